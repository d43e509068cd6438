//! The worker: one pinned thread that owns a set of rings.
//!
//! Each turn it takes SQEs from its rings into priority lanes, posts slices
//! of the lane heads through the `can_send` gate and the per-transport
//! credit pools, reaps transport completions, and posts CQEs (or batch task
//! states). It busy-polls while there is work, then spins, yields and
//! finally parks on its doorbell after setting NEED_WAKEUP on every ring.
//! Nothing here allocates or locks once the worker is running, except when
//! rings are added or retired.
//!
//! The worker is owned parts, each in the file that defines it:
//! - `scheduler`: `Scheduler`, what to serve next and what an outcome means
//!   (lanes, promotion, the gate's view, HIGH's headroom, the turn budget);
//!   it reads no clock and calls no transport;
//! - `book`: `InFlightBook`, the slices out on asynchronous transports, by
//!   the transport instance that holds them;
//! - `views`: `Views`, the region, segment and transport tables as this
//!   worker sees them (`RANKED`, `resolve`);
//! - `rings`: `Rings`, the batch ring and the application rings, with the
//!   CQ slots owed to each;
//! - `turn_clock`: the turn's timestamp, read lazily (`asked_deadline`,
//!   `queued_deadline`);
//! - `idle`: the idle policy (`step`: spin, yield or park).
//!
//! This file keeps the loop (`run`, `turn`, the park). Each stage of a turn
//! lives in its own module, its decisions plain functions with unit tests:
//! - `intake`: SQEs into tasks queued with the scheduler, or delivered at
//!   once (refused, or done inline);
//! - `dispatch`: the scheduler's picks to transports (`judge` an outcome,
//!   `slice_len`, the one slice cut);
//! - `complete`: reaping into tasks, and `settle`;
//! - `failover`: to the next transport (`may_fail_over`, `next_transport`);
//! - `housekeeping`: deadline and cancel sweep (`SweepTimer`), `stop_task`,
//!   rings, unregister handshake, shutdown drain (`stop_reason`,
//!   `acked_epoch`).
//!
//! No stage finishes a task itself; they hand tasks on through queues:
//! intake queues with the scheduler; dispatch posts into the in-flight
//! book; dispatch, reaping and `stop_task` put a task they leave settled
//! (nothing more to post, nothing in flight) on the task table's due list;
//! `settle`, run after each of them, fails it over (back to the scheduler)
//! or delivers it. `Rings::deliver` is the one place a completion is
//! written: by `settle`, by intake for a request refused or done inline,
//! and by the shutdown drain for an SQE it takes but never accepts.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tent_rings::Sqe;
use tent_rings::spsc::{Consumer, Producer};

use super::EngineShared;
use super::task::TaskTable;
use crate::clock::{monotonic_ns, nanos};
use crate::doorbell::{Doorbell, Wakers};
use crate::flow::SqController;
use crate::qos::PriorityStats;
use crate::transport::{SliceCompletion, WorkerCtx};
use book::InFlightBook;
use housekeeping::SweepTimer;
pub(crate) use rings::WorkerRing;
use rings::{ParkCheck, Rings};
use scheduler::Scheduler;

mod book;
mod complete;
mod dispatch;
mod failover;
mod housekeeping;
mod idle;
mod intake;
mod rings;
mod scheduler;
mod turn_clock;
mod views;

pub(super) use dispatch::{Verdict, judge, slice_len};
pub(super) use rings::cqe_for;
pub(super) use turn_clock::TurnClock;
pub(super) use views::{RANKED, Views};

/// How soon a parked worker looks again at a ring blocked on CQ room.
const CQ_BLOCKED_RECHECK: Duration = Duration::from_millis(1);
/// Idle turns between two clock reads.
const IDLE_CLOCK_TURNS: u32 = 64;

