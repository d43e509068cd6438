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
//! connections, and the bulk already queued on its others goes first: a
//! bulk slice the cap turns away becomes the worker's waiter on the rail
//! when it is the oldest turned away, and no newer bulk slice goes before
//! it, on any connection, until it is sent, leaves its queue unsent or its
//! connection goes down ([`BulkCap::gone`]), or stops asking (it asks each
//! turn) for [`WAITER_TTL_NS`]. Bulk queued on a connection that ticks
//! late in the worker's turn is not passed over for ever by a connection
//! kept fed.
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
//! down: `TCP_USER_TIMEOUT` for bytes the target's kernel does not
//! acknowledge, else the stalled slices' deadlines. HIGH itself is not
//! held.

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

/// How long a waiter that stopped asking keeps newer bulk back (ns): a
/// refused slice asks every worker turn, and a worker with bulk in flight
/// parks 1 ms at most, so only a waiter whose connection stopped short of
/// asking (its own window full, a send still in progress) stays silent
/// this long; one that left is forgotten at once ([`BulkCap::gone`]).
const WAITER_TTL_NS: u64 = 5_000_000;

/// No waiter.
const NO_WAITER: u64 = u64::MAX;

/// One worker's cap on its bulk bytes on the wire to one peer over one
/// rail while HIGH flows there.
#[derive(Debug)]
pub(super) struct BulkCap {
    /// Bulk bytes on the wire while HIGH flows (0: no cap).
    limit: u64,
    hold: Arc<HighHold>,
    /// Bulk bytes on the wire over the worker's connections on the rail.
    /// Only the owning worker touches it and the two below (atomics so a
    /// connection may move between threads whole, as `Link` does).
    wire: AtomicU64,
    /// When the oldest bulk slice the cap turned away was posted
    /// ([`NO_WAITER`]: none): no newer one goes before it.
    waiter: AtomicU64,
    /// When the waiter last asked (the turn's clock).
    asked: AtomicU64,
}

impl BulkCap {
    /// A worker's cap of `limit` bytes (0: none) while `hold` says HIGH
    /// flows.
    pub(super) fn new(limit: u64, hold: Arc<HighHold>) -> BulkCap {
        BulkCap {
            limit,
            hold,
            wire: AtomicU64::new(0),
            waiter: AtomicU64::new(NO_WAITER),
            asked: AtomicU64::new(0),
        }
    }

    /// Does the cap hold bulk at `now` (set, and HIGH flowing)?
    #[inline]
    pub(super) fn holds(&self, now: u64) -> bool {
        self.limit != 0 && self.hold.flows(now)
    }

    /// May a bulk slice of `len` bytes, posted at `posted`, go on the wire
    /// at `now`? One turned away by the bytes becomes the waiter when it
    /// is the oldest turned away (or the waiter stopped asking), and asks
    /// again by asking here.
    #[inline]
    pub(super) fn admits(&self, len: u64, posted: u64, now: u64) -> bool {
        if !self.holds(now) {
            return true;
        }
        // Relaxed, here and below: the owning worker's state.
        let waiter = self.waiter.load(Ordering::Relaxed);
        let asking = now.saturating_sub(self.asked.load(Ordering::Relaxed)) <= WAITER_TTL_NS;
        let older_waits = asking && waiter < posted;
        let ok = admits(
            self.limit,
            self.wire.load(Ordering::Relaxed),
            len,
            older_waits,
        );
        if !ok && (posted <= waiter || !asking) {
            self.waiter.store(posted, Ordering::Relaxed);
            self.asked.store(now, Ordering::Relaxed);
        }
        ok
    }

    /// A bulk slice of `len` bytes, posted at `posted`, went on the wire.
    #[inline]
    pub(super) fn sent(&self, len: u64, posted: u64) {
        // Relaxed: the owning worker's count.
        let w = self.wire.load(Ordering::Relaxed);
        self.wire.store(w.saturating_add(len), Ordering::Relaxed);
        // The waiter went: the next oldest turned away asks next.
        self.gone(posted);
    }

