//! Which superseded connections a slice must have the target fence
//! before it is served (see [`Fence`](super::frame::Fence)).
//!
//! Two sources: a WRITE moved off a connection that failed fences that
//! connection, and what it owed ([`fences_for`], [`owe`]: per slice,
//! `Op::fence`); and a connection reset while a WRITE was on it is fenced
//! by every connection to that peer before its next slice
//! ([`PeerFences`]), so bytes of that WRITE still queued in the target's
//! socket cannot land after its failure reached the application (a
//! `Timeout` or `Canceled` completion), over what the application wrote
//! since.

use std::collections::VecDeque;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Fences owed beyond the connection a slice left: `(b, a)` says a WRITE
/// failed on connection `b` after it was sent there behind a fence for
/// `a`. That fence may never have reached the target, so wherever the
/// slice goes next, `a` is fenced too (and what `a` owed). Touched only
/// when a moved slice is sent, or fails again.
static OWED: Mutex<VecDeque<(u32, u32)>> = Mutex::new(VecDeque::new());
/// Pairs kept in [`OWED`] (oldest forgotten first: it takes that many
/// slices failing twice before the first is served).
const OWED_MAX: usize = 256;
/// Fences sent ahead of one slice, at most.
pub(super) const FENCES_MAX: usize = 8;

/// Remember that connection `b` owes the fence of `a`.
pub(super) fn owe(b: u32, a: u32) {
    let mut owed = OWED.lock();
    if owed.contains(&(b, a)) {
        return;
    }
    if owed.len() >= OWED_MAX {
        owed.pop_front();
        crate::lograte::warn_limited!(
            "tcp-owed-fences",
            limit = OWED_MAX,
            "tcp: too many slices moved twice; the oldest owed fence is forgotten"
        );
    }
    owed.push_back((b, a));
}

/// The connections to fence ahead of a slice that left `conn`: `conn`,
/// then what it owes, transitively (at most [`FENCES_MAX`]).
pub(super) fn fences_for(conn: u32, out: &mut [u32; FENCES_MAX]) -> usize {
    out[0] = conn;
    let mut n = 1;
    let owed = OWED.lock();
    let mut i = 0;
    while i < n {
        let c = out[i];
        i += 1;
        for &(b, a) in owed.iter() {
            if b != c || out[..n].contains(&a) {
                continue;
            }
            if n == FENCES_MAX {
                crate::lograte::warn_limited!(
                    "tcp-fence-chain",
                    limit = FENCES_MAX,
                    "tcp: a slice moved more often than fences are sent ahead of it; the oldest are left out"
                );
                return n;
            }
            out[n] = a;
            n += 1;
        }
    }
    n
}

/// Connections to one peer fenced by every connection to it before its
/// next slice: those reset while a WRITE was on them. Shared by every
/// connection to the peer (all workers, all rails); only connection
/// threads touch it, and each looks at one atomic per slice.
#[derive(Debug, Default)]
pub(super) struct PeerFences {
    /// Bumped on every addition.
    generation: AtomicU64,
    /// `(generation it was added at, connection)`, oldest first.
    list: Mutex<VecDeque<(u64, u32)>>,
}

/// Connections kept in a [`PeerFences`] (oldest forgotten first: only a
/// connection that sent nothing while that many others failed misses one).
pub(super) const PEER_FENCES_MAX: usize = 64;

impl PeerFences {
    /// Connection `conn` was reset with a WRITE on it.
    pub(super) fn add(&self, conn: u32) {
        let mut list = self.list.lock();
        let g = self.generation.load(Ordering::Relaxed) + 1;
        if list.len() >= PEER_FENCES_MAX {
            list.pop_front();
        }
        list.push_back((g, conn));
        // Release: the entry is in the list before a sender sees `g`.
        self.generation.store(g, Ordering::Release);
    }

    /// Changes with every addition.
    #[inline]
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The connections added after generation `seen` into `out`: how
    /// many, and the generation that brings the caller to.
    pub(super) fn since(&self, seen: u64, out: &mut [u32; PEER_FENCES_MAX]) -> (usize, u64) {
        let list = self.list.lock();
        let latest = self.generation.load(Ordering::Relaxed);
        if list.front().is_some_and(|&(g, _)| g > seen + 1) {
            crate::lograte::warn_limited!(
                "tcp-peer-fences",
                limit = PEER_FENCES_MAX,
                "tcp: a connection idle while many to its peer failed; the oldest of their fences are not sent"
            );
        }
        let mut n = 0;
        for &(_, conn) in list.iter().filter(|&&(g, _)| g > seen) {
            out[n] = conn;
            n += 1;
        }
        (n, latest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp::conn::next_conn_id;

    #[test]
    fn a_slice_moved_twice_fences_every_connection_it_left() {
        let fences = |conn| {
            let mut out = [0u32; FENCES_MAX];
            let n = fences_for(conn, &mut out);
            out[..n].to_vec()
        };
        let (a, b, c) = (next_conn_id(), next_conn_id(), next_conn_id());
        assert_eq!(fences(a), [a]);
        // Failed on b behind a fence for a, then on c behind one for b.
        owe(b, a);
        owe(c, b);
        owe(c, b);
        assert_eq!(fences(c), [c, b, a]);
        // The walk ends even on a cycle.
        owe(a, c);
        assert_eq!(fences(c), [c, b, a]);
    }

    #[test]
    fn fences_ahead_of_one_slice_are_bounded() {
        let first = next_conn_id();
        let mut last = first;
        for _ in 0..2 * FENCES_MAX {
            let next = next_conn_id();
            owe(next, last);
            last = next;
        }
        let mut out = [0u32; FENCES_MAX];
        assert_eq!(fences_for(last, &mut out), FENCES_MAX);
        assert_eq!(out[0], last);
    }

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
}
