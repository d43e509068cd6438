//! The peers behind open segments: opening a segment by name (through the
//! [`Directory`]), and what happens when a peer's process goes away or
//! comes back as another incarnation. Shared by the API (`open_segment`)
//! and the metadata thread ([`metadata`]), which acts on what the store's
//! watch and the workers' failures say.
//!
//! A peer that restarted is replaced in place: a segment with the same id
//! and name, built from the new process's descriptor (new connections, new
//! QPs, new shm mapping), goes into the table; the old one is marked gone
//! (its tasks still in flight are stopped `ProcessFailed`, they addressed
//! a process that is no more), closed at the next unregister epoch and
//! held until every worker is past it, then dropped with everything it
//! held. The application's segment id keeps working: its next request
//! goes to the new process.

pub(super) mod metadata;

use std::sync::Arc;
use std::time::Duration;

use tent_rings::{ErrorKind, SegmentId, TransportKind};

use super::EngineShared;
use super::segments::NETWORK;
use super::withdrawn::Withdrawn;
use super::worker::WorkerShared;
use crate::control::SegmentDescriptor;
use crate::control::directory::{Directory, Located};
use crate::error::{Error, Result};
use crate::segment::{Attachment, PeerState, Segment, SegmentKind};
use crate::transport::shm::{self, MapBudget, ShmPeer};

/// How an opened segment is reached: its kind and the transports attached.
type Opened = (SegmentKind, Vec<(TransportKind, Attachment)>);

/// Opening and replacing the segments of peers.
pub(super) struct Peers {
    shared: Arc<EngineShared>,
    shm_maps: Arc<MapBudget>,
    workers: Vec<Arc<WorkerShared>>,
    directory: Directory,
    /// Segments replaced by a restarted peer's, held until no worker uses
    /// them ([`Peers::release_replaced`]).
    replaced: Withdrawn<Segment>,
}

impl Peers {
    pub(super) fn new(
        shared: Arc<EngineShared>,
        shm_maps: Arc<MapBudget>,
        workers: Vec<Arc<WorkerShared>>,
        directory: Directory,
    ) -> Peers {
        Peers {
            shared,
            shm_maps,
            workers,
            directory,
            replaced: Withdrawn::default(),
        }
    }

    pub(super) fn directory(&self) -> &Directory {
        &self.directory
    }

    /// Open `name` (not this engine's own), with the peer's descriptor
    /// passed through `edit` first; the same name twice is the same id.
    /// The owner is asked without the registry lock (the exchange may take
    /// its whole timeout, and registering memory must not wait on it); two
    /// callers opening one name at once both ask, and the first to finish
    /// makes the segment.
    pub(super) fn open(
        &self,
        name: &str,
        edit: impl FnOnce(&mut SegmentDescriptor),
    ) -> Result<SegmentId> {
        if let Some(s) = self.shared.segments.load().find_name(name) {
            return Ok(s.id());
        }
        // A client's mailbox name (`owner#mailbox`): the owner's segment,
        // its notifications for that client.
        let (owner, mailbox) = crate::notify::split_mailbox(name);
        if let Some(id) = self.alias(owner, name, mailbox) {
            return Ok(id);
        }
        let built = self.build(owner, edit)?;
        let _g = self.shared.registry.lock();
        let table = self.shared.segments.load_full();
        if let Some(s) = table.find_name(name) {
            return Ok(s.id());
        }
        let id = table.next_id();
        let seg = Arc::new(built.into_segment(id, name).with_mailbox(mailbox));
        self.shared.segments.store(Arc::new(table.with(seg)));
        tracing::info!(segment = name, id = id.0, "segment opened");
        Ok(id)
    }

    /// `name` opened as another name of `owner`, already open under one:
    /// a segment of its own sharing that one's transports (under the
    /// registry's lock, so a close of the other sees it: `close_segment`
    /// stops the shared state only when no open segment holds it).
    fn alias(&self, owner: &str, name: &str, mailbox: Option<u64>) -> Option<SegmentId> {
        let _g = self.shared.registry.lock();
        let table = self.shared.segments.load_full();
        if let Some(s) = table.find_name(name) {
            return Some(s.id());
        }
        // Only a serving one: a gone or suspect segment's state is on its
        // way out (the metadata thread replaces it), so a name opened now
        // gets state of its own.
        let of = table
            .find_owner(owner)
            .filter(|s| s.peer_state() == PeerState::Serving)?;
        let id = table.next_id();
        let seg = Arc::new(of.alias(id, name.to_owned(), mailbox));
        self.shared.segments.store(Arc::new(table.with(seg)));
        tracing::info!(
            segment = name,
            id = id.0,
            "segment opened (another name of an open one)"
        );
        Some(id)
    }

