//! Credit-based flow control: a lock-free cap on requests in flight.
//!
//! The whole state lives in one `AtomicU64`, so every transition is a single
//! compare-and-swap and no reader can see a torn combination:
//!
//! | bits    | field                                                   |
//! |---------|---------------------------------------------------------|
//! | 0..=31  | credits in flight                                       |
//! | 32      | paused (hysteresis, see [`CreditPool::new`])            |
//! | 33..=62 | epoch (30 bits, wrapping): bumped on every health change |
//! | 63      | degraded                                                |

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

const IN_FLIGHT_MASK: u64 = u32::MAX as u64;
const PAUSED: u64 = 1 << 32;
const EPOCH_SHIFT: u32 = 33;
const EPOCH_MASK: u64 = (1 << 30) - 1;
const DEGRADED: u64 = 1 << 63;

/// A decoded state word.
#[derive(Clone, Copy)]
struct Word(u64);

impl Word {
    fn in_flight(self) -> u32 {
        (self.0 & IN_FLIGHT_MASK) as u32
    }
    fn paused(self) -> bool {
        self.0 & PAUSED != 0
    }
    fn epoch(self) -> u32 {
        ((self.0 >> EPOCH_SHIFT) & EPOCH_MASK) as u32
    }
    fn degraded(self) -> bool {
        self.0 & DEGRADED != 0
    }
    fn with_in_flight(self, n: u32) -> Word {
        Word((self.0 & !IN_FLIGHT_MASK) | u64::from(n))
    }
    fn with_paused(self, yes: bool) -> Word {
        Word(if yes {
            self.0 | PAUSED
        } else {
            self.0 & !PAUSED
        })
    }
    /// Flip `degraded` to `yes` and start a new epoch.
    fn with_health(self, degraded: bool) -> Word {
        let epoch = (u64::from(self.epoch()) + 1) & EPOCH_MASK;
        let rest = self.0 & (IN_FLIGHT_MASK | PAUSED);
        Word(rest | (epoch << EPOCH_SHIFT) | if degraded { DEGRADED } else { 0 })
    }
}

/// A point-in-time view of a pool, for errors and diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditSnapshot {
    /// Total credits.
    pub capacity: u32,
    /// Credits reserved and not yet released.
    pub in_flight: u32,
    /// Threads registered as waiting (diagnostic).
    pub waiters: u32,
    /// `now_ns` of the most recent release.
    pub last_release_ns: u64,
    /// Whether the pool refuses all reservations.
    pub degraded: bool,
    /// Whether the pool is paused by hysteresis.
    pub paused: bool,
    /// Current health epoch.
    pub epoch: u32,
}

