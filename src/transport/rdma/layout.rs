//! How a region larger than a NIC's `max_mr_size` is registered: as
//! memory regions (MRs) of `2 × step` bytes starting every `step` bytes,
//! so neighbours overlap by `step`. Any work request no longer than `step`
//! lies whole inside the chunk its first byte's offset divided by `step`
//! names (the last chunk runs to the region's end), so a slice needs one
//! lkey and one rkey however the region is cut, and never splits.
//!
//! The owner picks `step` (half the smallest `max_mr_size` of its NICs,
//! at least [`MIN_STEP`], which is at least the longest RDMA slice), and
//! advertises it with the region (`REGION_MR_STEP`); its `rkeys` are then
//! NIC-major, [`MrLayout::chunks`] per NIC. Without a step the region is
//! one MR per NIC.

/// The shortest step: the longest RDMA slice (`transports/rdma/slice_size`
/// admits at most 1 GiB), so any slice fits inside one chunk. A NIC whose
/// `max_mr_size` is below twice this cannot hold a region longer than its
/// `max_mr_size` at all.
pub(crate) const MIN_STEP: u64 = 1 << 30;

/// Most chunks one region is cut into on one NIC (it bounds the keys a
/// region carries on the wire and the MRs it costs each NIC).
pub(crate) const MAX_CHUNKS: usize = 64;

