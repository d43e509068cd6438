//! Stopping one task's slices on TCP ([`Transport::abort`]).
//!
//! A worker keeps, with no lock, how many slices of each token it has out
//! on TCP and which tokens it aborted ([`Tokens`]); an entry goes when the
//! token's last slice comes back, so an abort is remembered exactly as
//! long as it matters. The worker drives its connections itself, so
//! nothing else needs to know.
//!
//! [`Transport::abort`]: crate::transport::Transport::abort

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
    fn bytes_is_what_new_allocates() {
        for most in [1, 7, 8, 100, 4096] {
            let t = Tokens::new(most);
            assert_eq!(
                Tokens::bytes(most),
                (t.slots.len() * std::mem::size_of::<Entry>()) as u64
            );
        }
    }
}
