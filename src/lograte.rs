//! Failure logs that survive failure: the first occurrence of a cause, then
//! a summary with a count at most once per [`INTERVAL_NS`].
//!
//! A peer that dies under load fails every op it had, and every op after it
//! until failover or the application gives up: one WARN per op wrote 5.9 M
//! lines in 15 s. A *cause* is whatever the caller hashes into it, usually
//! (peer, error kind); each log call site owns its own [`LogRate`] (a
//! `static` made by `warn_limited!`), so two sites
//! never share a budget.
//!
//! The table is fixed-size atomics: no lock, no allocation, so a worker may
//! hit it on its hot path. A site that sees more than [`SLOTS`] distinct
//! causes folds the extra ones into shared slots: they are summarised
//! together rather than logged one by one.
//!
//! ```
//! use tent::lograte::{Emit, LogRate, cause};
//!
//! let rate = LogRate::new();
//! let c = cause(&("10.0.0.2:4000", "ProcessFailed"));
//! assert_eq!(rate.hit_at(c, 0), Emit::First);
//! assert_eq!(rate.hit_at(c, 10), Emit::Quiet);
//! assert_eq!(rate.hit_at(c, 20), Emit::Quiet);
//! // One interval later the next occurrence carries the count.
//! assert_eq!(
//!     rate.hit_at(c, 1_000_000_000),
//!     Emit::Summary { suppressed: 3, total: 4 }
//! );
//! ```

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Distinct causes one call site tracks on their own.
pub(crate) const SLOTS: usize = 16;
/// At most one summary per cause per interval (1 s).
pub(crate) const INTERVAL_NS: u64 = 1_000_000_000;

/// What a call site should do with this occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The first occurrence of this cause: log it in full.
    First,
    /// An interval has passed since the last line for this cause: log once,
    /// with how many occurrences were not logged (this one included) and how
    /// many there were in all.
    Summary {
        /// Occurrences since the last line, this one included.
        suppressed: u64,
        /// Occurrences since the cause was first seen.
        total: u64,
    },
    /// Counted, not logged.
    Quiet,
}

#[derive(Debug)]
struct Slot {
    /// The cause's hash (never 0; 0 = free).
    key: AtomicU64,
    /// Occurrences since the last emitted line.
    pending: AtomicU64,
    /// Occurrences in all.
    total: AtomicU64,
    /// Monotonic ns before which no summary is emitted.
    next_ns: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            key: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            total: AtomicU64::new(0),
            next_ns: AtomicU64::new(0),
        }
    }
}

/// One call site's per-cause counters.
#[derive(Debug)]
pub struct LogRate {
    slots: [Slot; SLOTS],
    /// Where the site is (`file:line`) and its level, for the line that
    /// writes out a burst's count once the burst has ended ([`flush_due`]).
    site: &'static str,
    level: Level,
    /// On the list [`flush_due`] walks (listed at its first quiet hit).
    listed: AtomicBool,
}

/// A site's `tracing` level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// `warn!`.
    Warn,
    /// `info!`.
    Info,
    /// `debug!`.
    Debug,
}

/// Sites with counts that may be pending, for [`flush_due`]: statics, so
/// the pointers stay valid; past [`SITES_MAX`] a site is not flushed (its
/// next occurrence still writes the count).
const SITES_MAX: usize = 256;
static SITES: [AtomicPtr<LogRate>; SITES_MAX] = [const { AtomicPtr::new(std::ptr::null_mut()) }; SITES_MAX];
static SITES_LEN: AtomicUsize = AtomicUsize::new(0);
/// When [`flush_due`] next walks the sites (at most once per interval).
static NEXT_FLUSH_NS: AtomicU64 = AtomicU64::new(0);

