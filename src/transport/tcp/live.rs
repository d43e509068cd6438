//! The target's served connections as one table ([`Live`]): what the
//! accept threads admit into, what a full server picks its eviction victim
//! from, and what a [`Fence`] finds the connections it supersedes in.
//!
//! A connection is served by one serving thread ([`station`](super::station))
//! and seen from others only through its [`Slot`]: its stage, when it last
//! served a request, its initiator's ident, and the two flags of the fence
//! handshake (`writing`, `fenced`). The slot owns the socket, so a
//! `shutdown` from another thread (eviction, a fence) never reaches a
//! descriptor number that was closed and reused.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::frame::{Fence, Ident};
use crate::clock::monotonic_ns;

/// A connection still in its handshake this long may be evicted (a real
/// initiator's handshake takes a round trip or two).
const EVICT_HANDSHAKE_AGE: Duration = Duration::from_secs(1);
/// A connection past its handshake that has served no request (however
/// many it was refused) may be evicted this long after its handshake.
const EVICT_UNUSED_AGE: Duration = Duration::from_secs(1);
/// A connection that has served requests may be evicted for a newcomer
/// once none has been served for this long: longer than an initiator lets
/// its own connection idle before it reconnects first
/// (`op::RECONNECT_IDLE`), so an eviction never races a request. A
/// refused request is no use: a peer that sends nothing but requests for
/// keys it lacks holds its connection no longer than one that is silent.
const EVICT_UNSERVED: Duration = Duration::from_secs(30);

/// Where a connection is in its life (eviction order: lowest first).
pub(super) const STAGE_HANDSHAKE: u8 = 0;
pub(super) const STAGE_READY: u8 = 1;
pub(super) const STAGE_SERVING: u8 = 2;

/// One served connection as every thread sees it.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) id: usize,
    /// The socket (closed when the last holder of the slot lets go).
    pub(super) stream: TcpStream,
    pub(super) stage: AtomicU8,
    /// When it was accepted.
    pub(super) born: Instant,
    /// When (`clock::monotonic_ns`) it last served a request, or finished
    /// its handshake if it has served none; what eviction goes by.
    pub(super) served_ns: AtomicU64,
    /// Who its initiator's hello said it is (set before the hello reply).
    pub(super) ident: OnceLock<Ident>,
    /// Its serving thread may be writing a WRITE payload into region
    /// memory (a copy, or a `recv` in the kernel).
    pub(super) writing: AtomicBool,
    /// Superseded (fenced or evicted): it may write no more into region
    /// memory. Its slot stays in [`Live`] until its serving thread has
    /// reaped its last operation, so a fence still finds (and waits for)
    /// it.
    pub(super) fenced: AtomicBool,
    /// Fenced by a fence (not evicted): its peer is told so
    /// ([`Fenced`](super::frame::Fenced)) before it closes. Set before
    /// `fenced`.
    pub(super) notice: AtomicBool,
}

impl Slot {
    /// How long it has gone without serving a request, at `now`.
    fn unserved(&self, now: u64) -> Duration {
        Duration::from_nanos(now.saturating_sub(self.served_ns.load(Ordering::Relaxed)))
    }

    /// Served a request just now (or finished its handshake).
    pub(super) fn served(&self) {
        self.served_ns.store(monotonic_ns(), Ordering::Relaxed);
    }
}

/// The connections being served.
#[derive(Debug)]
pub(super) struct Live {
    /// Served at once, at most.
    max: usize,
    next: AtomicUsize,
    pub(super) conns: Mutex<Vec<Arc<Slot>>>,
}

impl Live {
    /// A table for up to `max` connections.
    pub(super) fn new(max: usize) -> Live {
        Live {
            max: max.max(1),
            next: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
        }
    }

    /// The most connections served at once.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Track `s`, evicting a victim first when full; `Err` gives `s` back:
    /// no room.
    pub(super) fn admit(&self, s: TcpStream) -> std::result::Result<Arc<Slot>, TcpStream> {
        let mut conns = self.conns.lock();
        // Superseded connections are closing: they hold no room (their
        // serving threads drop them within the stall limit).
        let open = conns
            .iter()
            .filter(|c| !c.fenced.load(Ordering::Relaxed))
            .count();
        if open >= self.max {
            let Some(victim) = Self::victim(&conns) else {
                return Err(s);
            };
            Self::evict(&conns[victim], "tcp data server full: evicted a connection");
        }
        let slot = Arc::new(Slot {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            stream: s,
            stage: AtomicU8::new(STAGE_HANDSHAKE),
            born: Instant::now(),
            served_ns: AtomicU64::new(monotonic_ns()),
            ident: OnceLock::new(),
            writing: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            notice: AtomicBool::new(false),
        });
        conns.push(slot.clone());
        Ok(slot)
    }

    /// Out of descriptors: evict a connection [`Live::victim`] names, so
    /// its descriptor comes free once its serving thread lets go of it.
    /// Whether there was one.
    pub(super) fn evict_one(&self) -> bool {
        let conns = self.conns.lock();
        let Some(victim) = Self::victim(&conns) else {
            return false;
        };
        Self::evict(
            &conns[victim],
            "tcp data server out of file descriptors: evicted a connection",
        );
        true
    }

    /// Mark `v` fenced, then shut its socket down (its serving thread
    /// closes it). It writes nothing more (see `station`).
    fn evict(v: &Slot, why: &'static str) {
        v.fenced.store(true, Ordering::SeqCst);
        let _ = v.stream.shutdown(std::net::Shutdown::Both);
        tracing::debug!(
            stage = v.stage.load(Ordering::Relaxed),
            unserved_ms = v.unserved(monotonic_ns()).as_millis() as u64,
            "{why}"
        );
    }