    /// The segment named `name` as its owner describes it now.
    fn build(&self, name: &str, edit: impl FnOnce(&mut SegmentDescriptor)) -> Result<Built> {
        let timeout = self
            .shared
            .config
            .default_timeout_ms
            .min(Duration::from_secs(10));
        self.build_within(name, timeout, edit)
    }

    /// [`Peers::build`], the owner's answer awaited at most `timeout`.
    fn build_within(
        &self,
        name: &str,
        timeout: Duration,
        edit: impl FnOnce(&mut SegmentDescriptor),
    ) -> Result<Built> {
        let cfg = &self.shared.config;
        let (addr, expected) = match self.directory.locate(name)? {
            Located::Shm => {
                return Ok(Built {
                    opened: self.open_shm(name)?,
                    incarnation: None,
                    control: None,
                });
            }
            Located::Control { addr, expected } => (addr, expected),
        };
        let mut desc = crate::control::fetch_descriptor(&addr, cfg.secret(), timeout)?;
        if let Some(e) = &expected {
            e.check(&desc)?;
        }
        edit(&mut desc);
        // 0: an owner that does not say.
        let incarnation = (desc.incarnation != 0).then_some(desc.incarnation);
        let via_store = expected.is_some();
        Ok(Built {
            opened: self.reach(&addr, desc)?,
            incarnation,
            control: Some((addr, via_store)),
        })
    }

    /// An shm segment by its name.
    fn open_shm(&self, name: &str) -> Result<Opened> {
        let cfg = &self.shared.config;
        if !cfg.transports.shm.enable {
            return Err(Error::new(
                ErrorKind::SegmentNotFound,
                format!("segment {name:?}: no transport can open it (shm disabled)"),
            ));
        }
        // Connecting proves the owner lives: it serves the segment's socket.
        // Each worker reads the peer's table through its own view.
        let peer =
            ShmPeer::attach_within(&cfg.transports.shm.dir, name, cfg.secret(), &self.shm_maps)?
                .for_workers(self.workers.len());
        let peer: Attachment = Arc::new(peer);
        Ok((SegmentKind::Shm, vec![(TransportKind::Shm, peer)]))
    }

    /// The owner of `desc` (its control server at `addr`): on the same host
    /// with shm exported, through shared memory; else through every network
    /// transport both ends have, best first (RDMA, TCP).
    fn reach(&self, addr: &str, desc: SegmentDescriptor) -> Result<Opened> {
        let cfg = &self.shared.config;
        if cfg.transports.shm.enable
            && desc.host_id == crate::control::host_id()
            && let Some(shm) = &desc.shm_name
        {
            match self.open_shm(shm) {
                Ok(opened) => return Ok(opened),
                // Same kernel, different /dev/shm (another mount namespace).
                Err(e) => {
                    tracing::info!(segment = addr, error = %e, "peer on this host but its shm segment is not visible here")
                }
            }
        }
        let mut attached: Vec<(TransportKind, Attachment)> = Vec::new();
        for &k in NETWORK {
            let Some(t) = self.shared.transports.slot(k).load_full() else {
                continue;
            };
            match t.transport.attach_peer(addr, &desc) {
                None => {}
                Some(Ok(peer)) => attached.push((k, peer)),
                // Not the network's fault (rings, threads): say so now.
                Some(Err(e)) if e.kind() != ErrorKind::Unreachable => return Err(e),
                Some(Err(e)) => {
                    tracing::warn!(segment = addr, transport = %k, error = %e, "peer offers this transport but no rail reaches it")
                }
            }
        }
        if attached.is_empty() {
            tracing::warn!(
                segment = addr,
                "no transport reaches this peer; its requests will fail Unreachable"
            );
        }
        Ok((SegmentKind::Remote(Arc::new(desc)), attached))
    }

