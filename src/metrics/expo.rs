//! The exposition: a [`Scrape`] (every figure, read at one scrape) as
//! OpenMetrics text, encoded by `prometheus-client`.
//!
//! Our counters stay what they are (per-worker single-writer atomics and
//! the engine's shared ones, summed when read), so no metric object of
//! the crate is kept: at each scrape the figures are read into a
//! [`Scrape`], its per-peer tables are capped (`cap.rs`), and the result
//! is the crate's custom [`Collector`], whose `encode` describes each
//! family (`encode_descriptor`) and encodes its samples (`encode_family`
//! for the labels, then `encode_counter`, `encode_gauge` or
//! `encode_histogram`); `prometheus_client::encoding::text::encode` writes
//! the text with its `# EOF`. A counter family is described
//! without its `_total` (OpenMetrics names the family so); its samples
//! carry it, the names they have always had.

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, LabelValueEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::registry::Registry;
use tent_rings::{Priority, TransportKind};

use super::KINDS;
use super::cap::{ABSENT, Merge, Row, collapse, kept_peers};
use super::ops::{OPCODES, OpSnapshot, Stage, TRANSPORTS};
use crate::flow::diag::{SqReport, SqRow};
use crate::http::HttpStats;
use crate::qos::stats::{bucket_upper_us, name as priority_name};
use crate::qos::{LevelSnapshot, QosSnapshot};
use crate::transport::rails::RailStat;

/// Everything `/metrics` shows, read at one scrape.
#[derive(Debug, Default)]
pub(crate) struct Scrape {
    /// Failover switches, `[from][to]` by `TransportKind` code.
    pub(crate) failover: [[u64; KINDS]; KINDS],
    /// Tasks that ran out of failover.
    pub(crate) exhausted: u64,
    /// Every rail of every open segment, with the segment's name.
    pub(crate) rails: Vec<(String, RailStat)>,
    /// The RDMA rails' QP slots.
    pub(crate) sq: Vec<SqRow>,
    /// The request counters.
    pub(crate) ops: OpSnapshot,
    /// The QoS figures.
    pub(crate) qos: QosSnapshot,
    /// The HTTP server's counters, when it runs.
    pub(crate) http: Option<HttpStats>,
    /// A daemon's clients (none for an engine that serves none): at most
    /// `DaemonLimits::clients`, so their series are bounded.
    pub(crate) clients: Vec<ClientSnapshot>,
}

impl Scrape {
    /// The OpenMetrics text of it all, at most `max_peers` peers with their
    /// own per-rail and per-SQ series (see `metrics/cap.rs`).
    pub(crate) fn encode(self, max_peers: usize) -> String {
        let carried = self
            .rails
            .iter()
            .map(|(s, r)| (s.as_str(), r.bytes))
            .chain(self.sq.iter().map(|r| (r.segment.as_str(), 0)));
        let kept = kept_peers(carried, max_peers);
        let rails = collapse(
            RAIL.rows(self.rails.iter().map(|(s, r)| {
                let labels = [r.transport.name(), s.as_str(), &r.local, &r.remote];
                (labels.map(str::to_owned), r)
            })),
            RAIL.segment,
            RAIL.peer_named,
            RAIL.merge(),
            &kept,
        );
        let sq = collapse(
            SQ.rows(self.sq.iter().map(|r| {
                let labels = [
                    r.segment.clone(),
                    r.local.clone(),
                    r.remote.clone(),
                    r.qp.to_string(),
                ];
                (labels, &r.report)
            })),
            SQ.segment,
            SQ.peer_named,
            SQ.merge(),
            &kept,
        );
        let exposition = Exposition {
            rails,
            sq,
            scrape: self,
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(exposition));
        let mut out = String::new();
        // Writing into a String does not fail, nor does any value handed
        // over (gauges are clamped to i64): an error is a defect here, and
        // the text so far is what there is.
        if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
            crate::lograte::warn_limited!(
                "metrics encode",
                "metrics: the exposition failed to encode; the text is cut short"
            );
        }
        out
    }
}

