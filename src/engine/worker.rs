//! The worker: one pinned thread that owns a set of rings.
//!
//! Each turn it takes SQEs from its rings into priority lanes, posts slices
//! of the lane heads through the `can_send` gate and the per-transport
//! credit pools, reaps transport completions, and posts CQEs (or batch task
//! states). It busy-polls while there is work, then spins, yields and
//! finally parks on its doorbell after setting NEED_WAKEUP on every ring.
//! Nothing here allocates or locks once the worker is running, except when
//! rings are added or retired.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};
use crossbeam_utils::CachePadded;
use tent_rings::spsc::{Consumer, Producer};
use tent_rings::{Cqe, ErrorKind, Priority, Sqe, TransportKind};

use super::batch::{BatchTask, Served, TaskState};
use super::task::{Held, Origin, SliceRecord, TaskTable};
use super::{EngineShared, slot_index};
use crate::clock::monotonic_ns;
use crate::doorbell::{CqBell, Doorbell, Wakers};
use crate::flow::SqController;
use crate::memory::RegionTable;
use crate::qos::{PriorityLanes, PriorityStats};
use crate::segment::{Segment, SegmentTable};
use crate::transport::{Installed, Slice, SliceCompletion, Slot, SubmitOutcome, WorkerCtx};

/// Every slot kind, indexed like `TransportSlots`.
const TRANSPORT_KINDS: [TransportKind; 5] = [
    TransportKind::Any,
    TransportKind::Local,
    TransportKind::Shm,
    TransportKind::Tcp,
    TransportKind::Rdma,
];

/// Transports best first. A request's ranked fallback list is this order
/// filtered by what is installed and reaches its segment (so what both
/// ends offer: RDMA → TCP for a remote peer, SHM → TCP for one on this
/// host); its `xport_priority` is the index here of its current transport.
pub(super) const RANKED: [TransportKind; 4] = [
    TransportKind::Local,
    TransportKind::Shm,
    TransportKind::Rdma,
    TransportKind::Tcp,
];

/// Bytes posted in one turn before the worker goes back to its rings, so a
/// HIGH request arriving behind large LOW ones waits for at most this.
/// Every slice is charged, the last of a task included.
const TURN_BYTES: u64 = 4 << 20;
/// A synchronous transport (local, shm) moves its bytes inside `submit`:
/// they cost the worker's own time, so they count this many times over.
/// 4 MiB / 16 = 256 KiB of memcpy a turn, about 20 µs at 14 GB/s: a HIGH
/// request behind a copying LOW stream waits that long, not the 300 µs of
/// 4 MiB.
const SYNC_BYTE_WEIGHT: u64 = 16;
/// SQEs taken from one ring per turn.
const INTAKE_PER_RING: usize = 64;
/// Deadline and cancel sweep period.
const HOUSEKEEPING_NS: u64 = 1_000_000;
/// How soon a parked worker looks again at a ring blocked on CQ room.
const CQ_BLOCKED_RECHECK: Duration = Duration::from_millis(1);
/// How often shutdown says which transports still hold slices.
const SHUTDOWN_LOG_NS: u64 = 1_000_000_000;
/// Idle turns of the shutdown drain spent yielding before it sleeps.
const SHUTDOWN_YIELDS: u32 = 1_000;
/// The shutdown drain's sleep between two polls once yielding is over.
const SHUTDOWN_NAP: Duration = Duration::from_micros(200);
/// Longest sleep while slices are in flight on transports that wake us,
/// or while every task waits on a transport that answered `Later`.
const COMPLETION_PARK: Duration = Duration::from_millis(1);
/// Idle turns between two clock reads.
const IDLE_CLOCK_TURNS: u32 = 64;

/// Worker-side ends of an application ring.
pub(crate) struct WorkerRing {
    pub sq: Consumer<Sqe>,
    pub cq: Option<Producer<Cqe>>,
    /// Accepted, not yet completed (each will need one CQ slot).
    pub outstanding: u32,
    pub cq_dirty: bool,
    /// The application's completion bell (ring API only).
    pub cq_bell: Option<Arc<CqBell>>,
}

impl WorkerRing {
    /// Can the CQ take one more CQE than the worker already owes? Every
    /// accepted SQE needs one, so SQEs are accepted only while this holds
    /// and posting a CQE never fails. Answers from the cached consumer head
    /// first. Always true for the batch ring (no CQ).
    #[inline]
    pub fn cq_has_room(&mut self) -> bool {
        let owed = self.outstanding as usize;
        self.cq.as_mut().is_none_or(|cq| cq.has_slots(owed + 1))
    }
}

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
    /// Core this worker is pinned to, or -1.
    pub core: AtomicI64,
    /// Its window on each transport slot (`max_inflight_slices` slices
    /// handed to the transport and not completed): the engine's one
    /// flow-control type, as an RDMA send queue and a TCP connection's
    /// wire window are. Only this worker reserves and releases; others
    /// read it (`Engine::credits_in_flight`).
    pub credits: [SqController; 5],
    pub completed_ops: CachePadded<AtomicU64>,
    pub completed_bytes: CachePadded<AtomicU64>,
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
    pub fn doorbell(&self) -> &Doorbell {
        &self.wakers.get(self.index).bell
    }

    /// Hand a new ring to the worker and wake it.
    pub fn adopt(&self, ring: WorkerRing) {
        self.new_rings
            .lock()
            .expect("worker ring list poisoned")
            .push(ring);
        // Release: the ring's construction is visible to the worker that
        // sees the flag.
        self.has_new.store(true, Ordering::Release);
        self.doorbell().ring();
    }
}

type RegionCache = Cache<Arc<ArcSwap<RegionTable>>, Arc<RegionTable>>;
type SegmentCache = Cache<Arc<ArcSwap<SegmentTable>>, Arc<SegmentTable>>;
type SlotCache = Cache<Slot, Option<Arc<Installed>>>;