/// Why [`CreditPool::try_reserve`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveError {
    /// Not enough free credits (or paused until enough are released).
    Full(CreditSnapshot),
    /// The pool is degraded; no reservations until it is cleared.
    Degraded {
        /// The epoch that marked it degraded.
        epoch: u32,
    },
    /// More credits than the pool has in total; can never succeed.
    TooLarge {
        /// Credits asked for.
        requested: u32,
        /// Pool capacity.
        capacity: u32,
    },
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReserveError::Full(s) => write!(
                f,
                "credit pool full: {} of {} in flight{}",
                s.in_flight,
                s.capacity,
                if s.paused { " (paused)" } else { "" }
            ),
            ReserveError::Degraded { epoch } => {
                write!(f, "credit pool degraded (epoch {epoch})")
            }
            ReserveError::TooLarge {
                requested,
                capacity,
            } => write!(f, "requested {requested} credits from a pool of {capacity}"),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Outcome of [`CreditPool::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// Credits still in flight after this release.
    pub in_flight: u32,
    /// This release cleared `paused` (free credits reached the resume
    /// watermark): wake the waiters.
    pub resumed: bool,
}

/// A fixed number of credits shared by many threads.
///
/// ```
/// use tent_rings::credit::{CreditPool, ReserveError};
///
/// let pool = CreditPool::new(4, 0);
/// let epoch = pool.try_reserve(3)?;
/// assert!(matches!(pool.try_reserve(2), Err(ReserveError::Full(_)))); // all or nothing
/// pool.release(3, 1_000);
/// assert_eq!(pool.available(), 4);
/// assert_eq!(pool.epoch(), epoch);
/// # Ok::<(), ReserveError>(())
/// ```
#[derive(Debug)]
pub struct CreditPool {
    /// Padded: it is the one word every submitting and completing thread
    /// hammers; keep unrelated data off its line.
    word: CachePadded<AtomicU64>,
    capacity: u32,
    resume_watermark: u32,
    waiters: AtomicU32,
    last_release_ns: AtomicU64,
}

impl CreditPool {
    /// A pool of `capacity` credits.
    ///
    /// With `resume_watermark > 0` the pool has hysteresis: once a reservation
    /// fails for lack of credits while fewer than `resume_watermark` are free,
    /// the pool pauses and refuses every reservation until releases bring the
    /// free count back to the watermark. That keeps a swarm of small requests
    /// from starving one that is waiting for many credits. The watermark is
    /// clamped to `capacity`; 0 disables hysteresis.
    pub fn new(capacity: u32, resume_watermark: u32) -> CreditPool {
        CreditPool {
            word: CachePadded::new(AtomicU64::new(0)),
            capacity,
            resume_watermark: resume_watermark.min(capacity),
            waiters: AtomicU32::new(0),
            last_release_ns: AtomicU64::new(0),
        }
    }

    /// Apply `f` to the state word until the compare-and-swap succeeds;
    /// returns the new word, or `f`'s error.
    fn update<E>(&self, mut f: impl FnMut(Word) -> Result<Word, E>) -> Result<Word, E> {
        // Relaxed: only a first guess; the CAS below validates it.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let next = f(Word(current))?;
            // SeqCst: Acquire so a reservation sees everything the
            // releasing thread did before giving its credits back (e.g. done
            // with a buffer slot), Release so the next release/reserve sees
            // ours, and one total order with the waiter count: a release
            // followed by a look at `waiters` and a waiter's registration
            // followed by a look at the word are a store-buffering pair,
            // which only SeqCst on both sides forbids (one side always sees
            // the other). Same instructions as AcqRel on x86 and ARMv8.
            match self.word.compare_exchange_weak(
                current,
                next.0,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Ok(next),
                Err(actual) => current = actual,
            }
        }
    }

    fn load(&self) -> Word {
        // SeqCst (an Acquire that also takes part in the total order; see
        // `update`): the caller sees what happened before the last
        // transition.
        Word(self.word.load(Ordering::SeqCst))
    }

    fn snapshot_of(&self, w: Word) -> CreditSnapshot {
        CreditSnapshot {
            capacity: self.capacity,
            in_flight: w.in_flight(),
            // Relaxed: diagnostics only.
            waiters: self.waiters.load(Ordering::Relaxed),
            last_release_ns: self.last_release_ns.load(Ordering::Relaxed),
            degraded: w.degraded(),
            paused: w.paused(),
            epoch: w.epoch(),
        }
    }

    fn free(&self, w: Word) -> u32 {
        self.capacity.saturating_sub(w.in_flight())
    }

    /// Reserve `n` credits, all or nothing; returns the epoch at reservation
    /// (compare it later to tell whether the pool's health changed meanwhile).
    pub fn try_reserve(&self, n: u32) -> Result<u32, ReserveError> {
        if n > self.capacity {
            return Err(ReserveError::TooLarge {
                requested: n,
                capacity: self.capacity,
            });
        }
        let outcome = self.update(|w| {
            if w.degraded() {
                return Err(Err(ReserveError::Degraded { epoch: w.epoch() }));
            }
            let free = self.free(w);
            if w.paused() {
                return Err(Err(ReserveError::Full(self.snapshot_of(w))));
            }
            if n <= free {
                return Ok(w.with_in_flight(w.in_flight() + n));
            }
            // Pausing only below the watermark keeps the invariant
            // "paused => free < watermark", so a release always gets the
            // chance to resume the pool.
            if free < self.resume_watermark {
                // Record the pause in the same CAS loop, then report Full.
                return Ok(w.with_paused(true));
            }
            Err(Err(ReserveError::Full(self.snapshot_of(w))))
        });
        match outcome {
            Ok(w) if w.paused() => Err(ReserveError::Full(self.snapshot_of(w))),
            Ok(w) => Ok(w.epoch()),
            Err(e) => e,
        }
    }

    /// Give back `n` credits at time `now_ns`. Works on a degraded pool too,
    /// so orphaned requests can drain.
    ///
    /// Releasing more than is in flight is a bug: it panics in debug builds
    /// and saturates at 0 in release builds.
    pub fn release(&self, n: u32, now_ns: u64) -> Released {
        let mut resumed = false;
        let w = self
            .update::<()>(|w| {
                debug_assert!(
                    n <= w.in_flight(),
                    "released {n} credits with {} in flight",
                    w.in_flight()
                );
                let next = w.with_in_flight(w.in_flight().saturating_sub(n));
                resumed = w.paused() && self.free(next) >= self.resume_watermark;
                Ok(next.with_paused(w.paused() && !resumed))
            })
            .unwrap_or_else(|()| unreachable!());
        // Relaxed: a diagnostic timestamp; nothing is ordered by it.
        self.last_release_ns.store(now_ns, Ordering::Relaxed);
        Released {
            in_flight: w.in_flight(),
            resumed,
        }
    }

    /// Credits reserved and not yet released.
    pub fn in_flight(&self) -> u32 {
        self.load().in_flight()
    }

    /// Credits free right now (ignoring `paused`).
    pub fn available(&self) -> u32 {
        self.free(self.load())
    }

    /// Total credits.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Current health epoch.
    pub fn epoch(&self) -> u32 {
        self.load().epoch()
    }

    /// Degraded, and the health epoch, read at one instant (one load: the
    /// check a post makes between its reservation and the post itself).
    #[inline]
    pub fn health(&self) -> (bool, u32) {
        let w = self.load();
        (w.degraded(), w.epoch())
    }

    /// Whether the pool refuses reservations because its path is unhealthy.
    pub fn is_degraded(&self) -> bool {
        self.load().degraded()
    }

    /// Refuse further reservations and start a new epoch; returns it.
    /// Already degraded: nothing changes and the current epoch is returned.
    pub fn mark_degraded(&self) -> u32 {
        self.set_health(true)
    }

    /// Accept reservations again and start a new epoch; returns it.
    /// Not degraded: nothing changes and the current epoch is returned.
    pub fn clear_degraded(&self) -> u32 {
        self.set_health(false)
    }

    fn set_health(&self, degraded: bool) -> u32 {
        match self.update(|w| {
            if w.degraded() == degraded {
                Err(w.epoch())
            } else {
                Ok(w.with_health(degraded))
            }
        }) {
            Ok(w) => w.epoch(),
            Err(epoch) => epoch,
        }
    }

    /// Register a thread waiting for credits: in snapshots, and for a
    /// releaser deciding whether anyone needs waking ([`waiters`](Self::waiters)).
    pub fn add_waiter(&self) {
        // SeqCst: a waiter registers, then re-checks the pool; a releaser
        // changes the pool, then reads `waiters`. One total order keeps
        // them from both missing the other.
        self.waiters.fetch_add(1, Ordering::SeqCst);
    }

    /// Unregister a waiting thread (never goes below 0).
    pub fn remove_waiter(&self) {
        // SeqCst: as in add_waiter.
        let _ = self
            .waiters
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                Some(w.saturating_sub(1))
            });
    }

    /// Threads registered as waiting now.
    #[inline]
    pub fn waiters(&self) -> u32 {
        // SeqCst: as in add_waiter.
        self.waiters.load(Ordering::SeqCst)
    }

    /// The whole state at one instant (the waiter count and timestamp are
    /// read separately and may be slightly newer).
    pub fn snapshot(&self) -> CreditSnapshot {
        self.snapshot_of(self.load())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reserve_release() {
        let pool = CreditPool::new(10, 0);
        assert_eq!(pool.capacity(), 10);
        assert_eq!(pool.try_reserve(4), Ok(0));
        assert_eq!(pool.try_reserve(6), Ok(0));
        assert_eq!(pool.in_flight(), 10);
        assert_eq!(pool.available(), 0);
        assert_eq!(
            pool.release(3, 77),
            Released {
                in_flight: 7,
                resumed: false
            }
        );
        let s = pool.snapshot();
        assert_eq!(s.last_release_ns, 77);
        assert_eq!(s.in_flight, 7);
        assert!(!s.paused && !s.degraded);
    }

    #[test]
    fn all_or_nothing() {
        let pool = CreditPool::new(8, 0);
        pool.try_reserve(5).unwrap();
        match pool.try_reserve(4) {
            Err(ReserveError::Full(s)) => {
                assert_eq!(s.in_flight, 5);
                assert!(!s.paused, "no hysteresis without a watermark");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(pool.in_flight(), 5);
        assert!(pool.try_reserve(3).is_ok());
    }

    #[test]
    fn too_large() {
        let pool = CreditPool::new(8, 0);
        assert_eq!(
            pool.try_reserve(9),
            Err(ReserveError::TooLarge {
                requested: 9,
                capacity: 8
            })
        );
        assert!(pool.try_reserve(8).is_ok());
    }

    #[test]
    fn degraded_and_epochs() {
        let pool = CreditPool::new(8, 0);
        pool.try_reserve(2).unwrap();
        assert_eq!(pool.mark_degraded(), 1);
        assert_eq!(pool.mark_degraded(), 1, "already degraded: same epoch");
        assert!(pool.is_degraded());
        assert_eq!(
            pool.try_reserve(1),
            Err(ReserveError::Degraded { epoch: 1 })
        );
        // Orphans still drain.
        assert_eq!(pool.release(2, 5).in_flight, 0);
        assert_eq!(pool.clear_degraded(), 2);
        assert_eq!(pool.clear_degraded(), 2);
        assert!(!pool.is_degraded());
        assert_eq!(pool.try_reserve(1), Ok(2));
        assert_eq!(pool.epoch(), 2);
    }

    #[test]
    fn epoch_wraps_at_30_bits() {
        let pool = CreditPool::new(8, 0);
        pool.try_reserve(3).unwrap();
        pool.word.store(
            Word(pool.word.load(Ordering::Relaxed)).0 | (EPOCH_MASK << EPOCH_SHIFT),
            Ordering::Relaxed,
        );
        assert_eq!(pool.epoch(), (1 << 30) - 1);
        assert_eq!(pool.mark_degraded(), 0);
        assert!(pool.is_degraded());
        assert_eq!(
            pool.in_flight(),
            3,
            "epoch bump must not touch other fields"
        );
    }

    #[test]
    fn watermark_hysteresis() {
        let pool = CreditPool::new(8, 4);
        pool.try_reserve(8).unwrap();
        assert!(matches!(pool.try_reserve(1), Err(ReserveError::Full(s)) if s.paused));
        assert!(pool.snapshot().paused);

        let mut resumes = 0;
        for (i, expect_ok) in [(1, false), (2, false), (3, false), (4, true)] {
            let r = pool.release(1, i);
            resumes += usize::from(r.resumed);
            assert_eq!(r.resumed, expect_ok, "release #{i}");
            // Free credits exist, but the pool stays refused until the watermark.
            let refused = matches!(pool.try_reserve(1), Err(ReserveError::Full(_)));
            assert_eq!(refused, !expect_ok, "reserve after release #{i}");
        }
        // The successful reserve took one credit back: 3 free, not paused.
        assert!(!pool.snapshot().paused);
        for _ in 0..5 {
            resumes += usize::from(pool.release(1, 9).resumed);
        }
        assert_eq!(resumes, 1);
        assert_eq!(pool.in_flight(), 0);
    }

    #[test]
    fn no_pause_when_above_watermark() {
        let pool = CreditPool::new(8, 2);
        pool.try_reserve(5).unwrap();
        // 3 free >= watermark 2: refused, but not paused.
        assert!(matches!(pool.try_reserve(4), Err(ReserveError::Full(s)) if !s.paused));
        assert!(pool.try_reserve(3).is_ok());
        assert!(matches!(pool.try_reserve(1), Err(ReserveError::Full(s)) if s.paused));
    }

    #[test]
    fn watermark_is_clamped() {
        let pool = CreditPool::new(4, 100);
        pool.try_reserve(4).unwrap();
        assert!(pool.try_reserve(1).is_err());
        assert!(!pool.release(3, 0).resumed);
        assert!(pool.release(1, 0).resumed);
    }

    #[test]
    fn waiters() {
        let pool = CreditPool::new(1, 0);
        pool.add_waiter();
        pool.add_waiter();
        pool.remove_waiter();
        assert_eq!(pool.snapshot().waiters, 1);
        pool.remove_waiter();
        pool.remove_waiter();
        assert_eq!(pool.snapshot().waiters, 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "released 2 credits with 1 in flight")]
    fn over_release_panics_in_debug() {
        let pool = CreditPool::new(4, 0);
        pool.try_reserve(1).unwrap();
        pool.release(2, 0);
    }

    #[test]
    fn concurrent_reserve_release() {
        let pool = Arc::new(CreditPool::new(16, 4));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    let mut done = 0;
                    let mut i = 0u64;
                    // Fewer rounds under Miri, which runs each one thousands
                    // of times slower but checks every access for races.
                    while done < if cfg!(miri) { 100 } else { 20_000 } {
                        let n = 1 + (i % 5) as u32 + t;
                        i += 1;
                        if pool.try_reserve(n).is_ok() {
                            assert!(pool.in_flight() <= 16);
                            pool.release(n, i);
                            done += 1;
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = pool.snapshot();
        assert_eq!(s.in_flight, 0);
        assert!(!s.paused);
    }

    #[test]
    fn display() {
        let e = ReserveError::TooLarge {
            requested: 9,
            capacity: 8,
        };
        assert_eq!(e.to_string(), "requested 9 credits from a pool of 8");
        assert!(
            ReserveError::Degraded { epoch: 3 }
                .to_string()
                .contains('3')
        );
    }
}
