//! An engine's incarnation: 64 random bits drawn once when it starts. It
//! tags every id the engine hands out (regions, segments, batches), so an
//! id from another engine, or from an earlier run of this one, names
//! nothing here and is refused typed; RDMA peers file this engine's QPs
//! under it.

use std::num::NonZeroU64;

/// Bits of a [`crate::BatchId`] that carry the tag (the rest: the slot
/// and its generation).
pub(crate) const BATCH_TAG_BITS: u32 = 24;

/// See the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Incarnation(NonZeroU64);

impl Incarnation {
    /// A fresh one, from the system's random source. Its tags are never 0
    /// (an id with tag 0 is [`tent_rings::SegmentId::LOCAL`]'s, or a
    /// test's).
    pub(crate) fn draw() -> Incarnation {
        loop {
            if let Some(i) = Incarnation::from_bits(crate::control::auth::random_u64()) {
                return i;
            }
        }
    }

    /// `bits` as an incarnation, if its tags are non-zero.
    fn from_bits(bits: u64) -> Option<Incarnation> {
        let i = Incarnation(NonZeroU64::new(bits)?);
        (i.tag() != 0 && i.batch_tag() != 0).then_some(i)
    }

    /// The 64 bits.
    pub(crate) fn get(self) -> u64 {
        self.0.get()
    }

    /// The tag region and segment ids carry (their high 32 bits): both
    /// halves folded together.
    pub(crate) fn tag(self) -> u32 {
        let x = self.0.get();
        (x ^ (x >> 32)) as u32
    }

    /// The tag a batch id carries: the low [`BATCH_TAG_BITS`] of [`tag`](Self::tag).
    pub(crate) fn batch_tag(self) -> u32 {
        self.tag() & ((1 << BATCH_TAG_BITS) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_never_zero_and_draws_differ() {
        assert!(Incarnation::from_bits(0).is_none());
        // Both halves equal: the folded tag is 0.
        assert!(Incarnation::from_bits(0x1234_5678_1234_5678).is_none());
        // The low 24 bits of the tag 0.
        assert!(Incarnation::from_bits(0x0100_0000).is_none());
        let i = Incarnation::from_bits(0x1).unwrap();
        assert_eq!((i.tag(), i.batch_tag()), (1, 1));
        let (a, b) = (Incarnation::draw(), Incarnation::draw());
        assert_ne!(a, b);
        assert!(a.tag() != 0 && a.batch_tag() != 0 && a.batch_tag() < 1 << BATCH_TAG_BITS);
    }
}