pub(crate) struct Worker {
    /// This worker's proof for the transports (so `Worker` is `!Send`: it
    /// is built on its own thread).
    ctx: WorkerCtx,
    shared: Arc<WorkerShared>,
    engine: Arc<EngineShared>,
    // Local snapshots of the shared tables: one atomic load per use to see
    // whether they changed, instead of a full arc-swap load.
    regions: RegionCache,
    segments: SegmentCache,
    slots: [SlotCache; 5],
    rings: Vec<Option<WorkerRing>>,
    tasks: TaskTable,
    lanes: PriorityLanes,
    reaped: Vec<SliceCompletion>,
    async_inflight: u32,
    /// Per slot: the transport instance this worker has slices posted on,
    /// and how many. Reaping polls these instances, not the slot, so a swap
    /// does not orphan slices already posted.
    posted: [Option<PostedOn>; 5],
    /// Instances swapped out of their slot with slices still posted.
    draining: Vec<PostedOn>,
    next_housekeeping: u64,
    /// The last dispatch stopped because every lane head it could reach was
    /// answered `SubmitOutcome::Later`: the worker parks (briefly) rather
    /// than spin while the transport gets ready.
    later: bool,
    /// The last dispatch found every queued lane closed by the slot gate
    /// (nothing else to post): the worker naps `gate.recheck_after()`
    /// instead of spinning on it.
    gated: bool,
    /// Lanes the gate held back at the last look (bit per priority): a
    /// hold is counted once per closing.
    held: u8,
    /// Credits of a worker window that only HIGH slices may take (an
    /// eighth of `max_inflight_slices`): a window full of bulk slices
    /// still lets a HIGH slice out at once.
    high_headroom: u32,
    /// Live HIGH and MEDIUM tasks (accepted, not finished; indexed by
    /// priority): the gate hears when a count goes from 0 to 1 and back
    /// (`SendGate::demand`).
    live: [u32; 2],
    /// The unregister epoch last acknowledged in `shared.region_ack`.
    region_ack: u64,
    block_size: u64,
    default_timeout_ns: u64,
    /// `max_failover_attempts` (0: failover off for every request).
    max_failover: u8,
}

/// Slice completions one `poll` may hand back (`Worker::reaped`).
const REAP_BATCH: usize = 256;
/// Application rings a worker has room for before its list grows.
const RINGS_AT_START: usize = 64;
/// Swapped-out transport instances tracked before the list grows.
const DRAINING_AT_START: usize = 8;

/// What one worker holds from the start, from the config alone: each term
/// is `size_of` of what `Worker::new` and `Engine::build` allocate for it,
/// so the figure follows the structs as they change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkerBytes {
    /// Task table (slots and free list) and the three priority lanes:
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
        let per_task = size_of::<super::task::Task>() + size_of::<u32>()
            // One lane entry per task in each of the three lanes.
            + 3 * size_of::<crate::qos::LaneEntry>();
        WorkerBytes {
            tasks: cap * per_task as u64,
            batch_ring: (tent_rings::region::HEADER_LEN
                + tent_rings::spsc::ring_bytes::<Sqe>(cfg.batch_ring_depth()))
                as u64,
            fixed: (REAP_BATCH * size_of::<SliceCompletion>()
                + RINGS_AT_START * size_of::<Option<WorkerRing>>()
                + DRAINING_AT_START * size_of::<PostedOn>()
                + size_of::<WorkerShared>()
                + size_of::<Worker>()) as u64,
        }
    }
}

impl Worker {
    pub fn new(
        shared: Arc<WorkerShared>,
        engine: Arc<EngineShared>,
        batch_cq: Consumer<Sqe>,
        ctx: WorkerCtx,
    ) -> Worker {
        let cfg = &engine.config;
        let cap = cfg.max_tasks_per_worker as usize;
        let mut rings = Vec::with_capacity(RINGS_AT_START);
        rings.push(Some(WorkerRing {
            sq: batch_cq,
            cq: None,
            outstanding: 0,
            cq_dirty: false,
            cq_bell: None,
        }));
        Worker {
            lanes: PriorityLanes::new(
                cap,
                cfg.transports.rdma.priority_promotion_timeout_us * 1_000,
            ),
            tasks: TaskTable::new(cap),
            reaped: vec![
                SliceCompletion {
                    token: 0,
                    result: Ok(0)
                };
                REAP_BATCH
            ],
            rings,
            async_inflight: 0,
            posted: std::array::from_fn(|_| None),
            draining: Vec::with_capacity(DRAINING_AT_START),
            next_housekeeping: 0,
            later: false,
            gated: false,
            held: 0,
            high_headroom: cfg.max_inflight_slices / 8,
            live: [0; 2],
            region_ack: 0,
            block_size: cfg.block_size,
            default_timeout_ns: cfg.default_timeout_ms * 1_000_000,
            max_failover: cfg.max_failover_attempts.min(u32::from(u8::MAX)) as u8,
            regions: Cache::new(engine.regions.clone()),
            segments: Cache::new(engine.segments.clone()),
            slots: std::array::from_fn(|k| {
                Cache::new(engine.transports.slot(TRANSPORT_KINDS[k]).clone())
            }),
            shared,
            engine,
            ctx,
        }
    }

