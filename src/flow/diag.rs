//! `SqCqeDiagnostics`: what one endpoint's send and completion queues have
//! been doing, so an operator can tell from one line why work stopped
//! going out (seed 004's SQ-full hint).
//!
//! The three causes the seed separates, and the counters that tell them
//! apart:
//!
//! - **a CQ-poll stall**: nobody reaps. `last_poll` is old.
//! - **a slow drain**: polls come, completions do not (or each frees
//!   little). `last_poll` is recent, `last_cqe` is old, or
//!   `recent_release_wr` is small.
//! - **a submission burst**: the queue drains fine but more arrives than
//!   it holds. CQEs are recent, and the backlog and its high watermark
//!   are large.
//!
//! One per endpoint, shared (an `Arc`) with the endpoint's successive
//! `SqController`s (their admission counters land here, so they outlive
//! a replaced QP) and with the metrics reader. The owning worker is the
//! only writer of everything but the admission counters: it writes with
//! plain loads and stores (`bump`), never a locked read-modify-write,
//! and once per reaped batch rather than per request where it can.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// An endpoint's queue diagnostics (see the module docs).
#[derive(Debug, Default)]
pub struct SqCqeDiagnostics {
    /// The last `poll_cq` on its CQ (monotonic ns; 0: never).
    pub(crate) last_poll_ns: AtomicU64,
    /// The last `poll_cq` that returned completions (0: never).
    pub(crate) last_cqe_ns: AtomicU64,
    /// Completions that poll returned.
    pub(crate) recent_cqes: AtomicU32,
    /// Requests those completions released (more than the CQEs when
    /// requests go unsignalled).
    pub(crate) recent_release_wr: AtomicU32,
    /// Completions reaped so far.
    pub(crate) cqes: AtomicU64,
    /// Requests posted and not known complete (the ledger's records).
    pub(crate) ledger_records: AtomicU32,
    /// Slices waiting in the endpoint's backlog to be posted.
    pub(crate) backlog: AtomicU32,
    /// The most ever waiting at once.
    pub(crate) backlog_high: AtomicU32,
    /// Slices refused because the backlog was full (back-pressure the
    /// worker answered by holding the task).
    pub(crate) full_refusals: AtomicU64,
    /// Times the endpoint went `sq_backoff_timeout_us` with requests
    /// posted and no completion.
    pub(crate) stalls: AtomicU64,
    /// Admission waits that had to sleep (written by submitting threads,
    /// as are the next two).
    pub(crate) admission_waits: AtomicU64,
    /// Microseconds they slept.
    pub(crate) admission_wait_us: AtomicU64,
    /// Admission waits that timed out.
    pub(crate) admission_timeouts: AtomicU64,
    /// Most requests ever admitted and not yet posted at once.
    pub(crate) queued_high: AtomicU32,
    /// Admissions the `least_loaded` policy charged here.
    pub(crate) least_loaded: AtomicU64,
}

/// Add one to a counter only the owning worker writes: a plain load and
/// store (readers see either value, both true at some instant), no locked
/// instruction on the worker's path.
#[inline]
pub(crate) fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

impl SqCqeDiagnostics {
    /// A poll of the endpoint's CQ at `now_ns` returned `cqes`
    /// completions that released `released` requests (`cqes` may be 0).
    #[inline]
    pub(crate) fn polled(&self, now_ns: u64, cqes: u32, released: u32) {
        self.last_poll_ns.store(now_ns, Ordering::Relaxed);
        if cqes > 0 {
            self.last_cqe_ns.store(now_ns, Ordering::Relaxed);
            self.recent_cqes.store(cqes, Ordering::Relaxed);
            self.recent_release_wr.store(released, Ordering::Relaxed);
            let total = self.cqes.load(Ordering::Relaxed);
            self.cqes
                .store(total.wrapping_add(u64::from(cqes)), Ordering::Relaxed);
        }
    }

