//! Read-only introspection: the config, this engine's names and
//! addresses, metrics, rails, QoS, credits and counters; and, with the
//! `testing` feature, `swap_transport` (the test hook on the transport
//! slots) and the shm export.

use std::sync::atomic::Ordering;

use tent_rings::TransportKind;

use super::Engine;
use crate::config::Config;
use crate::flow::SqController;
use crate::transport::shm::ShmExport;
use crate::transport::tcp::DataServer;

impl Engine {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// This engine's shm export (tests forge descriptors through it).
    #[cfg(any(test, feature = "testing"))]
    pub fn shm_export(&self) -> Option<&ShmExport> {
        self.export.as_deref()
    }

    /// The name of this engine's shared-memory segment (`None` with shm
    /// off): a peer on this host may open it directly.
    pub fn local_segment_name(&self) -> Option<&str> {
        self.export.as_deref().map(ShmExport::name)
    }

    /// Where this engine's TCP data server listens (`None` with tcp off).
    pub fn tcp_data_addr(&self) -> Option<std::net::SocketAddr> {
        self.data.as_ref().map(DataServer::local_addr)
    }

    /// This engine's p2p segment name, `ip:port` of its control server
    /// (TENT's segment naming): what peers pass to `open_segment`.
    pub fn segment_name(&self) -> String {
        if let Some(Some(name)) = crate::control::directory::published_name(&self.shared.config) {
            return name;
        }
        match &self.control {
            Some(c) => c.local_addr().to_string(),
            None => self.local_segment_name().unwrap_or("local").to_owned(),
        }
    }

    /// Replace the transport in `kind`'s slot (tests wrap transports with
    /// fault injection this way); returns the previous one. `t` is not
    /// installed again; one with per-worker state serves the engine that
    /// installed it or else whose worker first uses it, and refuses the
    /// others' slices with `InvalidArgument`.
    #[cfg(any(test, feature = "testing"))]
    pub fn swap_transport(
        &self,
        kind: TransportKind,
        t: Option<std::sync::Arc<dyn crate::transport::Transport>>,
    ) -> Option<std::sync::Arc<dyn crate::transport::Transport>> {
        self.shared.transports.swap(t, kind)
    }

