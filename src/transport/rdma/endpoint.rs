//! One RDMA endpoint: a queue pair to a peer's NIC, its send-queue credits,
//! and the slices in flight on it.
//!
//! - Its QP is connected off the worker, by the [`Connector`]: the endpoint
//!   is `Idle` (no QP) → `Connecting` (a job at the connector; slices wait
//!   in the bounded backlog, `submit` says `false` when it is full) →
//!   `Ready` (posting) or `Broken` (the connect failed: the waiting slices
//!   fail with its kind, logged once per cause, and so does new work until
//!   a backoff, doubling per failure from 250 ms to 8 s, has passed; the
//!   next work then connects again). A flush only looks at whether the job
//!   is done (one atomic load): it never waits on the peer.
//! - Slices wait in a backlog and go out in linked work-request lists, as
//!   many as the send-queue credits allow: the endpoint's [`SqController`]
//!   (sized to the QP's depth, so the provider never sees more than
//!   `max_qp_wr`) reserves them with one CAS, re-checks just before
//!   `post_send` that the queue was not degraded meanwhile (rolling the
//!   reservation back if it was), and takes them back as completions are
//!   known, once per reaped batch. An `ENOMEM`
//!   from `post_send` (the provider's own SQ full) keeps the unposted rest
//!   in the backlog; nothing is lost or reported.
//! - Selective signalling: the last request of each list (and every
//!   `sq_signal_interval_wr`-th, by default every `depth / 2`-th) asks for
//!   a completion; an RC QP completes in order, so
//!   a signalled completion also completes the unsignalled ones before it.
//!   Credits return exactly once, when a request's completion is known.
//! - Every request posted is recorded in the endpoint's
//!   [`SubmissionLedger`] just before `post_send` (a tail the provider
//!   refuses is taken back), and leaves it exactly once.
//! - A failed completion fails that slice alone with its mapped kind (see
//!   [`wc`](super::wc)). If its status is the request's own (not on seed
//!   004's fatal list), the QP, in error now, is replaced: the requests
//!   flushed behind it go back to the head of the backlog and are posted
//!   again on a fresh QP (DESIGN.md's recovery order); a slice flushed too
//!   often fails `Unreachable`. QPs that die before completing anything,
//!   twice or more in a row, put the endpoint in `Broken` (`Unreachable`)
//!   for a backoff doubling from 250 ms to 8 s: a path that kills every QP
//!   at once is not reconnected in a storm (its waiting slices move on).
//! - **Terminal-degraded.** Four failure paths converge through one
//!   function (`Endpoint::converge`): a reserve refused because the
//!   queue was degraded (a QP-fatal async event marks its `SqController`),
//!   a re-check that fails between reserve and post, `post_send` refusing
//!   work for any reason but its own SQ being full, and a fatal completion.
//!   It closes the queue's admission and wakes its waiters first, destroys
//!   the QP, orphans every ledger record (each then settled exactly once:
//!   an aborted slice ends with its abort's kind, every other one, and
//!   every slice waiting in the backlog, is handed to the caller to move
//!   to another rail or fail over: [`Endpoint::extract_orphans`]), and puts
//!   the endpoint in `Broken` for a backoff doubling from 250 ms per
//!   terminal QP in a row. It takes no new work until then
//!   ([`Endpoint::accepting`]); the next work after it connects a fresh QP
//!   with a fresh `SqController`, off the worker.
//! - [`Endpoint::abort`] stops a task's slices (its deadline passed, it was
//!   cancelled, the engine stops) and ends each only once nothing will
//!   touch its buffer: a waiting one at once; for posted ones the QP is
//!   moved to the error state (one non-blocking verb), nothing more is
//!   posted on it, and the device flushes every request on it, in order,
//!   signalled or not. An aborted slice ends with the abort's kind when its
//!   flush is reaped (or with its own result if it finished first). Once no
//!   aborted request is left on it the QP is dropped; the other tasks'
//!   flushed slices go back to the backlog head, oldest first, for a fresh
//!   QP, and such a flush is not counted against them.
//!
//! Nothing here allocates after construction except handing a connect job
//! to the connector (first work, or after a QP error: never per slice).
//!
//! [`Connector`]: super::connector::Connector

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tent_rings::{ErrorKind, Opcode};

use super::connector::{ConnectorHandle, Link, Queue, QueueSource};
use super::ledger::{SubmissionLedger, SubmissionRecord};
use super::wc::{Outcome, outcome};
use crate::clock::monotonic_ns;
use crate::error::Error;
use crate::flow::diag::{SqCqeDiagnostics, SqReport, bump};
use crate::flow::sq::{SqController, SqRefusal};
use crate::transport::rdma::sys::ffi;

/// Times a slice may be flushed and re-posted before it fails.
const MAX_REPOSTS: u8 = 4;
/// Work requests per `post_send` list.
const MAX_BATCH: usize = 32;
/// Completions per `poll_cq`.
const POLL_BATCH: usize = 32;
/// Backoff after a failed connect (doubling per consecutive failure).
pub(crate) const BACKOFF_MIN_NS: u64 = 250_000_000;
/// Longest backoff.
pub(crate) const BACKOFF_MAX_NS: u64 = 8_000_000_000;

