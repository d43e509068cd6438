//! `DeviceSelector`: which rail carries the next slice.
//!
//! A rail is a (local device, remote device) pair: two NICs for RDMA, two
//! interfaces for TCP. The selector only sees rail indices and an
//! availability predicate (link state now; the `RailMonitor`'s verdict
//! later), so every transport sprays slices the same way. This is the seam
//! for smarter policies (NUMA tier × EWMA bandwidth): callers keep their
//! cursor, the selector keeps no per-call state and never allocates.

/// How rails are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SelectPolicy {
    /// Each slice on the next available rail: one request's slices spread
    /// over every rail.
    #[default]
    RoundRobin,
}

/// Picks rails for slices.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceSelector {
    policy: SelectPolicy,
}

impl DeviceSelector {
    /// A selector with `policy`.
    pub fn new(policy: SelectPolicy) -> DeviceSelector {
        DeviceSelector { policy }
    }

    /// The rail for the next slice among `rails`, skipping unavailable
    /// ones and `avoid` (the rail a slice just failed on); `None` if no
    /// rail is available. Advances `cursor`.
    #[inline]
    pub fn pick(
        &self,
        cursor: &mut usize,
        rails: usize,
        avoid: Option<usize>,
        available: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        match self.policy {
            SelectPolicy::RoundRobin => {
                for step in 0..rails {
                    let r = (*cursor + step) % rails;
                    if Some(r) != avoid && available(r) {
                        *cursor = r + 1;
                        return Some(r);
                    }
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_spreads_and_skips_unavailable() {
        let s = DeviceSelector::default();
        let mut c = 0;
        let picks: Vec<_> = (0..6).map(|_| s.pick(&mut c, 3, None, |_| true)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2].map(Some));
        let picks: Vec<_> = (0..4)
            .map(|_| s.pick(&mut c, 3, None, |r| r != 1))
            .collect();
        assert_eq!(picks, [0, 2, 0, 2].map(Some));
        assert_eq!(s.pick(&mut c, 3, None, |_| false), None);
        assert_eq!(s.pick(&mut c, 0, None, |_| true), None);
    }

    #[test]
    fn avoids_the_failed_rail() {
        let s = DeviceSelector::default();
        let mut c = 0;
        for _ in 0..5 {
            assert_eq!(s.pick(&mut c, 2, Some(0), |_| true), Some(1));
        }
        assert_eq!(s.pick(&mut c, 1, Some(0), |_| true), None);
    }
}
