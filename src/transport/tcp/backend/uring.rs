//! The worker's own io_uring: one SQE per socket operation, at most one
//! `io_uring_enter` per flush.
//!
//! Set up with `COOP_TASKRUN` and `TASKRUN_FLAG` where the kernel has them:
//! the kernel posts completions when the worker next enters it (any
//! syscall, its yields included) instead of interrupting it, and flags the
//! submission ring when work waits, so a flush with nothing to submit still
//! enters when (and only when) completions are pending there. io_uring's
//! own worker pool is capped at one thread of each kind: socket operations
//! never need it (they wait by polling), and an engine's thread count must
//! not grow with its peers.

use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{IoUring, opcode, squeue, types};

use super::{Full, SockOp};

/// The tag of the backend's own entries (cancels): their completions are
/// not handed on.
const OWN: u64 = u64::MAX;

/// A worker's ring.
pub(crate) struct Uring {
    ring: IoUring,
    /// Entries pushed since the last flush.
    queued: u32,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("entries", &self.ring.params().sq_entries())
            .field("queued", &self.queued)
            .finish()
    }
}

/// Can this process set up a ring at all? Tried on a thread of its own:
/// a ring's teardown signals the thread that set it up (the kernel runs
/// its exit work there), which would cut the calling application thread's
/// next blocking syscall short with `EINTR`.
pub(crate) fn probe() -> std::io::Result<()> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("tent-uring-probe".into())
            .spawn_scoped(s, || IoUring::new(2).map(drop))
            .and_then(|t| t.join().unwrap_or_else(|_| Err(std::io::Error::other("probe panicked"))))
    })
}

impl Uring {
    /// A ring with room for `entries` operations in flight (its CQ twice
    /// that, so cancels and bursts never overflow it).
    pub(crate) fn new(entries: u32) -> std::io::Result<Uring> {
        let sq = entries.clamp(8, 4096).next_power_of_two();
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(sq * 2)
            .build(sq)
            .or_else(|_| IoUring::builder().setup_cqsize(sq * 2).build(sq))?;
        // Bounded and unbounded io-wq workers: one each at most (kernels
        // before 5.15 lack the call; their pool only serves what polling
        // cannot, which sockets never ask).
        let mut max = [1u32, 1];
        let _ = ring.submitter().register_iowq_max_workers(&mut max);
        Ok(Uring { ring, queued: 0 })
    }

    /// Queue one entry, submitting first if the ring is full.
    fn push_entry(&mut self, e: &squeue::Entry) -> Result<(), Full> {
        // SAFETY: the caller of `push` vouched for every pointer the entry names.
        if unsafe { self.ring.submission().push(e) }.is_ok() {
            self.queued += 1;
            return Ok(());
        }
        // Full since the last flush: hand the kernel what is there.
        let _ = self.ring.submit();
        self.queued = 0;
        // SAFETY: as above.
        match unsafe { self.ring.submission().push(e) } {
            Ok(()) => {
                self.queued = 1;
                Ok(())
            }
            Err(_) => Err(Full),
        }
    }

    /// See [`Backend::push`](super::Backend::push).
    ///
    /// # Safety
    /// Every pointer `op` names stays valid until its completion is reaped.
    pub(crate) unsafe fn push(&mut self, tag: u64, op: SockOp) -> Result<(), Full> {
        let e = match op {
            SockOp::Connect { fd, addr, len } => opcode::Connect::new(types::Fd(fd), addr, len)
                .build(),
            SockOp::Send { fd, msg } => opcode::SendMsg::new(types::Fd(fd), msg)
                // WAITALL: the kernel keeps sending a short send's rest
                // itself (stream sockets), one completion for the batch.
                .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
                .build(),
            SockOp::Recv { fd, buf, len } => opcode::Recv::new(types::Fd(fd), buf, len).build(),
        };
        self.push_entry(&e.user_data(tag))
    }

    /// Cancel every operation on `fd` (each still completes).
    pub(crate) fn cancel(&mut self, fd: RawFd) {
        let e = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
            .build()
            .user_data(OWN);
        if self.push_entry(&e).is_err() {
            // The ring refuses even after a submit: cancel synchronously.
            let _ = self
                .ring
                .submitter()
                .register_sync_cancel(None, types::CancelBuilder::fd(types::Fd(fd)).all());
        }
    }

    /// Submit what was queued; enter only when something was, when the
    /// kernel flagged completions waiting to be posted, or to wait.
    pub(crate) fn flush(&mut self, wait: Option<Duration>) {
        let pending = self.queued > 0 || self.ring.submission().taskrun();
        let r = match wait {
            Some(d) if self.ring.completion().is_empty() => {
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            _ if pending => self.ring.submitter().submit_and_wait(0),
            _ => return,
        };
        match r {
            Ok(n) => self.queued = self.queued.saturating_sub(n as u32),
            // ETIME (the wait ran out), EINTR, EBUSY (completions to reap
            // first): what was not taken is submitted by the next flush.
            Err(_) => {
                self.queued = self.ring.submission().len() as u32;
            }
        }
    }

    /// Move up to `out.len()` completions into `out`.
    #[inline]
    pub(crate) fn reap(&mut self, out: &mut [(u64, i32)]) -> usize {
        let mut n = 0;
        let mut cq = self.ring.completion();
        while n < out.len() {
            let Some(cqe) = cq.next() else {
                break;
            };
            if cqe.user_data() != OWN {
                out[n] = (cqe.user_data(), cqe.result());
                n += 1;
            }
        }
        n
    }
}