/// Seed 004's send-queue knobs an endpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqSettings {
    /// `sq_resume_watermark_wr`: free requests needed to resume after a
    /// refused reserve paused the queue (0: no hysteresis).
    pub resume_watermark: u32,
    /// `sq_signal_interval_wr`: signal every n-th request within a list
    /// too (0: every `depth / 2`-th, at least the last of each list).
    pub signal_interval: u32,
    /// `sq_admission_wait_slice_us`: the longest single sleep of a thread
    /// waiting on the queue.
    pub wait_slice: Duration,
    /// The first backoff of a `Broken` endpoint (doubling per failure in
    /// a row, up to [`BACKOFF_MAX_NS`]). Not a config key: 250 ms
    /// ([`BACKOFF_MIN_NS`]) everywhere but tests that need many failures.
    pub backoff_min: Duration,
    /// `sq_backoff_timeout_us`: how long the endpoint may hold posted
    /// requests with no completion before it counts as stalled (new work
    /// goes elsewhere, waiting work moves on; zero: never).
    pub stall_timeout: Duration,
}

impl Default for SqSettings {
    fn default() -> SqSettings {
        SqSettings {
            resume_watermark: 0,
            signal_interval: 0,
            wait_slice: Duration::from_micros(100),
            backoff_min: Duration::from_nanos(BACKOFF_MIN_NS),
            stall_timeout: Duration::from_secs(1),
        }
    }
}

impl SqSettings {
    /// The knobs `config` sets.
    pub(crate) fn from_config(config: &crate::config::Config) -> SqSettings {
        let r = &config.transports.rdma;
        SqSettings {
            resume_watermark: r.sq_resume_watermark_wr,
            signal_interval: r.sq_signal_interval_wr,
            wait_slice: r.sq_admission_wait_slice_us,
            stall_timeout: r.sq_backoff_timeout_us,
            ..SqSettings::default()
        }
    }
}

/// One slice as an endpoint posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaSlice {
    /// The engine's token, echoed in the completion.
    pub token: u64,
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Local address (inside memory registered with `lkey`).
    pub local: u64,
    /// Bytes (at most the NIC's max message size: the engine slices).
    pub len: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote address.
    pub remote: u64,
    /// Remote key (from the peer's descriptor).
    pub rkey: u32,
    /// Times flushed and re-posted so far.
    pub reposts: u8,
    /// The caller's own context, echoed in the completion (the RDMA
    /// transport keeps the local region there, to find its lkey on another
    /// rail).
    pub ctx: usize,
    /// When the caller handed it over (monotonic ns; 0 = not timed): the
    /// rail's bandwidth estimate is fed from it.
    pub posted_ns: u64,
    /// Slices ahead of it on its rail when posted (bandwidth estimate).
    pub ahead: u16,
    /// A HIGH slice (seed 001): queued ahead of every bulk slice waiting
    /// in the backlog (behind re-posts and earlier HIGH slices).
    pub urgent: bool,
}

/// A slice's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaCompletion {
    /// The slice's token.
    pub token: u64,
    /// Bytes moved, or why not.
    pub result: std::result::Result<u64, ErrorKind>,
    /// The slice itself (so a failed one can be posted on another rail).
    pub slice: RdmaSlice,
}

/// Why an endpoint went terminal-degraded: seed 004's four failure paths
/// (and a CQ that cannot be polled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminalCause {
    /// A reserve was refused: the queue was degraded (a QP-fatal async
    /// event, or another thread holding its controller).
    Reserve,
    /// The queue was degraded between reserve and post.
    Recheck,
    /// `ibv_post_send` refused work with this errno (not `ENOMEM`).
    Post(i32),
    /// A completion on seed 004's fatal list, with its kind.
    Cqe(ErrorKind),
    /// `ibv_poll_cq` failed with this code.
    Poll(i32),
}

impl std::fmt::Display for TerminalCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TerminalCause::Reserve => f.write_str("reserve refused (queue degraded)"),
            TerminalCause::Recheck => f.write_str("re-check before post failed (queue degraded)"),
            TerminalCause::Post(rc) => write!(f, "post_send refused work (errno {rc})"),
            TerminalCause::Cqe(kind) => write!(f, "fatal completion ({kind})"),
            TerminalCause::Poll(rc) => write!(f, "poll_cq failed ({rc})"),
        }
    }
}

/// Where an endpoint is in its life (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// No QP, none asked for (new, or the last one broke).
    Idle,
    /// A connect is at the connector; slices wait.
    Connecting,
    /// A QP to post on.
    Ready,
    /// The last connect failed with `kind`; work fails with it until
    /// `retry_ns` (monotonic), then the next work connects again.
    Broken {
        /// Why the connect failed.
        kind: ErrorKind,
        /// When the next connect may start.
        retry_ns: u64,
    },
}

enum State {
    Idle,
    Connecting,
    Ready(Queue),
    Broken { kind: ErrorKind, retry_ns: u64 },
}

/// A failed work completion's status and the vendor's syndrome.
#[derive(Debug, Clone, Copy)]
struct WcError {
    status: ffi::ibv_wc_status,
    vendor_err: u32,
}

