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
use std::sync::atomic::{AtomicU64, Ordering};

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
        LogRate {
            slots: [const { Slot::new() }; SLOTS],
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
        static RATE: $crate::lograte::LogRate = $crate::lograte::LogRate::new();
        match RATE.hit($crate::lograte::cause(&$cause)) {
            $crate::lograte::Emit::First => ::tracing::$level!($($arg)+),
            $crate::lograte::Emit::Summary { suppressed, total } => {
                ::tracing::$level!(suppressed, total, $($arg)+)
            }
            $crate::lograte::Emit::Quiet => {}
        }
    }};
}

// Crate-local macros, named through this module where the concept lives.
pub(crate) use {info_limited, log_limited, warn_limited};

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
