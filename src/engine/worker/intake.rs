//! Intake: SQEs from the worker's rings become tasks in priority lanes,
//! or typed error completions at once (validation).

use tent_rings::{ErrorKind, Sqe, TransportKind};

use super::turn_clock::{TurnClock, queued_deadline};
use super::views::Accepted;
use super::{Worker, dispatch};
use crate::engine::batch::{BatchTask, Served};
use crate::engine::task::{Held, Origin};

/// SQEs taken from one ring per turn.
const INTAKE_PER_RING: usize = 64;

impl Worker {
    pub(super) fn adopt_rings(&mut self) {
        let new = std::mem::take(&mut *self.shared.new_rings.lock());
        self.rings.adopt(new);
    }

    /// Move SQEs from the rings into tasks and lanes.
    pub(super) fn intake(&mut self, clock: &mut TurnClock) -> bool {
        let mut work = false;
        for ri in 0..self.rings.len() {
            let mut taken = 0;
            while taken < INTAKE_PER_RING && !self.tasks.is_full() {
                let Some((origin, sqe, rewritten)) = self.rings.take(ri, Some(&self.engine.fair))
                else {
                    break;
                };
                taken += 1;
                if rewritten {
                    self.rings.deliver(
                        origin,
                        sqe.user_data(),
                        Err(ErrorKind::InvalidArgument),
                        true,
                        0,
                        Served::default(),
                    );
                    continue;
                }
                self.accept(origin, &sqe, clock);
            }
            if taken > 0 {
                self.rings.release_taken(ri);
                work = true;
            }
        }
        work
    }

    /// Validate an SQE and queue it, or complete it at once with the reason.
    fn accept(&mut self, origin: Origin, sqe: &Sqe, clock: &mut TurnClock) {
        let user_data = sqe.user_data();
        let blocks = match origin {
            // SAFETY: a batch SQE's user_data is its batch task, written by the engine and live until the task's final state is stored.
            Origin::Batch => unsafe { BatchTask::from_user_data(user_data) }.blocks(),
            Origin::Ring(_) => None,
        };
        let scope = match origin {
            Origin::Ring(ri) => self.rings.scope(ri as usize),
            Origin::Batch => None,
        };
        self.views.refresh_slots(&self.engine.transports);
        let checked = self
            .views
            .accept(sqe, clock, self.max_timeout_ns, blocks, scope);
        match checked {
            Err(kind) => {
                // Refused before any transport: counted as a failure with
                // no transport (an opcode this version does not know is
                // no READ or WRITE, and is not counted).
                if let Some(op) = sqe.opcode() {
                    self.shared.ops.refused(op);
                }
                self.rings
                    .deliver(origin, user_data, Err(kind), true, 0, Served::default())
            }
            Ok(v) => {
                if self.complete_inline(origin, user_data, &v, sqe, clock) {
                    return;
                }
                // Queued: its deadline, QoS wait and lane entry are timed.
                let now = clock.now();
                let Some(i) = self.tasks.alloc() else {
                    // Unreachable: intake checks is_full() first.
                    self.rings.deliver(
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
                t.blocks = blocks.map(Held::new);
                t.run_cursor = 0;
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
                t.accepted_ns = now;
                t.waited = false;
                t.done_ns = 0;
                self.shared.qos.accepted(v.priority);
                if let Origin::Ring(ri) = origin
                    && let Some(scope) = self.rings.scope(ri as usize)
                {
                    // Given back at its completion (`complete`).
                    self.engine.fair.took(scope.share(), v.priority, sqe.len());
                }
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
        let Some(installed) = self.views.slot(v.transport) else {
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
        // SAFETY: the segment and region are in this worker's cached tables, which hold them until the next load (as in `validate`).
        let slice = unsafe { v.whole(sqe) };
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
        if let Origin::Ring(ri) = origin
            && let Some(scope) = self.rings.scope(ri as usize)
        {
            scope.waited(p, 0);
        }
        // The gate hears this work as it would a task's: its start and end.
        self.count_live(p, true);
        let done = res.unwrap_or(0);
        let served = Served {
            transport: v.transport,
            failover_count: 0,
            exhausted: false,
        };
        self.rings
            .deliver(origin, user_data, res, false, done, served);
        self.shared.ops.inline(v.opcode, v.transport, p, res, done);
        self.count_live(p, false);
        true
    }
}
