//! The metadata threads, off the workers:
//!
//! - **the lease keeper** (etcd only) keeps this engine's record
//!   published: the lease renewed every third of its TTL (each call bounded
//!   by a sixth of it), granted anew and the record put again when it
//!   lapsed, the record put back when someone deleted or overwrote it, and
//!   etcd reached again when it was lost. It does nothing slow, so no peer
//!   and no open can make this engine's own lease lapse. On drop it revokes
//!   the lease: peers see this engine leave at once, not a TTL later.
//! - **the peer watcher** (both modes) watches every record (etcd) and
//!   acts on what the watch says about peers this engine has open: a record
//!   deleted (lease expired or revoked) marks the peer gone; a record with
//!   another incarnation replaces the segment with the new process's, once
//!   that process proved it is the one the record names. It also checks the
//!   peers the workers suspect (a request failed `ProcessFailed`,
//!   `Unreachable` or `AddressNotRegistered`): who answers under the name
//!   now? The same process: the suspicion is cleared, or the segment
//!   refreshed when the process lists other regions; another: the segment
//!   is replaced. And it lets go of replaced segments once no worker holds
//!   them.
//!
//! etcd lost is said once; open segments keep serving (nothing on the data
//! path needs etcd), new opens fail until it returns; then the lease is
//! granted again, the record put again and the watch resynced from a fresh
//! read of every record, so nothing that changed meanwhile is missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::SegmentId;

use super::{Owner, Peers, Replace};
use crate::control::directory::etcd::{Change, Publication, Record, Step};
use crate::control::directory::{EtcdDirectory, Located};
use crate::control::etcd::{EtcdError, Watch};
use crate::error::{Error, Result};
use crate::segment::{PeerState, Segment, SegmentKind};

/// How long a thread sleeps (or waits on the watch) per turn: the bound
/// on how late a stop, a suspect check or a renewal is.
const TICK: Duration = Duration::from_millis(50);
/// How soon a suspect peer is asked first, and the most between two asks
/// of one that does not answer (doubling in between).
const FIRST_CHECK: Duration = Duration::from_millis(20);
const MAX_CHECK_GAP: Duration = Duration::from_secs(2);
/// The least between two asks of a peer that answered: requests failing
/// over and over (an application naming an address nobody registered)
/// cost its control server at most ten lookups a second.
const SETTLED_GAP: Duration = Duration::from_millis(100);
/// The longest a metadata thread sleeps while nothing is due: a suspect
/// segment or the engine's drop rings it awake sooner (`peer_bell`).
const IDLE_WAIT: Duration = Duration::from_secs(1);
/// Between two attempts to reach a lost etcd.
const RECONNECT_GAP: Duration = Duration::from_secs(1);
/// The longest wait before reading every record again after a failed read
/// or watch (doubling from a tick).
const MAX_RESYNC_GAP: Duration = Duration::from_secs(5);

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

/// The running threads; dropping them stops them (the keeper revokes the
/// lease on its way out).
pub(in crate::engine) struct MetadataThread {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    peers: Arc<Peers>,
}

