//! The rings a worker serves: the batch API's submission ring (slot 0) and
//! each application ring handed to it, with the CQ slots it owes each.
//!
//! Every SQE taken from an application ring reserves one CQ slot, so
//! posting its CQE never fails; a ring whose CQ has no room left gives no
//! SQE until the application reaps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tent_rings::spsc::{Consumer, Producer};
use tent_rings::{Cqe, ErrorKind, Priority, Sqe};

use crate::doorbell::CqBell;
use crate::engine::batch::{BatchTask, Served, TaskState};
use crate::engine::client_scope::ClientScope;
use crate::engine::task::Origin;
use crate::qos::FairShares;

/// CQEs a worker writes into a ring before it publishes them mid-turn
/// (the rest at the turn's end, with the wake-up check). Publishing only
/// at the end made the application and the worker take turns: at 32 in
/// flight, 8 B shm WRITEs went from 7.5-8.4 to 13-15 M ops/s with it
/// (4 and 16 measured the same; each publish is one more line transfer).
const CQ_PUBLISH_EVERY: usize = 8;

/// A ring request's completion: its result, the transport that served
/// it, how many times it switched, `fallback` when it succeeded only after
/// a switch, and `failover_exhausted` when it failed with none left.
pub(in crate::engine) fn cqe_for(
    user_data: u64,
    res: Result<u64, ErrorKind>,
    served: Served,
) -> Cqe {
    Cqe::new(user_data, res)
        .with_transport(served.transport)
        .with_failover_count(served.failover_count)
        .with_fallback(res.is_ok() && served.failover_count > 0)
        .with_failover_exhausted(served.exhausted)
}

/// A client rewrote the SQE taken, after it was looked at, into one past
/// its share: it is refused rather than counted.
pub(super) type Rewritten = bool;

/// Worker-side ends of an application ring.
pub(crate) struct WorkerRing {
    sq: Consumer<Sqe>,
    cq: Option<Producer<Cqe>>,
    /// Accepted, not yet completed (each will need one CQ slot).
    outstanding: u32,
    cq_dirty: bool,
    /// The application's completion bell (ring API only).
    cq_bell: Option<Arc<CqBell>>,
    /// A daemon client's ring: what its SQEs may name.
    scope: Option<Arc<ClientScope>>,
    /// A daemon client's ring: retired once the daemon sets this (the
    /// client may write anything into the ring's own closed flag).
    retire: Option<Arc<AtomicBool>>,
    /// A client ring's CQ consumer head when its bell was last rung: it is
    /// rung again only once the client has read past it, so a client that
    /// leaves NEED_WAKEUP set costs the worker no wake per flush.
    bell_head: Option<u32>,
    /// A client ring whose next SQE waits for the client's share or quota
    /// (set by `take`): the worker's park treats it as blocked, not as
    /// work to do now.
    held_back: bool,
}

impl WorkerRing {
    /// A ring's worker-side ends (`cq: None`: the batch ring).
    pub(crate) fn new(
        sq: Consumer<Sqe>,
        cq: Option<Producer<Cqe>>,
        cq_bell: Option<Arc<CqBell>>,
    ) -> Self {
        WorkerRing {
            sq,
            cq,
            outstanding: 0,
            cq_dirty: false,
            cq_bell,
            scope: None,
            retire: None,
            bell_head: None,
            held_back: false,
        }
    }

    /// The same ring, a daemon client's: its SQEs name only what `scope`
    /// allows, and it is retired when `retire` is set.
    pub(crate) fn for_client(mut self, scope: Arc<ClientScope>, retire: Arc<AtomicBool>) -> Self {
        self.scope = Some(scope);
        self.retire = Some(retire);
        self
    }

    /// Its application is gone: for a client ring, the daemon said so;
    /// otherwise the producer closed the ring.
    fn closed(&self) -> bool {
        match &self.retire {
            Some(flag) => flag.load(Ordering::Acquire),
            None => self.sq.is_producer_closed(),
        }
    }

    /// Ring the application's bell now? Always for an in-process ring; for
    /// a client's, only once it has read past where it was at the last
    /// ring.
    fn bell_due(&mut self) -> bool {
        let Some(b) = &self.cq_bell else {
            return false;
        };
        if b.shared.is_none() {
            return true;
        }
        let Some(cq) = self.cq.as_mut() else {
            return false;
        };
        let head = cq.consumer_head();
        if self.bell_head == Some(head) {
            return false;
        }
        self.bell_head = Some(head);
        true
    }