/// One daemon client's figures, read at one scrape (the engine's
/// `ClientScope::snapshot`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ClientSnapshot {
    pub(crate) id: u32,
    pub(crate) uid: u32,
    pub(crate) pid: u32,
    pub(crate) name: String,
    pub(crate) weight: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) bytes: u64,
    pub(crate) waits: [u64; 3],
    pub(crate) wait_ns: [u64; 3],
    pub(crate) in_flight: u64,
    pub(crate) max_in_flight: u64,
    pub(crate) regions: u64,
    pub(crate) held_bytes: u64,
    pub(crate) rings: u64,
    pub(crate) segments: u64,
}

/// A [`Scrape`] with its per-peer tables capped, as the crate's collector.
#[derive(Debug)]
struct Exposition {
    rails: Vec<Row<RAIL_FAMILIES>>,
    sq: Vec<Row<SQ_FAMILIES>>,
    scrape: Scrape,
}

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.scrape;
        encode_failover(&mut enc, s)?;
        RAIL.encode(&mut enc, &self.rails)?;
        // SQ families only where some rail is RDMA (as before the cap).
        if !self.sq.is_empty() {
            SQ.encode(&mut enc, &self.sq)?;
        }
        encode_ops(&mut enc, &s.ops)?;
        encode_qos(&mut enc, &s.qos)?;
        if let Some(h) = &s.http {
            encode_http(&mut enc, h)?;
        }
        if !s.clients.is_empty() {
            encode_clients(&mut enc, &s.clients)?;
        }
        Ok(())
    }
}

/// A label value escaped as the text format wants it (`\` `\\`, `"`
/// `\"`, newline `\n`). prometheus-client 0.24 writes label values as
/// given (its `LabelValueEncoder` passes them through), and segment and
/// NIC names come from peers' descriptors: a hostile peer could otherwise
/// end a label, or a line, and forge samples. The test
/// `the_crate_does_not_escape_label_values` says when that changes.
#[derive(Debug, Clone, Copy)]
struct Esc<'a>(&'a str);

impl EncodeLabelValue for Esc<'_> {
    fn encode(&self, e: &mut LabelValueEncoder) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            e.write_str(&rest[..i])?;
            e.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        e.write_str(rest)
    }
}

/// `N` labels: names and (escaped) values.
type Labels<'a, const N: usize> = [(&'static str, Esc<'a>); N];

/// Counter or gauge: a family's type and how its samples are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// Describe family `name` (a counter's without its `_total`, which its
/// samples get back from the encoder).
fn describe<'s>(
    enc: &'s mut DescriptorEncoder,
    name: &'s str,
    help: &str,
    kind: Kind,
) -> Result<MetricEncoder<'s>, fmt::Error> {
    let (name, ty) = match kind {
        Kind::Counter => (
            name.strip_suffix("_total").unwrap_or(name),
            MetricType::Counter,
        ),
        Kind::Gauge => (name, MetricType::Gauge),
    };
    enc.encode_descriptor(name, help, None, ty)
}

/// One sample of value `v` (gauges past `i64::MAX`, which the crate
/// refuses, read `i64::MAX`).
fn sample(m: &mut MetricEncoder, kind: Kind, v: u64) -> fmt::Result {
    match kind {
        Kind::Counter => m.encode_counter::<NoLabelSet, u64, u64>(&v, None),
        Kind::Gauge => m.encode_gauge(&i64::try_from(v).unwrap_or(i64::MAX)),
    }
}

/// A family of labelled samples (`None` values skipped).
fn family<'a, const N: usize>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: Kind,
    samples: impl IntoIterator<Item = (Labels<'a, N>, u64)>,
) -> fmt::Result {
    let mut m = describe(enc, name, help, kind)?;
    for (labels, v) in samples {
        sample(&mut m.encode_family(&labels)?, kind, v)?;
    }
    Ok(())
}

/// A family of one sample without labels.
fn single(enc: &mut DescriptorEncoder, name: &str, help: &str, kind: Kind, v: u64) -> fmt::Result {
    sample(&mut describe(enc, name, help, kind)?, kind, v)
}

