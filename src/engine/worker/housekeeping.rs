//! Housekeeping: the deadline and cancel sweep and `stop_task`, retiring
//! rings, the unregister handshake, and the shutdown drain.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tent_rings::ErrorKind;

use super::Worker;
use super::turn_clock::TurnClock;
use crate::clock::monotonic_ns;
use crate::engine::batch::Served;
use crate::segment::PeerState;

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

/// When the next sweep is due: every `HOUSEKEEPING_NS`, checked against
/// whatever time the worker has already read (it reads none for this
/// alone, except after [`CLOCKLESS_TURNS`](super::turn_clock::CLOCKLESS_TURNS)
/// busy turns without one).
#[derive(Debug, Default)]
pub(super) struct SweepTimer {
    next_ns: u64,
    /// Busy turns since one looked at the time for the sweep.
    unswept: u32,
}

impl SweepTimer {
    /// Is a sweep due at `now`?
    #[inline]
    pub(super) fn due(&self, now: u64) -> bool {
        now >= self.next_ns
    }

    /// A sweep ran at `now`: the next is due a period later.
    fn swept(&mut self, now: u64) {
        self.next_ns = now + HOUSEKEEPING_NS;
    }

    /// A turn read the time for queued work (and checked the sweep).
    #[inline]
    pub(super) fn looked(&mut self) {
        self.unswept = 0;
    }

    /// At the end of a busy turn that queued nothing: the time, if a
    /// sweep is due by it (the turn's reading, or a fresh one every
    /// `CLOCKLESS_TURNS` turns).
    #[inline]
    pub(super) fn due_after_busy_turn(&mut self, clock: &mut TurnClock) -> Option<u64> {
        clock
            .for_housekeeping(&mut self.unswept)
            .filter(|&now| self.due(now))
    }
}

impl Worker {
    /// Deadlines, cancels, retiring rings whose application went away, and
    /// the unregister handshake.
    pub(super) fn housekeeping(&mut self, now: u64) {
        self.sweep.swept(now);
        self.ack_unregister();
        self.shared.qos.set_queued(self.sched.queued());
        if self.tasks.active() > 0 {
            for i in 0..self.tasks.capacity() as u32 {
                let t = self.tasks.get_mut(i);
                if !t.live || t.stopped {
                    continue;
                }
                let canceled = t.batch_task().is_some_and(|b| b.cancel_requested());
                let gone = t.segment.is_some_and(|s| {
                    // SAFETY: the task is live, so its segment is held.
                    unsafe { s.get() }.peer_state() == PeerState::Gone
                });
                let stop = match gone {
                    true => Some(ErrorKind::ProcessFailed),
                    false => stop_reason(canceled, now, t.deadline_ns),
                };
                if let Some(kind) = stop {
                    self.stop_task(i, kind);
                }
            }
        }
        self.rings.retire_closed();
        crate::lograte::flush_due(now);
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

    /// Stop task `i` (its deadline passed, it was canceled, or the engine
    /// is shutting down): it fails with `kind` unless it failed already,
    /// nothing more of it is posted, and every transport instance with
    /// slices in flight is told to abort its slices. It is due once the
    /// last of them is back (`settle` delivers it).
    pub(super) fn stop_task(&mut self, i: u32, kind: ErrorKind) {
        let t = self.tasks.get_mut(i);
        t.error.get_or_insert(kind);
        t.stopped = true;
        // It ends now (the completion stage's clock), not at a copy before.
        t.done_ns = 0;
        // A multi-slice task may sit in a lane with slices in flight: take
        // it out in every case.
        t.posted = t.posted.max(t.len);
        let (inflight, token) = (t.inflight, t.token(i));
        self.sched.remove(i);
        if inflight > 0 {
            self.book.abort(&self.ctx, token, kind);
        }
        self.tasks.note_if_settled(i);
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
            // A CQ the application stopped reading: its rest stays queued.
            while let Some((origin, sqe, _)) = self.rings.take(ri, None) {
                self.rings.deliver(
                    origin,
                    sqe.user_data(),
                    Err(ErrorKind::Shutdown),
                    false,
                    0,
                    Served::default(),
                );
            }
            self.rings.release_taken(ri);
        }
        // Every live task stops: those with slices in flight have them
        // aborted and complete once they are back, the others at once.
        for i in 0..self.tasks.capacity() as u32 {
            let t = self.tasks.get_mut(i);
            if t.live && !t.stopped {
                self.stop_task(i, ErrorKind::Shutdown);
            }
        }
        self.settle();
        self.rings.flush();
        // Task memory (the application's, registered until the engine is
        // dropped) is let go only once no transport will touch it: no
        // slice is ever abandoned, however long its transport takes.
        let started = monotonic_ns();
        let mut next_log = started + SHUTDOWN_LOG_NS;
        let mut idle = 0u32;
        while self.book.any() {
            if self.reap() {
                self.rings.flush();
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
        self.rings.flush();
        // What a transport keeps for this worker goes on its thread.
        for slot in self.engine.transports.all() {
            if let Some(t) = slot.load_full() {
                t.transport.worker_exit(&self.ctx);
            }
        }
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
    use super::super::turn_clock::{CLOCKLESS_TURNS, TurnClock};
    use super::{HOUSEKEEPING_NS, SweepTimer, acked_epoch, stop_reason};
    use tent_rings::ErrorKind;

    #[test]
    fn a_cancel_wins_over_the_deadline_and_the_deadline_is_inclusive() {
        assert_eq!(stop_reason(false, 99, 100), None);
        assert_eq!(stop_reason(false, 100, 100), Some(ErrorKind::Timeout));
        assert_eq!(stop_reason(true, 100, 100), Some(ErrorKind::Canceled));
        assert_eq!(stop_reason(true, 0, 100), Some(ErrorKind::Canceled));
    }

    #[test]
    fn a_sweep_is_due_a_period_after_the_last_and_busy_turns_read_the_clock_rarely() {
        let mut t = SweepTimer::default();
        assert!(t.due(0), "the first sweep is due at once");
        t.swept(5_000);
        assert!(!t.due(5_000 + HOUSEKEEPING_NS - 1));
        assert!(t.due(5_000 + HOUSEKEEPING_NS));
        // A turn that read the time hands it over; one that did not reads
        // none until CLOCKLESS_TURNS busy turns went by.
        let mut read = TurnClock::default();
        let now = read.now();
        t.swept(now);
        assert_eq!(t.due_after_busy_turn(&mut read), None, "not due yet");
        for _ in 1..CLOCKLESS_TURNS {
            assert_eq!(t.due_after_busy_turn(&mut TurnClock::default()), None);
        }
        t.next_ns = 0;
        // A turn that read the time for queued work counts as a look: the
        // clockless count starts again.
        t.looked();
        for _ in 1..CLOCKLESS_TURNS {
            assert_eq!(t.due_after_busy_turn(&mut TurnClock::default()), None);
        }
        assert!(t.due_after_busy_turn(&mut TurnClock::default()).is_some());
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