/// Tests: a smaller [`MIN_STEP`] and `max_mr_size` (0 = unchanged), so a
/// guest with 1 GiB of memory can cut a region into chunks.
#[cfg(any(test, feature = "testing"))]
static TEST_LIMITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Tests only: from now on, regions are registered as if every NIC's
/// `max_mr_size` were `max_mr` and the shortest step `max_mr / 2`
/// (slices must then be no longer than that); `None` restores both.
#[cfg(any(test, feature = "testing"))]
pub fn set_max_mr_size_for_tests(max_mr: Option<u64>) {
    TEST_LIMITS.store(max_mr.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

/// The `max_mr_size` to register against, for a device that reports
/// `reported`.
pub(crate) fn max_mr_size(reported: u64) -> u64 {
    #[cfg(any(test, feature = "testing"))]
    if let m @ 1.. = TEST_LIMITS.load(std::sync::atomic::Ordering::Relaxed) {
        return m.min(reported);
    }
    reported
}

/// Can a NIC whose `max_mr_size` is `max_mr` hold chunks (twice the
/// shortest step)?
pub(crate) fn can_chunk(max_mr: u64) -> bool {
    max_mr / 2 >= min_step()
}

/// The shortest step in effect (see [`MIN_STEP`]).
fn min_step() -> u64 {
    #[cfg(any(test, feature = "testing"))]
    if let m @ 1.. = TEST_LIMITS.load(std::sync::atomic::Ordering::Relaxed) {
        return m / 2;
    }
    MIN_STEP
}

/// How one region is cut into MRs on every NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MrLayout {
    len: u64,
    /// 0: one MR for the whole region.
    step: u64,
}

impl MrLayout {
    /// One MR of `len` bytes.
    pub(crate) fn whole(len: u64) -> MrLayout {
        MrLayout { len, step: 0 }
    }

    /// The layout for `len` bytes on NICs whose smallest `max_mr_size` is
    /// `max_mr`: one MR when it fits, else chunks of `max_mr` rounded down
    /// to a page every half of that; `None` when even that cannot be (a
    /// step below the shortest, or more than [`MAX_CHUNKS`] chunks).
    pub(crate) fn new(len: u64, max_mr: u64) -> Option<MrLayout> {
        if len <= max_mr {
            return Some(MrLayout::whole(len));
        }
        let step = (max_mr / 2) & !4095;
        MrLayout::checked(len, step)
    }

    /// The layout a descriptor gives for a region of `len` bytes
    /// (`step`: its `REGION_MR_STEP`), checked as [`MrLayout::new`]'s; a
    /// peer's input, so `None` for any step this engine would not make.
    pub(crate) fn from_wire(len: u64, step: Option<u64>) -> Option<MrLayout> {
        match step {
            None => Some(MrLayout::whole(len)),
            Some(step) => MrLayout::checked(len, step),
        }
    }

    fn checked(len: u64, step: u64) -> Option<MrLayout> {
        if step < min_step() || step % 4096 != 0 {
            return None;
        }
        let l = MrLayout { len, step };
        (l.chunks() <= MAX_CHUNKS).then_some(l)
    }

    /// The step to advertise (`None`: one MR).
    pub(crate) fn step(&self) -> Option<u64> {
        (self.step != 0).then_some(self.step)
    }

    /// MRs per NIC.
    pub(crate) fn chunks(&self) -> usize {
        let span = self.step.saturating_mul(2);
        if self.step == 0 || self.len <= span {
            return 1;
        }
        // len > span >= 2 × MIN_STEP-ish: at least 2.
        usize::try_from((self.len - span).div_ceil(self.step) + 1).unwrap_or(usize::MAX)
    }

    /// Chunk `k`'s (offset, length) in the region.
    pub(crate) fn chunk(&self, k: usize) -> (u64, u64) {
        if self.step == 0 {
            return (0, self.len);
        }
        let off = (k as u64).saturating_mul(self.step).min(self.len);
        let end = off.saturating_add(self.step.saturating_mul(2)).min(self.len);
        if k + 1 == self.chunks() {
            return (off, self.len - off);
        }
        (off, end - off)
    }

    /// The chunk that holds a work request starting at offset `off` (and
    /// no longer than the step).
    #[inline]
    pub(crate) fn chunk_of(&self, off: u64) -> usize {
        if self.step == 0 {
            return 0;
        }
        let k = usize::try_from(off / self.step).unwrap_or(usize::MAX);
        k.min(self.chunks() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_region_that_fits_is_one_mr() {
        let l = MrLayout::new(3 * GIB, 4 * GIB).unwrap();
        assert_eq!((l.chunks(), l.step(), l.chunk(0)), (1, None, (0, 3 * GIB)));
        assert_eq!(l.chunk_of(3 * GIB - 1), 0);
    }

    #[test]
    fn a_longer_region_is_cut_into_overlapping_chunks_and_every_slice_fits_one() {
        // A 4 GiB max_mr_size: chunks of 4 GiB every 2 GiB.
        let len = 11 * GIB + 12_345;
        let l = MrLayout::new(len, 4 * GIB + 100).unwrap();
        assert_eq!(l.step(), Some(2 * GIB));
        assert_eq!(l.chunks(), 5);
        assert_eq!(l.chunk(0), (0, 4 * GIB));
        assert_eq!(l.chunk(3), (6 * GIB, 4 * GIB));
        // The last runs to the end, and the chunks cover the region.
        assert_eq!(l.chunk(4), (8 * GIB, len - 8 * GIB));
        for k in 0..l.chunks() {
            assert!(l.chunk(k).1 <= 4 * GIB, "chunk {k} over max_mr_size");
        }
        // A slice as long as the step, at offsets around every boundary,
        // lies inside the chunk it is looked up in.
        let slice = 2 * GIB;
        for base in (0..6).map(|i| i * GIB) {
            for off in [base.saturating_sub(1), base, base + 1, base + GIB - 1] {
                let end = (off + slice).min(len);
                let (c, n) = l.chunk(l.chunk_of(off));
                assert!(c <= off && end <= c + n, "off {off}: chunk {c}+{n}");
            }
        }
    }

    #[test]
    fn steps_are_checked_like_a_peers_input() {
        let len = 40 * GIB;
        assert_eq!(MrLayout::from_wire(len, None), Some(MrLayout::whole(len)));
        assert!(MrLayout::from_wire(len, Some(2 * GIB)).is_some());
        // Below the shortest step, not page aligned, or too many chunks.
        assert!(MrLayout::from_wire(len, Some(GIB / 2)).is_none());
        assert!(MrLayout::from_wire(len, Some(2 * GIB + 1)).is_none());
        assert!(MrLayout::from_wire(1 << 40, Some(GIB)).is_none());
        assert!(MrLayout::from_wire(len, Some(0)).is_none());
        // A NIC whose max_mr_size is under twice the shortest step cannot
        // hold a longer region.
        assert!(MrLayout::new(3 * GIB, GIB).is_none());
    }
}