/// A histogram sample from per-bucket counts (not cumulative; the qos
/// buckets, [`bucket_upper_us`], the last one `+Inf`) and their sum in ns.
fn histogram(m: &mut MetricEncoder, counts: &[u64], sum_ns: u64) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = counts
        .iter()
        .enumerate()
        .map(|(k, &c)| {
            // The crate writes an upper bound of f64::MAX as `+Inf`.
            let le = if k + 1 < counts.len() {
                bucket_upper_us(k) as f64 / 1e6
            } else {
                f64::MAX
            };
            (le, c)
        })
        .collect();
    let count = counts.iter().sum();
    m.encode_histogram::<NoLabelSet>(
        sum_ns as f64 / 1e9,
        count,
        &buckets,
        None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
    )
}

/// A per-peer table: its labels, which of them a peer names, and its
/// families, each read from a row's record `R`.
struct Table<R: 'static, const F: usize> {
    /// Label names.
    labels: [&'static str; 4],
    /// Which label is the peer's segment.
    segment: usize,
    /// The labels a peer names (collapsed to `_other` past the cap).
    peer_named: [bool; 4],
    /// The families.
    families: [Family<R>; F],
}

/// A per-peer family: sample name (a counter's ends in `_total`), type,
/// help, merge rule past the cap, and the value ([`ABSENT`]: no sample).
type Family<R> = (&'static str, Kind, &'static str, Merge, fn(&R) -> u64);

impl<R, const F: usize> Table<R, F> {
    /// Each family's merge rule.
    fn merge(&self) -> [Merge; F] {
        self.families.map(|f| f.3)
    }

    /// One row per record.
    fn rows<'r>(&self, records: impl Iterator<Item = ([String; 4], &'r R)>) -> Vec<Row<F>> {
        records
            .map(|(labels, r)| Row {
                labels,
                values: self.families.map(|f| (f.4)(r)),
            })
            .collect()
    }

    /// Every family, a sample per row that has a value.
    fn encode(&self, enc: &mut DescriptorEncoder, rows: &[Row<F>]) -> fmt::Result {
        for (i, &(name, kind, help, _, _)) in self.families.iter().enumerate() {
            let samples = rows.iter().filter(|r| r.values[i] != ABSENT).map(|r| {
                let labels: Labels<'_, 4> =
                    std::array::from_fn(|k| (self.labels[k], Esc(&r.labels[k])));
                (labels, r.values[i])
            });
            family(enc, name, help, kind, samples)?;
        }
        Ok(())
    }
}

const RAIL_FAMILIES: usize = 11;
const SQ_FAMILIES: usize = 11;

/// `tent_rail_*`: per rail to a peer.
static RAIL: Table<RailStat, RAIL_FAMILIES> = Table {
    labels: ["transport", "segment", "local", "remote"],
    segment: 1,
    peer_named: [false, true, true, true],
    families: [
        (
            "tent_rail_state",
            Kind::Gauge,
            "Rail state: 0 healthy, 1 degraded, 2 demoted, 3 paused.",
            Merge::Max,
            |r| u64::from(r.state.gauge()),
        ),
        (
            "tent_rail_up",
            Kind::Gauge,
            "Is the rail's local link up (1) or down (0).",
            Merge::Sum,
            |r| u64::from(r.up),
        ),
        (
            "tent_rail_bytes_total",
            Kind::Counter,
            "Bytes the rail has carried.",
            Merge::Sum,
            |r| r.bytes,
        ),
        (
            "tent_rail_failures_total",
            Kind::Counter,
            "Slice failures reported on the rail.",
            Merge::Sum,
            |r| r.failures,
        ),
        (
            "tent_rail_trips_total",
            Kind::Counter,
            "Times the rail was paused by its error threshold.",
            Merge::Sum,
            |r| r.trips,
        ),
        (
            "tent_rail_moved_slices_total",
            Kind::Counter,
            "Slices moved off the rail to a sibling.",
            Merge::Sum,
            |r| r.moved,
        ),
        (
            "tent_rail_inflight_slices",
            Kind::Gauge,
            "Slices on the rail now.",
            Merge::Sum,
            |r| u64::from(r.inflight),
        ),
        (
            "tent_rail_bandwidth_bytes_per_second",
            Kind::Gauge,
            "The rail's bandwidth estimate (the selector's EWMA, summed over the workers using it).",
            Merge::Sum,
            |r| r.bandwidth,
        ),
        (
            "tent_rail_inflight_bytes",
            Kind::Gauge,
            "Bytes on the rail now.",
            Merge::Sum,
            |r| r.inflight_bytes,
        ),
        (
            "tent_rail_theoretical_bytes_per_second",
            Kind::Gauge,
            "The rail's theoretical bandwidth (port speed, or default_bandwidth_gbps).",
            Merge::Sum,
            |r| r.theoretical,
        ),
        (
            "tent_rail_numa_tier",
            Kind::Gauge,
            "The rail's NUMA tier from the first worker's node (0: local); a slice ranks rails from its memory's node, the worker's breaking ties and standing in when that is unknown.",
            Merge::Max,
            |r| u64::from(r.tier),
        ),
    ],
};

