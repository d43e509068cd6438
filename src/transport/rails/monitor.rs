//! `RailMonitor`: the health of one rail, held in atomics.
//!
//! A rail is a (local device, remote device) pair: two RDMA NICs, or two
//! network interfaces for TCP. Every transport keeps one monitor per rail
//! per peer and asks [`RailMonitor::available`] before it posts a slice on
//! that rail; completions report back with [`RailMonitor::mark_failed`] and
//! [`RailMonitor::mark_recovered`].
//!
//! - **Fast path.** A rail in service costs one relaxed load to gate a post
//!   and one relaxed load to report a good completion; no lock anywhere.
//! - **Pausing.** `threshold` failures inside `window` (counted from the
//!   window's first failure; good completions in between do not reset the
//!   count, so a rail failing 40% of its slices still trips) pause the rail
//!   for a cooldown. A repeat trip doubles the cooldown, up to 300 s.
//! - **Recovery.** A good completion of a slice *posted after the trip* (a
//!   probe), or the cooldown's expiry, brings the rail back. A slice that
//!   was already in flight when the rail tripped proves nothing about it.
//! - **Decay, not reset** (closing TENT's gap): coming back does not forget
//!   the backoff. The remembered cooldown halves per `decay` of healthy
//!   time, so a rail that flaps pays a growing cooldown while one that
//!   stays healthy is forgiven.
//! - **Slow rails.** [`review_bandwidth`] compares the rails' bandwidth
//!   estimates (the selector's EWMA, kept per worker by the rail layer)
//!   and demotes a rail whose estimate stays below half the median of its
//!   siblings for 1 s: new slices avoid it while others are available,
//!   and it gets a probe slice every 100 ms so that it can earn its way
//!   back. (Under smart scheduling the EWMA weights already give a slow
//!   rail its proportional share, so the rail layer does not exclude a
//!   demoted rail there; see `rails::RailSet::pick`.)
//!
//! Several workers may report on one rail at once. Counters are RMWs; the
//! slow-path state changes are CASes, so exactly one reporter logs a trip
//! or a recovery. Bytes, in-flight counts and bandwidth are not here:
//! they are per worker (`rails::Rail`), so a slice costs no shared RMW.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::clock::{monotonic_ns, nanos};
use crate::config::Config;

/// Longest cooldown, however often a rail trips.
pub const MAX_COOLDOWN_NS: u64 = 300 * 1_000_000_000;
/// How long a rail must stay slow before it is demoted.
pub const SLOW_FOR_NS: u64 = 1_000_000_000;
/// A rail is slow below this fraction of its siblings' median bandwidth.
pub const SLOW_RATIO: f64 = 0.5;
/// How often a demoted rail still gets a slice, to re-measure it.
pub const PROBE_EVERY_NS: u64 = 100_000_000;

/// The thresholds a monitor applies (TENT's `rail_*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailPolicy {
    /// Failures inside `window_ns` that pause the rail.
    pub threshold: u32,
    /// The window failures are counted in.
    pub window_ns: u64,
    /// First cooldown of a paused rail.
    pub cooldown_ns: u64,
    /// Healthy time that halves the remembered cooldown.
    pub decay_ns: u64,
}

impl RailPolicy {
    /// The policy the config asks for (`transports/rdma/rail_*`, which
    /// apply to every transport's rails).
    pub(crate) fn from_config(c: &Config) -> RailPolicy {
        let r = &c.transports.rdma;
        RailPolicy {
            threshold: r.rail_error_threshold.max(1),
            window_ns: nanos(r.rail_error_window_secs),
            cooldown_ns: nanos(r.rail_cooldown_secs).min(MAX_COOLDOWN_NS),
            decay_ns: nanos(r.rail_backoff_decay_secs).max(1),
        }
    }
}

/// A [`RailPolicy`] every rail of a transport reads, which
/// `Engine::reload` may change while they run: each failure decision reads
/// it whole (four relaxed loads, on the failure path only).
#[derive(Debug)]
pub struct LiveRailPolicy {
    threshold: AtomicU32,
    window_ns: AtomicU64,
    cooldown_ns: AtomicU64,
    decay_ns: AtomicU64,
}

