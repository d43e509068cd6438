//! Transports: how a slice of a request is moved.
//!
//! A transport is installed once (installation may fail: the engine then
//! runs without it), states its [`Capabilities`], and answers every slice it
//! is given with its own [`SubmitOutcome`]: a submit never fails "as a
//! whole", so the engine always knows which slices started. Transports live
//! in [`TransportSlots`], one slot per [`TransportKind`] (a test, with the
//! `testing` feature, may swap a slot after the engine is built). `submit` and `poll` take the
//! calling worker's [`WorkerCtx`], which opens the transport's
//! [`PerWorker`] state; one transport serves one engine.

#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub(crate) mod local;
mod outcome;
pub mod rails;
pub mod rdma;
pub mod shm;
pub mod tcp;

pub use crate::worker_ctx::{EngineId, PerWorker, WorkerCtx};

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tent_rings::{ErrorKind, Opcode, TransportKind};

use crate::control::SegmentDescriptor;
use crate::error::Result;
use crate::segment::{Attachment, Segment};

/// What a transport can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Submitting a list either starts every slice or none of them.
    pub atomic_submit: bool,
    /// Slices complete inside `submit` (no `poll` needed).
    pub synchronous: bool,
    /// Reaches memory in another process.
    pub remote: bool,
    /// Preferred slice length in bytes (0: the engine's `block_size`).
    pub slice_bytes: u64,
    /// Calls `InstallContext::wakers.completion_ready` for every
    /// completion, so a worker waiting only on it may sleep.
    pub wakes_worker: bool,
    /// Can sleep the worker until one of its completions or the worker's
    /// bell ([`Transport::park`]): a worker with slices out only here (and
    /// on transports that wake it) parks in it instead of polling.
    pub parks_worker: bool,
}

/// One slice handed to a transport.
#[derive(Debug, Clone, Copy)]
pub struct Slice<'a> {
    /// Echoed back in the slice's completion.
    pub token: u64,
    /// READ (remote → local) or WRITE (local → remote).
    pub opcode: Opcode,
    /// Local memory, already checked against the local registration.
    pub local: *mut u8,
    /// The registered region `local` lies in (its RDMA lkeys); the task
    /// holds it until every slice of it has completed.
    pub region: &'a crate::memory::MemRegion,
    /// The segment the remote side belongs to.
    pub segment: &'a Segment,
    /// Remote address inside the segment.
    pub remote: u64,
    /// Bytes.
    pub len: u64,
    /// Bytes of the request from this slice's start to the request's end
    /// (this slice included): how a multi-rail transport plans the rest
    /// of the request. For a block list's request, whose slices are cut at
    /// each run's end too, the rest in slices of this one's length is an
    /// estimate.
    pub rest: u64,
    /// The lane it was posted from (its request's priority, or higher once
    /// promoted): transports keep HIGH ahead of bulk in their own queues.
    pub priority: tent_rings::Priority,
}

impl Slice<'_> {
    /// Slices of the request still to post, this one included (the engine
    /// cuts a request into slices of this one's length, the last shorter;
    /// a block list's, at its runs' ends too, so there it is an estimate).
    #[inline]
    pub(crate) fn slices_left(&self) -> u64 {
        self.rest.max(self.len).div_ceil(self.len.max(1))
    }
}

pub use crate::transport::rails::RailStat;
pub use outcome::{PackedOutcome, SubmitOutcome};

/// A worker's slices out to one peer of a network transport, and whether
/// the peer is on that worker's active list (polled until its slices
/// drain).
#[derive(Debug, Default)]
pub(crate) struct PeerActivity {
    outstanding: u32,
    active: bool,
}

impl PeerActivity {
    /// One more slice out; `true` when the peer has just become active
    /// (the caller puts it on its list).
    #[inline]
    pub(crate) fn posted(&mut self) -> bool {
        self.outstanding += 1;
        !std::mem::replace(&mut self.active, true)
    }

    /// One slice back.
    #[inline]
    pub(crate) fn completed(&mut self) {
        self.outstanding -= 1;
    }

    /// `true`, once, when nothing is out any more: the peer leaves the
    /// list.
    #[inline]
    pub(crate) fn drained(&mut self) -> bool {
        let drained = self.outstanding == 0 && self.active;
        if drained {
            self.active = false;
        }
        drained
    }
}

