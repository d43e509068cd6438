//! What a daemon client's ring may name: its own regions (tagged with its
//! id, `MemRegion::client`) and the segments it opened through the daemon.
//! The worker checks both for every SQE of an attached ring
//! (`Views::accept`), so a client naming another's region or segment gets
//! a typed error and touches nothing of theirs. The scope also carries what
//! the workers count for the client and what it holds at the daemon: the
//! daemon's `/metrics` and `/health` by client.

use std::sync::Weak;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use tent_rings::{Priority, SegmentId};

use crate::metrics::ClientSnapshot;
use crate::qos::ClientShare;

use crate::error::{Error, ErrorKind, Result};

/// Segments one client may have open at once.
pub(crate) const MAX_CLIENT_SEGMENTS: usize = 64;

/// One client's scope, shared by the daemon (which adds and removes its
/// segments) and the workers serving its rings (which read it).
#[derive(Debug)]
pub(crate) struct ClientScope {
    id: u32,
    /// Open segments' ids; 0: a free slot.
    segments: [AtomicU64; MAX_CLIENT_SEGMENTS],
    /// Its SQEs taken by workers and not yet completed, over all its rings
    /// and workers, and the most it may have: past it its rings wait, so
    /// one client cannot fill a worker's task table for every other.
    in_flight: AtomicU32,
    max_in_flight: u32,
    /// Who it is, for the reports.
    who: ClientId,
    /// What the workers counted for it (each a relaxed add).
    counts: ClientCounts,
    /// What it holds at the daemon (the daemon's thread for it stores).
    held: ClientHeld,
    /// Its weight and work taken, for its fair share within a priority.
    share: ClientShare,
}

/// Who a client is, as the reports label it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientId {
    pub(crate) uid: u32,
    pub(crate) pid: u32,
    /// The name it gave at attach (`daemon_client_name`; empty: none).
    pub(crate) name: String,
}

/// What the workers counted for one client.
#[derive(Debug, Default)]
struct ClientCounts {
    completed: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    /// Per priority: ops whose first slice went out, and the ns they
    /// waited from intake to then.
    waits: [AtomicU64; 3],
    wait_ns: [AtomicU64; 3],
}

/// What one client holds at the daemon.
#[derive(Debug, Default)]
pub(crate) struct ClientHeld {
    pub(crate) regions: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) rings: AtomicU64,
}

/// The clients a daemon's engine serves now, for its reports: at most
/// `DaemonLimits::clients` of them (a departed one's entry goes with it),
/// so their label sets are bounded.
#[derive(Debug, Default)]
pub(crate) struct ClientRegistry {
    clients: Mutex<Vec<Weak<ClientScope>>>,
}

impl ClientRegistry {
    /// Report `scope` from now on, while it lives.
    pub(crate) fn add(&self, scope: &std::sync::Arc<ClientScope>) {
        let mut c = self.clients.lock();
        c.retain(|w| w.strong_count() > 0);
        c.push(std::sync::Arc::downgrade(scope));
    }

    /// Every live client's figures, by id.
    pub(crate) fn snapshot(&self) -> Vec<ClientSnapshot> {
        let mut out: Vec<ClientSnapshot> = self
            .clients
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.snapshot())
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}

impl ClientScope {
    /// The scope of client `id` (non-zero), with no segment, at most
    /// `max_in_flight` (at least 1) of its ops in flight.
    #[cfg(test)]
    pub(crate) fn new(id: u32, max_in_flight: u32) -> ClientScope {
        ClientScope::of(id, max_in_flight, ClientId::default(), 1)
    }

    /// The scope of client `id` (non-zero) of process `who`, with no
    /// segment, at most `max_in_flight` (at least 1) of its ops in flight,
    /// sharing work by `weight` (at least 1) with the other clients.
    pub(crate) fn of(id: u32, max_in_flight: u32, who: ClientId, weight: u32) -> ClientScope {
        assert_ne!(id, 0, "client 0 is the daemon's own process");
        ClientScope {
            id,
            segments: std::array::from_fn(|_| AtomicU64::new(0)),
            in_flight: AtomicU32::new(0),
            max_in_flight: max_in_flight.max(1),
            who,
            counts: ClientCounts::default(),
            held: ClientHeld::default(),
            share: ClientShare::new(weight),
        }
    }

    /// The name it gave at attach (empty: none).
    pub(crate) fn name(&self) -> &str {
        &self.who.name
    }

    /// Its weight and work taken (`qos::fair`).
    #[inline]
    pub(crate) fn share(&self) -> &ClientShare {
        &self.share
    }

