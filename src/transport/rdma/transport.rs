//! `rdma`: one-sided READ and WRITE over RC queue pairs.
//!
//! A peer is reached over **rails**, each a (local NIC, remote NIC) pair:
//! `max(local, remote)` rails, NIC `i % local` to NIC `i % remote`, so equal
//! NIC counts pair index to index and neither side leaves a NIC idle. Each
//! worker has one [`Endpoint`] per rail per peer, made when the segment is
//! opened and connected (QP, then `QpConnect` over the control plane, on
//! the transport's [`Connector`] thread: the worker never waits on a peer)
//! the first time the worker posts on it; it stays cached with the segment.
//!
//! - **Checked before posting.** The remote range must lie inside one region
//!   of the peer's descriptor (`AddressNotRegistered`, `OutOfBounds`
//!   otherwise), and the rkey comes from that region's entry for the rail's
//!   remote NIC: the application never hands the engine an rkey, and a
//!   region the peer granted no (or a zero) rkey on any NIC is refused with
//!   `AccessDenied` without a work request being built.
//! - **Spraying.** The [`DeviceSelector`] spreads slices round robin over the
//!   rails whose local link is up and whose NICs hold a key for both ends.
//! - **Busy polling.** The worker that posts a slice reaps its completion
//!   (`poll` flushes every active endpoint's backlog as linked WR lists, then
//!   reaps its CQ), so nothing wakes the worker.
//! - **Rails that fail.** A link watch (rtnetlink, on each RoCE NIC's network
//!   device) marks a NIC down the moment its link drops; at the next poll the
//!   worker destroys that rail's QPs and re-posts everything they held on a
//!   sibling rail. A completion that fails for a rail-level reason
//!   (`Unreachable`, `RouteLost`, a NIC failure) moves that slice, and the
//!   work flushed behind it, to a sibling the same way. Only when no rail is
//!   left does the failure reach the task (DESIGN.md's recovery order).
//! - **Aborts.** [`RdmaTransport::abort_token`] stops a task's slices on
//!   every endpoint of the worker: waiting ones end at the next `poll`,
//!   posted ones once their QP, moved to the error state, has flushed them
//!   (see [`Endpoint::abort`]); nothing waits.
//!
//! Nothing in `submit` or `poll` allocates once the scratch queues have
//! grown to the worker's credit bound.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tent_rings::{ErrorKind, TransportKind};

use super::connector::{Connector, ConnectorHandle};
use super::connector::{Queue, QueueSource};
use super::endpoint::{Endpoint, RdmaCompletion, RdmaSlice};
use super::nic::NicSet;
use super::responder::{bootstrap, endpoint};
use crate::clock::monotonic_ns;
use crate::config::Config;
use crate::control::wire::{QpInitiator, QpRequest};
use crate::control::{RegionEntry, SegmentDescriptor};
use crate::error::{Error, Result};
use crate::memory::MemRegion;
use crate::netlink::{self, LinkEvent, LinkWatch};
use crate::segment::Segment;
use crate::transport::rails::{DeviceSelector, RailSpec, SelectorConfig, Spray};
use crate::transport::rails::{RailMonitor, RailPolicy, ReviewClock, review_bandwidth};
use crate::transport::rdma::verbs::{CompletionQueue, QueuePair};
use crate::transport::{
    Capabilities, InstallContext, PerWorker, RailStat, Slice, SliceCompletion, SubmitOutcome,
    Transport, WorkerCtx,
};

/// Times a slice may move between rails (on top of QP re-posts) before its
/// failure reaches the task.
const MAX_RAIL_MOVES: u8 = 8;

/// Settings read once from the config.
#[derive(Debug, Clone)]
struct Settings {
    slice_bytes: u64,
    depth: u32,
    backlog: usize,
    secret: Option<Vec<u8>>,
    connect_timeout: Duration,
    rail_policy: RailPolicy,
    /// This engine's initiator id (`QpInitiator`), drawn once.
    engine: u64,
}

