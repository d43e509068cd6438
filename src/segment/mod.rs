//! Segments: the memory of one engine as others see it.
//!
//! Segment 0 is this engine's own memory (TENT's `LOCAL_SEGMENT_ID`); any
//! other id is a remote segment opened by name. A segment carries what each
//! transport needs to reach it (its attachments); transports look only at
//! their own.

use std::any::{Any, TypeId};
use std::sync::Arc;

use tent_rings::{RegionId, SegmentId, TransportKind};

/// What a transport keeps for one segment (its peer state: rails and
/// connections, or the peer's mapped shm segment), opaque here so segments
/// need not know transports.
pub(crate) type Attachment = Arc<dyn Any + Send + Sync>;

/// What an engine knows of the process behind a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum PeerState {
    /// Nothing says otherwise: it serves.
    Serving = 0,
    /// A request to it failed as if it died; the metadata thread checks.
    Suspect = 1,
    /// It is gone (lease expired, or restarted as another incarnation).
    Gone = 2,
}

impl PeerState {
    /// How `/health` says it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PeerState::Serving => "serving",
            PeerState::Suspect => "suspect",
            PeerState::Gone => "gone",
        }
    }
}

/// A region as a peer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Region id in the owner's engine.
    pub id: RegionId,
    /// Start address in the owner's address space (what remote offsets name).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// How a segment is reached.
#[derive(Debug)]
pub(crate) enum SegmentKind {
    /// This engine's own memory.
    Local,
    /// Another process on this host, through its exported `/dev/shm`
    /// segment (the shm transport's attachment holds the mapping).
    Shm,
    /// An engine known by its descriptor (fetched over the control plane),
    /// reached over the network transports attached to the segment.
    Remote(Arc<crate::control::SegmentDescriptor>),
}

impl SegmentKind {
    /// How it is reached, in a word (`/health`).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            SegmentKind::Local => "local",
            SegmentKind::Shm => "shm",
            SegmentKind::Remote(_) => "remote",
        }
    }
}

/// An opened segment.
#[derive(Debug)]
pub struct Segment {
    id: SegmentId,
    name: String,
    kind: SegmentKind,
    /// The transports that reach a `Shm` or `Remote` segment, best first,
    /// each with its per-peer state.
    ///
    /// Each with the concrete type of its state, read once when it was
    /// attached, so the hot path's typed read-back (`attached`) compares a
    /// constant instead of asking the value through its vtable.
    attached: Vec<(TransportKind, TypeId, Attachment)>,
    /// The unregister epoch `close_segment` closed it at (0: open). A worker
    /// whose cached table still has it refuses new requests on it, and
    /// does not acknowledge the epoch while a live task names it.
    closed: std::sync::atomic::AtomicU64,
    /// What is known of the peer's process ([`PeerState`]): workers mark
    /// it suspect when a request to it fails as if it died, the metadata
    /// thread marks it gone when its lease expired or it restarted.
    peer: std::sync::atomic::AtomicU8,
    /// The owner's incarnation, from its descriptor (`None`: not known).
    incarnation: Option<u64>,
    /// Its owner's control server (`ip:port`), when it has one (a segment
    /// opened by its shm name has none).
    control: Option<String>,
    /// Found through a metadata store (etcd), whose watch speaks for it.
    via_store: bool,
    /// Opened by a daemon client's mailbox name (`owner#mailbox`): its
    /// notifications go to that client (see `crate::notify`).
    mailbox: Option<u64>,
}

impl Segment {
    /// A segment record.
    pub(crate) fn new(id: SegmentId, name: String, kind: SegmentKind) -> Segment {
        Segment {
            id,
            name,
            kind,
            attached: Vec::new(),
            closed: std::sync::atomic::AtomicU64::new(0),
            peer: std::sync::atomic::AtomicU8::new(PeerState::Serving as u8),
            incarnation: None,
            control: None,
            via_store: false,
            mailbox: None,
        }
    }

