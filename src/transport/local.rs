//! `local`: a transfer inside one process is a `memcpy`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tent_rings::{ErrorKind, TransportKind};

use super::{
    Capabilities, InlineMemo, InstallContext, PackedOutcome, Slice, SliceCompletion, SubmitOutcome, Transport,
    WorkerCtx, copy_slice, submit_each,
};
use crate::error::Result;
use crate::memory::RegionTable;
use crate::segment::{Segment, SegmentKind};

/// In-process copies between registered regions of this engine.
#[derive(Debug)]
pub(crate) struct LocalTransport {
    regions: Arc<ArcSwap<RegionTable>>,
}

impl LocalTransport {
    /// A local transport checking remote addresses against `regions`.
    pub(crate) fn new(regions: Arc<ArcSwap<RegionTable>>) -> LocalTransport {
        LocalTransport { regions }
    }
}

impl LocalTransport {
    /// Copy one slice between two regions of this process, on whichever
    /// thread calls (the transport keeps no per-worker state).
    #[inline]
    fn copy(&self, s: &Slice<'_>) -> PackedOutcome {
        if !self.reaches(s.segment) {
            return SubmitOutcome::Rejected(ErrorKind::Unreachable).into();
        }
        match self.regions.load().find_addr(s.remote, s.len) {
            Ok((_, remote)) => {
                // SAFETY: `local` was bounds-checked by the engine and `remote` by find_addr, both inside live registrations.
                unsafe { copy_slice(s.opcode, s.local, remote, s.len as usize) };
                SubmitOutcome::Completed(Ok(s.len))
            }
            Err(e) => SubmitOutcome::Completed(Err(e)),
        }
        .into()
    }
}

impl Transport for LocalTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }

    fn install(&self, _ctx: &InstallContext) -> Result<()> {
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: true,
            remote: false,
            slice_bytes: 0,
            wakes_worker: false,
            parks_worker: false,
        }
    }

    fn reaches(&self, segment: &Segment) -> bool {
        matches!(segment.kind(), SegmentKind::Local)
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        submit_each(self, ctx, slices, out);
    }

    #[inline]
    fn submit_one(&self, _ctx: &WorkerCtx, s: &Slice<'_>) -> PackedOutcome {
        self.copy(s)
    }

    #[inline]
    fn submits_inline(&self) -> bool {
        true
    }

    fn submit_inline(&self, s: &Slice<'_>, _memo: &mut InlineMemo) -> Option<PackedOutcome> {
        Some(self.copy(s))
    }

    fn poll(&self, _ctx: &WorkerCtx, _out: &mut [SliceCompletion]) -> usize {
        0
    }

    fn abort(&self, _ctx: &WorkerCtx, _token: u64, _kind: ErrorKind) {
        // Synchronous: every slice is done when `submit` returns, so
        // nothing is ever in flight here to stop.
    }
}
