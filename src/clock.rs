//! The engine's time base: `CLOCK_MONOTONIC` nanoseconds.
//!
//! SQE deadlines are absolute monotonic nanoseconds so that a ring in shared
//! memory means the same instant to every process on the host (an `Instant`
//! is opaque and per-process).

use std::time::Duration;

/// Now, in `CLOCK_MONOTONIC` nanoseconds (vDSO: no syscall).
#[inline]
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An absolute deadline `timeout` from now, for [`tent_rings::op::Write::deadline_ns`].
pub fn deadline_after(timeout: Duration) -> u64 {
    monotonic_ns().saturating_add(nanos(timeout))
}

/// `d` in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_deadline() {
        let a = monotonic_ns();
        let d = deadline_after(Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b >= a);
        assert!(d >= a + 5_000_000);
    }
}
