//! Counters an operator watches, in Prometheus text format.
//!
//! - `tent_transport_failover_total{from,to}`: transport switches (seed
//!   000's metric), one per successful switch of one task.
//! - `tent_task_failover_exhausted_total`: tasks that failed after their
//!   budget ran out or no transport was left.
//! - per rail: `tent_rail_state` (0 healthy, 1 degraded, 2 demoted,
//!   3 paused), `tent_rail_up`, `tent_rail_bytes_total`,
//!   `tent_rail_failures_total`, `tent_rail_trips_total`,
//!   `tent_rail_moved_slices_total`, `tent_rail_inflight_slices`,
//!   `tent_rail_inflight_bytes`, `tent_rail_bandwidth_bytes_per_second`
//!   (the EWMA), `tent_rail_theoretical_bytes_per_second`,
//!   `tent_rail_numa_tier`.
//!
//! - per RDMA rail and QP slot (`qp` label, `qp_per_transfer` per rail;
//!   every worker's endpoint there together), seed 004's
//!   SQ/CQE diagnostics: `tent_sq_posted_wr`, `tent_sq_backlog_slices`,
//!   `tent_sq_backlog_high_watermark`, `tent_sq_cqes_total`,
//!   `tent_sq_last_cqe_age_us`, `tent_sq_full_refusals_total`,
//!   `tent_sq_stalls_total`, `tent_sq_admission_waits_total`,
//!   `tent_sq_admission_timeouts_total`, `tent_sq_least_loaded_selections_total`,
//!   `tent_sq_queued_wr_high_watermark`.
//!
//! Counters are written by workers on the failure path only (never per
//! slice), so plain relaxed RMWs on shared atomics cost nothing that
//! matters.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tent_rings::TransportKind;

pub(crate) mod ops;

use crate::flow::diag::{SqReport, SqRow};
use crate::qos::stats::WAIT_BUCKETS;
use crate::transport::rails::RailStat;
use ops::{OPCODES, OpSnapshot, Stage, TRANSPORTS};

/// `tent_sq_*` families: name, type, help, field.
type SqFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&SqReport) -> u64,
);

const SQ_FAMILIES: [SqFamily; 11] = [
    (
        "tent_sq_posted_wr",
        "gauge",
        "Work requests posted and not known complete.",
        |r| u64::from(r.posted),
    ),
    (
        "tent_sq_backlog_slices",
        "gauge",
        "Slices waiting in the endpoints' backlogs.",
        |r| u64::from(r.backlog),
    ),
    (
        "tent_sq_backlog_high_watermark",
        "gauge",
        "Most slices ever waiting in one endpoint's backlog.",
        |r| u64::from(r.backlog_high),
    ),
    (
        "tent_sq_cqes_total",
        "counter",
        "Completions reaped.",
        |r| r.cqes,
    ),
    (
        "tent_sq_last_cqe_age_us",
        "gauge",
        "Microseconds since the last completion (absent: none yet).",
        |r| r.last_cqe_us_ago.unwrap_or(u64::MAX),
    ),
    (
        "tent_sq_full_refusals_total",
        "counter",
        "Slices refused because an endpoint's backlog was full (back-pressure).",
        |r| r.full_refusals,
    ),
    (
        "tent_sq_stalls_total",
        "counter",
        "Times an endpoint went sq_backoff_timeout_us with requests posted and no completion.",
        |r| r.stalls,
    ),
    (
        "tent_sq_admission_waits_total",
        "counter",
        "Admission waits that slept.",
        |r| r.admission_waits,
    ),
    (
        "tent_sq_admission_timeouts_total",
        "counter",
        "Admission waits that timed out.",
        |r| r.admission_timeouts,
    ),
    (
        "tent_sq_least_loaded_selections_total",
        "counter",
        "Admissions the least_loaded split policy charged to the rail's endpoints.",
        |r| r.least_loaded,
    ),
    (
        "tent_sq_queued_wr_high_watermark",
        "gauge",
        "Most requests admitted and not yet posted at once.",
        |r| u64::from(r.queued_high),
    ),
];

