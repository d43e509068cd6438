//! The bulk a HIGH slice waits behind on one rail to one peer.
//!
//! A HIGH slice takes the connection with the fewest slices on the wire,
//! the express one on a tie ([`TcpPeer::stride`](super::TcpPeer)), but
//! the bulk a worker keeps on the peer's other connections still sits
//! ahead of it in the paths they share: the interface's queue, the
//! target's serving threads and the CPU that copies its bytes. Measured on
//! loopback, HIGH's median under load grew with those bytes (0.10 ms at
//! 256 KiB, 0.21 ms at 512 KiB, 0.55 ms at the 2 MiB of four connections'
//! windows), LOW keeping 76%, 89% and 96% of its throughput. So while HIGH
//! flows to a peer over a rail, each worker keeps at most `limit` bulk
//! bytes on the wire to it over that rail, all its connections together;
//! with no HIGH for `hold`, each connection has its own window again.
//!
//! While the cap holds, the worker posts the rail's new bulk to one of its
//! connections, so that bulk leaves in the order it was posted.
//!
//! Whether HIGH flows ([`HighHold`]) is one per peer and rail, shared by
//! the workers: HIGH from any worker holds the bulk of all, which is where
//! a daemon's clients served by different workers meet (each worker's
//! lanes order only its own rings). The bytes ([`BulkCap`]) are each
//! worker's own, so no worker waits for another's completions to send,
//! and with `W` workers sending bulk a HIGH slice waits behind at most
//! `W x limit`. A HIGH slice refreshes the hold only once a sixteenth of
//! it has passed, so HIGH at millions of ops a second does not write the
//! shared line per op.
//!
//! A connection that stalls with the cap's bytes on it holds its worker's
//! bulk on the rail while HIGH flows, until the stall ends or tears it
//! down (`TCP_USER_TIMEOUT`); HIGH itself is not held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether HIGH flows to one peer over one rail, for every worker.
#[derive(Debug, Default)]
pub(super) struct HighHold {
    /// How long after a HIGH slice HIGH counts as flowing (ns; 0: never).
    hold_ns: u64,
    /// HIGH flows until then (monotonic ns).
    until: AtomicU64,
}

impl HighHold {
    /// HIGH flows for `hold_ns` after each HIGH slice (0: the cap is off).
    pub(super) fn new(hold_ns: u64) -> HighHold {
        HighHold {
            hold_ns,
            until: AtomicU64::new(0),
        }
    }

