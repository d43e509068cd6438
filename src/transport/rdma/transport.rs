//! `rdma`: one-sided READ and WRITE over RC queue pairs.
//!
//! A peer is reached over **rails**, each a (local NIC, remote NIC) pair
//! of the same GID type (`gid::pair_rails`): with every NIC alike,
//! `max(local, remote)` rails, NIC `i % local` to NIC `i % remote`, so equal
//! NIC counts pair index to index and neither side leaves a NIC idle; a NIC
//! whose type the other side lacks (RoCE v1 against v2, InfiniBand against
//! RoCE) gets no rail, and a peer no NIC here can reach is `Unreachable`. Each
//! worker has one [`Endpoint`] per rail per peer, made when the segment is
//! opened and connected (QP, then `QpConnect` over the control plane, on
//! the transport's [`Connector`] threads: the worker never waits on a peer)
//! the first time the worker posts on it; it stays cached with the segment.
//!
//! - **Checked before posting.** The remote range must lie inside one region
//!   of the peer's descriptor (`AddressNotRegistered`, `OutOfBounds`
//!   otherwise), and the rkey comes from that region's entry for the rail's
//!   remote NIC: the application never hands the engine an rkey, and a
//!   region the peer granted no (or a zero) rkey on any NIC is refused with
//!   `AccessDenied` without a work request being built.
//! - **Spraying.** The [`DeviceSelector`] spreads slices over the rails
//!   whose local link is up and whose NICs hold a key for both ends: by
//!   NUMA tier and EWMA bandwidth when smart scheduling is on (the
//!   default), round robin otherwise.
//! - **Busy polling.** The worker that posts a slice reaps its completion
//!   (`poll` flushes every active endpoint's backlog as linked WR lists, then
//!   reaps its CQ), so nothing wakes the worker.
//! - **Rails that fail.** A link watch (rtnetlink, on each RoCE NIC's network
//!   device) marks a NIC down the moment its link drops; at the next poll the
//!   worker destroys that rail's QPs and re-posts everything they held on a
//!   sibling rail. A completion that fails for a rail-level reason
//!   (`Unreachable`, `RouteLost`, a NIC failure) moves that slice to a
//!   sibling the same way; an endpoint made terminal (seed 004's fatal
//!   list, a refused post, a QP-fatal async event) hands over everything
//!   it held, each slice once, and takes no new work during its backoff
//!   ([`Endpoint::accepting`]). Only when no rail is left does the failure
//!   reach the task (DESIGN.md's recovery order).
//! - **Aborts.** [`RdmaTransport::abort_token`] stops a task's slices on
//!   every endpoint of the worker: waiting ones end at the next `poll`,
//!   posted ones once their QP, moved to the error state, has flushed them
//!   (see [`Endpoint::abort`]); nothing waits.
//!
//! Nothing in `submit` or `poll` allocates once the scratch queues have
//! grown to the worker's credit bound.

use crate::secret::Secret;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tent_rings::{ErrorKind, TransportKind};

use super::connector::{Connector, ConnectorHandle};
use super::connector::{Queue, QueueSource};
use super::endpoint::{Endpoint, RdmaCompletion, RdmaSlice, SqSettings};
use super::events::NicEvents;
use super::gid::{self, GidChoice, GidType, LinkLayer};
use super::layout::MrLayout;
use super::nic::NicSet;
use super::responder::{bootstrap, endpoint};
use crate::clock::monotonic_ns;
use crate::config::{Config, SplitPolicy};
use crate::control::wire::NicEntry;
use crate::control::wire::{MAX_QP_RAILS, QpInitiator, QpRequest};
use crate::control::{RegionEntry, SegmentDescriptor};
use crate::error::{Error, Result};
use crate::flow::AdmissionGate;
use crate::flow::diag::{SqCqeDiagnostics, SqReport, SqRow};
use crate::flow::split::{QueueLoad, choose, next_cursor};
use crate::flow::sq::SqController;
use crate::memory::MemRegion;
use crate::netlink;
use crate::segment::Segment;
use crate::transport::rails::{
    Ask, DeviceSelector, LinkListener, LiveRailPolicy, LiveSelector, MAX_RAIL_MOVES, Placement,
    RailDesc, RailPolicy, RailSet, SelectorConfig, WorkerRails, is_rail_fault,
};
use crate::transport::rdma::verbs::{CompletionQueue, QueuePair};
use crate::transport::{
    Capabilities, InstallContext, PeerActivity, PerWorker, RailStat, Slice, SliceCompletion,
    SubmitOutcome, Transport, WorkerCtx, submit_to_peers,
};

/// Settings read once from the config.
#[derive(Debug, Clone)]
struct Settings {
    slice_bytes: u64,
    depth: u32,
    /// Seed 004's send-queue knobs for every endpoint.
    sq: SqSettings,
    backlog: usize,
    secret: Option<Secret>,
    connect_timeout: Duration,
    rail_policy: Arc<LiveRailPolicy>,
    /// This engine's initiator id (`QpInitiator`), drawn once.
    engine: u64,
    /// `qp_per_transfer`: QPs per rail per worker; `None`: auto
    /// ([`qps_per_rail`]).
    qp_per_transfer: Option<usize>,
    /// `sq_split_policy`: which of a rail's QPs a slice goes out on.
    split: SplitPolicy,
    /// `sq_admission_resume_watermark_wr`.
    admission_resume: u32,
    /// `sq_admission_max_chunks_per_call`.
    max_chunks: u32,
}