/// A slice completion reaped by [`Transport::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceCompletion {
    /// The slice's token.
    pub token: u64,
    /// Bytes moved, or why not.
    pub result: Result<u64, ErrorKind>,
}

/// What a transport learns at installation.
#[derive(Debug, Clone)]
pub struct InstallContext {
    /// The engine installing it: a transport with [`PerWorker`] state binds
    /// it to this engine ([`PerWorker::bind`]) and so refuses a second one.
    pub engine: EngineId,
    /// Number of engine workers (transports keep per-worker state).
    pub workers: usize,
    /// The workers' bells: a transport that completes slices on its own
    /// threads calls `wakers.completion_ready(worker)` after publishing
    /// one, and says so with [`Capabilities::wakes_worker`].
    pub wakers: Arc<crate::doorbell::Wakers>,
    /// Where the workers run (NUMA nodes): a multi-rail transport ranks
    /// its rails into tiers per worker and memory node from it.
    pub placement: Arc<rails::Placement>,
    /// The engine's link watch: a transport with rails on network
    /// interfaces starts it and listens.
    pub links: Arc<rails::RailLinks>,
}

/// A way of moving bytes.
///
/// `submit` and `poll` run on a worker's thread and get its [`WorkerCtx`]:
/// state a transport keeps per worker lives in a [`PerWorker`], which the
/// context opens with no lock. A transport with such state serves one
/// engine; `install` into a second fails.
pub trait Transport: Send + Sync + 'static {
    /// Which slot it occupies.
    fn kind(&self) -> TransportKind;

    /// Bring the transport up; an error leaves its slot empty.
    ///
    /// # Errors
    /// Whatever stops it coming up; `InvalidArgument` when its per-worker
    /// state already belongs to another engine.
    fn install(&self, ctx: &InstallContext) -> Result<()>;

    /// What it can do.
    fn capabilities(&self) -> Capabilities;

    /// Can it reach `segment` at all?
    fn reaches(&self, segment: &Segment) -> bool;

    /// Start (or, if synchronous, perform) each slice; `out[i]` answers
    /// `slices[i]`. `ctx` is the calling worker's (`ctx.index()`).
    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]);

    /// [`submit`](Self::submit) for one slice, its outcome returned in a
    /// register ([`PackedOutcome`]): the worker's inline path for small
    /// ops. A synchronous transport implements it (and `submit` through
    /// it, `submit_each`).
    fn submit_one(&self, ctx: &WorkerCtx, slice: &Slice<'_>) -> PackedOutcome {
        let mut out = [SubmitOutcome::Rejected(ErrorKind::Unreachable)];
        self.submit(ctx, std::slice::from_ref(slice), &mut out);
        out[0].into()
    }

    /// Perform `slice` on the calling thread, which is not a worker (a
    /// ring's inline issue, on the application's thread): `None` when this
    /// transport cannot (it is not synchronous). Never blocks; the caller
    /// has checked the slice as a worker's intake does, and keeps what it
    /// names alive until this returns.
    fn submit_inline(&self, _slice: &Slice<'_>, _memo: &mut InlineMemo) -> Option<PackedOutcome> {
        None
    }

    /// Does [`submit_inline`](Self::submit_inline) perform slices (not
    /// answer `None`)? Asked before an op is tried inline, so one this
    /// transport cannot take is not announced to the slot gate.
    fn submits_inline(&self) -> bool {
        false
    }

    /// Reap completions of posted slices into `out`; returns how many.
    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize;

    /// Stop every slice of `token` that worker `ctx` posted here and that
    /// has not completed. Each such slice still completes through `poll`
    /// (with `kind`, or its own result if it finished first), and only
    /// once nothing — no thread of the transport, no NIC, no kernel send
    /// queue — will touch its local buffer again. Must not block (no lock
    /// that a connecting or I/O thread may hold, no waiting syscall): the
    /// quiescence arrives later, through `poll`.
    ///
    /// The worker calls it when a task with slices in flight passes its
    /// deadline, is canceled, or the engine shuts down, and delivers the
    /// task's completion only once every slice is back: a completion
    /// means the engine is done with the memory. Calling it again, or for
    /// a token with nothing in flight here, does nothing.
    fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind);

    /// A network transport's view of the peer `name` from its descriptor,
    /// which the segment keeps for it (its rails, keys, per-worker
    /// connections); `None`: this transport does not reach peers by
    /// descriptor (local, shm), or `desc` does not offer it.
    ///
    /// # Errors
    /// `Unreachable` when no rail pairs with the peer; others when the
    /// transport cannot take a peer at all (threads, memory).
    fn attach_peer(&self, name: &str, desc: &SegmentDescriptor) -> Option<Result<Attachment>> {
        let _ = (name, desc);
        None
    }

    /// The rails this transport has to `segment`, with their health and
    /// counters (empty: it has none there).
    fn rail_stats(&self, segment: &Segment) -> Vec<RailStat> {
        let _ = segment;
        Vec::new()
    }

    /// The rail policy its rails apply as they fail (`None`: it has no
    /// rails): `Engine::reload` changes it in place.
    fn live_rail_policy(&self) -> Option<Arc<rails::LiveRailPolicy>> {
        None
    }

    /// The selector its rails pick with (`None`: it has no rails):
    /// `Engine::reload` replaces it, each worker sees it at its next pick.
    fn live_selector(&self) -> Option<Arc<rails::LiveSelector>> {
        None
    }

    /// Sleep worker `ctx` until one of this transport's completions is
    /// ready, the worker's bell `word` moves off `seen` (a futex word: a
    /// submitter bumps it and wakes it), or `timeout` passes. Called only
    /// when the transport says [`Capabilities::parks_worker`]; spurious
    /// returns are fine (the worker looks again).
    fn park(&self, ctx: &WorkerCtx, word: &std::sync::atomic::AtomicU32, seen: u32, timeout: std::time::Duration) {
        let _ = ctx;
        crate::doorbell::wait_on(word, seen, timeout);
    }

    /// Worker `ctx` is leaving, with nothing of its in flight here: let go
    /// of what the transport keeps for it (sockets, a ring) on its own
    /// thread. Not called for a worker that never started.
    fn worker_exit(&self, ctx: &WorkerCtx) {
        let _ = ctx;
    }

    /// Join every thread of the transport. The engine calls it once its
    /// workers are done (nothing of theirs in flight).
    fn stop(&self) {}
}