    /// The same owner opened under another `name` as segment `id`, its
    /// notifications going to `mailbox`: the transports' per-peer state is
    /// shared, not made again (a peer addressing eight clients of one
    /// daemon holds one set of connections to it).
    pub(crate) fn alias(&self, id: SegmentId, name: String, mailbox: Option<u64>) -> Segment {
        let kind = match &self.kind {
            SegmentKind::Local => SegmentKind::Local,
            SegmentKind::Shm => SegmentKind::Shm,
            SegmentKind::Remote(d) => SegmentKind::Remote(d.clone()),
        };
        Segment {
            id,
            name,
            kind,
            attached: self.attached.clone(),
            closed: std::sync::atomic::AtomicU64::new(0),
            peer: std::sync::atomic::AtomicU8::new(self.peer_state() as u8),
            incarnation: self.incarnation,
            control: self.control.clone(),
            via_store: self.via_store,
            mailbox,
        }
    }

    /// Opened by `name` ending in `mailbox`.
    pub(crate) fn with_mailbox(mut self, mailbox: Option<u64>) -> Segment {
        self.mailbox = mailbox;
        self
    }

    /// Its owner's name: the name it was opened by, less a mailbox
    /// (`owner#mailbox`): what the directory locates and the store
    /// watches.
    pub(crate) fn owner(&self) -> &str {
        crate::notify::split_mailbox(&self.name).0
    }

    /// The client mailbox its notifications go to (`None`: the engine).
    pub(crate) fn mailbox(&self) -> Option<u64> {
        self.mailbox
    }

    /// Does it share a transport's per-peer state with `other` (one of
    /// them an alias of the other)?
    pub(crate) fn shares_state_with(&self, other: &Segment) -> bool {
        self.attached
            .iter()
            .any(|(_, _, a)| other.attached.iter().any(|(_, _, b)| Arc::ptr_eq(a, b)))
    }

    /// The same segment, its owner's incarnation known (or not).
    pub(crate) fn with_incarnation(mut self, incarnation: Option<u64>) -> Segment {
        self.incarnation = incarnation;
        self
    }

    /// The owner's incarnation, when its descriptor said.
    pub(crate) fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// Reached through the control server at `addr`; `via_store` when a
    /// metadata store named it.
    pub(crate) fn with_control(mut self, addr: String, via_store: bool) -> Segment {
        self.control = Some(addr);
        self.via_store = via_store;
        self
    }

    /// Its owner's control server (`ip:port`), if it has one.
    pub(crate) fn control(&self) -> Option<&str> {
        self.control.as_deref()
    }

    /// Was it found through a metadata store?
    pub(crate) fn via_store(&self) -> bool {
        self.via_store
    }

    /// A request to the peer failed as if its process were gone
    /// (`ProcessFailed`, `Unreachable`) or named an address the segment
    /// does not list (`AddressNotRegistered`): the metadata thread asks
    /// who answers under its name now. A worker's store, lock-free, and
    /// only while it serves (a load first: the line is read by every
    /// request); a gone peer stays gone. True when this call made it
    /// suspect (the caller wakes the metadata thread, once).
    #[inline]
    pub(crate) fn suspect(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.peer.load(Relaxed) != PeerState::Serving as u8 {
            return false;
        }
        self.peer
            .compare_exchange(
                PeerState::Serving as u8,
                PeerState::Suspect as u8,
                Relaxed,
                Relaxed,
            )
            .is_ok()
    }

    /// The process this segment was opened with is gone (its lease expired,
    /// or another incarnation answers under its name): requests to it fail
    /// `ProcessFailed`, and tasks in flight on it are stopped with it.
    pub(crate) fn mark_gone(&self) {
        self.peer
            .store(PeerState::Gone as u8, std::sync::atomic::Ordering::Release);
    }

