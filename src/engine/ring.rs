//! The ring API: a per-thread pair of SPSC rings into one worker.
//!
//! ```no_run
//! # fn main() -> tent::Result<()> {
//! use tent::{Engine, op, LocalAddr, RemoteAddr, SegmentId};
//! let engine = Engine::new(tent::Config::default())?;
//! let src = engine.allocate_memory(4096)?;
//! let dst = engine.allocate_memory(4096)?;
//! let mut ring = engine.ring()?;
//! let sqe = op::Write::new(LocalAddr::new(src.id(), 0), RemoteAddr::new(SegmentId::LOCAL, dst.addr()), 4096)
//!     .user_data(1)
//!     .build();
//! ring.submission().push(sqe).expect("ring has room");
//! ring.submit();
//! let cqe = ring.wait_one(std::time::Duration::from_secs(1))?;
//! assert_eq!(cqe.result(), Ok(4096));
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tent_rings::spsc::{Consumer, Producer, PushError};
use tent_rings::{Cqe, ErrorKind, Sqe};

use super::worker::WorkerShared;
use crate::doorbell::CqBell;

/// How long `wait_ready` spins before it yields the core.
const WAIT_SPIN: Duration = Duration::from_micros(20);
/// How long `wait_ready` polls (spinning, then yielding) before it sleeps.
const WAIT_YIELD: Duration = Duration::from_micros(200);
/// Longest single sleep in `wait_ready` (a backstop: the worker rings).
const WAIT_NAP: Duration = Duration::from_millis(10);
use crate::error::{Error, Result};

/// One application thread's rings. `Send`, not `Sync`: one thread submits,
/// as with io_uring.
pub struct Ring {
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    worker: Arc<WorkerShared>,
    bell: Arc<CqBell>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("worker", &self.worker.index)
            .field("capacity", &self.sq.capacity())
            .finish()
    }
}

impl Ring {
    pub(crate) fn new(
        sq: Producer<Sqe>,
        cq: Consumer<Cqe>,
        worker: Arc<WorkerShared>,
        bell: Arc<CqBell>,
    ) -> Ring {
        Ring {
            sq,
            cq,
            worker,
            bell,
        }
    }

