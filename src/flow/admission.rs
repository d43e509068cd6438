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
//! Split policies (`sq_split_policy`, the rule in [`super::split`]):
//! - `static`: round robin over the endpoints that are in service.
//! - `least_loaded`: the endpoint with the fewest posted + queued
//!   requests, skipping terminal ones (counted in each endpoint's
//!   diagnostics, `least_loaded_selections`).
//! - `capacity` (behind `sq_enable_experimental_capacity`): the charge is
//!   split over the endpoints by their free slots, most free first, over
//!   at most `sq_admission_max_chunks_per_call` of them, so one large call
//!   is admitted across rails at once; what does not fit waits on the
//!   least-loaded endpoint as above.
//!
//! A waiter refused for room tries again once its endpoint has
//! `sq_admission_resume_watermark_wr` slots free (hysteresis; see
//! [`SqController::wait_admission`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use tent_rings::Priority;

use crate::config::SplitPolicy;
use crate::flow::split::{QueueLoad, choose};
use crate::flow::sq::{AdmissionToken, SqController, SqRefusal};

/// One worker's endpoints to one peer, as admission sees them: each
/// endpoint's current controller (replaced with its QP).
#[derive(Debug)]
pub struct AdmissionGate {
    queues: Vec<Arc<ArcSwap<SqController>>>,
    cursor: AtomicUsize,
    /// `sq_admission_resume_watermark_wr`: free slots a refused waiter
    /// waits for before it tries again (0: none).
    resume: u32,
    /// `sq_admission_max_chunks_per_call`: most endpoints one `capacity`
    /// charge is split over (0: all of them).
    max_chunks: usize,
}

impl AdmissionGate {
    /// A gate over `queues` (each worker's endpoints to the peer, every
    /// rail's `qp_per_transfer` of them), with its waiters' resume
    /// watermark and `capacity`'s chunk cap (0: none).
    pub fn new(
        queues: Vec<Arc<ArcSwap<SqController>>>,
        resume: u32,
        max_chunks: u32,
    ) -> AdmissionGate {
        AdmissionGate {
            queues,
            cursor: AtomicUsize::new(0),
            resume,
            max_chunks: usize::try_from(max_chunks).unwrap_or(usize::MAX),
        }
    }

    /// Admit `need` requests of priority `p` (capped at what one endpoint
    /// holds for `p`, or under `capacity` at what all of them hold),
    /// waiting up to `timeout`. Returns the tokens (one per endpoint
    /// charged, in charge order).
    ///
    /// # Errors
    /// `TimedOut` with the chosen endpoint's snapshot; `Degraded` when
    /// every endpoint is out of service.
    pub fn admit(
        &self,
        policy: SplitPolicy,
        need: u32,
        timeout: Duration,
        p: Priority,
    ) -> Result<Vec<AdmissionToken>, (usize, SqRefusal)> {
        if need == 0 {
            return Ok(Vec::new());
        }
        if policy == SplitPolicy::Capacity {
            let qs: Vec<Arc<SqController>> = self.queues.iter().map(|q| q.load_full()).collect();
            if let Some(tokens) = capacity_split(&qs, need, self.max_chunks, p) {
                return Ok(tokens);
            }
        }
        // Round robin from the gate's cursor; the load-aware policies
        // take the first of equals (what does not fit waits on the
        // least-loaded endpoint, also under `capacity`).
        let (policy, cursor) = match policy {
            SplitPolicy::Static => (policy, self.cursor.fetch_add(1, Ordering::Relaxed)),
            SplitPolicy::LeastLoaded | SplitPolicy::Capacity => (SplitPolicy::LeastLoaded, 0),
        };
        // Guards, not clones: a look at each controller costs no
        // reference-count traffic; only the one charged is cloned.
        let Some(i) = choose(policy, self.queues.len(), cursor, |k| {
            load_of(&self.queues[k].load())
        }) else {
            return Err((0, SqRefusal::Degraded));
        };
        let q = self.queues[i].load_full();
        if policy != SplitPolicy::Static {
            // Submitting threads race here: a real RMW.
            q.diagnostics().least_loaded.fetch_add(1, Ordering::Relaxed);
        }
        q.wait_admission(need.min(q.limit(p)), self.resume, timeout, p)
            .map(|t| vec![t])
            .map_err(|e| (i, e))
    }
}

/// `q` as the split policies see it: in service unless terminal; its
/// posted + admitted + waiting requests against its depth.
fn load_of(q: &SqController) -> QueueLoad {
    QueueLoad {
        open: !q.is_terminal(),
        load: q.depth() - q.free(),
        depth: q.depth(),
    }
}