const KINDS: usize = 5;

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

    /// Everything, in Prometheus text exposition format; `rails` are
    /// (segment name, rail) pairs, `sq` the RDMA rails' queue counters.
    pub(crate) fn render(&self, rails: &[(String, RailStat)], sq: &[SqRow]) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP tent_transport_failover_total Tasks moved from one transport to the next after a transient failure.\n\
             # TYPE tent_transport_failover_total counter\n",
        );
        // Every pair of real transports, at 0 from the start (a series
        // that appears only at its first count hides the first increase).
        for (f, row) in self.failover.iter().enumerate() {
            for (t, c) in row.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                let any = TransportKind::Any as usize;
                if n == 0 && (f == t || f == any || t == any) {
                    continue;
                }
                let name =
                    |k: usize| TransportKind::from_u8(k as u8).map_or("unknown", |k| k.name());
                let _ = writeln!(
                    out,
                    "tent_transport_failover_total{{from=\"{}\",to=\"{}\"}} {n}",
                    name(f),
                    name(t)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP tent_task_failover_exhausted_total Tasks failed after every transport allowed had failed.\n\
             # TYPE tent_task_failover_exhausted_total counter\n\
             tent_task_failover_exhausted_total {}",
            self.exhausted_total()
        );
        type Field = fn(&RailStat) -> u64;
        let families: [(&str, &str, &str, Field); 11] = [
            (
                "tent_rail_state",
                "gauge",
                "Rail state: 0 healthy, 1 degraded, 2 demoted, 3 paused.",
                |r| u64::from(r.state.gauge()),
            ),
            (
                "tent_rail_up",
                "gauge",
                "Is the rail's local link up (1) or down (0).",
                |r| u64::from(r.up),
            ),
            (
                "tent_rail_bytes_total",
                "counter",
                "Bytes the rail has carried.",
                |r| r.bytes,
            ),
            (
                "tent_rail_failures_total",
                "counter",
                "Slice failures reported on the rail.",
                |r| r.failures,
            ),
            (
                "tent_rail_trips_total",
                "counter",
                "Times the rail was paused by its error threshold.",
                |r| r.trips,
            ),
            (
                "tent_rail_moved_slices_total",
                "counter",
                "Slices moved off the rail to a sibling.",
                |r| r.moved,
            ),
            (
                "tent_rail_inflight_slices",
                "gauge",
                "Slices on the rail now.",
                |r| u64::from(r.inflight),
            ),
            (
                "tent_rail_bandwidth_bytes_per_second",
                "gauge",
                "The rail's bandwidth estimate (the selector's EWMA, summed over the workers using it).",
                |r| r.bandwidth,
            ),
            (
                "tent_rail_inflight_bytes",
                "gauge",
                "Bytes on the rail now.",
                |r| r.inflight_bytes,
            ),
            (
                "tent_rail_theoretical_bytes_per_second",
                "gauge",
                "The rail's theoretical bandwidth (port speed, or default_bandwidth_gbps).",
                |r| r.theoretical,
            ),
            (
                "tent_rail_numa_tier",
                "gauge",
                "The rail's NUMA tier from the first worker's node (0: local); a slice ranks rails from its memory's node, the worker's breaking ties and standing in when that is unknown.",
                |r| u64::from(r.tier),
            ),
        ];
        for (name, ty, help, get) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
            for (seg, r) in rails {
                let _ = writeln!(
                    out,
                    "{name}{{transport=\"{}\",segment=\"{}\",local=\"{}\",remote=\"{}\"}} {}",
                    r.transport.name(),
                    escape(seg),
                    escape(&r.local),
                    escape(&r.remote),
                    get(r)
                );
            }
        }
        if !sq.is_empty() {
            for (name, ty, help, get) in SQ_FAMILIES {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
                for row in sq {
                    // `u64::MAX`: no value yet (an age with no event).
                    let v = get(&row.report);
                    if v == u64::MAX {
                        continue;
                    }
                    let _ = writeln!(
                        out,
                        "{name}{{segment=\"{}\",local=\"{}\",remote=\"{}\",qp=\"{}\"}} {v}",
                        escape(&row.segment),
                        escape(&row.local),
                        escape(&row.remote),
                        row.qp,
                    );
                }
            }
        }
        out
    }
}

