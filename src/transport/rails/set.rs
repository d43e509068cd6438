//! `RailSet`: the rails to one peer, as every network transport uses them.
//!
//! A transport builds one set per attached peer from [`RailDesc`]s (the
//! local and remote device of each rail, the local device's NUMA node and
//! port speed), and each of its workers keeps a [`WorkerRails`] for that
//! peer in its own per-worker state. Everything a slice does to a rail
//! goes through the set:
//!
//! - [`RailSet::pick`]: the [`DeviceSelector`] chooses among the rails the
//!   transport can post on (link, keys) and the [`RailMonitor`] lets through
//!   (a paused rail never; a demoted one only as round robin's fallback or
//!   probe: under smart scheduling its EWMA already gives it its share);
//! - [`RailSet::posted`], [`RailSet::left`], [`RailSet::completed`]: the
//!   worker's own load and bandwidth estimate of the rail, published to
//!   per-worker slots (one writer each, plain stores: no shared
//!   read-modify-write per slice) that observability sums when it reads;
//! - [`RailSet::fault`]: one classification of rail-level faults
//!   ([`is_rail_fault`]) for every transport, counted by the monitor;
//! - [`MAX_RAIL_MOVES`]: one budget for moving a slice to a sibling rail;
//! - [`RailSet::review`]: slow-rail demotion from the summed estimates;
//! - [`RailSet::stats`]: what `Engine::rails` and the traffic statistics
//!   report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tent_rings::{ErrorKind, TransportKind};

use super::monitor::{LiveRailPolicy, RailMonitor, RailStat, ReviewClock, review_bandwidth};
use super::selector::{
    DeviceSelector, LiveSelector, MAX_MEM_NODES, NoRail, RailSpec, Spray, Tiers,
};
use crate::clock::monotonic_ns;

/// Times a slice may move to a sibling rail before its failure reaches
/// the task (every transport: one budget).
pub(crate) const MAX_RAIL_MOVES: u8 = 8;

/// A worker's estimate counts toward a rail's summed bandwidth while it
/// sampled within this long.
const FRESH_NS: u64 = 1_000_000_000;

/// Is `kind` the fault of a rail, so that a sibling rail may do better
/// (and the rail's monitor counts it)? Not back-pressure (`SqFull`), not a
/// dead peer process (every rail reaches the same process: pausing rails
/// would only turn `ProcessFailed` into `RouteLost`), not a deadline, and
/// nothing the request itself got wrong.
#[inline]
pub(crate) fn is_rail_fault(kind: ErrorKind) -> bool {
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

/// One rail as the transport found it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RailDesc {
    /// Local device (NIC or interface) name.
    pub local: String,
    /// Remote device name.
    pub remote: String,
    /// The local device's NUMA node (`None`: unknown, tier 0 everywhere).
    pub numa_node: Option<u32>,
    /// The local device's port speed, Gbit/s (`None`: unknown).
    pub speed_gbps: Option<f64>,
    /// Slices of one worker the rail serves at once (TCP: connections ×
    /// requests in flight on each; RDMA: the endpoint's send queue depth).
    /// Under smart scheduling a request's next slice is bound to a rail
    /// only below it ([`Ask::Next`]); 0: no bound.
    pub depth: u32,
}

/// What a slice asks of [`RailSet::pick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A request's next slice, with this many of its slices (this one
    /// included) still to post. Under smart scheduling it is bound to a
    /// rail only when one it should go to has room, else `SqFull`
    /// (back-pressure: post it after a completion).
    Next(u64),
    /// A slice going again: moving off the rail named (never back to it),
    /// or caught in another slice's fault (`None`). Never waits for room:
    /// it was admitted once already.
    Again(Option<usize>),
    /// A HIGH request's last (or only) slice (seed 001). With
    /// `enable_priority_filtering`: bound at
    /// once (no plan, no waiting for room) to the least-loaded usable
    /// rail of its best NUMA tier, which bulk slices then leave to HIGH
    /// for `local_rotation_interval_us`; without it, as `Next(1)`.
    Urgent,
}

impl Ask {
    /// A request's next slice, `slices_left` of it (this one included)
    /// still to post; `high`: the request is HIGH. Its last (or only)
    /// slice is [`Urgent`](Ask::Urgent); a large HIGH request keeps the
    /// plan, since HIGH is the default priority and most bulk is HIGH
    /// when nothing else is.
    #[inline]
    pub(crate) fn next(high: bool, slices_left: u64) -> Ask {
        if high && slices_left <= 1 {
            Ask::Urgent
        } else {
            Ask::Next(slices_left)
        }
    }
}

/// Where the engine's workers run: their NUMA nodes, and the distance
/// classes between nodes (for the rails' tiers, by the node of a slice's
/// memory, the worker's breaking ties).
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// Worker `i`'s NUMA node (`None`: not pinned, or unknown).
    pub nodes: Vec<Option<u32>>,
    /// The machine's topology (`None`: every other node is tier 1).
    pub topology: Option<crate::topology::Topology>,
}