impl MetadataThread {
    /// Start them for `peers`; with etcd, `publish` is the key and record
    /// this engine publishes, under `name`, as `incarnation`.
    pub(in crate::engine) fn start(
        peers: Arc<Peers>,
        publish: Option<(String, Vec<u8>, Vec<u8>)>,
        incarnation: u64,
    ) -> Result<MetadataThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let now = Instant::now();
        let mut threads = MetadataThread {
            stop: stop.clone(),
            handles: Vec::new(),
            peers: peers.clone(),
        };
        if let (Some(dir), Some((name, key, value))) = (peers.directory().etcd(), publish) {
            dir.claim(&name, incarnation, peers.shared.config.secret())?;
            let mut p = Publication::new(key, value, dir.ttl(), now);
            // Published before the engine is handed out: a peer that looks
            // this engine up right after finds it.
            publish_now(dir, &mut p, now).map_err(|e| dir.lost(e))?;
            let keeper = Keeper {
                peers: peers.clone(),
                publication: p,
                reconnect_at: now,
                name,
                incarnation,
                publish_at: now,
            };
            let flag = stop.clone();
            threads.spawn("tent-lease", move |ready| keeper.run(&flag, ready))?;
        }
        let mut watcher = Watcher {
            peers,
            watch: None,
            resync_at: now,
            resync_gap: TICK,
            checks: HashMap::new(),
        };
        if let Some(dir) = watcher.peers.clone().directory().etcd() {
            // Watching before the engine is handed out: a peer it opens
            // right after is covered.
            watcher.resync(dir, now);
        }
        let flag = stop.clone();
        threads.spawn("tent-peers", move |ready| watcher.run(&flag, ready))?;
        Ok(threads)
    }

    /// Start thread `name` running `f`, and wait until it says it made
    /// its first turn (bounded): what a thread sets up on its first use of
    /// the tables (arc-swap's per-thread slot, an allocation) is done
    /// inside `Engine::new`, never in the middle of the application's
    /// transfers.
    fn spawn(
        &mut self,
        name: &str,
        f: impl FnOnce(std::sync::mpsc::SyncSender<()>) + Send + 'static,
    ) -> Result<()> {
        let (ready, started) = std::sync::mpsc::sync_channel(1);
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || f(ready))
            .map_err(|e| Error::invalid("metadata thread").with_source(e))?;
        self.handles.push(h);
        let _ = started.recv_timeout(Duration::from_secs(5));
        Ok(())
    }
}

