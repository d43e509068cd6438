//! Segments: opening (shm, or p2p over the network transports), probing
//! and closing them; their regions, shm peer and rails.

use std::sync::Arc;
use std::time::Duration;

use tent_rings::{ErrorKind, RegionId, SegmentId, TransportKind};

use super::Embedded;
use crate::error::{Error, Result};
use crate::segment::{RemoteRegion, Segment, SegmentKind};
use crate::transport::shm::{self, ShmPeer};

/// The transports that reach peers by descriptor, best first.
pub(super) const NETWORK: &[TransportKind] = &[TransportKind::Rdma, TransportKind::Tcp];

impl Embedded {
    pub(crate) fn rails(&self, id: SegmentId) -> Vec<crate::transport::RailStat> {
        self.shared
            .segments
            .load()
            .get(id)
            .map(|s| self.rails_of(s))
            .unwrap_or_default()
    }

    /// The rails every network transport has to `segment`, best first.
    pub(super) fn rails_of(&self, segment: &Segment) -> Vec<crate::transport::RailStat> {
        self.observer.rails_of(segment)
    }

    pub(crate) fn probe_peer_alive(&self, segment: SegmentId, timeout: Duration) -> Result<bool> {
        if segment == SegmentId::LOCAL {
            return Ok(true);
        }
        let seg = self.open_segment_by_id(segment)?;
        let (host, pid) = match (seg.kind(), shm::peer_of(&seg)) {
            (SegmentKind::Local, _) => return Ok(true),
            (SegmentKind::Shm, Some(peer)) if seg.control().is_none() => {
                return Ok(peer.owner_alive());
            }
            (SegmentKind::Shm, Some(peer)) => {
                if !peer.owner_alive() {
                    return Ok(false);
                }
                (None, peer.owner_pid())
            }
            (SegmentKind::Shm, None) => return Ok(false),
            (SegmentKind::Remote(d), _) => (Some(d.host_id.clone()), d.pid),
        };
        let cfg = &self.shared.config;
        let secret = cfg.secret();
        let addr = seg.control().unwrap_or(seg.name());
        let alive = match crate::control::client::fetch_descriptor_head(addr, secret, timeout) {
            Ok(d) => {
                d.pid == pid
                    && host.is_none_or(|h| h == d.host_id)
                    && seg.incarnation().is_none_or(|i| i == d.incarnation)
            }
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "peer probe: no answer");
                false
            }
        };
        Ok(alive)
    }

    pub(crate) fn open_segment(&self, name: &str) -> Result<SegmentId> {
        self.open_segment_with(name, |_| {})
    }

    /// Is open segment `id` this engine itself, by whatever name it was
    /// opened: the local segment, or one whose owner has this engine's
    /// incarnation (its control server reached under another address)? A
    /// daemon refuses such a segment to a client: every client's memory
    /// is there. (A bare shm name carries no incarnation: only a process
    /// that can already open the engine's files, its own user, could make
    /// a second name for one.)
    pub(crate) fn is_own_segment(&self, id: SegmentId) -> bool {
        let Ok(seg) = self.open_segment_by_id(id) else {
            return false;
        };
        let ours = self.shared.incarnation.get();
        match seg.kind() {
            SegmentKind::Local => true,
            SegmentKind::Remote(d) if d.incarnation == ours => true,
            _ => seg.incarnation() == Some(ours),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn open_segment_edited(
        &self,
        name: &str,
        edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<SegmentId> {
        self.open_segment_with(name, edit)
    }

    fn open_segment_with(
        &self,
        name: &str,
        edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<SegmentId> {
        if name == "local" || Some(name) == self.local_segment_name() || name == self.segment_name()
        {
            return Ok(SegmentId::LOCAL);
        }
        self.peers.open(name, edit)
    }

    pub(crate) fn close_segment(&self, id: SegmentId) -> Result<()> {
        if id == SegmentId::LOCAL {
            return Err(Error::invalid("the local segment cannot be closed"));
        }
        let segment = {
            let _g = self.shared.registry.lock();
            let table = self.shared.segments.load_full();
            match table.without(id) {
                Some((next, removed)) => {
                    self.next_epoch(|epoch| {
                        removed.close(epoch);
                        self.shared.segments.store(Arc::new(next));
                        self.closing.hold(removed.clone());
                    });
                    removed
                }
                // Closed by an earlier call that has not finished.
                None => self
                    .closing
                    .find(|s| s.id() == id)
                    .ok_or_else(|| not_open(id))?,
            }
        };
        self.drain_epoch(
            segment.closed_epoch(),
            || 0,
            |workers, _| {
                format!(
                    "segment {} ({}) still has tasks past the drain bound ({workers} worker(s)): it stays closed; call close_segment again",
                    id.0,
                    segment.name()
                )
            },
        )?;
        // No worker uses it any more: end its threads here, so whoever
        // drops it last (a worker whose cached table held it) joins nothing.
        // Another name of the same owner still open uses its state.
        let shared = self.shared.segments.load().shares_state(&segment);
        if !shared
            && let Some(peer) = shm::peer_of(&segment)
            && !peer.stop()
        {
            tracing::warn!(segment = %segment.name(), "close_segment: the shm refresher did not end in time; the segment's last drop joins it");
        }
        self.closing.release(|s| s.id() == id);
        Ok(())
    }

    pub(crate) fn segment_regions(&self, id: SegmentId) -> Result<Vec<RemoteRegion>> {
        let seg = self.open_segment_by_id(id)?;
        Ok(match seg.kind() {
            SegmentKind::Local => self
                .shared
                .regions
                .load()
                .iter()
                .map(|r| RemoteRegion {
                    id: r.id(),
                    addr: r.addr(),
                    len: r.len(),
                })
                .collect(),
            SegmentKind::Shm => shm::peer_of(&seg).map(ShmPeer::regions).unwrap_or_default(),
            SegmentKind::Remote(d) => d
                .regions
                .iter()
                .map(|r| RemoteRegion {
                    id: RegionId::from_parts(0, r.id),
                    addr: r.addr,
                    len: r.len,
                })
                .collect(),
        })
    }

    /// The open segment `id`, or `SegmentNotFound`.
    pub(super) fn open_segment_by_id(&self, id: SegmentId) -> Result<Arc<Segment>> {
        self.shared
            .segments
            .load()
            .get(id)
            .cloned()
            .ok_or_else(|| not_open(id))
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn segment_peer(&self, id: SegmentId) -> Option<Arc<ShmPeer>> {
        let seg = self.shared.segments.load().get(id)?.clone();
        Arc::downcast(seg.attachment(TransportKind::Shm)?.clone()).ok()
    }
}

/// What a call naming a segment that is not open gets.
fn not_open(id: SegmentId) -> Error {
    Error::new(
        ErrorKind::SegmentNotFound,
        format!("segment {} is not open", id.0),
    )
}
