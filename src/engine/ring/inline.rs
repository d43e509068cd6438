//! Inline issue: a small op on a synchronous transport (local, shm)
//! performed by the thread that submits it, as `io_uring_enter` issues a
//! request in the submitter's context and hands it to io-wq only when it
//! would block. The op never crosses to the worker's core: its SQE is not
//! written into the ring, and its CQE goes on the ring's own list of inline
//! completions, which the completion side reads before the worker's CQ.
//!
//! An op is issued inline only when doing so changes nothing another path
//! would see (`Ring::push`, [`InlineIssuer::stage`], [`InlineIssuer::issue`]):
//! - it is at most `inline_max_bytes` and one slice, and the ring has
//!   inline issue on;
//! - fewer than `inline_max_in_flight` of the ring's ops are staged or
//!   unread (deeper queues go faster with the worker's core beside the
//!   submitting thread);
//! - nothing of its ring waits at the worker (every SQE pushed before it
//!   has had its CQE read), so it cannot overtake an older op of any
//!   priority, and the ring has a free slot for each staged op;
//! - it passes the worker's own checks ([`Views::accept`]: fields, bounds,
//!   region key and revocation, segment open, deadline) against the
//!   submitting thread's views of the tables;
//! - the transport that serves it is synchronous and finishes it at once
//!   (a transport getting ready, or a transient fault, sends it to the
//!   worker, where deferral and failover live);
//! - the slot gate is open to its priority, and the gate hears its demand
//!   as it would a worker's task.
//!
//! Lifetimes: each ring's views of the tables sit in its [`InlineSide`]
//! behind a lock that its thread holds while it issues a submit's ops
//! (taken with `try_lock`: a ring that finds it taken sends that submit to
//! the worker, so the submitting thread never waits). `unregister_memory`,
//! `close_segment` and the engine's drop, once they have withdrawn what
//! they remove, take every ring's lock in turn and drop its views
//! ([`InlineRings::release_views`]): a copy in progress ends first, a ring
//! keeps no table with a removed region or segment alive, and its next
//! submit builds its views anew from the engine's tables.
//!
//! Statistics: each side counts its ops in its own [`OpStats`] and
//! [`PriorityStats`] (written only by the ring's thread, as a worker's
//! are); the engine's figures add them to the workers', and a dropped
//! ring's counts are kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use tent_rings::{Cqe, Priority, Sqe};

use super::super::EngineShared;
use super::super::batch::Served;
use super::super::worker::{TurnClock, Verdict, Views, cqe_for, judge, slice_len};
use crate::clock::nanos;
use crate::metrics::ops::{OpSnapshot, OpStats};
use crate::qos::{PriorityStats, QosSnapshot, SendGate};
use crate::transport::{InlineMemo, SubmitOutcome, TransportSlots};

/// Every ring's [`InlineSide`] in one engine, and the counts of rings
/// dropped.
#[derive(Default)]
pub(crate) struct InlineRings {
    live: Mutex<Vec<Arc<InlineSide>>>,
    retired: Mutex<Retired>,
    /// Set by the engine's drop: no op is issued inline after it.
    closed: AtomicBool,
}

#[derive(Default)]
struct Retired {
    ops: OpSnapshot,
    qos: QosSnapshot,
}

/// One ring's side of inline issue: its views (see the module doc) and its
/// counts.
#[derive(Default)]
pub(crate) struct InlineSide {
    views: Mutex<Option<InlineViews>>,
    ops: CachePadded<OpStats>,
    qos: CachePadded<PriorityStats>,
}

/// What a ring consults to issue an op: the worker's views of the tables,
/// and the engine's transports and slot gate.
struct InlineViews {
    views: Views,
    memo: InlineMemo,
    transports: Arc<TransportSlots>,
    gate: Arc<dyn SendGate>,
    gate_always_open: bool,
    tracks_demand: bool,
}

impl InlineViews {
    fn new(engine: &EngineShared) -> InlineViews {
        InlineViews {
            views: Views::new(engine),
            memo: InlineMemo::default(),
            transports: engine.transports.clone(),
            gate: engine.gate.clone(),
            gate_always_open: engine.gate.always_open(),
            tracks_demand: engine.gate.tracks_demand(),
        }
    }
}

impl std::fmt::Debug for InlineRings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineRings")
            .field("live", &self.live.lock().len())
            .finish_non_exhaustive()
    }
}