/// One rail to a peer.
#[derive(Debug)]
pub(crate) struct RdmaRail {
    /// Index of the local NIC in the engine's [`NicSet`].
    pub local: usize,
    /// Index of the remote NIC in the peer's descriptor.
    pub remote: usize,
    /// The remote NIC's name.
    pub remote_name: String,
}

/// What a worker has on one peer.
struct PeerEndpoints {
    /// `qp_per_transfer` per rail, rail by rail: rail `r`'s QPs are
    /// `eps[r * q .. (r + 1) * q]`.
    eps: Vec<Endpoint>,
    /// Per rail: where its split policy starts looking for a QP.
    cursor: Vec<usize>,
    /// This worker's loads, estimates and plan on the peer's rails.
    rails: WorkerRails,
    /// Its slices out, and whether the peer is on the active list.
    activity: PeerActivity,
}

/// A peer reachable over RDMA: its regions' rkeys and its rails.
pub(crate) struct RdmaPeer {
    name: String,
    regions: Vec<RegionEntry>,
    /// Each rail's NIC pair (index = rail).
    paths: Vec<RdmaRail>,
    /// The rails as the multi-rail layer keeps them.
    rails: RailSet,
    nics: Arc<NicSet>,
    per_worker: PerWorker<PeerEndpoints>,
    /// Each worker's endpoints' queue counters (index: worker, then
    /// endpoint as in [`PeerEndpoints::eps`]), readable without the
    /// worker's state.
    diag: Vec<Vec<Arc<SqCqeDiagnostics>>>,
    /// Every endpoint's send-queue depth.
    depth: u32,
    /// `qp_per_transfer`: endpoints per rail per worker.
    q: usize,
    /// `sq_split_policy`: which of a rail's endpoints a slice goes to.
    split: SplitPolicy,
    /// Each worker's admission gate to this peer (index: worker).
    gates: Vec<AdmissionGate>,
}

impl std::fmt::Debug for RdmaPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaPeer")
            .field("name", &self.name)
            .field("paths", &self.paths)
            .finish()
    }
}

impl RdmaPeer {
    /// Is rail `r`'s local link up?
    #[inline]
    fn link_up(&self, r: usize) -> bool {
        self.nics.nics()[self.paths[r].local].is_up()
    }

    /// Each rail's names, link state and counters.
    pub(crate) fn rail_stats(&self) -> Vec<RailStat> {
        self.rails.stats(|r| self.link_up(r))
    }

    /// Worker `w`'s admission gate to this peer (`None`: no such worker).
    pub(crate) fn gate(&self, w: usize) -> Option<&AdmissionGate> {
        self.gates.get(w)
    }

    /// The peer's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// QPs each worker keeps per rail to this peer (`qp_per_transfer`):
    /// endpoint `e` (an admission gate's index) is QP `e % q` of rail
    /// `e / q`.
    pub(crate) fn qp_per_transfer(&self) -> usize {
        self.q
    }

    /// Worker `w`'s endpoint `e`, its counters now (an admission
    /// timeout's message).
    pub(crate) fn sq_report(&self, w: usize, e: usize) -> Option<SqReport> {
        Some(self.report_of(self.diag.get(w)?.get(e)?, monotonic_ns()))
    }

    /// One endpoint's counters at `now` (its posted count is its ledger's).
    fn report_of(&self, d: &SqCqeDiagnostics, now: u64) -> SqReport {
        let posted = d.ledger_records.load(std::sync::atomic::Ordering::Relaxed);
        d.report(now, posted, self.depth)
    }

    /// Each QP slot's send- and completion-queue counters (rail by rail,
    /// `qp_per_transfer` per rail), every worker's endpoint there
    /// together, labelled as the metrics show them.
    pub(crate) fn sq_reports(&self) -> Vec<SqRow> {
        let now = monotonic_ns();
        (0..self.paths.len() * self.q)
            .map(|e| {
                let mut total = SqReport::default();
                for w in &self.diag {
                    total.merge(&self.report_of(&w[e], now));
                }
                let r = e / self.q;
                SqRow {
                    segment: self.name.clone(),
                    local: self.nics.nics()[self.paths[r].local].ctx.name().to_owned(),
                    remote: self.paths[r].remote_name.clone(),
                    qp: e % self.q,
                    report: total,
                }
            })
            .collect()
    }

    /// The descriptor region holding `[addr, addr+len)`.
    #[inline]
    pub(crate) fn region_of(
        &self,
        addr: u64,
        len: u64,
    ) -> std::result::Result<&RegionEntry, ErrorKind> {
        RegionEntry::find(&self.regions, addr, len)
    }

