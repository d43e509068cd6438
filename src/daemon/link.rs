//! The socket an attached engine holds to its daemon: one exchange at a
//! time (a request, then its reply and any descriptor), the watch that
//! notices the daemon going, and what its going wakes (every ring's
//! completion bell, the mail page's words, the completion-fd watch).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::relay::{Act, Hub};
use super::wire::{self, Reply, Request};
use crate::doorbell::{CqBell, SharedWord};
use crate::error::{Error, ErrorKind, Result};
use crate::memfd::recv_frame;

/// How long the daemon may take to say hello.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long any other exchange may take: the daemon bounds its own waits
/// (a segment's descriptor fetch by `default_timeout_ms`, a drain of the
/// ops on memory given back by `max_timeout_ms`, at most a day each), and
/// a daemon that dies meanwhile ends the wait at once (the socket hangs
/// up). Giving up sooner would leave the two sides out of step while the
/// daemon still works for this client.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(86_400 + 60);

/// The socket to the daemon, and what its going reaches.
pub(super) struct Link {
    pub(super) stream: Mutex<UnixStream>,
    /// Set once the daemon closed the socket (it exited or was killed):
    /// nothing more will be served.
    pub(super) gone: AtomicBool,
    /// The completion bells of the rings made here, rung when the daemon
    /// goes so a thread asleep on one wakes and sees it.
    pub(super) bells: Mutex<Vec<std::sync::Weak<CqBell>>>,
    /// The mail page's words (arrivals, settlements), rung with the bells.
    pub(super) mail: std::sync::OnceLock<[SharedWord; 2]>,
    /// Writes the completion fds of rings that have one, when the daemon's
    /// worker bumps their CQ bells: started by the first.
    pub(super) cq_watch: Mutex<Option<Arc<Hub<WriteEventfds>>>>,
    /// Written to stop the watcher.
    pub(super) stop: OwnedFd,
    /// Set before this side says it goes: the hang-up that follows is no
    /// news.
    pub(super) detaching: AtomicBool,
}

impl Link {
    pub(super) fn gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// One exchange: the request, then the reply and the descriptor it
    /// carried; a refusal is the error it names. Any other failure (the
    /// socket, a frame that is not a reply, a reply out of turn) leaves
    /// the two sides out of step, so the link ends (`broken`).
    pub(super) fn ask(&self, req: &Request) -> Result<(Reply, Option<OwnedFd>)> {
        let s = self.stream.lock();
        self.send(&s, req)?;
        self.reply(&s, timeout_for(req))
    }

    /// Send `req` whole, never raising SIGPIPE in the host process (a C or
    /// Python application keeps its default handler, which would end it).
    /// A daemon that refuses this process answers before it reads, then
    /// hangs up: a send that fails finds its refusal waiting, if any.
    pub(super) fn send(&self, s: &UnixStream, req: &Request) -> Result<()> {
        if self.gone() {
            return Err(gone_error());
        }
        let bytes = req.encode();
        let mut at = 0;
        while at < bytes.len() {
            match rustix::net::send(s, &bytes[at..], rustix::net::SendFlags::NOSIGNAL) {
                Ok(n) => at += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    let why = match read_reply(s, Duration::from_millis(200)) {
                        Ok((Reply::Refused { kind, message }, _)) => {
                            Error::new(kind, format!("tentd: {message}"))
                        }
                        _ => io("send a request")(e.into()),
                    };
                    return Err(self.broken(s, why));
                }
            }
        }
        Ok(())
    }

    /// Read one reply (see [`Link::ask`]).
    pub(super) fn reply(
        &self,
        s: &UnixStream,
        timeout: Duration,
    ) -> Result<(Reply, Option<OwnedFd>)> {
        match read_reply(s, timeout) {
            Ok((Reply::Refused { kind, message }, _)) => {
                Err(Error::new(kind, format!("tentd: {message}")))
            }
            Ok(got) => Ok(got),
            Err(e) => Err(self.broken(s, e)),
        }
    }

    /// The exchange failed half-way: end the link (nothing more is sent
    /// or read on it, rings answer `Shutdown`), and hand back why.
    pub(super) fn broken(&self, s: &UnixStream, why: Error) -> Error {
        if !self.gone.swap(true, Ordering::AcqRel) {
            tracing::warn!(error = %why, "tentd: the link to the daemon broke; this engine is detached");
            let _ = s.shutdown(std::net::Shutdown::Both);
            self.wake_rings();
        }
        why
    }

    /// A reply out of turn: the sides are out of step, the link ends.
    pub(super) fn desync(&self, r: &Reply) -> Error {
        let s = self.stream.lock();
        self.broken(&s, unexpected(r))
    }

    /// Ring every ring's completion bell and the mail words, so a sleeper
    /// wakes and looks.
    pub(super) fn wake_rings(&self) {
        for w in self.mail.get().into_iter().flatten() {
            w.ring();
        }
        for bell in self
            .bells
            .lock()
            .iter()
            .filter_map(std::sync::Weak::upgrade)
        {
            bell.ring();
        }
    }

    /// The daemon closed the socket: mark it and wake every ring's sleeper.
    pub(super) fn lost(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) && !self.detaching.load(Ordering::Acquire) {
            tracing::warn!("tentd: the daemon this engine is attached to has gone");
        }
        self.wake_rings();
    }
}