/// The request counters as Prometheus text (TENT's names):
/// `tent_{read,write}_{requests,bytes,failures}_total{transport}` for
/// every real transport, and requests and failures also under `none` for
/// those refused at intake (requests: completed, failed included; bytes: of
/// those that succeeded), and `tent_request_duration_seconds`, each
/// request's time from intake to completion by transport and priority
/// (only the pairs that served a request), and `tent_request_stage_seconds`,
/// that time split in its [`Stage`]s.
pub(crate) fn render_ops(out: &mut String, s: &OpSnapshot) {
    use crate::qos::stats::name as priority_name;
    use tent_rings::Priority;
    let real = || (1..TRANSPORTS).filter_map(|t| TransportKind::from_u8(t as u8).map(|k| (t, k)));
    // Requests and failures also under `none`: refused at intake.
    let label = |t: usize| {
        TransportKind::from_u8(t as u8)
            .filter(|_| t > 0)
            .map_or("none", |k| k.name())
    };
    for (o, op) in ["read", "write"].iter().enumerate().take(OPCODES) {
        type Count = fn(&OpSnapshot, usize, usize) -> u64;
        let families: [(&str, &str, Count); 3] = [
            (
                "requests",
                "Requests completed, failed ones included",
                |s, o, t| s.ok[o][t] + s.failed[o][t],
            ),
            (
                "bytes",
                "Bytes moved by requests that succeeded",
                |s, o, t| s.bytes[o][t],
            ),
            ("failures", "Requests that failed", |s, o, t| s.failed[o][t]),
        ];
        for (what, help, get) in families {
            let fam = format!("tent_{op}_{what}_total");
            let _ = writeln!(
                out,
                "# HELP {fam} {help}, {}s, by transport.\n# TYPE {fam} counter",
                op.to_uppercase()
            );
            let with_none = what != "bytes";
            for t in (if with_none { 0 } else { 1 })..TRANSPORTS {
                let _ = writeln!(out, "{fam}{{transport=\"{}\"}} {}", label(t), get(s, o, t));
            }
        }
    }
    let fam = "tent_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {fam} A request's time from intake to its completion, by transport and priority (done at intake: 0).\n# TYPE {fam} histogram"
    );
    for (t, k) in real() {
        for p in Priority::ALL {
            let labels = format!(
                "transport=\"{}\",priority=\"{}\"",
                k.name(),
                priority_name(p)
            );
            let (hist, sum) = (&s.latency[t][p.index()], s.latency_sum_ns[t][p.index()]);
            histogram(out, fam, &labels, hist, sum);
        }
    }
    let fam = "tent_request_stage_seconds";
    let _ = writeln!(
        out,
        "# HELP {fam} A request's time in each stage, by transport and priority: queue (intake to its first slice handed to a transport), dispatch (first slice to last), transport (last slice to completion); the three add up to tent_request_duration_seconds. Requests that failed before handing over a slice are not counted.\n# TYPE {fam} histogram"
    );
    for stage in Stage::ALL {
        let g = stage as usize;
        for (t, k) in real() {
            for p in Priority::ALL {
                let labels = format!(
                    "stage=\"{}\",transport=\"{}\",priority=\"{}\"",
                    stage.name(),
                    k.name(),
                    priority_name(p)
                );
                let (hist, sum) = (&s.stage[g][t][p.index()], s.stage_sum_ns[g][t][p.index()]);
                histogram(out, fam, &labels, hist, sum);
            }
        }
    }
}

