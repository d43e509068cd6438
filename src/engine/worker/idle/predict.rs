//! Adaptive polling: when work arrives at a steady pace (an op every
//! millisecond, say), an idle worker that parks pays a futex wake on every
//! arrival (26–78 µs here, against under a microsecond awake). The
//! [`ArrivalPredictor`] learns the gap between arrivals (an EWMA of the
//! gap and of its deviation, as TCP's RTT estimator does) and, while the
//! gaps are regular, has the worker sleep until just before the next one
//! is due and poll through the window it predicts, as io_uring's
//! `sq_thread_idle` and NAPI's busy-poll keep a poller awake for what is
//! about to come. A budget (`workers/idle_poll_budget_pct`, a share of
//! one core) bounds the polling: past it, the worker parks as before.
//! With nothing arriving there is no prediction, and an idle worker costs
//! what it did.
//!
//! A decision is a function of the state and `now`, unit-tested with a
//! simulated clock; the worker feeds it arrivals and polls.

/// Arrivals seen before a prediction is trusted.
const WARMUP: u32 = 4;
/// Gaps longer than this are not polled for (a park costs little then).
const MAX_GAP_NS: u64 = 20_000_000;
/// Gaps shorter than this are the spin phase's (`workers/spin_us`).
const MIN_GAP_NS: u64 = 20_000;
/// How early the worker wakes before the predicted arrival: more than a
/// futex wake-up takes here (26–78 µs). An arrival the worker missed is
/// stamped that much late, so the next window must open that much early to
/// catch the op by polling, whose stamp then puts the window back on the
/// pace (with 30 µs a pace lost once stayed lost).
const LEAD_NS: u64 = 100_000;
/// The window reaches this many deviations either side of the arrival.
const JITTER_WIDTH: u64 = 3;
/// The window's least half-width.
const MIN_HALF_WINDOW_NS: u64 = 10_000;
/// Gaps whose deviation exceeds this share of the gap are irregular: not
/// predicted (a random arrival gains nothing from an early wake).
const MAX_JITTER_SHARE: u64 = 4; // deviation <= gap / 4
/// The budget is kept over windows of this length.
const BUDGET_PERIOD_NS: u64 = 100_000_000;

/// Where the worker stands against the next predicted arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine::worker) enum Plan {
    /// No prediction (irregular, too long, too few samples, or the budget
    /// spent): the base policy decides.
    None,
    /// The next arrival is predicted: sleep until `wake_at` (monotonic
    /// ns), then poll.
    SleepUntil(u64),
    /// Inside the predicted window: keep polling.
    Poll,
}

/// See the module doc.
#[derive(Debug)]
pub(in crate::engine::worker) struct ArrivalPredictor {
    /// `workers/idle_poll_budget_pct`, in parts per hundred of one core.
    budget_pct: u64,
    last_arrival: u64,
    /// The last arrival woke the worker from a park (its stamp lags the
    /// op by a futex wake-up) rather than being found by polling.
    last_woke: bool,
    samples: u32,
    gap_ns: u64,
    dev_ns: u64,
    /// Polling charged in the current budget period, and its start.
    spent_ns: u64,
    period_start: u64,
}

impl ArrivalPredictor {
    pub(in crate::engine::worker) fn new(budget_pct: u32) -> ArrivalPredictor {
        ArrivalPredictor {
            budget_pct: u64::from(budget_pct.min(100)),
            last_arrival: 0,
            last_woke: false,
            samples: 0,
            gap_ns: 0,
            dev_ns: 0,
            spent_ns: 0,
            period_start: 0,
        }
    }