impl LiveRailPolicy {
    /// A cell holding `p`.
    pub fn new(p: RailPolicy) -> LiveRailPolicy {
        LiveRailPolicy {
            threshold: AtomicU32::new(p.threshold),
            window_ns: AtomicU64::new(p.window_ns),
            cooldown_ns: AtomicU64::new(p.cooldown_ns),
            decay_ns: AtomicU64::new(p.decay_ns),
        }
    }

    /// The policy now. A reload racing this read may mix old and new
    /// fields for one decision; each is a valid value.
    pub fn get(&self) -> RailPolicy {
        RailPolicy {
            threshold: self.threshold.load(Ordering::Relaxed),
            window_ns: self.window_ns.load(Ordering::Relaxed),
            cooldown_ns: self.cooldown_ns.load(Ordering::Relaxed),
            decay_ns: self.decay_ns.load(Ordering::Relaxed),
        }
    }

    /// Replace the policy.
    pub fn set(&self, p: RailPolicy) {
        self.threshold.store(p.threshold, Ordering::Relaxed);
        self.window_ns.store(p.window_ns, Ordering::Relaxed);
        self.cooldown_ns.store(p.cooldown_ns, Ordering::Relaxed);
        self.decay_ns.store(p.decay_ns, Ordering::Relaxed);
    }
}

impl Default for RailPolicy {
    fn default() -> Self {
        RailPolicy::from_config(&Config::default())
    }
}

/// What a rail is doing, as observability reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RailState {
    /// In service, no failure counted.
    Healthy,
    /// In service, failures counted in the current window.
    Degraded,
    /// Slow against its siblings: avoided while others are available.
    Demoted,
    /// Tripped: no new slices until cooldown expiry or a good completion.
    Paused,
}

impl RailState {
    /// Lower-case name (Prometheus label value).
    pub fn name(self) -> &'static str {
        match self {
            RailState::Healthy => "healthy",
            RailState::Degraded => "degraded",
            RailState::Demoted => "demoted",
            RailState::Paused => "paused",
        }
    }

    /// Numeric gauge value: 0 healthy, 1 degraded, 2 demoted, 3 paused.
    pub fn gauge(self) -> u8 {
        self as u8
    }
}

/// One rail to a peer as the application may watch it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailStat {
    /// The transport it belongs to.
    pub transport: tent_rings::TransportKind,
    /// Local device (NIC or interface).
    pub local: String,
    /// Remote device.
    pub remote: String,
    /// Is its link up?
    pub up: bool,
    /// Bytes it has carried.
    pub bytes: u64,
    /// Slices moved off it to a sibling rail.
    pub moved: u64,
    /// What its `RailMonitor` says of it.
    pub state: RailState,
    /// Slice failures reported on it.
    pub failures: u64,
    /// Times its error threshold paused it.
    pub trips: u64,
    /// Slices on it now.
    pub inflight: u32,
    /// Bytes on it now.
    pub inflight_bytes: u64,
    /// Its bandwidth estimate (the selector's EWMA), bytes per second.
    pub bandwidth: u64,
    /// Its theoretical bandwidth (port speed, or the configured default),
    /// bytes per second.
    pub theoretical: u64,
    /// Its NUMA tier from the first worker's node (0: local or unknown):
    /// that worker's tie-break, and its slices' tier when their memory's
    /// node is unknown (a slice ranks rails from its memory's node).
    pub tier: u8,
}

/// Health of one rail.
#[derive(Debug)]
pub struct RailMonitor {
    policy: Arc<LiveRailPolicy>,
    /// Names for the log lines.
    local: String,
    remote: String,
    /// 0: in service; else the monotonic ns the pause ends. Read by every
    /// post: on its own line.
    paused_until: CachePadded<AtomicU64>,
    /// When the current pause began (valid while `paused_until` != 0): a
    /// good completion un-pauses only if its slice was posted after it.
    tripped_ns: AtomicU64,
    errors: AtomicU32,
    window_start: AtomicU64,
    /// The backoff memory: the cooldown of the last trip.
    cooldown_ns: AtomicU64,
    /// When the rail last came back (the decay clock starts there).
    resumed_ns: AtomicU64,
    trips: AtomicU64,
    failures: AtomicU64,
    /// When its estimate first fell below the siblings' (0: not slow).
    slow_since: AtomicU64,
    demoted: AtomicBool,
    probe_at: AtomicU64,
    /// Bumped when its link comes back: the rail layer's workers then
    /// forget their stale estimates.
    link_epoch: AtomicU32,
}

