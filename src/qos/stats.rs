//! Per-priority statistics (seed 001's "monitor queue depths for each
//! priority level", and what proves HIGH is protected): one block per
//! worker, written only by that worker with plain load + store (no
//! read-modify-write on the hot path), read by anyone.

use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::Priority;

/// Wait-time histogram buckets: bucket 0 holds waits under 1 µs, bucket
/// `k` waits in [2^(k-1), 2^k) µs, the last everything longer (> 4 s).
pub const WAIT_BUCKETS: usize = 24;

/// The upper bound in µs of wait bucket `k` (`u64::MAX` for the last).
pub fn bucket_upper_us(k: usize) -> u64 {
    if k + 1 >= WAIT_BUCKETS {
        u64::MAX
    } else {
        1 << k
    }
}

/// The bucket a wait of `ns` falls in.
#[inline]
pub(crate) fn bucket_of(ns: u64) -> usize {
    let us = ns / 1_000;
    if us == 0 {
        0
    } else {
        ((64 - us.leading_zeros()) as usize).min(WAIT_BUCKETS - 1)
    }
}

/// One worker's per-priority counters.
#[derive(Debug, Default)]
pub(crate) struct PriorityStats {
    /// Tasks queued in each lane now (published by housekeeping, every
    /// millisecond while the worker has work).
    queued: [AtomicU64; 3],
    /// Tasks accepted, by the priority they were submitted with.
    accepted: [AtomicU64; 3],
    /// Tasks promoted out of each lane (MEDIUM → HIGH, LOW → MEDIUM).
    promoted: [AtomicU64; 3],
    /// Times a lane with work found the slot gate closed (once per
    /// closing, not per look).
    gate_holds: [AtomicU64; 3],
    /// Queue wait, by submitted priority: from intake to the task's first
    /// slice handed to a transport.
    wait: [[AtomicU64; WAIT_BUCKETS]; 3],
    /// The waits' sum in ns.
    wait_sum_ns: [AtomicU64; 3],
    /// Requests served at intake (`Worker::complete_inline`): accepted and
    /// posted at once, a wait of 0. One counter instead of three per op;
    /// `sum_into` adds them to `accepted` and to wait bucket 0.
    at_intake: [AtomicU64; 3],
}

#[inline]
fn add(a: &AtomicU64, n: u64) {
    // Single writer (the worker): load + store, no lock prefix.
    a.store(a.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl PriorityStats {
    /// A task of priority `p` was accepted.
    #[inline]
    pub(crate) fn accepted(&self, p: Priority) {
        add(&self.accepted[p.index()], 1);
    }

    /// A request of priority `p` was accepted and served at intake: as
    /// `accepted` then `waited(p, 0)`, in one store.
    #[inline]
    pub(crate) fn served_at_intake(&self, p: Priority) {
        add(&self.at_intake[p.index()], 1);
    }

    /// `moved[i]` tasks were promoted out of lane `i`.
    #[inline]
    pub(crate) fn promoted(&self, moved: [u32; 3]) {
        for (c, n) in self.promoted.iter().zip(moved) {
            if n > 0 {
                add(c, u64::from(n));
            }
        }
    }

    /// A lane of priority `p` with work found its gate closed.
    #[inline]
    pub(crate) fn gate_held(&self, p: Priority) {
        add(&self.gate_holds[p.index()], 1);
    }

    /// A task of priority `p` posted its first slice `ns` after intake.
    #[inline]
    pub(crate) fn waited(&self, p: Priority, ns: u64) {
        add(&self.wait[p.index()][bucket_of(ns)], 1);
        add(&self.wait_sum_ns[p.index()], ns);
    }

    /// Publish the lanes' depths.
    pub(crate) fn set_queued(&self, lens: [usize; 3]) {
        for (g, n) in self.queued.iter().zip(lens) {
            g.store(n as u64, Ordering::Relaxed);
        }
    }

    /// Add this worker's counters into `into`.
    pub(crate) fn sum_into(&self, into: &mut QosSnapshot) {
        for p in 0..3 {
            let l = &mut into.levels[p];
            l.queued += self.queued[p].load(Ordering::Relaxed);
            let at_intake = self.at_intake[p].load(Ordering::Relaxed);
            l.accepted += self.accepted[p].load(Ordering::Relaxed) + at_intake;
            l.wait[0] += at_intake;
            l.promoted += self.promoted[p].load(Ordering::Relaxed);
            l.gate_holds += self.gate_holds[p].load(Ordering::Relaxed);
            l.wait_sum_ns += self.wait_sum_ns[p].load(Ordering::Relaxed);
            for (b, c) in l.wait.iter_mut().zip(&self.wait[p]) {
                *b += c.load(Ordering::Relaxed);
            }
        }
    }
}

/// One priority level's figures, summed over the workers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LevelSnapshot {
    /// Tasks queued in this lane (as last published).
    pub queued: u64,
    /// Tasks accepted at this priority.
    pub accepted: u64,
    /// Tasks promoted out of this lane.
    pub promoted: u64,
    /// Closings of the slot gate met by this lane with work.
    pub gate_holds: u64,
    /// Queue-wait histogram (see [`WAIT_BUCKETS`] and [`bucket_upper_us`]).
    pub wait: [u64; WAIT_BUCKETS],
    /// The waits' sum in ns.
    pub wait_sum_ns: u64,
}

impl LevelSnapshot {
    /// Waits recorded.
    pub fn waits(&self) -> u64 {
        self.wait.iter().sum()
    }

    /// The bucket bound (µs) under which fraction `q` of the waits fell
    /// (`None`: none recorded). Bucket resolution: a factor of two.
    pub fn wait_quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.waits();
        if n == 0 {
            return None;
        }
        let want = ((n as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (k, c) in self.wait.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(bucket_upper_us(k));
            }
        }
        Some(u64::MAX)
    }
}

