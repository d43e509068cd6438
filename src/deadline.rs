//! Socket I/O bounded by one deadline for a whole exchange.
//!
//! Handshakes and control exchanges give a connection one deadline for all
//! of it: a peer that drips a byte per read must not extend it. Every read
//! or write here waits (`poll`) only for what is left of the deadline, then
//! moves what is ready without blocking (`MSG_DONTWAIT`): one `poll` and one
//! `recv`/`send` per call, and the socket's own options (timeouts, blocking
//! mode) are left as they are. Any stream socket works (`TcpStream`,
//! `UnixStream`, through [`AsFd`]). Not for per-op data paths.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use rustix::event::{self, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendFlags};

/// The instant `timeout` from now, saturating a year ahead where adding
/// it would overflow (`Duration::MAX` means "no deadline", not a panic).
pub(crate) fn after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}

/// The error for a deadline that passed (`TimedOut`).
pub(crate) fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "deadline passed")
}

/// Wait until `fd` is ready for `events` (`IN`, `OUT`) or `deadline`
/// passes (`TimedOut`). Readiness includes an error or a hang-up: the next
/// `recv`/`send` reports it.
pub(crate) fn wait_for(fd: BorrowedFd<'_>, events: PollFlags, deadline: Instant) -> io::Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        let ms = u64::try_from(left.as_millis().max(1)).unwrap_or(u64::MAX);
        let timeout = Timespec::try_from(Duration::from_millis(ms)).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        match event::poll(&mut [PollFd::from_borrowed_fd(fd, events)], Some(&timeout)) {
            Ok(0) | Err(Errno::INTR) => {}
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A socket whose reads and writes all end by one deadline.
///
/// [`Read::read`] returns `Ok(0)` at end of stream (so `read_exact` fails
/// `UnexpectedEof`); either direction fails `TimedOut` once the deadline has
/// passed with nothing moved.
#[derive(Debug)]
pub(crate) struct ByDeadline<S> {
    sock: S,
    deadline: Instant,
}

impl<S: AsFd> ByDeadline<S> {
    /// `sock` (a reference to a stream socket, usually) with `deadline`.
    pub(crate) fn new(sock: S, deadline: Instant) -> Self {
        ByDeadline { sock, deadline }
    }

    /// The socket.
    pub(crate) fn get_ref(&self) -> &S {
        &self.sock
    }

    /// One `poll` then one non-blocking `op`, until it moves something or
    /// fails with something other than `WouldBlock`/`Interrupted`.
    fn step(
        &self,
        events: PollFlags,
        mut op: impl FnMut(BorrowedFd<'_>) -> Result<usize, Errno>,
    ) -> io::Result<usize> {
        loop {
            wait_for(self.sock.as_fd(), events, self.deadline)?;
            match op(self.sock.as_fd()) {
                Ok(n) => return Ok(n),
                Err(Errno::AGAIN | Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl<S: AsFd> Read for ByDeadline<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.step(PollFlags::IN, |fd| {
            net::recv(fd, &mut *buf, RecvFlags::DONTWAIT).map(|(n, _)| n)
        })
    }
}

impl<S: AsFd> Write for ByDeadline<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // MSG_NOSIGNAL turns a dead peer into EPIPE instead of SIGPIPE.
        self.step(PollFlags::OUT, |fd| {
            net::send(fd, buf, SendFlags::DONTWAIT | SendFlags::NOSIGNAL)
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    #[test]
    fn reads_and_writes_whole_buffers() {
        let (a, b) = UnixStream::pair().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        ByDeadline::new(&a, deadline).write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        ByDeadline::new(&b, deadline).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
    }

    #[test]
    fn a_drip_does_not_extend_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let dripper = std::thread::spawn(move || {
            // One byte per 50 ms: 40 bytes would take 2 s.
            for _ in 0..40 {
                if c.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 40];
        let e = ByDeadline::new(&s, start + Duration::from_millis(300))
            .read_exact(&mut buf)
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(1000), "{took:?}");
        drop(s);
        dripper.join().unwrap();
    }

    #[test]
    fn a_closed_peer_is_unexpected_eof() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"ab").unwrap();
        drop(a);
        let mut buf = [0u8; 4];
        let mut r = ByDeadline::new(&b, Instant::now() + Duration::from_secs(5));
        let e = r.read_exact(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_silent_peer_times_out_a_read() {
        let (_a, b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 1];
        let e = ByDeadline::new(&b, start + Duration::from_millis(100))
            .read_exact(&mut buf)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    /// Writes to `s` (its send buffer made small) that nobody reads fail
    /// `TimedOut` at the deadline.
    fn never_read(s: BorrowedFd<'_>) {
        rustix::net::sockopt::set_socket_send_buffer_size(s, 4096).unwrap();
        let start = Instant::now();
        let e = ByDeadline::new(s, start + Duration::from_millis(100))
            .write_all(&vec![0u8; 16 << 20])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    #[test]
    fn a_peer_that_never_reads_times_out_a_write() {
        let (a, _b) = UnixStream::pair().unwrap();
        never_read(a.as_fd());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        never_read(c.as_fd());
    }

    #[test]
    fn a_passed_deadline_moves_nothing() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"x").unwrap();
        let mut buf = [0u8; 1];
        let e = ByDeadline::new(&b, Instant::now())
            .read(&mut buf)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