    /// The worker thread's body.
    pub fn run(mut self) {
        let cfg = &self.engine.config.workers;
        let spin_ns = cfg.spin_us * 1_000;
        let yield_ns = spin_ns + cfg.yield_us * 1_000;
        let park = Duration::from_millis(cfg.park_timeout_ms);
        let mut idle_since = 0u64;
        let mut idle_turns = 0u32;
        tracing::debug!(worker = self.shared.index, "worker started");
        loop {
            // Relaxed: a hint; the drain below re-reads everything it needs.
            if self.shared.shutdown.load(Ordering::Relaxed) {
                self.drain_on_shutdown();
                break;
            }
            if self.turn() {
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
            if now >= self.next_housekeeping {
                self.housekeeping(now);
            } else {
                // Idle (and before every park): an unregister waiting on
                // this worker, which rang its bell, need not wait for the
                // next housekeeping. One load when none is pending.
                self.ack_unregister();
            }
            if idle_since == 0 {
                idle_since = now;
            }
            let idle = now - idle_since;
            // `later`: every queued task waits on a transport getting
            // ready; the worker naps rather than spin.
            let queued = !self.lanes.is_empty();
            // Held back by the slot gate alone: a nap, like `later`, but
            // only as long as the gate says a slot may take to reopen.
            let gated = queued && self.gated;
            let later = queued && (self.later || gated);
            let mut nap = park.min(COMPLETION_PARK);
            if gated {
                nap = nap.min(self.engine.gate.recheck_after());
            }
            if idle < spin_ns {
                std::hint::spin_loop();
            } else if self.async_inflight > 0 && self.completions_wake() {
                // Everything in flight will ring the bell when it completes:
                // sleep instead of taking CPU from the transport's threads.
                // The 1 ms bound keeps deadlines and a closed gate honest.
                if self.park(nap, true) {
                    idle_since = 0;
                }
            } else if idle < yield_ns || (queued && !later) || self.async_inflight > 0 {
                std::thread::yield_now();
            } else if self.park(if later { nap } else { park }, false) {
                // Woken by a submitter: expect work, poll hot again.
                idle_since = 0;
            }
            // A timeout leaves `idle_since` old: one more turn, then straight
            // back to sleep instead of another spin/yield phase.
        }
        tracing::debug!(worker = self.shared.index, "worker stopped");
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
        let mut now = 0;
        work |= self.intake(&mut now);
        if !self.lanes.is_empty() {
            if now == 0 {
                now = monotonic_ns();
            }
            // Before posting: after a long park, deadlines are brought up
            // to date before the first slice goes out.
            if now >= self.next_housekeeping {
                self.housekeeping(now);
            }
            let moved = self.lanes.promote(now);
            if moved != [0; 3] {
                self.shared.qos.promoted(moved);
            }
            work |= self.dispatch(now);
        } else if now != 0 && now >= self.next_housekeeping {
            self.housekeeping(now);
        }
        if self.async_inflight > 0 {
            work |= self.reap();
        }
        self.flush_cqs();
        work
    }

    fn adopt_rings(&mut self) {
        let new: Vec<WorkerRing> = std::mem::take(
            &mut *self
                .shared
                .new_rings
                .lock()
                .expect("worker ring list poisoned"),
        );
        for r in new {
            match self.rings.iter().position(Option::is_none) {
                Some(i) => self.rings[i] = Some(r),
                None => self.rings.push(Some(r)),
            }
        }
    }

    /// Move SQEs from the rings into tasks and lanes.
    fn intake(&mut self, now: &mut u64) -> bool {
        let mut work = false;
        for ri in 0..self.rings.len() {
            let mut taken = 0;
            while taken < INTAKE_PER_RING && !self.tasks.is_full() {
                let Some(ring) = self.rings[ri].as_mut() else {
                    break;
                };
                if !ring.cq_has_room() {
                    break;
                }
                let Some(sqe) = ring.sq.pop() else {
                    break;
                };
                taken += 1;
                let origin = if ring.cq.is_some() {
                    ring.outstanding += 1;
                    Origin::Ring(ri as u32)
                } else {
                    Origin::Batch
                };
                if *now == 0 {
                    *now = monotonic_ns();
                }
                self.accept(origin, &sqe, *now);
            }
            if taken > 0 {
                if let Some(ring) = self.rings[ri].as_mut() {
                    ring.sq.sync();
                }
                work = true;
            }
        }
        work
    }

    /// Validate an SQE and queue it, or complete it at once with the reason.
    fn accept(&mut self, origin: Origin, sqe: &Sqe, now: u64) {
        let user_data = sqe.user_data();
        match self.validate(sqe, now) {
            Err(kind) => self.deliver(origin, user_data, Err(kind), true, 0, Served::default()),
            Ok(v) => {
                let Some(i) = self.tasks.alloc() else {
                    // Unreachable: intake checks is_full() first.
                    self.deliver(
                        origin,
                        user_data,
                        Err(ErrorKind::SqFull),
                        false,
                        0,
                        Served::default(),
                    );
                    return;
                };
                let t = self.tasks.get_mut(i);
                t.origin = origin;
                t.user_data = user_data;
                t.opcode = v.opcode;
                t.local = v.local;
                t.local_region = Some(v.region);
                t.segment = Some(v.segment);
                t.remote = sqe.remote().offset;
                t.len = sqe.len();
                t.posted = 0;
                t.done = 0;
                t.inflight = 0;
                t.error = None;
                t.deadline_ns = v.deadline_ns;
                t.priority = v.priority;
                t.transport = v.transport;
                t.xport_priority = v.xport_priority;
                t.failover_count = 0;
                t.no_failover = sqe.no_failover();
                t.failing = None;
                t.failing_on = TransportKind::Any;
                t.exhausted = false;
                t.last_slice = SliceRecord::default();
                t.accepted_ns = now;
                t.waited = false;
                self.shared.qos.accepted(v.priority);
                self.count_live(v.priority, true);
                // Lanes are as large as the task table: this cannot fail.
                let queued = self.lanes.push(v.priority, i, now);
                debug_assert!(queued);
            }
        }
    }

    fn validate(&mut self, sqe: &Sqe, now: u64) -> Result<Accepted, ErrorKind> {
        // A flag bit or reserved byte this version does not know: a newer
        // client's request, refused rather than run with part of it ignored.
        if sqe.has_unknown_fields() {
            return Err(ErrorKind::InvalidArgument);
        }
        let opcode = sqe.opcode().ok_or(ErrorKind::InvalidArgument)?;
        let priority = sqe.priority().ok_or(ErrorKind::InvalidArgument)?;
        let hint = sqe.transport_hint().ok_or(ErrorKind::InvalidArgument)?;
        if sqe.is_empty() {
            return Err(ErrorKind::InvalidArgument);
        }
        let local = sqe.local();
        let region = self
            .regions
            .load()
            .get(local.region)
            .filter(|r| !r.is_revoked())
            .ok_or(ErrorKind::AddressNotRegistered)?;
        let ptr = region.slice_ptr(local.offset, sqe.len())?;
        let region = Held::new(&**region);
        let segment = Held::new(
            &**self
                .segments
                .load()
                .get(sqe.remote().segment)
                // Closed, in a table this worker has not refreshed yet.
                .filter(|s| s.closed_epoch() == 0)
                .ok_or(ErrorKind::SegmentNotFound)?,
        );
        // The segment is in this worker's cached table, which holds it until
        // the next load; a task made from it is live, which keeps it (see
        // `Held`).
        // SAFETY: held by the cached table until this worker's next load.
        let live_segment = unsafe { segment.get() };
        let (xport_priority, transport) = self
            .resolve(live_segment, 0, hint)
            .ok_or(ErrorKind::Unreachable)?;
        let deadline_ns = match sqe.deadline_ns() {
            0 => now + self.default_timeout_ns,
            d if d <= now => return Err(ErrorKind::Timeout),
            d => d,
        };
        Ok(Accepted {
            opcode,
            priority,
            local: ptr,
            region,
            segment,
            transport,
            xport_priority,
            deadline_ns,
        })
    }

    /// The best transport at rank `from` or below that is installed and
    /// reaches `segment` (only `only`, unless it is `Any`), with its rank.
    fn resolve(
        &mut self,
        segment: &Segment,
        from: usize,
        only: TransportKind,
    ) -> Option<(u8, TransportKind)> {
        for (rank, &kind) in RANKED.iter().enumerate().skip(from) {
            if only != TransportKind::Any && kind != only {
                continue;
            }
            if let Some(installed) = self.slots[slot_index(kind)].load().as_ref()
                && installed.transport.reaches(segment)
            {
                return Some((rank as u8, kind));
            }
        }
        None
    }

    /// May task `i` fail over from a transient `kind` at all?
    #[inline]
    fn may_fail_over(&mut self, i: u32, kind: ErrorKind) -> bool {
        let max = self.max_failover;
        let t = self.tasks.get_mut(i);
        kind.is_transient() && !t.no_failover && max > 0 && kind != ErrorKind::Timeout
    }

    /// Move task `i`, whose current transport failed with `cause`, to the
    /// next transport in its ranked list (TENT's `resubmitTransferTask`).
    /// Posting resumes at the task's cursor: the caller has made sure that
    /// everything before it is done and nothing after it is in flight on
    /// the old transport. Returns false, with the task's error set, when
    /// the budget is spent or no transport is left.
    fn fail_over(&mut self, i: u32, cause: ErrorKind) -> bool {
        let max = self.max_failover;
        let t = self.tasks.get_mut(i);
        let from = t.transport;
        t.failing = None;
        // SAFETY: task `i` is live (it is failing over), and stays so here.
        let segment = unsafe { t.segment.expect("live task has a segment").get() };
        // A dead peer fails every task it had, and every task after it:
        // each of these lines is logged once per (segment, transport,
        // cause), then summarised with a count at most once a second.
        let peer = segment.name();
        let key = (segment.id(), from, cause);
        if t.failover_count >= max {
            crate::lograte::warn_limited!(
                key,
                %peer,
                %cause,
                "Task failover limit reached ({max}), last transport={from}"
            );
            return self.exhaust(i, cause);
        }
        let from_rank = usize::from(t.xport_priority) + 1;
        let Some((rank, to)) = self.resolve(segment, from_rank, TransportKind::Any) else {
            crate::lograte::warn_limited!(
                key,
                %peer,
                %cause,
                "No more transports available after {from} failed"
            );
            return self.exhaust(i, cause);
        };
        let t = self.tasks.get_mut(i);
        t.failover_count += 1;
        t.transport = to;
        t.xport_priority = rank;
        crate::lograte::info_limited!(
            (segment.id(), from, to, cause),
            %peer,
            cause = %cause,
            "Transport failover: {from} -> {to} (attempt {}/{max})",
            t.failover_count
        );
        self.engine.metrics.failover(from, to);
        true
    }

    /// Task `i` has no failover left: it fails with `cause`. Always false
    /// (what `fail_over` returns then).
    fn exhaust(&mut self, i: u32, cause: ErrorKind) -> bool {
        let t = self.tasks.get_mut(i);
        t.error = Some(cause);
        t.exhausted = true;
        self.engine.metrics.exhausted();
        false
    }

    /// Completion-stage failover: task `i`'s slices on the failed transport
    /// have drained; which of them landed is not known per byte, so the
    /// whole request runs again on the next transport (as TENT resubmits a
    /// task). Returns false, with the error set, if it cannot.
    fn resubmit(&mut self, i: u32, cause: ErrorKind) -> bool {
        let t = self.tasks.get_mut(i);
        if t.failing_on == t.transport {
            if !self.fail_over(i, cause) {
                return false;
            }
        } else {
            // A straggler of a transport it already left failed: run
            // again on the current one, no switch spent.
            t.failing = None;
        }
        let t = self.tasks.get_mut(i);
        t.posted = 0;
        t.done = 0;
        let priority = t.priority;
        // The task may still sit in a lane (a multi-slice task failing
        // while not at the head): one entry only.
        self.lanes.retain(|x| x != i);
        let queued = self.lanes.push(priority, i, monotonic_ns());
        debug_assert!(queued, "lanes are as large as the task table");
        true
    }

    /// Post slices of lane heads.
    fn dispatch(&mut self, now: u64) -> bool {
        let mut work = false;
        let mut budget = TURN_BYTES;
        // Per lane, the first task its transport answered `Later` (or
        // `SqFull` with slices in flight: back-pressure) this
        // turn: when it is that lane's head again, every head of the lane
        // is waiting, and the lane is passed over for the rest of the turn
        // (`waiting`), so the lanes below it still post. `Later` answers
        // are also counted: past one per queued task (the gate moved while
        // we went round), the turn ends.
        let mut first_later: [Option<u32>; 3] = [None; 3];
        let mut waiting: u8 = 0;
        let mut laters = 0usize;
        let most_laters = self.lanes.len();
        self.later = false;
        self.gated = false;
        while let Some((p, entry)) = self.lanes.next_except(&*self.engine.gate, waiting, now) {
            let i = entry.task;
            if first_later[p.index()] == Some(i) {
                waiting |= 1 << p.index();
                self.later = true;
                continue;
            }
            let t = self.tasks.get_mut(i);
            if !t.live || t.stopped {
                // Stopped (deadline, cancel): nothing to post.
                self.lanes.pop(p);
                continue;
            }
            let stop = if t.batch_task().is_some_and(|b| b.cancel_requested()) {
                Some(ErrorKind::Canceled)
            } else {
                (now >= t.deadline_ns).then_some(ErrorKind::Timeout)
            };
            if let Some(kind) = stop {
                self.lanes.pop(p);
                self.stop_task(i, kind);
                work = true;
                continue;
            }
            if t.posting_done() {
                self.lanes.pop(p);
                self.maybe_finish(i);
                work = true;
                continue;
            }
            let kind = t.transport;
            let pool = &self.shared.credits[slot_index(kind)];
            let Some(installed) = self.slots[slot_index(kind)].load().as_ref() else {
                t.error.get_or_insert(ErrorKind::Unreachable);
                continue;
            };
            // Credits bound slices in flight; a synchronous transport has
            // none in flight once submit returns, so it needs none.
            let credited = !installed.caps.synchronous;
            if credited && p != Priority::High && pool.available() <= self.high_headroom {
                // The rest of the window is HIGH's: this lane (and those
                // below it, which meet the same) waits for completions.
                waiting |= 1 << p.index();
                continue;
            }
            if credited && pool.try_reserve(1).is_err() {
                // Every credit is in flight: wait for completions.
                break;
            }
            let slice = match installed.caps.slice_bytes {
                0 => self.block_size,
                n => n,
            };
            let len = slice.min(t.len - t.posted);
            let offset = t.posted;
            // SAFETY: `t` is live (checked at the top of the loop).
            let segment = unsafe { t.segment.expect("live task has a segment").get() };
            // SAFETY: `t` is live (checked at the top of the loop).
            let region = unsafe { t.local_region.expect("live task has a region").get() };
            let slice = Slice {
                token: t.token(i),
                opcode: t.opcode,
                local: t.local.wrapping_add(offset as usize),
                region,
                segment,
                remote: t.remote + offset,
                len,
                rest: t.len - offset,
                priority: p,
            };
            let mut outcome = [SubmitOutcome::Rejected(ErrorKind::Unreachable)];
            installed
                .transport
                .submit(&self.ctx, std::slice::from_ref(&slice), &mut outcome);
            t.posted += len;
            t.last_slice = SliceRecord {
                rail: 0,
                bytes: len,
                post_ns: now,
            };
            // Not started, and no fault: the transport is getting ready for
            // it (`Later`), or answers back-pressure (`SqFull`) while this
            // worker has slices in flight, whose completions will free
            // room. The task keeps its place (and its deadline) behind the
            // others of its lane, which may go elsewhere this turn (another
            // peer, a rail with room); the lane is passed over once its
            // head is this task again.
            // A transport that finishes a slice `SqFull` (RDMA: its queues
            // went `sq_backoff_timeout_us` without a completion) means no
            // wait will help: that is a failure, failed over below.
            let deferred = match outcome[0] {
                SubmitOutcome::Later => true,
                SubmitOutcome::Rejected(ErrorKind::SqFull) => self.async_inflight > 0,
                _ => false,
            };
            if deferred {
                if credited {
                    pool.release(1, now);
                }
                t.posted -= len;
                self.lanes.rotate(p);
                first_later[p.index()].get_or_insert(i);
                laters += 1;
                if laters > most_laters {
                    self.later = true;
                    break;
                }
                continue;
            }
            // A slice the transport did not start, or finished with a
            // transient fault at once, has moved no byte that matters: its
            // range (and the rest of the task) moves to the next transport
            // right away, while slices already posted on this one finish
            // there. Nothing is posted twice (submit-stage failover).
            let refused = match outcome[0] {
                SubmitOutcome::Rejected(e) | SubmitOutcome::Completed(Err(e))
                    if e.is_transient() =>
                {
                    Some(e)
                }
                _ => None,
            };
            if let Some(e) = refused {
                if credited {
                    pool.release(1, now);
                }
                t.posted -= len;
                if self.may_fail_over(i, e) && self.fail_over(i, e) {
                    work = true;
                    continue;
                }
                let t = self.tasks.get_mut(i);
                t.error.get_or_insert(e);
                self.lanes.pop(p);
                self.maybe_finish(i);
                work = true;
                continue;
            }
            let t = self.tasks.get_mut(i);
            if !t.waited {
                // Its first slice is out: the queue wait QoS is judged by.
                t.waited = true;
                self.shared
                    .qos
                    .waited(t.priority, now.saturating_sub(t.accepted_ns));
            }
            match outcome[0] {
                SubmitOutcome::Completed(res) => {
                    if credited {
                        pool.release(1, now);
                    }
                    match res {
                        Ok(n) => t.done += n,
                        Err(e) => {
                            t.error.get_or_insert(e);
                        }
                    }
                }
                SubmitOutcome::Posted => {
                    t.inflight += 1;
                    self.async_inflight += 1;
                    let k = slot_index(kind);
                    match &mut self.posted[k] {
                        Some(p) if Arc::ptr_eq(&p.transport, installed) => p.inflight += 1,
                        other => {
                            // First post on this instance (or the slot was
                            // swapped): keep the previous one polled until
                            // its slices drain. Rare: the only Arc clone.
                            let next = PostedOn {
                                kind,
                                transport: installed.clone(),
                                inflight: 1,
                            };
                            if let Some(prev) = other.replace(next)
                                && prev.inflight > 0
                            {
                                self.draining.push(prev);
                            }
                        }
                    }
                }
                SubmitOutcome::Rejected(e) => {
                    if credited {
                        pool.release(1, now);
                    }
                    t.posted -= len;
                    t.error.get_or_insert(e);
                }
                SubmitOutcome::Later => unreachable!("deferred above"),
            }
            work = true;
            let done = t.posting_done();
            if done {
                // Its admission (seed 004) was for work not yet posted:
                // none is left, so the queue's room goes back now.
                if let Some(b) = t.batch_task() {
                    b.admission().release();
                }
                self.lanes.pop(p);
                self.maybe_finish(i);
            }
            let cost = if credited {
                len
            } else {
                len.saturating_mul(SYNC_BYTE_WEIGHT)
            };
            budget = budget.saturating_sub(cost);
            if budget == 0 {
                if !done {
                    self.lanes.rotate(p);
                }
                break;
            }
        }
        self.note_gate(waiting, now);
        work
    }

    /// After a dispatch: which lanes with work did the slot gate hold
    /// back? Counts each closing once, and marks the worker `gated` when
    /// nothing but the gate stops it (it then naps instead of spinning).
    fn note_gate(&mut self, waiting: u8, now: u64) {
        let gate = &*self.engine.gate;
        let mut closed = 0u8;
        let mut open_work = false;
        for p in Priority::ALL {
            if self.lanes.lane_is_empty(p) || waiting & (1 << p.index()) != 0 {
                continue;
            }
            if gate.can_send(p, now) {
                open_work = true;
            } else {
                closed |= 1 << p.index();
                if self.held & (1 << p.index()) == 0 {
                    self.shared.qos.gate_held(p);
                }
            }
        }
        self.held = closed;
        self.gated = closed != 0 && !open_work && waiting == 0;
    }

    /// Reap completions of posted slices from every transport instance
    /// that has some.
    fn reap(&mut self) -> bool {
        let now = monotonic_ns();
        let mut any = false;
        for k in 0..self.posted.len() {
            let Some(p) = self.posted[k].as_mut() else {
                continue;
            };
            if p.inflight == 0 {
                continue;
            }
            let n = p.transport.transport.poll(&self.ctx, &mut self.reaped);
            p.inflight = p.inflight.saturating_sub(n as u32);
            let kind = p.kind;
            any |= self.complete_slices(kind, n, now);
        }
        let mut d = 0;
        while d < self.draining.len() {
            let p = &mut self.draining[d];
            let n = p.transport.transport.poll(&self.ctx, &mut self.reaped);
            p.inflight = p.inflight.saturating_sub(n as u32);
            let (kind, done) = (p.kind, p.inflight == 0);
            any |= self.complete_slices(kind, n, now);
            if done {
                self.draining.swap_remove(d);
            } else {
                d += 1;
            }
        }
        any
    }

    /// Account the first `n` entries of `self.reaped`, posted on `kind`.
    fn complete_slices(&mut self, kind: TransportKind, n: usize, now: u64) -> bool {
        for c in 0..n {
            let SliceCompletion { token, result } = self.reaped[c];
            self.shared.credits[slot_index(kind)].release(1, now);
            self.async_inflight = self.async_inflight.saturating_sub(1);
            let Some((i, t)) = self.tasks.by_token(token) else {
                continue;
            };
            t.inflight = t.inflight.saturating_sub(1);
            match result {
                Ok(b) => t.done += b,
                Err(e) => {
                    if t.error.is_none() && t.failing.is_none() {
                        if self.may_fail_over(i, e) {
                            // Stop posting here; fail over once the rest
                            // of its slices on this transport drain.
                            let t = self.tasks.get_mut(i);
                            t.failing = Some(e);
                            t.failing_on = kind;
                        } else {
                            self.tasks.get_mut(i).error = Some(e);
                        }
                    }
                }
            }
            if self.tasks.get_mut(i).posting_done() {
                self.maybe_finish(i);
            }
        }
        n > 0
    }

    /// Deliver and free task `i` once nothing more will be posted for it
    /// and nothing of it is in flight: its completion (CQE or batch state)
    /// says no transport touches its memory any more, even for a task that
    /// failed, timed out or was canceled while slices were out (those are
    /// aborted first: `stop_task`).
    fn maybe_finish(&mut self, i: u32) {
        let t = self.tasks.get_mut(i);
        if !t.live || !t.posting_done() || t.inflight > 0 {
            return;
        }
        if t.error.is_none()
            && let Some(cause) = t.failing
            && self.resubmit(i, cause)
        {
            // Queued again on the next transport; still PENDING.
            return;
        }
        let t = self.tasks.get_mut(i);
        let res = match t.error {
            Some(e) => Err(e),
            None => Ok(t.done),
        };
        let (origin, user_data) = (t.origin, t.user_data);
        let served = Served {
            transport: t.transport,
            failover_count: t.failover_count,
            exhausted: t.exhausted,
        };
        let (done, priority) = (t.done, t.priority);
        self.deliver_task(origin, user_data, res, done, served);
        self.tasks.release(i);
        self.count_live(priority, false);
    }

    /// A task of `p` was accepted (`up`) or finished: tell the gate when
    /// the worker's first one comes or its last one goes.
    fn count_live(&mut self, p: Priority, up: bool) {
        // Nothing is reserved for LOW: its tasks are not counted.
        if p == Priority::Low {
            return;
        }
        let n = &mut self.live[p.index()];
        let edge = if up {
            *n += 1;
            *n == 1
        } else {
            *n -= 1;
            *n == 0
        };
        if edge {
            self.engine.gate.demand(p, up);
        }
    }

    /// Stop task `i` (its deadline passed, it was canceled, or the engine
    /// is shutting down): it fails with `kind` unless it failed already,
    /// nothing more of it is posted, and every transport instance with
    /// slices in flight is told to abort its slices. Its completion goes
    /// out once the last of them is back (`maybe_finish`).
    fn stop_task(&mut self, i: u32, kind: ErrorKind) {
        let t = self.tasks.get_mut(i);
        t.error.get_or_insert(kind);
        t.stopped = true;
        // A multi-slice task may sit in a lane with slices in flight: take
        // it out in every case.
        t.posted = t.posted.max(t.len);
        let (inflight, token) = (t.inflight, t.token(i));
        self.lanes.retain(|x| x != i);
        if inflight > 0 {
            // Which instances hold its slices is not tracked per task; a
            // transport with none of them does nothing.
            for p in self.posted.iter().flatten().chain(self.draining.iter()) {
                if p.inflight > 0 {
                    p.transport.transport.abort(&self.ctx, token, kind);
                }
            }
        }
        self.maybe_finish(i);
    }

    /// Deliver a finished task (with the bytes it moved) and count it.
    fn deliver_task(
        &mut self,
        origin: Origin,
        user_data: u64,
        res: Result<u64, ErrorKind>,
        done: u64,
        served: Served,
    ) {
        self.deliver(origin, user_data, res, false, done, served);
        if res.is_ok() {
            // Single writer (this worker): a plain store, no locked RMW.
            let s = &self.shared;
            let ops = s.completed_ops.load(Ordering::Relaxed);
            s.completed_ops.store(ops + 1, Ordering::Relaxed);
            let bytes = s.completed_bytes.load(Ordering::Relaxed);
            s.completed_bytes.store(bytes + done, Ordering::Relaxed);
        }
    }

    /// Post a completion for `origin`: a CQE, or the batch task's state.
    /// `validation`: the request was refused before any byte moved.
    fn deliver(
        &mut self,
        origin: Origin,
        user_data: u64,
        res: Result<u64, ErrorKind>,
        validation: bool,
        done: u64,
        served: Served,
    ) {
        match origin {
            Origin::Batch => {
                // SAFETY: a batch SQE's user_data is a BatchTask address kept alive until it leaves Pending (which this store does).
                let slot = unsafe { BatchTask::from_user_data(user_data) };
                slot.finish(
                    TaskState::for_result(res, validation),
                    done,
                    res.err(),
                    served,
                );
            }
            Origin::Ring(ri) => {
                let Some(ring) = self.rings[ri as usize].as_mut() else {
                    return;
                };
                let cqe = Cqe::new(user_data, res)
                    .with_transport(served.transport)
                    .with_failover_count(served.failover_count)
                    .with_fallback(res.is_ok() && served.failover_count > 0)
                    .with_failover_exhausted(served.exhausted);
                if let Some(cq) = ring.cq.as_mut() {
                    // Intake reserved this slot: the push cannot fail.
                    let pushed = cq.push(cqe).is_ok();
                    debug_assert!(pushed, "CQ slot was reserved at intake");
                }
                ring.outstanding = ring.outstanding.saturating_sub(1);
                ring.cq_dirty = true;
            }
        }
    }

    /// Publish CQEs posted this turn (one Release store per ring).
    fn flush_cqs(&mut self) {
        for ring in self.rings.iter_mut().flatten() {
            if ring.cq_dirty {
                ring.cq_dirty = false;
                if let Some(cq) = ring.cq.as_mut() {
                    cq.sync();
                    // Relaxed: see CqBell. needs_wakeup() fences (SeqCst)
                    // before it reads NEED_WAKEUP, pairing with the
                    // application's prepare_park().
                    if let Some(b) = &ring.cq_bell
                        && b.armed.load(Ordering::Relaxed)
                        && cq.needs_wakeup()
                    {
                        b.bell.ring();
                    }
                }
            }
        }
    }

    /// Deadlines, cancels, retiring rings whose application went away, and
    /// the unregister handshake.
    fn housekeeping(&mut self, now: u64) {
        self.next_housekeeping = now + HOUSEKEEPING_NS;
        self.ack_unregister();
        self.shared.qos.set_queued(self.lanes.lens());
        if self.tasks.active() > 0 {
            for i in 0..self.tasks.capacity() as u32 {
                let t = self.tasks.get_mut(i);
                if !t.live || t.stopped {
                    continue;
                }
                let canceled = t.batch_task().is_some_and(|b| b.cancel_requested());
                if canceled {
                    self.stop_task(i, ErrorKind::Canceled);
                } else if now >= t.deadline_ns {
                    self.stop_task(i, ErrorKind::Timeout);
                }
            }
        }
        // A ring whose application dropped it: once nothing is owed to it,
        // retire it, discarding SQEs nobody can read the completions of.
        for slot in self.rings.iter_mut().skip(1) {
            let retire = slot
                .as_mut()
                .is_some_and(|r| r.outstanding == 0 && r.sq.is_producer_closed());
            if retire {
                *slot = None;
            }
        }
    }

    /// The unregister handshake: once the engine publishes a new unregister
    /// epoch, refresh the cached region table past it (so a parked worker
    /// does not keep a removed region alive) and acknowledge the epoch as
    /// far as no live task holds a region revoked at or before it; also say
    /// until when such tasks may run. One Acquire load when nothing is
    /// pending; the task scan runs only while an unregister waits.
    fn ack_unregister(&mut self) {
        // Acquire: pairs with the engine's Release publish of the epoch,
        // so the revokes and the table store before it are seen here.
        let epoch = self.engine.region_epoch.load(Ordering::Acquire);
        if epoch == self.region_ack {
            return;
        }
        let _ = self.regions.load();
        let _ = self.segments.load();
        let (mut oldest, mut wait_until) = (u64::MAX, 0);
        if self.tasks.active() > 0 {
            for i in 0..self.tasks.capacity() as u32 {
                let t = self.tasks.get_mut(i);
                if !t.live {
                    continue;
                }
                // SAFETY: the task is live.
                let (revoked, closed) = unsafe {
                    (
                        t.local_region.map_or(0, |r| r.get().revoked_epoch()),
                        t.segment.map_or(0, |s| s.get().closed_epoch()),
                    )
                };
                for e in [revoked, closed] {
                    if e != 0 {
                        oldest = oldest.min(e);
                        wait_until = wait_until.max(t.deadline_ns);
                    }
                }
            }
        }
        let acked = epoch.min(oldest.saturating_sub(1));
        let ack = &self.shared.region_ack;
        ack.wait_until.store(wait_until, Ordering::Relaxed);
        if acked != self.region_ack {
            ack.epoch.store(acked, Ordering::Release);
            self.region_ack = acked;
        }
    }

    /// Do all transports with slices in flight wake this worker when one
    /// completes?
    fn completions_wake(&self) -> bool {
        self.posted
            .iter()
            .flatten()
            .chain(self.draining.iter())
            .all(|p| p.inflight == 0 || p.transport.caps.wakes_worker)
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
        let mut empty = true;
        let mut blocked = false;
        for ring in self.rings.iter_mut().flatten() {
            if !ring.cq_has_room() {
                // The application is behind on reaping: its SQEs wait for CQ
                // room, which no doorbell announces. Look again soon.
                blocked = true;
                continue;
            }
            if !ring.sq.prepare_park() {
                empty = false;
                break;
            }
        }
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
            self.shared.doorbell().wait(seen, wait);
            woken = self.shared.doorbell().value() != seen;
        }
        for ring in self.rings.iter_mut().flatten() {
            ring.sq.clear_need_wakeup();
        }
        bell.awaiting.store(false, Ordering::Relaxed);
        woken
    }