    /// Work arrived, seen at `now` after the worker was idle: found by
    /// polling, or (`woke`) after it woke the worker from a park, when the
    /// stamp lags the op by the wake-up. A gap between one of each is off
    /// by that lag: it moves the phase but teaches nothing about the pace
    /// (mixing them made the deviation, and so the window, too wide to
    /// stay within the budget).
    pub(in crate::engine::worker) fn arrived(&mut self, now: u64, woke: bool) {
        if self.budget_pct == 0 {
            return;
        }
        let same_kind = woke == self.last_woke;
        self.last_woke = woke;
        if !same_kind {
            self.last_arrival = now;
            return;
        }
        if self.last_arrival != 0 && now > self.last_arrival {
            let gap = now - self.last_arrival;
            if gap > MAX_GAP_NS {
                // A pause, not a pace: learn the pace afresh.
                self.samples = 0;
            } else if self.samples == 0 {
                self.gap_ns = gap;
                self.dev_ns = gap / 2;
                self.samples = 1;
            } else {
                // gap += (sample - gap) / 8; dev += (|sample - gap| - dev) / 4
                let err = gap.abs_diff(self.gap_ns);
                self.gap_ns = self.gap_ns - self.gap_ns / 8 + gap / 8;
                self.dev_ns = self.dev_ns - self.dev_ns / 4 + err / 4;
                self.samples = self.samples.saturating_add(1);
            }
        }
        self.last_arrival = now;
    }

    /// The predicted window of the next arrival, `[from, until)`, if the
    /// arrivals are regular enough to predict.
    fn window(&self) -> Option<(u64, u64)> {
        if self.samples < WARMUP
            || self.gap_ns < MIN_GAP_NS
            || self.gap_ns > MAX_GAP_NS
            || self.dev_ns > self.gap_ns / MAX_JITTER_SHARE
        {
            return None;
        }
        let at = self.last_arrival.saturating_add(self.gap_ns);
        let half = self
            .dev_ns
            .saturating_mul(JITTER_WIDTH)
            .max(MIN_HALF_WINDOW_NS);
        // A wide window (jittery arrivals) may cover much of the gap: the
        // budget bounds what it costs. Narrower windows were tried: once a
        // miss's futex wake-up stamps arrivals late and jittery, they never
        // lock onto the pace again (1000/s: p50 74 us instead of 0.5).
        Some((at.saturating_sub(half + LEAD_NS), at.saturating_add(half)))
    }

    /// What to do at `now` with no work, the base spin and yield past.
    pub(in crate::engine::worker) fn plan(&mut self, now: u64) -> Plan {
        let Some((from, until)) = self.window() else {
            return Plan::None;
        };
        if now >= until || !self.within_budget(now) {
            return Plan::None;
        }
        if now < from {
            Plan::SleepUntil(from)
        } else {
            Plan::Poll
        }
    }

    /// The worker polled for `ns` in a predicted window (or spun waiting
    /// for one); charged to the budget.
    pub(in crate::engine::worker) fn polled(&mut self, now: u64, ns: u64) {
        self.roll(now);
        self.spent_ns = self.spent_ns.saturating_add(ns);
    }

    fn roll(&mut self, now: u64) {
        if now.saturating_sub(self.period_start) >= BUDGET_PERIOD_NS {
            self.period_start = now;
            self.spent_ns = 0;
        }
    }

    fn within_budget(&mut self, now: u64) -> bool {
        self.roll(now);
        self.spent_ns.saturating_mul(100) < self.budget_pct.saturating_mul(BUDGET_PERIOD_NS)
    }
}

#[cfg(test)]
mod tests {
    use super::{ArrivalPredictor, BUDGET_PERIOD_NS, LEAD_NS, Plan};

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    /// Arrivals every `gap` from `start`, `n` of them; returns the last.
    fn feed(p: &mut ArrivalPredictor, start: u64, gap: u64, n: u64) -> u64 {
        let mut t = start;
        for _ in 0..n {
            p.arrived(t, false);
            t += gap;
        }
        t - gap
    }