    /// One of its ops ended with `res` (a worker posting its CQE); its
    /// share of ops in flight is given back.
    #[inline]
    pub(crate) fn completed_with(&self, res: std::result::Result<u64, ErrorKind>) {
        self.completed();
        let c = &self.counts;
        match res {
            Ok(n) => {
                c.completed.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(n, Ordering::Relaxed);
            }
            Err(_) => {
                c.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One of its ops of priority `p` had its first slice posted after
    /// waiting `ns` since intake.
    #[inline]
    pub(crate) fn waited(&self, p: Priority, ns: u64) {
        let i = p.index();
        self.counts.waits[i].fetch_add(1, Ordering::Relaxed);
        self.counts.wait_ns[i].fetch_add(ns, Ordering::Relaxed);
    }

    /// What it holds at the daemon, for the daemon to store.
    pub(crate) fn held(&self) -> &ClientHeld {
        &self.held
    }

    /// Its figures now.
    pub(crate) fn snapshot(&self) -> ClientSnapshot {
        let c = &self.counts;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientSnapshot {
            id: self.id,
            uid: self.who.uid,
            pid: self.who.pid,
            name: self.who.name.clone(),
            weight: self.share.weight(),
            completed: r(&c.completed),
            failed: r(&c.failed),
            bytes: r(&c.bytes),
            waits: std::array::from_fn(|i| r(&c.waits[i])),
            wait_ns: std::array::from_fn(|i| r(&c.wait_ns[i])),
            in_flight: u64::from(self.in_flight.load(Ordering::Relaxed)),
            max_in_flight: u64::from(self.max_in_flight),
            regions: r(&self.held.regions),
            held_bytes: r(&self.held.bytes),
            rings: r(&self.held.rings),
            segments: self
                .segments
                .iter()
                .filter(|s| s.load(Ordering::Relaxed) != 0)
                .count() as u64,
        }
    }

    /// Take one more of its SQEs, if it is under its share (a worker's
    /// intake; the CQE gives it back, `completed`).
    #[inline]
    pub(crate) fn try_take(&self) -> bool {
        // Relaxed: a count, not a publication; two workers racing past
        // the bound by one each is harmless.
        if self.in_flight.load(Ordering::Relaxed) >= self.max_in_flight {
            return false;
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One of its ops completed.
    #[inline]
    pub(crate) fn completed(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Its id: the tag of its regions.
    #[inline]
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// May its ring name `segment`? Never the engine's own (the local
    /// segment holds every client's memory).
    #[inline]
    pub(crate) fn allows(&self, segment: SegmentId) -> bool {
        segment != SegmentId::LOCAL
            // Acquire: pairs with `add`, so a segment seen here is one the
            // daemon opened before it answered the client.
            && self
                .segments
                .iter()
                .any(|s| s.load(Ordering::Acquire) == segment.0)
    }

    /// Let it name `segment` (the daemon opened it for this client);
    /// `OutOfMemory` past [`MAX_CLIENT_SEGMENTS`].
    pub(crate) fn add(&self, segment: SegmentId) -> Result<()> {
        if self.allows(segment) {
            return Ok(());
        }
        for s in &self.segments {
            if s.compare_exchange(0, segment.0, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
        }
        Err(Error::new(
            ErrorKind::OutOfMemory,
            format!("a client may have {MAX_CLIENT_SEGMENTS} segments open"),
        ))
    }

    /// It may name `segment` no more (it closed it). An SQE a worker took
    /// before keeps running: the segment's close waits for it.
    pub(crate) fn remove(&self, segment: SegmentId) {
        for s in &self.segments {
            if s.compare_exchange(segment.0, 0, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_names_only_the_segments_added_for_it_and_never_the_local_one() {
        let s = ClientScope::new(3, 8);
        let seg = SegmentId(0x1234);
        assert!(!s.allows(seg));
        s.add(seg).unwrap();
        assert!(s.allows(seg));
        s.add(seg).unwrap();
        let slots = |id: u64| {
            s.segments
                .iter()
                .filter(|x| x.load(Ordering::Relaxed) == id)
                .count()
        };
        assert_eq!(slots(seg.0), 1, "added once");
        assert!(!s.allows(SegmentId::LOCAL));
        s.remove(seg);
        assert!(!s.allows(seg), "removed");
        assert_eq!(slots(seg.0), 0);
        for i in 0..MAX_CLIENT_SEGMENTS as u64 {
            s.add(SegmentId(0x1000_0000 + i)).unwrap();
        }
        assert_eq!(
            s.add(SegmentId(0x2000_0000)).unwrap_err().kind(),
            ErrorKind::OutOfMemory
        );
    }

    #[test]
    fn a_client_s_ops_in_flight_stop_at_its_share_and_come_back_with_completions() {
        let s = ClientScope::new(1, 2);
        assert!(s.try_take() && s.try_take());
        assert!(!s.try_take(), "at its share");
        s.completed();
        assert!(s.try_take());
        assert!(!s.try_take());
    }
}
