//! `AdmissionGate`: seed 004's executor admission for one worker's
//! endpoints to one peer, and the split policies that say which endpoint
//! a submission is charged to.
//!
//! With `sq_executor_admission` on, a batch `submit` toward an RDMA peer
//! is admitted before its requests reach the worker: the call's work
//! requests (one per slice, at most one endpoint's depth) are charged to
//! the endpoints' [`SqController`]s as *queued*, and admission refuses
//! while posted + queued would pass the depth. The submitting thread
//! waits (up to `sq_admission_timeout_us`, in `sq_admission_wait_slice_us`
//! sleeps) instead of the worker holding work it cannot post; each task
//! carries its share ([`AdmissionSlot`](super::sq::AdmissionSlot)) until
//! its last slice is posted or it ends.
//!
//! The charge is soft: the rail layer still binds each slice to a rail
//! late, so a slice may go out on a sibling of the endpoint it was charged
//! to. What the gate bounds is the peer's work in the worker, posted plus
//! admitted, against its queues' depth: a slow peer backs its submitters
//! up, not the worker's task table, and the other peers keep moving.
//!
//! Split policies (`sq_split_policy`):
//! - `static`: round robin over the endpoints that are in service.
//! - `least_loaded`: the endpoint with the fewest posted + queued
//!   requests, skipping terminal ones (counted in each endpoint's
//!   diagnostics, `least_loaded_selections`).
//! - `capacity` (behind `sq_enable_experimental_capacity`): the charge is
//!   split over the endpoints by their free slots, most free first, so one
//!   large call is admitted across rails at once; what does not fit waits
//!   on the least-loaded endpoint as above.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::sq::{AdmissionToken, SqController, SqRefusal};
use crate::config::SplitPolicy;

/// One worker's endpoints to one peer, as admission sees them: each
/// endpoint's current controller (replaced with its QP).
#[derive(Debug)]
pub struct AdmissionGate {
    queues: Vec<Arc<ArcSwap<SqController>>>,
    cursor: AtomicUsize,
}

impl AdmissionGate {
    /// A gate over `queues` (one per rail).
    pub fn new(queues: Vec<Arc<ArcSwap<SqController>>>) -> AdmissionGate {
        AdmissionGate {
            queues,
            cursor: AtomicUsize::new(0),
        }
    }

    /// The endpoints' controllers now.
    fn load(&self) -> Vec<Arc<SqController>> {
        self.queues.iter().map(|q| q.load_full()).collect()
    }

    /// Admit `need` requests (capped at what one endpoint holds, or under
    /// `capacity` at what all of them hold), waiting up to `timeout`.
    /// Returns the tokens (one per endpoint charged, in charge order).
    ///
    /// # Errors
    /// `TimedOut` with the chosen endpoint's snapshot; `Degraded` when
    /// every endpoint is out of service.
    pub fn admit(
        &self,
        policy: SplitPolicy,
        need: u32,
        timeout: Duration,
    ) -> Result<Vec<AdmissionToken>, (usize, SqRefusal)> {
        let qs = self.load();
        if need == 0 {
            return Ok(Vec::new());
        }
        if policy == SplitPolicy::Capacity
            && let Some(tokens) = capacity_split(&qs, need)
        {
            return Ok(tokens);
        }
        let pick = match policy {
            SplitPolicy::Static => round_robin(&qs, self.cursor.fetch_add(1, Ordering::Relaxed)),
            SplitPolicy::LeastLoaded | SplitPolicy::Capacity => least_loaded(&qs),
        };
        let Some(i) = pick else {
            return Err((0, SqRefusal::Degraded));
        };
        if policy != SplitPolicy::Static {
            // Submitting threads race here: a real RMW.
            qs[i]
                .diagnostics()
                .least_loaded
                .fetch_add(1, Ordering::Relaxed);
        }
        let q = &qs[i];
        q.wait_admission(need.min(q.depth()), timeout)
            .map(|t| vec![t])
            .map_err(|e| (i, e))
    }
}

/// Requests posted and admitted toward `q`.
fn load_of(q: &SqController) -> u32 {
    q.posted().saturating_add(q.queued())
}

/// The next endpoint in service from `start` on (round robin).
fn round_robin(qs: &[Arc<SqController>], start: usize) -> Option<usize> {
    let n = qs.len();
    (0..n)
        .map(|k| (start + k) % n)
        .find(|&i| !qs[i].is_terminal())
}

/// The endpoint in service with the fewest posted + queued requests (the
/// lowest index among equals).
fn least_loaded(qs: &[Arc<SqController>]) -> Option<usize> {
    qs.iter()
        .enumerate()
        .filter(|(_, q)| !q.is_terminal())
        .min_by_key(|(_, q)| load_of(q))
        .map(|(i, _)| i)
}

