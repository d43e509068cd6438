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
use crate::daemon::DaemonRing;
use crate::doorbell::CqBell;
use inline::InlineIssuer;
pub(crate) use inline::InlineRings;

mod inline;

/// How long `wait_ready` spins before it yields the core.
const WAIT_SPIN: Duration = Duration::from_micros(20);
/// How long `wait_ready` polls (spinning, then yielding) before it sleeps.
const WAIT_YIELD: Duration = Duration::from_micros(200);
/// Longest single sleep in `wait_ready` (a backstop: the worker rings).
const WAIT_NAP: Duration = Duration::from_millis(10);
use crate::error::{Error, Result};

/// One application thread's rings. `Send`, not `Sync`: one thread submits,
/// as with io_uring.
///
/// A small READ or WRITE on the local or shm transport is issued inline:
/// [`SubmissionQueue::push`] stages it, and [`Ring::submit`] (or the
/// submission side's drop) performs it on the calling thread, its CQE ready
/// when the call returns, as `io_uring_enter` issues what will not block in
/// the submitter's context (see `inline_max_bytes` in docs/CONFIG.md for
/// when; [`Ring::set_inline`] turns it off for this ring). Everything else
/// goes to the ring's worker. A ring holds up to `ring_depth` of the
/// worker's CQEs, and up to `inline_max_in_flight` of ops issued inline.
pub struct Ring {
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    server: Server,
    bell: Arc<CqBell>,
    /// `None`: inline issue is off for the engine (`inline_max_bytes` 0),
    /// or the engine stopped.
    inline: Option<Box<InlineIssuer>>,
    /// Inline issue on for this ring ([`Ring::set_inline`]).
    inline_on: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("worker", &self.server.index())
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
        engine: &Arc<super::EngineShared>,
    ) -> Ring {
        let inline = InlineIssuer::new(engine, sq.capacity() as u32).map(Box::new);
        Ring {
            sq,
            cq,
            server: Server::Worker(worker),
            bell,
            inline,
            inline_on: true,
        }
    }

    /// A ring in memory shared with the daemon whose worker serves it (an
    /// attached engine's): nothing is issued inline, the daemon's engine
    /// being in another process.
    pub(crate) fn attached(
        sq: Producer<Sqe>,
        cq: Consumer<Cqe>,
        daemon: DaemonRing,
        bell: Arc<CqBell>,
    ) -> Ring {
        Ring {
            sq,
            cq,
            server: Server::Daemon(daemon),
            bell,
            inline: None,
            inline_on: false,
        }
    }

    /// Turn inline issue on or off for this ring (on by default where the
    /// engine's `inline_max_bytes` is not 0): off, every op goes to the
    /// worker, for a thread that must never spend its time copying.
    pub fn set_inline(&mut self, on: bool) {
        self.inline_on = on;
        // Nothing stays staged while it is off (`push` then writes into the
        // ring directly): what is staged goes to the worker first.
        if !on && let Some(issuer) = self.inline.as_deref_mut() {
            let sq = &mut self.sq;
            issuer.unstage(|s| sq.push(s).is_ok());
        }
    }

    /// Push `sqe`: staged for inline issue at the next submit when it may
    /// be (see [`Ring`]), else into the ring for the worker.
    #[inline(always)]
    fn push(&mut self, sqe: Sqe) -> Result<(), PushError<Sqe>> {
        if self.inline.is_none() || !self.inline_on {
            return self.sq.push(sqe);
        }
        self.push_staging(sqe)
    }

    /// [`push`](Self::push) on a ring that issues inline.
    #[inline(never)]
    fn push_staging(&mut self, sqe: Sqe) -> Result<(), PushError<Sqe>> {
        let Some(issuer) = self.inline.as_deref_mut() else {
            return self.sq.push(sqe);
        };
        // Staged only while nothing of this ring is at the worker (pushed,
        // its CQE not read) or queued for it, so order within the ring holds
        // for every priority; and only while the ring has a free slot for
        // each staged op, so whichever falls back to the worker fits (the
        // worker may not have handed back the slots of SQEs whose CQEs were
        // read; room seen now stays: only this thread pushes).
        let sqe = if self.sq.pending() == 0
            && self.sq.pushed() == self.cq.popped()
            && self.sq.has_slots(issuer.staged() + 1)
        {
            match issuer.stage(sqe) {
                Ok(()) => return Ok(()),
                Err(sqe) => sqe,
            }
        } else {
            sqe
        };
        // Staged ops are older than this one: they reach the worker first
        // (they fit, see above).
        let sq = &mut self.sq;
        issuer.unstage(|s| sq.push(s).is_ok());
        self.sq.push(sqe)
    }

    /// Issue the staged ops (the first part of `submit`); those that may
    /// not be issued inline go into the ring. Returns how many were issued
    /// inline.
    #[inline]
    fn issue_staged(&mut self) -> usize {
        let Some(issuer) = self.inline.as_deref_mut() else {
            return 0;
        };
        if issuer.is_closed() && issuer.staged() == 0 && !issuer.ready() {
            // The engine stopped: let go of the tables.
            self.inline = None;
            return 0;
        }
        let sq = &mut self.sq;
        issuer.issue_staged(|s| sq.push(s).is_ok())
    }

    /// An inline completion is waiting.
    #[inline]
    fn inline_ready(&self) -> bool {
        self.inline.as_deref().is_some_and(InlineIssuer::ready)
    }

    /// The submission side: push SQEs (written in place into the ring).
    #[inline]
    pub fn submission(&mut self) -> SubmissionQueue<'_> {
        SubmissionQueue { ring: self }
    }

    /// The completion side: iterate CQEs.
    #[inline]
    pub fn completion(&mut self) -> CompletionQueue<'_> {
        CompletionQueue {
            inline: self.inline.as_deref_mut(),
            cq: &mut self.cq,
        }
    }

    /// Issue the staged small ops here (inline issue, see [`Ring`]), then
    /// publish pushed SQEs (one Release store) and wake the worker only if
    /// it parked (NEED_WAKEUP); returns how many were submitted, both ways.
    ///
    /// `Err(Shutdown)` once the engine has stopped: entries published then
    /// may or may not get a (`Shutdown`) completion.
    #[inline]
    pub fn submit(&mut self) -> Result<usize> {
        let inline = self.issue_staged();
        let n = self.sq.pending();
        if n > 0 {
            self.sq.sync();
            // needs_wakeup() fences (SeqCst) before reading the flag; that
            // fence also orders the `exited` check below after the publish.
            if self.sq.needs_wakeup() {
                self.server.wake();
            }
        }
        if self.server.stopped() {
            return Err(self.server.stopped_error());
        }
        Ok(n + inline)
    }

    /// Submit, then wait for one CQE (see [`Ring::wait_ready`]).
    pub fn wait_one(&mut self, timeout: Duration) -> Result<Cqe> {
        self.submit()?;
        self.wait_ready(timeout)?;
        if let Some(c) = self.inline.as_deref_mut().and_then(InlineIssuer::pop) {
            return Ok(c);
        }
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
        if self.inline_ready() {
            return true;
        }
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
            if self.server.stopped() && self.cq.is_empty() {
                return Err(self.server.stopped_error());
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "no completion within the wait timeout",
                ));
            }
            let seen = self.bell.value();
            if self.cq.prepare_park() {
                self.bell.wait(seen, nap.min(timeout - elapsed));
            }
            self.cq.clear_need_wakeup();
            nap = WAIT_NAP;
        }
    }

    /// An eventfd that turns readable when the worker posts CQEs while
    /// this ring is about to sleep ([`Ring::prepare_wait`]), as
    /// `IORING_REGISTER_EVENTFD` and UCX's `ucp_worker_get_efd` give: wait
    /// on it with epoll, or tokio's `AsyncFd` (see README.md). Made on the
    /// first call; the ring owns it (do not close it; take it out of any
    /// epoll set before dropping the ring). Make it before submitting what
    /// you will wait for. The busy path pays nothing for it: the worker
    /// writes it only while the flag is set (also while `wait_ready`
    /// sleeps, which sets the same flag).
    ///
    /// A ring of an engine attached to a daemon has one too: the daemon's
    /// worker bumps the ring's CQ bell (shared memory), and a thread of
    /// this process, one for every ring of the engine, writes the eventfd
    /// (the worker never writes a descriptor another process controls).
    ///
    /// # Errors
    /// `OutOfMemory` when the kernel refuses an eventfd (the process's
    /// descriptor limit), or, attached, a thread to write it.
    pub fn completion_fd(&mut self) -> Result<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        if self.bell.efd.get().is_none() {
            let fd = crate::doorbell::eventfd("ring completion")?;
            if let Server::Daemon(d) = &self.server {
                // Watched before the fd is the ring's: until then no
                // waiter relies on it.
                d.watch_completions(&self.bell)?;
            }
            // Only this thread sets it (the ring is not `Sync`).
            let _ = self.bell.efd.set(fd);
            self.bell.armed.store(true, Ordering::Relaxed);
        }
        Ok(self.bell.efd.get().expect("set above").as_fd())
    }

    /// Say this thread is about to sleep on [`Ring::completion_fd`]: sets
    /// the ring's NEED_WAKEUP flag, so the worker writes the eventfd when
    /// it next posts CQEs. False when a completion is already there (do not
    /// sleep: reap it; the flag is not left set), when no completion fd was
    /// made, or when the engine has stopped. After waking, call
    /// [`Ring::finish_wait`] before reaping. One waiter per ring: the flag
    /// is the ring's, and `wait_ready` clears it too.
    pub fn prepare_wait(&mut self) -> bool {
        // No eventfd to signal, or no worker left to signal it: do not sleep.
        if self.bell.efd.get().is_none() || self.server.stopped() {
            return false;
        }
        if self.inline_ready() || !self.cq.prepare_park() {
            self.cq.clear_need_wakeup();
            return false;
        }
        true
    }

    /// The sleep is over: clear NEED_WAKEUP (the worker stops writing the
    /// eventfd) and drain the eventfd's counter. A worker that saw the flag
    /// just before it was cleared may still write once more: a later wait
    /// can wake with nothing new to reap (look, then wait again).
    pub fn finish_wait(&mut self) {
        self.cq.clear_need_wakeup();
        if let Some(fd) = self.bell.efd.get() {
            let mut buf = [0u8; 8];
            // EAGAIN: nothing was written.
            let _ = rustix::io::read(fd, &mut buf);
        }
    }

    /// Nothing more will be served: the engine stopped, or the daemon went.
    pub(crate) fn stopped(&self) -> bool {
        self.server.stopped()
    }

    /// The worker this ring is attached to (in the daemon's engine, for
    /// an attached engine's ring).
    pub fn worker(&self) -> usize {
        self.server.index()
    }
}