/// An endpoint (see the module docs).
pub struct Endpoint {
    state: State,
    link: Link,
    /// The source's peer (log lines, their rate-limit key).
    peer: Box<str>,
    sq: Arc<SqController>,
    backlog: VecDeque<RdmaSlice>,
    /// Most slices the backlog holds.
    limit: usize,
    since_signal: u32,
    signal_every: u32,
    wrs: Vec<ffi::ibv_send_wr>,
    sges: Vec<ffi::ibv_sge>,
    wcs: Vec<ffi::ibv_wc>,
    replacements: u64,
    /// A QP was connected before (a new one is then a replacement).
    connected_once: bool,
    /// Connects failed in a row (the backoff doubles with each).
    failures: u32,
    /// QPs in a row that died of a fault before completing anything: from
    /// the second on, the next connect waits a doubling backoff, so a path
    /// that kills every QP at once is not reconnected in a storm.
    dead_qps: u32,
    /// The current QP has completed a request well.
    qp_ok: bool,
    /// Every request handed to the QP, until its end is known.
    ledger: SubmissionLedger<RdmaSlice>,
    /// Slices a terminal degrade gave up, for the caller to move on
    /// ([`Endpoint::extract_orphans`]).
    orphans: VecDeque<RdmaSlice>,
    /// Terminal QPs in a row (the backoff doubles with each).
    terminal_strikes: u32,
    /// Terminal degrades so far, and the last one's cause.
    terminals: u64,
    last_terminal: Option<TerminalCause>,
    /// Tests: runs between reserve and re-check (a degrade from another
    /// thread landing there).
    #[cfg(test)]
    pub(crate) pre_post: Option<fn(&SqController)>,
    /// The knobs each QP's fresh `SqController` is built with.
    depth: u32,
    settings: SqSettings,
    /// Its queues' counters (shared with each QP's `SqController` and the
    /// metrics reader).
    diag: Arc<SqCqeDiagnostics>,
    /// The current `sq`, published for submitting threads (admission):
    /// replaced with each QP, read lock-free.
    published: Arc<ArcSwap<SqController>>,
    /// The time the caller's last [`Endpoint::polled_at`] gave (the
    /// worker's turn clock: no clock read of the endpoint's own).
    now_ns: u64,
    /// The last sign of life of the posted requests: a completion that
    /// released one, or the post that started a busy period.
    progress_ns: u64,
    /// This stall was reported (reset by the next progress).
    stall_reported: bool,
    /// Requests the completions of the current `reap` released.
    reaped_wr: u32,
    /// The QP was moved to the error state by `abort`: nothing more is
    /// posted on it, its completions are reaped until no aborted request
    /// is left on it, then it is dropped.
    draining: bool,
    /// Backlog head entries that this drain put back (the QP's remaining
    /// requests go in after them: oldest first).
    requeued: usize,
    /// The last QP was dropped for an abort, not a fault (its replacement
    /// is routine: logged at debug).
    dropped_for_abort: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.peer)
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers (the QP's, and the WR scratch lists' into `sges`/`wrs`) are owned by the endpoint; an endpoint is used by one worker at a time.
unsafe impl Send for Endpoint {}

impl Endpoint {
    /// An endpoint over queues from `source`, `depth` requests deep, able
    /// to hold `backlog` slices, with the default [`SqSettings`]. It
    /// connects its first QP (through `connector`) when it first has work,
    /// so peers and rails never used cost no QP.
    pub fn new(
        source: Box<dyn QueueSource>,
        depth: u32,
        backlog: usize,
        connector: &ConnectorHandle,
    ) -> Endpoint {
        Endpoint::with_settings(source, depth, backlog, connector, SqSettings::default())
    }

    /// [`Endpoint::new`] with the send-queue knobs `sq`.
    pub(crate) fn with_settings(
        source: Box<dyn QueueSource>,
        depth: u32,
        backlog: usize,
        connector: &ConnectorHandle,
        sq: SqSettings,
    ) -> Endpoint {
        let limit = backlog.max(1);
        let diag = Arc::<SqCqeDiagnostics>::default();
        let first = Arc::new(SqController::with_diagnostics(
            depth,
            sq.resume_watermark,
            sq.wait_slice,
            diag.clone(),
        ));
        Endpoint {
            state: State::Idle,
            peer: source.peer().into(),
            link: Link::new(source, connector),
            published: Arc::new(ArcSwap::new(first.clone())),
            sq: first,
            diag,
            now_ns: 0,
            progress_ns: 0,
            stall_reported: false,
            reaped_wr: 0,
            // Room for what a broken QP puts back too.
            backlog: VecDeque::with_capacity(limit + depth.max(1) as usize),
            limit,
            ledger: SubmissionLedger::new(depth),
            orphans: VecDeque::with_capacity(limit + depth.max(1) as usize),
            terminal_strikes: 0,
            terminals: 0,
            last_terminal: None,
            #[cfg(test)]
            pre_post: None,
            since_signal: 0,
            signal_every: match sq.signal_interval {
                0 => (depth / 2).max(1),
                n => n,
            },
            wrs: vec![ffi::ibv_send_wr::default(); MAX_BATCH],
            sges: vec![ffi::ibv_sge::default(); MAX_BATCH],
            wcs: vec![ffi::ibv_wc::default(); POLL_BATCH],
            replacements: 0,
            connected_once: false,
            failures: 0,
            dead_qps: 0,
            qp_ok: false,
            depth,
            settings: sq,
            draining: false,
            requeued: 0,
            dropped_for_abort: false,
        }
    }