    /// The queue now holds `records` posted requests and `backlog` waiting
    /// slices.
    #[inline]
    pub(crate) fn occupancy(&self, records: usize, backlog: usize) {
        let b = u32::try_from(backlog).unwrap_or(u32::MAX);
        self.ledger_records.store(
            u32::try_from(records).unwrap_or(u32::MAX),
            Ordering::Relaxed,
        );
        self.backlog.store(b, Ordering::Relaxed);
        if b > self.backlog_high.load(Ordering::Relaxed) {
            self.backlog_high.store(b, Ordering::Relaxed);
        }
    }

    /// Everything at once, with ages taken against `now_ns`; `posted` and
    /// `depth` are the current QP's send-queue credits.
    pub fn report(&self, now_ns: u64, posted: u32, depth: u32) -> SqReport {
        let age = |t: u64| (t != 0).then(|| now_ns.saturating_sub(t) / 1000);
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SqReport {
            posted,
            depth,
            backlog: self.backlog.load(Ordering::Relaxed),
            backlog_high: self.backlog_high.load(Ordering::Relaxed),
            ledger_records: self.ledger_records.load(Ordering::Relaxed),
            last_poll_us_ago: age(l(&self.last_poll_ns)),
            last_cqe_us_ago: age(l(&self.last_cqe_ns)),
            recent_cqes: self.recent_cqes.load(Ordering::Relaxed),
            recent_release_wr: self.recent_release_wr.load(Ordering::Relaxed),
            cqes: l(&self.cqes),
            full_refusals: l(&self.full_refusals),
            stalls: l(&self.stalls),
            admission_waits: l(&self.admission_waits),
            admission_wait_us: l(&self.admission_wait_us),
            admission_timeouts: l(&self.admission_timeouts),
            queued_high: self.queued_high.load(Ordering::Relaxed),
            least_loaded: l(&self.least_loaded),
        }
    }
}

/// An endpoint's send-queue diagnostics read at one instant. `Display` writes the one-line
/// hint an `SqFull` log line carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SqReport {
    /// Requests posted on the current QP.
    pub posted: u32,
    /// Its send-queue depth.
    pub depth: u32,
    /// Slices waiting to be posted.
    pub backlog: u32,
    /// The most ever waiting at once.
    pub backlog_high: u32,
    /// Ledger records (posted, end not known).
    pub ledger_records: u32,
    /// Microseconds since the last poll (`None`: never).
    pub last_poll_us_ago: Option<u64>,
    /// Microseconds since the last poll that returned completions.
    pub last_cqe_us_ago: Option<u64>,
    /// Completions the last non-empty poll returned.
    pub recent_cqes: u32,
    /// The requests they released.
    pub recent_release_wr: u32,
    /// Completions so far.
    pub cqes: u64,
    /// Slices refused for a full backlog.
    pub full_refusals: u64,
    /// Stalls (`sq_backoff_timeout_us` passed with no completion).
    pub stalls: u64,
    /// Admission waits that slept.
    pub admission_waits: u64,
    /// Microseconds they slept.
    pub admission_wait_us: u64,
    /// Admission waits that timed out.
    pub admission_timeouts: u64,
    /// Most requests admitted and not posted at once.
    pub queued_high: u32,
    /// Admissions the `least_loaded` policy charged here.
    pub least_loaded: u64,
}

/// One QP slot of one rail: its [`SqReport`] (every worker's endpoint
/// there together), labelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqRow {
    /// The peer segment's name.
    pub segment: String,
    /// The local NIC.
    pub local: String,
    /// The remote NIC.
    pub remote: String,
    /// Which of the rail's `qp_per_transfer` QPs.
    pub qp: usize,
    /// The counters.
    pub report: SqReport,
}

