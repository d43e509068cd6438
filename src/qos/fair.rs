//! Fair shares between a daemon's clients within a priority: a client
//! that floods its rings cannot starve another of the same priority.
//!
//! Each client may have, at each priority, at most its share of a window
//! of work taken from its rings and not yet completed: `window x weight /
//! (its weight + the weights of the other clients with such work)`, and
//! always one op (so an op larger than its share still runs, alone). Past
//! it the worker leaves the client's SQEs in its ring, where they wait
//! without costing anyone else. An op counts its bytes, and at least
//! [`MIN_COST`] (small ops are held to a share too).
//!
//! Why that is fair: every backlogged client then holds its share of the
//! work in the worker's lanes and the transports below; they serve what
//! they hold in arrival order, so each client's work waits as long as
//! another's, and by Little's law each moves bytes in proportion to what
//! it holds: its weight. It is the window form of weighted fair queueing
//! (a deficit round robin needs per-client queues in the worker; this
//! needs two counters per client and priority, kept with atomics because a
//! client's rings may sit on several workers). A client alone at a
//! priority has the whole window, so it runs as fast as it would without
//! the rule.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use tent_rings::Priority;

/// The work, in bytes, that the clients with work at one priority share
/// (taken from their rings, not yet completed). Enough for one client
/// alone to keep the fastest transport busy (8 x 4 MiB in flight).
pub(crate) const WINDOW: u64 = 32 << 20;
/// What an op counts for at least, in bytes: 8192 small ops fill a window.
pub(crate) const MIN_COST: u64 = 4 << 10;

/// The weights of the clients with work at each priority, engine-wide.
#[derive(Debug)]
pub(crate) struct FairShares {
    window: u64,
    /// Written by every worker as clients start and stop having work: a
    /// line of its own.
    active: CachePadded<[AtomicU64; 3]>,
}

impl Default for FairShares {
    fn default() -> Self {
        FairShares::new(WINDOW)
    }
}

/// One client's weight and its work taken, by priority.
#[derive(Debug)]
pub(crate) struct ClientShare {
    weight: u64,
    taken: [AtomicU64; 3],
}

impl ClientShare {
    /// A client of `weight` (at least 1).
    pub(crate) fn new(weight: u32) -> ClientShare {
        ClientShare {
            weight: u64::from(weight.max(1)),
            taken: Default::default(),
        }
    }

    /// Its weight.
    pub(crate) fn weight(&self) -> u64 {
        self.weight
    }

    /// Its work taken and not completed at `p`, in bytes (as counted).
    #[cfg(test)]
    pub(crate) fn taken(&self, p: Priority) -> u64 {
        self.taken[p.index()].load(Ordering::Relaxed)
    }
}

/// What an op of `len` bytes counts for.
#[inline]
fn cost(len: u64) -> u64 {
    len.max(MIN_COST)
}

/// A client's share of `window`: `weight` against `others` (the weights of
/// the other clients with work).
#[inline]
pub(crate) fn share(window: u64, weight: u64, others: u64) -> u64 {
    let all = weight.saturating_add(others).max(1);
    u64::try_from(u128::from(window) * u128::from(weight) / u128::from(all)).unwrap_or(u64::MAX)
}

impl FairShares {
    /// Shares of a window of `window` bytes.
    pub(crate) fn new(window: u64) -> FairShares {
        FairShares {
            window,
            active: Default::default(),
        }
    }

    /// May `c` have one more op of `len` bytes at `p` taken? Always when it
    /// has none there; else while its work stays within its share.
    #[inline]
    pub(crate) fn may_take(&self, c: &ClientShare, p: Priority, len: u64) -> bool {
        let i = p.index();
        let taken = c.taken[i].load(Ordering::Relaxed);
        if taken == 0 {
            return true;
        }
        // It is active: the others are the rest of the sum.
        let others = self.active[i]
            .load(Ordering::Relaxed)
            .saturating_sub(c.weight);
        taken.saturating_add(cost(len)) <= share(self.window, c.weight, others)
    }

    /// `c` took an op of `len` bytes at `p`.
    #[inline]
    pub(crate) fn took(&self, c: &ClientShare, p: Priority, len: u64) {
        let i = p.index();
        if c.taken[i].fetch_add(cost(len), Ordering::Relaxed) == 0 {
            self.active[i].fetch_add(c.weight, Ordering::Relaxed);
        }
    }

