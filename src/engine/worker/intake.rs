//! Intake: SQEs from the worker's rings become tasks in priority lanes,
//! or typed error completions at once (validation).

use super::turn_clock::{TurnClock, asked_deadline, queued_deadline};
use super::*;

impl Worker {
    pub(super) fn adopt_rings(&mut self) {
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
    pub(super) fn intake(&mut self, clock: &mut TurnClock) -> bool {
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
                self.accept(origin, &sqe, clock);
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
    fn accept(&mut self, origin: Origin, sqe: &Sqe, clock: &mut TurnClock) {
        let user_data = sqe.user_data();
        match self.validate(sqe, clock) {
            Err(kind) => self.deliver(origin, user_data, Err(kind), true, 0, Served::default()),
            Ok(v) => {
                if self.complete_inline(origin, user_data, &v, sqe, clock) {
                    return;
                }
                // Queued: its deadline, QoS wait and lane entry are timed.
                let now = clock.now();
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
                t.deadline_ns = queued_deadline(v.deadline_ns, now, self.default_timeout_ns);
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
                self.sched.queue(v.priority, i, now);
            }
        }
    }

    /// The fast path for a small op on a synchronous transport (local,
    /// shm): one that fits one slice is moved here, at intake, and its CQE
    /// written, with no task slot, lane or dispatch. Taken only for a HIGH
    /// request (nothing unread can be more urgent), when no HIGH work is
    /// queued ahead of it except work the last dispatch found waiting
    /// (answered `Later`, or back-pressure), which the dispatch passes
    /// over too; the slot gate is open to HIGH; and the turn's byte budget
    /// has room (the copy is charged as dispatch would
    /// charge it). It keeps what the task path records: QoS accepted and
    /// queue wait (0), the gate's demand edges, the completion counters.
    /// A ring request only: a batch task's admission and cancel live on
    /// the task path. Any answer but done (`Later`, a transient fault)
    /// returns false, and the request takes the task path from the start
    /// (a refused slice moved no byte that matters, so trying it again
    /// there, or failing over, is what the task path would have done).
    fn complete_inline(
        &mut self,
        origin: Origin,
        user_data: u64,
        v: &Accepted,
        sqe: &Sqe,
        clock: &mut TurnClock,
    ) -> bool {
        // HIGH only, and never ahead of ready HIGH work: see
        // `Scheduler::may_serve_at_intake`.
        if !matches!(origin, Origin::Ring(_)) || !self.sched.may_serve_at_intake(v.priority) {
            return false;
        }
        let len = sqe.len();
        let Some(installed) = self.slots[slot_index(v.transport)].as_ref() else {
            return false;
        };
        let caps = installed.caps;
        if !caps.synchronous
            || dispatch::slice_len(len, caps, self.block_size) < len
            || !(self.gate_always_open || self.engine.gate.can_send(v.priority, clock.now()))
        {
            return false;
        }
        // No table load happens between `validate` and `submit` returning.
        // SAFETY: the segment is in this worker's cached table, which holds it until the next load (as in `validate`).
        let segment = unsafe { v.segment.get() };
        // SAFETY: the region is in this worker's cached table, as above.
        let region = unsafe { v.region.get() };
        let slice = Slice {
            // Synchronous: no completion echoes it; it names no task.
            token: u64::MAX,
            opcode: v.opcode,
            local: v.local,
            region,
            segment,
            remote: sqe.remote().offset,
            len,
            rest: len,
            priority: v.priority,
        };
        let outcome = installed.transport.submit_one(&self.ctx, &slice).unpack();
        let res = match dispatch::judge(outcome, self.book.any()) {
            dispatch::Verdict::Done(res) => res,
            verdict => {
                // A synchronous transport never leaves a slice in flight.
                debug_assert!(
                    verdict != dispatch::Verdict::Posted,
                    "synchronous transport posted"
                );
                return false;
            }
        };
        self.sched.charge(len, false);
        let p = v.priority;
        self.shared.qos.served_at_intake(p);
        // The gate hears this work as it would a task's: its start and end.
        self.count_live(p, true);
        let done = res.unwrap_or(0);
        let served = Served {
            transport: v.transport,
            failover_count: 0,
            exhausted: false,
        };
        self.deliver_task(origin, user_data, res, done, served);
        self.count_live(p, false);
        // Single writer (this worker): a plain store, no locked RMW.
        let s = &self.shared.completed_inline;
        s.store(s.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        true
    }

    fn validate(&mut self, sqe: &Sqe, clock: &mut TurnClock) -> Result<Accepted, ErrorKind> {
        self.refresh_slots();
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
        let id = sqe.remote().segment;
        let table = self.segments.load();
        let table_at = Arc::as_ptr(table);
        let segment = Held::new(
            &**table
                .get(id)
                // Closed, in a table this worker has not refreshed yet.
                .filter(|s| s.closed_epoch() == 0)
                .ok_or(ErrorKind::SegmentNotFound)?,
        );
        let key = ResolveKey {
            table: table_at,
            segment: id,
            hint,
            slots_epoch: self.slots_epoch,
        };
        let (xport_priority, transport) = match self.resolved {
            Some((k, answer)) if k == key => answer,
            _ => {
                // The segment is in this worker's cached table, which holds
                // it until the next load; a task made from it is live, which
                // keeps it (see `Held`).
                // SAFETY: held by the cached table until this worker's next load.
                let live_segment = unsafe { segment.get() };
                let answer = self
                    .resolve(live_segment, 0, hint)
                    .ok_or(ErrorKind::Unreachable)?;
                self.resolved = Some((key, answer));
                answer
            }
        };
        let deadline_ns = asked_deadline(sqe.deadline_ns(), clock)?;
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
    pub(super) fn resolve(
        &mut self,
        segment: &Segment,
        from: usize,
        only: TransportKind,
    ) -> Option<(u8, TransportKind)> {
        for (rank, &kind) in RANKED.iter().enumerate().skip(from) {
            if only != TransportKind::Any && kind != only {
                continue;
            }
            if let Some(installed) = self.slots[slot_index(kind)].as_ref()
                && installed.transport.reaches(segment)
            {
                return Some((rank as u8, kind));
            }
        }
        None
    }
}

/// What `resolve` from rank 0 answered last depends on only these: the
/// segment (an entry of one segment table, which the worker holds while
/// it is current: a table is named by its address, and every reload of
/// the cache either happens here, where a new table has a new address
/// while the old one is still held, or forgets the answer), the hint,
/// and the installed transports. A run of requests to one peer walks the
/// transports once (`reaches` is a virtual call per transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ResolveKey {
    table: *const SegmentTable,
    segment: tent_rings::SegmentId,
    hint: TransportKind,
    slots_epoch: u64,
}

struct Accepted {
    opcode: tent_rings::Opcode,
    priority: Priority,
    local: *mut u8,
    region: Held<crate::memory::MemRegion>,
    segment: Held<Segment>,
    transport: TransportKind,
    xport_priority: u8,
    /// `None`: the default, set if the request is queued.
    deadline_ns: Option<u64>,
}
