//! Socket I/O straight into and out of registered memory.
//!
//! Payloads go between the socket and the application's (or the target's
//! registered) memory with no staging buffer: a header and its payload leave
//! in one `sendmsg` with two iovecs, and a payload is received with `recv`
//! into its final place. Raw pointers, not slices: the memory is shared with
//! the application, which Rust references could not describe honestly.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

/// Send `header` then `len` bytes at `payload` (may be null when `len` is
/// 0), all of it, within `pace` (target side): a send that returns short
/// (the socket's send timeout passed with part of it taken) is a frame
/// moving slowly, held to `pace`'s limits and cut.
///
/// # Safety
/// `payload` must be valid for reads of `len` bytes for the whole call.
pub(super) unsafe fn send_paced(
    sock: &impl AsRawFd,
    header: &[u8],
    payload: *const u8,
    len: usize,
    pace: &mut Pace<'_>,
) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let total = header.len() + len;
    let mut sent = 0usize;
    while sent < total {
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let mut n = 0;
        if sent < header.len() {
            iov[0] = libc::iovec {
                iov_base: header[sent..].as_ptr() as *mut libc::c_void,
                iov_len: header.len() - sent,
            };
            n = 1;
        }
        let done_payload = sent.saturating_sub(header.len());
        if len > done_payload {
            iov[n] = libc::iovec {
                iov_base: payload.wrapping_add(done_payload) as *mut libc::c_void,
                iov_len: len - done_payload,
            };
            n += 1;
        }
        // SAFETY: a zeroed msghdr is a valid "no name, no control" message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = n;
        // SAFETY: the iovecs point into `header` and into `payload`, valid for the stated lengths by the caller's contract; MSG_NOSIGNAL turns a dead peer into EPIPE instead of SIGPIPE.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // A send timeout (`SO_SNDTIMEO`, target side) passed with
                // nothing taken: the peer stopped reading.
                io::ErrorKind::WouldBlock => match pace.idle((total - sent) as u64) {
                    Ok(()) => continue,
                    Err(e) => Err(e),
                },
                _ => Err(e),
            };
        }
        sent += r as usize;
        if sent < total {
            pace.slow((total - sent) as u64)?;
        } else {
            pace.moved();
        }
    }
    Ok(())
}

/// Send a frame that has no payload.
pub(super) fn send_header(sock: &impl AsRawFd, header: &[u8]) -> io::Result<()> {
    send_header_paced(sock, header, &mut Pace::unlimited())
}

/// [`send_header`] within `pace` (target side, as [`send_paced`]).
pub(super) fn send_header_paced(
    sock: &impl AsRawFd,
    header: &[u8],
    pace: &mut Pace<'_>,
) -> io::Result<()> {
    // SAFETY: no payload: a null pointer with length 0 is never read.
    unsafe { send_paced(sock, header, std::ptr::null(), 0, pace) }
}

/// No mid-frame limit: for sockets without a read timeout (the initiator's),
/// on which a read never times out.
pub(super) const NO_STALL_LIMIT: Duration = Duration::MAX;

/// The slowest average rate a frame in progress may move at on the target
/// side, once it has been slow at all. Far below any link tent serves
/// (a tbf-shaped rail at 1 Mbit/s is twice it), and it makes a peer pay
/// bandwidth to hold a connection: without it, a peer dripping one byte
/// per stall limit held a connection (never idle, so never evicted) and a
/// region's use count (so `unregister_memory` never drained) forever.
pub(super) const FLOOR_BYTES_PER_S: u64 = 64 << 10;