    /// Replace `old` (still the table's segment under its id) with one
    /// built from what its owner's name leads to now, asked within
    /// [`REPLACE_TIMEOUT`]. Another process there (by [`Owner::same`]): the
    /// old segment is marked gone first (its work in flight went to a
    /// process that is no more), said once. The same process: replaced
    /// only when the old one is gone (it came back) or `why` is
    /// [`Replace::Refresh`] (its regions changed); else nothing changes.
    /// `Ok(false)`: nothing replaced (`old` closed or replaced already, or
    /// the same process). On an error `old` stays as it was.
    pub(super) fn replace(&self, old: &Arc<Segment>, why: Replace) -> Result<bool> {
        let current =
            |t: &crate::segment::SegmentTable| t.get(old.id()).is_some_and(|s| Arc::ptr_eq(s, old));
        if !current(&self.shared.segments.load()) {
            return Ok(false);
        }
        // Asked without the lock, as `open` does, and within a bound: the
        // metadata thread that calls this has other peers to watch.
        let built = self.build_within(old.owner(), REPLACE_TIMEOUT, |_| {})?;
        let new = Arc::new(
            built
                .into_segment(old.id(), old.name())
                .with_mailbox(old.mailbox()),
        );
        let restarted = !Owner::of(old).same(&Owner::of(&new));
        let came_back = old.peer_state() == PeerState::Gone;
        if !restarted && !came_back && why != Replace::Refresh {
            return Ok(false);
        }
        let _g = self.shared.registry.lock();
        let table = self.shared.segments.load_full();
        if !current(&table) {
            return Ok(false);
        }
        let (old_inc, new_inc) = (
            old.incarnation().unwrap_or(0),
            new.incarnation().unwrap_or(0),
        );
        if restarted {
            tracing::warn!(
                segment = old.name(),
                id = old.id().0,
                old_incarnation = format_args!("{old_inc:#x}"),
                new_incarnation = format_args!("{new_inc:#x}"),
                "peer restarted: its segment now reaches the new process (work in flight to the old one fails ProcessFailed)"
            );
            old.mark_gone();
        } else if came_back {
            tracing::info!(
                segment = old.name(),
                id = old.id().0,
                incarnation = format_args!("{new_inc:#x}"),
                "peer back: its segment reaches it again"
            );
        } else {
            // Work in flight on the old one goes on: the same process.
            tracing::debug!(
                segment = old.name(),
                id = old.id().0,
                "peer registered or withdrew regions: its segment now lists them"
            );
        }
        self.shared.next_epoch(|epoch| {
            // The new table first: a worker that loads it in between finds
            // the segment open, never closed with nothing in its place.
            self.shared.segments.store(Arc::new(table.with(new)));
            old.close(epoch);
            self.replaced.hold(old.clone());
        });
        // A parked worker acknowledges the epoch once it wakes.
        for w in &self.workers {
            w.doorbell().ring();
        }
        Ok(true)
    }

    /// The process behind `seg` is gone (its lease expired, or it died
    /// and no other answers yet): requests to it fail `ProcessFailed`, and
    /// its tasks in flight are stopped with it at the workers' next sweep.
    /// Says so once per segment.
    pub(super) fn mark_gone(&self, seg: &Segment, why: &str) {
        if seg.peer_state() == PeerState::Gone {
            return;
        }
        seg.mark_gone();
        tracing::warn!(
            segment = seg.name(),
            id = seg.id().0,
            incarnation = format_args!("{:#x}", seg.incarnation().unwrap_or(0)),
            why,
            "peer gone: its requests fail ProcessFailed until it is back"
        );
        for w in &self.workers {
            w.doorbell().ring();
        }
    }

    /// Are replaced segments waiting for the workers to let go of them?
    pub(super) fn holds_replaced(&self) -> bool {
        !self.replaced.snapshot().is_empty()
    }

    /// Drop the replaced segments no worker uses any more (every worker
    /// acknowledged the epoch they were closed at), ending an shm peer's
    /// threads here rather than on whichever thread drops it last.
    pub(super) fn release_replaced(&self) {
        use std::sync::atomic::Ordering;
        let done = |s: &Segment| {
            self.workers
                .iter()
                .all(|w| w.region_ack.epoch.load(Ordering::Acquire) >= s.closed_epoch())
        };
        let replaced = self.replaced.snapshot();
        if replaced.iter().any(|s| done(s)) {
            // No ring keeps a replaced segment in its views either.
            self.shared.inline.release_views();
        }
        for s in replaced {
            if done(&s) {
                // Another name of the same owner may still use its state.
                if !self.shared.segments.load().shares_state(&s)
                    && let Some(peer) = shm::peer_of(&s)
                {
                    let _ = peer.stop();
                }
                self.replaced.release(|r| std::ptr::eq(r, &*s));
            }
        }
    }
}