    /// Is a QP connected now?
    pub fn is_connected(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// Where it is in its life.
    #[cfg(test)]
    pub(crate) fn state(&self) -> EndpointState {
        match self.state {
            State::Idle => EndpointState::Idle,
            State::Connecting => EndpointState::Connecting,
            State::Ready(_) => EndpointState::Ready,
            State::Broken { kind, retry_ns } => EndpointState::Broken { kind, retry_ns },
        }
    }

    /// Does it take new work now? Not while `Broken` (terminal-degraded,
    /// or its connects failing) and its backoff runs: the rail layer sends
    /// the work elsewhere instead.
    #[inline]
    pub fn accepting(&self) -> bool {
        match self.state {
            State::Broken { retry_ns, .. } => monotonic_ns() >= retry_ns,
            _ => true,
        }
    }

    /// Terminal degrades so far.
    pub fn terminals(&self) -> u64 {
        self.terminals
    }

    /// Why it last went terminal-degraded.
    pub fn last_terminal(&self) -> Option<TerminalCause> {
        self.last_terminal
    }

    /// Its ledger's live records (requests posted, end not known).
    #[cfg(test)]
    pub(crate) fn ledger_records(&self) -> usize {
        self.ledger.record_count()
    }

    /// Give up this endpoint's QP (its rail is gone) and hand every slice
    /// queued or in flight to `out`, oldest first, for another rail; an
    /// aborted one in flight ends through `done` instead. The QP is
    /// destroyed first, so nothing posted on it can still land.
    pub(crate) fn evacuate(
        &mut self,
        out: &mut impl FnMut(RdmaSlice),
        done: &mut impl FnMut(RdmaCompletion),
    ) {
        // A lost rail says nothing of its QPs: this one is not counted as
        // dead (no backoff when the link comes back).
        self.qp_ok = true;
        self.break_queue(true, done);
        self.extract_orphans(out);
        while let Some(s) = self.backlog.pop_front() {
            out(s);
        }
        self.publish_freed();
    }

    /// Tell admission and the diagnostics what the queue holds now: at
    /// each flush and reap, and after anything that empties the backlog
    /// (an abort, an evacuation, a degrade, a give-up), since the
    /// transport stops polling an endpoint with nothing outstanding and a
    /// stale count would keep its slots taken for good.
    #[inline]
    fn publish_occupancy(&self) {
        self.diag
            .occupancy(self.ledger.record_count(), self.backlog.len());
    }

    /// [`publish_occupancy`](Self::publish_occupancy) after slices left
    /// the backlog without being posted (moved, aborted, shed, failed):
    /// their slots are free for admission now, so a sleeper waiting for
    /// them wakes (no completion will ring for them).
    fn publish_freed(&self) {
        self.publish_occupancy();
        self.sq.room_freed();
    }

    /// Hand every slice a terminal degrade gave up to `out`, oldest first,
    /// each exactly once: the caller moves it to another rail, or fails it
    /// over (it was not the slice's fault).
    pub fn extract_orphans(&mut self, out: &mut impl FnMut(RdmaSlice)) {
        while let Some(s) = self.orphans.pop_front() {
            out(s);
        }
    }

    /// Stop every slice of `token` here (see the module docs). Waiting
    /// ones end through `done` now with `kind`; posted ones end through
    /// the later `reap`s, once their completion says the device is done
    /// with their buffers. Never waits; aborting again, or a token with
    /// nothing here, changes nothing.
    pub fn abort(&mut self, token: u64, kind: ErrorKind, done: &mut impl FnMut(RdmaCompletion)) {
        let (mut at, mut before, requeued) = (0, 0, self.requeued);
        self.backlog.retain(|s| {
            let keep = s.token != token;
            if !keep {
                before += usize::from(at < requeued);
                done(RdmaCompletion {
                    token,
                    result: Err(kind),
                    slice: *s,
                });
            }
            at += 1;
            keep
        });
        self.requeued -= before;
        self.publish_freed();
        // Given up by a terminal degrade, not moved on yet: nothing holds
        // their buffers.
        self.orphans.retain(|s| {
            let keep = s.token != token;
            if !keep {
                done(RdmaCompletion {
                    token,
                    result: Err(kind),
                    slice: *s,
                });
            }
            keep
        });
        let State::Ready(q) = &mut self.state else {
            return;
        };
        if self.ledger.mark_aborted(|s| s.token == token, kind) == 0 || self.draining {
            return;
        }
        let rc = q.flush_to_error();
        if rc == 0 {
            self.draining = true;
            return;
        }
        let peer = &*self.peer;
        crate::lograte::warn_limited!(
            (peer, rc),
            peer,
            rc,
            "rdma: cannot move a QP to the error state to stop an aborted slice; destroying it instead"
        );
        // Destroying the QP stops the device as surely: the aborted slices
        // end now.
        self.break_queue(false, done);
    }

    /// Queue `slice`; `false` if the backlog is full (the caller holds
    /// engine credits, so it sized the backlog to never see this).
    pub fn submit(&mut self, slice: RdmaSlice) -> bool {
        if self.backlog.len() >= self.limit {
            bump(&self.diag.full_refusals);
            return false;
        }
        if slice.urgent {
            // Behind the re-posts at the head and the HIGH slices already
            // waiting, ahead of every bulk slice: a HIGH request overtakes
            // queued bulk at slice granularity. The scan covers only the
            // HIGH slices waiting, so it stays short.
            let mut at = self.requeued.min(self.backlog.len());
            while self.backlog.get(at).is_some_and(|s| s.urgent) {
                at += 1;
            }
            self.backlog.insert(at, slice);
        } else {
            self.backlog.push_back(slice);
        }
        // Published now, not at the next flush: the worker releases the
        // slice's admission charge right after this, and the gate must
        // not see the slot free in between (one store, this thread's).
        self.diag.backlog.store(
            u32::try_from(self.backlog.len()).unwrap_or(u32::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
        true
    }

    /// The worker's clock for this turn, before [`flush`](Self::flush)
    /// and [`reap`](Self::reap): completions and posts are timed with it.
    #[inline]
    pub fn polled_at(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// Has it held posted requests for `sq_backoff_timeout_us` with no
    /// completion (a peer that stopped answering without failing the QP,
    /// or a poll that does not come)? A stalled endpoint takes no new
    /// work; its waiting slices move on ([`shed_backlog`](Self::shed_backlog)).
    #[inline]
    pub(crate) fn stalled(&self, now_ns: u64) -> bool {
        let t = self.settings.stall_timeout.as_nanos();
        t != 0
            && self.ledger.record_count() > 0
            && u128::from(now_ns.saturating_sub(self.progress_ns)) > t
    }

    /// A stalled endpoint hands its waiting (never posted) slices to `out`,
    /// oldest first, for another rail; it counts the stall and returns
    /// true the first time for this stall (the caller logs it once).
    pub(crate) fn shed_backlog(&mut self, out: &mut impl FnMut(RdmaSlice)) -> bool {
        // Slices put back by an abort's drain are not the stall's to move.
        for s in self.backlog.drain(self.requeued..) {
            out(s);
        }
        self.publish_freed();
        let first = !self.stall_reported;
        if first {
            self.stall_reported = true;
            bump(&self.diag.stalls);
        }
        first
    }

    /// Its queues' counters now (see [`SqCqeDiagnostics`]).
    pub(crate) fn report(&self, now_ns: u64) -> SqReport {
        self.diag.report(now_ns, self.sq.posted(), self.sq.depth())
    }

    /// Its current controller as submitting threads see it (admission).
    pub fn published_sq(&self) -> &Arc<ArcSwap<SqController>> {
        &self.published
    }

    /// Its diagnostics, shared (the metrics reader keeps one per endpoint).
    pub fn diagnostics(&self) -> &Arc<SqCqeDiagnostics> {
        &self.diag
    }

    /// Slices queued, in flight, or given up and not handed on yet.
    pub fn outstanding(&self) -> usize {
        self.backlog.len() + self.ledger.record_count() + self.orphans.len()
    }

    /// Send-queue credits in use (requests posted and not yet completed).
    pub fn credits_in_flight(&self) -> u32 {
        self.sq.posted()
    }

    /// Its send-queue controller (admission, diagnostics).
    #[cfg(test)]
    pub(crate) fn sq(&self) -> &Arc<SqController> {
        &self.sq
    }

    /// QPs replaced after errors or aborts so far.
    pub fn replacements(&self) -> u64 {
        self.replacements
    }

    /// Post what the credits allow. Without a QP, ask the connector for
    /// one (or see whether it answered): never waits.
    pub fn flush(&mut self, done: &mut impl FnMut(RdmaCompletion)) {
        if !self.backlog.is_empty() {
            // The backlog's peak is before a post, not after.
            self.publish_occupancy();
        }
        // A QP draining an abort takes nothing new: it is in error.
        if !self.advance(done) || self.draining {
            return;
        }
        // The QP's one poster (`&mut`): held until `converge` or an
        // unposted tail, after which this returns.
        let State::Ready(q) = &mut self.state else {
            return;
        };
        while !self.backlog.is_empty() {
            let want = (self.backlog.len().min(MAX_BATCH) as u32).min(self.sq.depth());
            let reserved = match self.sq.try_reserve(want) {
                Ok(r) => r,
                // Less room than wanted and not paused by the resume
                // watermark (a refusal below it pauses the queue until
                // completions free that much): post what fits.
                Err(SqRefusal::Full(s)) if !s.credits.paused => {
                    let free = s.credits.capacity.saturating_sub(s.credits.in_flight);
                    match (free > 0).then(|| self.sq.try_reserve(free)) {
                        Some(Ok(r)) => r,
                        Some(Err(SqRefusal::Degraded)) => {
                            return self.converge(TerminalCause::Reserve, done);
                        }
                        _ => return,
                    }
                }
                // Out of service (an async event, or another holder).
                Err(SqRefusal::Degraded) => {
                    return self.converge(TerminalCause::Reserve, done);
                }
                // Paused: completions will free room.
                Err(_) => return,
            };
            let k = reserved.n as usize;
            if self.ledger.record_count() == 0 {
                // A busy period starts: the stall clock runs from here.
                self.progress_ns = self.now_ns;
            }
            let mut first = 0;
            for i in 0..k {
                let s = self.backlog.pop_front().expect("k <= backlog");
                let seq = self.ledger.record(s);
                if i == 0 {
                    first = seq;
                }
                self.since_signal += 1;
                let signal = i + 1 == k || self.since_signal >= self.signal_every;
                if signal {
                    self.since_signal = 0;
                }
                // Raw pointers from one `as_mut_ptr` each, written through
                // (never a `&mut` to an element): a later reference into
                // the list would invalidate the `next` links already made.
                let (wrs, sges) = (self.wrs.as_mut_ptr(), self.sges.as_mut_ptr());
                let next = if i + 1 < k {
                    wrs.wrapping_add(i + 1)
                } else {
                    std::ptr::null_mut()
                };
                let mut wr = ffi::ibv_send_wr {
                    wr_id: seq,
                    next,
                    sg_list: sges.wrapping_add(i),
                    num_sge: 1,
                    opcode: match s.opcode {
                        Opcode::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                        Opcode::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
                    },
                    send_flags: if signal {
                        ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
                    } else {
                        0
                    },
                    ..Default::default()
                };
                wr.wr.rdma.remote_addr = s.remote;
                wr.wr.rdma.rkey = s.rkey;
                // SAFETY: `i < k <= MAX_BATCH`, the length of both scratch vectors.
                unsafe {
                    sges.add(i).write(ffi::ibv_sge {
                        addr: s.local,
                        length: s.len,
                        lkey: s.lkey,
                    });
                    wrs.add(i).write(wr);
                }
            }
            #[cfg(test)]
            if let Some(hook) = self.pre_post {
                hook(&self.sq);
            }
            if self.sq.recheck(reserved).is_err() {
                // Degraded between reserve and post: the credits went back
                // (rollback); nothing is posted on a queue out of service.
                self.unpost(first);
                return self.converge(TerminalCause::Recheck, done);
            }
            let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
            // SAFETY: the list is `k` valid WRs whose SGEs point into `sges`, all alive for the call; each names memory the engine keeps registered until the slice's end is reported (its completion, or the QP destroyed), which the unregister drain waits for.
            let rc = unsafe { q.post_send(self.wrs.as_mut_ptr(), &mut bad) };
            let posted = if rc == 0 {
                k
            } else if bad.is_null() {
                0
            } else {
                // SAFETY: the provider points `bad` at a WR of our list.
                let off = unsafe { bad.offset_from(self.wrs.as_ptr()) };
                (off.max(0) as usize).min(k)
            };
            if posted < k {
                self.sq.release((k - posted) as u32, 0);
                self.unpost(first + posted as u64);
                // The unposted tail's signalled request never went out: the
                // next list must signal again soon.
                self.since_signal = self.signal_every;
                if rc != libc::ENOMEM {
                    return self.converge(TerminalCause::Post(rc), done);
                }
                // The provider's own SQ is full: the rest waits.
                return;
            }
        }
    }

    /// The first backoff, in ns.
    fn backoff_min_ns(&self) -> u64 {
        self.settings
            .backoff_min
            .as_nanos()
            .min(u128::from(BACKOFF_MAX_NS)) as u64
    }

    /// Take the requests from `first` on back from the ledger (the
    /// provider never got them) to the head of the backlog, in order.
    fn unpost(&mut self, first: u64) {
        let backlog = &mut self.backlog;
        self.ledger
            .cancel_tentative(first, |r| backlog.push_front(r.slice));
    }

    /// Reap completions, reporting each slice's end through `done`;
    /// returns how many work completions were read.
    pub fn reap(&mut self, done: &mut impl FnMut(RdmaCompletion)) -> usize {
        let State::Ready(q) = &mut self.state else {
            return 0;
        };
        if self.sq.is_terminal() {
            // Degraded from outside (a QP-fatal async event) with nothing
            // to post: it converges here rather than at the next post.
            self.converge(TerminalCause::Reserve, done);
            return 0;
        }
        let n = q.poll_cq(&mut self.wcs[..POLL_BATCH]);
        if n < 0 {
            self.converge(TerminalCause::Poll(n), done);
            return 0;
        }
        self.reaped_wr = 0;
        for i in 0..n as usize {
            let wc = &self.wcs[i];
            let (seq, status, vendor_err) = (wc.wr_id, wc.status, wc.vendor_err);
            // Completions of work already dealt with (flushed, re-posted),
            // or of a QP that is gone.
            if self.ledger.is_stale(seq) {
                continue;
            }
            let o = outcome(status);
            let why = WcError { status, vendor_err };
            if self.draining {
                self.drained(seq, o, why, done);
                continue;
            }
            match o {
                Outcome::Done => self.complete_through(seq, done),
                Outcome::Failed(kind) | Outcome::Fatal(kind) => {
                    // In order: everything before it completed.
                    self.complete_through(seq.saturating_sub(1), done);
                    if let Some(r) = self.take_front(seq) {
                        self.failed(r, kind, why, done);
                    }
                    // The request's own failure replaces the QP; one on
                    // the fatal list takes the endpoint out of service.
                    if matches!(o, Outcome::Fatal(_)) {
                        self.converge(TerminalCause::Cqe(kind), done);
                    } else {
                        self.break_queue(true, done);
                    }
                }
                Outcome::Flushed => self.break_queue(true, done),
            }
        }
        // Once per reap, not per request (see `diag`).
        self.diag.polled(self.now_ns, n as u32, self.reaped_wr);
        self.publish_occupancy();
        n as usize
    }

    /// One completion from a QP draining an abort. Requests end in order: a
    /// success completes those up to it; a flush or a failure completes
    /// those before it (an error is never silent, so they finished), then
    /// settles its own request: an aborted slice ends with the abort's kind
    /// (the device is done with its buffer now), a failed one with its
    /// failure (a fatal one makes the endpoint terminal), a flushed one
    /// goes back to the backlog, not counted as a re-post (the abort was
    /// not its fault). Once no aborted request is left on it, the QP is
    /// dropped.
    fn drained(
        &mut self,
        seq: u64,
        o: Outcome,
        why: WcError,
        done: &mut impl FnMut(RdmaCompletion),
    ) {
        if o == Outcome::Done {
            self.complete_through(seq, done);
        } else {
            self.complete_through(seq.saturating_sub(1), done);
            if let Some(r) = self.take_front(seq) {
                match (r.abort, o) {
                    (Some(kind), _) => done(RdmaCompletion {
                        token: r.slice.token,
                        result: Err(kind),
                        slice: r.slice,
                    }),
                    (None, Outcome::Failed(kind)) => self.failed(r, kind, why, done),
                    (None, Outcome::Fatal(kind)) => {
                        self.failed(r, kind, why, done);
                        return self.converge(TerminalCause::Cqe(kind), done);
                    }
                    (None, _) => {
                        self.backlog.insert(self.requeued, r.slice);
                        self.requeued += 1;
                    }
                }
            }
        }
        if self.ledger.aborted() == 0 {
            self.break_queue(false, done);
        }
    }

    /// The oldest posted request if it is `seq`, its credit returned.
    fn take_front(&mut self, seq: u64) -> Option<SubmissionRecord<RdmaSlice>> {
        let r = self.ledger.take(seq)?;
        self.sq.release(1, 0);
        Some(r)
    }

    /// `r` failed with `kind`, a root cause: it ends so, logged once per
    /// cause.
    fn failed(
        &mut self,
        r: SubmissionRecord<RdmaSlice>,
        kind: ErrorKind,
        why: WcError,
        done: &mut impl FnMut(RdmaCompletion),
    ) {
        done(RdmaCompletion {
            token: r.slice.token,
            result: Err(kind),
            slice: r.slice,
        });
        let peer = &*self.peer;
        // The vendor's syndrome is what a NIC's support reads first.
        crate::lograte::warn_limited!(
            (peer, kind, why.status.0, why.vendor_err),
            peer,
            %kind,
            status = why.status.0,
            vendor_err = format_args!("{:#x}", why.vendor_err),
            "rdma: work request failed; QP in error"
        );
    }

    /// Complete every posted request up to and including `seq` (an aborted
    /// one too: it finished first).
    fn complete_through(&mut self, seq: u64, done: &mut impl FnMut(RdmaCompletion)) {
        let released = self.ledger.release_by_cqe(seq, |r| {
            done(RdmaCompletion {
                token: r.slice.token,
                result: Ok(r.slice.len as u64),
                slice: r.slice,
            })
        });
        // One release per reaped batch, not per request.
        self.sq.release(released, 0);
        self.qp_ok |= released > 0;
        if released > 0 {
            self.terminal_strikes = 0;
            self.progress_ns = self.now_ns;
            self.stall_reported = false;
            self.reaped_wr = self.reaped_wr.saturating_add(released);
        }
    }

    /// Move towards a QP to post on; true once there is one. Idle with
    /// work: start a connect. Connecting: take the answer if it came.
    /// Broken: fail the waiting work until the backoff has passed, then
    /// connect again.
    fn advance(&mut self, done: &mut impl FnMut(RdmaCompletion)) -> bool {
        match self.state {
            State::Ready(_) => return true,
            State::Idle => {
                if !self.backlog.is_empty() {
                    self.link.start(&self.sq);
                    self.state = State::Connecting;
                }
            }
            State::Connecting => match self.link.try_take() {
                None => {}
                Some(Ok(q)) => {
                    self.state = State::Ready(q);
                    self.failures = 0;
                    self.qp_ok = false;
                    if self.connected_once {
                        self.replacements += 1;
                        if self.dropped_for_abort {
                            tracing::debug!(
                                peer = %self.peer,
                                replacements = self.replacements,
                                "rdma: QP replaced after an abort; re-posting flushed work"
                            );
                        } else {
                            tracing::info!(
                                peer = %self.peer,
                                replacements = self.replacements,
                                "rdma: QP replaced; re-posting flushed work"
                            );
                        }
                    }
                    self.connected_once = true;
                    return true;
                }
                Some(Err(e)) => self.connect_failed(&e, done),
            },
            State::Broken { kind, retry_ns } => {
                if !self.backlog.is_empty() {
                    if monotonic_ns() < retry_ns {
                        self.fail_backlog(kind, done);
                    } else {
                        self.link.start(&self.sq);
                        self.state = State::Connecting;
                    }
                }
            }
        }
        false
    }

    /// No QP could be connected: everything waiting fails with the
    /// connect's kind, and so does new work until the backoff has passed.
    fn connect_failed(&mut self, e: &Error, done: &mut impl FnMut(RdmaCompletion)) {
        let kind = e.kind();
        self.failures = self.failures.saturating_add(1);
        let backoff = self.back_off(kind, self.failures - 1);
        let peer = &*self.peer;
        crate::lograte::warn_limited!(
            (peer, kind),
            peer,
            error = %e,
            waiting = self.backlog.len(),
            retry_ms = backoff / 1_000_000,
            "rdma: cannot connect a QP; the slices waiting for it fail, and new ones until the retry"
        );
        self.fail_backlog(kind, done);
    }

    fn fail_backlog(&mut self, kind: ErrorKind, done: &mut impl FnMut(RdmaCompletion)) {
        while let Some(s) = self.backlog.pop_front() {
            done(RdmaCompletion {
                token: s.token,
                result: Err(kind),
                slice: s,
            });
        }
        self.publish_freed();
    }

    /// Drop the QP (destroying it: nothing posted on it can land after
    /// this), then settle what was in flight on it: an aborted slice ends
    /// with its abort's kind through `done`, the others go back to the
    /// backlog head (after those a drain put back), oldest first; `flush`
    /// asks for a new QP. With `fault` (the QP broke, not an abort) each
    /// counts a re-post, and slices re-posted too often fail instead.
    fn break_queue(&mut self, fault: bool, done: &mut impl FnMut(RdmaCompletion)) {
        if !self.is_connected() {
            return;
        }
        self.state = State::Idle;
        self.dropped_for_abort = !fault;
        let (backlog, mut at) = (&mut self.backlog, self.requeued);
        let (in_flight, _) = settle_orphans(&mut self.ledger, done, |mut s| {
            s.reposts += u8::from(fault);
            backlog.insert(at, s);
            at += 1;
        });
        // The QP is gone: nothing of it is in flight any more.
        self.sq.release(in_flight, 0);
        self.draining = false;
        self.requeued = 0;
        if !fault {
            return;
        }
        self.retire_queue();
        // From the second QP in a row that died before completing
        // anything, the next connect waits.
        if self.dead_qps < 2 {
            return;
        }
        let backoff = self.back_off(ErrorKind::Unreachable, self.dead_qps - 2);
        let peer = &*self.peer;
        crate::lograte::warn_limited!(
            (peer, "dead-qps"),
            peer,
            dead_qps = self.dead_qps,
            retry_ms = backoff / 1_000_000,
            "rdma: QPs to this peer die before completing anything; waiting before the next (its slices move on meanwhile)"
        );
    }

    /// Take the endpoint out of service (seed 004's one convergence
    /// function; see the module docs): the queue's admission is closed and
    /// its waiters woken before anything else, the QP destroyed, every
    /// ledger record orphaned and settled exactly once (an aborted slice
    /// ends with its abort's kind; the others, and every slice waiting in
    /// the backlog, go to the orphans for the caller to move on, each
    /// counted as a move), and the endpoint is `Broken` for a backoff
    /// doubling from 250 ms per terminal QP in a row (reset by a QP that
    /// completes work). Logged once per cause, with counts.
    fn converge(&mut self, cause: TerminalCause, done: &mut impl FnMut(RdmaCompletion)) {
        // Admission closed first: nothing new is admitted toward a queue
        // whose records are being settled.
        self.sq.mark_terminal();
        if !self.is_connected() {
            return;
        }
        self.state = State::Idle;
        self.dropped_for_abort = false;
        let orphans = &mut self.orphans;
        let (in_flight, aborted) = settle_orphans(&mut self.ledger, done, |mut s| {
            s.reposts = s.reposts.saturating_add(1);
            orphans.push_back(s);
        });
        self.sq.release(in_flight, 0);
        let waiting = self.backlog.len();
        self.orphans.extend(self.backlog.drain(..));
        self.draining = false;
        self.requeued = 0;
        self.terminals += 1;
        self.last_terminal = Some(cause);
        self.terminal_strikes = self.terminal_strikes.saturating_add(1);
        self.retire_queue();
        let backoff = self.back_off(ErrorKind::Unreachable, self.terminal_strikes - 1);
        let peer = &*self.peer;
        crate::lograte::warn_limited!(
            (peer, cause),
            peer,
            %cause,
            in_flight,
            aborted,
            waiting,
            retry_ms = backoff / 1_000_000,
            "rdma: endpoint terminal-degraded; its work moves on, a fresh QP after the backoff"
        );
        self.publish_occupancy();
    }

    /// The QP died: its `SqController` is terminal (it takes no more work;
    /// anyone holding it sees so at once) and the next QP gets a fresh
    /// one. A QP that completed nothing before it died counts toward
    /// `dead_qps`; one that did work resets the count.
    fn retire_queue(&mut self) {
        self.sq.mark_terminal();
        self.sq = Arc::new(SqController::with_diagnostics(
            self.depth,
            self.settings.resume_watermark,
            self.settings.wait_slice,
            self.diag.clone(),
        ));
        // Off the hot path (a QP died): submitters admit toward the new
        // controller from now on; tokens on the old one release into it.
        self.published.store(self.sq.clone());
        self.dead_qps = if self.qp_ok {
            0
        } else {
            self.dead_qps.saturating_add(1)
        };
    }

    /// `Broken` with `kind` for the first backoff doubled `doublings`
    /// times (at most [`BACKOFF_MAX_NS`]); returns the backoff in ns.
    fn back_off(&mut self, kind: ErrorKind, doublings: u32) -> u64 {
        let backoff = self
            .backoff_min_ns()
            .saturating_mul(1 << doublings.min(16))
            .min(BACKOFF_MAX_NS);
        self.state = State::Broken {
            kind,
            retry_ns: monotonic_ns().saturating_add(backoff),
        };
        backoff
    }

    /// Fail, through `done`, backlog slices flushed too many times.
    pub fn fail_exhausted(&mut self, done: &mut impl FnMut(RdmaCompletion)) {
        let mut i = 0;
        while i < self.backlog.len() {
            if self.backlog[i].reposts > MAX_REPOSTS {
                let s = self.backlog.remove(i).expect("index checked");
                // One fewer put back by a drain ahead of the rest.
                self.requeued -= usize::from(i < self.requeued);
                done(RdmaCompletion {
                    token: s.token,
                    result: Err(ErrorKind::Unreachable),
                    slice: s,
                });
            } else {
                i += 1;
            }
        }
        self.publish_freed();
    }
}

/// The QP of `ledger` is gone: orphan every record and settle each once.
/// An aborted one ends with its abort's kind through `done`; any other
/// goes to `keep`, oldest first. Returns (records settled, aborted ones).
fn settle_orphans(
    ledger: &mut SubmissionLedger<RdmaSlice>,
    done: &mut impl FnMut(RdmaCompletion),
    mut keep: impl FnMut(RdmaSlice),
) -> (u32, u32) {
    let mut aborted = 0;
    let n = ledger.insert_orphaned();
    ledger.extract_orphaned_records(|r| match r.abort {
        Some(kind) => {
            aborted += 1;
            done(RdmaCompletion {
                token: r.slice.token,
                result: Err(kind),
                slice: r.slice,
            });
        }
        None => keep(r.slice),
    });
    (n, aborted)
}

#[cfg(test)]
mod tests;
