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
/// The tag of the futex wait a park arms on the worker's bell.
const BELL: u64 = u64::MAX - 1;
/// `futex2` flags: a 32-bit futex, private to the process (the bell's
/// wake is `FUTEX_WAKE | FUTEX_PRIVATE_FLAG`).
const FUTEX2_SIZE_U32: u32 = 0x02;
const FUTEX2_PRIVATE: u32 = 128;
/// Wake on any bitset.
const FUTEX_BITSET_MATCH_ANY: u64 = 0xffff_ffff;

/// A worker's ring.
pub(crate) struct Uring {
    ring: IoUring,
    /// Entries pushed since the last flush.
    queued: u32,
    /// A futex wait on the worker's bell is armed (its completion, on a
    /// wake, disarms it).
    bell_armed: bool,
}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring")
            .field("entries", &self.ring.params().sq_entries())
            .field("queued", &self.queued)
            .finish()
    }
}

/// Can this process set up a ring at all, and can the ring wait on a
/// futex (kernel 6.7: what lets a worker park in it)? Tried on a thread of
/// its own: a ring's teardown signals the thread that set it up (the
/// kernel runs its exit work there), which would cut the calling
/// application thread's next blocking syscall short with `EINTR`.
pub(crate) fn probe() -> std::io::Result<bool> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("tent-uring-probe".into())
            .spawn_scoped(s, || {
                let ring = IoUring::new(2)?;
                let mut probe = io_uring::Probe::new();
                ring.submitter().register_probe(&mut probe)?;
                // Waits with a timeout (5.11) and cancels by socket (5.19,
                // the release that added SOCKET, probed for it) are what
                // the driver is built on.
                if !ring.params().is_feature_ext_arg() || !probe.is_supported(opcode::Socket::CODE) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::Unsupported,
                        "io_uring older than Linux 5.19",
                    ));
                }
                Ok(probe.is_supported(opcode::FutexWait::CODE))
            })
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
        Ok(Uring {
            ring,
            queued: 0,
            bell_armed: false,
        })
    }

    /// Queue one entry, submitting first if the ring is full.
    fn push_entry(&mut self, e: &squeue::Entry) -> Result<(), Full> {
        // SAFETY: the caller of `push` vouched for every pointer the entry names.
        if unsafe { self.ring.submission().push(e) }.is_ok() {
            self.queued += 1;
            return Ok(());
        }
        // Full since the last flush: hand the kernel what is there (what
        // it does not take stays queued for the next flush).
        let _ = self.ring.submit();
        self.queued = self.ring.submission().len() as u32;
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
            // No WAITALL: a short send completes, so the slices it carried
            // whole complete as their answers come (not behind a large
            // payload later in the batch); the rest is sent again.
            SockOp::Send { fd, msg } => opcode::SendMsg::new(types::Fd(fd), msg)
                .flags(libc::MSG_NOSIGNAL as u32)
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
        // Refused even after a submit: the caller's `shutdown` of the
        // socket ends its operations anyway (this only hurries them).
        let _ = self.push_entry(&e);
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

    /// Sleep until a completion is ready, the futex `word` moves off
    /// `seen` (and is woken), or `timeout`: one `io_uring_enter`, which
    /// also submits what is queued. The futex wait stays armed across
    /// parks until a wake completes it.
    pub(crate) fn park(&mut self, word: &std::sync::atomic::AtomicU32, seen: u32, timeout: Duration) {
        if !self.bell_armed {
            let e = opcode::FutexWait::new(
                word.as_ptr().cast_const(),
                u64::from(seen),
                FUTEX_BITSET_MATCH_ANY,
                FUTEX2_SIZE_U32 | FUTEX2_PRIVATE,
            )
            .build()
            .user_data(BELL);
            // SAFETY: the word is the worker's bell, in the engine's `Wakers`, which outlive every worker and so this ring (closed at the worker's exit); the kernel only compares and sleeps on it.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                crate::doorbell::wait_on(word, seen, timeout.min(Duration::from_millis(1)));
                return;
            }
            self.queued += 1;
            self.bell_armed = true;
        }
        self.flush(Some(timeout));
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
            match cqe.user_data() {
                OWN => {}
                BELL => self.bell_armed = false,
                tag => {
                    out[n] = (tag, cqe.result());
                    n += 1;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;
    use std::time::Instant;

    /// Long enough that a park that is not woken fails the test.
    const LONG: Duration = Duration::from_secs(10);
    const PROMPT: Duration = Duration::from_secs(2);

    #[test]
    fn a_parked_ring_wakes_when_the_bell_rings() {
        if !probe().unwrap_or(false) {
            let _ = writeln!(std::io::stderr(), "SKIP: this kernel's io_uring has no futex wait");
            return;
        }
        let mut u = Uring::new(8).unwrap();
        let word = Arc::new(AtomicU32::new(0));
        let w2 = word.clone();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w2.fetch_add(1, std::sync::atomic::Ordering::Release);
            let _ = rustix::thread::futex::wake(&w2, rustix::thread::futex::Flags::PRIVATE, 1);
        });
        let t = Instant::now();
        u.park(&word, 0, LONG);
        assert!(t.elapsed() < PROMPT, "the bell did not wake the ring: {:?}", t.elapsed());
        ringer.join().unwrap();
        // The wait's completion disarms it.
        let mut out = [(0u64, 0i32); 4];
        let deadline = Instant::now() + PROMPT;
        while u.bell_armed && Instant::now() < deadline {
            u.flush(None);
            u.reap(&mut out);
        }
        assert!(!u.bell_armed);
        // A bell that moved before the park returns at once.
        let t = Instant::now();
        u.park(&word, 0, LONG);
        assert!(t.elapsed() < PROMPT);
    }

    #[test]
    fn a_parked_ring_wakes_on_a_completion() {
        if !probe().unwrap_or(false) {
            let _ = writeln!(std::io::stderr(), "SKIP: this kernel's io_uring has no futex wait");
            return;
        }
        let mut u = Uring::new(8).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the receive: the test reaps it below.
        unsafe {
            u.push(
                7,
                SockOp::Recv {
                    fd: c.as_raw_fd(),
                    buf: buf.as_mut_ptr(),
                    len: 8,
                },
            )
            .unwrap();
        }
        u.flush(None);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(b"x").unwrap();
            s
        });
        let word = AtomicU32::new(0);
        let t = Instant::now();
        let mut out = [(0u64, 0i32); 4];
        let mut got = 0;
        while got == 0 && t.elapsed() < PROMPT {
            u.park(&word, 0, LONG);
            got = u.reap(&mut out);
        }
        assert!(t.elapsed() < PROMPT, "the completion did not wake the ring");
        assert_eq!(out[0], (7, 1));
        drop(sender.join().unwrap());
    }
}