impl InlineRings {
    fn join(&self) -> Arc<InlineSide> {
        let side = Arc::new(InlineSide::default());
        self.live.lock().push(side.clone());
        side
    }

    /// A ring dropped: keep its counts, forget its side.
    fn leave(&self, side: &Arc<InlineSide>) {
        let mut live = self.live.lock();
        live.retain(|s| !Arc::ptr_eq(s, side));
        let mut r = self.retired.lock();
        side.ops.sum_into(&mut r.ops);
        side.qos.sum_into(&mut r.qos);
    }

    /// No op is issued inline from now on (the engine is stopping).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Drop every ring's views, waiting for a copy in progress on one:
    /// call once what an unregister, a close or the engine's drop removes
    /// is out of the tables (and revoked). Each ring builds its views anew
    /// at its next submit, without it.
    pub(crate) fn release_views(&self) {
        let live = self.live.lock().clone();
        for side in live {
            *side.views.lock() = None;
        }
    }

    /// Inline ops' request counts, dropped rings' included.
    pub(crate) fn op_stats(&self) -> OpSnapshot {
        let live = self.live.lock();
        let mut s = self.retired.lock().ops.clone();
        for side in live.iter() {
            side.ops.sum_into(&mut s);
        }
        s
    }

    /// Inline ops' per-priority counts, dropped rings' included.
    pub(crate) fn qos_stats(&self) -> QosSnapshot {
        let live = self.live.lock();
        let mut q = self.retired.lock().qos;
        for side in live.iter() {
            side.qos.sum_into(&mut q);
        }
        q
    }
}

/// A ring's means to issue ops inline, and the ops and completions it
/// holds.
pub(super) struct InlineIssuer {
    /// Where its views come from (weak: a ring outliving its engine keeps
    /// none of it alive).
    engine: Weak<EngineShared>,
    max_bytes: u64,
    max_timeout_ns: u64,
    /// `block_size`: an op is issued inline only if it is one slice, as
    /// the worker would post it (a range two regions meet in passes there
    /// slice by slice).
    block_size: u64,
    /// The segment the last op found served by a transport that cannot
    /// issue inline (RDMA, TCP): its ops are not staged (they would be
    /// checked here, then again by the worker). Forgotten when the views
    /// are rebuilt.
    not_inline: Option<tent_rings::SegmentId>,
    side: Arc<InlineSide>,
    rings: Arc<InlineRings>,
    /// Ops pushed for inline issue, not submitted yet, in push order.
    staged: Vec<Sqe>,
    /// Bit `p.index()` set: a staged op has priority `p` (or, for bit 2,
    /// one this version does not know).
    staged_levels: u8,
    /// Inline completions not read yet, oldest first. Staged ops and these
    /// together are at most `depth` (both allocated once).
    done: VecDeque<Cqe>,
    /// The most staged and unread inline ops at once: the ring's depth, or
    /// `inline_max_in_flight` if less.
    depth: usize,
}

impl InlineIssuer {
    /// `None` when `inline_max_bytes` is 0.
    pub(super) fn new(engine: &Arc<EngineShared>, depth: u32) -> Option<InlineIssuer> {
        let cfg = &engine.config;
        if cfg.inline_max_bytes == 0 {
            return None;
        }
        let depth = depth as usize;
        let most = (cfg.inline_max_in_flight as usize).clamp(1, depth);
        Some(InlineIssuer {
            engine: Arc::downgrade(engine),
            max_bytes: cfg.inline_max_bytes,
            max_timeout_ns: nanos(cfg.max_timeout_ms.max(cfg.default_timeout_ms)),
            block_size: cfg.block_size,
            not_inline: None,
            side: engine.inline.join(),
            rings: engine.inline.clone(),
            staged: Vec::with_capacity(most),
            staged_levels: 0,
            done: VecDeque::with_capacity(most),
            depth: most,
        })
    }

    /// Take `sqe` to issue at the next submit, if it may be issued inline
    /// (the caller checked that nothing of the ring waits at the worker):
    /// small enough, and fewer than `inline_max_in_flight` staged and
    /// unread. Otherwise it is handed back, and it goes to the worker.
    #[inline]
    pub(super) fn stage(&mut self, sqe: Sqe) -> Result<(), Sqe> {
        if sqe.len() > self.max_bytes
            || self.staged.len() + self.done.len() >= self.depth
            || self.not_inline == Some(sqe.remote().segment)
        {
            return Err(sqe);
        }
        self.staged_levels |= 1 << level(&sqe).index();
        self.staged.push(sqe);
        Ok(())
    }