/// `tent_sq_*`: per RDMA rail and QP slot.
static SQ: Table<SqReport, SQ_FAMILIES> = Table {
    labels: ["segment", "local", "remote", "qp"],
    segment: 0,
    peer_named: [true, true, true, false],
    families: [
        (
            "tent_sq_posted_wr",
            Kind::Gauge,
            "Work requests posted and not known complete.",
            Merge::Sum,
            |r| u64::from(r.posted),
        ),
        (
            "tent_sq_backlog_slices",
            Kind::Gauge,
            "Slices waiting in the endpoints' backlogs.",
            Merge::Sum,
            |r| u64::from(r.backlog),
        ),
        (
            "tent_sq_backlog_high_watermark",
            Kind::Gauge,
            "Most slices ever waiting in one endpoint's backlog.",
            Merge::Max,
            |r| u64::from(r.backlog_high),
        ),
        (
            "tent_sq_cqes_total",
            Kind::Counter,
            "Completions reaped.",
            Merge::Sum,
            |r| r.cqes,
        ),
        (
            "tent_sq_last_cqe_age_us",
            Kind::Gauge,
            "Microseconds since the last completion (absent: none yet).",
            Merge::Min,
            |r| r.last_cqe_us_ago.unwrap_or(ABSENT),
        ),
        (
            "tent_sq_full_refusals_total",
            Kind::Counter,
            "Slices refused because an endpoint's backlog was full (back-pressure).",
            Merge::Sum,
            |r| r.full_refusals,
        ),
        (
            "tent_sq_stalls_total",
            Kind::Counter,
            "Times an endpoint went sq_backoff_timeout_us with requests posted and no completion.",
            Merge::Sum,
            |r| r.stalls,
        ),
        (
            "tent_sq_admission_waits_total",
            Kind::Counter,
            "Admission waits that slept.",
            Merge::Sum,
            |r| r.admission_waits,
        ),
        (
            "tent_sq_admission_timeouts_total",
            Kind::Counter,
            "Admission waits that timed out.",
            Merge::Sum,
            |r| r.admission_timeouts,
        ),
        (
            "tent_sq_least_loaded_selections_total",
            Kind::Counter,
            "Admissions the least_loaded split policy charged to the rail's endpoints.",
            Merge::Sum,
            |r| r.least_loaded,
        ),
        (
            "tent_sq_queued_wr_high_watermark",
            Kind::Gauge,
            "Most requests admitted and not yet posted at once.",
            Merge::Max,
            |r| u64::from(r.queued_high),
        ),
    ],
};

/// The name of transport code `t` (`unknown` for a code with none).
fn transport_name(t: usize) -> &'static str {
    u8::try_from(t)
        .ok()
        .and_then(TransportKind::from_u8)
        .map_or("unknown", |k| k.name())
}

