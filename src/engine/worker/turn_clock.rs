//! The turn's clock: read at most once a turn, and only when something in
//! the turn needs the time.
//!
//! A clock read (`clock_gettime`, vDSO) costs 23 ns here, as much as the
//! rest of an 8 B shm WRITE's worker time: read at every turn that took an
//! SQE, the instruction after it held 44% of `Worker::run`'s samples (16%
//! of all, the application thread's included) at 32 in flight, where a
//! turn takes one to four SQEs. An op done at intake needs no time unless it
//! asked for a deadline or the slot gate is timed; a queued one does (its
//! deadline, the QoS wait), and so do completions and housekeeping.

use tent_rings::ErrorKind;

use crate::clock::monotonic_ns;

/// Busy turns that may pass without a clock read before one is read for
/// housekeeping's sake: deadlines of slices in flight and cancels are then
/// looked at every few microseconds under a stream of ops done at intake,
/// which read no clock.
pub(super) const CLOCKLESS_TURNS: u32 = 64;

/// A turn's timestamp, read lazily: the first [`now`](TurnClock::now)
/// reads the clock, later ones in the same turn reuse it.
#[derive(Debug, Default)]
pub(in crate::engine) struct TurnClock(Option<u64>);

impl TurnClock {
    /// The turn's time, read now if nothing has read it yet.
    #[inline]
    pub(in crate::engine) fn now(&mut self) -> u64 {
        *self.0.get_or_insert_with(monotonic_ns)
    }

    /// The time for housekeeping's check at the end of a busy turn that
    /// queued nothing: the turn's reading if it has one, else one read now if
    /// `unswept` (turns since one was checked) reached
    /// [`CLOCKLESS_TURNS`], else `None` (the turn is counted).
    #[inline]
    pub(super) fn for_housekeeping(&mut self, unswept: &mut u32) -> Option<u64> {
        *unswept = unswept.saturating_add(1);
        let now = match self.0 {
            Some(now) => now,
            None if *unswept >= CLOCKLESS_TURNS => self.now(),
            None => return None,
        };
        *unswept = 0;
        Some(now)
    }
}

/// A request's deadline as its SQE asks: `None` for the default
/// (`default_timeout_ms` from when it is queued, [`queued_deadline`]; an op
/// done at intake needs none, so it reads no clock), `Some` for the
/// absolute one it asked for, `Timeout` when that one is already past, or
/// `InvalidArgument` when it lies more than `max_ns` (`max_timeout_ms`)
/// ahead: what an unregister or a segment close may have to wait for is
/// bounded.
pub(super) fn asked_deadline(
    asked: u64,
    clock: &mut TurnClock,
    max_ns: u64,
) -> Result<Option<u64>, ErrorKind> {
    match asked {
        0 => Ok(None),
        d => {
            let now = clock.now();
            if d <= now {
                Err(ErrorKind::Timeout)
            } else if d - now > max_ns {
                Err(ErrorKind::InvalidArgument)
            } else {
                Ok(Some(d))
            }
        }
    }
}

/// The deadline a queued request keeps: the one it asked for, or
/// `default_ns` from `now` (saturating: a default past the clock's range is
/// "never", not the past).
pub(super) fn queued_deadline(asked: Option<u64>, now: u64, default_ns: u64) -> u64 {
    asked.unwrap_or_else(|| now.saturating_add(default_ns))
}

#[cfg(test)]
mod tests {
    use super::{CLOCKLESS_TURNS, TurnClock, asked_deadline, queued_deadline};
    use tent_rings::ErrorKind;

    #[test]
    fn the_clock_is_read_once_and_only_when_asked() {
        let mut c = TurnClock::default();
        assert_eq!(c.0, None);
        let t = c.now();
        assert!(t > 0);
        assert_eq!(c.0, Some(t));
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_eq!(c.now(), t, "the turn keeps its first reading");
    }

    #[test]
    fn housekeeping_reads_the_clock_after_clockless_turns() {
        let mut unswept = 0;
        for _ in 1..CLOCKLESS_TURNS {
            let mut c = TurnClock::default();
            assert_eq!(c.for_housekeeping(&mut unswept), None);
            assert_eq!(c.0, None, "no clock read before the count");
        }
        let mut c = TurnClock::default();
        let now = c.for_housekeeping(&mut unswept);
        assert!(now.is_some() && now == c.0);
        assert_eq!(unswept, 0);
        // A turn that read the clock anyway checks with its reading.
        unswept = 5;
        let mut c = TurnClock(Some(7));
        assert_eq!(c.for_housekeeping(&mut unswept), Some(7));
        assert_eq!(unswept, 0);
    }

    #[test]
    fn a_default_deadline_reads_no_clock() {
        let mut c = TurnClock::default();
        assert_eq!(asked_deadline(0, &mut c, 10_000), Ok(None));
        assert_eq!(c.0, None);
        assert_eq!(queued_deadline(None, 1_000, 500), 1_500);
        // A default past the clock's range saturates rather than wraps
        // into the past.
        assert_eq!(queued_deadline(None, u64::MAX - 1, 500), u64::MAX);
    }

    #[test]
    fn an_asked_deadline_is_checked_against_the_turn_s_time() {
        let mut c = TurnClock(Some(1_000));
        assert_eq!(asked_deadline(2_000, &mut c, 10_000), Ok(Some(2_000)));
        assert_eq!(queued_deadline(Some(2_000), 1_000, 500), 2_000);
        assert_eq!(
            asked_deadline(1_000, &mut c, 10_000),
            Err(ErrorKind::Timeout)
        );
        assert_eq!(asked_deadline(1, &mut c, 10_000), Err(ErrorKind::Timeout));
        // Unread, an asked deadline reads it.
        let mut fresh = TurnClock::default();
        assert_eq!(
            asked_deadline(1, &mut fresh, 10_000),
            Err(ErrorKind::Timeout)
        );
        assert!(fresh.0.is_some());
    }

    #[test]
    fn a_deadline_further_than_the_cap_is_refused_and_one_at_it_taken() {
        let mut c = TurnClock(Some(1_000));
        assert_eq!(asked_deadline(11_000, &mut c, 10_000), Ok(Some(11_000)));
        assert_eq!(
            asked_deadline(11_001, &mut c, 10_000),
            Err(ErrorKind::InvalidArgument)
        );
        assert_eq!(
            asked_deadline(u64::MAX, &mut c, 10_000),
            Err(ErrorKind::InvalidArgument)
        );
    }
}
