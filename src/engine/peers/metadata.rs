//! The metadata thread: one per engine, off the workers. It
//!
//! - with etcd, keeps this engine's record published (a lease renewed
//!   every third of its TTL, granted anew and the record put again when it
//!   lapsed), watches every record, and acts on what the watch says about
//!   peers this engine has open: a record deleted (lease expired or
//!   revoked) marks the peer gone, a record with another incarnation
//!   replaces the segment with the new process's;
//! - in either mode, checks the peers the workers suspect (a request
//!   failed `ProcessFailed` or `Unreachable`): it asks who answers under
//!   the name now and replaces the segment when another incarnation does,
//!   or clears the suspicion when the same one does;
//! - lets go of replaced segments once no worker holds them.
//!
//! etcd lost is said once; open segments keep serving (nothing on the
//! data path needs etcd), new opens fail until it returns; then the lease
//! is granted again, the record put again and the watch resynced from a
//! fresh read of every record, so nothing that changed meanwhile is
//! missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::SegmentId;

use super::{Peers, Replace};
use crate::control::directory::etcd::{Change, Publication, Record, Step};
use crate::control::directory::{EtcdDirectory, Located};
use crate::control::etcd::{EtcdError, Watch};
use crate::error::{Error, Result};
use crate::segment::{PeerState, Segment, SegmentKind};

/// How long the thread sleeps (or waits on the watch) per turn: the
/// bound on how late a stop, a suspect check or a renewal is.
const TICK: Duration = Duration::from_millis(50);
/// How soon a suspect peer is asked first, and the most between two asks
/// of one that does not answer (doubling in between).
const FIRST_CHECK: Duration = Duration::from_millis(20);
const MAX_CHECK_GAP: Duration = Duration::from_secs(2);
/// The least between two asks of a peer that answered: requests failing
/// over and over (an application naming an address nobody registered)
/// cost its control server at most ten lookups a second.
const SETTLED_GAP: Duration = Duration::from_millis(100);

/// When to ask about a suspect peer next, after an ask at `now` that
/// settled it or not, the previous gap being `gap`: the next ask and gap.
fn next_check(settled: bool, gap: Duration, now: Instant) -> (Instant, Duration) {
    if settled {
        (now + SETTLED_GAP, FIRST_CHECK)
    } else {
        let gap = (gap * 2).min(MAX_CHECK_GAP);
        (now + gap, gap)
    }
}
/// Between two attempts to reach a lost etcd.
const RECONNECT_GAP: Duration = Duration::from_secs(1);