/// One transport slot: swappable at run time, and cheap to watch from a
/// worker (an `Arc` so a worker can keep an `arc_swap::Cache` of it).
pub(crate) type Slot = Arc<ArcSwapOption<Installed>>;

/// The transport slots, indexed by [`TransportKind`].
pub(crate) struct TransportSlots {
    slots: [Slot; 5],
    /// Bumped after every swap: a worker keeps its own copy of the slots
    /// and reloads them only when this moved (one load per turn, instead
    /// of an arc-swap cache check per slot per op).
    epoch: crossbeam_utils::CachePadded<std::sync::atomic::AtomicU64>,
}

/// What a thread issuing ops inline keeps between them for the transports
/// ([`Transport::submit_inline`]): its view of the shm peer it reached
/// last (a worker keeps one per peer; a submitting thread, one). Opaque.
#[derive(Default)]
pub struct InlineMemo {
    pub(crate) shm: Option<shm::ThreadView>,
}

impl std::fmt::Debug for InlineMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineMemo")
            .field("shm", &self.shm.is_some())
            .finish()
    }
}

/// An installed transport with its capabilities read once at install time
/// (a sized wrapper so `arc-swap` can hold it).
pub(crate) struct Installed {
    /// The transport.
    pub transport: Arc<dyn Transport>,
    /// `transport.capabilities()`, cached.
    pub caps: Capabilities,
}

impl std::fmt::Debug for TransportSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportSlots")
            .field("installed", &self.installed())
            .finish()
    }
}

impl Default for TransportSlots {
    fn default() -> Self {
        TransportSlots {
            slots: std::array::from_fn(|_| Arc::new(ArcSwapOption::empty())),
            epoch: Default::default(),
        }
    }
}

impl TransportSlots {
    /// Put `t` in `kind`'s slot, returning what was there.
    pub(crate) fn swap(
        &self,
        t: Option<Arc<dyn Transport>>,
        kind: TransportKind,
    ) -> Option<Arc<dyn Transport>> {
        let installed = t.map(|transport| {
            let caps = transport.capabilities();
            Arc::new(Installed { transport, caps })
        });
        let old = self.slots[kind as usize].swap(installed);
        // Release, after the store: a worker that reads the new epoch
        // (Acquire) and then loads the slots sees this swap.
        self.epoch
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        old.map(|old| old.transport.clone())
    }