/// What a worker shares with the engine and with submitters.
///
/// Each field that one side writes and the other reads on its hot path sits
/// on its own cache line (Rust reorders fields, so only padding guarantees
/// it): a submitter reads `exited` and may ring `doorbell` on every submit,
/// the worker reads `shutdown` / `has_new` every loop and writes the
/// counters on every completion.
pub(crate) struct WorkerShared {
    pub index: usize,
    /// Every worker's bell; this worker's is `wakers.get(index)`.
    pub wakers: Arc<Wakers>,
    pub new_rings: Mutex<Vec<WorkerRing>>,
    pub has_new: CachePadded<AtomicBool>,
    pub shutdown: CachePadded<AtomicBool>,
    /// Set when the worker has stopped taking SQEs.
    pub exited: CachePadded<AtomicBool>,
    /// The batch API's submission ring into this worker.
    pub batch_sq: Mutex<Producer<Sqe>>,
    /// Core this worker is pinned to, -1 when it is not, -2 until its
    /// thread has tried (`WorkerPool::start` waits that out).
    pub core: AtomicI64,
    /// Its window on each transport slot (`max_inflight_slices` slices
    /// handed to the transport and not completed): the engine's one
    /// flow-control type, as an RDMA send queue and a TCP connection's
    /// wire window are. Only this worker reserves and releases; others
    /// read it (`Engine::credits_in_flight`).
    pub credits: [SqController; 5],
    /// Requests, bytes, failures and intake-to-completion times, written
    /// only by this worker.
    pub ops: CachePadded<crate::metrics::ops::OpStats>,
    /// Its side of the unregister handshake (`Worker::ack_unregister`).
    pub region_ack: CachePadded<RegionAck>,
    /// Per-priority statistics (seed 001), written only by this worker.
    pub qos: CachePadded<PriorityStats>,
}

/// What a worker tells `Engine::unregister_memory`. Written only in
/// housekeeping and when idle, and only while an unregister is pending:
/// nothing per op.
#[derive(Debug, Default)]
pub(crate) struct RegionAck {
    /// Every region revoked at this unregister epoch or before is out of
    /// this worker: its cached region table is past the removal and no live
    /// task holds one (Release: what the tasks did to the memory happens
    /// before an unregister that reads it).
    pub epoch: AtomicU64,
    /// While it is behind: the latest deadline (monotonic ns) among its
    /// tasks that hold a revoked region, the drain's bound.
    pub wait_until: AtomicU64,
}

impl WorkerShared {
    /// This worker's doorbell.
    #[inline]
    pub(crate) fn doorbell(&self) -> &Doorbell {
        &self.wakers.get(self.index).bell
    }

    /// Is the worker parked, or about to be (see `WorkerBell::parked`)?
    pub(crate) fn parked(&self) -> bool {
        self.wakers.get(self.index).parked.load(Ordering::SeqCst)
    }

    /// Hand a new ring to the worker and wake it.
    pub(crate) fn adopt(&self, ring: WorkerRing) {
        self.new_rings.lock().push(ring);
        // Release: the ring's construction is visible to the worker that
        // sees the flag.
        self.has_new.store(true, Ordering::Release);
        self.doorbell().ring();
    }
}

pub(crate) struct Worker {
    /// This worker's proof for the transports (so `Worker` is `!Send`: it
    /// is built on its own thread).
    ctx: WorkerCtx,
    shared: Arc<WorkerShared>,
    engine: Arc<EngineShared>,
    /// The region, segment and transport tables as this worker sees them.
    views: Views,
    /// The gate opens to every priority at every instant
    /// (`SendGate::always_open`): intake's inline path does not ask it.
    gate_always_open: bool,
    /// The batch ring and the application rings it serves.
    rings: Rings,
    tasks: TaskTable,
    /// What to serve next: lanes, promotion, gate view, headroom, budget.
    sched: Scheduler,
    /// Where its slices in flight are.
    book: InFlightBook,
    /// What one poll of a transport hands back.
    reaped: Vec<SliceCompletion>,
    /// When the deadline and cancel sweep is due next.
    sweep: SweepTimer,
    /// The unregister epoch last acknowledged in `shared.region_ack`.
    region_ack: u64,
    block_size: u64,
    default_timeout_ns: u64,
    /// `max_timeout_ms`: the furthest deadline an SQE may ask for.
    max_timeout_ns: u64,
}