    /// Ops staged and not submitted.
    #[inline]
    pub(super) fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Hand every staged op to `to_worker`, in push order (an op that may
    /// not be issued inline came after them: they must reach the worker
    /// first). `to_worker` answers false when the ring had no room (the
    /// ring keeps room for every staged op, so never): that op completes
    /// `SqFull` here rather than vanish.
    pub(super) fn unstage(&mut self, mut to_worker: impl FnMut(Sqe) -> bool) {
        self.staged_levels = 0;
        for i in 0..self.staged.len() {
            let sqe = self.staged[i];
            self.hand_over(sqe, &mut to_worker);
        }
        self.staged.clear();
    }

    /// `sqe` to the worker through `to_worker`; if the ring had no room
    /// (never: see [`unstage`](Self::unstage)), its completion says so.
    #[inline]
    fn hand_over(&mut self, sqe: Sqe, to_worker: &mut impl FnMut(Sqe) -> bool) {
        if !to_worker(sqe) {
            refuse_full(&mut self.done, &sqe);
        }
    }

    /// Issue the staged ops (the ring's submit): HIGH first, then MEDIUM,
    /// then LOW, each in push order, as the worker would serve them had
    /// they been published together. Once one may not be issued here, it
    /// and every op after it in that order go to `to_worker` (still in that
    /// order), so none overtakes an op queued at the worker (`to_worker`
    /// as in [`unstage`](Self::unstage)). The side's lock is held for the
    /// pass; when it is taken (an unregister dropping the views), they all
    /// go to the worker. Returns how many were issued here.
    pub(super) fn issue_staged(&mut self, mut to_worker: impl FnMut(Sqe) -> bool) -> usize {
        let n = self.staged.len();
        if n == 0 {
            return 0;
        }
        // The fields apart, so the side's lock and the issue borrow
        // different ones (no `Arc` clone: two locked RMWs a pass).
        let InlineIssuer {
            engine,
            max_timeout_ns,
            block_size,
            not_inline,
            side,
            rings,
            staged,
            staged_levels,
            done,
            ..
        } = self;
        let mut held = side.views.try_lock();
        // Under the lock: an engine seen open here is not past its drop's
        // `release_views`, which waits for this pass.
        let mut views = None;
        if let Some(slot) = held.as_deref_mut()
            && !rings.is_closed()
        {
            if slot.is_none()
                && let Some(engine) = engine.upgrade()
            {
                *slot = Some(InlineViews::new(&engine));
                *not_inline = None;
            }
            if let Some(v) = slot.as_mut() {
                v.views.refresh_slots(&v.transports);
                views = Some(v);
            }
        }
        let mut pass = Pass {
            side,
            done,
            not_inline,
            max_timeout_ns: *max_timeout_ns,
            block_size: *block_size,
        };
        let mut here = 0;
        // One pass per priority staged (most submits stage one).
        let mixed = staged_levels.count_ones() > 1;
        for p in [Priority::High, Priority::Medium, Priority::Low] {
            if *staged_levels & (1 << p.index()) == 0 {
                continue;
            }
            for &sqe in staged.iter() {
                if mixed && level(&sqe) != p {
                    continue;
                }
                let issued = match views.as_deref_mut() {
                    Some(v) => pass.issue(v, &sqe),
                    None => false,
                };
                if issued {
                    here += 1;
                } else {
                    views = None;
                    if !to_worker(sqe) {
                        refuse_full(pass.done, &sqe);
                    }
                }
            }
        }
        drop(held);
        staged.clear();
        *staged_levels = 0;
        here
    }

    /// Has the engine stopped issuing inline?
    #[inline]
    pub(super) fn is_closed(&self) -> bool {
        self.rings.is_closed()
    }

    /// The oldest inline completion not read yet.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Cqe> {
        self.done.pop_front()
    }

    /// Inline completions not read yet.
    #[inline]
    pub(super) fn ready(&self) -> bool {
        !self.done.is_empty()
    }
}

/// What one `issue_staged` pass writes besides the views: the issuer's
/// fields apart from its staged ops.
struct Pass<'a> {
    side: &'a InlineSide,
    done: &'a mut VecDeque<Cqe>,
    not_inline: &'a mut Option<tent_rings::SegmentId>,
    max_timeout_ns: u64,
    block_size: u64,
}

