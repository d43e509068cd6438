//! How a worker's TCP connections reach the kernel: a completion-style
//! queue of socket operations that the worker fills, flushes once per
//! turn and reaps in the same loop as its other transports.
//!
//! Two implementations behind one type, [`Backend`]:
//! - [`Uring`](uring::Uring): the worker's own io_uring. Each operation is
//!   one SQE; a flush is at most one `io_uring_enter`.
//! - [`Epoll`](epoll::Epoll): non-blocking syscalls driven by an
//!   edge-triggered epoll set, for kernels without io_uring, with it
//!   disabled (`kernel.io_uring_disabled`), or refused (seccomp profiles
//!   answer `io_uring_setup` with `EPERM`). An operation is tried when it
//!   is pushed; one that would block waits for its socket's readiness and
//!   is tried again by a later flush. Its completions read exactly as the
//!   ring's.
//!
//! The caller's contract, the same for both: every pointer an operation
//! names (the socket address, the iovecs and what they point to, a receive
//! buffer) stays valid until that operation's completion has been reaped;
//! at most one send, one receive and one connect are outstanding per
//! socket; a socket is [`Backend::forget`]-ten before it is closed, and
//! only once none of its operations is outstanding.

pub(super) mod epoll;
pub(super) mod uring;

use std::os::fd::RawFd;

pub(crate) use crate::config::TcpBackend as Choice;

/// The backend `choice` comes to on this kernel (`Auto` becomes the one
/// that works), and whether a worker can park in it; `Err` when `IoUring`
/// was forced and the kernel refuses it.
pub(crate) fn resolve(choice: Choice) -> std::io::Result<(Choice, bool)> {
    match choice {
        Choice::Epoll => Ok((Choice::Epoll, false)),
        Choice::IoUring => uring::probe().map(|f| (Choice::IoUring, f)),
        Choice::Auto => match uring::probe() {
            Ok(f) => Ok((Choice::IoUring, f)),
            Err(e) => {
                tracing::warn!(error = %e, "tcp: io_uring is not available here (missing, disabled by kernel.io_uring_disabled, or refused by seccomp); the data path runs on epoll");
                Ok((Choice::Epoll, false))
            }
        },
    }
}

/// One socket operation.
#[derive(Debug, Clone, Copy)]
pub(super) enum SockOp {
    /// `connect(fd, addr, len)` on a non-blocking socket; completes with 0
    /// or `-errno` once the connection is up or refused.
    Connect {
        fd: RawFd,
        addr: *const libc::sockaddr,
        len: libc::socklen_t,
    },
    /// `sendmsg(fd, msg, MSG_NOSIGNAL)`; completes with the bytes taken
    /// (possibly fewer than asked) or `-errno`.
    Send { fd: RawFd, msg: *const libc::msghdr },
    /// `recv(fd, buf, len)`; completes with the bytes received (0: the
    /// peer closed) or `-errno`.
    Recv { fd: RawFd, buf: *mut u8, len: u32 },
}

impl SockOp {
    /// The socket it acts on.
    pub(super) fn fd(&self) -> RawFd {
        match *self {
            SockOp::Connect { fd, .. } | SockOp::Send { fd, .. } | SockOp::Recv { fd, .. } => fd,
        }
    }
}

/// The queue is full until the next flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Full;

/// A worker's socket operation queue.
#[derive(Debug)]
pub(super) enum Backend {
    /// The worker's io_uring.
    Uring(uring::Uring),
    /// Readiness-driven fallback.
    Epoll(epoll::Epoll),
}

impl Backend {
    /// A queue for up to `entries` operations outstanding, of the kind
    /// `choice` names (`Auto`: io_uring, else epoll).
    pub(super) fn new(choice: Choice, entries: u32) -> std::io::Result<Backend> {
        match choice {
            Choice::Epoll => Ok(Backend::Epoll(epoll::Epoll::new(entries)?)),
            Choice::IoUring => Ok(Backend::Uring(uring::Uring::new(entries)?)),
            Choice::Auto => match uring::Uring::new(entries) {
                Ok(u) => Ok(Backend::Uring(u)),
                Err(_) => Ok(Backend::Epoll(epoll::Epoll::new(entries)?)),
            },
        }
    }

    /// Its name, for the log and the stats.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Backend::Uring(_) => "io_uring",
            Backend::Epoll(_) => "epoll",
        }
    }

    /// Queue `op`, answered later with `tag` (never `u64::MAX`: the
    /// backend's own).
    ///
    /// # Safety
    /// Every pointer `op` names stays valid until its completion is reaped.
    #[inline]
    pub(super) unsafe fn push(&mut self, tag: u64, op: SockOp) -> Result<(), Full> {
        match self {
            // SAFETY: forwarded from the caller.
            Backend::Uring(u) => unsafe { u.push(tag, op) },
            // SAFETY: forwarded from the caller.
            Backend::Epoll(e) => unsafe { e.push(tag, op) },
        }
    }

    /// Ask every outstanding operation on `fd` to end now: each still
    /// completes (with `-ECANCELED`, or what it had done).
    pub(super) fn cancel(&mut self, fd: RawFd) {
        match self {
            Backend::Uring(u) => u.cancel(fd),
            Backend::Epoll(e) => e.cancel(fd),
        }
    }

    /// `fd` is about to be closed; none of its operations is outstanding.
    pub(super) fn forget(&mut self, fd: RawFd) {
        match self {
            Backend::Uring(_) => {}
            Backend::Epoll(e) => e.forget(fd),
        }
    }

    /// Hand what was pushed to the kernel and collect what finished
    /// (`wait`: block up to that long for at least one completion when
    /// none is ready). At most one syscall for the ring; none when nothing
    /// was pushed and nothing is due.
    pub(super) fn flush(&mut self, wait: Option<std::time::Duration>) {
        match self {
            Backend::Uring(u) => u.flush(wait),
            Backend::Epoll(e) => e.flush(wait),
        }
    }

    /// Move completions ready, oldest first, into `out` as `(tag, result)`
    /// (at most `out.len()`); how many.
    #[inline]
    pub(super) fn reap(&mut self, out: &mut [(u64, i32)]) -> usize {
        match self {
            Backend::Uring(u) => u.reap(out),
            Backend::Epoll(e) => e.reap(out),
        }
    }
}