/// One rail to a peer.
#[derive(Debug)]
pub struct RdmaRail {
    /// Index of the local NIC in the engine's [`NicSet`].
    pub local: usize,
    /// Index of the remote NIC in the peer's descriptor.
    pub remote: usize,
    /// The remote NIC's name.
    pub remote_name: String,
    /// Its health (and bytes carried), every worker together.
    pub monitor: RailMonitor,
    /// Slices moved off this rail to a sibling.
    moved: AtomicU64,
}

impl RdmaRail {
    /// Bytes this rail has carried.
    pub fn bytes(&self) -> u64 {
        self.monitor.bytes()
    }

    /// Slices moved off this rail to a sibling rail.
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }
}

/// What a worker has on one peer.
struct PeerEndpoints {
    /// One per rail.
    eps: Vec<Endpoint>,
    /// Round robin over the rails (tier 0, default bandwidth each).
    spray: Spray,
    outstanding: u32,
    active: bool,
}

/// A peer reachable over RDMA: its regions' rkeys and its rails.
pub struct RdmaPeer {
    name: String,
    regions: Vec<RegionEntry>,
    rails: Vec<RdmaRail>,
    nics: Arc<NicSet>,
    next_review: ReviewClock,
    per_worker: PerWorker<PeerEndpoints>,
}

impl std::fmt::Debug for RdmaPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaPeer")
            .field("name", &self.name)
            .field("rails", &self.rails)
            .finish()
    }
}

impl RdmaPeer {
    /// The rails to this peer.
    pub fn rails(&self) -> &[RdmaRail] {
        &self.rails
    }

    /// Each rail's names, link state and counters.
    pub fn rail_stats(&self) -> Vec<RailStat> {
        self.rails
            .iter()
            .map(|r| {
                let up = self.nics.nics()[r.local].is_up();
                r.monitor.stat(TransportKind::Rdma, up, r.moved())
            })
            .collect()
    }

    /// The descriptor region holding `[addr, addr+len)`.
    #[inline]
    pub fn region_of(&self, addr: u64, len: u64) -> std::result::Result<&RegionEntry, ErrorKind> {
        RegionEntry::find(&self.regions, addr, len)
    }

    /// Can rail `r` carry a slice between `local` and `remote` now (link
    /// up, both keys, and its `RailMonitor` lets it)? With `preferred`,
    /// only if it is not demoted for being slow either.
    #[inline]
    fn usable(&self, r: usize, local: &MemRegion, remote: &RegionEntry, preferred: bool) -> bool {
        let rail = &self.rails[r];
        self.nics.nics()[rail.local].is_up()
            && rkey_on(remote, rail.remote).is_some()
            && local.lkey(rail.local).is_some()
            && if preferred {
                rail.monitor.preferred()
            } else {
                rail.monitor.available()
            }
    }

    /// Demote rails that are slow against their siblings (every 100 ms at
    /// most, by whichever worker comes first).
    fn review(&self, now: u64) {
        if self.next_review.due(now) {
            review_bandwidth(
                self.rails.len(),
                |i| &self.rails[i].monitor,
                |i| self.nics.nics()[self.rails[i].local].is_up(),
                now,
            );
        }
    }
}

/// The rkey `region` grants on remote NIC `nic` (zero counts as none).
#[inline]
fn rkey_on(region: &RegionEntry, nic: usize) -> Option<u32> {
    region.rkeys.get(nic).copied().filter(|&k| k != 0)
}

/// Is `kind` the fault of a rail (so a sibling rail may do better)?
#[inline]
fn rail_fault(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Unreachable
            | ErrorKind::RouteLost
            | ErrorKind::LocalNicFailed
            | ErrorKind::LocalNicReboot
            | ErrorKind::RemoteNicFailed
            | ErrorKind::RemoteNicReboot
    )
}

/// Connects QPs for one rail of one peer: a CQ and an RC QP on the local
/// NIC, the peer's end over the control plane (`QpConnect`), then RTR/RTS.
struct RailSource {
    nics: Arc<NicSet>,
    /// The responder's key for this endpoint: (engine, worker, rail).
    initiator: QpInitiator,
    local: usize,
    peer: String,
    remote_nic: String,
    secret: Option<Vec<u8>>,
    timeout: Duration,
    depth: u32,
}

