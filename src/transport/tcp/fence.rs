//! Which superseded connections a connection must have the target fence
//! before its next slice (see [`Fence`](super::frame::Fence)): one list
//! per peer, [`PeerFences`].
//!
//! A connection torn down with a WRITE on it (failed, reset to stop a
//! task's slice, or cut by a link going down) is added; every connection
//! to that peer (all workers, all rails) sends a fence for it ahead of its
//! next slice. So bytes of that WRITE still queued in the target's socket
//! can neither land after its failure reached the application (whose next
//! WRITE they would overwrite) nor over the copy of it re-posted on a
//! sibling connection: that copy goes to the same peer, behind the fence.
//! A connection that fails after sending fences sends them again on its
//! next socket (their service is not known).

use std::sync::atomic::{AtomicU64, Ordering};

/// Connections kept in a [`PeerFences`] (oldest forgotten first: only a
/// connection that sent nothing while that many others failed misses one).
pub(super) const PEER_FENCES_MAX: usize = 64;

/// Connections to one peer fenced by every connection to it before its
/// next slice. Lock-free: an addition claims a generation and fills its
/// slot; a reader takes every filled slot past what it has seen.
#[derive(Debug)]
pub(super) struct PeerFences {
    /// Generations claimed so far (the last one).
    claimed: AtomicU64,
    /// `generation << 32 | connection`, at `generation % PEER_FENCES_MAX`.
    slots: [AtomicU64; PEER_FENCES_MAX],
}

impl Default for PeerFences {
    fn default() -> PeerFences {
        PeerFences {
            claimed: AtomicU64::new(0),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl PeerFences {
    /// Connection `conn` was torn down with a WRITE on it.
    pub(super) fn add(&self, conn: u32) {
        let g = self.claimed.fetch_add(1, Ordering::AcqRel) + 1;
        // Release: a reader that sees the slot's generation sees it whole.
        self.slots[(g % PEER_FENCES_MAX as u64) as usize]
            .store(((g & 0xffff_ffff) << 32) | u64::from(conn), Ordering::Release);
    }

    /// Changes with every addition.
    #[inline]
    pub(super) fn generation(&self) -> u64 {
        self.claimed.load(Ordering::Acquire)
    }

    /// The connections added after generation `seen` into `out`: how many,
    /// and the generation that brings the caller to (short of a slot still
    /// being filled: it, and those after it, are read again next time).
    pub(super) fn since(&self, seen: u64, out: &mut [u32; PEER_FENCES_MAX]) -> (usize, u64) {
        let latest = self.generation();
        let first = seen.max(latest.saturating_sub(PEER_FENCES_MAX as u64)) + 1;
        if first > seen + 1 {
            crate::lograte::warn_limited!(
                "tcp-peer-fences",
                limit = PEER_FENCES_MAX,
                "tcp: a connection idle while many to its peer failed; the oldest of their fences are not sent"
            );
        }
        let mut n = 0;
        let mut reached = seen;
        let mut gap = false;
        for g in first..=latest {
            let v = self.slots[(g % PEER_FENCES_MAX as u64) as usize].load(Ordering::Acquire);
            let at = v >> 32;
            if at < (g & 0xffff_ffff) {
                // Claimed, not filled yet: read again next time, with what
                // follows it (sent now too: a fence sent twice is harmless).
                gap = true;
                continue;
            }
            if at == (g & 0xffff_ffff) {
                out[n] = v as u32;
                n += 1;
            }
            // Else overwritten by a newer one: read in its turn.
            if !gap {
                reached = g;
            }
        }
        (n, reached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_fences_hand_each_connection_what_it_has_not_sent() {
        let f = PeerFences::default();
        let mut out = [0u32; PEER_FENCES_MAX];
        assert_eq!(f.since(0, &mut out), (0, 0));
        f.add(5);
        f.add(6);
        let (n, g) = f.since(0, &mut out);
        assert_eq!((&out[..n], g), (&[5, 6][..], 2));
        f.add(7);
        let (n, g) = f.since(g, &mut out);
        assert_eq!((&out[..n], g), (&[7][..], 3));
        assert_eq!(f.since(g, &mut out).0, 0);
        // Bounded: the oldest go first.
        for c in 100..100 + PEER_FENCES_MAX as u32 {
            f.add(c);
        }
        let (n, _) = f.since(0, &mut out);
        assert_eq!(n, PEER_FENCES_MAX);
        assert_eq!(out[0], 100);
    }

    #[test]
    fn a_slot_claimed_but_not_filled_is_read_next_time() {
        let f = PeerFences::default();
        f.add(1);
        // A second adder has claimed generation 2 and not stored yet.
        f.claimed.fetch_add(1, Ordering::AcqRel);
        // A third adder has filled generation 3.
        f.add(7);
        let mut out = [0u32; PEER_FENCES_MAX];
        let (n, g) = f.since(0, &mut out);
        assert_eq!((&out[..n], g), (&[1, 7][..], 1), "the fence past the gap goes now");
        f.slots[2].store((2 << 32) | 9, Ordering::Release);
        let (n, g) = f.since(g, &mut out);
        assert_eq!((&out[..n], g), (&[9, 7][..], 3));
    }

    #[test]
    fn adders_on_many_threads_lose_no_fence() {
        let f = std::sync::Arc::new(PeerFences::default());
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for i in 0..8 {
                        f.add(t * 100 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut out = [0u32; PEER_FENCES_MAX];
        let (n, g) = f.since(0, &mut out);
        assert_eq!((n, g), (32, 32));
        let mut got = out[..n].to_vec();
        got.sort_unstable();
        let mut want: Vec<u32> = (0..4u32).flat_map(|t| (0..8).map(move |i| t * 100 + i)).collect();
        want.sort_unstable();
        assert_eq!(got, want);
    }
}