    /// An op of `len` bytes at `p` that `c` took has completed.
    #[inline]
    pub(crate) fn done(&self, c: &ClientShare, p: Priority, len: u64) {
        let i = p.index();
        let n = cost(len);
        if c.taken[i].fetch_sub(n, Ordering::Relaxed) == n {
            self.active[i].fetch_sub(c.weight, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A FIFO server moving `rate` bytes per tick, fed by clients that
    /// each keep `demand` ops of `len` bytes submitted (their rings) and
    /// are let in by the shares; what each moved over `ticks`.
    fn serve(clients: &[(u32, usize, u64)], rate: u64, ticks: u32) -> Vec<u64> {
        let fair = FairShares::default();
        let shares: Vec<ClientShare> = clients.iter().map(|&(w, _, _)| ClientShare::new(w)).collect();
        // Ops waiting in each client's ring, and the server's queue.
        let mut ring: Vec<usize> = clients.iter().map(|&(_, d, _)| d).collect();
        let mut queue: VecDeque<(usize, u64)> = VecDeque::new();
        let mut moved = vec![0u64; clients.len()];
        let mut head_left = 0u64;
        for _ in 0..ticks {
            // Intake: each ring in turn, while its share lets it.
            for (c, &(_, _, len)) in clients.iter().enumerate() {
                while ring[c] > 0 && fair.may_take(&shares[c], Priority::Low, len) {
                    ring[c] -= 1;
                    fair.took(&shares[c], Priority::Low, len);
                    queue.push_back((c, len));
                }
            }
            // Service: `rate` bytes, head first.
            let mut budget = rate;
            while budget > 0 {
                let Some(&(c, len)) = queue.front() else { break };
                if head_left == 0 {
                    head_left = len;
                }
                let n = head_left.min(budget);
                head_left -= n;
                budget -= n;
                moved[c] += n;
                if head_left == 0 {
                    queue.pop_front();
                    fair.done(&shares[c], Priority::Low, len);
                    // Closed loop: the client submits another.
                    ring[c] += 1;
                }
            }
        }
        moved
    }

    #[test]
    fn a_client_flooding_four_times_the_ops_gets_no_more_than_an_equal_share() {
        let mb = 1 << 20;
        let moved = serve(&[(1, 4, 4 * mb), (1, 16, 4 * mb)], mb, 20_000);
        let ratio = moved[1] as f64 / moved[0] as f64;
        assert!((0.9..=1.1).contains(&ratio), "{moved:?}: {ratio}");
    }

    #[test]
    fn weights_three_to_one_share_three_to_one() {
        let mb = 1 << 20;
        let moved = serve(&[(3, 32, 4 * mb), (1, 32, 4 * mb)], mb, 20_000);
        let ratio = moved[0] as f64 / moved[1] as f64;
        assert!((2.7..=3.3).contains(&ratio), "{moved:?}: {ratio}");
    }

    #[test]
    fn a_client_alone_has_the_whole_window_and_one_op_always_goes() {
        let fair = FairShares::default();
        let a = ClientShare::new(1);
        let mut n = 0;
        while fair.may_take(&a, Priority::Low, 4 << 20) {
            fair.took(&a, Priority::Low, 4 << 20);
            n += 1;
        }
        assert_eq!(n, WINDOW / (4 << 20), "alone: the whole window");
        // Another client comes: the first is now past its half, the newcomer
        // gets its first op at once, and a huge op still goes alone.
        let b = ClientShare::new(1);
        assert!(fair.may_take(&b, Priority::Low, 1 << 40));
        fair.took(&b, Priority::Low, 1 << 40);
        assert!(!fair.may_take(&a, Priority::Low, 4 << 20));
        // Other priorities are shared apart.
        assert!(fair.may_take(&a, Priority::High, 4096));
        fair.done(&b, Priority::Low, 1 << 40);
        assert_eq!(b.taken(Priority::Low), 0);
        for _ in 0..n {
            fair.done(&a, Priority::Low, 4 << 20);
        }
        assert_eq!(fair.active[Priority::Low.index()].load(Ordering::Relaxed), 0);
    }
}