    /// The submission side: push SQEs (written in place into the ring).
    #[inline]
    pub fn submission(&mut self) -> SubmissionQueue<'_> {
        SubmissionQueue { ring: self }
    }

    /// The completion side: iterate CQEs.
    #[inline]
    pub fn completion(&mut self) -> CompletionQueue<'_> {
        CompletionQueue { cq: &mut self.cq }
    }

    /// Publish pushed SQEs (one Release store) and wake the worker only if
    /// it parked (NEED_WAKEUP); returns how many were published.
    ///
    /// `Err(Shutdown)` once the engine has stopped: entries published then
    /// may or may not get a (`Shutdown`) completion.
    #[inline]
    pub fn submit(&mut self) -> Result<usize> {
        let n = self.sq.pending();
        if n > 0 {
            self.sq.sync();
            // needs_wakeup() fences (SeqCst) before reading the flag; that
            // fence also orders the `exited` check below after the publish.
            if self.sq.needs_wakeup() {
                self.worker.doorbell().ring();
            }
        }
        if self.worker.exited.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Shutdown, "the engine has stopped"));
        }
        Ok(n)
    }

    /// Submit, then wait for one CQE (see [`Ring::wait_ready`]).
    pub fn wait_one(&mut self, timeout: Duration) -> Result<Cqe> {
        self.submit()?;
        self.wait_ready(timeout)?;
        let c = self.cq.pop().expect("wait_ready saw a CQE");
        self.cq.sync();
        Ok(c)
    }

    /// Is a CQE there? With one request out (a round trip) the check also
    /// fetches the next CQE's line, which then comes with the tail that
    /// publishes it; with more out the worker is still writing CQEs into
    /// that line, and fetching it at every check would take the line back
    /// from the worker before each of its stores. Every SQE is answered by
    /// one CQE, so pushed minus popped is what is out (SQEs not submitted
    /// yet count too: a hint only).
    #[inline]
    fn cq_ready(&mut self) -> bool {
        if self.sq.pushed().wrapping_sub(self.cq.popped()) <= 1 {
            !self.cq.is_empty()
        } else {
            !self.cq.is_empty_quiet()
        }
    }

    /// Wait until a CQE is ready: spin for 20 µs, poll and yield until
    /// 200 µs (short transfers complete within these), then sleep on the
    /// ring's completion bell until the worker posts one. `Err(Timeout)` after `timeout`;
    /// `Err(Shutdown)` if the engine stopped with nothing left to reap.
    /// Does not submit.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        // A CQE already there costs no clock read: at many ops in flight
        // most calls find one, and the clock is the dearest thing here.
        if self.cq_ready() {
            return Ok(());
        }
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                if self.cq_ready() {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            let waited = start.elapsed();
            if waited >= WAIT_YIELD {
                break;
            }
            if waited >= WAIT_SPIN {
                // Let the threads that complete the transfer run here.
                std::thread::yield_now();
            }
        }
        // The first sleep after arming is short: the worker may have
        // flushed its last CQE before it saw the bell armed.
        let mut nap = if self.bell.armed.swap(true, Ordering::Relaxed) {
            WAIT_NAP
        } else {
            Duration::from_micros(200)
        };
        loop {
            if !self.cq.is_empty() {
                return Ok(());
            }
            // A stopped engine says so even when the wait also ran out (a
            // short wait whose spin alone outlasted it, on a loaded machine).
            if self.worker.exited.load(Ordering::SeqCst) && self.cq.is_empty() {
                return Err(Error::new(ErrorKind::Shutdown, "the engine has stopped"));
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "no completion within the wait timeout",
                ));
            }
            let seen = self.bell.bell.value();
            if self.cq.prepare_park() {
                self.bell.bell.wait(seen, nap.min(timeout - elapsed));
            }
            self.cq.clear_need_wakeup();
            nap = WAIT_NAP;
        }
    }

    /// The worker this ring is attached to.
    pub fn worker(&self) -> usize {
        self.worker.index
    }
}

/// Borrowed submission side of a [`Ring`]; dropping it submits.
pub struct SubmissionQueue<'a> {
    ring: &'a mut Ring,
}

impl std::fmt::Debug for SubmissionQueue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubmissionQueue")
            .field("pending", &self.ring.sq.pending())
            .finish()
    }
}

impl SubmissionQueue<'_> {
    /// Copy `sqe` into the next free slot. A full ring hands it back.
    /// No syscall, no allocation, no atomic read-modify-write.
    #[inline]
    pub fn push(&mut self, sqe: impl Into<Sqe>) -> Result<(), PushError<Sqe>> {
        self.ring.sq.push(sqe.into())
    }

    /// Free slots.
    pub fn slots(&mut self) -> usize {
        self.ring.sq.slots()
    }

    /// Ring capacity.
    pub fn capacity(&self) -> usize {
        self.ring.sq.capacity()
    }
}

impl Drop for SubmissionQueue<'_> {
    fn drop(&mut self) {
        // A stopped engine is reported by the next explicit `submit` or
        // `wait_one`; a destructor cannot return it.
        let _ = self.ring.submit();
    }
}

/// Borrowed completion side of a [`Ring`]; dropping it releases the slots.
pub struct CompletionQueue<'a> {
    cq: &'a mut Consumer<Cqe>,
}

impl std::fmt::Debug for CompletionQueue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").finish_non_exhaustive()
    }
}

impl Iterator for CompletionQueue<'_> {
    type Item = Cqe;

    #[inline]
    fn next(&mut self) -> Option<Cqe> {
        self.cq.pop()
    }
}

impl Drop for CompletionQueue<'_> {
    fn drop(&mut self) {
        self.cq.sync();
    }
}