impl Placement {
    /// The tier of a device on `device` for worker `worker`: 0 when either
    /// node is unknown or they are the same, else the rank of their NUMA
    /// distance.
    pub(crate) fn tier(&self, worker: usize, device: Option<u32>) -> u8 {
        self.tier_from(self.nodes.get(worker).copied().flatten(), device)
    }

    /// The tier of a device on `device` seen from node `from` (a worker's,
    /// or where a slice's memory is): as [`Placement::tier`].
    pub(crate) fn tier_from(&self, from: Option<u32>, device: Option<u32>) -> u8 {
        match (from, device) {
            (Some(a), Some(b)) if a != b => self
                .topology
                .as_ref()
                .map_or(1, |t| t.tier(Some(a), Some(b)).max(1)),
            _ => 0,
        }
    }
}

/// One worker's counters for one rail, published for readers: written by
/// that worker alone with plain stores, read (summed) by observability.
#[derive(Debug, Default)]
struct Published {
    bytes: AtomicU64,
    inflight_bytes: AtomicU64,
    inflight_slices: AtomicU32,
    /// The worker's EWMA, `f64` bits (0: none yet).
    ewma: AtomicU64,
    /// When it last sampled (0: never).
    sampled_ns: AtomicU64,
}

/// One rail to a peer: its names, health, and the workers' counters.
#[derive(Debug)]
pub(crate) struct Rail {
    /// Local device name.
    pub local: String,
    /// Remote device name.
    pub remote: String,
    /// The local device's NUMA node.
    pub numa_node: Option<u32>,
    /// Its health.
    pub monitor: RailMonitor,
    spec: RailSpec,
    moved: AtomicU64,
    workers: Box<[CachePadded<Published>]>,
}

impl Rail {
    /// Bytes it has carried, every worker together.
    pub(crate) fn bytes(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.bytes.load(Ordering::Relaxed))
            .sum()
    }

    /// Slices and bytes on it now, every worker together.
    pub(crate) fn inflight(&self) -> (u32, u64) {
        self.workers.iter().fold((0, 0), |(s, b), w| {
            (
                s.saturating_add(w.inflight_slices.load(Ordering::Relaxed)),
                b.saturating_add(w.inflight_bytes.load(Ordering::Relaxed)),
            )
        })
    }

    /// Slices moved off it to a sibling.
    pub(crate) fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }

    /// Theoretical bandwidth, bytes per second.
    pub(crate) fn theoretical(&self) -> f64 {
        self.spec.theoretical_bps
    }

    /// Its bandwidth estimate at `now`, bytes per second: the measured
    /// one, or the theoretical bandwidth if no worker has sampled it.
    pub(crate) fn bandwidth(&self, now: u64) -> u64 {
        self.measured(now)
            .unwrap_or(self.spec.theoretical_bps as u64)
    }

    /// What the workers measured by `now`: the sum of the estimates of
    /// those that sampled it in the last second (each measures its own
    /// share when several use it); if none did lately, the freshest
    /// estimate; `None` if none ever did.
    fn measured(&self, now: u64) -> Option<u64> {
        let mut fresh = 0.0;
        let mut latest = (0u64, 0.0);
        for w in self.workers.iter() {
            let at = w.sampled_ns.load(Ordering::Relaxed);
            if at == 0 {
                continue;
            }
            let e = f64::from_bits(w.ewma.load(Ordering::Relaxed));
            if now.saturating_sub(at) <= FRESH_NS {
                fresh += e;
            }
            if at >= latest.0 {
                latest = (at, e);
            }
        }
        if fresh > 0.0 {
            Some(fresh as u64)
        } else if latest.0 != 0 {
            Some(latest.1 as u64)
        } else {
            None
        }
    }
}

/// The rails to one peer.
#[derive(Debug)]
pub(crate) struct RailSet {
    kind: TransportKind,
    selector: Arc<LiveSelector>,
    rails: Box<[Rail]>,
    review: ReviewClock,
    placement: Arc<Placement>,
}

/// One worker's rail state toward one peer: its loads, estimates and
/// selection plan. Lives in the transport's per-worker state; only that
/// worker touches it.
#[derive(Debug)]
pub(crate) struct WorkerRails {
    worker: usize,
    /// The transport's selector as this worker last found it: one relaxed
    /// load per pick sees a reload, which applies from that pick on.
    selector: arc_swap::Cache<Arc<LiveSelector>, Arc<DeviceSelector>>,
    spray: Spray,
    /// The rail HIGH slices last went out on and until when (monotonic
    /// ns) bulk slices keep off it (priority filtering).
    express: Option<(usize, u64)>,
    /// Each rail's link epoch this worker's estimate belongs to.
    epochs: Box<[u32]>,
}