    /// The endpoint of `rail` (an index into [`PeerEndpoints::eps`]) the
    /// split policy gives the next slice, among those taking work at
    /// `now`, never `not` (the one a slice is leaving).
    #[inline]
    fn lane(
        &self,
        eps: &mut PeerEndpoints,
        rail: usize,
        now: u64,
        not: Option<usize>,
    ) -> Option<usize> {
        let base = rail * self.q;
        let open = |e: usize| Some(e) != not && lane_open(&eps.eps[e], now);
        if self.q == 1 {
            return open(base).then_some(base);
        }
        let k = choose(self.split, self.q, eps.cursor[rail], |k| QueueLoad {
            open: open(base + k),
            load: u32::try_from(eps.eps[base + k].outstanding()).unwrap_or(u32::MAX),
            depth: self.depth,
        })?;
        eps.cursor[rail] = next_cursor(self.split, k);
        Some(base + k)
    }

    /// Can rail `r` carry a slice between `local` and `remote` (link up,
    /// a key at both ends)? Its health is the rail layer's to judge.
    #[inline]
    fn usable(&self, r: usize, local: &MemRegion, remote: &RegionEntry) -> bool {
        let rail = &self.paths[r];
        self.link_up(r)
            && rkey_on(remote, rail.remote, remote.addr).is_some()
            && local.on_nic(rail.local)
    }
}

/// Does `e` take new work at `now`? A terminal-degraded (or
/// unconnectable) endpoint not until its backoff has passed; a stalled
/// one not until a completion shows it moves again.
#[inline]
fn lane_open(e: &Endpoint, now: u64) -> bool {
    e.accepting() && !e.stalled(now)
}

/// GID types for a log line: `RoCE v2, ?, IB`.
/// QPs each worker keeps per rail when `qp_per_transfer` is auto, for
/// rails whose local NICs' links are `links`: [`ROCE_QPS_PER_RAIL`] if any
/// is Ethernet (RoCE), else 1.
fn qps_per_rail(mut links: impl Iterator<Item = LinkLayer>) -> usize {
    if links.any(|l| l == LinkLayer::Ethernet) {
        ROCE_QPS_PER_RAIL
    } else {
        1
    }
}

/// QPs per RoCE rail by default. A routed RoCE fabric hashes each flow (a
/// QP's UDP source port) onto one ECMP path, so a rail of one QP rides one
/// path however many the fabric has; two give the hash two draws (Mooncake
/// keeps two per endpoint). More cost QP contexts the NIC caches (workers ×
/// rails × peers × this) and a control-plane exchange each at connect. On
/// Soft-RoCE (one host, no ECMP) neither 2 nor 4 bought throughput, and
/// each doubling cost about a tenth at 64 KiB (guest medians of three:
/// 0.029, 0.026, 0.023 GB/s for 1, 2, 4), so the default stays at 2.
const ROCE_QPS_PER_RAIL: usize = 2;

/// The rails to a peer: (local NIC, remote NIC) index pairs, and how many
/// reachable pairs the subnet rule left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RailPlan {
    /// The pairs, at most `MAX_QP_RAILS`.
    pub(crate) pairs: Vec<(usize, usize)>,
    /// Reachable pairs left out because either NIC has a partner on its
    /// own subnet.
    pub(crate) across: usize,
}

/// The rails between NICs addressed by `ours` and the peer's NICs
/// `theirs` (its descriptor's): pairs that can reach each other
/// ([`gid::reachable`]), on the same subnet where either has a partner
/// there ([`gid::subnet_rule`]), the load spread ([`gid::pair_rails`]).
/// What [`RdmaTransport::attach`] connects and the topology report shows.
pub(crate) fn plan_rails(ours: &[GidChoice], theirs: &[NicEntry]) -> RailPlan {
    let (local, remote) = (ours.len(), theirs.len());
    let types: Vec<Option<GidType>> = theirs
        .iter()
        .map(|n| n.gid_type.and_then(GidType::from_code))
        .collect();
    let reach =
        |a: usize, b: usize| gid::reachable(ours[a].ty, &ours[a].gid, types[b], &theirs[b].gid);
    let ok = gid::subnet_rule(local, remote, reach, |a, b| {
        let (here, there) = (&ours[a], &theirs[b]);
        gid::same_subnet(&here.gid, here.prefix, &there.gid, there.prefix)
    });
    let mut pairs = gid::pair_rails(local, remote, |a, b| ok[a * remote + b]);
    let across = (0..local)
        .flat_map(|a| (0..remote).map(move |b| (a, b)))
        .filter(|&(a, b)| reach(a, b) && !ok[a * remote + b])
        .count();
    // Mixed types can pair more NICs than either side has; a QP key
    // names at most MAX_QP_RAILS rails.
    pairs.truncate(MAX_QP_RAILS);
    RailPlan { pairs, across }
}

