//! What both sides of `tcp` do to sockets outside their state machines:
//! tuning, a blocking send of a short frame, and what a socket error means
//! for the slices on it.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tent_rings::ErrorKind;

/// Send a frame that has no payload, all of it, on a blocking socket (the
/// blocking handshake and a refusal sent from an accept thread).
pub(super) fn send_header(sock: &impl AsRawFd, header: &[u8]) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let mut sent = 0usize;
    while sent < header.len() {
        // SAFETY: the range is inside `header`; MSG_NOSIGNAL turns a dead peer into EPIPE instead of SIGPIPE.
        let r = unsafe {
            libc::send(
                fd,
                header[sent..].as_ptr() as *const libc::c_void,
                header.len() - sent,
                libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += r as usize;
    }
    Ok(())
}

/// The slowest average rate a frame in progress may move at on the target
/// side, past a grace of the stall limit. Far below any link tent serves
/// (a tbf-shaped rail at 1 Mbit/s is twice it), and it makes a peer pay
/// bandwidth to hold a connection: without it, a peer dripping one byte
/// per stall limit held a connection (never idle, so never evicted) and a
/// region's use count (so `unregister_memory` never drained) forever.
pub(super) const FLOOR_BYTES_PER_S: u64 = 64 << 10;

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
/// Running out of descriptors (`EMFILE`, past the open-file limit the
/// engine raised to the hard limit at start) or socket memory is
/// `OutOfMemory`: refused, typed, not retried on another rail.
///
/// `ECONNREFUSED` is `ProcessFailed`: the address and port come from the
/// peer's own descriptor, and a refused SYN means its host answered (the
/// route works) while nothing listens where that engine said it does: its
/// process, or its data server, is gone. EOF and `ECONNRESET` on an open
/// connection mean the same (a live kernel closed or reset it).
pub(super) fn kind_of(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        // Out of descriptors or socket memory here: no path or peer is at
        // fault, and another rail would fail the same way.
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => ErrorKind::OutOfMemory,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_is_out_of_memory_not_a_path_fault() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert_eq!(kind_of(&io::Error::from_raw_os_error(errno)), ErrorKind::OutOfMemory);
        }
        let refused = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(kind_of(&refused), ErrorKind::ProcessFailed);
        let timed_out = io::Error::from_raw_os_error(libc::ETIMEDOUT);
        assert_eq!(kind_of(&timed_out), ErrorKind::RouteLost);
    }
}