    /// Unproven (mid-handshake for [`EVICT_HANDSHAKE_AGE`]) first, then
    /// one that has served no request (for [`EVICT_UNUSED_AGE`] since its
    /// handshake, however many it was refused), then the one unserved
    /// longest past [`EVICT_UNSERVED`]; oldest first among equals. A
    /// connection that an initiator is using right now is never one of
    /// them.
    pub(super) fn victim(conns: &[Arc<Slot>]) -> Option<usize> {
        let now = monotonic_ns();
        conns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.fenced.load(Ordering::Relaxed))
            .filter(|(_, c)| match c.stage.load(Ordering::Relaxed) {
                STAGE_HANDSHAKE => c.born.elapsed() >= EVICT_HANDSHAKE_AGE,
                STAGE_READY => c.unserved(now) >= EVICT_UNUSED_AGE,
                _ => c.unserved(now) >= EVICT_UNSERVED,
            })
            .min_by_key(|(_, c)| {
                (
                    c.stage.load(Ordering::Relaxed),
                    std::cmp::Reverse(c.unserved(now)),
                    c.id,
                )
            })
            .map(|(i, _)| i)
    }

    /// Start serving `fence` from connection `me`: every other connection
    /// registered under `me`'s session and the fence's connection id is
    /// marked fenced, its receiving side shut down, and returned. The fence is served once
    /// none of them is [`Slot::writing`] (see [`all_still`]); any later
    /// byte of theirs is refused. A peer can fence only its own session's
    /// connections; a connection already gone needs nothing.
    pub(super) fn fence(
        &self,
        me: &Slot,
        fence: Fence,
    ) -> std::result::Result<Vec<Arc<Slot>>, String> {
        let Some(&mine) = me.ident.get() else {
            return Err("fence before a hello".into());
        };
        let who = Ident {
            session: mine.session,
            conn: fence.conn,
        };
        let victims: Vec<Arc<Slot>> = self
            .conns
            .lock()
            .iter()
            .filter(|c| c.id != me.id && c.ident.get() == Some(&who))
            .cloned()
            .collect();
        for v in &victims {
            v.notice.store(true, Ordering::Relaxed);
            // SeqCst, paired with the serving thread's SeqCst store of
            // `writing` then load of `fenced`: either it sees the mark and
            // writes nothing, or we see it writing and wait.
            v.fenced.store(true, Ordering::SeqCst);
            // Ends a payload `recv` at once (what was already received
            // still lands, before `writing` clears). The sending side
            // stays open: its serving thread tells the peer it was fenced.
            let _ = v.stream.shutdown(std::net::Shutdown::Read);
        }
        // A peer may send fences at will: a line per cause, then counts.
        crate::lograte::log_limited!(
            debug,
            victims.len().min(2),
            conn = fence.conn,
            fenced = victims.len(),
            "tcp data connection fenced"
        );
        Ok(victims)
    }

    /// Its serving thread is done with connection `id`.
    pub(super) fn remove(&self, id: usize) {
        self.conns.lock().retain(|c| c.id != id);
    }

    /// Shut every connection down (the server stops).
    pub(super) fn shut_all(&self) {
        for c in self.conns.lock().iter() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Whether none of `victims` is inside a write into region memory any
/// more (their later bytes are refused: they are fenced).
pub(super) fn all_still(victims: &[Arc<Slot>]) -> bool {
    victims.iter().all(|v| !v.writing.load(Ordering::SeqCst))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::super::frame::SESSION_LEN;
    use super::*;

    const S1: [u8; SESSION_LEN] = [0x51; SESSION_LEN];

    #[test]
    fn an_evicted_connection_is_fenced_and_a_fence_waits_for_its_write() {
        let live = Live::new(1);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dial = || TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let old = live.admit(dial()).unwrap();
        old.ident
            .set(Ident {
                session: S1,
                conn: 1,
            })
            .unwrap();
        old.stage.store(STAGE_READY, Ordering::Relaxed);
        old.served_ns
            .store(monotonic_ns() - 2_000_000_000, Ordering::Relaxed);
        // Its serving thread took a request queued before the eviction and
        // is inside the payload's `recv` into region memory.
        old.writing.store(true, Ordering::SeqCst);
        let _newcomer = live.admit(dial()).unwrap();
        assert!(
            old.fenced.load(Ordering::SeqCst),
            "an evicted connection may still write into region memory"
        );
        // A later connection of its initiator fences it: that must wait
        // until the evicted one is out of its write.
        let roomy = Live::new(8);
        let old2 = roomy.admit(dial()).unwrap();
        old2.ident
            .set(Ident {
                session: S1,
                conn: 1,
            })
            .unwrap();
        old2.writing.store(true, Ordering::SeqCst);
        let me = roomy.admit(dial()).unwrap();
        me.ident
            .set(Ident {
                session: S1,
                conn: 2,
            })
            .unwrap();
        let victims = roomy.fence(&me, Fence { conn: 1 }).unwrap();
        assert_eq!(victims.len(), 1);
        assert!(old2.fenced.load(Ordering::SeqCst));
        assert!(
            !all_still(&victims),
            "a fence passed a connection still writing"
        );
        old2.writing.store(false, Ordering::Release);
        assert!(all_still(&victims));
        roomy.remove(old2.id);
        assert!(roomy.fence(&me, Fence { conn: 1 }).unwrap().is_empty());
    }

    #[test]
    fn a_full_table_with_every_connection_in_use_admits_no_one() {
        let live = Live::new(1);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dial = || TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let busy = live.admit(dial()).unwrap();
        busy.stage.store(STAGE_SERVING, Ordering::Relaxed);
        busy.served();
        assert!(live.admit(dial()).is_err());
        assert!(!busy.fenced.load(Ordering::Relaxed));
    }
}