    /// Can the CQ take one more CQE than the worker already owes? Every
    /// accepted SQE needs one, so SQEs are accepted only while this holds
    /// and posting a CQE never fails. Answers from the cached consumer head
    /// first. Always true for the batch ring (no CQ).
    #[inline]
    fn cq_has_room(&mut self) -> bool {
        let owed = self.outstanding as usize;
        self.cq.as_mut().is_none_or(|cq| cq.has_slots(owed + 1))
    }
}

/// What a parked worker's rings say (`Rings::prepare_park`).
pub(super) struct ParkCheck {
    /// Every ring that can take SQEs is empty and flagged NEED_WAKEUP
    /// (rings blocked on CQ room are passed over, not flagged).
    pub empty: bool,
    /// A ring's SQEs wait on CQ room, which no doorbell announces.
    pub blocked: bool,
}

/// The rings of one worker, by index (an `Origin::Ring` names one).
pub(super) struct Rings {
    slots: Vec<Option<WorkerRing>>,
}

impl Rings {
    /// The batch ring in slot 0, room for `capacity` rings before the list
    /// grows.
    pub(super) fn new(batch_sq: Consumer<Sqe>, capacity: usize) -> Rings {
        let mut slots = Vec::with_capacity(capacity);
        slots.push(Some(WorkerRing::new(batch_sq, None, None)));
        Rings { slots }
    }

    /// Serve `new` from now on, in free slots first.
    pub(super) fn adopt(&mut self, new: Vec<WorkerRing>) {
        for r in new {
            match self.slots.iter().position(Option::is_none) {
                Some(i) => self.slots[i] = Some(r),
                None => self.slots.push(Some(r)),
            }
        }
    }

    /// Ring slots (some may be empty).
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Ring `ri`'s client scope, if a daemon client's.
    #[inline]
    pub(super) fn scope(&self, ri: usize) -> Option<&ClientScope> {
        self.slots.get(ri)?.as_ref()?.scope.as_deref()
    }

    /// The next SQE of ring `ri` and whom its completion goes to, if it
    /// has one and its CQ has room for it (that slot is then owed).
    #[inline]
    pub(super) fn take(
        &mut self,
        ri: usize,
        fair: Option<&FairShares>,
    ) -> Option<(Origin, Sqe, Rewritten)> {
        let ring = self.slots[ri].as_mut()?;
        if !ring.cq_has_room() {
            return None;
        }
        // A client past its fair share of work at its next SQE's priority,
        // or past its quota of ops in flight, waits (a completion gives
        // them back: `Worker::complete`, `post_cqe`); its ring counts as
        // blocked, not as work, for the worker's park. The SQE is copied
        // to decide; the client may rewrite it before it is taken, so the
        // copy taken is what is counted, and one that now says otherwise
        // and is past the share is refused (`InvalidArgument`).
        ring.held_back = false;
        let mut looked: Option<(Priority, u64)> = None;
        if let Some(scope) = &ring.scope {
            let head: Sqe = *ring.sq.peek()?;
            let (p, len) = (head.priority().unwrap_or(Priority::Low), head.len());
            if fair.is_some_and(|f| !f.may_take(scope.share(), p, len)) || !scope.try_take() {
                ring.held_back = true;
                return None;
            }
            looked = Some((p, len));
        }
        let Some(sqe) = ring.sq.pop() else {
            if let Some(scope) = &ring.scope {
                scope.completed();
            }
            return None;
        };
        let mut rewritten = false;
        if let (Some(scope), Some(f), Some(seen)) = (&ring.scope, fair, looked) {
            let now = (sqe.priority().unwrap_or(Priority::Low), sqe.len());
            rewritten = now != seen && !f.may_take(scope.share(), now.0, now.1);
        }
        let origin = if ring.cq.is_some() {
            ring.outstanding += 1;
            Origin::Ring(ri as u32)
        } else {
            Origin::Batch
        };
        Some((origin, sqe, rewritten))
    }

    /// Hand the SQ slots taken from ring `ri` back to its application.
    #[inline]
    pub(super) fn release_taken(&mut self, ri: usize) {
        if let Some(ring) = self.slots[ri].as_mut() {
            ring.sq.sync();
        }
    }