impl QueueSource for RailSource {
    fn connect(&mut self) -> Result<Queue> {
        let nic = &self.nics.nics()[self.local];
        let cq = CompletionQueue::new(&nic.ctx, self.depth as i32)?;
        let qp = QueuePair::new(&nic.pd, &cq, nic.port, Some(nic.gid_index), self.depth)?;
        let theirs = crate::control::connect_qp(
            &self.peer,
            self.secret.as_deref(),
            self.timeout,
            QpRequest {
                initiator: self.initiator,
                initiator_nic: nic.ctx.name().to_owned(),
                target_nic: self.remote_nic.clone(),
                qp: bootstrap(&qp.endpoint()?),
            },
        )?;
        qp.connect(&endpoint(&theirs))?;
        tracing::debug!(peer = %self.peer, local = nic.ctx.name(), remote = %self.remote_nic, "rdma: QP connected");
        Ok(Queue {
            qp: qp.as_raw(),
            cq: cq.as_raw(),
            to_error: crate::transport::rdma::verbs::modify_to_error,
            // The QP first, then its CQ (tuple fields drop in order).
            owner: Box::new((qp, cq)),
        })
    }

    fn peer(&self) -> &str {
        &self.peer
    }
}

/// A worker's scratch space for `poll`.
struct WorkerState {
    /// Peers this worker has slices on (polled until they drain).
    active: Vec<Arc<RdmaPeer>>,
    /// Slice ends waiting to be handed to the engine.
    ready: VecDeque<SliceCompletion>,
    /// Endpoint output of one poll: (rail, completion).
    done: Vec<(usize, RdmaCompletion)>,
    /// Slices leaving a rail: (rail, slice).
    moved: Vec<(usize, RdmaSlice)>,
}

/// The RDMA transport (initiator side; the target side is the NICs' own
/// responder plus [`super::Responder`] for QP bootstrap).
pub struct RdmaTransport {
    nics: Arc<NicSet>,
    settings: Settings,
    workers: PerWorker<WorkerState>,
    selector: DeviceSelector,
    watch: Mutex<Option<LinkWatch>>,
    /// Started by the first `attach`; dropping the transport joins it.
    connector: Mutex<Option<Connector>>,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("nics", &self.nics)
            .field("slice_bytes", &self.settings.slice_bytes)
            .field("depth", &self.settings.depth)
            .finish()
    }
}

impl RdmaTransport {
    /// A transport over `nics` for an engine with `config`.
    pub fn new(config: &Config, nics: Arc<NicSet>) -> RdmaTransport {
        let r = &config.transports.rdma;
        let max_msg = nics
            .nics()
            .iter()
            .map(|n| n.max_msg)
            .min()
            .unwrap_or(1 << 30);
        let max_wr = nics
            .nics()
            .iter()
            .map(|n| n.ctx.max_qp_wr())
            .min()
            .unwrap_or(1)
            .max(1);
        let backlog = config.max_inflight_slices.max(1) as usize;
        let workers = PerWorker::new(config.workers.count.max(1) as usize, |_| WorkerState {
            active: Vec::with_capacity(16),
            ready: VecDeque::with_capacity(backlog),
            done: Vec::with_capacity(backlog),
            moved: Vec::with_capacity(backlog),
        });
        RdmaTransport {
            settings: Settings {
                slice_bytes: r.slice_size.min(max_msg as u64).max(1),
                depth: r.qp_depth.clamp(1, max_wr),
                backlog,
                secret: (!config.rpc_shared_secret.is_empty())
                    .then(|| config.rpc_shared_secret.as_bytes().to_vec()),
                connect_timeout: Duration::from_millis(config.default_timeout_ms.clamp(100, 5_000)),
                rail_policy: RailPolicy::from_config(config),
                engine: crate::control::new_engine_id(),
            },
            nics,
            workers,
            // Round robin until this transport feeds the selector's loads.
            selector: DeviceSelector::new(SelectorConfig {
                smart: false,
                ..SelectorConfig::from_config(config)
            }),
            watch: Mutex::new(None),
            connector: Mutex::new(None),
        }
    }

