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
/// 0), all of it, in as few syscalls as the kernel allows.
///
/// # Safety
/// `payload` must be valid for reads of `len` bytes for the whole call.
pub unsafe fn send_all(
    sock: &impl AsRawFd,
    header: &[u8],
    payload: *const u8,
    len: usize,
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
                io::ErrorKind::WouldBlock => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer stopped reading (send timeout)",
                )),
                _ => Err(e),
            };
        }
        sent += r as usize;
    }
    Ok(())
}

/// Send a frame that has no payload.
pub fn send_header(sock: &impl AsRawFd, header: &[u8]) -> io::Result<()> {
    // SAFETY: no payload: a null pointer with length 0 is never read.
    unsafe { send_all(sock, header, std::ptr::null(), 0) }
}

/// No mid-frame limit: for sockets without a read timeout (the initiator's),
/// on which a read never times out.
pub const NO_STALL_LIMIT: Duration = Duration::MAX;

/// A frame in progress that stopped arriving: `Err` once nothing has come
/// for `stall` since the first read timeout (so about `stall` plus the
/// socket's read timeout in all). Only called when a read timed out.
fn stalled(since: &mut Option<Instant>, stall: Duration) -> io::Result<()> {
    let now = Instant::now();
    match *since {
        None => *since = Some(now),
        Some(t) if now.duration_since(t) >= stall => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer stalled mid-frame for over {stall:?}"),
            ));
        }
        Some(_) => {}
    }
    Ok(())
}

/// The one receive loop behind [`recv_exact`] and [`recv_header`]: read
/// exactly `len` bytes into `dst`. A read timeout (the socket's idle poll)
/// does not end a frame that has started: it ends only when nothing has
/// arrived for about `stall`. `Ok(false)`: `idle_ok` and the read timed out
/// before the first byte (an idle connection, not an error).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the whole call.
#[inline]
unsafe fn recv_into(
    fd: std::os::fd::RawFd,
    dst: *mut u8,
    len: usize,
    stall: Duration,
    idle_ok: bool,
) -> io::Result<bool> {
    let mut got = 0usize;
    let mut since = None;
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
                    stalled(&mut since, stall)?;
                    continue;
                }
                _ => return Err(e),
            }
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += r as usize;
        since = None;
    }
    Ok(true)
}

/// Receive exactly `len` bytes into `dst`. A read timeout (the socket's
/// idle poll) does not end a frame that has started: it ends only when
/// nothing has arrived for about `stall`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes for the whole call.
pub unsafe fn recv_exact(
    sock: &impl AsRawFd,
    dst: *mut u8,
    len: usize,
    stall: Duration,
) -> io::Result<()> {
    // SAFETY: forwarded from the caller.
    unsafe { recv_into(sock.as_raw_fd(), dst, len, stall, false) }.map(|_| ())
}

/// Receive a fixed-size header. `Ok(None)`: the read timed out before its
/// first byte (an idle connection, not an error). Once its first byte is
/// in, a header is read to its end unless nothing more arrives for about
/// `stall` (the peer stalled mid-frame: an error).
pub fn recv_header<const N: usize>(
    sock: &impl AsRawFd,
    stall: Duration,
) -> io::Result<Option<[u8; N]>> {
    let mut b = [0u8; N];
    // SAFETY: `b` is a local buffer of exactly N writable bytes.
    let full = unsafe { recv_into(sock.as_raw_fd(), b.as_mut_ptr(), N, stall, true) }?;
    Ok(full.then_some(b))
}

/// Read and discard `len` bytes (the payload of a refused WRITE), so the
/// connection keeps its framing (mid-frame: `stall` as in [`recv_exact`]).
pub fn discard(sock: &impl AsRawFd, mut len: u64, stall: Duration) -> io::Result<()> {
    let mut scratch = [0u8; 16 << 10];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        // SAFETY: `scratch` is a local buffer of at least `n` bytes.
        unsafe { recv_exact(sock, scratch.as_mut_ptr(), n, stall)? };
        len -= n as u64;
    }
    Ok(())
}

/// The error kind a failed socket operation means for the slices on it.
///
/// `ECONNREFUSED` is `ProcessFailed`: the address and port come from the
/// peer's own descriptor, and a refused SYN means its host answered (the
/// route works) while nothing listens where that engine said it does: its
/// process, or its data server, is gone. EOF and `ECONNRESET` on an open
/// connection mean the same (a live kernel closed or reset it).
pub fn kind_of(e: &io::Error) -> ErrorKind {
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