    /// How many swaps so far (see [`load_all`](Self::load_all)).
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every slot's transport now, indexed by [`TransportKind`]: a
    /// worker's copy, reloaded when [`epoch`](Self::epoch) moves.
    pub(crate) fn load_all(&self) -> [Option<Arc<Installed>>; 5] {
        std::array::from_fn(|k| self.slots[k].load_full())
    }

    /// The slot of `kind` (workers cache it).
    pub(crate) fn slot(&self, kind: TransportKind) -> &Slot {
        &self.slots[kind as usize]
    }

    /// Every slot.
    pub(crate) fn all(&self) -> &[Slot] {
        &self.slots
    }

    /// Kinds with a transport installed.
    pub(crate) fn installed(&self) -> Vec<TransportKind> {
        self.slots
            .iter()
            .filter_map(|s| s.load().as_ref().map(|t| t.transport.kind()))
            .collect()
    }
}

/// Copy `len` bytes for `opcode` between local and remote memory.
///
/// # Safety
/// Both pointers must be valid for `len` bytes; the ranges may overlap.
#[inline]
pub(crate) unsafe fn copy_slice(opcode: Opcode, local: *mut u8, remote: *mut u8, len: usize) {
    let (src, dst) = match opcode {
        Opcode::Write => (local as *const u8, remote),
        Opcode::Read => (remote as *const u8, local),
    };
    if len <= 16 {
        // SAFETY: as below; `small_copy` reads every byte before it writes one, so overlap is allowed too.
        unsafe { small_copy(src, dst, len) };
        return;
    }
    // SAFETY: the caller guarantees both ranges are valid; `copy` allows overlap (a loopback transfer may name the same memory on both sides).
    unsafe { std::ptr::copy(src, dst, len) };
}