/// `sqe` found no room in the ring: its completion says so.
#[cold]
fn refuse_full(done: &mut VecDeque<Cqe>, sqe: &Sqe) {
    debug_assert!(false, "a staged op found the ring full");
    done.push_back(cqe_for(
        sqe.user_data(),
        Err(tent_rings::ErrorKind::SqFull),
        Served::default(),
    ));
}

impl Pass<'_> {
    /// Perform `sqe` here if it may be (see the module doc; the caller
    /// holds the side's lock, and checked the rest: nothing at the worker,
    /// room):
    /// true when its completion is on the list, false when it goes to the
    /// worker.
    #[inline]
    fn issue(&mut self, iv: &mut InlineViews, sqe: &Sqe) -> bool {
        let len = sqe.len();
        let mut clock = TurnClock::default();
        let user_data = sqe.user_data();
        let v = match iv
            .views
            .accept(sqe, &mut clock, self.max_timeout_ns, None, None)
        {
            Ok(v) => v,
            Err(kind) => {
                // Refused as the worker's intake refuses it.
                if let Some(op) = sqe.opcode() {
                    self.side.ops.refused(op);
                }
                self.done
                    .push_back(cqe_for(user_data, Err(kind), Served::default()));
                return true;
            }
        };
        let Some(installed) = iv.views.slot(v.transport) else {
            return false;
        };
        let p = v.priority;
        if !installed.caps.synchronous || !installed.transport.submits_inline() {
            *self.not_inline = Some(sqe.remote().segment);
            return false;
        }
        if slice_len(len, installed.caps, self.block_size) < len
            || !(iv.gate_always_open || iv.gate.can_send(p, clock.now()))
        {
            return false;
        }
        // The gate hears this op as it would a worker's task: its start and
        // its end.
        let demand = iv.tracks_demand && p != Priority::Low;
        if demand {
            iv.gate.demand(p, true);
        }
        // SAFETY: the segment and region are in this issuer's cached tables, which hold them until its next load, after this call; the caller holds the side's lock, which an unregister or close takes (`release_views`) before it returns.
        let slice = unsafe { v.whole(sqe) };
        let outcome = installed
            .transport
            .submit_inline(&slice, &mut iv.memo)
            .map(|o| o.unpack())
            .unwrap_or(SubmitOutcome::Later);
        if demand {
            iv.gate.demand(p, false);
        }
        // Anything but done (a transport getting ready, a transient fault)
        // moved no byte that matters: the worker takes it from the start,
        // where deferral and failover live.
        let Verdict::Done(res) = judge(outcome, false) else {
            return false;
        };
        self.side.qos.served_at_intake(p);
        self.side
            .ops
            .inline(v.opcode, v.transport, p, res, res.unwrap_or(0));
        let served = Served {
            transport: v.transport,
            failover_count: 0,
            exhausted: false,
        };
        self.done.push_back(cqe_for(user_data, res, served));
        true
    }
}

/// The pass an op is issued in: its priority, or the last for one this
/// version does not know (`accept` refuses it).
#[inline]
fn level(sqe: &Sqe) -> Priority {
    sqe.priority().unwrap_or(Priority::Low)
}

impl Drop for InlineIssuer {
    fn drop(&mut self) {
        self.rings.leave(&self.side);
    }
}

#[cfg(test)]
mod tests {
    use super::{InlineRings, InlineViews};
    use crate::engine::Engine;
    use std::time::Duration;

    /// An unregister's `release_views` waits for a ring's pass in progress
    /// (it holds the side's lock), then leaves it no views.
    #[test]
    fn release_views_waits_for_a_pass_in_progress_and_drops_the_views() {
        let e = Engine::new(crate::Config::default()).unwrap();
        let e = e.embedded().expect("embedded");
        let rings: &InlineRings = &e.shared.inline;
        let side = rings.join();
        let mut pass = side.views.lock();
        *pass = Some(InlineViews::new(&e.shared));
        std::thread::scope(|s| {
            let release = s.spawn(|| rings.release_views());
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                !release.is_finished(),
                "release_views returned during a pass"
            );
            drop(pass);
            release.join().unwrap();
        });
        assert!(side.views.lock().is_none());
        // While it is held, a pass finds it taken and issues nothing.
        let held = side.views.lock();
        assert!(side.views.try_lock().is_none());
        drop(held);
        rings.leave(&side);
    }
}
