//! What an engine says about itself, readable from any thread without the
//! [`Engine`](super::Engine): the application's calls and the HTTP
//! endpoint's thread both ask the [`Observer`]. Everything it reports is
//! read from the shared state's atomics and snapshots; nothing here waits on
//! a worker or takes a lock a worker takes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tent_rings::TransportKind;

use super::EngineShared;
use super::client_scope::ClientRegistry;
use super::segments::NETWORK;
use super::topology_report::{self, TopologyReport};
use super::worker::WorkerShared;
use crate::http::HttpCounters;
use crate::metrics::ops::OpSnapshot;
use crate::metrics::{ClientSnapshot, Scrape};
use crate::qos::{QosSnapshot, SlotClock, SlotSnapshot};
use crate::segment::Segment;
use crate::topology::Topology;
use crate::transport::RailStat;

/// This engine's view of itself (see the module doc).
pub(crate) struct Observer {
    shared: Arc<EngineShared>,
    workers: Vec<Arc<WorkerShared>>,
    slots: Option<Arc<SlotClock>>,
    topology: Topology,
    /// `ip:port` of the control server (what peers open), when there is one.
    segment: Option<String>,
    /// Set when the engine starts tearing down: no longer ready.
    stopping: AtomicBool,
    /// The HTTP endpoint's URL, once it listens (the descriptor reads the
    /// same cell).
    http_url: Arc<OnceLock<String>>,
    /// The NICs' facts as last read, and when (never taken by a worker).
    nic_facts: parking_lot::Mutex<Option<(std::time::Instant, Vec<topology_report::NicFacts>)>>,
    /// The HTTP server's counters, when it runs (its thread writes them).
    http: Option<Arc<HttpCounters>>,
    /// A daemon's clients, reported by client.
    clients: ClientRegistry,
}

/// How long the NICs' facts in a topology report are reused.
const NIC_FACTS_FOR: std::time::Duration = std::time::Duration::from_secs(1);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("workers", &self.workers.len())
            .field("segment", &self.segment)
            .finish_non_exhaustive()
    }
}

/// Whether the engine serves, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// Every worker runs, a transport is installed, and the engine is not
    /// stopping.
    pub(crate) ready: bool,
    /// What keeps it from being ready (empty when ready).
    pub(crate) reasons: Vec<String>,
}

impl Observer {
    pub(crate) fn new(
        shared: Arc<EngineShared>,
        workers: Vec<Arc<WorkerShared>>,
        slots: Option<Arc<SlotClock>>,
        topology: Topology,
        segment: Option<String>,
        http_url: Arc<OnceLock<String>>,
        http: Option<Arc<HttpCounters>>,
    ) -> Observer {
        Observer {
            shared,
            workers,
            slots,
            topology,
            segment,
            stopping: AtomicBool::new(false),
            http_url,
            nic_facts: parking_lot::Mutex::new(None),
            http,
            clients: ClientRegistry::default(),
        }
    }

    /// The engine starts tearing down.
    pub(crate) fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// The HTTP endpoint's URL (`None`: off, or not started).
    pub(crate) fn http_url(&self) -> Option<&str> {
        self.http_url.get().map(String::as_str)
    }

    /// The rails every network transport has to `segment`, best first.
    pub(crate) fn rails_of(&self, segment: &Segment) -> Vec<RailStat> {
        NETWORK
            .iter()
            .filter_map(|&k| self.shared.transports.slot(k).load_full())
            .flat_map(|t| t.transport.rail_stats(segment))
            .collect()
    }

    /// Every rail of every open segment, with the segment's name.
    pub(crate) fn all_rails(&self) -> Vec<(String, RailStat)> {
        let segments = self.shared.segments.load();
        segments
            .iter()
            .flat_map(|s| {
                self.rails_of(s)
                    .into_iter()
                    .map(|r| (s.name().to_owned(), r))
            })
            .collect()
    }