impl RailMonitor {
    /// A healthy rail between `local` and `remote` (names for the logs).
    pub fn new(policy: RailPolicy, local: impl Into<String>, remote: impl Into<String>) -> Self {
        RailMonitor::with_live(Arc::new(LiveRailPolicy::new(policy)), local, remote)
    }

    /// A healthy rail that applies `policy` as it is at each failure.
    pub fn with_live(
        policy: Arc<LiveRailPolicy>,
        local: impl Into<String>,
        remote: impl Into<String>,
    ) -> Self {
        RailMonitor {
            policy,
            local: local.into(),
            remote: remote.into(),
            paused_until: CachePadded::new(AtomicU64::new(0)),
            tripped_ns: AtomicU64::new(0),
            errors: AtomicU32::new(0),
            window_start: AtomicU64::new(0),
            cooldown_ns: AtomicU64::new(0),
            resumed_ns: AtomicU64::new(0),
            trips: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            slow_since: AtomicU64::new(0),
            demoted: AtomicBool::new(false),
            probe_at: AtomicU64::new(0),
            link_epoch: AtomicU32::new(0),
        }
    }

    /// How many times its link has come back (see
    /// [`link_restored`](Self::link_restored)).
    #[inline]
    pub(crate) fn link_epoch(&self) -> u32 {
        self.link_epoch.load(Ordering::Relaxed)
    }

    /// May a slice be posted on this rail now? The clock is read only
    /// while the rail is paused.
    #[inline]
    pub fn available(&self) -> bool {
        // Relaxed: a gate, not a publication; a post that races a trip
        // fails on the rail and is counted like any other.
        if self.paused_until.load(Ordering::Relaxed) == 0 {
            return true;
        }
        self.available_at(monotonic_ns())
    }

