//! The in-flight book: the slices a worker has handed to asynchronous
//! transports and not reaped, by the transport instance that holds them.
//!
//! Reaping polls the instances written here, not the transport slots, so a
//! transport swapped out of its slot keeps being polled until the slices
//! posted on it come back: none is orphaned. The worker's credit window
//! (`WorkerShared::credits`) counts the same slices for flow control; this
//! book says where they are.

use std::sync::Arc;

use tent_rings::{ErrorKind, TransportKind};

use crate::engine::slot_index;
use crate::transport::{Installed, SliceCompletion, WorkerCtx};

/// Swapped-out transport instances tracked before the list grows.
pub(super) const DRAINING_AT_START: usize = 8;

/// A transport instance with slices posted on it.
pub(super) struct PostedOn {
    kind: TransportKind,
    transport: Arc<Installed>,
    inflight: u32,
}

/// Where a reaping pass has got to: the slots, then the drained list.
#[derive(Debug, Default)]
pub(super) struct ReapCursor {
    slot: usize,
    draining: usize,
}

/// See the module doc.
pub(super) struct InFlightBook {
    /// Per slot: the instance this worker has slices posted on.
    posted: [Option<PostedOn>; 5],
    /// Instances swapped out of their slot with slices still posted.
    draining: Vec<PostedOn>,
    /// Slices posted and not reaped, over every instance.
    total: u32,
}

impl InFlightBook {
    pub(super) fn new() -> InFlightBook {
        InFlightBook {
            posted: std::array::from_fn(|_| None),
            draining: Vec::with_capacity(DRAINING_AT_START),
            total: 0,
        }
    }

    /// Anything in flight?
    #[inline]
    pub(super) fn any(&self) -> bool {
        self.total > 0
    }

    /// A slice was posted on `installed`, the instance in `kind`'s slot. A
    /// first post on a new instance (the slot was swapped) keeps the
    /// previous one polled until its slices drain.
    #[inline]
    pub(super) fn posted(&mut self, kind: TransportKind, installed: &Arc<Installed>) {
        self.total += 1;
        match &mut self.posted[slot_index(kind)] {
            Some(p) if Arc::ptr_eq(&p.transport, installed) => p.inflight += 1,
            other => {
                // Rare: the only Arc clone.
                let next = PostedOn {
                    kind,
                    transport: installed.clone(),
                    inflight: 1,
                };
                if let Some(prev) = other.replace(next)
                    && prev.inflight > 0
                {
                    self.draining.push(prev);
                }
            }
        }
    }

    /// One completion was reaped (the poll that returned it has already
    /// counted it off its instance).
    #[inline]
    pub(super) fn reaped(&mut self) {
        self.total = self.total.saturating_sub(1);
    }

    /// Poll the next instance with slices out, from `cursor` on, into
    /// `out`: the transport it was and how many completions it wrote, or
    /// `None` once every instance has been polled. An instance of the
    /// drained list whose last slice came back is let go.
    #[inline]
    pub(super) fn poll_next(
        &mut self,
        cursor: &mut ReapCursor,
        ctx: &WorkerCtx,
        out: &mut [SliceCompletion],
    ) -> Option<(TransportKind, usize)> {
        while cursor.slot < self.posted.len() {
            let k = cursor.slot;
            cursor.slot += 1;
            let Some(p) = self.posted[k].as_mut() else {
                continue;
            };
            if p.inflight == 0 {
                continue;
            }
            let n = p.transport.transport.poll(ctx, out);
            p.inflight = p.inflight.saturating_sub(n as u32);
            if n > 0 {
                return Some((p.kind, n));
            }
        }
        while cursor.draining < self.draining.len() {
            let d = cursor.draining;
            let p = &mut self.draining[d];
            let n = p.transport.transport.poll(ctx, out);
            p.inflight = p.inflight.saturating_sub(n as u32);
            let kind = p.kind;
            if p.inflight == 0 {
                // The entry moved into `d` is polled next.
                self.draining.swap_remove(d);
            } else {
                cursor.draining += 1;
            }
            if n > 0 {
                return Some((kind, n));
            }
        }
        None
    }