    /// A bulk slice posted at `posted` left its queue without being sent
    /// (failed, stopped, out of patience), or its connection went down with
    /// it at the front: if it was the waiter, no newer bulk waits for it
    /// (one of the same time still queued asks again).
    #[inline]
    pub(super) fn gone(&self, posted: u64) {
        // Relaxed: the owning worker's state.
        if self.waiter.load(Ordering::Relaxed) == posted {
            self.waiter.store(NO_WAITER, Ordering::Relaxed);
        }
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

/// The rule while the cap holds: a bulk slice goes while the bulk on the
/// wire stays within `limit`, and always onto a wire with no bulk (so a
/// slice larger than the cap still moves), unless an older one the cap
/// turned away waits.
fn admits(limit: u64, wire: u64, len: u64, older_waits: bool) -> bool {
    !older_waits && (wire == 0 || wire.saturating_add(len) <= limit)
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
        cap.sent(2048 * KIB, 0);
        assert!(cap.admits(256 * KIB, 0, 0));
        hold.saw_high(MS);
        assert!(!cap.admits(256 * KIB, 0, MS), "2 MiB out: no more bulk");
        cap.left(1792 * KIB);
        assert!(cap.admits(256 * KIB, 0, 2 * MS), "256 KiB + 256 KiB fits");
        cap.sent(256 * KIB, 0);
        assert!(!cap.admits(4 * KIB, 0, 2 * MS), "full to the byte");
        // The hold runs out 10 ms after the last HIGH slice that moved it:
        // one within a sixteenth of the hold does not.
        hold.saw_high(MS + MS / 2);
        assert!(!cap.admits(256 * KIB, 0, 11 * MS - 1));
        assert!(cap.admits(256 * KIB, 0, 11 * MS));
        assert!(cap.holds(11 * MS - 1) && !cap.holds(11 * MS));
        // Another HIGH slice holds it again.
        hold.saw_high(12 * MS);
        assert!(cap.holds(22 * MS - 1));
        hold.saw_high(13 * MS);
        assert!(cap.holds(23 * MS - 1) && !cap.holds(23 * MS));
        assert!(!cap.admits(256 * KIB, 0, 12 * MS));
        assert_eq!(cap.on_wire(), 512 * KIB);
    }

    #[test]
    fn high_on_one_worker_caps_every_worker_s_bulk_each_within_its_own_bytes() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let (a, b) = (
            BulkCap::new(256 * KIB, hold.clone()),
            BulkCap::new(256 * KIB, hold.clone()),
        );
        a.sent(256 * KIB, 0);
        b.sent(256 * KIB, 0);
        assert!(a.admits(256 * KIB, 0, 0) && b.admits(256 * KIB, 0, 0));
        // HIGH seen by either worker holds both.
        hold.saw_high(0);
        assert!(!a.admits(4 * KIB, 0, 1) && !b.admits(4 * KIB, 0, 1));
        // One worker's bytes leaving frees that worker alone: neither
        // waits for the other's completions.
        a.left(256 * KIB);
        assert!(a.admits(256 * KIB, 0, 1) && !b.admits(4 * KIB, 0, 1));
    }