    /// Finish everything still queued with `Shutdown` so no caller waits forever.
    fn drain_on_shutdown(&mut self) {
        // SeqCst, paired with the fence in `Ring::submit`: a submitter either
        // sees `exited` or its SQEs are seen by the drain below.
        self.shared.exited.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        // Rings handed over but not adopted yet hold SQEs too.
        self.shared.has_new.store(false, Ordering::Relaxed);
        self.adopt_rings();
        for ri in 0..self.rings.len() {
            while let Some(ring) = self.rings[ri].as_mut() {
                // A CQ the application stopped reading: leave the rest queued.
                if !ring.cq_has_room() {
                    break;
                }
                let Some(sqe) = ring.sq.pop() else { break };
                let origin = if ring.cq.is_some() {
                    ring.outstanding += 1;
                    Origin::Ring(ri as u32)
                } else {
                    Origin::Batch
                };
                self.deliver(
                    origin,
                    sqe.user_data(),
                    Err(ErrorKind::Shutdown),
                    false,
                    0,
                    Served::default(),
                );
            }
            if let Some(ring) = self.rings[ri].as_mut() {
                ring.sq.sync();
            }
        }
        // Every live task stops: those with slices in flight have them
        // aborted and complete once they are back, the others at once.
        for i in 0..self.tasks.capacity() as u32 {
            let t = self.tasks.get_mut(i);
            if t.live && !t.stopped {
                self.stop_task(i, ErrorKind::Shutdown);
            }
        }
        self.flush_cqs();
        // Task memory (the application's, registered until the engine is
        // dropped) is let go only once no transport will touch it: no
        // slice is ever abandoned, however long its transport takes.
        let started = monotonic_ns();
        let mut next_log = started + SHUTDOWN_LOG_NS;
        let mut idle = 0u32;
        while self.async_inflight > 0 {
            if self.reap() {
                self.flush_cqs();
                idle = 0;
                continue;
            }
            let now = monotonic_ns();
            if now >= next_log {
                next_log = now + SHUTDOWN_LOG_NS;
                self.log_held_slices(now - started);
            }
            if idle < SHUTDOWN_YIELDS {
                idle += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(SHUTDOWN_NAP);
            }
        }
        self.lanes.retain(|_| false);
        self.flush_cqs();
    }

    /// Shutdown is waiting on transports that still hold slices: say
    /// which (once per transport, then a summary a second).
    fn log_held_slices(&self, waited_ns: u64) {
        for p in self.posted.iter().flatten().chain(self.draining.iter()) {
            if p.inflight > 0 {
                crate::lograte::warn_limited!(
                    (self.shared.index, p.kind),
                    worker = self.shared.index,
                    transport = %p.kind,
                    slices = p.inflight,
                    waited_ms = waited_ns / 1_000_000,
                    "shutdown: waiting for a transport to hand back slices still in flight; their tasks' memory is kept until it does"
                );
            }
        }
    }
}

/// A transport instance with slices posted on it.
struct PostedOn {
    kind: TransportKind,
    transport: Arc<Installed>,
    inflight: u32,
}

struct Accepted {
    opcode: tent_rings::Opcode,
    priority: Priority,
    local: *mut u8,
    region: Held<crate::memory::MemRegion>,
    segment: Held<Segment>,
    transport: TransportKind,
    xport_priority: u8,
    deadline_ns: u64,
}