    /// Every RDMA rail's SQ/CQE rows (seed 004).
    pub(crate) fn sq_rows(&self) -> Vec<crate::flow::SqRow> {
        self.shared
            .segments
            .load()
            .iter()
            .filter_map(|s| crate::transport::rdma::transport::peer_of(s))
            .flat_map(|p| p.sq_reports())
            .collect()
    }

    /// Per-priority statistics summed over the workers, and the slot clock.
    pub(crate) fn qos_stats(&self) -> QosSnapshot {
        // Ops issued inline count as served at intake, on their ring.
        let mut q = self.shared.inline.qos_stats();
        for w in &self.workers {
            w.qos.sum_into(&mut q);
        }
        q.slots = self.slots.as_ref().map(|c| SlotSnapshot {
            slot: c.slot(),
            owner: c.is_owner(),
            takeovers: c.takeovers(),
        });
        q
    }

    /// Every worker's request counters summed, with the ops rings issued
    /// inline.
    pub(crate) fn op_stats(&self) -> OpSnapshot {
        let mut s = self.shared.inline.op_stats();
        for w in &self.workers {
            w.ops.sum_into(&mut s);
        }
        s
    }

    /// The metrics as OpenMetrics text: every figure read now, the
    /// per-peer series bounded by `metrics/max_labelled_peers`.
    pub(crate) fn metrics_text(&self) -> String {
        let m = &self.shared.metrics;
        let scrape = Scrape {
            failover: m.failover_counts(),
            exhausted: m.exhausted_total(),
            rails: self.all_rails(),
            sq: self.sq_rows(),
            ops: self.op_stats(),
            qos: self.qos_stats(),
            http: self.http.as_ref().map(|c| c.snapshot()),
            clients: self.clients.snapshot(),
        };
        let cap = self.shared.config.metrics.max_labelled_peers;
        scrape.encode(usize::try_from(cap).unwrap_or(usize::MAX))
    }

    /// Installed transports.
    pub(crate) fn transports(&self) -> Vec<TransportKind> {
        self.shared.transports.installed()
    }

    /// Is the engine alive: has any worker not exited (a worker that
    /// panicked counts as exited)?
    pub(crate) fn live(&self) -> bool {
        self.workers
            .iter()
            .any(|w| !w.exited.load(Ordering::Acquire))
    }

    /// Is the engine ready to serve, and if not, why?
    pub(crate) fn readiness(&self) -> Readiness {
        let mut reasons = Vec::new();
        if self.stopping.load(Ordering::Acquire) {
            reasons.push("the engine is stopping".to_owned());
        }
        let exited = self
            .workers
            .iter()
            .filter(|w| w.exited.load(Ordering::Acquire))
            .count();
        if exited > 0 {
            reasons.push(format!(
                "{exited} of {} workers have exited",
                self.workers.len()
            ));
        }
        if self.transports().is_empty() {
            reasons.push("no transport is installed".to_owned());
        }
        Readiness {
            ready: reasons.is_empty(),
            reasons,
        }
    }

    /// `/health`'s document: readiness, the engine, its peers and rails.
    pub(crate) fn health_json(&self) -> Value {
        let r = self.readiness();
        let workers_alive = self
            .workers
            .iter()
            .filter(|w| !w.exited.load(Ordering::Acquire))
            .count();
        let segments = self.shared.segments.load();
        let peers: Vec<Value> = segments
            .iter()
            .filter(|s| s.id() != tent_rings::SegmentId::LOCAL)
            .map(|s| {
                let rails: Vec<Value> = self.rails_of(s).iter().map(rail_json).collect();
                json!({
                    "segment": s.name(),
                    "kind": s.kind().name(),
                    "incarnation": s.incarnation().map(|i| format!("{i:016x}")),
                    "state": s.peer_state().name(),
                    "control": s.control(),
                    "rails": rails,
                })
            })
            .collect();
        json!({
            "status": if r.ready { "ready" } else { "not_ready" },
            "live": self.live(),
            "ready": r.ready,
            "reasons": r.reasons,
            "engine": {
                "segment": self.segment,
                "incarnation": format!("{:016x}", self.shared.incarnation.get()),
                "workers": { "count": self.workers.len(), "alive": workers_alive },
                "transports": self.transports().iter().map(|k| k.name()).collect::<Vec<_>>(),
                "config_generation": self.shared.live.generation(),
                "config_source": self.shared.config.source,
                "metrics_url": self.http_url(),
            },
            "peers": peers,
            "clients": self.clients.snapshot().iter().map(client_json).collect::<Vec<_>>(),
        })
    }

