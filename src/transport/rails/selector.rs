//! `DeviceSelector` and `Spray`: which rail carries the next slice (seed
//! 003, Slice Spraying).
//!
//! A rail is a (local device, remote device) pair: two NICs for RDMA, two
//! interfaces for TCP. The selector sees rail indices, each rail's NUMA
//! tier for the slice's local memory ([`Tiers`]), its theoretical
//! bandwidth, and an availability predicate (link, keys, `RailMonitor`),
//! so every transport sprays slices the same way. [`DeviceSelector`]
//! holds the configuration only and is shared; a [`Spray`] is one
//! worker's state toward one peer (loads, estimates, the current plan)
//! and only that worker touches it, so nothing here is atomic and nothing
//! on the hot path allocates.
//!
//! **Tiers** ([`Tiers`]): a rail's tier is the rank of the NUMA distance
//! from the node of the slice's local memory to the rail's device (a
//! buffer on node 1 read through a NIC on node 0 crosses the socket
//! interconnect); among rails of one tier the asking worker's distance to
//! the device breaks ties for round robin and HIGH slices (under smart
//! scheduling only exactly equal scores, so with the default jitter,
//! which draws among near-equal rails, practically never), and it is the
//! tier when the memory's node is unknown. "Best tier" below means lowest
//! (memory tier, worker tier).
//!
//! **Baseline** (`enable_smart_scheduling = false`): round robin within the
//! best tier that has a usable rail; lower tiers are used
//! only when it has none. No estimate is consulted, but loads and
//! estimates are still kept so statistics work.
//!
//! **Smart** (`enable_smart_scheduling = true`). A rail's score is the
//! predicted time of one more slice on it, `(inflight_bytes + slice_bytes)
//! / max(ewma, epsilon) × penalty(tier)` ([`score`]), plus a jitter drawn
//! uniformly from `[0, score_jitter_range)` when one rail is chosen. All
//! usable rails compete: the penalty makes remote tiers less attractive
//! until local rails are loaded, and a tier that empties simply falls
//! through to the others. A request is planned in windows of `W =
//! min(slices_left, max_slice_count)` slices; a plan is made when the token
//! differs from the current plan's or the plan is used up, and the rest of
//! the window is re-planned over the usable rails when the plan's next rail
//! is not usable now.
//! - `W < max_slice_count / 2` (integer division): the whole window goes to
//!   the single rail of minimum score, chosen anew per plan.
//! - Otherwise a multi-path plan ([`allocate`]): the slices are split so
//!   that every rail would finish together (water-filling on predicted
//!   time over capacities `ewma / penalty`, backlogs included; a rail whose
//!   backlog alone outlasts the others gets none), floors per rail, the
//!   remainder to the minimum-score rail. With no backlog this is exactly
//!   "proportional to ewma / penalty". The counts are handed out
//!   interleaved (smooth weighted round robin, deterministic), never as
//!   blocks: the engine posts a request's slices a few at a time as
//!   credits free, and a block split would leave rails idle.
//!   `max_slice_count = 1` makes every window a one-slice multi-path plan:
//!   the minimum-score rail, with the probes below still taken.
//! - Every [`PROBE_EVERY`]-th multi-path plan (the 100th, the 200th, ...) is
//!   a probe: round robin over every usable rail of every tier, so that no
//!   rail's estimate starves.
//!
//! **Late binding** ([`Spray::next`], smart only). A rail's `depth` is
//! how many of one worker's slices it serves at once (TCP: connections ×
//! requests in flight on each; RDMA: the endpoint's send queue). A
//! request's next slice is bound to a rail only while the rail has fewer
//! than `depth` of this worker's slices on it; past that it would only
//! queue, and a slice queued early on the wrong rail is the one that
//! finishes last (a 256 MiB READ planned whole on EWMA estimates finished
//! its slow rail up to 0.9 s after its fast one). So the plan's next rail
//! is the next planned one that has room (smooth weighted round robin over
//! the planned rails with room, each at most its share of the window);
//! when none has room but another usable rail does, the rest of the
//! window is planned again from the loads as they are (backlog included,
//! so near the end of a request a rail whose queue outlasts the others
//! gets nothing), and when the planned rails are full and no rail can
//! take the slice, [`NoRail::Full`]: the transport answers back-pressure
//! and the worker posts the slice after a completion. A single-rail
//! window waits for its best rail. Round robin binds at once (the
//! baseline as the seed gives it), and so do moves (`avoid`).
//!
//! A pick that names `avoid` is a slice moving off that rail: it goes to
//! the minimum-score usable rail other than `avoid` (smart) or to the next
//! rail of the round robin (baseline), and leaves the plan as it was.
//!
//! **Estimates.** A rail's EWMA starts at its theoretical bandwidth. A good
//! completion of `bytes` that took `elapsed` with `ahead` of this worker's
//! slices before it on the rail is observed as `bytes × (ahead + 1) /
//! elapsed` (queue-normalised, as in the `RailMonitor`: a slice that waited
//! behind others is not mistaken for a slow rail), and `ewma = α·ewma +
//! (1 − α)·observed` with α = `bandwidth_learning_rate` the weight of the
//! old value (α = 0: the new sample; α = 1: never learn), clamped to
//! `[ewma_min, ewma_max] × theoretical`.
//!
//! At most [`MAX_RAILS`] rails: those past it are ignored, so the scratch
//! of a plan lives in fixed arrays on the stack; a `Spray`'s own arrays
//! are sized once, in [`Spray::new`].
//!
//! **Reload.** A transport holds its selector in a [`LiveSelector`] that
//! `Engine::reload` replaces whole; every `Spray` method takes the selector
//! as it is at that call, so each knob applies from the next decision that
//! reads it (a pick, a plan, an estimate's update). What a `Spray` fixes at
//! [`Spray::new`] is only what the rail is: its theoretical bandwidth and
//! its depth (the bandwidth keys decide the former when a peer attaches,
//! so they need a restart).

use crate::config::Config;

/// The selector every rail of a transport reads, replaced whole by
/// `Engine::reload`: a worker keeps an `arc_swap::Cache` of it and finds a
/// new one with one relaxed load per pick (no lock, no count, no
/// allocation).
pub type LiveSelector = arc_swap::ArcSwap<DeviceSelector>;

/// Rails a [`Spray`] uses; rails past this are ignored.
pub const MAX_RAILS: usize = 64;
/// NUMA nodes a [`Tiers`] ranks rails for by memory: memory on a node at or
/// past it ranks as memory on an unknown node (the worker's tiers).
pub const MAX_MEM_NODES: usize = 64;
/// Every this-many-th multi-path plan is a round-robin probe.
pub const PROBE_EVERY: u64 = 100;

const BITS_PER_BYTE: f64 = 8.0;
const NS_PER_S: f64 = 1e9;

/// How rails are chosen: the two modes of seed 003.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectPolicy {
    /// Round robin within the best tier that has a usable rail.
    RoundRobin,
    /// Score by predicted time × NUMA penalty; windows split by EWMA.
    Smart,
}

/// The selector's knobs (`transports/rdma/*`, seed 003).
#[derive(Debug, Clone, PartialEq)]
pub struct SelectorConfig {
    /// `enable_smart_scheduling`.
    pub smart: bool,
    /// `numa_penalties`: tier → multiplier; a tier past the end uses the
    /// last entry (none: 1.0).
    pub numa_penalties: Vec<f64>,
    /// `bandwidth_learning_rate`: α, the weight of the OLD estimate.
    pub learning_rate: f64,
    /// `ewma_min_bandwidth_multiplier`: lower clamp, × theoretical.
    pub ewma_min_multiplier: f64,
    /// `ewma_max_bandwidth_multiplier`: upper clamp, × theoretical.
    pub ewma_max_multiplier: f64,
    /// `score_jitter_range`: seconds added to a score, uniform in
    /// `[0, jitter)`, when one rail is chosen.
    pub jitter: f64,
    /// `score_epsilon`: the least bandwidth a score divides by.
    pub epsilon: f64,
    /// `default_bandwidth_gbps`: a device's bandwidth when it reports none.
    pub default_gbps: f64,
    /// `min_bandwidth_gbps`: the least plausible reported bandwidth.
    pub min_gbps: f64,
    /// `max_bandwidth_gbps`: the most plausible reported bandwidth.
    pub max_gbps: f64,
    /// `max_slice_count`: the window size; multi-path from half of it.
    pub max_slice_count: u32,
    /// `enable_priority_filtering` (seed 001): HIGH slices bind at once to
    /// the least-loaded rail of their best NUMA tier, and bulk slices keep
    /// off the rail HIGH last used for `express_hold_ns`.
    pub priority_filtering: bool,
    /// `local_rotation_interval_us` in ns: how long the rail HIGH used
    /// stays HIGH's after its last HIGH slice.
    pub express_hold_ns: u64,
}

impl SelectorConfig {
    /// The knobs `c.transports.rdma` sets (validated by the config: the
    /// ranges, min ≤ max, default within [min, max]).
    pub(crate) fn from_config(c: &Config) -> SelectorConfig {
        let r = &c.transports.rdma;
        SelectorConfig {
            smart: r.enable_smart_scheduling,
            numa_penalties: r.numa_penalties.clone(),
            learning_rate: r.bandwidth_learning_rate,
            ewma_min_multiplier: r.ewma_min_bandwidth_multiplier,
            ewma_max_multiplier: r.ewma_max_bandwidth_multiplier,
            jitter: r.score_jitter_range,
            epsilon: r.score_epsilon,
            default_gbps: r.default_bandwidth_gbps,
            min_gbps: r.min_bandwidth_gbps,
            max_gbps: r.max_bandwidth_gbps,
            max_slice_count: r.max_slice_count,
            priority_filtering: r.enable_priority_filtering,
            express_hold_ns: crate::clock::nanos(r.local_rotation_interval_us),
        }
    }

    /// Theoretical bandwidth in BYTES per second of a device that reports
    /// `reported_gbps` (Gbit/s; `None` = unknown): `default_gbps` when
    /// unknown, not finite, or outside `[min_gbps, max_gbps]`.
    pub fn theoretical_bps(&self, reported_gbps: Option<f64>) -> f64 {
        let gbps = match reported_gbps {
            Some(g) if g.is_finite() && g >= self.min_gbps && g <= self.max_gbps => g,
            _ => self.default_gbps,
        };
        gbps * 1e9 / BITS_PER_BYTE
    }