/// `capacity`: take `need` from the endpoints' slots free to `p`, most
/// free first, over at most `max_chunks` of them (0: any number), without
/// waiting; `None` (nothing held) when they have less free than `need`
/// between them.
fn capacity_split(
    qs: &[Arc<SqController>],
    need: u32,
    max_chunks: usize,
    p: Priority,
) -> Option<Vec<AdmissionToken>> {
    let mut order: Vec<usize> = (0..qs.len()).filter(|&i| !qs[i].is_terminal()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(qs[i].free_for(p)));
    let cap = if max_chunks == 0 {
        usize::MAX
    } else {
        max_chunks
    };
    let mut tokens = Vec::new();
    let mut left = need;
    for i in order {
        if left == 0 || tokens.len() == cap {
            break;
        }
        let free = qs[i].free_for(p);
        if free == 0 {
            continue;
        }
        if let Ok(t) = qs[i].try_admit_as(free.min(left), p) {
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
            0,
            0,
        );
        (g, qs)
    }

    const NOW: Duration = Duration::ZERO;

    #[test]
    fn static_goes_round_robin_and_skips_terminal_endpoints() {
        let (g, qs) = gate(&[8, 8, 8]);
        let mut at = vec![];
        for _ in 0..4 {
            let t = g
                .admit(SplitPolicy::Static, 1, NOW, Priority::High)
                .unwrap();
            at.push(
                qs.iter()
                    .position(|q| Arc::ptr_eq(q, t[0].queue().unwrap()))
                    .unwrap(),
            );
        }
        assert_eq!(at, [0, 1, 2, 0]);
        qs[1].mark_terminal();
        let t = g
            .admit(SplitPolicy::Static, 1, NOW, Priority::High)
            .unwrap();
        assert!(Arc::ptr_eq(t[0].queue().unwrap(), &qs[2]), "1 is out: 2");
        qs[0].mark_terminal();
        qs[2].mark_terminal();
        assert_eq!(
            g.admit(SplitPolicy::Static, 1, NOW, Priority::High)
                .unwrap_err()
                .1,
            SqRefusal::Degraded
        );
    }

    #[test]
    fn least_loaded_picks_the_fewest_posted_plus_queued_and_counts_it() {
        let (g, qs) = gate(&[8, 8]);
        let r = qs[0].try_reserve(3).unwrap();
        let _q = qs[1].try_admit(2).unwrap();
        let t = g
            .admit(SplitPolicy::LeastLoaded, 2, NOW, Priority::High)
            .unwrap();
        assert!(
            Arc::ptr_eq(t[0].queue().unwrap(), &qs[1]),
            "3 posted vs 2 queued"
        );
        let t2 = g
            .admit(SplitPolicy::LeastLoaded, 1, NOW, Priority::High)
            .unwrap();
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
        let big = g
            .admit(SplitPolicy::LeastLoaded, 100, NOW, Priority::High)
            .unwrap();
        assert_eq!(big[0].count(), 8);
    }

    #[test]
    fn a_full_queue_times_out_with_its_snapshot_and_a_release_admits() {
        let (g, qs) = gate(&[4]);
        let held = g
            .admit(SplitPolicy::LeastLoaded, 4, NOW, Priority::High)
            .unwrap();
        let (i, e) = g
            .admit(
                SplitPolicy::LeastLoaded,
                1,
                Duration::from_millis(2),
                Priority::High,
            )
            .unwrap_err();
        assert_eq!(i, 0);
        assert!(
            matches!(e, SqRefusal::TimedOut(s) if s.queued == 4),
            "{e:?}"
        );
        assert_eq!(qs[0].snapshot().admission_timeouts, 1);
        // A waiter wakes when the holder lets go.
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                g.admit(
                    SplitPolicy::LeastLoaded,
                    2,
                    Duration::from_secs(10),
                    Priority::High,
                )
            });
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
        let t = g
            .admit(SplitPolicy::Capacity, 12, NOW, Priority::High)
            .unwrap();
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
        let t = g
            .admit(SplitPolicy::Capacity, 20, NOW, Priority::High)
            .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].count(), qs[1].queued()), (8, 8));
        assert_eq!(qs[2].queued(), 1, "the greedy pass gave back what it took");
    }

    #[test]
    fn capacity_splits_over_at_most_max_chunks_endpoints() {
        let qs: Vec<Arc<SqController>> = (0..4)
            .map(|_| Arc::new(SqController::new(8, 0, Duration::from_micros(50))))
            .collect();
        let g = AdmissionGate::new(
            qs.iter()
                .map(|q| Arc::new(ArcSwap::new(q.clone())))
                .collect(),
            0,
            2,
        );
        // 20 would need three endpoints: two may not hold it, so nothing
        // is kept from the split and the least-loaded one takes its depth.
        let t = g
            .admit(SplitPolicy::Capacity, 20, NOW, Priority::High)
            .unwrap();
        assert_eq!(t.iter().map(|t| t.count()).collect::<Vec<_>>(), [8]);
        assert_eq!(qs.iter().map(|q| q.queued()).sum::<u32>(), 8);
        drop(t);
        let t = g
            .admit(SplitPolicy::Capacity, 16, NOW, Priority::High)
            .unwrap();
        assert_eq!(t.iter().map(|t| t.count()).collect::<Vec<_>>(), [8, 8]);
    }
}