    /// The suspicion was unfounded (the same process still answers).
    pub(crate) fn clear_suspect(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = self.peer.compare_exchange(
            PeerState::Suspect as u8,
            PeerState::Serving as u8,
            Relaxed,
            Relaxed,
        );
    }

    /// What is known of the peer's process now.
    #[inline]
    pub(crate) fn peer_state(&self) -> PeerState {
        match self.peer.load(std::sync::atomic::Ordering::Acquire) {
            0 => PeerState::Serving,
            1 => PeerState::Suspect,
            _ => PeerState::Gone,
        }
    }

    /// Closed at unregister epoch `epoch` (see `Engine::close_segment`).
    pub(crate) fn close(&self, epoch: u64) {
        self.closed
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    /// The epoch it was closed at; 0 while open.
    #[inline]
    pub(crate) fn closed_epoch(&self) -> u64 {
        self.closed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The same segment, also reached over `kind` with its per-peer state;
    /// attachments rank in the order they are added (best first).
    pub(crate) fn with_attachment(mut self, kind: TransportKind, state: Attachment) -> Segment {
        if !matches!(self.kind, SegmentKind::Local) && self.attachment(kind).is_none() {
            // `*state`: the value's own type, not the `Arc`'s.
            let ty = (*state).type_id();
            self.attached.push((kind, ty, state));
        }
        self
    }

    /// The state `kind` keeps for this segment, if `kind` reaches it.
    #[inline]
    pub(crate) fn attachment(&self, kind: TransportKind) -> Option<&Attachment> {
        self.attached
            .iter()
            .find(|(k, _, _)| *k == kind)
            .map(|(_, _, a)| a)
    }

    /// Its id (what an SQE names).
    pub(crate) fn id(&self) -> SegmentId {
        self.id
    }

    /// The name it was opened by.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// How it is reached.
    pub(crate) fn kind(&self) -> &SegmentKind {
        &self.kind
    }

    /// The state `kind` keeps for this segment, as the type that transport
    /// attached (`None` if `kind` does not reach it).
    #[inline]
    pub(crate) fn attached<T: Any>(&self, kind: TransportKind) -> Option<&T> {
        self.attached_with_handle(kind).map(|(_, t)| t)
    }

    /// [`attached`](Self::attached), with the shared handle it is kept by
    /// (for a transport that keeps the peer alive past this segment).
    #[inline]
    pub(crate) fn attached_with_handle<T: Any>(&self, kind: TransportKind) -> Option<(&Attachment, &T)> {
        let (_, ty, state) = self.attached.iter().find(|(k, _, _)| *k == kind)?;
        if *ty != TypeId::of::<T>() {
            return None;
        }
        // SAFETY: `ty` is the concrete type of the value `state` points to (read from the value when it was attached, and an `Arc`'s value never changes type), and it is `T`'s: the pointee is a `T`, alive as long as `self` holds `state`.
        Some((state, unsafe { &*Arc::as_ptr(state).cast::<T>() }))
    }
}

/// Snapshot of the opened segments, by id.
#[derive(Debug, Default, Clone)]
pub(crate) struct SegmentTable {
    by_id: Vec<Option<Arc<Segment>>>,
    /// The engine's tag every id here but [`SegmentId::LOCAL`] carries (0
    /// in a table built for a test): an id with another is another
    /// engine's, and names nothing.
    tag: u32,
}

impl SegmentTable {
    /// An empty table whose ids carry the engine's `tag`.
    pub(crate) fn tagged(tag: u32) -> SegmentTable {
        SegmentTable {
            by_id: Vec::new(),
            tag,
        }
    }

    /// The slot of `id`, unless another engine issued it. Slot 0 is
    /// [`SegmentId::LOCAL`]'s alone: this engine's tag with number 0 names
    /// nothing (else it would be a second name of the local segment, which
    /// `close_segment` must never take out).
    #[inline]
    fn slot(&self, id: SegmentId) -> Option<usize> {
        let ours = id.tag() == self.tag && id.index() != 0;
        (id == SegmentId::LOCAL || ours).then_some(id.index() as usize)
    }

    /// The segment with `id`.
    #[inline]
    pub(crate) fn get(&self, id: SegmentId) -> Option<&Arc<Segment>> {
        self.by_id.get(self.slot(id)?).and_then(Option::as_ref)
    }

    /// The open segment called `name`.
    pub(crate) fn find_name(&self, name: &str) -> Option<&Arc<Segment>> {
        self.by_id.iter().flatten().find(|s| s.name() == name)
    }

    /// An open segment of the owner called `owner`, under any of its
    /// names (with a mailbox or without: `crate::notify::split_mailbox`).
    pub(crate) fn find_owner(&self, owner: &str) -> Option<&Arc<Segment>> {
        self.by_id
            .iter()
            .flatten()
            .find(|s| crate::notify::split_mailbox(s.name()).0 == owner)
    }

    /// Does an open segment share a transport's per-peer state with
    /// `segment`?
    pub(crate) fn shares_state(&self, segment: &Segment) -> bool {
        self.by_id
            .iter()
            .flatten()
            .any(|s| s.id() != segment.id() && s.shares_state_with(segment))
    }

    /// The id for the next open segment (never reused: a stale id names
    /// nothing rather than another peer).
    pub(crate) fn next_id(&self) -> SegmentId {
        let index = u32::try_from(self.by_id.len().max(1)).unwrap_or(u32::MAX);
        SegmentId::from_parts(self.tag, index)
    }

    /// A copy with `segment` in its slot (one of another engine's ids is
    /// a bug of the caller: it panics).
    pub(crate) fn with(&self, segment: Arc<Segment>) -> SegmentTable {
        let mut next = self.clone();
        let idx = self.slot(segment.id()).expect("a segment id of this engine");
        if next.by_id.len() <= idx {
            next.by_id.resize(idx + 1, None);
        }
        next.by_id[idx] = Some(segment);
        next
    }

    /// Every open segment.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Segment>> {
        self.by_id.iter().flatten()
    }

    /// A copy without segment `id`, and the segment taken out.
    pub(crate) fn without(&self, id: SegmentId) -> Option<(SegmentTable, Arc<Segment>)> {
        let removed = self.get(id)?.clone();
        let mut next = self.clone();
        next.by_id[self.slot(id)?] = None;
        Some((next, removed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attachment_reads_back_only_as_the_type_it_was_attached_as() {
        let state: Attachment = Arc::new(7u32);
        let seg = Segment::new(SegmentId(1), "peer".into(), SegmentKind::Shm)
            .with_attachment(TransportKind::Shm, state);
        assert_eq!(seg.attached::<u32>(TransportKind::Shm), Some(&7));
        assert_eq!(seg.attached::<u64>(TransportKind::Shm), None);
        assert_eq!(
            seg.attached::<Attachment>(TransportKind::Shm).map(|_| ()),
            None
        );
        assert_eq!(seg.attached::<u32>(TransportKind::Tcp), None);
        let local = Segment::new(SegmentId(0), "local".into(), SegmentKind::Local)
            .with_attachment(TransportKind::Shm, Arc::new(7u32));
        assert_eq!(local.attached::<u32>(TransportKind::Shm), None);
    }

    #[test]
    fn this_engine_s_tag_with_number_0_is_no_second_name_of_local() {
        let local = Arc::new(Segment::new(SegmentId::LOCAL, "local".into(), SegmentKind::Local));
        let t = SegmentTable::tagged(0xabcd).with(local);
        let alias = SegmentId::from_parts(0xabcd, 0);
        assert!(t.get(alias).is_none());
        assert!(t.without(alias).is_none(), "close_segment(alias) took out the local segment");
        assert!(t.get(SegmentId::LOCAL).is_some());
        assert!(t.get(SegmentId::from_parts(0x1234, 0)).is_none());
    }
}