    #[test]
    fn a_slice_larger_than_the_cap_goes_onto_a_wire_with_no_bulk() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(64 * KIB, hold.clone());
        hold.saw_high(0);
        assert!(cap.admits(256 * KIB, 0, 1));
        cap.sent(256 * KIB, 0);
        assert!(!cap.admits(4 * KIB, 0, 1));
        cap.left(256 * KIB);
        assert!(cap.admits(4 * KIB, 0, 1));
    }

    #[test]
    fn no_limit_never_holds_bulk() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(0, hold.clone());
        hold.saw_high(0);
        assert!(!cap.holds(0));
        cap.sent(1 << 40, 0);
        assert!(cap.admits(1 << 30, 0, 0));
        cap.left(u64::MAX);
        assert_eq!(cap.on_wire(), 0, "leaving saturates at zero");
        // No hold time: HIGH never counts as flowing.
        let never = Arc::new(HighHold::default());
        never.saw_high(5);
        assert!(!BulkCap::new(64 * KIB, never).holds(5));
    }

    #[test]
    fn an_older_slice_turned_away_goes_before_newer_bulk_even_onto_an_empty_wire() {
        let hold = Arc::new(HighHold::new(10 * MS));
        let cap = BulkCap::new(256 * KIB, hold.clone());
        hold.saw_high(0);
        let now = MS;
        cap.sent(256 * KIB, 1);
        // Posted at 10 and at 20 (on two connections): both turned away;
        // the older one waits.
        assert!(!cap.admits(256 * KIB, 10, now));
        assert!(!cap.admits(256 * KIB, 20, now));
        cap.left(256 * KIB);
        // The wire is empty, but the one posted at 20 is newer than the
        // waiter: it waits its turn, whichever connection asks first.
        assert!(!cap.admits(256 * KIB, 20, now + 1));
        assert!(cap.admits(256 * KIB, 10, now + 1));
        cap.sent(256 * KIB, 10);
        // The waiter went: the one posted at 20 is turned away by the
        // bytes now, and waits in turn.
        assert!(!cap.admits(256 * KIB, 30, now + 2));
        assert!(!cap.admits(256 * KIB, 20, now + 2));
        cap.left(256 * KIB);
        assert!(!cap.admits(256 * KIB, 30, now + 3));
        assert!(cap.admits(256 * KIB, 20, now + 3));
        // Slices posted in one turn share their time: the waiter holds
        // back newer ones, not another of its own time.
        cap.sent(256 * KIB, 20);
        assert!(!cap.admits(128 * KIB, 40, now + 4));
        cap.left(256 * KIB);
        assert!(!cap.admits(128 * KIB, 41, now + 5));
        assert!(cap.admits(128 * KIB, 40, now + 5));
        assert!(!cap.admits(128 * KIB, 41, now + 5), "the waiter is not sent yet");
        cap.sent(128 * KIB, 40);
        assert!(cap.admits(128 * KIB, 41, now + 5));
    }

    /// A cap of 256 KiB with HIGH flowing for 100 ms, an empty wire, and
    /// a slice posted at 10 turned away at 1 ms: its waiter.
    fn waiting_since_1_ms() -> BulkCap {
        let hold = Arc::new(HighHold::new(100 * MS));
        let cap = BulkCap::new(256 * KIB, hold.clone());
        hold.saw_high(0);
        cap.sent(256 * KIB, 1);
        assert!(!cap.admits(256 * KIB, 10, MS));
        cap.left(256 * KIB);
        cap
    }

    #[test]
    fn a_waiter_that_left_its_queue_unsent_holds_nothing_back() {
        let cap = waiting_since_1_ms();
        assert!(!cap.admits(256 * KIB, 20, MS + 1), "the waiter at 10 first");
        // Stopped (or failed, or its connection went down): gone at once,
        // not after its silence.
        cap.gone(10);
        assert!(cap.admits(256 * KIB, 20, MS + 1));
        // Another slice's leaving does not forget the waiter.
        cap.sent(256 * KIB, 20);
        assert!(!cap.admits(256 * KIB, 30, MS + 2));
        cap.left(256 * KIB);
        cap.gone(29);
        assert!(!cap.admits(256 * KIB, 31, MS + 3));
        assert!(cap.admits(256 * KIB, 30, MS + 3));
    }

    #[test]
    fn a_waiter_that_stops_asking_is_forgotten() {
        let cap = waiting_since_1_ms();
        // Its connection went down and it never asks again: newer bulk
        // waits for it only as long as a waiter that still asks could be
        // silent.
        assert!(!cap.admits(256 * KIB, 20, MS + WAITER_TTL_NS));
        assert!(cap.admits(256 * KIB, 20, MS + WAITER_TTL_NS + 1));
        // Asking keeps it: turned away at 5 ms and again at 9 ms, it still
        // holds newer bulk back at 13 ms.
        cap.sent(256 * KIB, 20);
        assert!(!cap.admits(256 * KIB, 30, 5 * MS + WAITER_TTL_NS));
        assert!(!cap.admits(256 * KIB, 30, 9 * MS + WAITER_TTL_NS));
        cap.left(256 * KIB);
        assert!(!cap.admits(256 * KIB, 40, 13 * MS + WAITER_TTL_NS));
        assert!(cap.admits(256 * KIB, 30, 13 * MS + WAITER_TTL_NS));
        // Without HIGH there is no cap, and no waiting.
        let idle = BulkCap::new(256 * KIB, Arc::new(HighHold::new(MS)));
        idle.sent(256 * KIB, 1);
        assert!(idle.admits(256 * KIB, 2, 0));
    }
}
