//! What became of one submitted slice: [`SubmitOutcome`], and the same in
//! one machine word ([`PackedOutcome`]) for the worker's inline path.

use tent_rings::ErrorKind;

/// What became of one submitted slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitOutcome {
    /// Done already (synchronous transports): bytes moved or why not.
    Completed(Result<u64, ErrorKind>),
    /// Started; its completion arrives through [`Transport::poll`](super::Transport::poll).
    Posted,
    /// Not started at all (safe to post elsewhere).
    Rejected(ErrorKind),
    /// Not started, and not a fault: the transport is getting ready for
    /// it (an shm peer mapping a region its owner just published) without
    /// waiting. Try again on a later turn; no failover, and the task's
    /// deadline still bounds it.
    Later,
}

impl SubmitOutcome {
    /// The outcome of queueing a slice on a network transport: started,
    /// refused for back-pressure (safe to post elsewhere or later), or
    /// finished at once with the error.
    #[inline]
    pub(crate) fn of_post(posted: Result<(), ErrorKind>) -> SubmitOutcome {
        match posted {
            Ok(()) => SubmitOutcome::Posted,
            Err(ErrorKind::SqFull) => SubmitOutcome::Rejected(ErrorKind::SqFull),
            Err(e) => SubmitOutcome::Completed(Err(e)),
        }
    }
}

/// A [`SubmitOutcome`] in one `u64`, what [`Transport::submit_one`]
/// returns: a word comes back in a register. The enum is 16 bytes and
/// comes back through memory, where the caller's 8-byte load of what the
/// callee stored in 2- and 8-byte pieces cannot be forwarded from the
/// store buffer and waits until every older store is in the cache — on the
/// small-op path, the previous ops' CQE stores, whose lines the
/// application holds (37% of the worker's samples outside the transport at
/// 8 B, 32 in flight).
///
/// The word is a byte count below 2^63 for `Completed(Ok(n))`; with the
/// top bit set, bits 16..18 say which other outcome and bits 0..16 carry
/// its error code. A count of 2^63 or more, which no slice has, saturates.
///
/// [`Transport::submit_one`]: super::Transport::submit_one
///
/// ```
/// use tent::transport::{PackedOutcome, SubmitOutcome};
/// use tent::ErrorKind;
/// for o in [
///     SubmitOutcome::Completed(Ok(8)),
///     SubmitOutcome::Completed(Err(ErrorKind::AccessDenied)),
///     SubmitOutcome::Posted,
///     SubmitOutcome::Rejected(ErrorKind::SqFull),
///     SubmitOutcome::Later,
/// ] {
///     assert_eq!(PackedOutcome::from(o).unpack(), o);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct PackedOutcome(u64);

impl PackedOutcome {
    /// Set on every outcome but `Completed(Ok(_))`.
    const OTHER: u64 = 1 << 63;
    const FAILED: u64 = Self::OTHER;
    const POSTED: u64 = Self::OTHER | 1 << 16;
    const REJECTED: u64 = Self::OTHER | 2 << 16;
    const LATER: u64 = Self::OTHER | 3 << 16;
    const CODE: u64 = 0xFFFF;

    /// The outcome it packs.
    #[inline(always)]
    pub fn unpack(self) -> SubmitOutcome {
        if self.0 & Self::OTHER == 0 {
            return SubmitOutcome::Completed(Ok(self.0));
        }
        // Packed by `from` from a valid kind; `Unreachable` should a word
        // made any other way carry no known code.
        let kind =
            || ErrorKind::from_code((self.0 & Self::CODE) as u16).unwrap_or(ErrorKind::Unreachable);
        match self.0 & !Self::CODE {
            Self::FAILED => SubmitOutcome::Completed(Err(kind())),
            Self::POSTED => SubmitOutcome::Posted,
            Self::REJECTED => SubmitOutcome::Rejected(kind()),
            _ => SubmitOutcome::Later,
        }
    }
}

impl From<SubmitOutcome> for PackedOutcome {
    #[inline(always)]
    fn from(o: SubmitOutcome) -> PackedOutcome {
        PackedOutcome(match o {
            SubmitOutcome::Completed(Ok(n)) => n.min(Self::OTHER - 1),
            SubmitOutcome::Completed(Err(e)) => Self::FAILED | u64::from(e.code()),
            SubmitOutcome::Posted => Self::POSTED,
            SubmitOutcome::Rejected(e) => Self::REJECTED | u64::from(e.code()),
            SubmitOutcome::Later => Self::LATER,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_survives_its_word_and_a_huge_count_saturates() {
        let kinds = (0..=u16::MAX).filter_map(ErrorKind::from_code);
        for k in kinds {
            for o in [SubmitOutcome::Completed(Err(k)), SubmitOutcome::Rejected(k)] {
                assert_eq!(PackedOutcome::from(o).unpack(), o);
            }
        }
        for n in [0, 1, 8, u64::from(u32::MAX) + 1, (1 << 63) - 1] {
            let o = SubmitOutcome::Completed(Ok(n));
            assert_eq!(PackedOutcome::from(o).unpack(), o);
        }
        assert_eq!(
            PackedOutcome::from(SubmitOutcome::Completed(Ok(u64::MAX))).unpack(),
            SubmitOutcome::Completed(Ok((1 << 63) - 1))
        );
        for o in [SubmitOutcome::Posted, SubmitOutcome::Later] {
            assert_eq!(PackedOutcome::from(o).unpack(), o);
        }
    }
}