    /// The score multiplier of NUMA tier `tier`. The config admits only
    /// finite positive entries; any other entry of a hand-built config
    /// counts as 1.0, so no score can be zeroed or negated.
    pub(crate) fn penalty(&self, tier: u8) -> f64 {
        let p = self
            .numa_penalties
            .get(usize::from(tier))
            .or(self.numa_penalties.last())
            .copied()
            .unwrap_or(1.0);
        if p.is_finite() && p > 0.0 { p } else { 1.0 }
    }
}

impl Default for SelectorConfig {
    fn default() -> SelectorConfig {
        SelectorConfig::from_config(&Config::default())
    }
}

/// What is fixed about a rail when it is attached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RailSpec {
    /// Bytes per second ([`SelectorConfig::theoretical_bps`]); a value that
    /// is not finite and positive counts as the default bandwidth.
    pub theoretical_bps: f64,
    /// Slices of one worker the rail serves at once: [`Spray::next`]
    /// binds no more to it (0: no bound).
    pub depth: u32,
}

/// Why [`Spray::next`] gave no rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRail {
    /// No rail is usable.
    Unusable,
    /// The rails the slice should go to are at their depth: post it after
    /// a completion.
    Full,
}

/// One worker's view of one rail (plain fields: only its worker writes it).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RailLoad {
    /// Bytes of this worker's slices posted on the rail and not yet left.
    pub inflight_bytes: u64,
    /// This worker's slices posted on the rail and not yet left.
    pub inflight_slices: u32,
    /// Bandwidth estimate, bytes per second.
    pub ewma_bps: f64,
    /// Completions folded into the estimate since it was last reset.
    pub samples: u64,
}

/// Picks rails for slices: the configuration every [`Spray`] reads.
#[derive(Debug, Clone)]
pub struct DeviceSelector {
    cfg: SelectorConfig,
}

impl DeviceSelector {
    /// A selector with `cfg`.
    pub fn new(cfg: SelectorConfig) -> DeviceSelector {
        DeviceSelector { cfg }
    }

    /// Its configuration.
    pub fn config(&self) -> &SelectorConfig {
        &self.cfg
    }

    /// Whether it scores rails (seed 003's smart mode).
    pub(crate) fn is_smart(&self) -> bool {
        self.cfg.smart
    }

    /// Its mode.
    #[cfg(test)]
    pub(crate) fn policy(&self) -> SelectPolicy {
        if self.cfg.smart {
            SelectPolicy::Smart
        } else {
            SelectPolicy::RoundRobin
        }
    }

    /// The window of a request with `slices_left` slices to post: at least
    /// one slice, at most `max_slice_count`.
    fn window(&self, slices_left: u64) -> u64 {
        slices_left.clamp(1, u64::from(self.cfg.max_slice_count.max(1)))
    }

    /// Whether a window of `w` slices is split over rails.
    fn multi_path(&self, w: u64) -> bool {
        w >= u64::from(self.cfg.max_slice_count / 2)
    }

    /// The bandwidth a score divides by: never below epsilon, never zero.
    fn divisor(&self, ewma: f64) -> f64 {
        ewma.max(self.cfg.epsilon).max(f64::MIN_POSITIVE)
    }
}

impl Default for DeviceSelector {
    fn default() -> DeviceSelector {
        DeviceSelector::new(SelectorConfig::default())
    }
}

/// Predicted seconds until one more slice of `slice_bytes` would finish
/// on a rail with `load` in NUMA tier `tier`: `(inflight + slice) /
/// max(ewma, epsilon) × penalty(tier)`, without jitter.
pub fn score(sel: &DeviceSelector, load: &RailLoad, tier: u8, slice_bytes: u64) -> f64 {
    (load.inflight_bytes as f64 + slice_bytes as f64) / sel.divisor(load.ewma_bps)
        * sel.cfg.penalty(tier)
}

/// Splits `n` slices of `slice_bytes` over the rails with `usable[r]` into
/// `counts[r]` (every entry of `counts` is written), so that all would
/// finish together: with capacity `e_r = max(ewma, epsilon) / penalty` and
/// backlog `b_r = inflight_bytes`, `T = (n·s + Σ b_r) / Σ e_r` over the
/// active rails and `n_r = (T·e_r − b_r) / s`; rails with `n_r < 0` leave
/// the active set and `T` is recomputed. Each rail gets `floor(n_r)`, the
/// remainder goes to the usable rail of minimum [`score`] (the first of
/// equals). Returns `Σ counts`: `n`, or 0 when no rail is usable. Rails
/// past the shortest slice or [`MAX_RAILS`] are left out; a slice size of
/// 0 counts as one byte. Pure, allocation-free, O(rails²) at worst.
pub fn allocate(
    sel: &DeviceSelector,
    loads: &[RailLoad],
    tiers: &[u8],
    usable: &[bool],
    n: u64,
    slice_bytes: u64,
    counts: &mut [u64],
) -> u64 {
    counts.fill(0);
    let rails = loads
        .len()
        .min(tiers.len())
        .min(usable.len())
        .min(counts.len())
        .min(MAX_RAILS);
    let (loads, tiers) = (&loads[..rails], &tiers[..rails]);
    let flat = [0u8; MAX_RAILS];
    let near = &flat[..rails];
    let Some(best) = min_score(sel, loads, tiers, near, |r| usable[r], slice_bytes, || 0.0) else {
        return 0;
    };
    let s = slice_bytes.max(1) as f64;
    let mut active = [false; MAX_RAILS];
    let mut cap = [0.0f64; MAX_RAILS];
    for r in (0..rails).filter(|&r| usable[r]) {
        active[r] = true;
        cap[r] = sel.divisor(loads[r].ewma_bps) / sel.cfg.penalty(tiers[r]);
    }
    let mut share = [0.0f64; MAX_RAILS];
    loop {
        let (mut work, mut total_cap) = (n as f64 * s, 0.0);
        for r in (0..rails).filter(|&r| active[r]) {
            work += loads[r].inflight_bytes as f64;
            total_cap += cap[r];
        }
        if total_cap <= 0.0 {
            // Every rail left the set (rounding only): all to the best.
            break;
        }
        let t = work / total_cap;
        let mut dropped = false;
        for r in 0..rails {
            if !active[r] {
                continue;
            }
            share[r] = (t * cap[r] - loads[r].inflight_bytes as f64) / s;
            if share[r] < 0.0 {
                // Removing a rail only lowers T, so it never comes back.
                active[r] = false;
                share[r] = 0.0;
                dropped = true;
            }
        }
        if !dropped {
            break;
        }
    }
    let mut given = 0u64;
    for r in (0..rails).filter(|&r| active[r]) {
        // `as` saturates (NaN → 0); the cap keeps rounding from
        // overshooting n.
        let c = (share[r].floor() as u64).min(n - given);
        counts[r] = c;
        given += c;
    }
    counts[best] += n - given;
    n
}

/// The rail with `usable(r)` of minimum [`score`] plus `jitter()`; of
/// equals in the same tier, the lowest `near` (the worker's tier), else
/// the first; `None` if none is usable.
fn min_score(
    sel: &DeviceSelector,
    loads: &[RailLoad],
    tiers: &[u8],
    near: &[u8],
    usable: impl Fn(usize) -> bool,
    slice_bytes: u64,
    mut jitter: impl FnMut() -> f64,
) -> Option<usize> {
    let mut best: Option<(f64, (u8, u8), usize)> = None;
    for (r, ((load, &tier), &near)) in loads.iter().zip(tiers).zip(near).enumerate() {
        if !usable(r) {
            continue;
        }
        let sc = score(sel, load, tier, slice_bytes) + jitter();
        let better = |(b, (bt, bn), _)| sc < b || (sc == b && tier == bt && near < bn);
        if best.is_none_or(better) {
            best = Some((sc, (tier, near), r));
        }
    }
    best.map(|(_, _, r)| r)
}

/// May rail `r` take another slice: not `gated`, no depth, or fewer of
/// the worker's slices on it than its depth.
#[inline]
fn has_room(fixed: &[Fixed], loads: &[RailLoad], gated: bool, r: usize) -> bool {
    let depth = fixed[r].depth;
    !gated || depth == 0 || loads[r].inflight_slices < depth
}

/// Uniform in `[0, range)` from the xorshift64* state `rng` (0 without
/// drawing when the range is not positive).
fn jitter(rng: &mut u64, range: f64) -> f64 {
    if range <= 0.0 {
        return 0.0;
    }
    let mut x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    let unit = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
    unit * range
}

/// What a [`Spray`] fixes about a rail at `new`.
#[derive(Debug, Clone, Copy)]
struct Fixed {
    /// Bytes per second.
    theoretical: f64,
    /// [`RailSpec::depth`].
    depth: u32,
}

impl Fixed {
    /// `estimate` within the clamps `[ewma_min, ewma_max] × theoretical`
    /// as `sel` has them now (max/min rather than `f64::clamp`, which
    /// panics on NaN or on the inverted bounds a hand-built config could
    /// hold).
    fn clamp(&self, sel: &DeviceSelector, estimate: f64) -> f64 {
        let c = &sel.cfg;
        estimate
            .max(self.theoretical * c.ewma_min_multiplier)
            .min(self.theoretical * c.ewma_max_multiplier)
    }
}

/// The slices of one window and the order they go out in.
#[derive(Debug)]
struct Plan {
    /// The request it belongs to.
    token: u64,
    /// Slices still to hand out; 0 = no plan.
    left: u64,
    /// Slices per rail in the window (smooth weighted round robin weights).
    weight: Box<[u64]>,
    /// Of `weight`, those not handed out yet.
    quota: Box<[u64]>,
    /// Σ weight.
    total: i64,
    /// Smooth weighted round robin state.
    current: Box<[i64]>,
}

impl Plan {
    /// Hand out `weight` (already filled, Σ = `w` ≥ 1) for `token`.
    fn start(&mut self, token: u64, w: u64) {
        self.token = token;
        self.left = w;
        self.total = w as i64;
        self.current.fill(0);
        self.quota.copy_from_slice(&self.weight);
    }