pub(super) fn gone_error() -> Error {
    Error::new(
        ErrorKind::Shutdown,
        "the daemon (tentd) this engine is attached to has gone",
    )
}

/// Sleep until the daemon closes `stream` (`link`'s socket) or `stop`
/// is written.
pub(super) fn watch(link: &Link, stream: &UnixStream) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: link.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfds, as its length says.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // Unwatched, the daemon's death would go unseen: the link ends.
            tracing::warn!(error = %e, "tentd: cannot watch the link to the daemon");
            link.lost();
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            link.lost();
            return;
        }
    }
}

/// Read one reply frame within `timeout` (a refusal too: the caller
/// turns it into its error).
fn read_reply(s: &UnixStream, timeout: Duration) -> Result<(Reply, Option<OwnedFd>)> {
    let deadline = Instant::now() + timeout;
    let mut header = [0u8; 4];
    let got = recv_frame(s, &mut header, deadline).map_err(|e| io("read a reply")(e.err))?;
    let n = wire::body_len(header)
        .map_err(|m| Error::new(ErrorKind::Unreachable, format!("tentd: {}", m.0)))?;
    let mut body = vec![0u8; n];
    recv_frame(s, &mut body, deadline).map_err(|e| io("read a reply")(e.err))?;
    let reply = Reply::decode(&body)
        .map_err(|m| Error::new(ErrorKind::Unreachable, format!("tentd: {}", m.0)))?;
    Ok((reply, got.fd))
}

/// How long the reply to `req` may take.
fn timeout_for(req: &Request) -> Duration {
    match req {
        Request::Hello { .. } => IO_TIMEOUT,
        _ => DRAIN_TIMEOUT,
    }
}

pub(super) fn unexpected(r: &Reply) -> Error {
    Error::new(
        ErrorKind::Unreachable,
        format!("tentd answered out of turn: {r:?}"),
    )
}

pub(super) fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::new(ErrorKind::Unreachable, format!("tentd: {what}")).with_source(e)
}

/// The completion-fd watch's act: write each moved ring's eventfd.
#[derive(Default)]
pub(super) struct WriteEventfds {
    pub(super) rings: Mutex<std::collections::HashMap<u64, std::sync::Weak<CqBell>>>,
}

impl WriteEventfds {
    fn write(&self, keys: &[u64]) {
        let rings = self.rings.lock();
        for k in keys {
            if let Some(bell) = rings.get(k).and_then(std::sync::Weak::upgrade)
                && let Some(fd) = bell.efd.get()
            {
                // Ours, non-blocking: a full counter is readable already.
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
        }
    }
}

impl Act for WriteEventfds {
    fn fresh(&self, keys: &[u64]) {
        self.write(keys);
    }

    fn bumped(&self, keys: &[u64]) {
        self.write(keys);
    }
}