/// Slice completions one `poll` may hand back (`Worker::reaped`).
const REAP_BATCH: usize = 256;
/// Application rings a worker has room for before its list grows.
const RINGS_AT_START: usize = 64;

/// What one worker holds from the start, from the config alone: each term
/// is `size_of` of what `Worker::new` and `Engine::build` allocate for it,
/// so the figure follows the structs as they change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkerBytes {
    /// Task table (slots, free and due lists) and the three priority lanes:
    /// `max_tasks_per_worker` each.
    pub tasks: u64,
    /// The batch API's submission ring: `Config::batch_ring_depth` SQEs.
    pub batch_ring: u64,
    /// What does not depend on a key: reap buffer, ring and draining
    /// lists, the shared block.
    pub fixed: u64,
}

impl WorkerBytes {
    pub(crate) fn of(cfg: &crate::config::Config) -> WorkerBytes {
        use std::mem::size_of;
        let cap = u64::from(cfg.max_tasks_per_worker);
        // A slot, its free-list and due-list entries.
        let per_task = size_of::<super::task::Task>() + 2 * size_of::<u32>()
            // One lane entry per task in each of the three lanes.
            + 3 * size_of::<crate::qos::LaneEntry>();
        WorkerBytes {
            tasks: cap * per_task as u64,
            batch_ring: (tent_rings::region::HEADER_LEN
                + tent_rings::spsc::ring_bytes::<Sqe>(cfg.batch_ring_depth()))
                as u64,
            fixed: (REAP_BATCH * size_of::<SliceCompletion>()
                + RINGS_AT_START * size_of::<Option<WorkerRing>>()
                + book::DRAINING_AT_START * size_of::<book::PostedOn>()
                + size_of::<WorkerShared>()
                + size_of::<Worker>()) as u64,
        }
    }
}

impl Worker {
    pub(super) fn new(
        shared: Arc<WorkerShared>,
        engine: Arc<EngineShared>,
        batch_cq: Consumer<Sqe>,
        ctx: WorkerCtx,
    ) -> Worker {
        let cfg = &engine.config;
        let cap = cfg.max_tasks_per_worker as usize;
        Worker {
            sched: Scheduler::new(
                cap,
                nanos(cfg.transports.rdma.priority_promotion_timeout_us),
                cfg.max_inflight_slices,
                engine.gate.tracks_demand(),
            ),
            tasks: TaskTable::new(cap),
            reaped: vec![
                SliceCompletion {
                    token: 0,
                    result: Ok(0)
                };
                REAP_BATCH
            ],
            rings: Rings::new(batch_cq, RINGS_AT_START),
            book: InFlightBook::new(),
            sweep: SweepTimer::default(),
            region_ack: 0,
            block_size: cfg.block_size,
            default_timeout_ns: nanos(cfg.default_timeout_ms),
            max_timeout_ns: nanos(cfg.max_timeout_ms.max(cfg.default_timeout_ms)),
            views: Views::new(&engine),
            gate_always_open: engine.gate.always_open(),
            shared,
            engine,
            ctx,
        }
    }