/// `tent_transport_failover_total{from,to}` for every pair of real
/// transports, at 0 from the start (a series that appears only at its
/// first count hides the first increase), and any other pair once
/// counted; `tent_task_failover_exhausted_total`.
fn encode_failover(enc: &mut DescriptorEncoder, s: &Scrape) -> fmt::Result {
    let any = TransportKind::Any as usize;
    let pairs = s.failover.iter().enumerate().flat_map(|(f, row)| {
        row.iter()
            .enumerate()
            .filter(move |&(t, &n)| n != 0 || (f != t && f != any && t != any))
            .map(move |(t, &n)| {
                let labels: Labels<'_, 2> = [
                    ("from", Esc(transport_name(f))),
                    ("to", Esc(transport_name(t))),
                ];
                (labels, n)
            })
    });
    family(
        enc,
        "tent_transport_failover_total",
        "Tasks moved from one transport to the next after a transient failure.",
        Kind::Counter,
        pairs,
    )?;
    single(
        enc,
        "tent_task_failover_exhausted_total",
        "Tasks failed after every transport allowed had failed.",
        Kind::Counter,
        s.exhausted,
    )
}

/// The request counters (TENT's names):
/// `tent_{read,write}_{requests,bytes,failures}_total{transport}` for
/// every real transport, and requests and failures also under `none` for
/// those refused at intake (requests: completed, failed included; bytes: of
/// those that succeeded), and `tent_request_duration_seconds`, each
/// request's time from intake to completion by transport and priority
/// (only the pairs that served a request), and
/// `tent_request_stage_seconds`, that time split in its `Stage`s.
fn encode_ops(enc: &mut DescriptorEncoder, s: &OpSnapshot) -> fmt::Result {
    // Slot 0 is `none`: refused at intake, before any transport.
    let label = |t: usize| if t == 0 { "none" } else { transport_name(t) };
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
            let first = if what == "bytes" { 1 } else { 0 };
            let samples = (first..TRANSPORTS).map(|t| {
                let labels: Labels<'_, 1> = [("transport", Esc(label(t)))];
                (labels, get(s, o, t))
            });
            family(
                enc,
                &format!("tent_{op}_{what}_total"),
                &format!("{help}, {}s, by transport.", op.to_uppercase()),
                Kind::Counter,
                samples,
            )?;
        }
    }
    let mut m = enc.encode_descriptor(
        "tent_request_duration_seconds",
        "A request's time from intake to its completion, by transport and priority (done at intake: 0).",
        None,
        MetricType::Histogram,
    )?;
    for t in 1..TRANSPORTS {
        for p in Priority::ALL {
            let labels: Labels<'_, 2> = [
                ("transport", Esc(transport_name(t))),
                ("priority", Esc(priority_name(p))),
            ];
            let (counts, sum) = (&s.latency[t][p.index()], s.latency_sum_ns[t][p.index()]);
            served_histogram(&mut m, &labels, counts, sum)?;
        }
    }
    let mut m = enc.encode_descriptor(
        "tent_request_stage_seconds",
        "A request's time in each stage, by transport and priority: queue (intake to its first slice handed to a transport), dispatch (first slice to last), transport (last slice to completion); the three add up to tent_request_duration_seconds. Requests that failed before handing over a slice are not counted.",
        None,
        MetricType::Histogram,
    )?;
    for stage in Stage::ALL {
        let g = stage as usize;
        for t in 1..TRANSPORTS {
            for p in Priority::ALL {
                let labels: Labels<'_, 3> = [
                    ("stage", Esc(stage.name())),
                    ("transport", Esc(transport_name(t))),
                    ("priority", Esc(priority_name(p))),
                ];
                let (counts, sum) = (&s.stage[g][t][p.index()], s.stage_sum_ns[g][t][p.index()]);
                served_histogram(&mut m, &labels, counts, sum)?;
            }
        }
    }
    Ok(())
}

