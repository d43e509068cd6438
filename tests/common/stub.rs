//! [`Synchronous`]: a transport in one slot whose every slice is answered
//! inside `submit` by a closure the test gives (nothing is ever in
//! flight), so a test writes only the behaviour it is about.

use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};
use tent::{ErrorKind, TransportKind};

/// The answer to one slice.
type Answer = dyn Fn(&Slice<'_>) -> SubmitOutcome + Send + Sync;

/// See the module doc.
pub(crate) struct Synchronous {
    kind: TransportKind,
    slice_bytes: u64,
    answer: Box<Answer>,
}

impl Synchronous {
    /// In `kind`'s slot, slices of the engine's block size, each answered
    /// by `answer`.
    pub(crate) fn new(
        kind: TransportKind,
        answer: impl Fn(&Slice<'_>) -> SubmitOutcome + Send + Sync + 'static,
    ) -> Synchronous {
        Synchronous {
            kind,
            slice_bytes: 0,
            answer: Box::new(answer),
        }
    }

    /// Slices of at most `bytes`.
    pub(crate) fn slice_bytes(mut self, bytes: u64) -> Synchronous {
        self.slice_bytes = bytes;
        self
    }
}

impl Transport for Synchronous {
    fn kind(&self) -> TransportKind {
        self.kind
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            synchronous: true,
            slice_bytes: self.slice_bytes,
            ..Capabilities::default()
        }
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        for (s, o) in slices.iter().zip(out) {
            *o = (self.answer)(s);
        }
    }
    fn poll(&self, _: &WorkerCtx, _: &mut [SliceCompletion]) -> usize {
        0
    }
    fn abort(&self, _: &WorkerCtx, _: u64, _: ErrorKind) {
        // Synchronous: nothing is ever in flight.
    }
}