    /// The worker thread's body.
    pub(super) fn run(mut self) {
        let cfg = &self.engine.config.workers;
        let spin_ns = nanos(cfg.spin_us);
        let yield_ns = spin_ns.saturating_add(nanos(cfg.yield_us));
        let park = cfg.park_timeout_ms;
        let mut predictor = idle::ArrivalPredictor::new(cfg.idle_poll_budget_pct);
        // While polling in a predicted window: the last clock reading (its
        // time is charged to the budget); 0 otherwise.
        let mut polling_at = 0u64;
        // The idle path ran (or the worker parked) since the last work, and
        // whether a submitter's wake-up ended a park since.
        let mut was_idle = false;
        let mut woke = false;
        let mut idle_since = 0u64;
        let mut idle_turns = 0u32;
        // A timed sleep ends when asked, not up to 50 µs later (the
        // default timer slack): the predicted wake-up depends on it.
        let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
        tracing::debug!(worker = self.shared.index, "worker started");
        loop {
            // Relaxed: a hint; the drain below re-reads everything it needs.
            if self.shared.shutdown.load(Ordering::Relaxed) {
                self.drain_on_shutdown();
                break;
            }
            if self.turn() {
                if was_idle {
                    // Work after an idle stretch: an arrival to learn from,
                    // stamped after its turn (stamping it at the last idle
                    // look or the wake-up instead lost the lock on a 1 ms
                    // pace here: p50 0.5 -> 74 us).
                    let now = monotonic_ns();
                    predictor.arrived(now, woke);
                    if polling_at != 0 {
                        predictor.polled(now, now.saturating_sub(polling_at));
                    }
                }
                polling_at = 0;
                was_idle = false;
                woke = false;
                idle_since = 0;
                idle_turns = 0;
                continue;
            }
            // Reading the clock costs as much as an idle turn: look at it
            // only every IDLE_CLOCK_TURNS idle turns.
            idle_turns = idle_turns.wrapping_add(1);
            if idle_turns % IDLE_CLOCK_TURNS != 0 {
                continue;
            }
            let now = monotonic_ns();
            if self.sweep.due(now) {
                self.housekeeping(now);
                self.settle();
                // A task it stopped (deadline, cancel) has its completion
                // written: publish it now, not after the park ahead.
                self.rings.flush();
            } else {
                // Idle (and before every park): an unregister waiting on
                // this worker, which rang its bell, need not wait for the
                // next housekeeping. One load when none is pending.
                self.ack_unregister();
            }
            if idle_since == 0 {
                idle_since = now;
            }
            was_idle = true;
            let queued = !self.sched.is_empty();
            let gated = queued && self.sched.gated();
            let state = idle::Idle {
                idle_ns: now - idle_since,
                spin_ns,
                yield_ns,
                queued,
                later: self.sched.later(),
                gated,
                in_flight: self.book.any(),
                // Looked at only when it matters (a loop over the
                // transports with slices posted; a virtual call).
                completions_wake: self.book.any() && self.book.completions_wake(),
                park,
                gate_recheck: if gated {
                    self.engine.gate.recheck_after()
                } else {
                    Duration::MAX
                },
            };
            let mut step = idle::step(&state);
            // Nothing at all to wait for: regular arrivals may say when the
            // next op comes (the worker's own state decides otherwise).
            if let idle::Step::Park {
                timeout,
                completions: false,
            } = step
                && !queued
                && !state.in_flight
            {
                match predictor.plan(now) {
                    idle::Plan::Poll => {
                        if polling_at != 0 {
                            predictor.polled(now, now.saturating_sub(polling_at));
                        }
                        polling_at = now;
                        step = idle::Step::Spin;
                    }
                    idle::Plan::SleepUntil(at) => {
                        polling_at = 0;
                        step = idle::Step::Park {
                            timeout: timeout.min(Duration::from_nanos(at.saturating_sub(now))),
                            completions: false,
                        };
                    }
                    idle::Plan::None => polling_at = 0,
                }
            }
            match step {
                idle::Step::Spin => std::hint::spin_loop(),
                idle::Step::Yield => std::thread::yield_now(),
                idle::Step::Park {
                    timeout,
                    completions,
                } => {
                    if self.park(timeout, completions) {
                        // Woken (by a submitter, or a completion): expect
                        // work, poll hot again.
                        idle_since = 0;
                        woke = true;
                    }
                }
            }
            // A timeout leaves `idle_since` old: IDLE_CLOCK_TURNS empty turns
            // (until the clock is read again), a housekeeping sweep, then
            // straight back to sleep instead of another spin/yield phase.
        }
        tracing::debug!(worker = self.shared.index, "worker stopped");
    }