    /// [`available`](Self::available) at time `now`.
    pub(crate) fn available_at(&self, now: u64) -> bool {
        let until = self.paused_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if now < until {
            return false;
        }
        if self
            .paused_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.resumed(now, "cooldown expired");
        }
        true
    }

    /// Is it in service and not demoted, or demoted with a probe due? New
    /// slices prefer such rails; see [`available`](Self::available) for
    /// the fallback when none is preferred.
    #[inline]
    pub(crate) fn preferred(&self) -> bool {
        if !self.available() {
            return false;
        }
        // Relaxed: a scheduling hint.
        if !self.demoted.load(Ordering::Relaxed) {
            return true;
        }
        let now = monotonic_ns();
        let at = self.probe_at.load(Ordering::Relaxed);
        now >= at
            && self
                .probe_at
                .compare_exchange(
                    at,
                    now + PROBE_EVERY_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// A slice failed on this rail (a rail-level, transient fault).
    pub(crate) fn mark_failed(&self) {
        self.mark_failed_at(monotonic_ns());
    }

    /// [`mark_failed`](Self::mark_failed) at time `now`.
    pub(crate) fn mark_failed_at(&self, now: u64) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let policy = self.policy.get();
        let start = self.window_start.load(Ordering::Relaxed);
        let count = if start == 0 || now.saturating_sub(start) > policy.window_ns {
            // A failure older than the window restarts the count at 1.
            self.window_start.store(now, Ordering::Relaxed);
            self.errors.store(1, Ordering::Relaxed);
            1
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed) + 1
        };
        if count < policy.threshold || self.paused_until.load(Ordering::Relaxed) != 0 {
            return;
        }
        let cooldown = self.next_cooldown(now, &policy);
        let until = now.saturating_add(cooldown).max(1);
        // Stamped before the pause is published (Release in the CAS below,
        // Acquire in `unpause_posted`): a reporter that sees the pause sees
        // its trip time. Two racing trippers store near-equal times.
        self.tripped_ns.store(now, Ordering::Relaxed);
        if self
            .paused_until
            .compare_exchange(0, until, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.cooldown_ns.store(cooldown, Ordering::Relaxed);
            self.trips.fetch_add(1, Ordering::Relaxed);
            // A rail that flaps (a good completion un-pauses it, the next
            // failures trip it again) could trip many times a second:
            // once per rail, then a summary at most once a second.
            crate::lograte::warn_limited!(
                (&self.local, &self.remote),
                "Rail paused: local_nic={} remote_nic={} ({} failures within {} s, cooldown {} ms)",
                self.local,
                self.remote,
                count,
                policy.window_ns / 1_000_000_000,
                cooldown / 1_000_000
            );
        }
    }

    /// The cooldown of a trip at `now`: the remembered one, halved per
    /// `decay` of healthy time since the rail came back, then doubled; the
    /// base cooldown if the memory has decayed below it.
    fn next_cooldown(&self, now: u64, policy: &RailPolicy) -> u64 {
        let base = policy.cooldown_ns;
        let last = self.cooldown_ns.load(Ordering::Relaxed);
        if last == 0 {
            return base;
        }
        let healthy = now.saturating_sub(self.resumed_ns.load(Ordering::Relaxed));
        let halvings = (healthy / policy.decay_ns.max(1)).min(63) as u32;
        let remembered = last >> halvings;
        if remembered < base {
            base
        } else {
            remembered.saturating_mul(2).min(MAX_COOLDOWN_NS)
        }
    }

    /// A slice posted at `posted_ns` (monotonic) completed well on this
    /// rail at `now`.
    #[inline]
    pub fn mark_recovered(&self, posted_ns: u64, now: u64) {
        // Relaxed: the fast path of a rail in service; a missed concurrent
        // trip is seen at the next completion.
        if self.paused_until.load(Ordering::Relaxed) != 0 {
            self.completed_at(posted_ns, now);
        }
    }

    /// A good completion, reported at `now`, of a slice posted at
    /// `posted_ns`: un-pauses the rail if the slice was posted after the
    /// trip. Failures counted in the window stay counted either way.
    pub(crate) fn completed_at(&self, posted_ns: u64, now: u64) {
        // Acquire: pairs with the trip's CAS, so `tripped_ns` is this
        // pause's.
        let until = self.paused_until.load(Ordering::Acquire);
        if until == 0 || posted_ns <= self.tripped_ns.load(Ordering::Relaxed) {
            return;
        }
        // A CAS on the pause we judged: a newer trip in between stays.
        if self
            .paused_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.resumed(now, "un-paused by successful transfer");
        }
    }

    /// The link under the rail came back: whatever tripped it was the
    /// link, so it is in service again (the backoff memory stays).
    pub(crate) fn link_restored(&self) {
        // What it measured before the link went is stale: measure afresh
        // (workers see the epoch move and reset their estimates).
        self.link_epoch.fetch_add(1, Ordering::Relaxed);
        self.slow_since.store(0, Ordering::Relaxed);
        // Count no failures any more and, if paused, come back. Exactly
        // one caller sees the pause end.
        self.clear_errors();
        if self.paused_until.load(Ordering::Relaxed) != 0
            && self.paused_until.swap(0, Ordering::AcqRel) != 0
        {
            self.resumed(monotonic_ns(), "link restored");
        }
    }

    fn clear_errors(&self) {
        self.errors.store(0, Ordering::Relaxed);
        self.window_start.store(0, Ordering::Relaxed);
    }

    /// The pause ended at `now` (the decay clock starts here).
    fn resumed(&self, now: u64, why: &str) {
        self.clear_errors();
        self.resumed_ns.store(now, Ordering::Relaxed);
        // As many as the trips (see `Rail paused`): limited the same way.
        let (local, remote) = (&self.local, &self.remote);
        crate::lograte::info_limited!(
            (local, remote, why),
            "Rail recovered: local_nic={local} remote_nic={remote} ({why})"
        );
    }

    /// Times it tripped into a pause.
    pub(crate) fn trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    /// Failures reported on it.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The cooldown of its last trip (the backoff memory), in ns.
    #[cfg(test)]
    pub(crate) fn last_cooldown_ns(&self) -> u64 {
        self.cooldown_ns.load(Ordering::Relaxed)
    }

    /// Is it demoted for being slow?
    #[cfg(test)]
    pub(crate) fn is_demoted(&self) -> bool {
        self.demoted.load(Ordering::Relaxed)
    }

    /// What it is doing now (at `now`, for a paused rail's expiry).
    pub(crate) fn state_at(&self, now: u64) -> RailState {
        let until = self.paused_until.load(Ordering::Relaxed);
        if until != 0 && now < until {
            RailState::Paused
        } else if self.demoted.load(Ordering::Relaxed) {
            RailState::Demoted
        } else if self.errors.load(Ordering::Relaxed) > 0
            && now.saturating_sub(self.window_start.load(Ordering::Relaxed))
                <= self.policy.get().window_ns
        {
            RailState::Degraded
        } else {
            RailState::Healthy
        }
    }

}