/// `capacity`: take `need` from the endpoints' free slots, most free first,
/// without waiting; `None` (nothing held) when they have less free than
/// `need` between them.
fn capacity_split(qs: &[Arc<SqController>], need: u32) -> Option<Vec<AdmissionToken>> {
    let mut order: Vec<usize> = (0..qs.len()).filter(|&i| !qs[i].is_terminal()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(qs[i].depth().saturating_sub(load_of(&qs[i]))));
    let mut tokens = Vec::new();
    let mut left = need;
    for i in order {
        if left == 0 {
            break;
        }
        let free = qs[i].depth().saturating_sub(load_of(&qs[i]));
        if free == 0 {
            continue;
        }
        if let Ok(t) = qs[i].try_admit(free.min(left)) {
            left -= t.count();
            tokens.push(t);
        }
    }
    // Dropping what was taken gives it back.
    (left == 0).then_some(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(depths: &[u32]) -> (AdmissionGate, Vec<Arc<SqController>>) {
        let qs: Vec<Arc<SqController>> = depths
            .iter()
            .map(|&d| Arc::new(SqController::new(d, 0, Duration::from_micros(50))))
            .collect();
        let g = AdmissionGate::new(
            qs.iter()
                .map(|q| Arc::new(ArcSwap::new(q.clone())))
                .collect(),
        );
        (g, qs)
    }

    const NOW: Duration = Duration::ZERO;

    #[test]
    fn static_goes_round_robin_and_skips_terminal_endpoints() {
        let (g, qs) = gate(&[8, 8, 8]);
        let mut at = vec![];
        for _ in 0..4 {
            let t = g.admit(SplitPolicy::Static, 1, NOW).unwrap();
            at.push(
                qs.iter()
                    .position(|q| Arc::ptr_eq(q, t[0].queue().unwrap()))
                    .unwrap(),
            );
        }
        assert_eq!(at, [0, 1, 2, 0]);
        qs[1].mark_terminal();
        let t = g.admit(SplitPolicy::Static, 1, NOW).unwrap();
        assert!(Arc::ptr_eq(t[0].queue().unwrap(), &qs[2]), "1 is out: 2");
        qs[0].mark_terminal();
        qs[2].mark_terminal();
        assert_eq!(
            g.admit(SplitPolicy::Static, 1, NOW).unwrap_err().1,
            SqRefusal::Degraded
        );
    }

    #[test]
    fn least_loaded_picks_the_fewest_posted_plus_queued_and_counts_it() {
        let (g, qs) = gate(&[8, 8]);
        let r = qs[0].try_reserve(3).unwrap();
        let _q = qs[1].try_admit(2).unwrap();
        let t = g.admit(SplitPolicy::LeastLoaded, 2, NOW).unwrap();
        assert!(
            Arc::ptr_eq(t[0].queue().unwrap(), &qs[1]),
            "3 posted vs 2 queued"
        );
        let t2 = g.admit(SplitPolicy::LeastLoaded, 1, NOW).unwrap();
        assert!(Arc::ptr_eq(t2[0].queue().unwrap(), &qs[0]), "3 vs 4 now");
        let counted = |q: &SqController| q.diagnostics().report(0, 0, 8).least_loaded;
        assert_eq!(
            (counted(&qs[0]), counted(&qs[1])),
            (1, 1),
            "one selection each"
        );
        qs[0].release(r.n, 0);
        // A charge larger than a queue is capped at its depth.
        drop((t, t2, _q));
        let big = g.admit(SplitPolicy::LeastLoaded, 100, NOW).unwrap();
        assert_eq!(big[0].count(), 8);
    }

    #[test]
    fn a_full_queue_times_out_with_its_snapshot_and_a_release_admits() {
        let (g, qs) = gate(&[4]);
        let held = g.admit(SplitPolicy::LeastLoaded, 4, NOW).unwrap();
        let (i, e) = g
            .admit(SplitPolicy::LeastLoaded, 1, Duration::from_millis(2))
            .unwrap_err();
        assert_eq!(i, 0);
        assert!(
            matches!(e, SqRefusal::TimedOut(s) if s.queued == 4),
            "{e:?}"
        );
        assert_eq!(qs[0].snapshot().admission_timeouts, 1);
        // A waiter wakes when the holder lets go.
        std::thread::scope(|s| {
            let w = s.spawn(|| g.admit(SplitPolicy::LeastLoaded, 2, Duration::from_secs(10)));
            std::thread::sleep(Duration::from_millis(5));
            drop(held);
            let t = w.join().unwrap().unwrap();
            assert_eq!(t[0].count(), 2);
        });
        assert_eq!(qs[0].queued(), 0);
    }

    #[test]
    fn capacity_splits_a_large_charge_over_the_free_slots_most_free_first() {
        let (g, qs) = gate(&[8, 8, 8]);
        let _a = qs[0].try_admit(6).unwrap();
        let _b = qs[2].try_admit(1).unwrap();
        let t = g.admit(SplitPolicy::Capacity, 12, NOW).unwrap();
        let got: Vec<(usize, u32)> = t
            .iter()
            .map(|t| {
                (
                    qs.iter()
                        .position(|q| Arc::ptr_eq(q, t.queue().unwrap()))
                        .unwrap(),
                    t.count(),
                )
            })
            .collect();
        assert_eq!(got, [(1, 8), (2, 4)]);
        drop(t);
        // More than all of them hold free: nothing kept, least-loaded waits.
        let t = g.admit(SplitPolicy::Capacity, 20, NOW).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].count(), qs[1].queued()), (8, 8));
        assert_eq!(qs[2].queued(), 1, "the greedy pass gave back what it took");
    }
}