fn type_list(types: &[Option<GidType>]) -> String {
    types
        .iter()
        .map(|t| t.map_or("?".to_owned(), |t| t.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rkey on the owner's NIC `nic` for a work request that starts at
/// `addr` in `region` (a peer's descriptor: a step this engine would not
/// make, or keys missing for it, is no key; zero counts as none).
#[inline]
fn rkey_on(region: &RegionEntry, nic: usize, addr: u64) -> Option<u32> {
    let key = match region.mr_step {
        None => region.rkeys.get(nic),
        step @ Some(_) => {
            let layout = MrLayout::from_wire(region.len, step)?;
            let k = layout.chunk_of(addr.wrapping_sub(region.addr));
            let i = nic.checked_mul(layout.chunks())?.checked_add(k)?;
            region.chunk_rkeys.get(i)
        }
    };
    key.copied().filter(|&k| k != 0)
}

/// The NICs as a listener on the engine's link watch: a NIC whose netdev
/// goes down takes no new slices, and the workers evacuate its QPs at
/// their next poll.
struct NicLinks {
    nics: Arc<NicSet>,
}

impl LinkListener for NicLinks {
    fn link_changed(&self, ifindex: u32, up: bool) {
        // The netdev under each NIC's GID now (a GID chosen again may sit
        // on another one).
        for n in self.nics.nics() {
            if n.netdev_index() == Some(ifindex) {
                n.set_link(up, "link watch");
            }
        }
    }
}

/// Connects QPs for one rail of one peer: a CQ and an RC QP on the local
/// NIC, the peer's end over the control plane (`QpConnect`), then RTR/RTS.
struct RailSource {
    nics: Arc<NicSet>,
    /// The responder's key for this endpoint: (engine, worker, rail, QP).
    initiator: QpInitiator,
    local: usize,
    peer: String,
    remote_nic: String,
    secret: Option<Secret>,
    timeout: Duration,
    depth: u32,
}

impl QueueSource for RailSource {
    fn connect(&mut self) -> Result<Queue> {
        let nic = &self.nics.nics()[self.local];
        let cq = CompletionQueue::new(&nic.ctx, self.depth as i32)?;
        let addr = nic.addressing();
        let qp = QueuePair::new(&nic.pd, &cq, addr, self.depth)?;
        let theirs = crate::control::connect_qp(
            &self.peer,
            self.secret.as_ref().map(|s| s.expose().as_bytes()),
            self.timeout,
            QpRequest {
                initiator: self.initiator,
                initiator_nic: nic.ctx.name().to_owned(),
                target_nic: self.remote_nic.clone(),
                qp: bootstrap(&qp.endpoint()?),
                gid_type: addr.gid.ty.map(|t| t.code()),
            },
        )?;
        qp.connect(&endpoint(&theirs))?;
        tracing::debug!(peer = %self.peer, local = nic.ctx.name(), remote = %self.remote_nic, "rdma: QP connected");
        let (raw_qp, raw_cq) = (qp.as_raw(), cq.as_raw());
        // SAFETY: `raw_qp` and `raw_cq` live as long as `qp` and `cq`, which the queue owns (the QP dropped first, then its CQ: tuple fields drop in order); nothing else posts on this fresh QP or polls its CQ; `modify_to_error` takes a live QP.
        Ok(unsafe {
            Queue::new(
                raw_qp,
                raw_cq,
                crate::transport::rdma::verbs::modify_to_error,
                Box::new((qp, cq)),
            )
        })
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn watch(&mut self, queue: &Queue, sq: &Arc<SqController>) {
        self.nics.qps().watch(self.local, queue.qp_num(), sq);
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
    /// Slices leaving an endpoint: (endpoint, whether its whole rail is
    /// out, slice). One leaving an endpoint alone tries the rail's other
    /// QPs first.
    moved: Vec<(usize, bool, RdmaSlice)>,
}

/// The RDMA transport (initiator side; the target side is the NICs' own
/// responder plus [`super::Responder`] for QP bootstrap).
pub(crate) struct RdmaTransport {
    nics: Arc<NicSet>,
    settings: Settings,
    workers: PerWorker<WorkerState>,
    selector: Arc<LiveSelector>,
    /// Where the workers run (set at install).
    placement: std::sync::OnceLock<Arc<Placement>>,
    /// The NICs' listener on the engine's link watch (kept alive here).
    nic_links: std::sync::OnceLock<Arc<NicLinks>>,
    /// The NICs' async-event thread, started at install; dropping the
    /// transport joins it.
    events: std::sync::OnceLock<NicEvents>,
    /// Started by the first `attach`; dropping the transport joins its
    /// threads.
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
    /// `engine` is the engine's incarnation: peers file its QPs under it.
    pub(crate) fn new(config: &Config, nics: Arc<NicSet>, engine: u64) -> RdmaTransport {
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
                sq: SqSettings::from_config(config),
                backlog,
                secret: config.shared_secret().cloned(),
                connect_timeout: config
                    .default_timeout_ms
                    .clamp(Duration::from_millis(100), Duration::from_secs(5)),
                rail_policy: Arc::new(LiveRailPolicy::new(RailPolicy::from_config(config))),
                engine,
                qp_per_transfer: r.qp_per_transfer.count().map(|n| usize::from(n.max(1))),
                split: r.sq_split_policy,
                admission_resume: r.sq_admission_resume_watermark_wr,
                max_chunks: r.sq_admission_max_chunks_per_call,
            },
            nics,
            workers,
            selector: Arc::new(LiveSelector::from_pointee(DeviceSelector::new(
                SelectorConfig::from_config(config),
            ))),
            placement: std::sync::OnceLock::new(),
            nic_links: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
            connector: Mutex::new(None),
        }
    }

    /// The connector's handle, starting its threads on first use.
    fn connector(&self) -> Result<ConnectorHandle> {
        let mut c = self.connector.lock();
        if c.is_none() {
            *c = Some(Connector::start()?);
        }
        Ok(c.as_ref().expect("just set").handle())
    }

    /// Connect-side view of the peer `name` from its descriptor: its rails
    /// and, per worker, one (lazily connected) endpoint per rail.
    pub(crate) fn attach(&self, name: &str, desc: &SegmentDescriptor) -> Result<Arc<RdmaPeer>> {
        let (local, remote) = (self.nics.nics().len(), desc.nics.len());
        if remote == 0 || local == 0 {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!("{name}: the peer advertises no RDMA NIC"),
            ));
        }
        let our_gids: Vec<_> = self.nics.nics().iter().map(|n| n.gid()).collect();
        let ours: Vec<Option<GidType>> = our_gids.iter().map(|g| g.ty).collect();
        let theirs: Vec<Option<GidType>> = desc
            .nics
            .iter()
            .map(|n| n.gid_type.and_then(GidType::from_code))
            .collect();
        let reach = |a: usize, b: usize| {
            gid::reachable(ours[a], &our_gids[a].gid, theirs[b], &desc.nics[b].gid)
        };
        let RailPlan { pairs, across } = plan_rails(&our_gids, &desc.nics);
        if across > 0 {
            tracing::info!(
                peer = name,
                pairs_left_out = across,
                "rdma: rails only between NICs on the same subnet (NICs with a partner on theirs pair only there)"
            );
        }
        if pairs.is_empty() {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "{name}: no RDMA NIC here can reach one of the peer's (GID types here {}, there {})",
                    type_list(&ours),
                    type_list(&theirs)
                ),
            ));
        }
        let unreachable = (0..local).any(|a| (0..remote).any(|b| !reach(a, b)));
        if unreachable && pairs.len() < local.max(remote) {
            tracing::info!(peer = name, here = %type_list(&ours), there = %type_list(&theirs), rails = pairs.len(), "rdma: rails only between NICs of the same GID type and address kind");
        }
        let q = self.settings.qp_per_transfer.unwrap_or_else(|| {
            qps_per_rail(
                pairs
                    .iter()
                    .map(|&(a, _)| self.nics.nics()[a].addressing().link),
            )
        });
        let rails: Vec<RdmaRail> = pairs
            .into_iter()
            .map(|(a, b)| RdmaRail {
                local: a,
                remote: b,
                remote_name: desc.nics[b].name.clone(),
            })
            .collect();
        let set = RailSet::new(
            TransportKind::Rdma,
            self.selector.clone(),
            self.settings.rail_policy.clone(),
            self.placement.get().cloned().unwrap_or_default(),
            rails
                .iter()
                .map(|r| {
                    let nic = &self.nics.nics()[r.local];
                    RailDesc {
                        local: nic.ctx.name().to_owned(),
                        remote: r.remote_name.clone(),
                        numa_node: nic.numa_node,
                        speed_gbps: nic.speed_gbps,
                        // `qp_per_transfer` endpoints per rail per
                        // worker: their send queues.
                        depth: self.settings.depth.saturating_mul(q as u32),
                    }
                })
                .collect(),
            self.workers.workers(),
        );
        let mut regions = desc.regions.clone();
        regions.sort_by_key(|r| r.addr);
        for r in &regions {
            let missing: Vec<&str> = (0..remote)
                .filter(|&n| rkey_on(r, n, r.addr).is_none())
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
                    .flat_map(|(r, rail)| (0..q).map(move |k| (r, k, rail)))
                    .map(|(r, k, rail)| {
                        let initiator = QpInitiator::new(s.engine, w, r)
                            .and_then(|i| i.with_queue(k))
                            .map_err(|e| {
                                Error::invalid(format!(
                                    "{name}: QP {k} of rail {r} of worker {w}: {e}"
                                ))
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
                        Ok(Endpoint::with_settings(
                            Box::new(source),
                            s.depth,
                            s.backlog,
                            &connector,
                            s.sq,
                        ))
                    })
                    .collect::<Result<_>>()?;
                Ok(PeerEndpoints {
                    eps,
                    cursor: vec![0; rails.len()],
                    rails: set.worker(w),
                    activity: PeerActivity::default(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let diag = per_worker
            .iter()
            .map(|p: &PeerEndpoints| p.eps.iter().map(|e| e.diagnostics().clone()).collect())
            .collect();
        let gates = per_worker
            .iter()
            .map(|p: &PeerEndpoints| {
                AdmissionGate::new(
                    p.eps.iter().map(|e| e.published_sq().clone()).collect(),
                    s.admission_resume,
                    s.max_chunks,
                )
            })
            .collect();
        let per_worker: PerWorker<_> = per_worker.into_iter().collect();
        tracing::info!(peer = name, rails = ?rails.iter().map(|r| format!("{}->{}", self.nics.nics()[r.local].ctx.name(), r.remote_name)).collect::<Vec<_>>(), "rdma peer attached");
        Ok(Arc::new(RdmaPeer {
            name: name.to_owned(),
            regions,
            paths: rails,
            rails: set,
            nics: self.nics.clone(),
            per_worker,
            diag,
            depth: s.depth,
            q,
            split: s.split,
            gates,
        }))
    }

    /// Queue `s` (between `local` and `remote`) on the usable rail the
    /// selector picks for it (`ask`: its request's next slice, or one
    /// moving off a rail), with that rail's keys.
    #[inline]
    fn post(
        peer: &RdmaPeer,
        eps: &mut PeerEndpoints,
        mut s: RdmaSlice,
        local: &MemRegion,
        remote: &RegionEntry,
        ask: Ask,
        now: u64,
    ) -> std::result::Result<(), ErrorKind> {
        let len = u64::from(s.len);
        let (endpoints, q) = (&eps.eps, peer.q);
        let rail = peer
            .rails
            .pick(&mut eps.rails, local.numa_node(), s.token, ask, len, |r| {
                // A rail with a QP that takes work.
                peer.usable(r, local, remote)
                    && endpoints[r * q..(r + 1) * q]
                        .iter()
                        .any(|e| lane_open(e, now))
            })?;
        let lane = peer
            .lane(eps, rail, now, None)
            .ok_or(ErrorKind::RouteLost)?;
        let r = &peer.paths[rail];
        s.lkey = local
            .lkey_at(r.local, s.local)
            .ok_or(ErrorKind::RouteLost)?;
        s.rkey = rkey_on(remote, r.remote, s.remote).ok_or(ErrorKind::RouteLost)?;
        s.ahead = peer.rails.posted(&mut eps.rails, rail, len);
        if eps.eps[lane].submit(s) {
            Ok(())
        } else {
            peer.rails.left(&mut eps.rails, rail, len);
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
    pub(crate) fn abort_token(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        debug_assert!(!is_rail_fault(kind), "abort with a rail fault: {kind}");
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
                eps,
                activity,
                rails,
                ..
            } = &mut *guard;
            for (e, ep) in eps.iter_mut().enumerate() {
                let r = e / peer.q;
                if ep.outstanding() == 0 {
                    continue;
                }
                ep.abort(token, kind, &mut |c| {
                    // Ended now (never posted, or its QP destroyed): it
                    // leaves the rail, through no fault of the rail's.
                    peer.rails.left(rails, r, u64::from(c.slice.len));
                    activity.completed();
                    ready.push_back(SliceCompletion {
                        token: c.token,
                        result: c.result,
                    });
                });
            }
        }
    }

    /// An endpoint of `peer` (worker `w`) went `sq_backoff_timeout_us`
    /// with nothing completing: one warning per peer and worker, with each
    /// rail's queue counters so the line itself tells a poll stall from a
    /// slow drain from a burst (seed 004's SQ-full hint).
    #[cold]
    fn report_stall(&self, peer: &RdmaPeer, eps: &PeerEndpoints, w: usize, now: u64) {
        let rails: Vec<String> = eps
            .eps
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let state = if e.stalled(now) { "stalled" } else { "moving" };
                let (r, k) = (i / peer.q, i % peer.q);
                format!("rail {r} qp {k} ({state}): {}", e.report(now))
            })
            .collect();
        let name = &*peer.name;
        crate::lograte::warn_limited!(
            (name, w),
            peer = name,
            worker = w,
            workers = self.workers.workers(),
            qp_per_transfer = peer.q,
            timeout_us = self.settings.sq.stall_timeout.as_micros() as u64,
            rails = %rails.join("; "),
            "rdma: SQ full and no completion within sq_backoff_timeout_us; its waiting work moves to other rails or fails SqFull (failed over)"
        );
    }

    /// Queue `s` again, on a rail other than `from`.
    fn repost(
        &self,
        peer: &RdmaPeer,
        eps: &mut PeerEndpoints,
        s: RdmaSlice,
        from: usize,
        now: u64,
    ) -> std::result::Result<(), ErrorKind> {
        // SAFETY: `ctx` is the slice's local region, which its task holds (an Arc) until every slice of it has completed; this slice has not.
        let local = unsafe { &*(s.ctx as *const MemRegion) };
        let remote = peer.region_of(s.remote, s.len as u64)?;
        Self::post(peer, eps, s, local, remote, Ask::Again(Some(from)), now)
    }
}

/// The RDMA state of `segment`, if RDMA reaches it.
pub(crate) fn peer_of(segment: &Segment) -> Option<&RdmaPeer> {
    segment.attached::<RdmaPeer>(TransportKind::Rdma)
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
        let _ = self.placement.set(ctx.placement.clone());
        if self.nics.nics().iter().all(|n| n.netdev_index().is_none()) {
            return Ok(());
        }
        ctx.links.start();
        let listener = Arc::new(NicLinks {
            nics: self.nics.clone(),
        });
        ctx.links
            .listen(Arc::downgrade(&listener) as std::sync::Weak<dyn LinkListener>);
        let _ = self.nic_links.set(listener);
        // Links that were already down before the watch started.
        for n in self.nics.nics() {
            if let Some(idx) = n.netdev_index()
                && let Ok(up) = netlink::link_up(idx)
            {
                n.up.store(up, Ordering::Release);
            }
        }
        // Port events: a port that goes down says so at once, netdev or
        // not. Without them the link watch (RoCE) and completions remain.
        if self.events.get().is_none() {
            match NicEvents::start(self.nics.clone()) {
                Ok(ev) => {
                    let _ = self.events.set(ev);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "rdma: NIC async events not read; port failures are seen from the link watch and completions only"
                ),
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
            parks_worker: false,
        }
    }

    fn reaches(&self, segment: &Segment) -> bool {
        peer_of(segment).is_some()
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let now = monotonic_ns();
        let kind = TransportKind::Rdma;
        submit_to_peers(
            kind,
            &self.workers,
            ctx,
            slices,
            out,
            |ws, attached, peer: &RdmaPeer, s| {
                let Ok(len) = u32::try_from(s.len) else {
                    // The engine slices at `slice_bytes` (at most the NICs' max
                    // message size): a longer slice is a caller bug.
                    return SubmitOutcome::Completed(Err(ErrorKind::InvalidArgument));
                };
                let remote = match peer.region_of(s.remote, s.len) {
                    Ok(r) => r,
                    Err(e) => {
                        return SubmitOutcome::Completed(Err(e));
                    }
                };
                if peer
                    .paths
                    .iter()
                    .all(|p| rkey_on(remote, p.remote, remote.addr).is_none())
                {
                    return SubmitOutcome::Completed(Err(ErrorKind::AccessDenied));
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
                    urgent: s.priority == tent_rings::Priority::High,
                };
                let mut eps = match peer.per_worker.get(ctx) {
                    Ok(e) => e,
                    Err(e) => {
                        return SubmitOutcome::Rejected(e);
                    }
                };
                let posted = Self::post(
                    peer,
                    &mut eps,
                    slice,
                    s.region,
                    remote,
                    Ask::next(slice.urgent, s.slices_left()),
                    now,
                );
                if posted == Err(ErrorKind::RouteLost) && eps.eps.iter().any(|e| e.stalled(now)) {
                    // No rail left but stalled ones: not back-pressure the
                    // task may wait out, but `sq_backoff_timeout_us` passed
                    // with nothing completing. The slice fails `SqFull` (the
                    // engine fails it over), with the queues' story logged.
                    self.report_stall(peer, &eps, ctx.index(), now);
                    return SubmitOutcome::Completed(Err(ErrorKind::SqFull));
                }
                // Rare (first slice since the peer drained): the only
                // reference-count update on this path.
                if posted.is_ok()
                    && eps.activity.posted()
                    && let Ok(p) = Arc::downcast::<RdmaPeer>(attached.clone())
                {
                    ws.active.push(p);
                }
                SubmitOutcome::of_post(posted)
            },
        );
    }

    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        // Refused at submit too: nothing of this worker's is in flight here.
        let Ok(mut ws) = self.workers.get(ctx) else {
            return 0;
        };
        let ws = &mut *ws;
        // One clock read per turn with peers to poll: completions, posts
        // and stalls are timed with it.
        let now = if ws.active.is_empty() {
            0
        } else {
            monotonic_ns()
        };
        let mut i = 0;
        while i < ws.active.len() {
            let peer = &ws.active[i];
            // Opened with this context when the peer joined `active`.
            let Ok(mut guard) = peer.per_worker.get(ctx) else {
                i += 1;
                continue;
            };
            let eps = &mut *guard;
            let mut stalled = false;
            for e in 0..eps.eps.len() {
                let ep = &mut eps.eps[e];
                if ep.outstanding() == 0 {
                    continue;
                }
                let r = e / peer.q;
                let nic_up = peer.link_up(r);
                if !nic_up {
                    ep.evacuate(&mut |s| ws.moved.push((e, true, s)), &mut |c| {
                        ws.done.push((r, c))
                    });
                    continue;
                }
                ep.polled_at(now);
                ep.flush(&mut |c| ws.done.push((r, c)));
                ep.reap(&mut |c| ws.done.push((r, c)));
                ep.fail_exhausted(&mut |c| ws.done.push((r, c)));
                stalled |=
                    ep.stalled(now) && ep.shed_backlog(&mut |s| ws.moved.push((e, false, s)));
                // A terminal-degraded endpoint gave up what it held: it
                // moves to a sibling QP or rail (or fails over), each once.
                ep.extract_orphans(&mut |s| ws.moved.push((e, false, s)));
            }
            for k in 0..ws.moved.len() {
                let (lane, rail_out, s) = ws.moved[k];
                let from = lane / peer.q;
                // Leaving one QP of a rail that works: another QP of the
                // rail takes it, and the rail's accounts stay as they are.
                if !rail_out
                    && let Some(sibling) = peer.lane(eps, from, now, Some(lane))
                    && eps.eps[sibling].submit(s)
                {
                    continue;
                }
                peer.rails.moved(from);
                peer.rails.left(&mut eps.rails, from, u64::from(s.len));
                if s.reposts >= MAX_RAIL_MOVES || self.repost(peer, eps, s, from, now).is_err() {
                    ws.ready.push_back(SliceCompletion {
                        token: s.token,
                        result: Err(ErrorKind::RouteLost),
                    });
                    eps.activity.completed();
                } else {
                    tracing::debug!(peer = %peer.name, from_rail = from, "slice re-posted on a sibling rail");
                }
            }
            ws.moved.clear();
            if stalled {
                self.report_stall(peer, eps, ctx.index(), now);
            }
            // Completions are timed after the reaps (a bandwidth sample
            // ends when its CQE is seen, not when this poll started: a
            // provider that completes inside `post_send`, as rxe does,
            // would otherwise time its own flushes out of the samples).
            let now = if ws.done.is_empty() {
                now
            } else {
                monotonic_ns()
            };
            for k in 0..ws.done.len() {
                let (from, c) = ws.done[k];
                let len = u64::from(c.slice.len);
                let fault = match c.result {
                    Ok(_) => {
                        peer.rails.completed(
                            &mut eps.rails,
                            from,
                            len,
                            c.slice.posted_ns,
                            now,
                            c.slice.ahead,
                        );
                        false
                    }
                    Err(kind) => {
                        peer.rails.left(&mut eps.rails, from, len);
                        peer.rails.fault(from, kind)
                    }
                };
                if fault && c.slice.reposts < MAX_RAIL_MOVES {
                    let mut again = c.slice;
                    again.reposts += 1;
                    if self.repost(peer, eps, again, from, now).is_ok() {
                        peer.rails.moved(from);
                        tracing::debug!(peer = %peer.name, from_rail = from, "failed slice re-posted on a sibling rail");
                        continue;
                    }
                }
                ws.ready.push_back(SliceCompletion {
                    token: c.token,
                    result: c.result,
                });
                eps.activity.completed();
            }
            let reaped = !ws.done.is_empty();
            ws.done.clear();
            if reaped {
                peer.rails.review(now, |i| peer.link_up(i));
            }
            let drained = eps.activity.drained();
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

    fn attach_peer(
        &self,
        name: &str,
        desc: &SegmentDescriptor,
    ) -> Option<Result<crate::segment::Attachment>> {
        desc.transports
            .contains(&(TransportKind::Rdma as u8))
            .then(|| {
                self.attach(name, desc)
                    .map(|p| p as crate::segment::Attachment)
            })
    }

    fn live_rail_policy(&self) -> Option<Arc<LiveRailPolicy>> {
        Some(self.settings.rail_policy.clone())
    }

    fn live_selector(&self) -> Option<Arc<LiveSelector>> {
        Some(self.selector.clone())
    }

    fn rail_stats(&self, segment: &Segment) -> Vec<RailStat> {
        peer_of(segment)
            .map(RdmaPeer::rail_stats)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunked region's rkey is its NIC's key for the chunk a request
    /// starts in; a step this engine would not make, a list too short for
    /// the chunks, or a zero key is no key (a peer's descriptor).
    #[test]
    fn rkeys_are_looked_up_by_nic_and_chunk_and_a_bad_layout_grants_none() {
        const GIB: u64 = 1 << 30;
        let region = |mr_step: Option<u64>, keys: Vec<u32>| RegionEntry {
            id: 1,
            addr: 1 << 40,
            len: 10 * GIB,
            key: 7,
            rkeys: if mr_step.is_some() {
                vec![0; 2]
            } else {
                keys.clone()
            },
            mr_step,
            chunk_rkeys: if mr_step.is_some() { keys } else { Vec::new() },
        };
        // 10 GiB in chunks of 4 GiB every 2 GiB: 4 per NIC, two NICs.
        let r = region(Some(2 * GIB), (0..8).map(|k| 100 + k).collect());
        let at = |off: u64| r.addr + off;
        assert_eq!(rkey_on(&r, 0, at(0)), Some(100));
        assert_eq!(rkey_on(&r, 0, at(2 * GIB - 1)), Some(100));
        assert_eq!(rkey_on(&r, 0, at(2 * GIB)), Some(101));
        assert_eq!(rkey_on(&r, 1, at(5 * GIB)), Some(106));
        // The last chunk runs to the end.
        assert_eq!(rkey_on(&r, 1, at(10 * GIB - 8)), Some(107));
        assert_eq!(rkey_on(&r, 2, at(0)), None, "no third NIC");
        // Unchunked: one key per NIC, wherever the request starts.
        let whole = region(None, vec![5, 0]);
        assert_eq!(rkey_on(&whole, 0, whole.addr + 9 * GIB), Some(5));
        assert_eq!(rkey_on(&whole, 1, whole.addr), None, "zero is no key");
        // Hostile layouts: a step below the shortest, or keys missing.
        assert_eq!(rkey_on(&region(Some(4096), vec![1; 8]), 0, at(0)), None);
        assert_eq!(
            rkey_on(&region(Some(2 * GIB), vec![1; 5]), 1, at(3 * GIB)),
            None
        );
    }

    #[test]
    fn auto_gives_roce_rails_two_qps_and_infiniband_one() {
        use LinkLayer::*;
        assert_eq!(qps_per_rail([Ethernet, Ethernet].into_iter()), 2);
        assert_eq!(qps_per_rail([InfiniBand].into_iter()), 1);
        // Mixed: one count per peer, the RoCE rails' (InfiniBand's second
        // QP costs a QP context, nothing more).
        assert_eq!(qps_per_rail([InfiniBand, Ethernet].into_iter()), 2);
        assert_eq!(qps_per_rail(std::iter::empty()), 1);
    }
}
