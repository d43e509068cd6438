//! `shm`: one-sided READ/WRITE into another process's exported segment,
//! mapped from `/dev/shm`. Every slice is checked against the peer's region
//! bounds and live key before a byte moves. A slice on a region the owner
//! published after the peer last mapped its segment is answered
//! [`SubmitOutcome::Later`] while the peer's refresher maps it: the worker
//! never waits on the owner.
//!
//! Everything the transport is lives here: the owner's export and a peer's
//! mapping of it (`peer.rs`, with the peer's refresher thread), the
//! descriptor layout and its one parser (`desc.rs`), and how memfds travel
//! between processes (`handout.rs`). A segment opened over shm carries its
//! [`ShmPeer`] as the shm attachment.

pub mod desc;
mod handout;
mod peer;

use tent_rings::{ErrorKind, TransportKind};

pub use desc::ShmEntry;
pub(crate) use desc::DATA_OFFSET;
pub use peer::{Access, ExportedMemory, MapBudget, ShmExport, ShmPeer};
pub(crate) use peer::ThreadView;

use super::{
    InlineMemo,
    Capabilities, InstallContext, PackedOutcome, Slice, SliceCompletion, SubmitOutcome, Transport,
    WorkerCtx, copy_slice, submit_each,
};
use crate::error::Result;
use crate::segment::Segment;

/// The peer a segment opened over shm is mapped through.
#[inline]
pub(crate) fn peer_of(segment: &Segment) -> Option<&ShmPeer> {
    segment.attached::<ShmPeer>(TransportKind::Shm)
}

/// Cross-process copies through shared mappings.
#[derive(Debug, Default)]
pub(crate) struct ShmTransport;

/// What an access to a peer's memory means for the slice of `len` bytes.
#[inline]
fn judge(res: Result<Access<()>, ErrorKind>, len: u64) -> PackedOutcome {
    match res {
        Ok(Access::Done(())) => SubmitOutcome::Completed(Ok(len)),
        // The peer's refresher is mapping what the owner just
        // published: the slice waits its next turn.
        Ok(Access::Later) => SubmitOutcome::Later,
        Err(e) => SubmitOutcome::Completed(Err(e)),
    }
    .into()
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn install(&self, _ctx: &InstallContext) -> Result<()> {
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: true,
            remote: true,
            slice_bytes: 0,
            wakes_worker: false,
            parks_worker: false,
        }
    }

    fn reaches(&self, segment: &Segment) -> bool {
        peer_of(segment).is_some()
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        submit_each(self, ctx, slices, out);
    }

    #[inline]
    fn submit_one(&self, ctx: &WorkerCtx, s: &Slice<'_>) -> PackedOutcome {
        let Some(peer) = peer_of(s.segment) else {
            return SubmitOutcome::Rejected(ErrorKind::Unreachable).into();
        };
        judge(peer.with_remote_on(ctx, s.remote, s.len, |remote| {
            // SAFETY: `remote` was bounds- and key-checked inside a mapping `with_remote` keeps alive; `local` was checked by the engine.
            unsafe { copy_slice(s.opcode, s.local, remote, s.len as usize) }
        }), s.len)
    }

    /// From a submitting thread: through the thread's own view of the
    /// peer's table, with the same checks.
    #[inline]
    fn submits_inline(&self) -> bool {
        true
    }

    fn submit_inline(&self, s: &Slice<'_>, memo: &mut InlineMemo) -> Option<PackedOutcome> {
        let Some(peer) = peer_of(s.segment) else {
            return Some(SubmitOutcome::Rejected(ErrorKind::Unreachable).into());
        };
        // The thread's view of the peer it reached last (a new peer: a
        // new view, one table load).
        let view = match &mut memo.shm {
            Some(v) if peer.owns_view(v) => v,
            slot => slot.insert(peer.thread_view()),
        };
        Some(judge(peer.with_remote_in(view, s.remote, s.len, |remote| {
            // SAFETY: as in `submit_one`.
            unsafe { copy_slice(s.opcode, s.local, remote, s.len as usize) }
        }), s.len))
    }

    fn poll(&self, _ctx: &WorkerCtx, _out: &mut [SliceCompletion]) -> usize {
        0
    }

    fn abort(&self, _ctx: &WorkerCtx, _token: u64, _kind: ErrorKind) {
        // Synchronous: every slice is done when `submit` returns, so
        // nothing is ever in flight here to stop.
    }
}