    #[test]
    fn a_steady_pace_sleeps_until_just_before_the_next_arrival_then_polls() {
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, 10 * MS, MS, 20);
        let next = last + MS;
        // Right after the last one: sleep, waking a little before the next.
        match p.plan(last + 100 * US) {
            Plan::SleepUntil(at) => {
                assert!(
                    at < next && at + LEAD_NS + 100 * US >= next,
                    "{at} vs {next}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Inside the window: poll; past it: the base policy.
        assert_eq!(p.plan(next - 5 * US), Plan::Poll);
        assert_eq!(p.plan(next + 5 * US), Plan::Poll);
        assert_eq!(p.plan(next + MS / 2), Plan::None);
    }

    #[test]
    fn too_few_samples_irregular_gaps_long_gaps_or_no_budget_predict_nothing() {
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, MS, MS, 3);
        assert_eq!(p.plan(last + 100 * US), Plan::None, "warm-up");

        // Irregular: alternating 0.2 ms and 1.8 ms gaps.
        let mut p = ArrivalPredictor::new(25);
        let mut t = MS;
        for i in 0..40 {
            p.arrived(t, false);
            t += if i % 2 == 0 { 200 * US } else { 1_800 * US };
        }
        assert_eq!(p.plan(t - 900 * US), Plan::None, "irregular");

        // A gap a park costs little against.
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, MS, 50 * MS, 10);
        assert_eq!(p.plan(last + MS), Plan::None, "long gaps");

        // Budget 0: never.
        let mut p = ArrivalPredictor::new(0);
        let last = feed(&mut p, MS, MS, 20);
        assert_eq!(p.plan(last + MS - 5 * US), Plan::None, "no budget");
    }

    #[test]
    fn polling_past_the_budget_falls_back_until_the_next_period() {
        let mut p = ArrivalPredictor::new(10);
        let last = feed(&mut p, 2 * BUDGET_PERIOD_NS, MS, 20);
        let next = last + MS;
        assert_eq!(p.plan(next), Plan::Poll);
        // A tenth of the period spent: the budget is gone.
        p.polled(next, BUDGET_PERIOD_NS / 10);
        assert_eq!(p.plan(next), Plan::None);
        // The next period starts afresh.
        assert!(p.within_budget(next + BUDGET_PERIOD_NS));
    }

    #[test]
    fn a_clock_that_jumps_or_goes_back_is_survived_and_a_pause_restarts_the_estimate() {
        let mut p = ArrivalPredictor::new(25);
        for t in [1, u64::MAX, 5, u64::MAX - 1, 0, 7] {
            p.arrived(t, t % 2 == 0);
            let _ = p.plan(t);
            p.polled(t, u64::MAX);
        }
        // A steady pace, one long pause, and the pace again: the pause is
        // forgotten rather than averaged in.
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, MS, MS, 20);
        let last = feed(&mut p, last + 50 * MS, MS, 12);
        assert_eq!(p.plan(last + MS), Plan::Poll);
    }

    #[test]
    fn a_late_stamp_moves_the_phase_but_not_the_pace() {
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, MS, MS, 20);
        // The next op woke the worker: stamped 75 us late. Then polling
        // finds the following ones on the pace again.
        p.arrived(last + MS + 75 * US, true);
        p.arrived(last + 2 * MS, false);
        let last = feed(&mut p, last + 3 * MS, MS, 3);
        assert_eq!(p.plan(last + MS - 2 * US), Plan::Poll);
        assert!(matches!(p.plan(last + 100 * US), Plan::SleepUntil(_)));
    }

    #[test]
    fn the_estimate_follows_a_change_of_pace() {
        let mut p = ArrivalPredictor::new(25);
        let last = feed(&mut p, MS, MS, 20);
        let last = feed(&mut p, last + 500 * US, 500 * US, 30);
        assert_eq!(p.plan(last + 500 * US), Plan::Poll);
        assert!(matches!(p.plan(last + 50 * US), Plan::SleepUntil(_)));
    }
}
