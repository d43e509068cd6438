//! TEMPORARY stub of the selector API (replaced by wt-sel at merge).
#![allow(missing_docs, dead_code)]
use crate::config::Config;

pub const MAX_RAILS: usize = 64;
pub const PROBE_EVERY: u64 = 100;

#[derive(Debug, Clone, PartialEq)]
pub struct SelectorConfig {
    pub smart: bool,
    pub numa_penalties: Vec<f64>,
    pub learning_rate: f64,
    pub ewma_min_multiplier: f64,
    pub ewma_max_multiplier: f64,
    pub jitter: f64,
    pub epsilon: f64,
    pub default_gbps: f64,
    pub min_gbps: f64,
    pub max_gbps: f64,
    pub max_slice_count: u32,
}
impl SelectorConfig {
    pub fn from_config(c: &Config) -> SelectorConfig {
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
        }
    }
    pub fn theoretical_bps(&self, reported_gbps: Option<f64>) -> f64 {
        let g = reported_gbps
            .filter(|g| g.is_finite() && *g >= self.min_gbps && *g <= self.max_gbps)
            .unwrap_or(self.default_gbps);
        g * 1e9 / 8.0
    }
    pub fn penalty(&self, tier: u8) -> f64 {
        self.numa_penalties
            .get(tier as usize)
            .or(self.numa_penalties.last())
            .copied()
            .unwrap_or(1.0)
    }
}
impl Default for SelectorConfig {
    fn default() -> Self {
        SelectorConfig::from_config(&Config::default())
    }
}
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RailSpec {
    pub theoretical_bps: f64,
}
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RailLoad {
    pub inflight_bytes: u64,
    pub inflight_slices: u32,
    pub ewma_bps: f64,
    pub samples: u64,
}
#[derive(Debug, Clone, Default)]
pub struct DeviceSelector {
    cfg: SelectorConfig,
}
impl DeviceSelector {
    pub fn new(cfg: SelectorConfig) -> DeviceSelector {
        DeviceSelector { cfg }
    }
    pub fn config(&self) -> &SelectorConfig {
        &self.cfg
    }
    pub fn is_smart(&self) -> bool {
        self.cfg.smart
    }
}
#[derive(Debug)]
pub struct Spray {
    loads: Vec<RailLoad>,
    specs: Vec<RailSpec>,
    tiers: Vec<u8>,
    cursor: usize,
    plans: u64,
}
impl Spray {
    pub fn new(_sel: &DeviceSelector, specs: &[RailSpec], tiers: &[u8], _seed: u64) -> Spray {
        Spray {
            loads: specs
                .iter()
                .map(|s| RailLoad {
                    ewma_bps: s.theoretical_bps,
                    ..Default::default()
                })
                .collect(),
            specs: specs.to_vec(),
            tiers: tiers.to_vec(),
            cursor: 0,
            plans: 0,
        }
    }
    pub fn rails(&self) -> usize {
        self.loads.len()
    }
    pub fn tier(&self, rail: usize) -> u8 {
        self.tiers[rail]
    }
    pub fn pick(
        &mut self,
        _sel: &DeviceSelector,
        _token: u64,
        _slices_left: u64,
        _slice_bytes: u64,
        avoid: Option<usize>,
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = self.loads.len();
        for step in 0..n {
            let r = (self.cursor + step) % n;
            if Some(r) != avoid && usable(r) {
                self.cursor = r + 1;
                return Some(r);
            }
        }
        None
    }
    pub fn posted(&mut self, rail: usize, bytes: u64) -> u32 {
        let l = &mut self.loads[rail];
        let ahead = l.inflight_slices;
        l.inflight_slices += 1;
        l.inflight_bytes += bytes;
        ahead
    }
    pub fn left(&mut self, rail: usize, bytes: u64) {
        let l = &mut self.loads[rail];
        l.inflight_slices = l.inflight_slices.saturating_sub(1);
        l.inflight_bytes = l.inflight_bytes.saturating_sub(bytes);
    }
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
        let c = &sel.cfg;
        let obs = bytes as f64 * (ahead as f64 + 1.0) * 1e9 / elapsed_ns as f64;
        let l = &mut self.loads[rail];
        let t = self.specs[rail].theoretical_bps;
        l.ewma_bps = (c.learning_rate * l.ewma_bps + (1.0 - c.learning_rate) * obs)
            .clamp(c.ewma_min_multiplier * t, c.ewma_max_multiplier * t);
        l.samples += 1;
    }
    pub fn reset_estimate(&mut self, rail: usize) {
        self.loads[rail].ewma_bps = self.specs[rail].theoretical_bps;
    }
    pub fn load(&self, rail: usize) -> RailLoad {
        self.loads[rail]
    }
    pub fn plans(&self) -> u64 {
        self.plans
    }
}
