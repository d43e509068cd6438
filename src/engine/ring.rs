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
use crate::error::{Error, Result};

/// One application thread's rings. `Send`, not `Sync`: one thread submits,
/// as with io_uring.
pub struct Ring {
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    worker: Arc<WorkerShared>,
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
    pub(crate) fn new(sq: Producer<Sqe>, cq: Consumer<Cqe>, worker: Arc<WorkerShared>) -> Ring {
        Ring { sq, cq, worker }
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

    /// Submit, then wait (spin, then yield) for one CQE.
    pub fn wait_one(&mut self, timeout: Duration) -> Result<Cqe> {
        self.submit()?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(c) = self.cq.pop() {
                self.cq.sync();
                return Ok(c);
            }
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                if start.elapsed() > timeout {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        "no completion within the wait timeout",
                    ));
                }
                std::thread::yield_now();
            }
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
