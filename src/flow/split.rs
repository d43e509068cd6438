//! Seed 004's split policies (`sq_split_policy`): which of several send
//! queues takes the next piece of work. One rule, used twice: by the
//! admission gate (which endpoint a submit is charged to, on the
//! submitting thread) and by the worker's post path (which of a rail's
//! `qp_per_transfer` QPs a slice goes out on).
//!
//! - `static`: round robin over the queues in service, from a cursor.
//! - `least_loaded`: the queue in service with the fewest posted + queued
//!   requests; among equals the first from the cursor, so a quiet peer's
//!   slices still spread.
//! - `capacity`: the cursor's queue while it has a free slot, else the one
//!   with the most free: consecutive slices go to one QP, which posts
//!   them as one linked list (one doorbell), until it is full.

use crate::config::SplitPolicy;

/// One queue as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLoad {
    /// Can it take work (not terminal, not stalled, not unconnectable)?
    pub open: bool,
    /// Requests posted, admitted or waiting on it.
    pub load: u32,
    /// Its depth.
    pub depth: u32,
}

impl QueueLoad {
    /// Slots left before it is full.
    #[inline]
    pub(crate) fn free(&self) -> u32 {
        self.depth.saturating_sub(self.load)
    }
}

/// The queue among `n` (`of(k)`: queue `k`'s load) that `policy` gives
/// the next piece of work to, starting from `cursor`; `None` when none
/// is open. The caller moves its cursor with [`next_cursor`].
#[inline]
pub fn choose(
    policy: SplitPolicy,
    n: usize,
    cursor: usize,
    of: impl Fn(usize) -> QueueLoad,
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let from = cursor % n;
    let order = (0..n).map(move |k| (from + k) % n);
    match policy {
        SplitPolicy::Static => order.into_iter().find(|&k| of(k).open),
        SplitPolicy::LeastLoaded => order
            .filter_map(|k| Some((k, of(k))).filter(|(_, q)| q.open))
            .min_by_key(|(_, q)| q.load)
            .map(|(k, _)| k),
        SplitPolicy::Capacity => {
            let here = of(from);
            if here.open && here.free() > 0 {
                return Some(from);
            }
            order
                .filter_map(|k| Some((k, of(k))).filter(|(_, q)| q.open))
                // The first of the most free: `max_by_key` keeps the last.
                .min_by_key(|(_, q)| std::cmp::Reverse(q.free()))
                .map(|(k, _)| k)
        }
    }
}

/// Where the cursor goes once `chosen` took the work: past it (round
/// robin, and least-loaded's ties), or onto it (`capacity` stays).
#[inline]
pub fn next_cursor(policy: SplitPolicy, chosen: usize) -> usize {
    match policy {
        SplitPolicy::Capacity => chosen,
        SplitPolicy::Static | SplitPolicy::LeastLoaded => chosen + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(open: bool, load: u32) -> QueueLoad {
        QueueLoad {
            open,
            load,
            depth: 8,
        }
    }

    /// `policy` run `rounds` times over `qs`, each pick adding one load.
    fn run(policy: SplitPolicy, mut qs: Vec<QueueLoad>, rounds: usize) -> Vec<usize> {
        let mut cursor = 0;
        let mut picks = vec![];
        for _ in 0..rounds {
            let Some(k) = choose(policy, qs.len(), cursor, |k| qs[k]) else {
                break;
            };
            qs[k].load += 1;
            cursor = next_cursor(policy, k);
            picks.push(k);
        }
        picks
    }

    #[test]
    fn static_goes_round_robin_over_the_open_queues() {
        let qs = vec![q(true, 0), q(false, 0), q(true, 7)];
        assert_eq!(run(SplitPolicy::Static, qs, 4), [0, 2, 0, 2]);
    }

    #[test]
    fn least_loaded_evens_the_queues_out_and_spreads_ties() {
        let qs = vec![q(true, 3), q(true, 0), q(true, 1), q(false, 0)];
        // The emptiest first; among equals the first from the cursor, so
        // 1 and 2 alternate instead of 1 taking every tie; 0 (3 loaded)
        // waits until they catch up.
        assert_eq!(
            run(SplitPolicy::LeastLoaded, qs, 8),
            [1, 2, 1, 2, 1, 2, 0, 1]
        );
    }

    #[test]
    fn capacity_fills_one_queue_then_moves_to_the_most_free() {
        let qs = vec![q(true, 6), q(true, 5), q(true, 2), q(false, 0)];
        let picks = run(SplitPolicy::Capacity, qs, 10);
        assert_eq!(picks, [0, 0, 2, 2, 2, 2, 2, 2, 1, 1]);
        // Everything full: still the first open one (its backlog, or the
        // admission wait, is the caller's); nothing open: none.
        assert_eq!(
            run(SplitPolicy::Capacity, vec![q(false, 0), q(true, 8)], 1),
            [1]
        );
        assert!(run(SplitPolicy::Static, vec![q(false, 0)], 1).is_empty());
        assert_eq!(choose(SplitPolicy::LeastLoaded, 0, 5, |_| q(true, 0)), None);
    }
}