    /// The connector thread's handle, starting it on first use.
    fn connector(&self) -> Result<ConnectorHandle> {
        let mut c = self.connector.lock().expect("connector poisoned");
        if c.is_none() {
            *c = Some(Connector::start()?);
        }
        Ok(c.as_ref().expect("just set").handle())
    }

    /// The NICs it posts on.
    pub fn nics(&self) -> &Arc<NicSet> {
        &self.nics
    }

    /// Connect-side view of the peer `name` from its descriptor: its rails
    /// and, per worker, one (lazily connected) endpoint per rail.
    pub fn attach(&self, name: &str, desc: &SegmentDescriptor) -> Result<Arc<RdmaPeer>> {
        let (local, remote) = (self.nics.nics().len(), desc.nics.len());
        if remote == 0 || local == 0 {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!("{name}: the peer advertises no RDMA NIC"),
            ));
        }
        let rails: Vec<RdmaRail> = (0..local.max(remote))
            .map(|i| RdmaRail {
                local: i % local,
                remote: i % remote,
                remote_name: desc.nics[i % remote].name.clone(),
                monitor: RailMonitor::new(
                    self.settings.rail_policy,
                    self.nics.nics()[i % local].ctx.name(),
                    desc.nics[i % remote].name.clone(),
                ),
                moved: AtomicU64::new(0),
            })
            .collect();
        let mut regions = desc.regions.clone();
        regions.sort_by_key(|r| r.addr);
        for r in &regions {
            let missing: Vec<&str> = (0..remote)
                .filter(|&n| rkey_on(r, n).is_none())
                .map(|n| desc.nics[n].name.as_str())
                .collect();
            if !missing.is_empty() {
                tracing::warn!(peer = name, region = r.id, nics = ?missing, "descriptor grants no rkey on these NICs for this region: its slices avoid them");
            }
        }
        let s = &self.settings;
        let connector = self.connector()?;
        let per_worker = (0..self.workers.workers())
            .map(|w| {
                let eps = rails
                    .iter()
                    .enumerate()
                    .map(|(r, rail)| {
                        let initiator = QpInitiator::new(s.engine, w, r).map_err(|e| {
                            Error::invalid(format!("{name}: rail {r} of worker {w}: {e}"))
                        })?;
                        let source = RailSource {
                            nics: self.nics.clone(),
                            initiator,
                            local: rail.local,
                            peer: name.to_owned(),
                            remote_nic: rail.remote_name.clone(),
                            secret: s.secret.clone(),
                            timeout: s.connect_timeout,
                            depth: s.depth,
                        };
                        Ok(Endpoint::new(
                            Box::new(source),
                            s.depth,
                            s.backlog,
                            &connector,
                        ))
                    })
                    .collect::<Result<_>>()?;
                let spec = RailSpec {
                    theoretical_bps: self.selector.config().theoretical_bps(None),
                };
                Ok(PeerEndpoints {
                    eps,
                    spray: Spray::new(
                        &self.selector,
                        &vec![spec; rails.len()],
                        &vec![0; rails.len()],
                        w as u64,
                    ),
                    outstanding: 0,
                    active: false,
                })
            })
            .collect::<Result<PerWorker<_>>>()?;
        tracing::info!(peer = name, rails = ?rails.iter().map(|r| format!("{}->{}", self.nics.nics()[r.local].ctx.name(), r.remote_name)).collect::<Vec<_>>(), "rdma peer attached");
        Ok(Arc::new(RdmaPeer {
            name: name.to_owned(),
            regions,
            rails,
            nics: self.nics.clone(),
            next_review: ReviewClock::default(),
            per_worker,
        }))
    }

    /// Queue `s` (between `local` and `remote`) on a usable rail other
    /// than `avoid`, with that rail's keys.
    #[inline]
    fn post(
        &self,
        peer: &RdmaPeer,
        eps: &mut PeerEndpoints,
        mut s: RdmaSlice,
        local: &MemRegion,
        remote: &RegionEntry,
        avoid: Option<usize>,
    ) -> std::result::Result<(), ErrorKind> {
        let rail = eps
            .spray
            .pick(&self.selector, 0, 1, 0, avoid, |r| {
                peer.usable(r, local, remote, true)
            })
            .or_else(|| {
                eps.spray.pick(&self.selector, 0, 1, 0, avoid, |r| {
                    peer.usable(r, local, remote, false)
                })
            })
            .ok_or(ErrorKind::RouteLost)?;
        let r = &peer.rails[rail];
        s.lkey = local.lkey(r.local).ok_or(ErrorKind::RouteLost)?;
        s.rkey = rkey_on(remote, r.remote).ok_or(ErrorKind::RouteLost)?;
        s.ahead = r.monitor.on_post();
        if eps.eps[rail].submit(s) {
            Ok(())
        } else {
            r.monitor.on_leave();
            Err(ErrorKind::SqFull)
        }
    }

    /// Stop every slice of `token` that worker `ctx` posted here and that
    /// has not completed. Each still completes through `poll`, with `kind`
    /// (or its own result if it finished first), and only once the NIC
    /// will not touch its local buffer again: a slice waiting in a backlog
    /// at the next `poll`; a posted one once its QP, moved to the error
    /// state, has flushed it (the other tasks' slices flushed with it are
    /// posted again on a fresh QP, not counted as faults of the rail).
    /// Never waits; a token with nothing here, or aborted before, is left
    /// as it is. `kind` is the task's (`Timeout`, `Canceled`, `Shutdown`),
    /// never a rail fault: nothing aborted moves to a sibling rail.
    pub fn abort_token(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        debug_assert!(!rail_fault(kind), "abort with a rail fault: {kind}");
        // Refused at submit too: nothing of this worker's is here.
        let Ok(mut ws) = self.workers.get(ctx) else {
            return;
        };
        let WorkerState { active, ready, .. } = &mut *ws;
        for peer in active.iter() {
            // Opened with this context when the peer joined `active`.
            let Ok(mut guard) = peer.per_worker.get(ctx) else {
                continue;
            };
            let PeerEndpoints {
                eps, outstanding, ..
            } = &mut *guard;
            for (r, ep) in eps.iter_mut().enumerate() {
                if ep.outstanding() == 0 {
                    continue;
                }
                let monitor = &peer.rails[r].monitor;
                ep.abort(token, kind, &mut |c| {
                    // Ended now (never posted, or its QP destroyed): it
                    // leaves the rail, through no fault of the rail's.
                    monitor.on_leave();
                    *outstanding -= 1;
                    ready.push_back(SliceCompletion {
                        token: c.token,
                        result: c.result,
                    });
                });
            }
        }
    }

    /// Queue `s` again, on a rail other than `from`.
    fn repost(
        &self,
        peer: &RdmaPeer,
        eps: &mut PeerEndpoints,
        s: RdmaSlice,
        from: usize,
    ) -> std::result::Result<(), ErrorKind> {
        // SAFETY: `ctx` is the slice's local region, which its task holds (an Arc) until every slice of it has completed; this slice has not.
        let local = unsafe { &*(s.ctx as *const MemRegion) };
        let remote = peer.region_of(s.remote, s.len as u64)?;
        self.post(peer, eps, s, local, remote, Some(from))
    }
}