/// Who serves a ring's SQEs.
enum Server {
    /// A worker of this process's engine.
    Worker(Arc<WorkerShared>),
    /// A worker of the daemon's engine, over shared memory.
    Daemon(DaemonRing),
}

impl Server {
    /// Wake the worker that sleeps (it asked, with NEED_WAKEUP).
    #[inline]
    fn wake(&self) {
        match self {
            Server::Worker(w) => w.doorbell().ring(),
            Server::Daemon(d) => d.wake(),
        }
    }

    /// The engine stopped, or the daemon went: nothing more will be served.
    #[inline]
    fn stopped(&self) -> bool {
        match self {
            Server::Worker(w) => w.exited.load(Ordering::SeqCst),
            Server::Daemon(d) => d.gone(),
        }
    }

    fn stopped_error(&self) -> Error {
        match self {
            Server::Worker(_) => Error::new(ErrorKind::Shutdown, "the engine has stopped"),
            Server::Daemon(_) => Error::new(
                ErrorKind::Shutdown,
                "the engine was dropped, or the daemon (tentd) it is attached to has gone",
            ),
        }
    }

    fn index(&self) -> usize {
        match self {
            Server::Worker(w) => w.index,
            Server::Daemon(d) => d.worker(),
        }
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
    /// A small local or shm op may be staged for inline issue (see
    /// [`Ring`]): `submit` performs it.
    pub fn push(&mut self, sqe: impl Into<Sqe>) -> Result<(), PushError<Sqe>> {
        self.ring.push(sqe.into())
    }

    /// Free slots.
    pub fn slots(&mut self) -> usize {
        let staged = self.ring.inline.as_deref().map_or(0, InlineIssuer::staged);
        self.ring.sq.slots().saturating_sub(staged)
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

/// Borrowed completion side of a [`Ring`]: inline completions first, then
/// the worker's; dropping it releases the slots.
pub struct CompletionQueue<'a> {
    inline: Option<&'a mut InlineIssuer>,
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
        if let Some(c) = self.inline.as_deref_mut().and_then(InlineIssuer::pop) {
            return Some(c);
        }
        self.cq.pop()
    }
}

impl Drop for CompletionQueue<'_> {
    fn drop(&mut self) {
        self.cq.sync();
    }
}