    /// The rail the next slice goes to among those `fits` admits: of the
    /// rails with quota left, the largest `current + weight`, the first
    /// of equals. `None`: no such rail.
    fn peek(&self, fits: impl Fn(usize) -> bool) -> Option<usize> {
        let mut best: Option<(i64, usize)> = None;
        for (r, ((&w, &q), &c)) in self
            .weight
            .iter()
            .zip(self.quota.iter())
            .zip(self.current.iter())
            .enumerate()
        {
            let key = c + w as i64;
            if q > 0 && best.is_none_or(|(b, _)| key > b) && fits(r) {
                best = Some((key, r));
            }
        }
        best.map(|(_, r)| r)
    }

    /// Hand out one slice on `rail` (one `peek` named). Taking always the
    /// rail `peek(|_| true)` names, each rail comes up exactly `weight`
    /// times over a window, spread evenly; skipping a full rail takes
    /// another's share early, never more than its quota.
    fn take(&mut self, rail: usize) {
        for (&w, c) in self.weight.iter().zip(self.current.iter_mut()) {
            *c += w as i64;
        }
        self.current[rail] -= self.total;
        self.quota[rail] -= 1;
        self.left -= 1;
    }
}

/// Each rail's NUMA tier for one worker, by the node of a slice's local
/// memory: row 0 holds the worker's own tiers (distance from the worker's
/// node to each rail's device), the tie-break and the stand-in for memory
/// on an unknown node; row `1 + n` holds the tiers for memory on node `n`
/// (`n < nodes`, at most [`MAX_MEM_NODES`]). Built once per worker and
/// peer; a lookup is an index, so a pick per slice stays free of
/// allocation, locks and syscalls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    rails: usize,
    /// `(1 + nodes) × rails`, row by row.
    table: Box<[u8]>,
    /// Per row, the least [`rank`](Tiers::rank) of any rail: round robin
    /// stops searching there.
    tops: Box<[u16]>,
}

impl Tiers {
    /// Rails at the worker's tiers `worker` whatever the memory's node
    /// (none known).
    pub fn of_worker(worker: &[u8]) -> Tiers {
        Tiers::new(worker, 0, |_, _| 0)
    }

    /// Rails at the worker's tiers `worker` (at most [`MAX_RAILS`] used),
    /// and for memory on node `n < nodes` (at most [`MAX_MEM_NODES`]) at
    /// `by_node(n, rail)`.
    pub fn new(worker: &[u8], nodes: usize, by_node: impl Fn(u32, usize) -> u8) -> Tiers {
        let rails = worker.len().min(MAX_RAILS);
        let nodes = nodes.min(MAX_MEM_NODES);
        let mut table = Vec::with_capacity((1 + nodes) * rails);
        table.extend_from_slice(&worker[..rails]);
        for n in 0..nodes as u32 {
            table.extend((0..rails).map(|r| by_node(n, r)));
        }
        let mut t = Tiers {
            rails,
            table: table.into(),
            tops: Box::default(),
        };
        t.tops = (0..=nodes)
            .map(|row| (0..rails).map(|r| t.rank(row, r)).min().unwrap_or(0))
            .collect();
        t
    }

    /// The first `n` rails only.
    fn truncated(&self, n: usize) -> Tiers {
        if n >= self.rails {
            return self.clone();
        }
        let rows = self.tops.len();
        Tiers::new(&self.table[..n], rows - 1, |node, r| {
            self.table[(1 + node as usize) * self.rails + r]
        })
    }

    /// Rails ranked.
    pub fn rails(&self) -> usize {
        self.rails
    }

    /// The row for memory on `node` (`None`, or a node past the table:
    /// unknown, the worker's row).
    #[inline]
    fn row(&self, node: Option<u32>) -> usize {
        match node {
            Some(n) if (n as usize) < self.tops.len() - 1 => 1 + n as usize,
            _ => 0,
        }
    }

    /// Row `row`'s tiers, rail by rail.
    #[inline]
    fn tiers(&self, row: usize) -> &[u8] {
        &self.table[row * self.rails..(row + 1) * self.rails]
    }

    /// Rail `rail`'s tier for memory on `node` (0 past the rails).
    pub fn tier(&self, node: Option<u32>, rail: usize) -> u8 {
        self.tiers(self.row(node)).get(rail).copied().unwrap_or(0)
    }

    /// Rail `r`'s order in row `row`: its tier, then the worker's tier.
    #[inline]
    fn rank(&self, row: usize, r: usize) -> u16 {
        u16::from(self.table[row * self.rails + r]) << 8 | u16::from(self.table[r])
    }
}

/// One worker's selection state toward one peer: its rails' loads, tiers
/// and estimates, the current plan, the multi-path plan counter (probe
/// cadence), a round-robin cursor and a jitter RNG (xorshift64*).
/// Allocates only in [`Spray::new`].
#[derive(Debug)]
pub struct Spray {
    fixed: Box<[Fixed]>,
    tiers: Tiers,
    loads: Box<[RailLoad]>,
    plan: Plan,
    plans: u64,
    cursor: usize,
    rng: u64,
}

