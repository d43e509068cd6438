//! Housekeeping: the deadline and cancel sweep, retiring rings, the
//! unregister handshake, and the shutdown drain.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tent_rings::ErrorKind;

use super::Worker;
use crate::clock::monotonic_ns;
use crate::engine::batch::Served;
use crate::engine::task::Origin;

/// Deadline and cancel sweep period.
const HOUSEKEEPING_NS: u64 = 1_000_000;
/// How often shutdown says which transports still hold slices.
const SHUTDOWN_LOG_NS: u64 = 1_000_000_000;
/// Idle turns of the shutdown drain spent yielding before it sleeps.
const SHUTDOWN_YIELDS: u32 = 1_000;
/// The shutdown drain's sleep between two polls once yielding is over.
const SHUTDOWN_NAP: Duration = Duration::from_micros(200);

/// Why a live task stops before it is done, if it does: canceled by the
/// application (batch API), or past its deadline. One rule for the
/// dispatch (a lane head) and the sweep (every task).
pub(super) fn stop_reason(canceled: bool, now: u64, deadline_ns: u64) -> Option<ErrorKind> {
    if canceled {
        Some(ErrorKind::Canceled)
    } else {
        (now >= deadline_ns).then_some(ErrorKind::Timeout)
    }
}

/// The unregister epoch a worker may acknowledge: the engine's `epoch`,
/// but short of the oldest epoch a live task still holds a revoked region
/// or closed segment of (`u64::MAX`: none).
pub(super) fn acked_epoch(epoch: u64, oldest_held: u64) -> u64 {
    epoch.min(oldest_held.saturating_sub(1))
}

impl Worker {
    /// Deadlines, cancels, retiring rings whose application went away, and
    /// the unregister handshake.
    pub(super) fn housekeeping(&mut self, now: u64) {
        self.next_housekeeping = now + HOUSEKEEPING_NS;
        self.ack_unregister();
        self.shared.qos.set_queued(self.sched.queued());
        if self.tasks.active() > 0 {
            for i in 0..self.tasks.capacity() as u32 {
                let t = self.tasks.get_mut(i);
                if !t.live || t.stopped {
                    continue;
                }
                let canceled = t.batch_task().is_some_and(|b| b.cancel_requested());
                if let Some(kind) = stop_reason(canceled, now, t.deadline_ns) {
                    self.stop_task(i, kind);
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
    pub(super) fn ack_unregister(&mut self) {
        // Acquire: pairs with the engine's Release publish of the epoch,
        // so the revokes and the table store before it are seen here.
        let epoch = self.engine.region_epoch.load(Ordering::Acquire);
        if epoch == self.region_ack {
            return;
        }
        self.views.refresh_tables();
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
        let acked = acked_epoch(epoch, oldest);
        let ack = &self.shared.region_ack;
        ack.wait_until.store(wait_until, Ordering::Relaxed);
        if acked != self.region_ack {
            ack.epoch.store(acked, Ordering::Release);
            self.region_ack = acked;
        }
    }

    /// Finish everything still queued with `Shutdown` so no caller waits forever.
    pub(super) fn drain_on_shutdown(&mut self) {
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
        while self.book.any() {
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
        self.sched.clear();
        self.flush_cqs();
    }

    /// Shutdown is waiting on transports that still hold slices: say
    /// which (once per transport, then a summary a second).
    fn log_held_slices(&self, waited_ns: u64) {
        for (kind, slices) in self.book.held() {
            crate::lograte::warn_limited!(
                (self.shared.index, kind),
                worker = self.shared.index,
                transport = %kind,
                slices,
                waited_ms = waited_ns / 1_000_000,
                "shutdown: waiting for a transport to hand back slices still in flight; their tasks' memory is kept until it does"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{acked_epoch, stop_reason};
    use tent_rings::ErrorKind;

    #[test]
    fn a_cancel_wins_over_the_deadline_and_the_deadline_is_inclusive() {
        assert_eq!(stop_reason(false, 99, 100), None);
        assert_eq!(stop_reason(false, 100, 100), Some(ErrorKind::Timeout));
        assert_eq!(stop_reason(true, 100, 100), Some(ErrorKind::Canceled));
        assert_eq!(stop_reason(true, 0, 100), Some(ErrorKind::Canceled));
    }

    #[test]
    fn an_epoch_is_acknowledged_only_past_what_live_tasks_hold() {
        // Nothing held: the engine's epoch.
        assert_eq!(acked_epoch(7, u64::MAX), 7);
        // A task holds a region revoked at epoch 5: up to 4.
        assert_eq!(acked_epoch(7, 5), 4);
        // Held at the newest epoch itself.
        assert_eq!(acked_epoch(7, 7), 6);
        // Held at epoch 1 (the first): nothing can be acknowledged.
        assert_eq!(acked_epoch(7, 1), 0);
    }
}
