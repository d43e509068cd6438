//! Completion: reap posted slices, finish tasks, and post their CQEs (or
//! batch states) on their rings (`rings.rs` publishes them).

use std::sync::atomic::Ordering;

use tent_rings::{Cqe, ErrorKind, Priority, TransportKind};

use super::Worker;
use super::book::ReapCursor;
use super::turn_clock::TurnClock;
use crate::engine::batch::{BatchTask, Served, TaskState};
use crate::engine::slot_index;
use crate::engine::task::Origin;
use crate::transport::SliceCompletion;

/// A ring request's completion: its result, the transport that served
/// it, how many times it switched, `fallback` when it succeeded only after
/// a switch, and `failover_exhausted` when it failed with none left.
pub(super) fn cqe_for(user_data: u64, res: Result<u64, ErrorKind>, served: Served) -> Cqe {
    Cqe::new(user_data, res)
        .with_transport(served.transport)
        .with_failover_count(served.failover_count)
        .with_fallback(res.is_ok() && served.failover_count > 0)
        .with_failover_exhausted(served.exhausted)
}

impl Worker {
    /// Reap completions of posted slices from every transport instance
    /// that has some.
    pub(super) fn reap(&mut self) -> bool {
        self.reap_at(&mut TurnClock::default())
    }

    /// [`reap`](Self::reap) within a turn: the turn's clock is read here
    /// only once a completion needs a timestamp, so a turn whose slices
    /// are all still out reads no clock for them.
    pub(super) fn reap_at(&mut self, clock: &mut TurnClock) -> bool {
        let mut any = false;
        let mut cursor = ReapCursor::default();
        while let Some((kind, n)) = self
            .book
            .poll_next(&mut cursor, &self.ctx, &mut self.reaped)
        {
            any |= self.complete_slices(kind, n, clock.now());
        }
        any
    }

    /// Account the first `n` entries of `self.reaped`, posted on `kind`.
    fn complete_slices(&mut self, kind: TransportKind, n: usize, now: u64) -> bool {
        for c in 0..n {
            let SliceCompletion { token, result } = self.reaped[c];
            self.shared.credits[slot_index(kind)].release(1, now);
            self.book.reaped();
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
    pub(super) fn maybe_finish(&mut self, i: u32) {
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
    #[inline]
    pub(super) fn count_live(&mut self, p: Priority, up: bool) {
        if self.sched.count_live(p, up) {
            self.engine.gate.demand(p, up);
        }
    }

    /// Stop task `i` (its deadline passed, it was canceled, or the engine
    /// is shutting down): it fails with `kind` unless it failed already,
    /// nothing more of it is posted, and every transport instance with
    /// slices in flight is told to abort its slices. Its completion goes
    /// out once the last of them is back (`maybe_finish`).
    pub(super) fn stop_task(&mut self, i: u32, kind: ErrorKind) {
        let t = self.tasks.get_mut(i);
        t.error.get_or_insert(kind);
        t.stopped = true;
        // A multi-slice task may sit in a lane with slices in flight: take
        // it out in every case.
        t.posted = t.posted.max(t.len);
        let (inflight, token) = (t.inflight, t.token(i));
        self.sched.remove(i);
        if inflight > 0 {
            self.book.abort(&self.ctx, token, kind);
        }
        self.maybe_finish(i);
    }

    /// Deliver a finished task (with the bytes it moved) and count it.
    pub(super) fn deliver_task(
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
    /// Inlined: on the small-op path it is most of a CQE's cost, and a call
    /// there spilled what the caller held.
    #[inline(always)]
    pub(super) fn deliver(
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
            Origin::Ring(ri) => self.rings.post_cqe(ri, cqe_for(user_data, res, served)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cqe_for;
    use crate::engine::batch::Served;
    use tent_rings::{ErrorKind, TransportKind};

    #[test]
    fn a_cqe_says_who_served_and_whether_it_fell_back() {
        let served = Served {
            transport: TransportKind::Tcp,
            failover_count: 1,
            exhausted: false,
        };
        let c = cqe_for(7, Ok(8), served);
        assert_eq!(c.user_data(), 7);
        assert_eq!(c.result(), Ok(8));
        assert_eq!(c.transport(), TransportKind::Tcp);
        assert_eq!(c.failover_count(), 1);
        assert!(c.fallback());
        assert!(!c.failover_exhausted());
        // Failed after a switch: not a fallback; exhausted when said.
        let failed = cqe_for(
            7,
            Err(ErrorKind::Unreachable),
            Served {
                exhausted: true,
                ..served
            },
        );
        assert!(!failed.fallback());
        assert!(failed.failover_exhausted());
        // Served where it started.
        let first = cqe_for(
            1,
            Ok(8),
            Served {
                failover_count: 0,
                ..served
            },
        );
        assert!(!first.fallback());
    }
}