/// The RDMA state of `segment`, if RDMA reaches it.
pub fn peer_of(segment: &Segment) -> Option<&RdmaPeer> {
    segment
        .attachment(TransportKind::Rdma)?
        .downcast_ref::<RdmaPeer>()
}

impl Transport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn install(&self, ctx: &InstallContext) -> Result<()> {
        if ctx.workers > self.workers.workers() {
            return Err(Error::invalid(format!(
                "rdma transport built for {} workers, engine has {}",
                self.workers.workers(),
                ctx.workers
            )));
        }
        self.workers.bind(ctx.engine)?;
        let watched: Vec<(usize, u32)> = self
            .nics
            .nics()
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.netdev.as_ref().map(|(_, idx)| (i, *idx)))
            .collect();
        if watched.is_empty() {
            return Ok(());
        }
        let nics = self.nics.clone();
        let on_event = move |ev: LinkEvent| {
            for &(i, idx) in &watched {
                if idx != ev.index {
                    continue;
                }
                let nic = &nics.nics()[i];
                let was = nic.up.swap(ev.up, Ordering::AcqRel);
                let name = nic.ctx.name();
                if was && !ev.up {
                    tracing::warn!(
                        nic = name,
                        "rail down: link lost; in-flight slices move to sibling rails"
                    );
                } else if !was && ev.up {
                    tracing::info!(nic = name, "rail up: link restored");
                }
            }
        };
        match LinkWatch::start(on_event) {
            Ok(w) => *self.watch.lock().expect("link watch poisoned") = Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "rdma: cannot watch link state (rtnetlink); rails rely on completion errors")
            }
        }
        // Links that were already down before the watch started.
        for n in self.nics.nics() {
            if let Some((_, idx)) = &n.netdev
                && let Ok(up) = netlink::link_up(*idx)
            {
                n.up.store(up, Ordering::Release);
            }
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: false,
            remote: true,
            slice_bytes: self.settings.slice_bytes,
            // Workers busy-poll the CQs: nobody rings their bell.
            wakes_worker: false,
        }
    }

    fn reaches(&self, segment: &Segment) -> bool {
        peer_of(segment).is_some()
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let mut ws = match self.workers.get(ctx) {
            Ok(ws) => ws,
            Err(e) => return out.fill(SubmitOutcome::Rejected(e)),
        };
        let now = monotonic_ns();
        for (s, o) in slices.iter().zip(out.iter_mut()) {
            let Some(attached) = s.segment.attachment(TransportKind::Rdma) else {
                *o = SubmitOutcome::Rejected(ErrorKind::Unreachable);
                continue;
            };
            let Some(peer) = attached.downcast_ref::<RdmaPeer>() else {
                *o = SubmitOutcome::Rejected(ErrorKind::Unreachable);
                continue;
            };
            let Ok(len) = u32::try_from(s.len) else {
                // The engine slices at `slice_bytes` (at most the NICs' max
                // message size): a longer slice is a caller bug.
                *o = SubmitOutcome::Completed(Err(ErrorKind::InvalidArgument));
                continue;
            };
            let remote = match peer.region_of(s.remote, s.len) {
                Ok(r) => r,
                Err(e) => {
                    *o = SubmitOutcome::Completed(Err(e));
                    continue;
                }
            };
            if (0..peer.rails.len()).all(|r| rkey_on(remote, peer.rails[r].remote).is_none()) {
                *o = SubmitOutcome::Completed(Err(ErrorKind::AccessDenied));
                continue;
            }
            let slice = RdmaSlice {
                token: s.token,
                opcode: s.opcode,
                local: s.local as u64,
                len,
                lkey: 0,
                remote: s.remote,
                rkey: 0,
                reposts: 0,
                ctx: s.region as *const MemRegion as usize,
                posted_ns: now,
                ahead: 0,
            };
            let mut eps = match peer.per_worker.get(ctx) {
                Ok(e) => e,
                Err(e) => {
                    *o = SubmitOutcome::Rejected(e);
                    continue;
                }
            };
            *o = match self.post(peer, &mut eps, slice, s.region, remote, None) {
                Ok(()) => {
                    eps.outstanding += 1;
                    if !eps.active {
                        eps.active = true;
                        // Rare (first slice since the peer drained): the
                        // only reference-count update on this path.
                        if let Ok(p) = Arc::downcast::<RdmaPeer>(attached.clone()) {
                            ws.active.push(p);
                        }
                    }
                    SubmitOutcome::Posted
                }
                Err(ErrorKind::SqFull) => SubmitOutcome::Rejected(ErrorKind::SqFull),
                Err(e) => SubmitOutcome::Completed(Err(e)),
            };
        }
    }

    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        // Refused at submit too: nothing of this worker's is in flight here.
        let Ok(mut ws) = self.workers.get(ctx) else {
            return 0;
        };
        let ws = &mut *ws;
        let mut i = 0;
        while i < ws.active.len() {
            let peer = &ws.active[i];
            // Opened with this context when the peer joined `active`.
            let Ok(mut guard) = peer.per_worker.get(ctx) else {
                i += 1;
                continue;
            };
            let eps = &mut *guard;
            for r in 0..eps.eps.len() {
                let ep = &mut eps.eps[r];
                if ep.outstanding() == 0 {
                    continue;
                }
                let nic_up = peer.nics.nics()[peer.rails[r].local].is_up();
                if !nic_up {
                    ep.evacuate(&mut |s| ws.moved.push((r, s)), &mut |c| {
                        ws.done.push((r, c))
                    });
                    continue;
                }
                let before = ws.done.len();
                ep.flush(&mut |c| ws.done.push((r, c)));
                ep.reap(&mut |c| ws.done.push((r, c)));
                ep.fail_exhausted(&mut |c| ws.done.push((r, c)));
                let rail_failed = ws.done[before..]
                    .iter()
                    .any(|(_, c)| matches!(c.result, Err(k) if rail_fault(k)));
                if rail_failed && peer.rails.len() > 1 {
                    // What was flushed behind the failure would only meet
                    // the same fault on a fresh QP here: move it too.
                    ep.evacuate(&mut |s| ws.moved.push((r, s)), &mut |c| {
                        ws.done.push((r, c))
                    });
                }
            }
            for k in 0..ws.moved.len() {
                let (from, s) = ws.moved[k];
                peer.rails[from].moved.fetch_add(1, Ordering::Relaxed);
                peer.rails[from].monitor.on_leave();
                if s.reposts >= MAX_RAIL_MOVES || self.repost(peer, eps, s, from).is_err() {
                    ws.ready.push_back(SliceCompletion {
                        token: s.token,
                        result: Err(ErrorKind::RouteLost),
                    });
                    eps.outstanding -= 1;
                } else {
                    tracing::debug!(peer = %peer.name, from_rail = from, "slice re-posted on a sibling rail");
                }
            }
            ws.moved.clear();
            let now = if ws.done.is_empty() {
                0
            } else {
                monotonic_ns()
            };
            for k in 0..ws.done.len() {
                let (from, c) = ws.done[k];
                let monitor = &peer.rails[from].monitor;
                monitor.on_leave();
                match c.result {
                    Ok(b) => monitor.mark_recovered(b, c.slice.posted_ns, now, c.slice.ahead),
                    Err(kind) if rail_fault(kind) => monitor.mark_failed(),
                    Err(_) => {}
                }
                if let Err(kind) = c.result
                    && rail_fault(kind)
                    && c.slice.reposts < MAX_RAIL_MOVES
                {
                    let mut again = c.slice;
                    again.reposts += 1;
                    if self.repost(peer, eps, again, from).is_ok() {
                        peer.rails[from].moved.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(peer = %peer.name, from_rail = from, %kind, "failed slice re-posted on a sibling rail");
                        continue;
                    }
                }
                ws.ready.push_back(SliceCompletion {
                    token: c.token,
                    result: c.result,
                });
                eps.outstanding -= 1;
            }
            ws.done.clear();
            if now != 0 {
                peer.review(now);
            }
            let drained = eps.outstanding == 0;
            if drained {
                eps.active = false;
            }
            drop(guard);
            if drained {
                ws.active.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let n = ws.ready.len().min(out.len());
        for slot in out.iter_mut().take(n) {
            *slot = ws.ready.pop_front().expect("n <= ready");
        }
        n
    }

    fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        self.abort_token(ctx, token, kind);
    }
}