impl SqReport {
    /// Add `other` (another worker's endpoint on the same rail): counts
    /// and occupancies sum, ages keep the most recent.
    pub fn merge(&mut self, o: &SqReport) {
        let newest = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.posted += o.posted;
        self.depth += o.depth;
        self.backlog += o.backlog;
        self.backlog_high = self.backlog_high.max(o.backlog_high);
        self.ledger_records += o.ledger_records;
        self.last_poll_us_ago = newest(self.last_poll_us_ago, o.last_poll_us_ago);
        self.last_cqe_us_ago = newest(self.last_cqe_us_ago, o.last_cqe_us_ago);
        self.recent_cqes += o.recent_cqes;
        self.recent_release_wr += o.recent_release_wr;
        self.cqes += o.cqes;
        self.full_refusals += o.full_refusals;
        self.stalls += o.stalls;
        self.admission_waits += o.admission_waits;
        self.admission_wait_us += o.admission_wait_us;
        self.admission_timeouts += o.admission_timeouts;
        self.queued_high = self.queued_high.max(o.queued_high);
        self.least_loaded += o.least_loaded;
    }
}

impl fmt::Display for SqReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ago = |v: Option<u64>| v.map_or_else(|| "never".to_owned(), |us| format!("{us}us ago"));
        write!(
            f,
            "posted={}/{} ledger_records={} backlog={} (high {}) last_poll={} last_cqe={} \
             recent_cqes={} recent_release_wr={} cqes={} sq_full_refusals={} stalls={} \
             admission_waits={} admission_wait_us={} admission_timeouts={} queued_wr_high_watermark={} \
             least_loaded_selections={}",
            self.posted,
            self.depth,
            self.ledger_records,
            self.backlog,
            self.backlog_high,
            ago(self.last_poll_us_ago),
            ago(self.last_cqe_us_ago),
            self.recent_cqes,
            self.recent_release_wr,
            self.cqes,
            self.full_refusals,
            self.stalls,
            self.admission_waits,
            self.admission_wait_us,
            self.admission_timeouts,
            self.queued_high,
            self.least_loaded,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_tells_a_poll_stall_from_a_slow_drain() {
        let d = SqCqeDiagnostics::default();
        d.polled(1_000_000, 2, 64);
        d.occupancy(128, 40);
        d.occupancy(128, 10);
        // Polled since, nothing came back: a slow drain.
        d.polled(9_000_000, 0, 0);
        let r = d.report(10_000_000, 128, 256);
        assert_eq!(r.last_poll_us_ago, Some(1000));
        assert_eq!(r.last_cqe_us_ago, Some(9000));
        assert_eq!((r.recent_cqes, r.recent_release_wr, r.cqes), (2, 64, 2));
        assert_eq!((r.backlog, r.backlog_high, r.ledger_records), (10, 40, 128));
        let line = r.to_string();
        assert!(line.contains("last_poll=1000us ago"), "{line}");
        assert!(line.contains("last_cqe=9000us ago"), "{line}");
        assert!(line.contains("posted=128/256"), "{line}");
        // Never polled reads "never", not a huge age.
        let fresh = SqCqeDiagnostics::default().report(5, 0, 256).to_string();
        assert!(fresh.contains("last_poll=never"), "{fresh}");
    }

    #[test]
    fn merging_sums_counts_and_keeps_the_newest_ages() {
        let mut a = SqReport {
            posted: 3,
            depth: 256,
            last_poll_us_ago: Some(50),
            last_cqe_us_ago: None,
            stalls: 1,
            backlog_high: 7,
            ..SqReport::default()
        };
        let b = SqReport {
            posted: 4,
            depth: 256,
            last_poll_us_ago: Some(20),
            last_cqe_us_ago: Some(900),
            stalls: 2,
            backlog_high: 5,
            ..SqReport::default()
        };
        a.merge(&b);
        assert_eq!(
            (a.posted, a.depth, a.stalls, a.backlog_high),
            (7, 512, 3, 7)
        );
        assert_eq!(
            (a.last_poll_us_ago, a.last_cqe_us_ago),
            (Some(20), Some(900))
        );
    }
}