/// `submit` for a transport that does its work in `submit_one` (the
/// synchronous ones): each slice in turn, its outcome in `out`.
#[inline]
pub(crate) fn submit_each<T: Transport + ?Sized>(
    t: &T,
    ctx: &WorkerCtx,
    slices: &[Slice<'_>],
    out: &mut [SubmitOutcome],
) {
    for (s, o) in slices.iter().zip(out.iter_mut()) {
        *o = t.submit_one(ctx, s).unpack();
    }
}

/// `submit` for a network transport, whose peers hang off the segments as
/// attachments: open this worker's state `W` of the transport (every slice
/// refused with its error when it cannot be), then hand each slice to
/// `post` with the segment's attachment for `kind` and that attachment as
/// the transport's peer type `P` (`Unreachable` when the segment has none).
#[inline]
pub(crate) fn submit_to_peers<W, P: std::any::Any>(
    kind: TransportKind,
    workers: &PerWorker<W>,
    ctx: &WorkerCtx,
    slices: &[Slice<'_>],
    out: &mut [SubmitOutcome],
    mut post: impl FnMut(&mut W, &Attachment, &P, &Slice<'_>) -> SubmitOutcome,
) {
    let mut ws = match workers.get(ctx) {
        Ok(ws) => ws,
        Err(e) => return out.fill(SubmitOutcome::Rejected(e)),
    };
    for (s, o) in slices.iter().zip(out.iter_mut()) {
        *o = match s.segment.attached_with_handle::<P>(kind) {
            Some((attached, peer)) => post(&mut ws, attached, peer, s),
            None => SubmitOutcome::Rejected(ErrorKind::Unreachable),
        };
    }
}

/// Copy `len <= 16` bytes with two (possibly overlapping) loads and two
/// stores of the largest width that fits, all loads first: no call into
/// libc's `memmove` for a small op (its dispatch costs more than the copy).
///
/// # Safety
/// `src` valid for `len` reads and `dst` for `len` writes; they may overlap.
#[inline(always)]
unsafe fn small_copy(src: *const u8, dst: *mut u8, len: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY: each access covers [0, w) or [len - w, len) with w <= len, inside both ranges; both loads happen before either store.
    unsafe {
        match len {
            8..=16 => {
                let (a, b) = (rd(src.cast::<u64>()), rd(src.add(len - 8).cast::<u64>()));
                wr(dst.cast::<u64>(), a);
                wr(dst.add(len - 8).cast::<u64>(), b);
            }
            4..=7 => {
                let (a, b) = (rd(src.cast::<u32>()), rd(src.add(len - 4).cast::<u32>()));
                wr(dst.cast::<u32>(), a);
                wr(dst.add(len - 4).cast::<u32>(), b);
            }
            2..=3 => {
                let (a, b) = (rd(src.cast::<u16>()), rd(src.add(len - 2).cast::<u16>()));
                wr(dst.cast::<u16>(), a);
                wr(dst.add(len - 2).cast::<u16>(), b);
            }
            1 => *dst = *src,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_any_small_length_moves_exactly_its_bytes_even_overlapping() {
        for len in 0..=40usize {
            for opcode in [Opcode::Write, Opcode::Read] {
                let mut a: Vec<u8> = (0..64).collect();
                let mut b = vec![0xEEu8; 64];
                // SAFETY: both buffers hold 64 bytes, len + 3 <= 64.
                unsafe { copy_slice(opcode, a.as_mut_ptr().add(3), b.as_mut_ptr().add(5), len) };
                let (src, dst) = match opcode {
                    Opcode::Write => (&a, &b),
                    Opcode::Read => (&b, &a),
                };
                let mut want = match opcode {
                    Opcode::Write => vec![0xEEu8; 64],
                    Opcode::Read => (0..64).collect(),
                };
                let from = if opcode == Opcode::Write { 3 } else { 5 };
                let to = if opcode == Opcode::Write { 5 } else { 3 };
                want[to..to + len].copy_from_slice(&src[from..from + len]);
                assert_eq!(dst, &want, "len {len} {opcode:?}");
            }
            // One buffer on both sides, shifted by 1 either way: overlap
            // is allowed (a loopback transfer may name the same memory).
            for (from, to) in [(2usize, 3usize), (3, 2)] {
                let mut buf: Vec<u8> = (0..64).collect();
                let mut want = buf.clone();
                want.copy_within(from..from + len, to);
                let p = buf.as_mut_ptr();
                // SAFETY: both ranges lie in `buf` (len + 3 <= 64).
                unsafe { copy_slice(Opcode::Write, p.add(from), p.add(to), len) };
                assert_eq!(buf, want, "len {len} overlapping {from}->{to}");
            }
        }
    }

    #[test]
    fn a_peer_is_active_from_its_first_slice_until_its_last_is_back() {
        let mut a = PeerActivity::default();
        assert!(!a.drained(), "never active: nothing to leave");
        assert!(a.posted(), "first slice: the peer joins the list");
        assert!(!a.posted());
        a.completed();
        assert!(!a.drained());
        a.completed();
        assert!(a.drained(), "last slice back: it leaves");
        assert!(!a.drained(), "once");
        assert!(a.posted(), "and joins again");
    }

    #[test]
    fn every_swap_moves_the_epoch_after_the_slot() {
        let slots = TransportSlots::default();
        let e0 = slots.epoch();
        assert!(slots.load_all().iter().all(Option::is_none));
        let t: Arc<dyn Transport> = Arc::new(shm::ShmTransport);
        assert!(slots.swap(Some(t), TransportKind::Shm).is_none());
        let e1 = slots.epoch();
        assert!(e1 > e0, "a worker would keep its old copy");
        let all = slots.load_all();
        assert!(all[TransportKind::Shm as usize].is_some());
        assert!(all[TransportKind::Local as usize].is_none());
        assert!(slots.swap(None, TransportKind::Shm).is_some());
        assert!(slots.epoch() > e1);
        assert!(slots.load_all()[TransportKind::Shm as usize].is_none());
    }

    #[test]
    fn a_post_maps_to_one_outcome() {
        assert_eq!(SubmitOutcome::of_post(Ok(())), SubmitOutcome::Posted);
        assert_eq!(
            SubmitOutcome::of_post(Err(ErrorKind::SqFull)),
            SubmitOutcome::Rejected(ErrorKind::SqFull)
        );
        assert_eq!(
            SubmitOutcome::of_post(Err(ErrorKind::RouteLost)),
            SubmitOutcome::Completed(Err(ErrorKind::RouteLost))
        );
    }
}