    /// Tell every instance with slices out to abort those of `token` (which
    /// instances hold a task's slices is not tracked per task; one with
    /// none of them does nothing).
    pub(super) fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        for p in self.holding() {
            p.transport.transport.abort(ctx, token, kind);
        }
    }

    /// Do all instances with slices out wake the worker when one completes
    /// (by ringing its bell, or, for one of them at most, by being the
    /// one it parks in: [`InFlightBook::parker`])?
    pub(super) fn completions_wake(&self) -> bool {
        let mut parkers = 0;
        for p in self.holding() {
            if p.transport.caps.parks_worker && !p.transport.caps.wakes_worker {
                parkers += 1;
            } else if !p.transport.caps.wakes_worker {
                return false;
            }
        }
        parkers <= 1
    }

    /// The instance the worker must park in (it sleeps until one of its
    /// completions or the bell), when one holding slices needs that.
    pub(super) fn parker(&self) -> Option<&Arc<Installed>> {
        self.holding()
            .find(|p| p.transport.caps.parks_worker && !p.transport.caps.wakes_worker)
            .map(|p| &p.transport)
    }

    /// Each transport still holding slices, and how many (for the
    /// shutdown drain's log).
    pub(super) fn held(&self) -> impl Iterator<Item = (TransportKind, u32)> + '_ {
        self.holding().map(|p| (p.kind, p.inflight))
    }

    fn holding(&self) -> impl Iterator<Item = &PostedOn> {
        self.posted
            .iter()
            .flatten()
            .chain(self.draining.iter())
            .filter(|p| p.inflight > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlightBook, ReapCursor};
    use crate::error::Result;
    use crate::segment::Segment;
    use crate::transport::{
        Capabilities, InstallContext, Installed, Slice, SliceCompletion, SubmitOutcome, Transport,
        WorkerCtx,
    };
    use crate::worker_ctx::EngineId;
    use parking_lot::Mutex;
    use std::sync::Arc;
    use tent_rings::{ErrorKind, TransportKind};

    /// Hands back the completions the test gives it; remembers aborts.
    #[derive(Debug, Default)]
    struct Scripted {
        ready: Mutex<Vec<SliceCompletion>>,
        aborted: Mutex<Vec<u64>>,
    }

    impl Scripted {
        fn complete(&self, token: u64) {
            self.ready.lock().push(SliceCompletion {
                token,
                result: Ok(1),
            });
        }
    }

    impl Transport for Scripted {
        fn kind(&self) -> TransportKind {
            TransportKind::Tcp
        }
        fn install(&self, _: &InstallContext) -> Result<()> {
            Ok(())
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                atomic_submit: false,
                synchronous: false,
                remote: true,
                slice_bytes: 0,
                wakes_worker: true,
                parks_worker: false,
            }
        }
        fn reaches(&self, _: &Segment) -> bool {
            true
        }
        fn submit(&self, _: &WorkerCtx, _: &[Slice<'_>], out: &mut [SubmitOutcome]) {
            out.fill(SubmitOutcome::Posted);
        }
        fn poll(&self, _: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
            let mut ready = self.ready.lock();
            let n = ready.len().min(out.len());
            for (o, c) in out.iter_mut().zip(ready.drain(..n)) {
                *o = c;
            }
            n
        }
        fn abort(&self, _: &WorkerCtx, token: u64, _: ErrorKind) {
            self.aborted.lock().push(token);
        }
    }

    fn installed(t: &Arc<Scripted>) -> Arc<Installed> {
        Arc::new(Installed {
            transport: t.clone(),
            caps: t.capabilities(),
        })
    }

    /// Poll every instance once, as a reaping pass does: the tokens back.
    fn reap(book: &mut InFlightBook, ctx: &WorkerCtx) -> Vec<u64> {
        let mut out = vec![
            SliceCompletion {
                token: 0,
                result: Ok(0)
            };
            8
        ];
        let mut cursor = ReapCursor::default();
        let mut tokens = Vec::new();
        while let Some((kind, n)) = book.poll_next(&mut cursor, ctx, &mut out) {
            assert_eq!(kind, TransportKind::Tcp);
            for c in &out[..n] {
                book.reaped();
                tokens.push(c.token);
            }
        }
        tokens
    }

    #[test]
    fn a_swapped_out_instance_is_polled_until_its_slices_are_back() {
        // SAFETY: this test's context stays on its thread, from a fresh engine id.
        let ctx = unsafe { WorkerCtx::new(EngineId::next(), 0) };
        let (old, new) = (Arc::new(Scripted::default()), Arc::new(Scripted::default()));
        let (old_i, new_i) = (installed(&old), installed(&new));
        let mut book = InFlightBook::new();
        book.posted(TransportKind::Tcp, &old_i);
        book.posted(TransportKind::Tcp, &old_i);
        // The slot was swapped: the old instance drains beside the new.
        book.posted(TransportKind::Tcp, &new_i);
        assert_eq!(book.held().collect::<Vec<_>>().len(), 2);
        book.abort(&ctx, 9, ErrorKind::Canceled);
        assert_eq!(*old.aborted.lock(), [9], "the old one is told too");
        assert_eq!(*new.aborted.lock(), [9]);
        old.complete(1);
        new.complete(3);
        let mut back = reap(&mut book, &ctx);
        back.sort_unstable();
        assert_eq!(back, [1, 3]);
        assert!(book.any(), "one slice still out on the old instance");
        old.complete(2);
        assert_eq!(reap(&mut book, &ctx), [2]);
        assert!(!book.any());
        // The drained instance is let go: the test holds the last reference.
        assert_eq!(Arc::strong_count(&old_i), 1);
        assert_eq!(book.held().count(), 0);
    }
}