    /// A task of `p` was accepted (`up`) or finished: tell the gate when
    /// the worker's first one comes or its last one goes.
    #[inline]
    fn count_live(&mut self, p: tent_rings::Priority, up: bool) {
        if self.sched.count_live(p, up) {
            self.engine.gate.demand(p, up);
        }
    }

    /// Sleep until a submitter rings, a ring is added, or `timeout`;
    /// returns true if something (not the timeout) woke it. With
    /// `completions`, a transport completing a slice also wakes it.
    ///
    /// Without `completions` it is only called with nothing in flight and
    /// either empty lanes, so no deadline needs this worker while it
    /// sleeps, or every lane head waiting on `Later`; with `completions` or
    /// `Later`, `timeout` is short enough for the deadline sweep.
    fn park(&mut self, timeout: Duration, completions: bool) -> bool {
        let seen = self.shared.doorbell().value();
        let bell = self.shared.wakers.clone();
        let bell = bell.get(self.shared.index);
        // Before any NEED_WAKEUP is flagged (see `WorkerBell::parked`).
        bell.parked.store(true, Ordering::SeqCst);
        if completions {
            // SeqCst store and fence, paired with Wakers::completion_ready:
            // a completion published after the poll below rings the bell.
            bell.awaiting.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            if self.reap() {
                bell.awaiting.store(false, Ordering::Relaxed);
                return true;
            }
        }
        let ParkCheck { empty, blocked } = self.rings.prepare_park();
        let mut woken = true;
        if empty
            && !self.shared.has_new.load(Ordering::Acquire)
            && !self.shared.shutdown.load(Ordering::Acquire)
        {
            let wait = if blocked {
                timeout.min(CQ_BLOCKED_RECHECK)
            } else {
                timeout
            };
            match self.book.parker().filter(|_| completions) {
                // Sleeps in the transport: its completions or the bell.
                Some(p) => {
                    p.clone()
                        .transport
                        .park(&self.ctx, self.shared.doorbell().word(), seen, wait)
                }
                None => self.shared.doorbell().wait(seen, wait),
            }
            woken = self.shared.doorbell().value() != seen;
        }
        self.rings.clear_need_wakeup();
        bell.awaiting.store(false, Ordering::Relaxed);
        bell.parked.store(false, Ordering::SeqCst);
        woken
    }

    /// One pass over rings, lanes and completions; true if anything moved.
    /// The clock is read only once there is something to time.
    fn turn(&mut self) -> bool {
        let mut work = false;
        // Relaxed fast check; the Acquire swap below synchronises with adopt().
        if self.shared.has_new.load(Ordering::Relaxed)
            && self.shared.has_new.swap(false, Ordering::Acquire)
        {
            self.adopt_rings();
            work = true;
        }
        self.sched.begin_turn();
        self.views.refresh_slots(&self.engine.transports);
        let mut clock = TurnClock::default();
        work |= self.intake(&mut clock);
        if !self.sched.is_empty() {
            let now = clock.now();
            self.sweep.looked();
            // Before posting: after a long park, deadlines are brought up
            // to date before the first slice goes out.
            if self.sweep.due(now) {
                self.housekeeping(now);
            }
            // The promotion timeout as reloaded (one load per turn that
            // has queued work).
            let moved = self.sched.promote(now, self.engine.live.promotion_ns());
            if moved != [0; 3] {
                self.shared.qos.promoted(moved);
            }
            work |= self.dispatch(now);
            self.settle();
        } else if work && let Some(now) = self.sweep.due_after_busy_turn(&mut clock) {
            // Ops done at intake read no clock: every CLOCKLESS_TURNS busy
            // turns one is read here, so deadlines of slices in flight and
            // cancels still come round under a stream of them. (An idle
            // turn is the idle loop's: it reads the clock on its own.)
            self.housekeeping(now);
            self.settle();
        }
        if self.book.any() {
            work |= self.reap_at(&mut clock);
        }
        self.rings.flush();
        work
    }
}