impl RailSet {
    /// The rails `descs` of a transport of `kind`, for `workers` workers
    /// placed as `placement` says.
    pub(crate) fn new(
        kind: TransportKind,
        selector: Arc<LiveSelector>,
        policy: Arc<LiveRailPolicy>,
        placement: Arc<Placement>,
        descs: Vec<RailDesc>,
        workers: usize,
    ) -> RailSet {
        // A rail's theoretical bandwidth is fixed when its peer attaches.
        let sel = selector.load();
        let cfg = sel.config();
        let rails = descs
            .into_iter()
            .map(|d| Rail {
                monitor: RailMonitor::with_live(policy.clone(), d.local.clone(), d.remote.clone()),
                spec: RailSpec {
                    theoretical_bps: cfg.theoretical_bps(d.speed_gbps),
                    depth: d.depth,
                },
                local: d.local,
                remote: d.remote,
                numa_node: d.numa_node,
                moved: AtomicU64::new(0),
                workers: (0..workers.max(1))
                    .map(|_| CachePadded::new(Published::default()))
                    .collect(),
            })
            .collect();
        RailSet {
            kind,
            selector,
            rails,
            review: ReviewClock::default(),
            placement,
        }
    }

    /// Worker `worker`'s state toward this peer (allocates: call at
    /// attach, not per slice): among others each rail's tier for memory on
    /// each node the placement or a rail names (see [`Tiers`]).
    pub(crate) fn worker(&self, worker: usize) -> WorkerRails {
        let specs: Vec<RailSpec> = self.rails.iter().map(|r| r.spec).collect();
        let near: Vec<u8> = self
            .rails
            .iter()
            .map(|r| self.placement.tier(worker, r.numa_node))
            .collect();
        let tiers = Tiers::new(&near, self.memory_nodes(), |node, r| {
            self.placement
                .tier_from(Some(node), self.rails[r].numa_node)
        });
        // Seeded per worker and peer so two workers' jitter differs.
        let seed = (worker as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (self as *const RailSet as u64);
        let selector = arc_swap::Cache::new(self.selector.clone());
        WorkerRails {
            worker: worker.min(self.workers() - 1),
            spray: Spray::new(&self.selector.load(), &specs, &tiers, seed),
            selector,
            express: None,
            epochs: self.rails.iter().map(|r| r.monitor.link_epoch()).collect(),
        }
    }

    fn workers(&self) -> usize {
        self.rails.first().map_or(1, |r| r.workers.len())
    }

    /// Node ids memory may be on, `0..n`: past the highest node the
    /// topology, a worker or a rail names (at most [`MAX_MEM_NODES`]).
    fn memory_nodes(&self) -> usize {
        let p = &*self.placement;
        let topology = p.topology.iter().flat_map(|t| t.node_ids());
        let named = p
            .nodes
            .iter()
            .chain(self.rails.iter().map(|r| &r.numa_node));
        topology
            .chain(named.copied().flatten())
            .map(|n| n as usize + 1)
            .max()
            .unwrap_or(0)
            .min(MAX_MEM_NODES)
    }

    /// Rail `i`.
    #[inline]
    pub(crate) fn rail(&self, i: usize) -> &Rail {
        &self.rails[i]
    }

    /// The rail for a slice of about `slice_bytes` of request `token`
    /// (`ask`: its next slice, or one going again) whose local memory is
    /// on NUMA node `mem` (its region's
    /// [`numa_node`](crate::memory::MemRegion::numa_node); `None`:
    /// unknown), among those `usable` says the transport can post on now. `Err(RouteLost)`: no rail can
    /// take it; `Err(SqFull)`: the rails it should go to are full (smart
    /// scheduling's late binding, [`Ask::Next`] only).
    #[inline]
    pub(crate) fn pick(
        &self,
        w: &mut WorkerRails,
        mem: Option<u32>,
        token: u64,
        ask: Ask,
        slice_bytes: u64,
        usable: impl Fn(usize) -> bool,
    ) -> Result<usize, ErrorKind> {
        let rails = &self.rails;
        let sel: &DeviceSelector = w.selector.load();
        let cfg = sel.config();
        let ask = match ask {
            Ask::Urgent if cfg.priority_filtering => {
                // HIGH: the least-loaded rail of the best tier that has a
                // usable one, at once; held for it a while.
                let ok = |r: usize| usable(r) && rails[r].monitor.available();
                let rail = w
                    .spray
                    .best_of_top_tier(sel, mem, ok, slice_bytes)
                    .ok_or(ErrorKind::RouteLost)?;
                if w.spray.rails() > 1 {
                    w.express = Some((rail, monotonic_ns().saturating_add(cfg.express_hold_ns)));
                }
                return Ok(rail);
            }
            Ask::Urgent => Ask::Next(1),
            other => other,
        };
        if let (Ask::Next(_), Some((x, until))) = (ask, w.express) {
            // Bulk keeps off HIGH's rail while HIGH holds it, when another
            // rail can take the slice (never refused for it alone).
            if monotonic_ns() >= until {
                w.express = None;
            } else {
                let others = (0..w.spray.rails())
                    .any(|r| r != x && usable(r) && rails[r].monitor.available());
                if others {
                    match self.pick_plain(sel, &mut w.spray, mem, token, ask, slice_bytes, |r| {
                        r != x && usable(r)
                    }) {
                        // `usable` reads links that go down at any
                        // instant: the other rails went since `others`
                        // was read, so HIGH's rail (or none) it is.
                        Err(ErrorKind::RouteLost) => {}
                        picked => return picked,
                    }
                }
            }
        }
        self.pick_plain(sel, &mut w.spray, mem, token, ask, slice_bytes, usable)
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn pick_plain(
        &self,
        sel: &DeviceSelector,
        spray: &mut Spray,
        mem: Option<u32>,
        token: u64,
        ask: Ask,
        slice_bytes: u64,
        usable: impl Fn(usize) -> bool,
    ) -> Result<usize, ErrorKind> {
        let rails = &self.rails;
        let (slices_left, avoid) = match ask {
            Ask::Next(left) => (left, None),
            Ask::Again(avoid) => (1, avoid),
            Ask::Urgent => (1, None),
        };
        if sel.is_smart() {
            // Paused rails are out; a demoted one keeps its EWMA share.
            let ok = |r: usize| usable(r) && rails[r].monitor.available();
            return match ask {
                Ask::Next(_) | Ask::Urgent => spray
                    .next(sel, mem, token, slices_left, slice_bytes, ok)
                    .map_err(|e| match e {
                        NoRail::Full => ErrorKind::SqFull,
                        NoRail::Unusable => ErrorKind::RouteLost,
                    }),
                Ask::Again(_) => spray
                    .pick(sel, mem, token, slices_left, slice_bytes, avoid, ok)
                    .ok_or(ErrorKind::RouteLost),
            };
        }
        // Round robin: rails the monitor prefers (not demoted, or a
        // demoted one's probe is due), else any available one.
        spray
            .pick(sel, mem, token, slices_left, slice_bytes, avoid, |r| {
                usable(r) && rails[r].monitor.preferred()
            })
            .or_else(|| {
                spray.pick(sel, mem, token, slices_left, slice_bytes, avoid, |r| {
                    usable(r) && rails[r].monitor.available()
                })
            })
            .ok_or(ErrorKind::RouteLost)
    }

    /// A slice of `bytes` was posted on `rail`; returns how many of this
    /// worker's slices were ahead of it there (hand it back to
    /// [`completed`](Self::completed)).
    #[inline]
    pub(crate) fn posted(&self, w: &mut WorkerRails, rail: usize, bytes: u64) -> u16 {
        let ahead = w.spray.posted(rail, bytes);
        self.publish_load(w, rail);
        ahead.min(u32::from(u16::MAX)) as u16
    }

    /// A slice of `bytes` left `rail` without completing well (failed,
    /// moved, aborted).
    #[inline]
    pub(crate) fn left(&self, w: &mut WorkerRails, rail: usize, bytes: u64) {
        w.spray.left(rail, bytes);
        self.publish_load(w, rail);
    }

    /// A slice of `bytes` posted on `rail` at `posted_ns` with `ahead`
    /// slices ahead of it completed well at `now`: it leaves the rail,
    /// feeds the worker's estimate, and un-pauses the rail if it was a
    /// probe.
    #[inline]
    pub(crate) fn completed(
        &self,
        w: &mut WorkerRails,
        rail: usize,
        bytes: u64,
        posted_ns: u64,
        now: u64,
        ahead: u16,
    ) {
        let r = &self.rails[rail];
        let sel: &DeviceSelector = w.selector.load();
        let epoch = r.monitor.link_epoch();
        if w.epochs[rail] != epoch {
            // Its link came back since: what this worker knew is stale.
            w.epochs[rail] = epoch;
            w.spray.reset_estimate(sel, rail);
        }
        w.spray.left(rail, bytes);
        w.spray.observed(
            sel,
            rail,
            bytes,
            now.saturating_sub(posted_ns),
            u32::from(ahead),
        );
        let p = &r.workers[w.worker];
        // One writer: a load and a store, no locked RMW.
        p.bytes.store(
            p.bytes.load(Ordering::Relaxed).wrapping_add(bytes),
            Ordering::Relaxed,
        );
        p.ewma
            .store(w.spray.load(rail).ewma_bps.to_bits(), Ordering::Relaxed);
        p.sampled_ns.store(now.max(1), Ordering::Relaxed);
        self.publish_load(w, rail);
        r.monitor.mark_recovered(posted_ns, now);
    }

    #[inline]
    fn publish_load(&self, w: &WorkerRails, rail: usize) {
        let l = w.spray.load(rail);
        let p = &self.rails[rail].workers[w.worker];
        p.inflight_bytes.store(l.inflight_bytes, Ordering::Relaxed);
        p.inflight_slices
            .store(l.inflight_slices, Ordering::Relaxed);
    }

    /// A slice failed on `rail` with `kind`: counted against the rail if
    /// it is a rail-level fault. Returns whether it was (a sibling rail
    /// may then do better).
    #[inline]
    pub(crate) fn fault(&self, rail: usize, kind: ErrorKind) -> bool {
        let fault = is_rail_fault(kind);
        if fault {
            self.rails[rail].monitor.mark_failed();
        }
        fault
    }

    /// A slice moved off `rail` to a sibling.
    #[inline]
    pub(crate) fn moved(&self, rail: usize) {
        self.rails[rail].moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Demote rails slow against their siblings (every 100 ms at most, by
    /// whichever worker comes first); only rails `in_service` are judged.
    pub(crate) fn review(&self, now: u64, in_service: impl Fn(usize) -> bool) {
        if self.review.due(now) {
            review_bandwidth(
                self.rails.len(),
                |i| &self.rails[i].monitor,
                // Only measured estimates: the theoretical is no evidence
                // of slowness.
                |i| self.rails[i].measured(now).unwrap_or(0),
                in_service,
                now,
            );
        }
    }

    /// Each rail as observability reports it; `up(i)`: is rail `i`'s link
    /// up.
    pub(crate) fn stats(&self, up: impl Fn(usize) -> bool) -> Vec<RailStat> {
        let now = crate::clock::monotonic_ns();
        self.rails
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (inflight, inflight_bytes) = r.inflight();
                RailStat {
                    transport: self.kind,
                    local: r.local.clone(),
                    remote: r.remote.clone(),
                    up: up(i),
                    bytes: r.bytes(),
                    moved: r.moved(),
                    state: r.monitor.state_at(now),
                    failures: r.monitor.failures(),
                    trips: r.monitor.trips(),
                    inflight,
                    inflight_bytes,
                    bandwidth: r.bandwidth(now),
                    theoretical: r.theoretical() as u64,
                    tier: self.placement.tier(0, r.numa_node),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize, workers: usize) -> RailSet {
        set_with(
            n,
            workers,
            crate::transport::rails::SelectorConfig::default(),
        )
    }

    fn set_with(n: usize, workers: usize, cfg: crate::transport::rails::SelectorConfig) -> RailSet {
        set_live(
            n,
            workers,
            Arc::new(LiveSelector::from_pointee(DeviceSelector::new(cfg))),
        )
    }

    /// `n` rails of 100 Gb/s for `workers`, reading the selector in `live`.
    fn set_live(n: usize, workers: usize, live: Arc<LiveSelector>) -> RailSet {
        RailSet::new(
            TransportKind::Tcp,
            live,
            Arc::new(LiveRailPolicy::new(
                crate::transport::rails::RailPolicy::default(),
            )),
            Arc::new(Placement::default()),
            (0..n)
                .map(|i| RailDesc {
                    local: format!("l{i}"),
                    remote: format!("r{i}"),
                    numa_node: None,
                    speed_gbps: Some(100.0),
                    depth: 0,
                })
                .collect(),
            workers,
        )
    }

    /// Seed 001's priority filtering: HIGH binds at once to the least
    /// loaded rail, and bulk keeps off that rail while HIGH holds it
    /// (unless no other rail is usable), then has it back.
    #[test]
    fn bulk_keeps_off_the_rail_high_holds_until_the_hold_lapses() {
        let mut cfg = crate::transport::rails::SelectorConfig::default();
        assert!(cfg.priority_filtering, "the seed's default");
        cfg.express_hold_ns = 30_000_000;
        let s = set_with(3, 1, cfg.clone());
        let mut w = s.worker(0);
        // Load rails 0 and 2: HIGH takes the idle rail 1.
        s.posted(&mut w, 0, 1 << 20);
        s.posted(&mut w, 2, 1 << 20);
        let x = s
            .pick(&mut w, None, 1, Ask::Urgent, 4096, |_| true)
            .unwrap();
        assert_eq!(x, 1);
        for t in 0..200 {
            let r = s
                .pick(&mut w, None, 100 + t, Ask::Next(1), 65536, |_| true)
                .unwrap();
            assert_ne!(r, x, "bulk slice {t} took HIGH's rail");
            s.posted(&mut w, r, 65536);
        }
        // Only HIGH's rail usable: bulk still goes (never refused for it).
        assert_eq!(
            s.pick(&mut w, None, 999, Ask::Next(1), 65536, |r| r == x),
            Ok(x)
        );
        std::thread::sleep(std::time::Duration::from_millis(40));
        let mut back = false;
        for t in 0..200 {
            let r = s
                .pick(&mut w, None, 2000 + t, Ask::Next(1), 65536, |_| true)
                .unwrap();
            back |= r == x;
        }
        assert!(back, "the hold lapsed: bulk uses every rail again");
        // Filtering off: HIGH is an ordinary slice and holds nothing.
        cfg.priority_filtering = false;
        let s = set_with(3, 1, cfg);
        let mut w = s.worker(0);
        s.pick(&mut w, None, 1, Ask::Urgent, 4096, |_| true)
            .unwrap();
        assert!(w.express.is_none());
    }

    /// `Engine::reload` stores a new selector in the transport's
    /// `LiveSelector`: a worker's `WorkerRails`, made before, picks with it
    /// from its next pick on (its cache sees the new pointer), and its
    /// estimates follow it at the next completion.
    #[test]
    fn a_reloaded_selector_applies_at_a_workers_next_pick_and_completion() {
        let cfg = crate::transport::rails::SelectorConfig {
            jitter: 0.0,
            ..Default::default()
        };
        let live = Arc::new(LiveSelector::from_pointee(DeviceSelector::new(cfg.clone())));
        let s = set_live(2, 1, live.clone());
        let mut w = s.worker(0);
        s.posted(&mut w, 1, 1 << 30);
        let pick = |w: &mut WorkerRails, t: u64| {
            s.pick(w, None, t, Ask::Next(1), 65536, |_| true).unwrap()
        };
        assert_eq!(
            [pick(&mut w, 1), pick(&mut w, 2)],
            [0, 0],
            "smart: rail 1 is loaded"
        );
        live.store(Arc::new(DeviceSelector::new(
            crate::transport::rails::SelectorConfig {
                smart: false,
                learning_rate: 1.0,
                ..cfg.clone()
            },
        )));
        let mut seen = [0; 2];
        for t in 10..14 {
            seen[pick(&mut w, t)] += 1;
        }
        assert_eq!(seen, [2, 2], "round robin from the next pick");
        // Learning rate 1 from the next completion: the estimate stays.
        let before = w.spray.load(0).ewma_bps;
        s.posted(&mut w, 0, 65536);
        s.completed(&mut w, 0, 65536, 0, 1, 0);
        assert_eq!(w.spray.load(0).ewma_bps, before);
    }

    /// Priority filtering and its hold (`enable_priority_filtering`,
    /// `local_rotation_interval_us`) reloaded: the next HIGH pick holds
    /// its rail for the new time, or holds nothing.
    #[test]
    fn reloaded_priority_filtering_and_hold_apply_at_the_next_high_pick() {
        let cfg = crate::transport::rails::SelectorConfig {
            express_hold_ns: 30_000_000,
            ..Default::default()
        };
        let s = set_with(2, 1, cfg.clone());
        let mut w = s.worker(0);
        let held = |w: &WorkerRails| {
            w.express
                .map(|(_, until)| until.saturating_sub(monotonic_ns()))
        };
        s.pick(&mut w, None, 1, Ask::Urgent, 4096, |_| true)
            .unwrap();
        assert!(held(&w).unwrap() > 20_000_000, "held 30 ms");
        s.selector.store(Arc::new(DeviceSelector::new(
            crate::transport::rails::SelectorConfig {
                express_hold_ns: 10_000,
                ..cfg.clone()
            },
        )));
        s.pick(&mut w, None, 2, Ask::Urgent, 4096, |_| true)
            .unwrap();
        assert!(
            held(&w).unwrap() <= 10_000,
            "held 10 us from the next HIGH pick"
        );
        w.express = None;
        s.selector.store(Arc::new(DeviceSelector::new(
            crate::transport::rails::SelectorConfig {
                priority_filtering: false,
                ..cfg
            },
        )));
        s.pick(&mut w, None, 3, Ask::Urgent, 4096, |_| true)
            .unwrap();
        assert!(w.express.is_none(), "filtering off: HIGH holds nothing");
    }

    /// The other rails' links go down between the look that finds them
    /// usable and the pick among them: the bulk slice takes HIGH's rail,
    /// never a refusal with `RouteLost` (which failed a whole request
    /// while the surviving rail was up).
    #[test]
    fn bulk_kept_off_high_s_rail_takes_it_when_the_others_go_down_meanwhile() {
        for smart in [true, false] {
            let cfg = crate::transport::rails::SelectorConfig {
                express_hold_ns: 30_000_000,
                smart,
                ..Default::default()
            };
            let s = set_with(2, 1, cfg);
            let mut w = s.worker(0);
            s.posted(&mut w, 1, 1 << 20);
            let x = s
                .pick(&mut w, None, 1, Ask::Urgent, 4096, |_| true)
                .unwrap();
            assert_eq!(x, 0, "HIGH takes the idle rail");
            // Rail 1 reads up to the first look, down from then on.
            let looks = std::cell::Cell::new(0u32);
            let usable = |r: usize| {
                if r != 1 {
                    return true;
                }
                looks.set(looks.get() + 1);
                looks.get() == 1
            };
            assert_eq!(s.pick(&mut w, None, 2, Ask::Next(1), 65536, usable), Ok(x));
        }
    }

    #[test]
    fn one_classification_of_rail_faults() {
        for k in [
            ErrorKind::Unreachable,
            ErrorKind::RouteLost,
            ErrorKind::LocalNicFailed,
            ErrorKind::RemoteNicReboot,
        ] {
            assert!(is_rail_fault(k), "{k}");
        }
        for k in [
            ErrorKind::ProcessFailed,
            ErrorKind::SqFull,
            ErrorKind::Timeout,
            ErrorKind::AccessDenied,
            ErrorKind::Canceled,
        ] {
            assert!(!is_rail_fault(k), "{k}");
        }
        let s = set(2, 1);
        assert!(!s.fault(0, ErrorKind::ProcessFailed));
        assert_eq!(s.rail(0).monitor.failures(), 0);
        assert!(s.fault(0, ErrorKind::RouteLost));
        assert_eq!(s.rail(0).monitor.failures(), 1);
    }

    #[test]
    fn counters_are_per_worker_and_summed_when_read() {
        let s = set(2, 2);
        let mut a = s.worker(0);
        let mut b = s.worker(1);
        assert_eq!(s.posted(&mut a, 1, 100), 0);
        assert_eq!(s.posted(&mut a, 1, 100), 1);
        // Worker b's queue is its own.
        assert_eq!(s.posted(&mut b, 1, 50), 0);
        assert_eq!(s.rail(1).inflight(), (3, 250));
        s.completed(&mut a, 1, 100, 1_000, 2_000, 0);
        s.left(&mut b, 1, 50);
        assert_eq!(s.rail(1).inflight(), (1, 100));
        assert_eq!(s.rail(1).bytes(), 100);
        let st = s.stats(|_| true);
        assert_eq!(st[1].bytes, 100);
        assert_eq!(st[1].inflight_bytes, 100);
        assert_eq!(st[0].bandwidth, st[0].theoretical, "never sampled");
    }

    #[test]
    fn link_restored_resets_the_workers_estimates() {
        let s = set(1, 1);
        let mut w = s.worker(0);
        let theory = s.rail(0).theoretical();
        s.posted(&mut w, 0, 1_000_000);
        // 1 MB in 1 s: far below theory, clamped at the floor.
        s.completed(&mut w, 0, 1_000_000, 1, 1_000_000_001, 0);
        let low = w.spray.load(0).ewma_bps;
        assert!(low < theory, "{low} vs {theory}");
        s.rail(0).monitor.link_restored();
        s.posted(&mut w, 0, 1);
        s.completed(&mut w, 0, 0, 5, 5, 0);
        assert_eq!(w.spray.load(0).ewma_bps, theory);
    }

    /// Two NUMA nodes, a worker on node 0, two equal rails, one on each
    /// node: the local rail takes every single-slice request until its
    /// queue makes it predict worse than the remote one does after the
    /// tier penalty (5x by default); then the remote rail gets work.
    #[test]
    fn on_an_injected_two_node_machine_local_rails_win_until_they_are_loaded() {
        use crate::topology::{NumaDistances, NumaNode, Topology};
        let topology = Topology::from_nodes_with_distances(
            vec![
                NumaNode {
                    os_index: 0,
                    cpus: vec![0],
                },
                NumaNode {
                    os_index: 1,
                    cpus: vec![1],
                },
            ],
            NumaDistances::new(vec![0, 1], vec![vec![10, 21], vec![21, 10]]).unwrap(),
        );
        let placement = Arc::new(Placement {
            nodes: vec![topology.worker_node(Some(0))],
            topology: Some(topology),
        });
        let cfg = crate::transport::rails::SelectorConfig {
            jitter: 0.0,
            ..Default::default()
        };
        let s = RailSet::new(
            TransportKind::Rdma,
            Arc::new(LiveSelector::from_pointee(DeviceSelector::new(cfg))),
            Arc::new(LiveRailPolicy::new(
                crate::transport::rails::RailPolicy::default(),
            )),
            placement,
            [("remote", 1), ("local", 0)]
                .into_iter()
                .map(|(name, node)| RailDesc {
                    local: name.into(),
                    remote: "peer".into(),
                    numa_node: Some(node),
                    speed_gbps: Some(100.0),
                    depth: 0,
                })
                .collect(),
            1,
        );
        let mut w = s.worker(0);
        assert_eq!(
            s.stats(|_| true).iter().map(|r| r.tier).collect::<Vec<_>>(),
            [1, 0]
        );
        let slice = 65_536;
        let mut picks = Vec::new();
        for token in 0..8 {
            let r = s
                .pick(&mut w, None, token, Ask::Next(1), slice, |_| true)
                .unwrap();
            s.posted(&mut w, r, slice);
            picks.push(r);
        }
        // Local predicts (k+1)·slice/bw; remote 5·slice/bw: the local rail
        // wins while fewer than 4 slices are queued on it (a tie at 4 goes
        // to either), then the remote one gets the next.
        assert_eq!(&picks[..4], [1, 1, 1, 1], "{picks:?}");
        assert!(
            picks[4..].contains(&0),
            "the loaded local rail shares: {picks:?}"
        );
        // Unloaded again, the local rail wins again.
        for (i, &r) in picks.iter().enumerate() {
            s.completed(&mut w, r, slice, 0, 1 + i as u64, 0);
        }
        let mut w = s.worker(0);
        assert_eq!(
            s.pick(&mut w, None, 99, Ask::Next(1), slice, |_| true),
            Ok(1)
        );
    }

    /// A set over rails on NUMA nodes `nics` (in rail order), for workers
    /// on `workers`, on a machine with the distance table `distances`
    /// (node `i`'s row is `distances[i]`).
    fn numa_set(
        distances: Vec<Vec<u32>>,
        workers: &[u32],
        nics: &[u32],
        cfg: crate::transport::rails::SelectorConfig,
    ) -> RailSet {
        use crate::topology::{NumaDistances, NumaNode, Topology};
        let n = distances.len() as u32;
        let topology = Topology::from_nodes_with_distances(
            (0..n)
                .map(|i| NumaNode {
                    os_index: i,
                    cpus: vec![i as usize],
                })
                .collect(),
            NumaDistances::new((0..n).collect(), distances).unwrap(),
        );
        let placement = Arc::new(Placement {
            nodes: workers
                .iter()
                .map(|&w| topology.worker_node(Some(w as usize)))
                .collect(),
            topology: Some(topology),
        });
        RailSet::new(
            TransportKind::Rdma,
            Arc::new(LiveSelector::from_pointee(DeviceSelector::new(cfg))),
            Arc::new(LiveRailPolicy::new(
                crate::transport::rails::RailPolicy::default(),
            )),
            placement,
            nics.iter()
                .map(|&node| RailDesc {
                    local: format!("nic{node}"),
                    remote: "peer".into(),
                    numa_node: Some(node),
                    speed_gbps: Some(100.0),
                    depth: 0,
                })
                .collect(),
            workers.len(),
        )
    }

    /// The first rail each way of picking gives a fresh worker `worker`
    /// for a slice whose memory is on `mem`: smart (one slice, and a HIGH
    /// slice under priority filtering) and round robin.
    fn first_picks(
        distances: &[Vec<u32>],
        workers: &[u32],
        nics: &[u32],
        worker: usize,
        mem: Option<u32>,
    ) -> [usize; 3] {
        let cfg = |smart| crate::transport::rails::SelectorConfig {
            jitter: 0.0,
            smart,
            ..Default::default()
        };
        let pick = |smart, ask| {
            let s = numa_set(distances.to_vec(), workers, nics, cfg(smart));
            let mut w = s.worker(worker);
            s.pick(&mut w, mem, 1, ask, 65_536, |_| true).unwrap()
        };
        [
            pick(true, Ask::Next(1)),
            pick(true, Ask::Urgent),
            pick(false, Ask::Next(1)),
        ]
    }

    /// Two nodes, a NIC on each: a slice's rails rank from its memory's
    /// node, so memory on node 1 goes out through node 1's NIC even from
    /// a worker on node 0; memory on an unknown node ranks from the
    /// worker's node.
    #[test]
    fn rails_rank_from_the_memory_s_node_and_from_the_worker_s_when_unknown() {
        let two = vec![vec![10, 21], vec![21, 10]];
        // Rail 0 on node 0, rail 1 on node 1; one worker on each node.
        let nics = [0, 1];
        assert_eq!(first_picks(&two, &[0, 1], &nics, 0, Some(1)), [1; 3]);
        assert_eq!(first_picks(&two, &[0, 1], &nics, 1, Some(0)), [0; 3]);
        assert_eq!(first_picks(&two, &[0, 1], &nics, 0, Some(0)), [0; 3]);
        assert_eq!(first_picks(&two, &[0, 1], &nics, 0, None), [0; 3]);
        assert_eq!(first_picks(&two, &[0, 1], &nics, 1, None), [1; 3]);
        // A node no table row covers: unknown, the worker's node.
        assert_eq!(first_picks(&two, &[0, 1], &nics, 1, Some(200)), [1; 3]);
        // The tiers behind it: memory first, the worker's for unknown.
        let s = numa_set(two, &[0], &nics, Default::default());
        let w = s.worker(0);
        let tiers = |mem| [0, 1].map(|r| w.spray.tier(mem, r));
        assert_eq!(tiers(Some(1)), [1, 0]);
        assert_eq!(tiers(Some(0)), [0, 1]);
        assert_eq!(tiers(None), [0, 1]);
        // Observability keeps the worker's tiers (worker 0's).
        assert_eq!(
            s.stats(|_| true).iter().map(|r| r.tier).collect::<Vec<_>>(),
            [0, 1]
        );
    }

    /// Memory on node 2, as far from node 0 as from node 1, with a NIC on
    /// each of those: a tie the worker's node breaks, whichever rail comes
    /// first.
    #[test]
    fn the_worker_s_node_breaks_a_tie_between_rails_equally_far_from_the_memory() {
        let three = vec![vec![10, 21, 31], vec![21, 10, 31], vec![31, 31, 10]];
        for nics in [[0, 1], [1, 0]] {
            let on = |node| nics.iter().position(|&n| n == node).unwrap();
            for worker in [0, 1] {
                assert_eq!(
                    first_picks(&three, &[0, 1], &nics, worker, Some(2)),
                    [on(worker as u32); 3],
                    "NICs on {nics:?}, worker {worker}"
                );
            }
        }
        // With the memory known, the worker's node only breaks ties: a
        // worker on node 2 with memory on node 1 takes node 1's NIC.
        assert_eq!(first_picks(&three, &[2], &[0, 1], 0, Some(1)), [1; 3]);
    }

    #[test]
    fn placement_tiers() {
        let p = Placement {
            nodes: vec![Some(0), None],
            topology: None,
        };
        assert_eq!(p.tier(0, Some(0)), 0);
        assert_eq!(p.tier(0, Some(1)), 1);
        assert_eq!(p.tier(0, None), 0);
        assert_eq!(
            p.tier(1, Some(1)),
            0,
            "an unplaced worker is near everything"
        );
        assert_eq!(p.tier(7, Some(1)), 0);
    }
}