/// Every priority level's figures ([`Engine::qos_stats`](crate::Engine::qos_stats)).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QosSnapshot {
    /// Indexed by [`Priority::index`].
    pub levels: [LevelSnapshot; 3],
    /// The shared slot clock, when one is configured.
    pub slots: Option<SlotSnapshot>,
}

/// The shared slot clock as this engine sees it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// The current slot (0: HIGH only, 1: HIGH + MEDIUM, 2: all).
    pub slot: u8,
    /// Does this engine rotate it now?
    pub owner: bool,
    /// Takeovers recorded in the file (every participant's).
    pub takeovers: u64,
}

/// The name of priority `p` in metrics and reports.
pub(crate) fn name(p: Priority) -> &'static str {
    match p {
        Priority::High => "high",
        Priority::Medium => "medium",
        Priority::Low => "low",
    }
}

impl QosSnapshot {
    /// The level of priority `p`.
    pub fn level(&self, p: Priority) -> &LevelSnapshot {
        &self.levels[p.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_served_at_intake_counts_as_accepted_with_no_wait() {
        let s = PriorityStats::default();
        s.accepted(Priority::High);
        s.waited(Priority::High, 5_000);
        s.served_at_intake(Priority::High);
        s.served_at_intake(Priority::High);
        let mut snap = QosSnapshot::default();
        s.sum_into(&mut snap);
        let high = snap.levels[Priority::High.index()];
        assert_eq!(high.accepted, 3);
        assert_eq!(high.waits(), 3);
        assert_eq!(high.wait[0], 2, "the two served at intake waited 0");
        assert_eq!(high.wait[bucket_of(5_000)], 1);
        assert_eq!(high.wait_sum_ns, 5_000);
        assert_eq!(snap.levels[Priority::Low.index()].accepted, 0);
    }

    #[test]
    fn buckets_are_powers_of_two_of_microseconds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(999), 0);
        assert_eq!(bucket_of(1_000), 1);
        assert_eq!(bucket_of(1_999), 1);
        assert_eq!(bucket_of(2_000), 2);
        assert_eq!(bucket_of(1_000_000), 10);
        assert_eq!(bucket_of(u64::MAX), WAIT_BUCKETS - 1);
        assert_eq!(bucket_upper_us(1), 2);
    }

    #[test]
    fn counters_sum_and_quantiles_read_back() {
        let s = PriorityStats::default();
        s.accepted(Priority::Low);
        s.promoted([0, 1, 2]);
        s.gate_held(Priority::Low);
        for _ in 0..99 {
            s.waited(Priority::High, 500);
        }
        s.waited(Priority::High, 3_000_000);
        s.set_queued([1, 0, 4]);
        let mut snap = QosSnapshot::default();
        s.sum_into(&mut snap);
        s.sum_into(&mut snap);
        let low = snap.level(Priority::Low);
        assert_eq!(
            (low.accepted, low.promoted, low.gate_holds, low.queued),
            (2, 4, 2, 8)
        );
        let high = snap.level(Priority::High);
        assert_eq!(high.waits(), 200);
        assert_eq!(high.wait_quantile_us(0.5), Some(1));
        assert_eq!(high.wait_quantile_us(0.999), Some(4096));
        assert_eq!(snap.level(Priority::Medium).wait_quantile_us(0.5), None);
    }
}