/// One series of a histogram family with `labels`, from its per-bucket
/// counts (buckets as the QoS wait's) and their sum in ns; nothing for a
/// series with no count (only the pairs that served a request show).
fn histogram(out: &mut String, fam: &str, labels: &str, hist: &[u64; WAIT_BUCKETS], sum_ns: u64) {
    use crate::qos::stats::bucket_upper_us;
    if hist.iter().all(|&c| c == 0) {
        return;
    }
    let mut cum = 0;
    for (b, c) in hist.iter().enumerate() {
        cum += c;
        if b + 1 < WAIT_BUCKETS {
            let le = bucket_upper_us(b) as f64 / 1e6;
            let _ = writeln!(out, "{fam}_bucket{{{labels},le=\"{le}\"}} {cum}");
        }
    }
    let _ = writeln!(out, "{fam}_bucket{{{labels},le=\"+Inf\"}} {cum}");
    let _ = writeln!(out, "{fam}_sum{{{labels}}} {}", sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{fam}_count{{{labels}}} {cum}");
}

/// Seed 001's per-priority figures as Prometheus text: lane depth,
/// accepted, promotions, slot-gate holds, the queue-wait histogram, and
/// the shared slot clock when one is configured.
pub(crate) fn render_qos(out: &mut String, q: &crate::qos::QosSnapshot) {
    use crate::qos::stats::{WAIT_BUCKETS, bucket_upper_us, name};
    use tent_rings::Priority;
    type Field = fn(&crate::qos::LevelSnapshot) -> u64;
    let families: [(&str, &str, &str, Field); 4] = [
        (
            "tent_qos_queued_tasks",
            "gauge",
            "Tasks waiting in the workers' lane of this priority.",
            |l| l.queued,
        ),
        (
            "tent_qos_accepted_total",
            "counter",
            "Tasks accepted at this priority.",
            |l| l.accepted,
        ),
        (
            "tent_qos_promoted_total",
            "counter",
            "Tasks promoted out of this priority's lane after priority_promotion_timeout_us.",
            |l| l.promoted,
        ),
        (
            "tent_qos_gate_holds_total",
            "counter",
            "Times this priority's lane, with work, found the shared time slot closed to it.",
            |l| l.gate_holds,
        ),
    ];
    for (fam, ty, help, get) in families {
        let _ = writeln!(out, "# HELP {fam} {help}\n# TYPE {fam} {ty}");
        for p in Priority::ALL {
            let _ = writeln!(out, "{fam}{{priority=\"{}\"}} {}", name(p), get(q.level(p)));
        }
    }
    let fam = "tent_qos_wait_seconds";
    let _ = writeln!(
        out,
        "# HELP {fam} Queue wait of a task, by submitted priority: intake to its first slice handed to a transport.\n# TYPE {fam} histogram"
    );
    for p in Priority::ALL {
        let l = q.level(p);
        let mut cum = 0;
        for (k, c) in l.wait.iter().enumerate() {
            cum += c;
            if k + 1 < WAIT_BUCKETS {
                let le = bucket_upper_us(k) as f64 / 1e6;
                let _ = writeln!(
                    out,
                    "{fam}_bucket{{priority=\"{}\",le=\"{le}\"}} {cum}",
                    name(p)
                );
            }
        }
        let _ = writeln!(
            out,
            "{fam}_bucket{{priority=\"{}\",le=\"+Inf\"}} {cum}",
            name(p)
        );
        let _ = writeln!(
            out,
            "{fam}_sum{{priority=\"{}\"}} {}",
            name(p),
            l.wait_sum_ns as f64 / 1e9
        );
        let _ = writeln!(out, "{fam}_count{{priority=\"{}\"}} {cum}", name(p));
    }
    if let Some(s) = q.slots {
        let _ = writeln!(
            out,
            "# HELP tent_qos_slot The shared time slot now (0: HIGH only, 1: HIGH and MEDIUM, 2: all).\n\
             # TYPE tent_qos_slot gauge\ntent_qos_slot {}\n\
             # HELP tent_qos_slot_owner Does this engine rotate the shared slot clock (1) or watch it (0).\n\
             # TYPE tent_qos_slot_owner gauge\ntent_qos_slot_owner {}\n\
             # HELP tent_qos_slot_takeovers_total Times a participant took the slot clock over from a silent owner.\n\
             # TYPE tent_qos_slot_takeovers_total counter\ntent_qos_slot_takeovers_total {}",
            s.slot,
            u8::from(s.owner),
            s.takeovers
        );
    }
}

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rails::RailState;

    #[test]
    fn renders_failover_pairs_and_rails() {
        let m = Metrics::default();
        m.failover(TransportKind::Rdma, TransportKind::Tcp);
        m.failover(TransportKind::Rdma, TransportKind::Tcp);
        m.exhausted();
        let rail = RailStat {
            transport: TransportKind::Tcp,
            local: "veth\"0".into(),
            remote: "eth0".into(),
            up: true,
            bytes: 42,
            moved: 1,
            state: RailState::Paused,
            failures: 3,
            trips: 1,
            inflight: 2,
            inflight_bytes: 8192,
            bandwidth: 1000,
            theoretical: 5000,
            tier: 1,
        };
        let sq = SqRow {
            segment: "10.0.0.2:7000".into(),
            local: "mlx5_0".into(),
            remote: "mlx5_1".into(),
            qp: 1,
            report: SqReport {
                posted: 12,
                stalls: 2,
                cqes: 40,
                last_cqe_us_ago: None,
                ..SqReport::default()
            },
        };
        let text = m.render(&[("10.0.0.2:7000".into(), rail)], std::slice::from_ref(&sq));
        assert!(
            text.contains("tent_transport_failover_total{from=\"rdma\",to=\"tcp\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("tent_task_failover_exhausted_total 1\n"));
        assert!(text.contains(
            "tent_rail_state{transport=\"tcp\",segment=\"10.0.0.2:7000\",local=\"veth\\\"0\",remote=\"eth0\"} 3\n"
        ));
        assert!(text.contains("tent_rail_bytes_total{transport=\"tcp\","));
        assert!(text.contains("# TYPE tent_rail_trips_total counter\n"));
        assert!(text.contains("tent_rail_inflight_bytes{transport=\"tcp\",segment=\"10.0.0.2:7000\",local=\"veth\\\"0\",remote=\"eth0\"} 8192\n"), "{text}");
        assert!(text.contains("tent_rail_numa_tier{"));
        assert!(text.contains(
            "tent_sq_stalls_total{segment=\"10.0.0.2:7000\",local=\"mlx5_0\",remote=\"mlx5_1\",qp=\"1\"} 2\n"
        ), "{text}");
        assert!(text.contains(
            "tent_sq_posted_wr{segment=\"10.0.0.2:7000\",local=\"mlx5_0\",remote=\"mlx5_1\",qp=\"1\"} 12\n"
        ));
        assert!(text.contains("# TYPE tent_sq_cqes_total counter\n"));
        // No completion yet: the age has no sample, not a huge number.
        assert!(!text.contains("tent_sq_last_cqe_age_us{"), "{text}");
        assert_eq!(m.failovers(TransportKind::Rdma, TransportKind::Tcp), 2);
        assert_eq!(m.failovers_total(), 2);
        // Every non-comment line is `name{labels} value` or `name value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            value.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
        }
    }
}