/// One series of a histogram family with `labels`; nothing for a series
/// with no count (only the pairs that served a request show).
fn served_histogram<const N: usize>(
    m: &mut MetricEncoder,
    labels: &Labels<'_, N>,
    counts: &[u64],
    sum_ns: u64,
) -> fmt::Result {
    if counts.iter().all(|&c| c == 0) {
        return Ok(());
    }
    histogram(&mut m.encode_family(labels)?, counts, sum_ns)
}

/// Seed 001's per-priority figures: lane depth, accepted, promotions,
/// slot-gate holds, the queue-wait histogram, and the shared slot clock
/// when one is configured.
fn encode_qos(enc: &mut DescriptorEncoder, q: &QosSnapshot) -> fmt::Result {
    type Field = fn(&LevelSnapshot) -> u64;
    let families: [(&str, Kind, &str, Field); 4] = [
        (
            "tent_qos_queued_tasks",
            Kind::Gauge,
            "Tasks waiting in the workers' lane of this priority.",
            |l| l.queued,
        ),
        (
            "tent_qos_accepted_total",
            Kind::Counter,
            "Tasks accepted at this priority.",
            |l| l.accepted,
        ),
        (
            "tent_qos_promoted_total",
            Kind::Counter,
            "Tasks promoted out of this priority's lane after priority_promotion_timeout_us.",
            |l| l.promoted,
        ),
        (
            "tent_qos_gate_holds_total",
            Kind::Counter,
            "Times this priority's lane, with work, found the shared time slot closed to it.",
            |l| l.gate_holds,
        ),
    ];
    for (name, kind, help, get) in families {
        let samples = Priority::ALL.into_iter().map(|p| {
            let labels: Labels<'_, 1> = [("priority", Esc(priority_name(p)))];
            (labels, get(q.level(p)))
        });
        family(enc, name, help, kind, samples)?;
    }
    let mut m = enc.encode_descriptor(
        "tent_qos_wait_seconds",
        "Queue wait of a task, by submitted priority: intake to its first slice handed to a transport.",
        None,
        MetricType::Histogram,
    )?;
    for p in Priority::ALL {
        let l = q.level(p);
        let labels: Labels<'_, 1> = [("priority", Esc(priority_name(p)))];
        histogram(&mut m.encode_family(&labels)?, &l.wait, l.wait_sum_ns)?;
    }
    if let Some(s) = q.slots {
        single(
            enc,
            "tent_qos_slot",
            "The shared time slot now (0: HIGH only, 1: HIGH and MEDIUM, 2: all).",
            Kind::Gauge,
            u64::from(s.slot),
        )?;
        single(
            enc,
            "tent_qos_slot_owner",
            "Does this engine rotate the shared slot clock (1) or watch it (0).",
            Kind::Gauge,
            u64::from(s.owner),
        )?;
        single(
            enc,
            "tent_qos_slot_takeovers_total",
            "Times a participant took the slot clock over from a silent owner.",
            Kind::Counter,
            s.takeovers,
        )?;
    }
    Ok(())
}

/// The HTTP server's own counters (`src/http`).
fn encode_http(enc: &mut DescriptorEncoder, h: &HttpStats) -> fmt::Result {
    single(
        enc,
        "tent_http_connections_accepted_total",
        "Connections the HTTP endpoint accepted.",
        Kind::Counter,
        h.accepted,
    )?;
    single(
        enc,
        "tent_http_connections_evicted_total",
        "Connections closed at the connection cap (64) for a newcomer: the oldest one not being answered, or the newcomer when every one is.",
        Kind::Counter,
        h.evicted,
    )?;
    single(
        enc,
        "tent_http_connections_timed_out_total",
        "Connections closed at their 2 s deadline before their response was out.",
        Kind::Counter,
        h.timed_out,
    )?;
    let refused = [
        ("bad_request", h.bad_request),
        ("too_large", h.too_large),
        ("unauthorized", h.unauthorized),
    ];
    family(
        enc,
        "tent_http_requests_refused_total",
        "Requests the server refused before any route: bad_request (malformed, 400; a method other than GET and HEAD, 405), too_large (a body, 413; a long target, 414; a large head, 431), unauthorized (bearer missing or wrong, 401).",
        Kind::Counter,
        refused.map(|(reason, n)| ([("reason", Esc(reason))], n)),
    )?;
    let classes = ["1xx", "2xx", "3xx", "4xx", "5xx"];
    family(
        enc,
        "tent_http_responses_total",
        "Responses the HTTP endpoint wrote out in full, by status class.",
        Kind::Counter,
        classes
            .into_iter()
            .zip(h.by_class)
            .map(|(class, n)| ([("class", Esc(class))], n)),
    )
}