/// The time limits of one frame in progress on the target side.
///
/// Nothing is timed while a frame moves at speed: the limits start at the
/// first read or send that comes back short (the socket's timeout passed),
/// so the fast path reads no clock. From then on, two limits hold:
/// - no byte for `stall` (since the last that moved; a call that comes
///   back with none has waited a whole socket timeout): cut;
/// - less than [`FLOOR_BYTES_PER_S`] on average since the frame first came
///   back short, past a grace of `stall`: cut, however regularly bytes
///   trickle in (a peer that never reads, whose kernel still takes a few
///   bytes a second, is one of these);
///
/// and `cut_when`'s condition (a region unregistered under the frame) cuts
/// it at once.
pub(super) struct Pace<'a> {
    stall: Duration,
    /// When the frame first came back short, and the bytes it had left
    /// then; `None` until then.
    slow_since: Option<(Instant, u64)>,
    /// When a byte last moved, once the frame is slow (else the first
    /// timeout with none).
    since: Option<Instant>,
    cut: Option<(&'a dyn Fn() -> bool, &'static str)>,
}

impl<'a> Pace<'a> {
    /// A frame held to `stall` ([`NO_STALL_LIMIT`]: no limit at all).
    pub(super) fn new(stall: Duration) -> Self {
        Pace {
            stall,
            slow_since: None,
            since: None,
            cut: None,
        }
    }

    /// No limit: for sockets without timeouts (the initiator's), on which
    /// a call never comes back short for lack of time.
    pub(super) fn unlimited() -> Self {
        Pace::new(NO_STALL_LIMIT)
    }

    /// Also cut the frame, with `why`, once `cut` says so (checked
    /// whenever the frame is slow: at least once per socket timeout).
    pub(super) fn cut_when(mut self, cut: &'a dyn Fn() -> bool, why: &'static str) -> Self {
        self.cut = Some((cut, why));
        self
    }

    /// Bytes moved and the call came back whole: once the frame is slow,
    /// that is its last byte so far (a frame read in several calls, as a
    /// refused WRITE's discard is, counts its stall from there). Nothing
    /// while the frame has never been slow: no clock on the fast path.
    #[inline]
    fn moved(&mut self) {
        if self.since.is_some() {
            self.since = Some(Instant::now());
        }
    }

    /// The frame came back short with `left` bytes to go (some moved).
    fn slow(&mut self, left: u64) -> io::Result<()> {
        if self.stall != NO_STALL_LIMIT {
            self.since = Some(Instant::now());
        }
        self.check(left)
    }

    /// The socket's timeout passed with nothing moved, `left` to go.
    fn idle(&mut self, left: u64) -> io::Result<()> {
        if self.stall != NO_STALL_LIMIT {
            let now = Instant::now();
            let since = *self.since.get_or_insert(now);
            if now.duration_since(since) >= self.stall {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer stalled mid-frame for over {:?}", self.stall),
                ));
            }
        }
        self.check(left)
    }

    fn check(&mut self, left: u64) -> io::Result<()> {
        if let Some((cut, why)) = self.cut
            && cut()
        {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, why));
        }
        if self.stall == NO_STALL_LIMIT {
            return Ok(());
        }
        let now = Instant::now();
        let (t0, left0) = *self.slow_since.get_or_insert((now, left));
        let moved = left0.saturating_sub(left);
        // What the bytes moved since then buy at the floor, plus the grace.
        let earned = Duration::from_secs(moved / FLOOR_BYTES_PER_S)
            + Duration::from_nanos((moved % FLOOR_BYTES_PER_S) * 1_000_000_000 / FLOOR_BYTES_PER_S);
        if now.duration_since(t0) > self.stall.saturating_add(earned) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the peer moved a frame slower than {} KiB/s ({moved} bytes in {:?}, {left} left)",
                    FLOOR_BYTES_PER_S >> 10,
                    now.duration_since(t0)
                ),
            ));
        }
        Ok(())
    }
}