    /// Deliver a request's completion to where it came from: a CQE on
    /// its ring, or the batch task's state. `validation`: it was refused
    /// before any byte moved. Inlined: on the small-op path it is most of
    /// a CQE's cost, and a call there spilled what the caller held.
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
            Origin::Ring(ri) => self.post_cqe(ri, cqe_for(user_data, res, served)),
        }
    }

    /// Post `cqe` on ring `ri`, into the slot intake reserved for it.
    /// Inlined: on the small-op path it is most of a CQE's cost.
    #[inline(always)]
    fn post_cqe(&mut self, ri: u32, cqe: Cqe) {
        let Some(ring) = self.slots[ri as usize].as_mut() else {
            return;
        };
        if let Some(scope) = &ring.scope {
            scope.completed_with(cqe.result());
        }
        if let Some(cq) = ring.cq.as_mut() {
            // Intake reserved this slot: the push fails only if a daemon
            // client moved its CQ head back (its ring, its loss).
            let pushed = cq.push(cqe).is_ok();
            debug_assert!(
                pushed || ring.scope.is_some(),
                "CQ slot was reserved at intake"
            );
            // Published every CQ_PUBLISH_EVERY within a turn, not only at
            // its end: the application reaps and refills while the worker
            // works on the rest of the turn.
            if cq.pending() >= CQ_PUBLISH_EVERY {
                cq.sync();
            }
        }
        ring.outstanding = ring.outstanding.saturating_sub(1);
        ring.cq_dirty = true;
    }

    /// Publish the CQEs posted this turn (one Release store per ring), and
    /// ring an armed application's bell.
    pub(super) fn flush(&mut self) {
        for ring in self.slots.iter_mut().flatten() {
            if ring.cq_dirty {
                ring.cq_dirty = false;
                if let Some(cq) = ring.cq.as_mut() {
                    cq.sync();
                    // Relaxed: see CqBell. needs_wakeup() fences (SeqCst)
                    // before it reads NEED_WAKEUP, pairing with the
                    // application's prepare_park().
                    let wanted = ring
                        .cq_bell
                        .as_ref()
                        .is_some_and(|b| b.armed.load(Ordering::Relaxed))
                        && cq.needs_wakeup();
                    if wanted && ring.bell_due() {
                        ring.cq_bell.as_ref().expect("checked").ring();
                    }
                }
            }
        }
    }

    /// Retire application rings whose application dropped them, once
    /// nothing is owed to them, discarding SQEs nobody can read the
    /// completions of.
    pub(super) fn retire_closed(&mut self) {
        for slot in self.slots.iter_mut().skip(1) {
            let retire = slot
                .as_mut()
                .is_some_and(|r| r.outstanding == 0 && r.closed());
            if retire {
                *slot = None;
            }
        }
    }

    /// Before a park: flag NEED_WAKEUP on every ring that can take SQEs,
    /// stopping at the first that is not empty.
    pub(super) fn prepare_park(&mut self) -> ParkCheck {
        let mut check = ParkCheck {
            empty: true,
            blocked: false,
        };
        for ring in self.slots.iter_mut().flatten() {
            // A backstop for an application that armed its bell while this
            // worker was flushing (its Relaxed look at `armed` may have
            // missed the arming, and the application the CQEs): before
            // sleeping, CQEs still unread on a ring whose application says
            // it sleeps ring its bell once more.
            let unread = match (&ring.cq_bell, ring.cq.as_mut()) {
                (Some(b), Some(cq)) => {
                    b.armed.load(Ordering::Relaxed)
                        && cq.slots() < cq.capacity()
                        && cq.needs_wakeup()
                }
                _ => false,
            };
            if unread && ring.bell_due() {
                ring.cq_bell.as_ref().expect("checked").ring();
            }
            if !ring.cq_has_room() || ring.held_back {
                // The application is behind on reaping, or the client is
                // past its share: its SQEs wait for CQ room or for its
                // work to complete, which no doorbell announces. Look
                // again soon.
                check.blocked = true;
                continue;
            }
            if !ring.sq.prepare_park() {
                check.empty = false;
                break;
            }
        }
        check
    }

    /// After a park: clear NEED_WAKEUP everywhere.
    pub(super) fn clear_need_wakeup(&mut self) {
        for ring in self.slots.iter_mut().flatten() {
            ring.sq.clear_need_wakeup();
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