/// A daemon's figures by client: what its ops did, how long they waited
/// per priority, what it holds against its quotas. Labelled by the
/// daemon's client id, the process's uid and pid, and the name it gave.
fn encode_clients(enc: &mut DescriptorEncoder, clients: &[ClientSnapshot]) -> fmt::Result {
    let ids: Vec<[String; 3]> = clients
        .iter()
        .map(|c| [c.id.to_string(), c.uid.to_string(), c.pid.to_string()])
        .collect();
    let who = |i: usize| {
        let [c, u, p] = &ids[i];
        [
            ("client", Esc(c)),
            ("uid", Esc(u)),
            ("pid", Esc(p)),
            ("name", Esc(&clients[i].name)),
        ]
    };
    let with = |i: usize, k: &'static str, v: &'static str| {
        let [a, b, c, d] = who(i);
        [a, b, c, d, (k, Esc(v))]
    };
    family(
        enc,
        "tent_client_ops_total",
        "A daemon client's ops that ended, by result (completed, failed).",
        Kind::Counter,
        clients.iter().enumerate().flat_map(|(i, c)| {
            [
                (with(i, "result", "completed"), c.completed),
                (with(i, "result", "failed"), c.failed),
            ]
        }),
    )?;
    family(
        enc,
        "tent_client_bytes_total",
        "Bytes a daemon client's completed ops moved.",
        Kind::Counter,
        clients.iter().enumerate().map(|(i, c)| (who(i), c.bytes)),
    )?;
    let prio = [Priority::High, Priority::Medium, Priority::Low];
    family(
        enc,
        "tent_client_queue_waits_total",
        "A daemon client's ops whose first slice went out, by priority.",
        Kind::Counter,
        clients.iter().enumerate().flat_map(|(i, c)| {
            prio.map(|p| (with(i, "priority", priority_name(p)), c.waits[p.index()]))
        }),
    )?;
    family(
        enc,
        "tent_client_queue_wait_microseconds_total",
        "Microseconds a daemon client's ops waited from intake to their first slice, by priority (over tent_client_queue_waits_total: the mean).",
        Kind::Counter,
        clients.iter().enumerate().flat_map(|(i, c)| {
            prio.map(|p| {
                (
                    with(i, "priority", priority_name(p)),
                    c.wait_ns[p.index()] / 1_000,
                )
            })
        }),
    )?;
    family(
        enc,
        "tent_client_weight",
        "A daemon client's weight in its share of work within a priority (tentd --weight).",
        Kind::Gauge,
        clients.iter().enumerate().map(|(i, c)| (who(i), c.weight)),
    )?;
    family(
        enc,
        "tent_client_in_flight",
        "A daemon client's ops the workers hold now (taken from its rings, not completed).",
        Kind::Gauge,
        clients.iter().enumerate().map(|(i, c)| (who(i), c.in_flight)),
    )?;
    family(
        enc,
        "tent_client_held",
        "What a daemon client holds against its quota, by what (regions, bytes, rings, segments, in_flight_limit: its quota of ops in flight).",
        Kind::Gauge,
        clients.iter().enumerate().flat_map(|(i, c)| {
            [
                (with(i, "what", "regions"), c.regions),
                (with(i, "what", "bytes"), c.held_bytes),
                (with(i, "what", "rings"), c.rings),
                (with(i, "what", "segments"), c.segments),
                (with(i, "what", "in_flight_limit"), c.max_in_flight),
            ]
        }),
    )
}

#[cfg(test)]
mod tests;