/// The running thread; dropping it stops it, and with etcd revokes the
/// lease (peers see this engine gone at once, not a TTL later).
pub(in crate::engine) struct MetadataThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl MetadataThread {
    /// Start it for `peers`; `record` is what to publish under `key` (etcd).
    pub(in crate::engine) fn start(
        peers: Arc<Peers>,
        publish: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<MetadataThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let now = Instant::now();
        let publication = match (peers.directory().etcd(), publish) {
            (Some(dir), Some((key, value))) => {
                let mut p = Publication::new(key, value, dir.ttl(), now);
                // Published before the engine is handed out: a peer that
                // looks this engine up right after finds it.
                publish_now(dir, &mut p, now).map_err(|e| dir.lost(e))?;
                Some(p)
            }
            _ => None,
        };
        let mut tending = Tending {
            peers,
            publication,
            watch: None,
            lost: false,
            reconnect_at: now,
            checks: HashMap::new(),
        };
        let peers = tending.peers.clone();
        if let Some(dir) = peers.directory().etcd() {
            // Watching before the engine is handed out: a peer it opens
            // right after is covered.
            tending.resync(dir, now);
        }
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("tent-metadata".into())
            .spawn(move || tending.run(&flag))
            .map_err(|e| Error::invalid("metadata thread").with_source(e))?;
        Ok(MetadataThread {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for MetadataThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Grant a lease and put the record with it.
fn publish_now(
    dir: &EtcdDirectory,
    p: &mut Publication,
    now: Instant,
) -> std::result::Result<(), EtcdError> {
    let client = match dir.client() {
        Some(c) => c,
        None => dir.reconnect()?,
    };
    let (lease, _) = client.grant(p.ttl())?;
    client.put(p.key(), p.value(), Some(lease))?;
    p.renewed(lease, now);
    Ok(())
}

/// The thread's state.
struct Tending {
    peers: Arc<Peers>,
    publication: Option<Publication>,
    watch: Option<Watch>,
    /// etcd is lost (said once, until it returns).
    lost: bool,
    reconnect_at: Instant,
    /// Per suspect or gone segment: when to ask next, and the gap after.
    checks: HashMap<SegmentId, (Instant, Duration)>,
}

impl Tending {
    fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let mut waited = false;
            let peers = self.peers.clone();
            if let Some(dir) = peers.directory().etcd() {
                self.tend_etcd(dir, now);
                waited = self.read_watch(dir);
            }
            if !waited {
                std::thread::sleep(TICK);
            }
            self.check_suspects(Instant::now());
            self.peers.release_replaced();
        }
        // Peers see this engine leave now rather than at its lease's expiry.
        if let (Some(dir), Some(lease)) = (
            self.peers.directory().etcd(),
            self.publication.as_ref().and_then(Publication::lease),
        ) && let Some(client) = dir.client()
        {
            let _ = client.revoke(lease);
        }
    }

    /// Reach etcd when lost, keep the record published, and watch.
    fn tend_etcd(&mut self, dir: &EtcdDirectory, now: Instant) {
        if dir.client().is_none() {
            if now < self.reconnect_at {
                return;
            }
            self.reconnect_at = now + RECONNECT_GAP;
            if dir.reconnect().is_err() {
                return;
            }
            tracing::info!(
                endpoint = dir
                    .client()
                    .map(|c| c.endpoint().to_owned())
                    .unwrap_or_default(),
                "etcd metadata store reached again: republishing and resyncing"
            );
            self.lost = false;
        }
        if let Some(p) = &mut self.publication {
            let result = match p.due(now) {
                Step::Wait(_) => Ok(()),
                Step::Publish => {
                    let r = publish_now(dir, p, now);
                    if r.is_ok() {
                        tracing::info!(key = %String::from_utf8_lossy(p.key()), "segment record published in etcd");
                    }
                    r
                }
                Step::Renew(lease) => match dir.client().map(|c| c.keep_alive(lease)) {
                    Some(Ok(_)) => {
                        p.renewed(lease, now);
                        Ok(())
                    }
                    Some(Err(EtcdError::LeaseGone(_))) => {
                        tracing::warn!(key = %String::from_utf8_lossy(p.key()), "this engine's etcd lease lapsed: publishing its record again (peers saw it gone meanwhile)");
                        p.lapsed();
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    None => Ok(()),
                },
            };
            if let Err(e) = result {
                self.lose(dir, e, now);
                return;
            }
        }
        if self.watch.is_none() {
            self.resync(dir, now);
        }
    }

    /// Read every record, act on what changed for the peers open here,
    /// and watch from the read's revision on.
    fn resync(&mut self, dir: &EtcdDirectory, now: Instant) {
        let Some(client) = dir.client() else {
            return;
        };
        let watched = dir.snapshot(&client).and_then(|(records, revision)| {
            let watch = dir.watch(&client, revision + 1)?;
            Ok((records, watch))
        });
        match watched {
            Ok((records, watch)) => {
                self.watch = Some(watch);
                let open: Vec<Arc<Segment>> = self.store_segments();
                for seg in open {
                    let record = records
                        .iter()
                        .find(|(n, _)| n == seg.name())
                        .map(|(_, r)| r.clone());
                    self.on_record(&seg, record);
                }
            }
            Err(e) => self.lose(dir, e, now),
        }
    }

    /// Wait on the watch for up to a tick and apply what it says; false
    /// when there is no watch to wait on.
    fn read_watch(&mut self, dir: &EtcdDirectory) -> bool {
        let Some(watch) = &mut self.watch else {
            return false;
        };
        match watch.next(TICK) {
            Ok(None) => {}
            Ok(Some(event)) => {
                if let Some(Change { name, record }) = dir.change(&event) {
                    for seg in self.store_segments() {
                        if seg.name() == name {
                            self.on_record(&seg, record.clone());
                        }
                    }
                }
            }
            Err(e) => {
                // Resync (range, then watch again) on the next turn.
                self.watch = None;
                tracing::debug!(error = %e, "etcd watch ended");
            }
        }
        true
    }

    /// etcd failed: a refusal is logged; a lost store is said once, and
    /// reached again later.
    fn lose(&mut self, dir: &EtcdDirectory, e: EtcdError, now: Instant) {
        self.watch = None;
        let kind = e.kind();
        if matches!(
            kind,
            tent_rings::ErrorKind::Unreachable | tent_rings::ErrorKind::Timeout
        ) {
            dir.disconnect();
            self.reconnect_at = now + RECONNECT_GAP;
            if !self.lost {
                self.lost = true;
                tracing::warn!(error = %dir.lost(e), "etcd metadata store lost: open segments keep serving, new opens fail until it returns; this engine's record lapses if it stays away past the lease TTL");
            }
        } else {
            crate::lograte::warn_limited!((kind.code(), "etcd"), error = %e, "etcd refused a metadata request");
        }
    }

    /// The open segments a store named, whose records speak for them.
    fn store_segments(&self) -> Vec<Arc<Segment>> {
        self.peers
            .shared
            .segments
            .load()
            .iter()
            .filter(|s| s.via_store())
            .cloned()
            .collect()
    }

    /// `seg`'s record now says `record` (`None`: deleted, its owner's
    /// lease expired or was revoked).
    fn on_record(&mut self, seg: &Arc<Segment>, record: Option<Record>) {
        match record {
            None => self
                .peers
                .mark_gone(seg, "its record left etcd (lease expired or revoked)"),
            Some(r) => {
                let same = seg.incarnation() == Some(r.incarnation);
                if same && seg.peer_state() != PeerState::Gone {
                    return;
                }
                let why = match same {
                    true => Replace::Returned,
                    false => Replace::Restarted,
                };
                if !same {
                    // Whatever was in flight went to the old process.
                    self.peers
                        .mark_gone(seg, "another incarnation published its name");
                }
                if let Err(e) = self.peers.replace(seg, why) {
                    tracing::info!(segment = seg.name(), error = %e, "the peer's new process does not answer yet: trying again");
                    self.checks.insert(seg.id(), (Instant::now(), FIRST_CHECK));
                }
            }
        }
    }

    /// Ask who answers under the name of each suspect segment (and each
    /// gone one that may have come back) that is due.
    fn check_suspects(&mut self, now: Instant) {
        let table = self.peers.shared.segments.load_full();
        // A peer that answered is remembered a while, so a new suspicion
        // waits out SETTLED_GAP.
        self.checks.retain(|id, (at, _)| {
            table
                .get(*id)
                .is_some_and(|s| s.peer_state() != PeerState::Serving || now < *at + MAX_CHECK_GAP)
        });
        for seg in table.iter() {
            let state = seg.peer_state();
            if state == PeerState::Serving || seg.control().is_none() {
                continue;
            }
            let (at, gap) = *self
                .checks
                .entry(seg.id())
                .or_insert((now + FIRST_CHECK, FIRST_CHECK));
            if now < at {
                continue;
            }
            let settled = self.check(seg, state);
            self.checks
                .insert(seg.id(), next_check(settled, gap, Instant::now()));
        }
    }

    /// Who answers under `seg`'s name now? The same process: it serves
    /// (a suspicion cleared), or, when it lists other regions than the
    /// segment has, the segment is refreshed. Another: the segment is
    /// replaced. None: ask again later. True when settled.
    fn check(&mut self, seg: &Arc<Segment>, state: PeerState) -> bool {
        let peers = &self.peers;
        let cfg = &peers.shared.config;
        let timeout = match peers.directory().etcd() {
            Some(dir) => (dir.ttl() / 6).min(Duration::from_secs(1)),
            None => Duration::from_secs(1),
        };
        let (addr, expected) = match peers.directory().locate(seg.name(), timeout) {
            Ok(Located::Control { addr, expected }) => (addr, expected),
            // An shm segment by name reports its owner's end itself; a
            // store that is lost or holds no record: later.
            Ok(Located::Shm) | Err(_) => return false,
        };
        if seg.via_store() && expected.is_none() {
            // Its record is gone: the watch marks it; nothing answers.
            peers.mark_gone(seg, "its record is no longer in etcd");
            return false;
        }
        let head = match crate::control::client::fetch_descriptor_head(&addr, cfg.secret(), timeout)
        {
            Ok(d) => d,
            Err(_) => return false,
        };
        if expected.as_ref().is_some_and(|e| e.check(&head).is_err()) {
            return false;
        }
        let same = head.incarnation != 0 && seg.incarnation() == Some(head.incarnation);
        // An shm segment follows its owner's regions itself.
        let regions_moved = matches!(seg.kind(), SegmentKind::Remote(d) if d.regions_version != head.regions_version);
        let why = match (same, state) {
            (false, _) => Replace::Restarted,
            (true, PeerState::Gone) => Replace::Returned,
            (true, _) if regions_moved => Replace::Refreshed,
            (true, _) => {
                seg.clear_suspect();
                return true;
            }
        };
        if !same {
            peers.mark_gone(seg, "another incarnation answers under its name");
        }
        match peers.replace(seg, why) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "replacing a restarted peer's segment failed: trying again");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_peer_is_asked_ever_less_often_and_an_answering_one_at_most_ten_times_a_second() {
        let t0 = Instant::now();
        let (mut at, mut gap) = (t0, FIRST_CHECK);
        let mut gaps = Vec::new();
        for _ in 0..10 {
            (at, gap) = next_check(false, gap, at);
            gaps.push(gap);
        }
        assert_eq!(gaps[0], FIRST_CHECK * 2);
        assert!(gaps.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*gaps.last().unwrap(), MAX_CHECK_GAP);
        assert_eq!(at, t0 + gaps.iter().sum::<Duration>());
        let (next, gap) = next_check(true, MAX_CHECK_GAP, t0);
        assert_eq!((next, gap), (t0 + SETTLED_GAP, FIRST_CHECK));
    }
}