impl Spray {
    /// Rails `specs` with, for this worker, NUMA tiers `tiers` (0 =
    /// local). Only the first `min(specs.len(), tiers.rails(), MAX_RAILS)`
    /// rails are used. Each estimate starts at the rail's theoretical
    /// bandwidth, clamped. `seed` seeds the jitter.
    pub fn new(sel: &DeviceSelector, specs: &[RailSpec], tiers: &Tiers, seed: u64) -> Spray {
        let n = specs.len().min(tiers.rails()).min(MAX_RAILS);
        let fixed: Box<[Fixed]> = specs[..n]
            .iter()
            .map(|s| {
                let theoretical = match s.theoretical_bps {
                    t if t.is_finite() && t > 0.0 => t,
                    _ => sel.cfg.theoretical_bps(None),
                };
                Fixed {
                    theoretical,
                    depth: s.depth,
                }
            })
            .collect();
        let loads = fixed
            .iter()
            .map(|f| RailLoad {
                ewma_bps: f.clamp(sel, f.theoretical),
                ..RailLoad::default()
            })
            .collect();
        Spray {
            fixed,
            tiers: tiers.truncated(n),
            loads,
            plan: Plan {
                token: 0,
                left: 0,
                weight: vec![0; n].into(),
                quota: vec![0; n].into(),
                total: 0,
                current: vec![0; n].into(),
            },
            plans: 0,
            cursor: 0,
            // xorshift's state must not be zero.
            rng: (seed ^ 0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// Rails in use.
    pub(crate) fn rails(&self) -> usize {
        self.loads.len()
    }

    /// Rail `rail`'s NUMA tier for this worker and memory on `node` (0
    /// past the rails in use).
    #[cfg(test)]
    pub(crate) fn tier(&self, node: Option<u32>, rail: usize) -> u8 {
        self.tiers.tier(node, rail)
    }

    /// The rail for the next slice of request `token`, whose local memory
    /// is on NUMA node `mem` (`None`: unknown), of which `slices_left`
    /// slices (this one included) are still to be posted, each about
    /// `slice_bytes`. `usable(r)`: may rail `r` take a slice now (link,
    /// keys, `RailMonitor`). `avoid`: never this rail (the one a slice is
    /// moving off; such a pick leaves the plan alone). `None` if no rail is
    /// usable. Never allocates.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pick(
        &mut self,
        sel: &DeviceSelector,
        mem: Option<u32>,
        token: u64,
        slices_left: u64,
        slice_bytes: u64,
        avoid: Option<usize>,
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let row = self.tiers.row(mem);
        let ok = |r: usize| Some(r) != avoid && usable(r);
        if !sel.is_smart() {
            return self.round_robin(row, ok);
        }
        if avoid.is_some() {
            return self.best(sel, row, ok, slice_bytes);
        }
        self.planned(sel, row, token, slices_left, slice_bytes, ok, false)
            .ok()
    }

    /// Like [`pick`](Self::pick) with no rail to avoid, for a request's
    /// next slice, bound late under smart scheduling: a rail with
    /// [`RailSpec::depth`] of this worker's slices on it takes no more
    /// (see the module notes). `Err(Full)`: try again after a completion.
    /// Round robin binds at once. Never allocates.
    pub fn next(
        &mut self,
        sel: &DeviceSelector,
        mem: Option<u32>,
        token: u64,
        slices_left: u64,
        slice_bytes: u64,
        usable: impl Fn(usize) -> bool,
    ) -> Result<usize, NoRail> {
        let row = self.tiers.row(mem);
        if !sel.is_smart() {
            return self.round_robin(row, usable).ok_or(NoRail::Unusable);
        }
        self.planned(sel, row, token, slices_left, slice_bytes, usable, true)
    }

    /// Smart: the plan's next rail among those `ok` admits and that have
    /// room (`gated`: below their depth; else every rail has), planning a
    /// window when there is no plan for `token`, its planned rail is no
    /// longer usable (both count toward the probe cadence), or its planned
    /// rails are full while another usable rail has room (the rest of the
    /// window again, not counted). `row`: the tiers of the slice's memory.
    #[allow(clippy::too_many_arguments)]
    fn planned(
        &mut self,
        sel: &DeviceSelector,
        row: usize,
        token: u64,
        slices_left: u64,
        slice_bytes: u64,
        ok: impl Fn(usize) -> bool,
        gated: bool,
    ) -> Result<usize, NoRail> {
        let window = sel.window(slices_left);
        if self.plan.left == 0 || self.plan.token != token {
            return self.replan(sel, row, token, window, slice_bytes, ok, gated, true);
        }
        let w = self.plan.left.min(window);
        let Some(next) = self.plan.peek(|_| true) else {
            return self.replan(sel, row, token, w, slice_bytes, ok, gated, true);
        };
        if !ok(next) {
            return self.replan(sel, row, token, w, slice_bytes, ok, gated, true);
        }
        let room = |r: usize| has_room(&self.fixed, &self.loads, gated, r);
        if room(next) {
            self.plan.take(next);
            return Ok(next);
        }
        if let Some(r) = self.plan.peek(|r| room(r) && ok(r)) {
            self.plan.take(r);
            return Ok(r);
        }
        if (0..self.rails()).any(|r| room(r) && ok(r)) {
            return self.replan(sel, row, token, w, slice_bytes, ok, gated, false);
        }
        Err(NoRail::Full)
    }

    /// A slice of `bytes` was posted on `rail`; returns how many of this
    /// worker's slices were on the rail ahead of it (0 past the rails).
    pub fn posted(&mut self, rail: usize, bytes: u64) -> u32 {
        let Some(l) = self.loads.get_mut(rail) else {
            return 0;
        };
        let ahead = l.inflight_slices;
        l.inflight_slices = ahead.saturating_add(1);
        l.inflight_bytes = l.inflight_bytes.saturating_add(bytes);
        ahead
    }

    /// A slice of `bytes` left `rail` (completed, failed, moved);
    /// saturating.
    pub fn left(&mut self, rail: usize, bytes: u64) {
        if let Some(l) = self.loads.get_mut(rail) {
            l.inflight_slices = l.inflight_slices.saturating_sub(1);
            l.inflight_bytes = l.inflight_bytes.saturating_sub(bytes);
        }
    }

    /// A good completion: `bytes` in `elapsed_ns` with `ahead` slices ahead
    /// of it when posted. `observed = bytes·(ahead+1)/elapsed`; `ewma =
    /// α·ewma + (1−α)·observed`, clamped to `[ewma_min, ewma_max] ×
    /// theoretical` (α and the clamps as `sel` has them now). `bytes` or
    /// `elapsed_ns` 0: ignored.
    pub fn observed(
        &mut self,
        sel: &DeviceSelector,
        rail: usize,
        bytes: u64,
        elapsed_ns: u64,
        ahead: u32,
    ) {
        if bytes == 0 || elapsed_ns == 0 {
            return;
        }
        let Some(l) = self.loads.get_mut(rail) else {
            return;
        };
        // At most 2^64 × 2^32 × 1e9: finite in f64, so α = 1 keeps the
        // old value exactly (0 × observed stays 0).
        let observed = bytes as f64 * (f64::from(ahead) + 1.0) * NS_PER_S / elapsed_ns as f64;
        let a = sel.cfg.learning_rate;
        l.ewma_bps = self.fixed[rail].clamp(sel, a * l.ewma_bps + (1.0 - a) * observed);
        l.samples = l.samples.saturating_add(1);
    }

    /// Forget `rail`'s estimate (its link came back): back to theoretical.
    pub(crate) fn reset_estimate(&mut self, sel: &DeviceSelector, rail: usize) {
        if let (Some(l), Some(f)) = (self.loads.get_mut(rail), self.fixed.get(rail)) {
            l.ewma_bps = f.clamp(sel, f.theoretical);
            l.samples = 0;
        }
    }

    /// Rail `rail`'s load (the default past the rails in use).
    pub(crate) fn load(&self, rail: usize) -> RailLoad {
        self.loads.get(rail).copied().unwrap_or_default()
    }

    /// Multi-path plans made so far (probes included).
    #[cfg(test)]
    pub(crate) fn plans(&self) -> u64 {
        self.plans
    }

    /// Baseline: the next rail from the cursor among the usable ones of
    /// the best tier (row `row`) that has any.
    fn round_robin(&mut self, row: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
        let n = self.rails();
        let top = self.tiers.tops[row];
        let mut found: Option<(u16, usize)> = None;
        for step in 0..n {
            let r = (self.cursor + step) % n;
            let t = self.tiers.rank(row, r);
            if found.is_some_and(|(best, _)| t >= best) || !ok(r) {
                continue;
            }
            found = Some((t, r));
            if t == top {
                break;
            }
        }
        let (_, r) = found?;
        self.cursor = (r + 1) % n;
        Some(r)
    }

    /// `ok` of every rail, asked once each; `None` if none is.
    fn usable_mask(&self, ok: impl Fn(usize) -> bool) -> Option<[bool; MAX_RAILS]> {
        let mut mask = [false; MAX_RAILS];
        let mut any = false;
        for (r, m) in mask.iter_mut().enumerate().take(self.rails()) {
            *m = ok(r);
            any |= *m;
        }
        any.then_some(mask)
    }

    /// The rail `ok` admits of minimum score plus jitter, with row
    /// `row`'s tiers.
    fn best(
        &mut self,
        sel: &DeviceSelector,
        row: usize,
        ok: impl Fn(usize) -> bool,
        slice_bytes: u64,
    ) -> Option<usize> {
        let rng = &mut self.rng;
        let (tiers, near) = (self.tiers.tiers(row), self.tiers.tiers(0));
        min_score(sel, &self.loads, tiers, near, ok, slice_bytes, || {
            jitter(rng, sel.cfg.jitter)
        })
    }

    /// The best-scoring rail `ok` admits within the best NUMA tier for
    /// memory on `mem` that has one (a HIGH slice under priority
    /// filtering: no plan, no depth bound). `None` if no rail is admitted.
    pub(crate) fn best_of_top_tier(
        &mut self,
        sel: &DeviceSelector,
        mem: Option<u32>,
        ok: impl Fn(usize) -> bool,
        slice_bytes: u64,
    ) -> Option<usize> {
        let row = self.tiers.row(mem);
        let t = &self.tiers;
        let top = (0..self.rails())
            .filter(|&r| ok(r))
            .map(|r| t.rank(row, r))
            .min()?;
        let rng = &mut self.rng;
        min_score(
            sel,
            &self.loads,
            t.tiers(row),
            t.tiers(0),
            |r| ok(r) && t.rank(row, r) == top,
            slice_bytes,
            || jitter(rng, sel.cfg.jitter),
        )
    }

    /// A new plan of `w` slices for `token` over the rails `ok` admits
    /// (whether or not they have room: the loads decide), and its first
    /// rail with room (`gated`, as in `planned`); `Err(Full)` when every planned rail is full.
    /// `counted`: a multi-path plan counts toward the probe cadence. `row`:
    /// the tiers of the slice's memory.
    #[allow(clippy::too_many_arguments)]
    fn replan(
        &mut self,
        sel: &DeviceSelector,
        row: usize,
        token: u64,
        w: u64,
        slice_bytes: u64,
        ok: impl Fn(usize) -> bool,
        gated: bool,
        counted: bool,
    ) -> Result<usize, NoRail> {
        self.plan.left = 0;
        if !sel.multi_path(w) {
            let best = self
                .best(sel, row, ok, slice_bytes)
                .ok_or(NoRail::Unusable)?;
            self.plan.weight.fill(0);
            self.plan.weight[best] = w;
        } else {
            let mask = self.usable_mask(ok).ok_or(NoRail::Unusable)?;
            if counted {
                self.plans += 1;
            }
            if counted && self.plans % PROBE_EVERY == 0 {
                self.probe(&mask, w);
            } else {
                let n = self.rails();
                allocate(
                    sel,
                    &self.loads,
                    self.tiers.tiers(row),
                    &mask[..n],
                    w,
                    slice_bytes,
                    &mut self.plan.weight,
                );
            }
        }
        self.plan.start(token, w);
        let first = self
            .plan
            .peek(|r| has_room(&self.fixed, &self.loads, gated, r))
            .ok_or(NoRail::Full)?;
        self.plan.take(first);
        Ok(first)
    }

    /// A probe plan: `w` slices round robin over every usable rail; the
    /// odd ones go to the rails from the cursor on, which moves past them.
    fn probe(&mut self, mask: &[bool; MAX_RAILS], w: u64) {
        let n = self.rails();
        let k = mask[..n].iter().filter(|&&m| m).count() as u64;
        let (each, mut odd) = (w / k, w % k);
        let start = self.cursor;
        for step in 0..n {
            let r = (start + step) % n;
            self.plan.weight[r] = 0;
            if !mask[r] {
                continue;
            }
            self.plan.weight[r] = each;
            if odd > 0 {
                self.plan.weight[r] += 1;
                odd -= 1;
                self.cursor = (r + 1) % n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 KiB slice.
    const S: u64 = 65_536;

    /// The default knobs without jitter, changed by `f`.
    fn sel_with(f: impl FnOnce(&mut SelectorConfig)) -> DeviceSelector {
        let mut c = SelectorConfig {
            jitter: 0.0,
            ..SelectorConfig::default()
        };
        f(&mut c);
        DeviceSelector::new(c)
    }

    fn spray(sel: &DeviceSelector, bps: &[f64], tiers: &[u8]) -> Spray {
        let specs: Vec<RailSpec> = bps
            .iter()
            .map(|&b| RailSpec {
                theoretical_bps: b,
                depth: 0,
            })
            .collect();
        Spray::new(sel, &specs, &Tiers::of_worker(tiers), 7)
    }

    fn loads(ewma: &[f64], inflight_slices: &[u64]) -> Vec<RailLoad> {
        ewma.iter()
            .zip(inflight_slices)
            .map(|(&e, &i)| RailLoad {
                inflight_bytes: i * S,
                inflight_slices: i as u32,
                ewma_bps: e,
                samples: 0,
            })
            .collect()
    }

    /// Picks every slice of one `n`-slice request `token` over the rails
    /// `usable` admits; each is posted (and stays in flight) when `post`.
    fn request(
        sp: &mut Spray,
        sel: &DeviceSelector,
        token: u64,
        n: u64,
        post: bool,
        usable: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        (0..n)
            .map(|i| {
                let r = sp.pick(sel, None, token, n - i, S, None, &usable).unwrap();
                if post {
                    sp.posted(r, S);
                }
                r
            })
            .collect()
    }

    fn tally(picks: &[usize], rails: usize) -> Vec<usize> {
        let mut c = vec![0; rails];
        for &r in picks {
            c[r] += 1;
        }
        c
    }

    #[test]
    fn from_config_reads_the_seed_keys() {
        let c = Config::from_json_str(
            r#"{"transports": {"rdma": {"enable_smart_scheduling": false,
                "numa_penalties": [1.0, 2.0], "bandwidth_learning_rate": 0.5,
                "ewma_min_bandwidth_multiplier": 0.2, "ewma_max_bandwidth_multiplier": 4.0,
                "score_jitter_range": 0.001, "score_epsilon": 0.01,
                "default_bandwidth_gbps": 100.0, "min_bandwidth_gbps": 20.0,
                "max_bandwidth_gbps": 200.0, "max_slice_count": 16,
                "enable_priority_filtering": false, "local_rotation_interval_us": 50}}}"#,
            "t.json",
        )
        .unwrap();
        let s = SelectorConfig::from_config(&c);
        assert_eq!(
            s,
            SelectorConfig {
                smart: false,
                numa_penalties: vec![1.0, 2.0],
                learning_rate: 0.5,
                ewma_min_multiplier: 0.2,
                ewma_max_multiplier: 4.0,
                jitter: 0.001,
                epsilon: 0.01,
                default_gbps: 100.0,
                min_gbps: 20.0,
                max_gbps: 200.0,
                max_slice_count: 16,
                priority_filtering: false,
                express_hold_ns: 50_000,
            }
        );
        let d = DeviceSelector::default();
        assert!(d.is_smart());
        assert_eq!(d.policy(), SelectPolicy::Smart);
        assert_eq!(d.config().numa_penalties, [1.0, 5.0, 10.0]);
        assert_eq!(DeviceSelector::new(s).policy(), SelectPolicy::RoundRobin);
    }

    #[test]
    fn theoretical_bandwidth_rule() {
        let c = SelectorConfig::default(); // 400 Gb/s default, [10, 800]
        assert_eq!(c.theoretical_bps(None), 50e9);
        assert_eq!(c.theoretical_bps(Some(100.0)), 12.5e9);
        assert_eq!(c.theoretical_bps(Some(10.0)), 1.25e9);
        assert_eq!(c.theoretical_bps(Some(800.0)), 100e9);
        for bad in [9.99, 800.5, 0.0, -100.0, f64::NAN, f64::INFINITY] {
            assert_eq!(c.theoretical_bps(Some(bad)), 50e9, "{bad}");
        }
    }

    #[test]
    fn penalties_per_tier() {
        let mut c = SelectorConfig::default();
        assert_eq!(
            [0, 1, 2, 3, 255].map(|t| c.penalty(t)),
            [1.0, 5.0, 10.0, 10.0, 10.0]
        );
        c.numa_penalties.clear();
        assert_eq!(c.penalty(0), 1.0);
        assert_eq!(c.penalty(3), 1.0);
        c.numa_penalties = vec![0.0, f64::NAN, -2.0, 3.0];
        assert_eq!([0, 1, 2, 3].map(|t| c.penalty(t)), [1.0, 1.0, 1.0, 3.0]);
    }

    #[test]
    fn local_rails_win_until_they_are_loaded() {
        // Same bandwidth; the remote rail's penalty is 4.5, so an idle
        // remote rail scores like a local one holding 3.5 slices: the
        // local rail takes 4 single-slice requests, the 5th crosses over,
        // and the remote rail, once it holds one, scores like a local one
        // holding 8: past that, remote again.
        let sel = sel_with(|c| c.numa_penalties = vec![1.0, 4.5]);
        let mut sp = spray(&sel, &[50e9, 50e9], &[0, 1]);
        let picks: Vec<usize> = (0..9)
            .map(|t| {
                let r = sp.pick(&sel, None, t, 1, S, None, |_| true).unwrap();
                sp.posted(r, S);
                r
            })
            .collect();
        assert_eq!(picks, [0, 0, 0, 0, 1, 0, 0, 0, 0]);
        sp.posted(0, S);
        let (local, remote) = (
            score(&sel, &sp.load(0), 0, S),
            score(&sel, &sp.load(1), 1, S),
        );
        assert!(local > remote, "{local} {remote}");
        assert_eq!(sp.pick(&sel, None, 9, 1, S, None, |_| true), Some(1));
        assert_eq!(sp.plans(), 0);
    }

    #[test]
    fn equal_penalties_mean_no_numa_preference() {
        let run = |sel: &DeviceSelector| {
            let mut sp = spray(sel, &[50e9, 50e9], &[0, 1]);
            let picks: Vec<usize> = (0..8)
                .map(|t| {
                    let r = sp.pick(sel, None, t, 1, S, None, |_| true).unwrap();
                    sp.posted(r, S);
                    r
                })
                .collect();
            tally(&picks, 2)
        };
        assert_eq!(run(&sel_with(|c| c.numa_penalties = vec![1.0; 3])), [4, 4]);
        assert_eq!(
            run(&sel_with(|c| c.numa_penalties = vec![1.0, 4.5])),
            [7, 1]
        );
    }

    #[test]
    fn split_is_proportional_to_bandwidth_over_penalty() {
        let sel = sel_with(|_| {});
        let mut c = [0; 2];
        let l = loads(&[1000.0, 200.0], &[0, 0]);
        assert_eq!(
            allocate(&sel, &l, &[0, 0], &[true, true], 60, S, &mut c),
            60
        );
        assert_eq!(c, [50, 10]);
        // Tier 1 (penalty 5): capacities 1000 : 40 → 57.7 / 2.3, the
        // remainder to the best.
        assert_eq!(
            allocate(&sel, &l, &[0, 1], &[true, true], 60, S, &mut c),
            60
        );
        assert_eq!(c, [58, 2]);
    }

    #[test]
    fn remainder_goes_to_the_best_rail() {
        let sel = sel_with(|_| {});
        let mut c = [0; 3];
        // 3.2 / 3.5 / 3.2: floors 3 each, one left → rail 1 (fastest).
        let l = loads(&[1000.0, 1100.0, 1000.0], &[0, 0, 0]);
        allocate(&sel, &l, &[0; 3], &[true; 3], 10, S, &mut c);
        assert_eq!(c, [3, 4, 3]);
        // Rail 0 is faster but loaded: 3.5 / 2.75 / 3.75, floors 3 / 2 /
        // 3, and both left over go to rail 2, the idle one (best score).
        let l = loads(&[1200.0, 1000.0, 1000.0], &[1, 1, 0]);
        allocate(&sel, &l, &[0; 3], &[true; 3], 10, S, &mut c);
        assert_eq!(c, [3, 2, 5]);
    }

    #[test]
    fn backlogged_rails_get_fewer() {
        let sel = sel_with(|_| {});
        let mut c = [0; 3];
        // Equal rails, rail 1 holds 20 slices: both finish together when
        // rail 0 gets 40 and rail 1 another 20.
        let l = loads(&[1000.0, 1000.0], &[0, 20]);
        allocate(&sel, &l, &[0, 0], &[true, true], 60, S, &mut c[..2]);
        assert_eq!(c[..2], [40, 20]);
        // A backlog that alone outlasts the window: that rail gets none.
        let l = loads(&[1000.0, 1000.0], &[0, 100]);
        allocate(&sel, &l, &[0, 0], &[true, true], 60, S, &mut c[..2]);
        assert_eq!(c[..2], [60, 0]);
        // The set shrinks and T is recomputed over the rest.
        let l = loads(&[1000.0, 1000.0, 1000.0], &[0, 0, 200]);
        allocate(&sel, &l, &[0; 3], &[true; 3], 60, S, &mut c);
        assert_eq!(c, [30, 30, 0]);
    }

    #[test]
    fn allocate_with_no_usable_rail_gives_nothing() {
        let sel = sel_with(|_| {});
        let mut c = [9; 2];
        let l = loads(&[1000.0, 1000.0], &[0, 0]);
        assert_eq!(
            allocate(&sel, &l, &[0, 0], &[false, false], 60, S, &mut c),
            0
        );
        assert_eq!(c, [0, 0]);
        // Unusable rails get none however fast.
        let l = loads(&[1e9, 1.0], &[0, 0]);
        assert_eq!(allocate(&sel, &l, &[0, 0], &[false, true], 7, S, &mut c), 7);
        assert_eq!(c, [0, 7]);
    }

    #[test]
    fn multi_path_slices_are_interleaved() {
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 200.0], &[0, 0]);
        let picks = request(&mut sp, &sel, 1, 60, true, |_| true);
        assert_eq!(tally(&picks, 2), [50, 10]);
        let longest = picks
            .chunk_by(|a, b| a == b)
            .map(|run| run.len())
            .max()
            .unwrap();
        assert!(longest <= 5, "a run of {longest}: {picks:?}");
        assert!(picks[..6].contains(&1), "{picks:?}");
        assert_eq!(sp.plans(), 1);
    }