    /// A HIGH slice was posted at `now`.
    #[inline]
    pub(super) fn saw_high(&self, now: u64) {
        if self.hold_ns == 0 {
            return;
        }
        let until = now.saturating_add(self.hold_ns);
        // Relaxed: a hint between workers; a bulk slice that reads it a
        // little late goes under the cap a little late.
        let held = self.until.load(Ordering::Relaxed);
        if until > held.saturating_add(self.hold_ns >> 4) {
            self.until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Does HIGH flow at `now`?
    #[inline]
    fn flows(&self, now: u64) -> bool {
        now < self.until.load(Ordering::Relaxed)
    }
}

/// One worker's cap on its bulk bytes on the wire to one peer over one
/// rail while HIGH flows there.
#[derive(Debug)]
pub(super) struct BulkCap {
    /// Bulk bytes on the wire while HIGH flows (0: no cap).
    limit: u64,
    hold: Arc<HighHold>,
    /// Bulk bytes on the wire over the worker's connections on the rail.
    /// Only the owning worker touches it (an atomic so a connection may
    /// move between threads whole, as `Link` does).
    wire: AtomicU64,
}

impl BulkCap {
    /// A worker's cap of `limit` bytes (0: none) while `hold` says HIGH
    /// flows.
    pub(super) fn new(limit: u64, hold: Arc<HighHold>) -> BulkCap {
        BulkCap {
            limit,
            hold,
            wire: AtomicU64::new(0),
        }
    }

    /// Does the cap hold bulk at `now` (set, and HIGH flowing)?
    #[inline]
    pub(super) fn holds(&self, now: u64) -> bool {
        self.limit != 0 && self.hold.flows(now)
    }

    /// May a bulk slice of `len` bytes go on the wire at `now`?
    #[inline]
    pub(super) fn admits(&self, len: u64, now: u64) -> bool {
        admits(
            self.limit,
            self.wire.load(Ordering::Relaxed),
            len,
            self.holds(now),
        )
    }

    /// A bulk slice of `len` bytes went on the wire.
    #[inline]
    pub(super) fn sent(&self, len: u64) {
        // Relaxed: the owning worker's count.
        let w = self.wire.load(Ordering::Relaxed);
        self.wire.store(w.saturating_add(len), Ordering::Relaxed);
    }

    /// Bulk slices of `len` bytes in all left the wire (answered, or their
    /// socket closed).
    #[inline]
    pub(super) fn left(&self, len: u64) {
        // Relaxed: as in `sent`. A connection gives back only what it
        // added; saturating all the same, so a miscount cannot wrap.
        let w = self.wire.load(Ordering::Relaxed);
        self.wire.store(w.saturating_sub(len), Ordering::Relaxed);
    }

    /// Bulk bytes on the wire now.
    #[cfg(test)]
    pub(super) fn on_wire(&self) -> u64 {
        self.wire.load(Ordering::Relaxed)
    }
}

impl Default for BulkCap {
    /// No cap.
    fn default() -> BulkCap {
        BulkCap::new(0, Arc::default())
    }
}

/// The rule: with HIGH flowing and a cap set, a bulk slice goes while the
/// bulk on the wire stays within `limit`, and always onto a wire with no
/// bulk (so a slice larger than the cap still moves); otherwise it goes.
fn admits(limit: u64, wire: u64, len: u64, high_flows: bool) -> bool {
    limit == 0 || !high_flows || wire == 0 || wire.saturating_add(len) <= limit
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MS: u64 = 1_000_000;

    #[test]
    fn bulk_fills_the_cap_only_while_high_flows() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(512 * KIB, hold.clone());
        // No HIGH yet: each connection's own window is the only limit.
        cap.sent(2048 * KIB);
        assert!(cap.admits(256 * KIB, 0));
        hold.saw_high(MS);
        assert!(!cap.admits(256 * KIB, MS), "2 MiB out: no more bulk");
        cap.left(1792 * KIB);
        assert!(cap.admits(256 * KIB, 2 * MS), "256 KiB + 256 KiB fits");
        cap.sent(256 * KIB);
        assert!(!cap.admits(4 * KIB, 2 * MS), "full to the byte");
        // The hold runs out 10 ms after the last HIGH slice that moved it:
        // one within a sixteenth of the hold does not.
        hold.saw_high(MS + MS / 2);
        assert!(!cap.admits(256 * KIB, 11 * MS - 1));
        assert!(cap.admits(256 * KIB, 11 * MS));
        assert!(cap.holds(11 * MS - 1) && !cap.holds(11 * MS));
        // Another HIGH slice holds it again.
        hold.saw_high(12 * MS);
        assert!(cap.holds(22 * MS - 1));
        hold.saw_high(13 * MS);
        assert!(cap.holds(23 * MS - 1) && !cap.holds(23 * MS));
        assert!(!cap.admits(256 * KIB, 12 * MS));
        assert_eq!(cap.on_wire(), 512 * KIB);
    }

    #[test]
    fn high_on_one_worker_caps_every_worker_s_bulk_each_within_its_own_bytes() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let (a, b) = (
            BulkCap::new(256 * KIB, hold.clone()),
            BulkCap::new(256 * KIB, hold.clone()),
        );
        a.sent(256 * KIB);
        b.sent(256 * KIB);
        assert!(a.admits(256 * KIB, 0) && b.admits(256 * KIB, 0));
        // HIGH seen by either worker holds both.
        hold.saw_high(0);
        assert!(!a.admits(4 * KIB, 1) && !b.admits(4 * KIB, 1));
        // One worker's bytes leaving frees that worker alone: neither
        // waits for the other's completions.
        a.left(256 * KIB);
        assert!(a.admits(256 * KIB, 1) && !b.admits(4 * KIB, 1));
    }

    #[test]
    fn a_slice_larger_than_the_cap_goes_onto_a_wire_with_no_bulk() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(64 * KIB, hold.clone());
        hold.saw_high(0);
        assert!(cap.admits(256 * KIB, 1));
        cap.sent(256 * KIB);
        assert!(!cap.admits(4 * KIB, 1));
        cap.left(256 * KIB);
        assert!(cap.admits(4 * KIB, 1));
    }

    #[test]
    fn no_limit_never_holds_bulk() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(0, hold.clone());
        hold.saw_high(0);
        assert!(!cap.holds(0));
        cap.sent(1 << 40);
        assert!(cap.admits(1 << 30, 0));
        cap.left(u64::MAX);
        assert_eq!(cap.on_wire(), 0, "leaving saturates at zero");
        // No hold time: HIGH never counts as flowing.
        let never = Arc::new(HighHold::default());
        never.saw_high(5);
        assert!(!BulkCap::new(64 * KIB, never).holds(5));
    }
}
