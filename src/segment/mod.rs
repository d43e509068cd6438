//! Segments: the memory of one engine as others see it.
//!
//! Segment 0 is this engine's own memory (TENT's `LOCAL_SEGMENT_ID`); any
//! other id is a remote segment opened by name. A segment carries what each
//! transport needs to reach it (its attachments); transports look only at
//! their own.

pub mod shm;
pub mod shm_desc;
mod shm_handout;

use std::sync::Arc;

use tent_rings::{SegmentId, TransportKind};

pub use shm::{RemoteRegion, ShmExport, ShmPeer};
pub use shm_desc::ShmEntry;

/// What a network transport keeps for one segment (its peer state: rails,
/// connections), opaque here so segments need not know transports.
pub type Attachment = Arc<dyn std::any::Any + Send + Sync>;

/// How a segment is reached.
#[derive(Debug)]
pub enum SegmentKind {
    /// This engine's own memory.
    Local,
    /// Another process on this host, through its exported `/dev/shm` segment.
    Shm(Arc<ShmPeer>),
    /// An engine known by its descriptor (fetched over the control plane),
    /// reached over the network transports attached to the segment.
    Remote(Arc<crate::control::SegmentDescriptor>),
}

/// An opened segment.
#[derive(Debug)]
pub struct Segment {
    id: SegmentId,
    name: String,
    kind: SegmentKind,
    /// The network transports that reach a `Remote` segment, best first,
    /// each with its per-peer state.
    net: Vec<(TransportKind, Attachment)>,
    /// The unregister epoch `close_segment` closed it at (0: open). A worker
    /// whose cached table still has it refuses new requests on it, and
    /// does not acknowledge the epoch while a live task names it.
    closed: std::sync::atomic::AtomicU64,
}

impl Segment {
    /// A segment record.
    pub fn new(id: SegmentId, name: String, kind: SegmentKind) -> Segment {
        Segment {
            id,
            name,
            kind,
            net: Vec::new(),
            closed: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Closed at unregister epoch `epoch` (see `Engine::close_segment`).
    pub(crate) fn close(&self, epoch: u64) {
        self.closed
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    /// The epoch it was closed at; 0 while open.
    #[inline]
    pub fn closed_epoch(&self) -> u64 {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The same segment, also reached over `kind` with its per-peer state;
    /// attachments rank in the order they are added (best first).
    pub fn with_attachment(mut self, kind: TransportKind, state: Attachment) -> Segment {
        if matches!(self.kind, SegmentKind::Remote(_)) && self.attachment(kind).is_none() {
            self.net.push((kind, state));
        }
        self
    }

    /// The state `kind` keeps for this segment, if `kind` reaches it.
    #[inline]
    pub fn attachment(&self, kind: TransportKind) -> Option<&Attachment> {
        self.net.iter().find(|(k, _)| *k == kind).map(|(_, a)| a)
    }

    /// Its id (what an SQE names).
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// The name it was opened by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it is reached.
    pub fn kind(&self) -> &SegmentKind {
        &self.kind
    }

    /// The shared-memory attachment, if the peer exported one.
    pub fn shm(&self) -> Option<&ShmPeer> {
        match &self.kind {
            SegmentKind::Shm(p) => Some(p),
            SegmentKind::Local | SegmentKind::Remote(_) => None,
        }
    }

    /// The network transports attached to this segment, in the order they
    /// were attached (best first). A request's fallback list is ranked by
    /// the worker from every installed transport that `reaches` the
    /// segment; this is what the network side offers.
    pub fn transports(&self) -> impl Iterator<Item = TransportKind> + '_ {
        self.net.iter().map(|(k, _)| *k)
    }
}

/// Snapshot of the opened segments, by id.
#[derive(Debug, Default, Clone)]
pub struct SegmentTable {
    by_id: Vec<Option<Arc<Segment>>>,
}

impl SegmentTable {
    /// The segment with `id`.
    #[inline]
    pub fn get(&self, id: SegmentId) -> Option<&Arc<Segment>> {
        self.by_id.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The open segment called `name`.
    pub fn find_name(&self, name: &str) -> Option<&Arc<Segment>> {
        self.by_id.iter().flatten().find(|s| s.name() == name)
    }

    /// The id for the next open segment (never reused: a stale id names
    /// nothing rather than another peer).
    pub fn next_id(&self) -> SegmentId {
        SegmentId(self.by_id.len().max(1) as u32)
    }

    /// A copy with `segment` in its slot.
    pub fn with(&self, segment: Arc<Segment>) -> SegmentTable {
        let mut next = self.clone();
        let idx = segment.id().0 as usize;
        if next.by_id.len() <= idx {
            next.by_id.resize(idx + 1, None);
        }
        next.by_id[idx] = Some(segment);
        next
    }

    /// Every open segment.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Segment>> {
        self.by_id.iter().flatten()
    }

    /// A copy without segment `id`, and the segment taken out.
    pub fn without(&self, id: SegmentId) -> Option<(SegmentTable, Arc<Segment>)> {
        let removed = self.get(id)?.clone();
        let mut next = self.clone();
        next.by_id[id.0 as usize] = None;
        Some((next, removed))
    }
}