/// Write out the counts of bursts that ended: a cause whose occurrences
/// were counted quietly and that has not occurred since its interval
/// passed gets one line now, with `suppressed` and `total` (otherwise its
/// count would wait for its next occurrence, which may never come). At
/// most one walk per interval across all threads; one atomic load
/// otherwise. Called from the workers' housekeeping.
pub(crate) fn flush_due(now_ns: u64) {
    let next = NEXT_FLUSH_NS.load(Ordering::Relaxed);
    if now_ns < next
        || NEXT_FLUSH_NS
            .compare_exchange(next, now_ns.saturating_add(INTERVAL_NS), Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let n = SITES_LEN.load(Ordering::Acquire).min(SITES_MAX);
    for site in &SITES[..n] {
        let p = site.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: only `&'static LogRate`s are stored (`LogRate::listed_at`'s receiver is `'static`).
        let rate: &'static LogRate = unsafe { &*p };
        rate.drain_due(now_ns, |suppressed, total| {
            let site = rate.site;
            match rate.level {
                Level::Warn => tracing::warn!(site, suppressed, total, "log lines suppressed at this site since its last line"),
                Level::Info => tracing::info!(site, suppressed, total, "log lines suppressed at this site since its last line"),
                Level::Debug => tracing::debug!(site, suppressed, total, "log lines suppressed at this site since its last line"),
            }
        });
    }
}

impl Default for LogRate {
    fn default() -> Self {
        Self::new()
    }
}

/// The cause key of `parts` (e.g. `&(peer, kind)`): a fixed hash, so the same
/// parts give the same key in every thread.
pub fn cause<T: Hash + ?Sized>(parts: &T) -> u64 {
    // DefaultHasher::new() has fixed keys (no per-process randomness
    // needed here) and allocates nothing.
    let mut h = std::hash::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

impl LogRate {
    /// An empty table (usable in a `static`).
    pub const fn new() -> LogRate {
        LogRate::site("", Level::Warn)
    }

    /// An empty table for the call site `site` (`file:line`) at `level`.
    pub const fn site(site: &'static str, level: Level) -> LogRate {
        LogRate {
            slots: [const { Slot::new() }; SLOTS],
            site,
            level,
            listed: AtomicBool::new(false),
        }
    }

    /// [`LogRate::hit`], and a site with a count pending goes on the list
    /// [`flush_due`] walks (once).
    #[inline]
    pub(crate) fn hit_listed(&'static self, cause: u64) -> Emit {
        let e = self.hit(cause);
        if e == Emit::Quiet && !self.listed.load(Ordering::Relaxed) && !self.listed.swap(true, Ordering::Relaxed) {
            let at = SITES_LEN.fetch_add(1, Ordering::AcqRel);
            if let Some(slot) = SITES.get(at) {
                slot.store(std::ptr::from_ref(self).cast_mut(), Ordering::Release);
            }
        }
        e
    }

    /// Call `emit(suppressed, total)` for each cause with occurrences not
    /// yet written whose interval has passed at `now_ns`, and start its
    /// next interval (as a summary at its next occurrence would).
    pub fn drain_due(&self, now_ns: u64, mut emit: impl FnMut(u64, u64)) {
        for slot in &self.slots {
            if slot.key.load(Ordering::Acquire) == 0 || slot.pending.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let next = slot.next_ns.load(Ordering::Relaxed);
            if now_ns < next
                || slot
                    .next_ns
                    .compare_exchange(next, now_ns.saturating_add(INTERVAL_NS), Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            let suppressed = slot.pending.swap(0, Ordering::Relaxed);
            if suppressed > 0 {
                emit(suppressed, slot.total.load(Ordering::Relaxed));
            }
        }
    }

    /// Count one occurrence of `cause` now.
    #[inline]
    pub(crate) fn hit(&self, cause: u64) -> Emit {
        self.hit_at(cause, crate::clock::monotonic_ns())
    }

    /// Count one occurrence of `cause` at `now_ns` (monotonic).
    pub fn hit_at(&self, cause: u64, now_ns: u64) -> Emit {
        let key = cause | 1;
        let start = (key >> 1) as usize % SLOTS;
        for probe in 0..SLOTS {
            let slot = &self.slots[(start + probe) % SLOTS];
            let k = slot.key.load(Ordering::Acquire);
            if k == key {
                return Self::again(slot, now_ns);
            }
            if k == 0 {
                // Claim it. The deadline is set before the key is visible,
                // so a racing hit on the same cause finds it and stays quiet.
                slot.next_ns
                    .store(now_ns.saturating_add(INTERVAL_NS), Ordering::Relaxed);
                match slot
                    .key
                    .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => {
                        slot.total.fetch_add(1, Ordering::Relaxed);
                        return Emit::First;
                    }
                    Err(k) if k == key => return Self::again(slot, now_ns),
                    Err(_) => continue,
                }
            }
        }
        // Every slot holds another cause: fold this one into its home slot,
        // summarised with whatever lives there (never logged one by one).
        Self::again(&self.slots[start], now_ns)
    }

    fn again(slot: &Slot, now_ns: u64) -> Emit {
        let total = slot.total.fetch_add(1, Ordering::Relaxed) + 1;
        slot.pending.fetch_add(1, Ordering::Relaxed);
        let next = slot.next_ns.load(Ordering::Relaxed);
        if now_ns < next {
            return Emit::Quiet;
        }
        // One thread wins the interval; the others stay quiet.
        if slot
            .next_ns
            .compare_exchange(
                next,
                now_ns.saturating_add(INTERVAL_NS),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return Emit::Quiet;
        }
        match slot.pending.swap(0, Ordering::Relaxed) {
            0 => Emit::Quiet,
            suppressed => Emit::Summary { suppressed, total },
        }
    }
}

/// `tracing::warn!` at most once per second per cause at this call site: the
/// first occurrence in full, then one line per interval carrying
/// `suppressed` (occurrences since the last line) and `total`.
///
/// ```text
/// // Inside the crate (the macros are crate-local):
/// for _ in 0..1000 {
///     crate::lograte::warn_limited!((peer, kind.code()), %peer, %kind, "transfer failed");
/// }
/// // One line was written, not a thousand.
/// ```
macro_rules! warn_limited {
    ($cause:expr, $($arg:tt)+) => {
        $crate::lograte::log_limited!(warn, $cause, $($arg)+)
    };
}

/// [`warn_limited!`] at info level (seed 000's `Transport failover: ...`
/// line is info, and fires once per failed task).
macro_rules! info_limited {
    ($cause:expr, $($arg:tt)+) => {
        $crate::lograte::log_limited!(info, $cause, $($arg)+)
    };
}

/// The body of [`warn_limited!`] and [`info_limited!`]: `$level` names the
/// `tracing` macro.
macro_rules! log_limited {
    ($level:ident, $cause:expr, $($arg:tt)+) => {{
        static RATE: $crate::lograte::LogRate =
            $crate::lograte::LogRate::site(concat!(file!(), ":", line!()), $crate::lograte::level!($level));
        match RATE.hit_listed($crate::lograte::cause(&$cause)) {
            $crate::lograte::Emit::First => ::tracing::$level!($($arg)+),
            $crate::lograte::Emit::Summary { suppressed, total } => {
                ::tracing::$level!(suppressed, total, $($arg)+)
            }
            $crate::lograte::Emit::Quiet => {}
        }
    }};
}

/// The [`Level`] of a `tracing` macro's name.
macro_rules! level {
    (warn) => {
        $crate::lograte::Level::Warn
    };
    (info) => {
        $crate::lograte::Level::Info
    };
    (debug) => {
        $crate::lograte::Level::Debug
    };
}

// Crate-local macros, named through this module where the concept lives.
pub(crate) use {info_limited, level, log_limited, warn_limited};

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = INTERVAL_NS;

    #[test]
    fn first_then_one_summary_per_interval_per_cause() {
        let r = LogRate::new();
        let (a, b) = (cause(&("peer-a", 7u16)), cause(&("peer-b", 7u16)));
        assert_eq!(r.hit_at(a, 0), Emit::First);
        assert_eq!(r.hit_at(b, 0), Emit::First, "causes are separate");
        let mut lines = 0;
        for i in 1..=1_000_000u64 {
            // A million failures over 2.5 s.
            if r.hit_at(a, i * 2_500) != Emit::Quiet {
                lines += 1;
            }
        }
        assert_eq!(lines, 2, "one summary per second, not one per op");
        assert_eq!(
            r.hit_at(a, 10 * S),
            Emit::Summary {
                suppressed: 200_001,
                total: 1_000_002
            }
        );
    }

    /// A burst that ends gets its count written once its interval has
    /// passed, without waiting for an occurrence that may never come; a
    /// cause with nothing pending writes nothing.
    #[test]
    fn a_burst_s_count_is_drained_once_its_interval_passes() {
        let r = LogRate::new();
        let (a, b) = (cause(&"a"), cause(&"b"));
        assert_eq!(r.hit_at(a, 0), Emit::First);
        assert_eq!(r.hit_at(b, 0), Emit::First);
        for t in 1..=99 {
            assert_eq!(r.hit_at(a, t), Emit::Quiet);
        }
        let mut lines = Vec::new();
        r.drain_due(S / 2, |s, t| lines.push((s, t)));
        assert!(lines.is_empty(), "drained before the interval passed");
        r.drain_due(S, |s, t| lines.push((s, t)));
        assert_eq!(lines, [(99, 100)], "one line for the burst of a, none for b");
        r.drain_due(3 * S, |s, t| lines.push((s, t)));
        assert_eq!(lines.len(), 1, "nothing pending, nothing written");
        // The next occurrence counts from the drain, not from the burst.
        assert_eq!(r.hit_at(a, 3 * S + 1), Emit::Summary { suppressed: 1, total: 101 });
    }

    #[test]
    fn more_causes_than_slots_are_folded_not_logged_each() {
        let r = LogRate::new();
        let mut first = 0;
        for c in 0..(SLOTS as u64 * 4) {
            if r.hit_at(cause(&c), 0) == Emit::First {
                first += 1;
            }
        }
        assert_eq!(first, SLOTS, "the overflow is counted, not logged");
    }

    #[test]
    fn concurrent_hits_give_one_first_and_one_summary() {
        let r = std::sync::Arc::new(LogRate::new());
        let c = cause(&"x");
        let emitted: u64 = (0..4)
            .map(|_| {
                let r = r.clone();
                std::thread::spawn(move || {
                    (0..10_000)
                        .filter(|_| r.hit_at(c, 0) != Emit::Quiet)
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(emitted, 1);
        assert_eq!(
            r.hit_at(c, S),
            Emit::Summary {
                suppressed: 40_000,
                total: 40_001
            }
        );
    }
}
