//! Read-only introspection: the config, this engine's names and
//! addresses, metrics, rails, QoS, credits and counters; and, with the
//! `testing` feature, `swap_transport` (the test hook on the transport
//! slots) and the shm export.

use std::sync::atomic::Ordering;

use tent_rings::TransportKind;

use super::Embedded;
use crate::config::Config;
use crate::flow::SqController;
use crate::transport::shm::ShmExport;
use crate::transport::tcp::DataServer;

impl Embedded {
    /// The daemon clients its reports break down by (`/metrics`,
    /// `/health`).
    pub(crate) fn clients(&self) -> &super::client_scope::ClientRegistry {
        self.observer.clients()
    }

    pub(crate) fn config(&self) -> &Config {
        &self.shared.config
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn shm_export(&self) -> Option<&ShmExport> {
        self.export.as_deref()
    }

    pub(crate) fn local_segment_name(&self) -> Option<&str> {
        self.export.as_deref().map(ShmExport::name)
    }

    pub(crate) fn tcp_data_addr(&self) -> Option<std::net::SocketAddr> {
        self.data.as_ref().map(DataServer::local_addr)
    }

    pub(crate) fn segment_name(&self) -> String {
        if let Some(Some(name)) = crate::control::directory::published_name(&self.shared.config) {
            return name;
        }
        match &self.control {
            Some(c) => c.local_addr().to_string(),
            None => self.local_segment_name().unwrap_or("local").to_owned(),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn swap_transport(
        &self,
        kind: TransportKind,
        t: Option<std::sync::Arc<dyn crate::transport::Transport>>,
    ) -> Option<std::sync::Arc<dyn crate::transport::Transport>> {
        self.shared.transports.swap(t, kind)
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.shared.metrics
    }

    pub(crate) fn all_rails(&self) -> Vec<(String, crate::transport::RailStat)> {
        self.observer.all_rails()
    }

    pub(crate) fn sq_rows(&self) -> Vec<crate::flow::SqRow> {
        self.observer.sq_rows()
    }

    pub(crate) fn metrics_text(&self) -> String {
        self.observer.metrics_text()
    }

    pub(crate) fn qos_stats(&self) -> crate::qos::QosSnapshot {
        self.observer.qos_stats()
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn slot_clock(&self) -> Option<&std::sync::Arc<crate::qos::SlotClock>> {
        self.slots.as_ref().map(crate::qos::SlotRotator::clock)
    }

    pub(crate) fn topology_report(&self) -> crate::engine::TopologyReport {
        self.observer.topology_report()
    }

    pub(crate) fn planned_rails(
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

    pub(crate) fn http_url(&self) -> Option<&str> {
        self.observer.http_url()
    }

    pub(crate) fn http_bearer_token(&self) -> Option<String> {
        self.shared
            .config
            .secret()
            .map(|s| crate::http::Bearer::from_secret(s).token().to_owned())
    }

    pub(crate) fn transports(&self) -> Vec<TransportKind> {
        self.observer.transports()
    }

    pub(crate) fn credits_in_flight(&self) -> u32 {
        let workers: u32 = self
            .workers
            .iter()
            .flat_map(|w| w.credits.iter())
            .map(SqController::posted)
            .sum();
        let tcp = self.shared.tcp.as_ref().map_or(0, |t| t.wire_in_flight());
        workers + tcp
    }

    pub(crate) fn worker_cores(&self) -> Vec<Option<usize>> {
        self.workers
            .iter()
            .map(|w| usize::try_from(w.core.load(Ordering::Relaxed)).ok())
            .collect()
    }

    pub(crate) fn completed(&self) -> (u64, u64) {
        self.observer.op_stats().completed()
    }

    pub(crate) fn completed_inline(&self) -> u64 {
        self.observer.op_stats().inline
    }

    pub(crate) fn traffic_stats(&self) -> crate::transport::rails::TrafficStats {
        crate::transport::rails::TrafficStats {
            rails: self.all_rails(),
        }
    }
}