    /// Failover counters.
    #[cfg(any(test, feature = "testing"))]
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.shared.metrics
    }

    /// Every rail of every open segment (RDMA and TCP), with the segment's
    /// name.
    pub fn all_rails(&self) -> Vec<(String, crate::transport::RailStat)> {
        self.observer.all_rails()
    }

    /// Every RDMA rail's send- and completion-queue counters (seed 004's
    /// SQ/CQE diagnostics), a row per QP slot of the rail
    /// (`qp_per_transfer`), every worker's endpoint there together.
    pub fn sq_rows(&self) -> Vec<crate::flow::SqRow> {
        self.observer.sq_rows()
    }

    /// Every metric `/metrics` serves, as OpenMetrics text (ending in
    /// `# EOF`): failover counters, per-rail and per-SQ series (at most
    /// `metrics/max_labelled_peers` peers with their own, the rest summed
    /// under `segment="_other"`), request counters and latencies, QoS
    /// figures, and the HTTP server's counters when it runs.
    pub fn metrics_text(&self) -> String {
        self.observer.metrics_text()
    }

    /// Per-priority statistics summed over the workers (seed 001): lane
    /// depths, tasks accepted, promotions, slot-gate holds, queue-wait
    /// histograms, and the shared slot clock when one is configured.
    pub fn qos_stats(&self) -> crate::qos::QosSnapshot {
        self.observer.qos_stats()
    }

    /// The shared slot clock this engine follows (`None`: single-process
    /// mode, `shared_quota_shm_path` empty).
    #[cfg(any(test, feature = "testing"))]
    pub fn slot_clock(&self) -> Option<&std::sync::Arc<crate::qos::SlotClock>> {
        self.slots.as_ref().map(crate::qos::SlotRotator::clock)
    }

    /// This host as the engine sees and uses it (what `/topology`
    /// serves): NUMA nodes and their CPUs; each RDMA NIC's NUMA node, PCI
    /// address, port state, speed and the GID in use with why; where each
    /// worker runs and why. Reads each NIC's port and GID table now.
    pub fn topology_report(&self) -> crate::engine::TopologyReport {
        self.observer.topology_report()
    }

    /// The RDMA and TCP rails this engine would form to the peer
    /// `segment`, from its descriptor (fetched with this engine's secret
    /// within `timeout`), with why there are none when there are none.
    /// Connects no QP and no TCP connection (the TCP rails' local ends are
    /// the routing table's, as the TCP transport asks it). An error when
    /// the descriptor cannot be fetched.
    pub fn planned_rails(
        &self,
        segment: &str,
        timeout: std::time::Duration,
    ) -> crate::Result<crate::engine::topology_report::RailsTo> {
        let desc = crate::control::fetch_descriptor(segment, self.shared.config.secret(), timeout)?;
        let ours: Vec<_> = self.shared.rdma.as_ref().map_or_else(Vec::new, |set| {
            set.nics()
                .iter()
                .map(|n| (n.ctx.name().to_owned(), n.gid()))
                .collect()
        });
        let mut rails = super::topology_report::planned_rails(segment, &ours, &desc.nics);
        let tcp = tent_rings::TransportKind::Tcp;
        (rails.tcp, rails.tcp_note) = super::topology_report::planned_tcp_rails(
            self.shared.transports.slot(tcp).load().is_some(),
            desc.transports.contains(&(tcp as u8)),
            &desc.rails,
            crate::transport::tcp::route_to,
        );
        Ok(rails)
    }

    /// Where the HTTP endpoint listens (`http://ip:port`; `None` with
    /// `metrics/http_enable` off): `/metrics`, `/metrics/json`, `/health`,
    /// `/health/live`, `/health/ready` and `/topology`.
    pub fn http_url(&self) -> Option<&str> {
        self.observer.http_url()
    }

    /// The bearer token the HTTP endpoint requires on every path but
    /// `/health/live` when `rpc_shared_secret` is set (`None` without a
    /// secret): what a Prometheus scrape config's `authorization:
    /// credentials:` takes. It is derived from the secret, so every engine
    /// sharing the secret takes the same token.
    pub fn http_bearer_token(&self) -> Option<String> {
        self.shared
            .config
            .secret()
            .map(|s| crate::http::Bearer::from_secret(s).token().to_owned())
    }

    /// Installed transports.
    pub fn transports(&self) -> Vec<TransportKind> {
        self.observer.transports()
    }

    /// Flow-control credits taken and not given back (0 when idle): every
    /// worker's window on each transport, plus every TCP connection's wire
    /// window (a TCP slice on the wire holds one in each).
    pub fn credits_in_flight(&self) -> u32 {
        let workers: u32 = self
            .workers
            .iter()
            .flat_map(|w| w.credits.iter())
            .map(SqController::posted)
            .sum();
        let tcp = self.shared.tcp.as_ref().map_or(0, |t| t.wire_in_flight());
        workers + tcp
    }

    /// The core each worker is pinned to (`None`: not pinned).
    pub fn worker_cores(&self) -> Vec<Option<usize>> {
        self.workers
            .iter()
            .map(|w| usize::try_from(w.core.load(Ordering::Relaxed)).ok())
            .collect()
    }

    /// Operations and bytes completed successfully so far.
    pub fn completed(&self) -> (u64, u64) {
        self.observer.op_stats().completed()
    }

    /// Of [`completed`](Self::completed)'s ops, how many completed at
    /// intake, with no task (a small op on a synchronous transport with
    /// nothing ready queued ahead of it: see `docs/ARCHITECTURE.md`).
    pub fn completed_inline(&self) -> u64 {
        self.observer.op_stats().inline
    }

    /// Seed 003's traffic statistics: every rail of every open segment
    /// with the bytes it carried, its bandwidth estimate and what is on it
    /// now (`Display` prints `=== Device Traffic Statistics ===`).
    pub fn traffic_stats(&self) -> crate::transport::rails::TrafficStats {
        crate::transport::rails::TrafficStats {
            rails: self.all_rails(),
        }
    }
}