/// The longest the metadata thread waits for a peer's descriptor when it
/// replaces a segment (an application's open waits up to
/// `default_timeout_ms`, at most 10 s).
const REPLACE_TIMEOUT: Duration = Duration::from_secs(2);

/// Who owns a segment's memory, as far as it is known: its incarnation
/// (0: it did not say), host and pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owner<'a> {
    pub incarnation: u64,
    pub host: Option<&'a str>,
    pub pid: Option<u32>,
}

impl<'a> Owner<'a> {
    /// The owner of `seg` (a remote one's from its descriptor; an shm
    /// one's pid from its mapping).
    pub(super) fn of(seg: &'a Segment) -> Owner<'a> {
        let (host, pid) = match seg.kind() {
            SegmentKind::Remote(d) => (Some(d.host_id.as_str()), Some(d.pid)),
            _ => (None, shm::peer_of(seg).map(ShmPeer::owner_pid)),
        };
        Owner {
            incarnation: seg.incarnation().unwrap_or(0),
            host,
            pid,
        }
    }

    /// The owner a descriptor names.
    pub(super) fn of_descriptor(d: &'a SegmentDescriptor) -> Owner<'a> {
        Owner {
            incarnation: d.incarnation,
            host: Some(&d.host_id),
            pid: Some(d.pid),
        }
    }

    /// The same process? By incarnation when either says one; for owners
    /// that name none (an older version), by pid and, where both know it,
    /// host (the kernel's boot id: containers on one host share it, so two
    /// such processes with the same pid in two containers look the same).
    pub(super) fn same(&self, other: &Owner<'_>) -> bool {
        if self.incarnation != 0 || other.incarnation != 0 {
            return self.incarnation == other.incarnation;
        }
        let hosts = match (self.host, other.host) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        self.pid.is_some() && self.pid == other.pid && hosts
    }
}

/// When [`Peers::replace`] replaces a segment whose owner still answers
/// as the same process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replace {
    /// Only if it had been marked gone (it came back); another process is
    /// always replaced.
    IfChanged,
    /// Always: the same process lists other regions than it was opened with.
    Refresh,
}

/// A segment made from what its owner said, before it has an id.
struct Built {
    opened: Opened,
    incarnation: Option<u64>,
    /// Its owner's control server, and whether a store named it.
    control: Option<(String, bool)>,
}

impl Built {
    fn into_segment(self, id: SegmentId, name: &str) -> Segment {
        let (kind, attached) = self.opened;
        let mut seg = Segment::new(id, name.to_owned(), kind).with_incarnation(self.incarnation);
        if let Some((addr, via_store)) = self.control {
            seg = seg.with_control(addr, via_store);
        }
        for (k, peer) in attached {
            seg = seg.with_attachment(k, peer);
        }
        seg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(host: &str, pid: u32, incarnation: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            name: "10.0.0.1:7000".into(),
            host_id: host.into(),
            pid,
            incarnation,
            ..Default::default()
        }
    }

    fn remote(d: SegmentDescriptor) -> Segment {
        let inc = (d.incarnation != 0).then_some(d.incarnation);
        Segment::new(SegmentId(1), "p".into(), SegmentKind::Remote(Arc::new(d)))
            .with_incarnation(inc)
    }

    #[test]
    fn an_owner_is_the_same_by_incarnation_or_without_one_by_host_and_pid() {
        let old = remote(desc("h", 10, 0));
        let same = |d: SegmentDescriptor| Owner::of(&old).same(&Owner::of_descriptor(&d));
        assert!(same(desc("h", 10, 0)));
        assert!(!same(desc("h", 11, 0)), "another pid");
        assert!(!same(desc("g", 10, 0)), "another host");
        assert!(!same(desc("h", 10, 5)), "it now names one");
        let named = remote(desc("h", 10, 7));
        let seg = |d: SegmentDescriptor| Owner::of(&named).same(&Owner::of(&remote(d)));
        assert!(seg(desc("h", 10, 7)));
        assert!(!seg(desc("h", 10, 8)), "a restart");
        assert!(!seg(desc("h", 10, 0)));
        // An owner nothing is known of is nobody's same.
        let unknown = Owner {
            incarnation: 0,
            host: None,
            pid: None,
        };
        assert!(!unknown.same(&unknown));
    }
}