    #[test]
    fn multi_path_from_half_of_max_slice_count() {
        let sel = sel_with(|_| {}); // max_slice_count 64
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 0]);
        let t = tally(&request(&mut sp, &sel, 1, 31, false, |_| true), 2);
        assert!(t.contains(&31), "{t:?}");
        assert_eq!(sp.plans(), 0);
        let t = tally(&request(&mut sp, &sel, 2, 32, false, |_| true), 2);
        assert_eq!(t, [16, 16]);
        assert_eq!(sp.plans(), 1);
    }

    #[test]
    fn requests_are_planned_in_windows() {
        // 200 slices, max_slice_count 64: windows of 64, 64, 64 (split)
        // and 8 (below 32: one rail).
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 0]);
        let picks = request(&mut sp, &sel, 1, 200, false, |_| true);
        assert_eq!(sp.plans(), 3);
        for w in picks[..192].chunks(64) {
            assert_eq!(tally(w, 2), [32, 32]);
        }
        assert!(picks[192..].iter().all(|&r| r == picks[192]));
    }

    #[test]
    fn every_hundredth_multi_path_plan_probes_every_rail() {
        // Tier 2 rails with penalty 1000 get no slice of a normal plan.
        let sel = sel_with(|c| c.numa_penalties = vec![1.0, 1000.0]);
        let mut sp = spray(&sel, &[50e9; 3], &[0, 2, 2]);
        for p in 1..=300u64 {
            let usable = |r: usize| p != 300 || r != 1;
            let t = tally(&request(&mut sp, &sel, p, 64, false, usable), 3);
            match p {
                100 | 200 => {
                    let mut sorted = t.clone();
                    sorted.sort();
                    assert_eq!(sorted, [21, 21, 22], "plan {p}");
                }
                300 => assert_eq!(t, [32, 0, 32], "plan {p}"),
                _ => assert_eq!(t, [64, 0, 0], "plan {p}"),
            }
        }
        assert_eq!(sp.plans(), 300);
    }

    #[test]
    fn max_slice_count_one_plans_each_slice_and_still_probes() {
        let sel = sel_with(|c| {
            c.max_slice_count = 1;
            c.numa_penalties = vec![1.0, 1000.0];
        });
        let mut sp = spray(&sel, &[50e9; 3], &[0, 2, 2]);
        let picks = request(&mut sp, &sel, 1, 300, false, |_| true);
        assert_eq!(sp.plans(), 300);
        for (i, &r) in picks.iter().enumerate() {
            let want = match i + 1 {
                200 => 1,
                300 => 2,
                _ => 0, // the 100th probe starts at the cursor: rail 0
            };
            assert_eq!(r, want, "slice {}", i + 1);
        }
    }

    #[test]
    fn estimate_stays_within_its_clamps() {
        let sel = sel_with(|c| c.learning_rate = 0.5);
        let mut sp = spray(&sel, &[1000.0], &[0]);
        assert_eq!(sp.load(0).ewma_bps, 1000.0);
        for _ in 0..100 {
            sp.observed(&sel, 0, u64::MAX, 1, u32::MAX);
            assert!(sp.load(0).ewma_bps <= 10_000.0);
        }
        assert_eq!(sp.load(0).ewma_bps, 10_000.0);
        for _ in 0..100 {
            sp.observed(&sel, 0, 1, u64::MAX, 0);
            assert!(sp.load(0).ewma_bps >= 100.0);
        }
        assert_eq!(sp.load(0).ewma_bps, 100.0);
        assert_eq!(sp.load(0).samples, 200);
        sp.reset_estimate(&sel, 0);
        assert_eq!((sp.load(0).ewma_bps, sp.load(0).samples), (1000.0, 0));
        // The first estimate is clamped too.
        let sel = sel_with(|c| c.ewma_min_multiplier = 2.0);
        assert_eq!(spray(&sel, &[1000.0], &[0]).load(0).ewma_bps, 2000.0);
    }

    #[test]
    fn learning_rate_is_the_weight_of_the_old_value() {
        let sel = sel_with(|c| c.learning_rate = 0.0);
        let mut sp = spray(&sel, &[1000.0], &[0]);
        sp.observed(&sel, 0, 500, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 500.0);
        // Queue-normalised: one slice ahead, twice the bandwidth.
        sp.observed(&sel, 0, 500, 1_000_000_000, 1);
        assert_eq!(sp.load(0).ewma_bps, 1000.0);
        sp.observed(&sel, 0, 1_000_000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 10_000.0);

        let sel = sel_with(|c| c.learning_rate = 1.0);
        let mut sp = spray(&sel, &[1000.0], &[0]);
        for (b, ns) in [(1, 1), (u64::MAX, 1), (1, u64::MAX), (500, 1_000_000_000)] {
            sp.observed(&sel, 0, b, ns, 3);
            assert_eq!(sp.load(0).ewma_bps, 1000.0);
        }
        assert_eq!(sp.load(0).samples, 4);

        let sel = sel_with(|c| c.learning_rate = 0.25);
        let mut sp = spray(&sel, &[1000.0], &[0]);
        sp.observed(&sel, 0, 2000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 0.25 * 1000.0 + 0.75 * 2000.0);
        // No bytes or no time: no sample.
        sp.observed(&sel, 0, 0, 1_000, 0);
        sp.observed(&sel, 0, 1_000, 0, 0);
        sp.observed(&sel, 5, 1_000, 1_000, 0);
        assert_eq!(sp.load(0).samples, 1);
    }

    #[test]
    fn baseline_round_robins_within_the_best_tier() {
        let sel = sel_with(|c| c.smart = false);
        let mut sp = spray(&sel, &[1.0, 1e12, 1.0, 1e12], &[1, 0, 1, 0]);
        let mut pick = |usable: &dyn Fn(usize) -> bool| {
            (0..4)
                .map(|t| sp.pick(&sel, None, t, 64, S, None, usable).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(&|_| true), [1, 3, 1, 3]);
        assert_eq!(pick(&|r| r != 1), [3, 3, 3, 3]);
        // The best tier has no usable rail: the next one takes over.
        assert_eq!(pick(&|r| r != 1 && r != 3), [0, 2, 0, 2]);
        assert_eq!(pick(&|r| r == 2), [2, 2, 2, 2]);
        assert_eq!(pick(&|_| true), [3, 1, 3, 1]);
        assert_eq!(sp.plans(), 0);
    }

    /// Four rails; worker tiers 0, 0, 1, 1; memory on node 1 ranks them
    /// 1, 0, 0, 1 (`by_node`).
    fn by_memory(sel: &DeviceSelector) -> Spray {
        let specs = [RailSpec {
            theoretical_bps: 1e9,
            depth: 0,
        }; 4];
        let mem1 = [1, 0, 0, 1];
        let tiers = Tiers::new(
            &[0, 0, 1, 1],
            2,
            |node, r| if node == 1 { mem1[r] } else { 0 },
        );
        Spray::new(sel, &specs, &tiers, 7)
    }

    #[test]
    fn tiers_by_memory_node_with_the_worker_s_as_tie_break_and_fallback() {
        let t = Tiers::new(&[0, 1], 3, |node, r| (node as u8 + r as u8) % 2);
        assert_eq!(t.rails(), 2);
        let row = |mem| [0, 1].map(|r| t.tier(mem, r));
        assert_eq!(row(None), [0, 1], "unknown: the worker's");
        assert_eq!(row(Some(0)), [0, 1]);
        assert_eq!(row(Some(1)), [1, 0]);
        assert_eq!(row(Some(2)), [0, 1]);
        assert_eq!(row(Some(3)), [0, 1], "past the table: the worker's");
        assert_eq!(row(Some(u32::MAX)), [0, 1]);
        assert_eq!(t.tier(Some(1), 9), 0, "past the rails");
        // Bounded: at most MAX_MEM_NODES rows past the worker's.
        let big = Tiers::new(&[0], 1000, |_, _| 3);
        assert_eq!(big.tier(Some(MAX_MEM_NODES as u32 - 1), 0), 3);
        assert_eq!(big.tier(Some(MAX_MEM_NODES as u32), 0), 0);
        // A spray over fewer rails keeps each row's first rails.
        let sel = sel_with(|_| {});
        let specs = [RailSpec {
            theoretical_bps: 1e9,
            depth: 0,
        }];
        let sp = Spray::new(&sel, &specs, &t, 1);
        assert_eq!(
            (sp.rails(), sp.tier(Some(1), 0), sp.tier(None, 0)),
            (1, 1, 0)
        );
    }

    /// Round robin goes over the memory's best tier, and within it over
    /// the rails nearest the worker; smart and HIGH picks too.
    #[test]
    fn picks_rank_rails_by_the_memory_s_node_then_the_worker_s() {
        let rr = sel_with(|c| c.smart = false);
        let mut sp = by_memory(&rr);
        let picks = |sp: &mut Spray, mem| {
            (0..4)
                .map(|t| sp.pick(&rr, mem, t, 1, S, None, |_| true).unwrap())
                .collect::<Vec<_>>()
        };
        // Memory on node 1: rails 1 and 2 are its tier 0; the worker
        // prefers rail 1 (its tier 0) of the two.
        assert_eq!(picks(&mut sp, Some(1)), [1; 4]);
        assert_eq!(sp.pick(&rr, Some(1), 9, 1, S, None, |r| r != 1), Some(2));
        // Both rail 1 and 2 out: back to the worker's order in tier 1.
        assert_eq!(
            sp.pick(&rr, Some(1), 9, 1, S, None, |r| r == 0 || r == 3),
            Some(0)
        );
        // Unknown memory, or on node 0 (every rail tier 0 there): the
        // worker's tiers, round robin over rails 0 and 1.
        assert_eq!(tally(&picks(&mut sp, None), 4), [2, 2, 0, 0]);
        assert_eq!(tally(&picks(&mut sp, Some(0)), 4), [2, 2, 0, 0]);
        // Smart, one slice at a time: memory on node 1 takes rail 1 (a
        // tie with rail 2 on score the worker breaks) until it is loaded.
        let smart = sel_with(|_| {});
        let mut sp = by_memory(&smart);
        assert_eq!(sp.pick(&smart, Some(1), 1, 1, S, None, |_| true), Some(1));
        sp.posted(1, S);
        assert_eq!(sp.pick(&smart, Some(1), 2, 1, S, None, |_| true), Some(2));
        assert_eq!(sp.pick(&smart, None, 3, 1, S, None, |_| true), Some(0));
        // HIGH: the best tier for the memory, the worker's tie-break.
        assert_eq!(sp.best_of_top_tier(&smart, Some(1), |_| true, S), Some(1));
        assert_eq!(sp.best_of_top_tier(&smart, Some(1), |r| r != 1, S), Some(2));
        assert_eq!(sp.best_of_top_tier(&smart, None, |_| true, S), Some(0));
        // A multi-path plan over the memory's tiers: rails 1 and 2 share
        // alike, rails 0 and 3 (penalty 5) a fifth as much each.
        let mut sp = by_memory(&smart);
        let picks: Vec<usize> = (0..60)
            .map(|i| {
                sp.pick(&smart, Some(1), 4, 60 - i, S, None, |_| true)
                    .unwrap()
            })
            .collect();
        let t = tally(&picks, 4);
        assert!(t[1] > 2 * t[0] && t[2] > 2 * t[3], "{t:?}");
        assert_eq!(t.iter().sum::<usize>(), 60);
    }

    #[test]
    fn baseline_spreads_skips_and_avoids() {
        let sel = sel_with(|c| c.smart = false);
        let mut sp = spray(&sel, &[1.0; 3], &[0; 3]);
        let mut pick =
            |avoid, usable: &dyn Fn(usize) -> bool| sp.pick(&sel, None, 0, 1, S, avoid, usable);
        let picks: Vec<_> = (0..6).map(|_| pick(None, &|_| true)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2].map(Some));
        let picks: Vec<_> = (0..4).map(|_| pick(None, &|r| r != 1)).collect();
        assert_eq!(picks, [0, 2, 0, 2].map(Some));
        let picks: Vec<_> = (0..4).map(|_| pick(Some(0), &|_| true)).collect();
        assert_eq!(picks, [1, 2, 1, 2].map(Some));
        assert_eq!(pick(Some(0), &|r| r == 0), None);
        assert_eq!(pick(None, &|_| false), None);
        let mut none = spray(&sel, &[], &[]);
        assert_eq!(none.pick(&sel, None, 0, 1, S, None, |_| true), None);
    }

    #[test]
    fn smart_mode_falls_through_an_emptied_tier() {
        let sel = sel_with(|c| c.numa_penalties = vec![1.0, 1000.0]);
        let mut sp = spray(&sel, &[50e9; 3], &[0, 0, 1]);
        // 31.98 / 31.98 / 0.06: floors 31 / 31 / 0, the remainder to rail 0.
        let t = tally(&request(&mut sp, &sel, 1, 64, false, |_| true), 3);
        assert_eq!(t, [33, 31, 0]);
        let t = tally(&request(&mut sp, &sel, 2, 64, false, |r| r == 2), 3);
        assert_eq!(t, [0, 0, 64]);
        assert_eq!(sp.pick(&sel, None, 3, 1, S, None, |r| r == 2), Some(2));
    }

    #[test]
    fn avoid_is_honoured_and_leaves_the_plan_alone() {
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 0]);
        for t in 0..10 {
            assert_eq!(sp.pick(&sel, None, t, 1, S, Some(0), |_| true), Some(1));
        }
        assert_eq!(sp.pick(&sel, None, 10, 1, S, Some(1), |r| r == 1), None);
        // A move in the middle of a plan goes elsewhere and the window
        // still comes out 30/30.
        let mut picks = Vec::new();
        for i in 0..60u64 {
            if i == 10 {
                let next = sp.plan.peek(|_| true).unwrap();
                assert_eq!(
                    sp.pick(&sel, None, 11, 60 - i, S, Some(next), |_| true),
                    Some(1 - next)
                );
            }
            picks.push(sp.pick(&sel, None, 11, 60 - i, S, None, |_| true).unwrap());
        }
        assert_eq!(tally(&picks, 2), [30, 30]);
        assert_eq!(sp.plans(), 1);
    }

    #[test]
    fn no_usable_rail_is_none() {
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 1]);
        assert_eq!(sp.pick(&sel, None, 1, 64, S, None, |_| false), None);
        assert_eq!(sp.pick(&sel, None, 2, 1, S, None, |_| false), None);
        assert_eq!(sp.plans(), 0);
        // A plan in progress whose rails all go away.
        assert!(sp.pick(&sel, None, 3, 64, S, None, |_| true).is_some());
        assert_eq!(sp.pick(&sel, None, 3, 63, S, None, |_| false), None);
    }

    #[test]
    fn single_slice_requests_go_to_the_minimum_score() {
        let sel = sel_with(|_| {});
        let tiers = [0, 1, 0];
        let mut sp = spray(&sel, &[1000.0, 3000.0, 2000.0], &tiers);
        let mut seen = [false; 3];
        for t in 0..60 {
            let want = (0..3)
                .min_by(|&a, &b| {
                    let (sa, sb) = (
                        score(&sel, &sp.load(a), tiers[a], S),
                        score(&sel, &sp.load(b), tiers[b], S),
                    );
                    sa.total_cmp(&sb)
                })
                .unwrap();
            let r = sp.pick(&sel, None, t, 1, S, None, |_| true).unwrap();
            assert_eq!(r, want, "request {t}");
            seen[r] = true;
            sp.posted(r, S);
            if t % 3 == 0 {
                sp.left(r, S);
            }
        }
        assert_eq!(seen, [true; 3]);
        assert_eq!(sp.plans(), 0);
    }

    #[test]
    fn jitter_breaks_ties() {
        let picks = |sel: &DeviceSelector| {
            let mut sp = spray(sel, &[1000.0, 1000.0], &[0, 0]);
            let p: Vec<usize> = (0..200)
                .map(|t| sp.pick(sel, None, t, 1, S, None, |_| true).unwrap())
                .collect();
            tally(&p, 2)
        };
        assert_eq!(picks(&sel_with(|_| {})), [200, 0]);
        let t = picks(&sel_with(|c| c.jitter = 1e-9));
        assert!(t[0] > 50 && t[1] > 50, "{t:?}");
    }

    #[test]
    fn replans_when_the_planned_rail_becomes_unusable() {
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 0]);
        let mut picks = Vec::new();
        for i in 0..60u64 {
            let up = |r: usize| i < 10 || r != 0;
            picks.push(sp.pick(&sel, None, 1, 60 - i, S, None, up).unwrap());
        }
        assert_eq!(tally(&picks[..10], 2), [5, 5]);
        assert!(picks[10..].iter().all(|&r| r == 1), "{picks:?}");
        // The rest (50 ≥ 32) was a multi-path plan of its own.
        assert_eq!(sp.plans(), 2);
        // A single-rail window moves whole to the other rail.
        let mut picks = Vec::new();
        for i in 0..10u64 {
            let up = |r: usize| i < 3 || r != 0;
            picks.push(sp.pick(&sel, None, 2, 10 - i, S, None, up).unwrap());
        }
        assert_eq!(picks, [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(sp.plans(), 2);
    }

    #[test]
    fn zero_bandwidth_does_not_divide_by_zero() {
        let sel = sel_with(|_| {});
        let l = RailLoad::default();
        let sc = score(&sel, &l, 0, S);
        assert!(sc.is_finite() && sc > 0.0);
        assert_eq!(sc, S as f64 / sel.config().epsilon);
        let mut c = [0; 2];
        allocate(
            &sel,
            &loads(&[0.0, 1000.0], &[0, 0]),
            &[0, 0],
            &[true; 2],
            60,
            S,
            &mut c,
        );
        assert_eq!(c, [0, 60]);
        allocate(
            &sel,
            &loads(&[0.0, 0.0], &[0, 0]),
            &[0, 0],
            &[true; 2],
            60,
            S,
            &mut c,
        );
        assert_eq!(c, [30, 30]);
        // A hand-built epsilon of 0 still never makes a NaN.
        let sel = sel_with(|c| c.epsilon = 0.0);
        assert!(!score(&sel, &l, 0, 0).is_nan());
        assert!(!score(&sel, &l, 0, S).is_nan());
        allocate(
            &sel,
            &loads(&[0.0, f64::NAN], &[0, 0]),
            &[0, 0],
            &[true; 2],
            60,
            0,
            &mut c,
        );
        assert_eq!(c.iter().sum::<u64>(), 60);
    }

    #[test]
    fn inflight_accounting_saturates() {
        let sel = sel_with(|_| {});
        let mut sp = spray(&sel, &[1000.0, 1000.0], &[0, 0]);
        assert_eq!(sp.posted(0, S), 0);
        assert_eq!(sp.posted(0, S), 1);
        assert_eq!(sp.posted(0, 10), 2);
        assert_eq!(
            (sp.load(0).inflight_slices, sp.load(0).inflight_bytes),
            (3, 2 * S + 10)
        );
        sp.left(0, S);
        assert_eq!(
            (sp.load(0).inflight_slices, sp.load(0).inflight_bytes),
            (2, S + 10)
        );
        for _ in 0..5 {
            sp.left(0, S);
        }
        assert_eq!(
            sp.load(0),
            RailLoad {
                ewma_bps: 1000.0,
                ..RailLoad::default()
            }
        );
        // Past the rails: ignored.
        assert_eq!(sp.posted(2, S), 0);
        sp.left(2, S);
        assert_eq!(sp.load(2), RailLoad::default());
    }

    #[test]
    fn rails_past_max_rails_are_ignored() {
        for smart in [true, false] {
            let sel = sel_with(|c| c.smart = smart);
            let mut sp = spray(&sel, &[1000.0; 70], &[0; 70]);
            assert_eq!(sp.rails(), MAX_RAILS);
            assert_eq!(
                sp.pick(&sel, None, 1, 64, S, None, |r| r >= MAX_RAILS),
                None
            );
            assert_eq!(sp.pick(&sel, None, 2, 1, S, None, |r| r >= MAX_RAILS), None);
            let r = sp.pick(&sel, None, 3, 64, S, None, |r| r == MAX_RAILS - 1);
            assert_eq!(r, Some(MAX_RAILS - 1));
        }
        // Mismatched lengths: the shorter wins.
        let sel = sel_with(|_| {});
        let sp = spray(&sel, &[1000.0; 3], &[0, 1]);
        assert_eq!((sp.rails(), sp.tier(None, 1)), (2, 1));
    }

    /// `spray` with every rail's depth `depth`.
    fn deep(sel: &DeviceSelector, bps: &[f64], depth: u32) -> Spray {
        let specs: Vec<RailSpec> = bps
            .iter()
            .map(|&b| RailSpec {
                theoretical_bps: b,
                depth,
            })
            .collect();
        Spray::new(sel, &specs, &Tiers::of_worker(&vec![0; bps.len()]), 7)
    }

    #[test]
    fn next_binds_no_slice_past_a_rails_depth() {
        let sel = sel_with(|_| {});
        let mut sp = deep(&sel, &[1000.0, 1000.0], 2);
        let mut picks = Vec::new();
        for i in 0..4u64 {
            let r = sp.next(&sel, None, 1, 64 - i, S, |_| true).unwrap();
            sp.posted(r, S);
            picks.push(r);
        }
        assert_eq!(tally(&picks, 2), [2, 2]);
        assert_eq!(sp.next(&sel, None, 1, 60, S, |_| true), Err(NoRail::Full));
        assert_eq!(sp.next(&sel, None, 1, 60, S, |_| true), Err(NoRail::Full));
        // A completion on rail 1 makes room there, and only there.
        sp.left(1, S);
        assert_eq!(sp.next(&sel, None, 1, 60, S, |_| true), Ok(1));
        sp.posted(1, S);
        assert_eq!(sp.next(&sel, None, 1, 59, S, |_| true), Err(NoRail::Full));
        // Waiting re-plans the window but is no new window: no probe due.
        assert_eq!(sp.plans(), 1);
        // No usable rail is not "full".
        assert_eq!(
            sp.next(&sel, None, 1, 59, S, |_| false),
            Err(NoRail::Unusable)
        );
    }

    #[test]
    fn a_single_rail_window_waits_for_its_best_rail() {
        let sel = sel_with(|_| {});
        let mut sp = deep(&sel, &[10_000.0, 1000.0], 2);
        for i in 0..2u64 {
            assert_eq!(sp.next(&sel, None, 1, 3 - i, S, |_| true), Ok(0));
            sp.posted(0, S);
        }
        // Rail 1 has room, but a slice there would finish after one
        // queued behind the two on rail 0 (3S/10000 < S/1000).
        assert_eq!(sp.next(&sel, None, 1, 1, S, |_| true), Err(NoRail::Full));
        sp.left(0, S);
        assert_eq!(sp.next(&sel, None, 1, 1, S, |_| true), Ok(0));
    }

    #[test]
    fn round_robin_and_moves_bind_at_once() {
        let sel = sel_with(|c| c.smart = false);
        let mut sp = deep(&sel, &[1000.0, 1000.0], 1);
        let mut picks = Vec::new();
        for i in 0..6u64 {
            let r = sp.next(&sel, None, 1, 6 - i, S, |_| true).unwrap();
            sp.posted(r, S);
            picks.push(r);
        }
        assert_eq!(picks, [0, 1, 0, 1, 0, 1]);
        let sel = sel_with(|_| {});
        let mut sp = deep(&sel, &[1000.0, 1000.0], 1);
        for r in 0..2 {
            sp.posted(r, S);
        }
        assert_eq!(sp.next(&sel, None, 1, 64, S, |_| true), Err(NoRail::Full));
        // Moving off rail 0: rail 1, full or not.
        assert_eq!(sp.pick(&sel, None, 1, 1, S, Some(0), |_| true), Some(1));
    }

    /// One request of `n` slices of `S` over rails whose estimates all
    /// start at 1 GB/s but which really serve `true_bps` (one slice at a
    /// time each, first in first out), each `depth` deep; `late`: posted
    /// through `next` as room frees (what the transports do), else every
    /// slice bound at once through `pick` (what they did). Returns (when
    /// the request finished, when each rail finished), in ns.
    fn simulate(true_bps: &[f64], depth: u32, n: u64, late: bool) -> (u64, Vec<u64>) {
        let sel = sel_with(|_| {});
        let mut sp = deep(&sel, &vec![1e9; true_bps.len()], depth);
        let slice_ns: Vec<u64> = true_bps
            .iter()
            .map(|b| (S as f64 / b * 1e9) as u64)
            .collect();
        let mut free_at = vec![0u64; true_bps.len()];
        let mut last = vec![0u64; true_bps.len()];
        // (done, rail, posted, ahead), kept sorted by `done` descending.
        let mut flight: Vec<(u64, usize, u64, u32)> = Vec::new();
        let (mut now, mut left) = (0u64, n);
        loop {
            while left > 0 {
                let r = if late {
                    match sp.next(&sel, None, 1, left, S, |_| true) {
                        Ok(r) => r,
                        Err(NoRail::Full) => break,
                        Err(NoRail::Unusable) => unreachable!(),
                    }
                } else {
                    sp.pick(&sel, None, 1, left, S, None, |_| true).unwrap()
                };
                let ahead = sp.posted(r, S);
                let done = free_at[r].max(now) + slice_ns[r];
                free_at[r] = done;
                flight.push((done, r, now, ahead));
                flight.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
                left -= 1;
            }
            let Some((done, r, posted, ahead)) = flight.pop() else {
                break;
            };
            now = done;
            last[r] = done;
            sp.left(r, S);
            sp.observed(&sel, r, S, done - posted, ahead);
        }
        (now, last)
    }

    #[test]
    fn late_binding_finishes_mis_estimated_rails_together() {
        // 1 GB/s and 200 MB/s, both believed 1 GB/s: the ideal is every
        // byte at the sum of the rates.
        let rates = [1e9, 2e8];
        let n = 1024;
        let ideal = (n * S) as f64 / (rates[0] + rates[1]) * 1e9;
        let (done, last) = simulate(&rates, 8, n, true);
        assert!(
            (done as f64) < 1.05 * ideal,
            "late binding: {done} ns vs ideal {ideal:.0} (rails done at {last:?})"
        );
        // The rails finish within a few slow slices of each other.
        let slow_slice = S as f64 / rates[1] * 1e9;
        let skew = last[0].abs_diff(last[1]) as f64;
        assert!(skew < 10.0 * slow_slice, "skew {skew} ns: {last:?}");
        // Bound at once on the first estimates, the slow rail gets its
        // "equal" share and the request takes far longer.
        let (eager, _) = simulate(&rates, 8, n, false);
        assert!(eager as f64 > 1.5 * ideal, "eager {eager} vs {ideal:.0}");
    }

    #[test]
    fn late_binding_costs_nothing_on_equal_rails() {
        let rates = [1e9, 1e9, 1e9];
        let n = 600;
        let ideal = (n * S) as f64 / 3e9 * 1e9;
        let (done, _) = simulate(&rates, 4, n, true);
        assert!((done as f64) < 1.02 * ideal, "{done} vs {ideal:.0}");
    }

    // Reload: a `Spray` reads the selector it is handed at each decision,
    // so a new one (what `Engine::reload` stores in the `LiveSelector`,
    // and the worker's cache hands over at its next pick) applies from the
    // next pick, plan or estimate on, the same `Spray` and its state kept.

    /// The rail each of `n` one-request picks (fresh tokens from `first`)
    /// lands on, nothing posted.
    fn picks(sp: &mut Spray, sel: &DeviceSelector, first: u64, n: u64, slices: u64) -> Vec<usize> {
        (0..n)
            .map(|t| {
                sp.pick(sel, None, first + t, slices, S, None, |_| true)
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_reloaded_smart_scheduling_switch_applies_at_the_next_pick() {
        let smart = sel_with(|_| {});
        let mut sp = spray(&smart, &[1e9, 1e9], &[0, 0]);
        sp.posted(1, 1 << 30);
        assert_eq!(
            picks(&mut sp, &smart, 1, 4, 1),
            [0, 0, 0, 0],
            "scores: rail 1 is loaded"
        );
        let rr = sel_with(|c| c.smart = false);
        assert_eq!(
            tally(&picks(&mut sp, &rr, 10, 4, 1), 2),
            [2, 2],
            "round robin"
        );
        assert_eq!(picks(&mut sp, &smart, 20, 2, 1), [0, 0], "and back");
    }

    #[test]
    fn reloaded_numa_penalties_apply_at_the_next_pick() {
        let sel = sel_with(|c| c.numa_penalties = vec![1.0, 5.0]);
        let mut sp = spray(&sel, &[1e9, 1e9], &[0, 1]);
        assert_eq!(picks(&mut sp, &sel, 1, 2, 1), [0, 0]);
        let cheap_remote = sel_with(|c| c.numa_penalties = vec![1.0, 0.5]);
        assert_eq!(picks(&mut sp, &cheap_remote, 10, 2, 1), [1, 1]);
    }

    #[test]
    fn a_reloaded_learning_rate_applies_at_the_next_estimate() {
        let frozen = sel_with(|c| c.learning_rate = 1.0);
        let mut sp = spray(&frozen, &[1000.0], &[0]);
        sp.observed(&frozen, 0, 2000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 1000.0, "alpha 1: never learns");
        let eager = sel_with(|c| c.learning_rate = 0.0);
        sp.observed(&eager, 0, 2000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 2000.0, "alpha 0: the new sample");
    }

    #[test]
    fn reloaded_ewma_clamps_apply_at_the_next_estimate_and_reset() {
        let sel = sel_with(|c| c.learning_rate = 0.0);
        let mut sp = spray(&sel, &[1000.0], &[0]);
        sp.observed(&sel, 0, 1_000_000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 10_000.0, "the default max: 10 x");
        let tight = sel_with(|c| {
            c.learning_rate = 0.0;
            c.ewma_max_multiplier = 2.0;
            c.ewma_min_multiplier = 1.5;
        });
        sp.observed(&tight, 0, 1_000_000, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 2000.0, "the reloaded max");
        sp.observed(&tight, 0, 1, 1_000_000_000, 0);
        assert_eq!(sp.load(0).ewma_bps, 1500.0, "the reloaded min");
        sp.reset_estimate(&tight, 0);
        assert_eq!(sp.load(0).ewma_bps, 1500.0, "a reset starts within them");
    }

    #[test]
    fn a_reloaded_jitter_range_applies_at_the_next_pick() {
        let none = sel_with(|_| {});
        let mut sp = spray(&none, &[1e9, 1e9], &[0, 0]);
        assert_eq!(
            tally(&picks(&mut sp, &none, 1, 50, 1), 2),
            [50, 0],
            "equals: the first"
        );
        let wide = sel_with(|c| c.jitter = 1.0);
        let t = tally(&picks(&mut sp, &wide, 100, 50, 1), 2);
        assert!(
            t[0] > 0 && t[1] > 0,
            "a jitter far above the scores draws both: {t:?}"
        );
    }

    #[test]
    fn a_reloaded_score_epsilon_applies_at_the_next_pick() {
        // Rails of a quarter and a half byte per second: the faster one
        // wins, until an epsilon of 1 B/s floors both divisors alike.
        let tiny = sel_with(|c| c.ewma_min_multiplier = 1.0);
        let mut sp = spray(&tiny, &[0.25, 0.5], &[0, 0]);
        assert_eq!(picks(&mut sp, &tiny, 1, 2, 1), [1, 1]);
        let floor = sel_with(|c| {
            c.ewma_min_multiplier = 1.0;
            c.epsilon = 1.0;
        });
        assert_eq!(picks(&mut sp, &floor, 10, 2, 1), [0, 0]);
    }

    #[test]
    fn a_reloaded_max_slice_count_applies_at_the_next_plan() {
        // 8 slices: a multi-path window at 16 (from 8), one rail's at 64.
        let sel = sel_with(|c| c.max_slice_count = 16);
        let mut sp = spray(&sel, &[1e9, 1e9], &[0, 0]);
        let split = request(&mut sp, &sel, 1, 8, false, |_| true);
        assert_eq!(tally(&split, 2), [4, 4]);
        let big = sel_with(|c| c.max_slice_count = 64);
        let one = request(&mut sp, &big, 2, 8, false, |_| true);
        assert!(tally(&one, 2).contains(&8), "{one:?}");
    }
}