/// The one receive loop behind [`recv_exact`], [`recv_header`] and
/// [`discard`]: read exactly `len` bytes into `dst`, `after` more of the
/// frame to follow. A read timeout (the socket's idle poll) does not end a
/// frame that has started: `pace` does. `Ok(false)`: `idle_ok` and the
/// read timed out before the first byte (an idle connection, not an
/// error).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the whole call.
#[inline]
unsafe fn recv_into(
    fd: std::os::fd::RawFd,
    dst: *mut u8,
    len: usize,
    after: u64,
    pace: &mut Pace<'_>,
    idle_ok: bool,
) -> io::Result<bool> {
    let mut got = 0usize;
    let left = |got: usize| (len - got) as u64 + after;
    while got < len {
        // SAFETY: `dst + got .. dst + len` is valid for writes by the caller's contract.
        let r = unsafe {
            libc::recv(
                fd,
                dst.add(got) as *mut libc::c_void,
                len - got,
                libc::MSG_WAITALL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut if idle_ok && got == 0 => {
                    return Ok(false);
                }
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    pace.idle(left(got))?;
                    continue;
                }
                _ => return Err(e),
            }
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += r as usize;
        if got < len {
            // Short with MSG_WAITALL: the read timeout passed mid-frame.
            pace.slow(left(got))?;
        } else {
            pace.moved();
        }
    }
    Ok(true)
}

/// Receive exactly `len` bytes into `dst`. A read timeout (the socket's
/// idle poll) does not end a frame that has started: `pace` does.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the whole call.
pub(super) unsafe fn recv_exact(
    sock: &impl AsRawFd,
    dst: *mut u8,
    len: usize,
    pace: &mut Pace<'_>,
) -> io::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { recv_into(sock.as_raw_fd(), dst, len, 0, pace, false) }.map(|_| ())
}

/// Receive a fixed-size header. `Ok(None)`: the read timed out before its
/// first byte (an idle connection, not an error). Once its first byte is
/// in, a header is read to its end within `pace` (the peer stalled or
/// dripped mid-frame: an error).
pub(super) fn recv_header<const N: usize>(
    sock: &impl AsRawFd,
    pace: &mut Pace<'_>,
) -> io::Result<Option<[u8; N]>> {
    let mut b = [0u8; N];
    // SAFETY: `b` is a local buffer of exactly N writable bytes.
    let full = unsafe { recv_into(sock.as_raw_fd(), b.as_mut_ptr(), N, 0, pace, true) }?;
    Ok(full.then_some(b))
}

/// Read and discard `len` bytes (the payload of a refused WRITE), so the
/// connection keeps its framing; the whole payload is one frame to `pace`.
pub(super) fn discard(sock: &impl AsRawFd, mut len: u64, pace: &mut Pace<'_>) -> io::Result<()> {
    let mut scratch = [0u8; 16 << 10];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        len -= n as u64;
        // SAFETY: `scratch` is a local buffer of at least `n` bytes.
        unsafe { recv_into(sock.as_raw_fd(), scratch.as_mut_ptr(), n, len, pace, false)? };
    }
    Ok(())
}

/// What every data socket gets, on both sides: no Nagle, the user
/// timeout (0: the kernel's), keepalive.
pub(super) fn tune(s: socket2::SockRef<'_>, user_timeout_ms: u32) {
    let _ = s.set_nodelay(true);
    if user_timeout_ms > 0 {
        let _ = s.set_tcp_user_timeout(Some(Duration::from_millis(u64::from(user_timeout_ms))));
    }
    let _ = s.set_keepalive(true);
}

/// The error kind a failed socket operation means for the slices on it.
///
/// `ECONNREFUSED` is `ProcessFailed`: the address and port come from the
/// peer's own descriptor, and a refused SYN means its host answered (the
/// route works) while nothing listens where that engine said it does: its
/// process, or its data server, is gone. EOF and `ECONNRESET` on an open
/// connection mean the same (a live kernel closed or reset it).
pub(super) fn kind_of(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => ErrorKind::ProcessFailed,
        Some(
            libc::ETIMEDOUT
            | libc::EHOSTUNREACH
            | libc::ENETUNREACH
            | libc::ENETDOWN
            | libc::EADDRNOTAVAIL,
        ) => ErrorKind::RouteLost,
        Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED) => ErrorKind::ProcessFailed,
        _ => match e.kind() {
            io::ErrorKind::UnexpectedEof => ErrorKind::ProcessFailed,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ErrorKind::RouteLost,
            _ => ErrorKind::Unreachable,
        },
    }
}
