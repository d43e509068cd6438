//! Counters an operator watches, and their exposition: OpenMetrics text
//! (`/metrics`, `Engine::metrics_text`) encoded by `prometheus-client`
//! ([`expo`]) from figures read at scrape time.
//!
//! - `tent_transport_failover_total{from,to}`: transport switches (seed
//!   000's metric), one per successful switch of one task.
//! - `tent_task_failover_exhausted_total`: tasks that failed after their
//!   budget ran out or no transport was left.
//! - per rail (`transport`, `segment`, `local`, `remote`): `tent_rail_state`
//!   (0 healthy, 1 degraded, 2 demoted, 3 paused), `tent_rail_up`,
//!   `tent_rail_bytes_total`, `tent_rail_failures_total`,
//!   `tent_rail_trips_total`, `tent_rail_moved_slices_total`,
//!   `tent_rail_inflight_slices`, `tent_rail_inflight_bytes`,
//!   `tent_rail_bandwidth_bytes_per_second` (the EWMA),
//!   `tent_rail_theoretical_bytes_per_second`, `tent_rail_numa_tier`.
//! - per RDMA rail and QP slot (`segment`, `local`, `remote`, `qp`;
//!   `qp_per_transfer` per rail, every worker's endpoint there together),
//!   seed 004's SQ/CQE diagnostics: `tent_sq_posted_wr`,
//!   `tent_sq_backlog_slices`, `tent_sq_backlog_high_watermark`,
//!   `tent_sq_cqes_total`, `tent_sq_last_cqe_age_us`,
//!   `tent_sq_full_refusals_total`, `tent_sq_stalls_total`,
//!   `tent_sq_admission_waits_total`, `tent_sq_admission_timeouts_total`,
//!   `tent_sq_least_loaded_selections_total`,
//!   `tent_sq_queued_wr_high_watermark`.
//! - the request counters and their latency histogram ([`ops`]), the QoS
//!   figures (`tent_qos_*`), the HTTP server's own counters
//!   (`tent_http_*`).
//!
//! The per-rail and per-SQ series are bounded by `metrics/max_labelled_peers`
//! ([`cap`]): past it, the peers that carried the least are summed under
//! `segment="_other"`.
//!
//! Counters here are written by workers on the failure path only (never
//! per slice), so plain relaxed RMWs on shared atomics cost nothing that
//! matters.

use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::TransportKind;

pub(crate) mod cap;
pub(crate) mod expo;
pub(crate) mod ops;

pub(crate) use expo::{ClientSnapshot, Scrape};

/// `TransportKind` codes.
pub(crate) const KINDS: usize = 5;

/// Engine-wide counters.
#[derive(Debug, Default)]
pub struct Metrics {
    failover: [[AtomicU64; KINDS]; KINDS],
    exhausted: AtomicU64,
}

impl Metrics {
    /// One task switched from `from` to `to`.
    pub(crate) fn failover(&self, from: TransportKind, to: TransportKind) {
        self.failover[from as usize][to as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// One task failed with no failover left.
    pub(crate) fn exhausted(&self) {
        self.exhausted.fetch_add(1, Ordering::Relaxed);
    }

    /// Switches from `from` to `to` so far.
    pub fn failovers(&self, from: TransportKind, to: TransportKind) -> u64 {
        self.failover[from as usize][to as usize].load(Ordering::Relaxed)
    }

    /// Switches so far, every pair together.
    pub fn failovers_total(&self) -> u64 {
        self.failover
            .iter()
            .flatten()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Tasks that ran out of failover so far.
    pub fn exhausted_total(&self) -> u64 {
        self.exhausted.load(Ordering::Relaxed)
    }

    /// Every pair's switches so far, `[from][to]` by `TransportKind` code.
    pub(crate) fn failover_counts(&self) -> [[u64; KINDS]; KINDS] {
        self.failover
            .each_ref()
            .map(|row| row.each_ref().map(|c| c.load(Ordering::Relaxed)))
    }
}
