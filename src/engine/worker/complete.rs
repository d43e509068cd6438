//! Completion: reap posted slices into their tasks, and settle the tasks
//! that the stages left settled: each one fails over to its next transport
//! or is delivered (a CQE or batch state, which `rings.rs` posts) and freed.

use tent_rings::{ErrorKind, TransportKind};

use super::Worker;
use super::book::ReapCursor;
use super::failover::may_fail_over;
use super::turn_clock::TurnClock;
use crate::engine::batch::Served;
use crate::engine::slot_index;
use crate::engine::task::Origin;
use crate::transport::SliceCompletion;

impl Worker {
    /// Reap completions of posted slices from every transport instance
    /// that has some, and settle the tasks they leave settled.
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
            any |= self.account(kind, n, clock.now());
        }
        if any {
            self.settle();
        }
        any
    }

    /// Account the first `n` entries of `self.reaped`, posted on `kind`:
    /// bytes done, errors (or a failover to come), and the tasks left
    /// settled go on the due list.
    fn account(&mut self, kind: TransportKind, n: usize, now: u64) -> bool {
        for c in 0..n {
            let SliceCompletion { token, result } = self.reaped[c];
            self.shared.credits[slot_index(kind)].release(1, now);
            self.book.reaped();
            let Some((i, t)) = self.tasks.by_token(token) else {
                continue;
            };
            t.inflight = t.inflight.saturating_sub(1);
            t.done_ns = 0;
            match result {
                Ok(b) => t.done += b,
                Err(e) => {
                    if t.error.is_none() && t.failing.is_none() {
                        if may_fail_over(e, t.no_failover, self.engine.live.max_failover()) {
                            // Stop posting here; fail over once the rest
                            // of its slices on this transport drain.
                            t.failing = Some(e);
                            t.failing_on = kind;
                        } else {
                            t.error = Some(e);
                        }
                    }
                }
            }
            self.tasks.note_if_settled(i);
        }
        n > 0
    }

    /// The completion stage: every task on the due list is, in the order
    /// it was noted, queued again on its next transport (a failover at
    /// completion) or delivered and freed. Its completion (CQE or batch
    /// state) says no transport touches its memory any more, even for a
    /// task that failed, timed out or was canceled while slices were out
    /// (those were aborted first: `stop_task`).
    pub(super) fn settle(&mut self) {
        // Read once, at the first delivery that needs it, after whatever
        // this turn did: a request's time runs to here.
        let mut stamp = None;
        while let Some(i) = self.tasks.next_due() {
            let t = self.tasks.get_mut(i);
            if !t.live || !t.settled() {
                continue;
            }
            if t.error.is_none()
                && let Some(cause) = t.failing
                && self.resubmit(i, cause)
            {
                // Queued again on the next transport; still PENDING.
                continue;
            }
            let t = self.tasks.get_mut(i);
            let res = match t.error {
                Some(e) => Err(e),
                None => Ok(t.done),
            };
            let served = Served {
                transport: t.transport,
                failover_count: t.failover_count,
                exhausted: t.exhausted,
            };
            // An address the segment does not list may be a region its
            // owner registered since the open: asked about too.
            if matches!(
                res,
                Err(ErrorKind::ProcessFailed
                    | ErrorKind::Unreachable
                    | ErrorKind::AddressNotRegistered)
            ) && let Some(s) = t.segment
            {
                // SAFETY: the task is live until `release` below.
                if unsafe { s.get() }.suspect() {
                    // Once per segment that turns suspect: a futex wake,
                    // on a failed request's path only.
                    self.engine.peer_bell.ring();
                }
            }
            let (origin, user_data, done, priority) = (t.origin, t.user_data, t.done, t.priority);
            if let Origin::Ring(ri) = origin
                && let Some(scope) = self.rings.scope(ri as usize)
            {
                // Its work is done: the client's share has room again.
                self.engine.fair.done(scope.share(), priority, t.len);
            }
            // A task whose last slice was a synchronous copy finished when
            // dispatch stamped it; any other, now.
            let now = match t.done_ns {
                0 => *stamp.get_or_insert_with(crate::clock::monotonic_ns),
                done => done,
            };
            debug_assert!(now >= t.last_post_ns, "a task ends before its last slice");
            let (opcode, took) = (t.opcode, now.saturating_sub(t.accepted_ns));
            // Queue, dispatch and transport; each from the stamp before it,
            // so the three add up to `took` (all from monotonic clocks).
            let stages = t.waited.then(|| {
                let first = t.first_post_ns.max(t.accepted_ns);
                let last = t.last_post_ns.max(first);
                [
                    first - t.accepted_ns,
                    last - first,
                    now.saturating_sub(last),
                ]
            });
            self.rings
                .deliver(origin, user_data, res, false, done, served);
            self.shared
                .ops
                .completed(opcode, served.transport, priority, res, done, took, stages);
            self.tasks.release(i);
            self.count_live(priority, false);
        }
    }
}
