//! Stopping one task's slices on TCP ([`Transport::abort`]).
//!
//! A worker keeps, with no lock, how many slices of each token it has out
//! on TCP and which tokens it aborted ([`Tokens`]); an entry goes when the
//! token's last slice comes back, so an abort is remembered exactly as
//! long as it matters. What the connections' threads must know of an
//! abort is on the worker's [`AbortBoard`]: one writer (the worker), lock-
//! free readers (its connections' senders and receivers), one load when no
//! token is aborted.
//!
//! [`Transport::abort`]: crate::transport::Transport::abort

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};

use tent_rings::ErrorKind;

/// One token with slices out.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    token: u64,
    /// Slices of it out on TCP (0: the slot is free).
    count: u32,
    /// The kind it was aborted with (an `ErrorKind` code, 0: not aborted).
    aborted: u16,
}

/// The tokens one worker has slices out on, with how many, and the kind
/// of those it aborted: a fixed open-addressed table (linear probing,
/// backward-shift removal), so counting costs no allocation.
#[derive(Debug)]
pub(crate) struct Tokens {
    slots: Box<[Entry]>,
    len: usize,
}

impl Tokens {
    /// Room for `most` tokens out at once (the worker's credits bound it).
    pub(super) fn new(most: usize) -> Tokens {
        let cap = Tokens::capacity(most);
        Tokens {
            slots: vec![Entry::default(); cap].into_boxed_slice(),
            len: 0,
        }
    }

    /// Slots for `most` tokens: twice as many, a power of two (one always
    /// stays free, so a probe ends).
    fn capacity(most: usize) -> usize {
        (most.max(8) * 2).next_power_of_two()
    }

    /// Bytes `Tokens::new(most)` allocates (the engine's footprint check).
    pub(super) fn bytes(most: usize) -> u64 {
        (Tokens::capacity(most) * std::mem::size_of::<Entry>()) as u64
    }