    /// The daemon clients reported by client (`/metrics`, `/health`).
    pub(crate) fn clients(&self) -> &ClientRegistry {
        &self.clients
    }

    /// `/topology`'s document: the [`TopologyReport`] as JSON.
    pub(crate) fn topology_json(&self) -> Value {
        serde_json::to_value(self.topology_report())
            .unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }

    /// This host as the engine sees and uses it: NUMA nodes and their
    /// CPUs, the RDMA NICs (where they sit, their port, the GID in use and
    /// why), where the workers run and why. Reads each NIC's port and GID
    /// table now.
    /// What each RDMA NIC says of itself (port, GID table, PCI address),
    /// read at most once per [`NIC_FACTS_FOR`]: each read is a port query
    /// and a GID table walk per NIC (a firmware command on some NICs), and
    /// `/topology` may be asked in a loop by anyone reaching the endpoint.
    fn nic_facts(&self) -> Vec<topology_report::NicFacts> {
        let Some(set) = self.shared.rdma.as_ref() else {
            return Vec::new();
        };
        let mut cached = self.nic_facts.lock();
        let now = std::time::Instant::now();
        if let Some((at, facts)) = cached.as_ref()
            && now.duration_since(*at) < NIC_FACTS_FOR
        {
            return facts.clone();
        }
        let sysfs = crate::transport::rails::Sysfs::default();
        let facts: Vec<_> = set
            .nics()
            .iter()
            .map(|n| topology_report::nic_facts(n, &sysfs))
            .collect();
        *cached = Some((now, facts.clone()));
        facts
    }

    pub(crate) fn topology_report(&self) -> TopologyReport {
        let numa_nodes = topology_report::node_reports(&self.topology);
        let facts = self.nic_facts();
        let cores: Vec<Option<usize>> = self
            .workers
            .iter()
            .map(|w| usize::try_from(w.core.load(Ordering::Relaxed)).ok())
            .collect();
        let near: Vec<(String, Option<u32>)> = facts
            .iter()
            .map(|f| (f.name.clone(), f.numa_node))
            .collect();
        let w = &self.shared.config.workers;
        TopologyReport {
            numa_nodes,
            rdma_nics: facts.iter().map(topology_report::nic_report).collect(),
            workers: topology_report::worker_reports(
                w.pin,
                &w.cores,
                &near,
                &self.topology,
                &cores,
            ),
            transports: self
                .transports()
                .iter()
                .map(|k| k.name().to_owned())
                .collect(),
            rails_to: None,
        }
    }
}

/// One rail as `/health` shows it.
fn rail_json(r: &RailStat) -> Value {
    json!({
        "transport": r.transport.name(),
        "local": r.local,
        "remote": r.remote,
        "state": r.state.name(),
        "up": r.up,
        "bytes": r.bytes,
        "failures": r.failures,
        "inflight_slices": r.inflight,
    })
}

/// One daemon client in `/health`: who, what its ops did, what it holds.
fn client_json(c: &ClientSnapshot) -> Value {
    let wait_us = |i: usize| c.wait_ns[i].checked_div(c.waits[i]).unwrap_or(0) / 1_000;
    json!({
        "client": c.id,
        "uid": c.uid,
        "pid": c.pid,
        "name": c.name,
        "weight": c.weight,
        "ops": { "completed": c.completed, "failed": c.failed, "bytes": c.bytes },
        "mean_queue_wait_us": { "high": wait_us(0), "medium": wait_us(1), "low": wait_us(2) },
        "held": {
            "regions": c.regions,
            "bytes": c.held_bytes,
            "rings": c.rings,
            "segments": c.segments,
            "in_flight": c.in_flight,
            "in_flight_limit": c.max_in_flight,
        },
    })
}