impl Drop for MetadataThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.peers.shared.peer_bell.ring_all();
        for h in self.handles.drain(..) {
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

/// The lease keeper's state.
struct Keeper {
    peers: Arc<Peers>,
    publication: Publication,
    reconnect_at: Instant,
    /// The name it publishes, as this incarnation.
    name: String,
    incarnation: u64,
    /// Not before this may the record be put again after another live
    /// engine was found holding the name.
    publish_at: Instant,
}

impl Keeper {
    fn run(mut self, stop: &AtomicBool, ready: std::sync::mpsc::SyncSender<()>) {
        let peers = self.peers.clone();
        let Some(dir) = peers.directory().etcd() else {
            return;
        };
        let mut ready = Some(ready);
        let bell = &peers.shared.peer_bell;
        while !stop.load(Ordering::Acquire) {
            let seen = bell.value();
            let now = Instant::now();
            self.tend(dir, now);
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
            // Until the next renewal (a tick while publishing or lost).
            let wait = match self.publication.due(now) {
                Step::Wait(at) if dir.client().is_some() => {
                    at.saturating_duration_since(Instant::now()).min(IDLE_WAIT)
                }
                _ => TICK,
            };
            if !stop.load(Ordering::Acquire) {
                bell.wait(seen, wait);
            }
        }
        if let (Some(lease), Some(client)) = (self.publication.lease(), dir.client()) {
            let _ = client.revoke(lease);
        }
    }

    fn tend(&mut self, dir: &EtcdDirectory, now: Instant) {
        if dir.client().is_none() {
            if now < self.reconnect_at {
                return;
            }
            self.reconnect_at = now + RECONNECT_GAP;
            if dir.reconnect().is_err() {
                return;
            }
        }
        // Another live engine holds the name (both started while etcd was
        // lost, or the name was given twice): this one yields rather than
        // overwrite it, and asks again a third of a TTL later.
        let secret = self.peers.shared.config.secret();
        let may_put = |publish_at: &mut Instant| {
            if now < *publish_at {
                return false;
            }
            match dir.claim(&self.name, self.incarnation, secret) {
                Ok(()) => true,
                Err(e) => {
                    *publish_at = now + dir.ttl() / 3;
                    crate::lograte::warn_limited!(
                        (self.name.clone(), "name-held"),
                        error = %e,
                        "this engine's segment name is held by another live engine: not publishing it"
                    );
                    false
                }
            }
        };
        let p = &mut self.publication;
        let result = match p.due(now) {
            Step::Wait(_) => Ok(()),
            Step::Publish if !may_put(&mut self.publish_at) => Ok(()),
            Step::Publish => publish_now(dir, p, now).map(|()| {
                tracing::info!(key = %String::from_utf8_lossy(p.key()), "segment record published in etcd");
            }),
            Step::Renew(lease) => match dir.client().map(|c| (c.keep_alive(lease), c)) {
                Some((Ok(_), client)) => {
                    p.renewed(lease, now);
                    // Still ours? Someone with access to the store may have
                    // deleted or overwritten it: put it back (unless a live
                    // engine holds the name now).
                    match client.get(p.key()) {
                        Ok(Some((v, _))) if v == p.value() => Ok(()),
                        Ok(_) if !may_put(&mut self.publish_at) => Ok(()),
                        Ok(_) => {
                            crate::lograte::warn_limited!(
                                (p.key().to_vec(), "record"),
                                key = %String::from_utf8_lossy(p.key()),
                                "this engine's record in etcd was deleted or overwritten: put back"
                            );
                            client.put(p.key(), p.value(), Some(lease)).map(drop)
                        }
                        Err(e) => Err(e),
                    }
                }
                Some((Err(EtcdError::LeaseGone(_)), _)) => {
                    tracing::warn!(key = %String::from_utf8_lossy(p.key()), "this engine's etcd lease lapsed: publishing its record again (peers saw it gone meanwhile)");
                    p.lapsed();
                    Ok(())
                }
                Some((Err(e), _)) => Err(e),
                None => Ok(()),
            },
        };
        if let Err(e) = result
            && dir.failed(&e)
        {
            self.reconnect_at = now + RECONNECT_GAP;
        }
    }
}

/// The peer watcher's state.
struct Watcher {
    peers: Arc<Peers>,
    watch: Option<Watch>,
    /// When to read every record again (no watch), and the wait after a
    /// failed read.
    resync_at: Instant,
    resync_gap: Duration,
    /// Per suspect (or recently settled) segment: when to ask next, and
    /// the gap after.
    checks: HashMap<SegmentId, (Instant, Duration)>,
}

impl Watcher {
    fn run(&mut self, stop: &AtomicBool, ready: std::sync::mpsc::SyncSender<()>) {
        let mut ready = Some(ready);
        let peers = self.peers.clone();
        let bell = &peers.shared.peer_bell;
        while !stop.load(Ordering::Acquire) {
            // Read before the checks: a suspect rung in meanwhile wakes
            // the wait below at once.
            let seen = bell.value();
            self.check_suspects(Instant::now(), stop);
            self.peers.release_replaced();
            if let Some(r) = ready.take() {
                let _ = r.send(());
            }
            let peers = self.peers.clone();
            let waited = match peers.directory().etcd() {
                Some(dir) => {
                    let now = Instant::now();
                    if self.watch.is_none() && now >= self.resync_at {
                        self.resync(dir, now);
                    }
                    self.read_watch(dir)
                }
                None => false,
            };
            if !waited && !stop.load(Ordering::Acquire) {
                let busy = !self.checks.is_empty() || self.peers.holds_replaced();
                bell.wait(seen, if busy { TICK } else { IDLE_WAIT });
            }
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
                self.resync_gap = TICK;
                for seg in self.store_segments() {
                    match records.iter().find(|(n, _)| n == seg.owner()) {
                        None => self.on_record(&seg, None),
                        Some((_, Some(r))) => self.on_record(&seg, Some(r.clone())),
                        // Unreadable (logged): neither gone nor changed.
                        Some((_, None)) => {}
                    }
                }
            }
            Err(e) => {
                dir.failed(&e);
                self.resync_gap = (self.resync_gap * 2).min(MAX_RESYNC_GAP);
                self.resync_at = now + self.resync_gap;
            }
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
                        if seg.owner() == name {
                            self.on_record(&seg, record.clone());
                        }
                    }
                }
            }
            Err(e) => {
                // Read everything again (and watch anew) a tick later.
                self.watch = None;
                self.resync_at = Instant::now() + self.resync_gap;
                if !matches!(
                    e,
                    EtcdError::WatchClosed(_) | EtcdError::WatchCanceled { .. }
                ) {
                    dir.failed(&e);
                }
                tracing::debug!(error = %e, "etcd watch ended");
            }
        }
        true
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
    /// lease expired or was revoked: the store speaks for its liveness).
    /// Another incarnation replaces the segment only once the process the
    /// record names proved to be it; until then nothing changes.
    fn on_record(&mut self, seg: &Arc<Segment>, record: Option<Record>) {
        let Some(r) = record else {
            self.peers
                .mark_gone(seg, "its record left etcd (lease expired or revoked)");
            return;
        };
        let same = seg.incarnation() == Some(r.incarnation);
        if same && seg.peer_state() != PeerState::Gone {
            return;
        }
        if let Err(e) = self.peers.replace(seg, Replace::IfChanged) {
            tracing::info!(segment = seg.name(), error = %e, "the process the peer's record names does not answer as it yet: asking again");
            seg.suspect();
            self.checks
                .insert(seg.id(), (Instant::now() + FIRST_CHECK, FIRST_CHECK));
        }
    }

    /// Ask who answers under the name of each suspect segment (and each
    /// gone one that may have come back, unless the watch will say when
    /// its record returns) that is due.
    fn check_suspects(&mut self, now: Instant, stop: &AtomicBool) {
        let table = self.peers.shared.segments.load_full();
        // A peer that answered is remembered a while, so a new suspicion
        // waits out SETTLED_GAP.
        self.checks.retain(|id, (at, _)| {
            table
                .get(*id)
                .is_some_and(|s| s.peer_state() != PeerState::Serving || now < *at + MAX_CHECK_GAP)
        });
        for seg in table.iter() {
            if stop.load(Ordering::Acquire) {
                return;
            }
            let state = seg.peer_state();
            if state == PeerState::Serving || seg.control().is_none() {
                continue;
            }
            if state == PeerState::Gone && seg.via_store() && self.watch.is_some() {
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

    /// Who answers under `seg`'s name now? The same process: it serves (a
    /// suspicion cleared), or, when it lists other regions than the
    /// segment has, the segment is refreshed. Another, proven to be the
    /// one its name leads to: the segment is replaced. None: ask again
    /// later. True when settled.
    fn check(&mut self, seg: &Arc<Segment>, state: PeerState) -> bool {
        let peers = &self.peers;
        let cfg = &peers.shared.config;
        let timeout = match peers.directory().etcd() {
            Some(dir) => crate::control::directory::etcd::call_timeout(dir.ttl()),
            None => Duration::from_secs(1),
        };
        // First the process it was opened with, where it was: if it still
        // answers as itself, the store need not be asked.
        if state == PeerState::Suspect
            && let Some(at) = seg.control()
            && let Ok(head) =
                crate::control::client::fetch_descriptor_head(at, cfg.secret(), timeout)
            && Owner::of(seg).same(&Owner::of_descriptor(&head))
        {
            return self.still_serving(seg, &head);
        }
        let (addr, expected) = match peers.directory().locate(seg.owner()) {
            Ok(Located::Control { addr, expected }) => (addr, expected),
            // An shm segment by name reports its owner's end itself; a
            // store that is lost, or a record refused: later.
            Ok(Located::Shm) | Err(_) => return false,
        };
        if seg.via_store() && expected.is_none() {
            // Its record is gone (the store speaks for its liveness), an
            // open that raced the deletion included.
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
        if state != PeerState::Gone && Owner::of(seg).same(&Owner::of_descriptor(&head)) {
            return self.still_serving(seg, &head);
        }
        self.replace(seg, Replace::IfChanged)
    }

    /// The process `seg` was opened with answers as itself (`head`): the
    /// suspicion is cleared, or the segment refreshed when the process
    /// lists other regions (an shm segment follows its owner's regions
    /// itself). True when settled.
    fn still_serving(&self, seg: &Arc<Segment>, head: &crate::control::SegmentDescriptor) -> bool {
        let moved = matches!(seg.kind(), SegmentKind::Remote(d) if d.regions_version != head.regions_version);
        if !moved {
            seg.clear_suspect();
            return true;
        }
        self.replace(seg, Replace::Refresh)
    }

    /// [`Peers::replace`]; true when settled (a failure is asked again).
    fn replace(&self, seg: &Arc<Segment>, why: Replace) -> bool {
        match self.peers.replace(seg, why) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "replacing a peer's segment failed: asking again");
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