    #[inline]
    fn home(&self, token: u64) -> usize {
        // Fibonacci hashing: tokens differ mostly in their high half.
        let bits = self.slots.len().trailing_zeros();
        (token.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    #[inline]
    fn find(&self, token: u64) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(token);
        // One slot always stays free (`add`), so the probe ends.
        loop {
            let e = &self.slots[i];
            if e.count == 0 {
                return Err(i);
            }
            if e.token == token {
                return Ok(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// One more slice of `token` out; false (nothing counted) when full.
    #[inline]
    pub(super) fn add(&mut self, token: u64) -> bool {
        match self.find(token) {
            Ok(i) => {
                self.slots[i].count += 1;
                true
            }
            Err(_) if self.len + 1 >= self.slots.len() => false,
            Err(i) => {
                self.slots[i] = Entry {
                    token,
                    count: 1,
                    aborted: 0,
                };
                self.len += 1;
                true
            }
        }
    }

    /// Mark `token` aborted with `kind`: true if it has slices out and was
    /// not aborted before.
    pub(super) fn abort(&mut self, token: u64, kind: ErrorKind) -> bool {
        match self.find(token) {
            Ok(i) if self.slots[i].aborted == 0 => {
                self.slots[i].aborted = kind.code();
                true
            }
            _ => false,
        }
    }

    /// The kind `token` was aborted with, if it was.
    #[inline]
    pub(super) fn aborted(&self, token: u64) -> Option<ErrorKind> {
        match self.find(token) {
            Ok(i) => ErrorKind::from_code(self.slots[i].aborted),
            Err(_) => None,
        }
    }

    /// One slice of `token` came back for good. True when it was the last
    /// one of an aborted token (its board entry can go).
    #[inline]
    pub(super) fn finish(&mut self, token: u64) -> bool {
        let Ok(i) = self.find(token) else {
            debug_assert!(false, "a slice of token {token:#x} was not counted");
            return false;
        };
        let e = &mut self.slots[i];
        e.count -= 1;
        if e.count > 0 {
            return false;
        }
        let aborted = e.aborted != 0;
        self.remove_at(i);
        aborted
    }

    /// Free slot `i`, shifting back the entries that probed past it.
    fn remove_at(&mut self, mut i: usize) {
        let mask = self.slots.len() - 1;
        self.slots[i] = Entry::default();
        self.len -= 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            if self.slots[j].count == 0 {
                return;
            }
            let h = self.home(self.slots[j].token);
            // Entry j may move to i unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !stays {
                self.slots[i] = self.slots[j];
                self.slots[j] = Entry::default();
                i = j;
            }
        }
    }
}

/// No token (a free board slot). Engine tokens are `slot << 32 | gen`
/// with far fewer than 2^32 task slots, so none is this.
const NO_TOKEN: u64 = u64::MAX;

/// The tokens a worker aborted that still have slices out, for its
/// connections' threads.
///
/// The worker alone writes it; senders and receivers read it with no lock.
/// A reader asks only about a token it holds a slice of, whose entry (so
/// whose kind) cannot change under it: the worker removes an entry only
/// once every slice of the token is back.
#[derive(Debug)]
pub(crate) struct AbortBoard {
    /// Bumped on every abort: a sender that sees it change looks through
    /// its queued slices.
    generation: AtomicU64,
    /// Slots in use are below it.
    top: AtomicUsize,
    tokens: Box<[AtomicU64]>,
    kinds: Box<[AtomicU16]>,
}

impl AbortBoard {
    /// Bytes `AbortBoard::new(most)` allocates for its slots (the
    /// engine's footprint check).
    pub(super) fn bytes(most: usize) -> u64 {
        (most.max(1) * (std::mem::size_of::<AtomicU64>() + std::mem::size_of::<AtomicU16>())) as u64
    }

    /// Room for `most` aborted tokens at once.
    pub(super) fn new(most: usize) -> AbortBoard {
        let n = most.max(1);
        AbortBoard {
            generation: AtomicU64::new(0),
            top: AtomicUsize::new(0),
            tokens: (0..n).map(|_| AtomicU64::new(NO_TOKEN)).collect(),
            kinds: (0..n).map(|_| AtomicU16::new(0)).collect(),
        }
    }

    /// Post `token` as aborted with `kind` (worker only). SeqCst, paired
    /// with a sender's claim of a slice (`Conn::claim`): either the sender
    /// sees the token here and sends nothing, or the worker then sees the
    /// slice on the wire and resets the connection.
    pub(super) fn post(&self, token: u64, kind: ErrorKind) {
        let top = self.top.load(Ordering::Relaxed);
        let i = match (0..top).find(|&i| self.kinds[i].load(Ordering::Relaxed) == 0) {
            Some(i) => i,
            None if top < self.tokens.len() => top,
            None => {
                // Cannot happen: the board has a slot per token out. The
                // abort still stops what is on the wire, and `poll` still
                // reports `kind`; only queued slices go out first.
                crate::lograte::warn_limited!(
                    "tcp-abort-board-full",
                    slots = self.tokens.len(),
                    "tcp: abort board full; queued slices of an aborted task may still be sent"
                );
                return;
            }
        };
        self.kinds[i].store(kind.code(), Ordering::Relaxed);
        self.tokens[i].store(token, Ordering::SeqCst);
        if i == top {
            self.top.store(top + 1, Ordering::SeqCst);
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Take `token` off the board (worker only): its last slice is back.
    pub(super) fn remove(&self, token: u64) {
        let top = self.top.load(Ordering::Relaxed);
        let Some(i) = (0..top).find(|&i| self.tokens[i].load(Ordering::Relaxed) == token) else {
            return;
        };
        self.tokens[i].store(NO_TOKEN, Ordering::Release);
        self.kinds[i].store(0, Ordering::Release);
        let mut top = top;
        while top > 0 && self.kinds[top - 1].load(Ordering::Relaxed) == 0 {
            top -= 1;
        }
        self.top.store(top, Ordering::Release);
    }

    /// The kind `token` was aborted with, if it is on the board. One load
    /// when the board is empty.
    #[inline]
    pub(super) fn kind_of(&self, token: u64) -> Option<ErrorKind> {
        let top = self.top.load(Ordering::SeqCst);
        (0..top.min(self.tokens.len()))
            .find(|&i| self.tokens[i].load(Ordering::SeqCst) == token)
            .and_then(|i| ErrorKind::from_code(self.kinds[i].load(Ordering::Relaxed)))
    }

    /// Changes with every abort.
    #[inline]
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_count_and_forget_exactly() {
        let mut t = Tokens::new(8);
        let cap = t.slots.len();
        // Tokens shaped like the engine's: slot << 32 | generation.
        let tok = |slot: u64, g: u64| (slot << 32) | g;
        for s in 0..(cap as u64 - 1) {
            assert!(t.add(tok(s, 1)));
        }
        assert!(!t.add(tok(999, 1)), "one slot stays free");
        assert!(t.add(tok(3, 1)), "a token already out counts up");
        assert!(t.abort(tok(3, 1), ErrorKind::Timeout));
        assert!(!t.abort(tok(3, 1), ErrorKind::Canceled), "aborted once");
        assert!(!t.abort(tok(999, 1), ErrorKind::Timeout), "nothing out");
        assert_eq!(t.aborted(tok(3, 1)), Some(ErrorKind::Timeout));
        assert!(!t.finish(tok(3, 1)), "one slice of it is still out");
        assert!(t.finish(tok(3, 1)), "its last slice: the board entry goes");
        assert_eq!(t.aborted(tok(3, 1)), None);
        // Every other token is still found after the removals' shifts.
        for s in (0..(cap as u64 - 1)).filter(|&s| s != 3) {
            assert!(!t.finish(tok(s, 1)), "token of slot {s} lost");
        }
        assert_eq!(t.len, 0);
        assert!(t.slots.iter().all(|e| e.count == 0));
    }

    #[test]
    fn tokens_survive_churn_with_collisions() {
        let mut t = Tokens::new(16);
        let mut out: Vec<u64> = Vec::new();
        let mut x = 1u64;
        for round in 0..10_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if out.len() < 20 && (x >> 60) < 10 {
                let tok = ((x >> 40) % 64) << 32 | round;
                assert!(t.add(tok));
                out.push(tok);
            } else if !out.is_empty() {
                let tok = out.swap_remove((x >> 33) as usize % out.len());
                t.finish(tok);
            }
            for &tok in &out {
                assert!(t.find(tok).is_ok(), "round {round}: {tok:#x} lost");
            }
        }
    }

    #[test]
    fn the_board_answers_for_posted_tokens_only() {
        let b = AbortBoard::new(4);
        assert_eq!(b.kind_of(7), None);
        let g = b.generation();
        b.post(7, ErrorKind::Timeout);
        b.post(9, ErrorKind::Canceled);
        assert_ne!(b.generation(), g);
        assert_eq!(b.kind_of(7), Some(ErrorKind::Timeout));
        assert_eq!(b.kind_of(9), Some(ErrorKind::Canceled));
        assert_eq!(b.kind_of(8), None);
        b.remove(7);
        assert_eq!(b.kind_of(7), None);
        assert_eq!(b.kind_of(9), Some(ErrorKind::Canceled));
        // The freed slot is used again; the top shrinks once all are free.
        b.post(11, ErrorKind::Shutdown);
        assert_eq!(b.top.load(Ordering::Relaxed), 2);
        b.remove(9);
        b.remove(11);
        assert_eq!(b.top.load(Ordering::Relaxed), 0);
        assert_eq!(b.kind_of(11), None);
    }

    #[test]
    fn bytes_is_what_new_allocates() {
        for most in [1, 7, 8, 100, 4096] {
            let t = Tokens::new(most);
            assert_eq!(
                Tokens::bytes(most),
                (t.slots.len() * std::mem::size_of::<Entry>()) as u64
            );
            let b = AbortBoard::new(most);
            assert_eq!(
                AbortBoard::bytes(most),
                (b.tokens.len() * 8 + b.kinds.len() * 2) as u64
            );
        }
    }
}