/// How often a set of sibling rails is reviewed for bandwidth, claimed by
/// whichever worker completes a slice first once it is due.
#[derive(Debug, Default)]
pub struct ReviewClock(AtomicU64);

impl ReviewClock {
    /// Every 100 ms at most.
    pub(crate) const PERIOD_NS: u64 = 100_000_000;

    /// Is a review due at `now`? True for exactly one caller per period.
    #[inline]
    pub(crate) fn due(&self, now: u64) -> bool {
        let at = self.0.load(Ordering::Relaxed);
        now >= at
            && self
                .0
                .compare_exchange(
                    at,
                    now + Self::PERIOD_NS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

/// Demote the rails among `count` sibling rails (`rail(i)` is the i-th,
/// `estimate(i)` its bandwidth estimate, 0 for none) whose estimate has
/// stayed below [`SLOW_RATIO`] × the median of
/// their siblings' for [`SLOW_FOR_NS`], and restore those that caught up.
/// Allocation-free (at most 64 rails are compared; more are left alone).
/// Transports call it from their completion path, a few times a second.
///
/// Only rails `in_service` (link up) are judged or compared: a rail whose
/// sibling is down carries everything, so its per-slice estimate drops for
/// reasons that are not its own.
pub fn review_bandwidth<'a>(
    count: usize,
    rail: impl Fn(usize) -> &'a RailMonitor,
    estimate: impl Fn(usize) -> u64,
    in_service: impl Fn(usize) -> bool,
    now: u64,
) {
    const MAX: usize = 64;
    if !(2..=MAX).contains(&count) {
        return;
    }
    let mut est = [0u64; MAX];
    for (i, e) in est.iter_mut().enumerate().take(count) {
        let r = rail(i);
        *e = if in_service(i) && r.paused_until.load(Ordering::Relaxed) == 0 {
            estimate(i)
        } else {
            0
        };
    }
    for i in 0..count {
        let r = rail(i);
        let mut sib = [0u64; MAX];
        let mut n = 0;
        for (j, &e) in est[..count].iter().enumerate() {
            if j != i && e > 0 {
                sib[n] = e;
                n += 1;
            }
        }
        if n == 0 || est[i] == 0 {
            continue;
        }
        let sib = &mut sib[..n];
        sib.sort_unstable();
        let median = if n % 2 == 1 {
            sib[n / 2] as f64
        } else {
            (sib[n / 2 - 1] as f64 + sib[n / 2] as f64) / 2.0
        };
        let slow = (est[i] as f64) < SLOW_RATIO * median;
        if slow {
            let since = r.slow_since.load(Ordering::Relaxed);
            if since == 0 {
                r.slow_since.store(now.max(1), Ordering::Relaxed);
            } else if now.saturating_sub(since) >= SLOW_FOR_NS
                && !r.demoted.swap(true, Ordering::Relaxed)
            {
                r.probe_at.store(now + PROBE_EVERY_NS, Ordering::Relaxed);
                tracing::warn!(
                    "Rail demoted: local_nic={} remote_nic={} ({} MB/s < {SLOW_RATIO} x sibling median {} MB/s for 1 s)",
                    r.local,
                    r.remote,
                    est[i] / 1_000_000,
                    (median / 1e6) as u64
                );
            }
        } else {
            r.slow_since.store(0, Ordering::Relaxed);
            if r.demoted.swap(false, Ordering::Relaxed) {
                tracing::info!(
                    "Rail restored: local_nic={} remote_nic={} (bandwidth back within {SLOW_RATIO} x sibling median)",
                    r.local,
                    r.remote
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_reloaded_policy_applies_at_the_rails_next_failure() {
        let live = Arc::new(LiveRailPolicy::new(policy()));
        let m = RailMonitor::with_live(live.clone(), "a", "b");
        assert_eq!(policy().threshold, 3);
        m.mark_failed_at(1);
        // Reloaded from 3 to 2: the second failure now pauses the rail.
        live.set(RailPolicy {
            threshold: 2,
            ..policy()
        });
        assert_eq!(live.get().threshold, 2);
        m.mark_failed_at(2);
        assert_eq!(m.state_at(3), RailState::Paused);
        // With the policy it started with, two failures do not.
        let old = RailMonitor::new(policy(), "a", "b");
        old.mark_failed_at(1);
        old.mark_failed_at(2);
        assert_ne!(old.state_at(3), RailState::Paused);
    }

    fn policy() -> RailPolicy {
        RailPolicy {
            threshold: 3,
            window_ns: 10 * S,
            cooldown_ns: 30 * S,
            decay_ns: 60 * S,
        }
    }

    fn rail() -> RailMonitor {
        RailMonitor::new(policy(), "mlx5_0", "mlx5_1")
    }

    #[test]
    fn healthy_rail_is_available_and_healthy() {
        let r = rail();
        assert!(r.available_at(1));
        assert!(r.available());
        assert_eq!(r.state_at(1), RailState::Healthy);
    }

    #[test]
    fn threshold_failures_inside_window_pause() {
        let r = rail();
        r.mark_failed_at(100);
        r.mark_failed_at(200);
        assert!(r.available_at(300), "two failures are under the threshold");
        assert_eq!(r.state_at(300), RailState::Degraded);
        r.mark_failed_at(300);
        assert!(!r.available_at(400));
        assert_eq!(r.state_at(400), RailState::Paused);
        assert_eq!(r.trips(), 1);
        assert_eq!(r.last_cooldown_ns(), 30 * S);
    }

    #[test]
    fn failures_outside_window_restart_the_count() {
        let r = rail();
        r.mark_failed_at(S);
        r.mark_failed_at(2 * S);
        // 12 s after the first: the window restarts at 1.
        r.mark_failed_at(13 * S);
        r.mark_failed_at(14 * S);
        assert!(r.available_at(14 * S));
        r.mark_failed_at(15 * S);
        assert!(!r.available_at(15 * S));
    }

    #[test]
    fn cooldown_expiry_restores() {
        let r = rail();
        for t in 1..=3 {
            r.mark_failed_at(t);
        }
        assert!(!r.available_at(30 * S));
        assert!(r.available_at(30 * S + 3));
        assert_eq!(r.state_at(30 * S + 4), RailState::Healthy);
    }

    #[test]
    fn good_completion_unpauses_early() {
        let r = rail();
        for t in 1..=3 {
            r.mark_failed_at(t);
        }
        assert!(!r.available_at(10));
        r.completed_at(20, 20);
        assert!(r.available_at(21));
        assert_eq!(r.state_at(21), RailState::Healthy);
    }

    #[test]
    fn repeat_trips_double_up_to_the_cap() {
        let r = rail();
        let mut now = S;
        let mut seen = Vec::new();
        for _ in 0..6 {
            for _ in 0..3 {
                r.mark_failed_at(now);
            }
            seen.push(r.last_cooldown_ns() / S);
            // Recovered at once: no healthy time to decay the memory.
            r.completed_at(now + 1, now + 1);
            now += 2;
        }
        assert_eq!(seen, [30, 60, 120, 240, 300, 300]);
    }

    #[test]
    fn cooldown_decays_with_healthy_time_instead_of_resetting() {
        let r = rail();
        let trip = |r: &RailMonitor, t: u64| {
            for _ in 0..3 {
                r.mark_failed_at(t);
            }
        };
        trip(&r, S);
        r.completed_at(2 * S, 2 * S);
        trip(&r, 3 * S);
        r.completed_at(4 * S, 4 * S);
        trip(&r, 5 * S);
        assert_eq!(r.last_cooldown_ns(), 120 * S);
        r.completed_at(6 * S, 6 * S);
        // One decay period healthy: 120 -> 60 remembered, doubled to 120.
        trip(&r, 6 * S + 60 * S);
        assert_eq!(r.last_cooldown_ns(), 120 * S);
        r.completed_at(70 * S, 70 * S);
        // Two periods: 120 -> 30, doubled: 60.
        trip(&r, 70 * S + 120 * S);
        assert_eq!(r.last_cooldown_ns(), 60 * S);
        r.completed_at(200 * S, 200 * S);
        // Long healthy: decayed below the base, so the base again.
        trip(&r, 200 * S + 600 * S);
        assert_eq!(r.last_cooldown_ns(), 30 * S);
    }

    #[test]
    fn flapping_rail_pays_a_growing_cooldown_where_reset_would_not() {
        // A rail that trips, comes back by expiry, and trips again right
        // away: each cycle's cooldown grows.
        let r = rail();
        let mut now = S;
        let mut cooldowns = Vec::new();
        for _ in 0..4 {
            for _ in 0..3 {
                r.mark_failed_at(now);
            }
            let c = r.last_cooldown_ns();
            cooldowns.push(c / S);
            now += c + 1;
            assert!(r.available_at(now), "expired");
        }
        assert_eq!(cooldowns, [30, 60, 120, 240]);
    }

    #[test]
    fn failures_while_paused_do_not_extend() {
        let r = rail();
        for t in 1..=3 {
            r.mark_failed_at(t);
        }
        for t in 4..10 {
            r.mark_failed_at(t);
        }
        assert_eq!(r.trips(), 1);
        assert!(r.available_at(30 * S + 3));
    }

    #[test]
    fn link_restored_unpauses_keeping_memory() {
        let r = rail();
        for t in 1..=3 {
            r.mark_failed_at(t);
        }
        r.link_restored();
        assert!(r.available());
        assert_eq!(r.last_cooldown_ns(), 30 * S);
    }

    #[test]
    fn concurrent_failures_trip_exactly_once() {
        let r = std::sync::Arc::new(RailMonitor::new(
            RailPolicy {
                threshold: 100,
                ..policy()
            },
            "a",
            "b",
        ));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        r.mark_failed_at(5 * S);
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(r.trips(), 1);
        assert_eq!(r.failures(), 4000);
        assert!(!r.available_at(6 * S));
    }

    #[test]
    fn slow_rail_is_demoted_after_a_second_and_restored_when_it_catches_up() {
        let a = RailMonitor::new(policy(), "eth0", "eth0");
        let b = RailMonitor::new(policy(), "eth1", "eth1");
        let c = RailMonitor::new(policy(), "eth2", "eth2");
        let rails = [&a, &b, &c];
        // 0.4x the median.
        let bw = std::cell::Cell::new([1000u64, 1000, 400]);
        let review = |now| review_bandwidth(3, |i| rails[i], |i| bw.get()[i], |_| true, now);
        review(S);
        assert!(!c.is_demoted(), "slow for less than 1 s");
        review(S + S / 2);
        assert!(!c.is_demoted());
        review(2 * S);
        assert!(c.is_demoted());
        assert!(!a.is_demoted() && !b.is_demoted());
        assert_eq!(c.state_at(2 * S), RailState::Demoted);
        // Still available (a fallback), just not preferred.
        assert!(c.available_at(2 * S));
        bw.set([1000, 1000, 1000]);
        review(3 * S);
        assert!(!c.is_demoted());
    }

    #[test]
    fn a_rail_that_recovers_before_a_second_is_not_demoted() {
        let a = RailMonitor::new(policy(), "eth0", "eth0");
        let b = RailMonitor::new(policy(), "eth1", "eth1");
        let bw = std::cell::Cell::new([1000u64, 100]);
        let review = |now| review_bandwidth(2, |i| [&a, &b][i], |i| bw.get()[i], |_| true, now);
        review(S);
        bw.set([1000, 1000]);
        review(S + S / 2);
        bw.set([1000, 100]);
        review(2 * S + S / 4);
        assert!(!b.is_demoted(), "the slow spell restarted at 1.5 s");
        review(3 * S + S / 2);
        assert!(b.is_demoted());
    }

    #[test]
    fn rails_out_of_service_are_neither_judged_nor_compared() {
        let a = RailMonitor::new(policy(), "a", "a");
        let b = RailMonitor::new(policy(), "b", "b");
        // a carries everything: slow per slice; b's is stale: its link is down.
        let bw = [100u64, 1000];
        let up = |i: usize| i == 0;
        review_bandwidth(2, |i| [&a, &b][i], |i| bw[i], up, S);
        review_bandwidth(2, |i| [&a, &b][i], |i| bw[i], up, 3 * S);
        assert!(!a.is_demoted() && !b.is_demoted());
        let epoch = b.link_epoch();
        b.link_restored();
        assert_eq!(b.link_epoch(), epoch + 1, "its workers measure afresh");
    }

    #[test]
    fn failures_interleaved_with_successes_trip_inside_the_window() {
        // 40% of slices fail (F at 2 of every 5), successes between them:
        // the third failure inside the 10 s window trips the rail.
        let r = rail();
        let pattern = [true, false, true, false, false];
        let mut failed = 0;
        let mut t = S;
        'outer: for _ in 0..4 {
            for &fail in &pattern {
                t += S / 10;
                if fail {
                    r.mark_failed_at(t);
                    failed += 1;
                    if failed == 3 {
                        break 'outer;
                    }
                } else {
                    r.completed_at(t - S / 20, t);
                }
            }
        }
        assert_eq!(r.trips(), 1, "3 failures in {} ms", (t - S) / 1_000_000);
        assert!(!r.available_at(t + 1));
        assert_eq!(r.state_at(t + 1), RailState::Paused);
    }

    #[test]
    fn successes_do_not_restart_the_window() {
        let r = rail();
        r.mark_failed_at(S);
        r.completed_at(S, 2 * S);
        r.mark_failed_at(3 * S);
        r.completed_at(3 * S, 4 * S);
        assert_eq!(r.state_at(4 * S), RailState::Degraded);
        r.mark_failed_at(5 * S);
        assert!(!r.available_at(5 * S + 1), "3 failures within 10 s");
    }

    #[test]
    fn degraded_ends_with_the_window() {
        let r = rail();
        r.mark_failed_at(S);
        r.completed_at(S, 2 * S);
        assert_eq!(r.state_at(2 * S), RailState::Degraded);
        assert_eq!(r.state_at(12 * S), RailState::Healthy);
    }

    #[test]
    fn completion_posted_before_the_trip_does_not_resume() {
        let r = rail();
        for t in [10, 20, 30] {
            r.mark_failed_at(t);
        }
        assert!(!r.available_at(31));
        // A slice posted at 25 (before the trip at 30) completes well at 40.
        r.completed_at(25, 40);
        assert!(!r.available_at(41), "posted before the trip");
        assert_eq!(r.state_at(41), RailState::Paused);
        // One posted after the trip (a probe) brings the rail back.
        r.completed_at(35, 50);
        assert!(r.available_at(51));
        assert_eq!(r.state_at(51), RailState::Healthy);
    }

    #[test]
    fn at_half_the_median_is_not_slow() {
        let a = RailMonitor::new(policy(), "a", "a");
        let b = RailMonitor::new(policy(), "b", "b");
        let bw = [1000u64, 500];
        review_bandwidth(2, |i| [&a, &b][i], |i| bw[i], |_| true, S);
        review_bandwidth(2, |i| [&a, &b][i], |i| bw[i], |_| true, 5 * S);
        assert!(!b.is_demoted());
    }
}
