//! `TrafficStats`: seed 003's per-device traffic report.
//!
//! TENT's `printTrafficStats` prints one line per device; here a device is
//! a rail (local device → remote device) of an open segment, so the same
//! local NIC appears once per peer it carries traffic to:
//!
//! ```text
//! === Device Traffic Statistics ===
//! Dev 0: Total=268435456 bytes, EWMA BW=0.98 Gbps, Inflight=0 bytes (tcp veth0 -> b0@10.77.1.2:4001, segment 10.77.1.2:4000, tier 0, healthy)
//! ```

use std::fmt;

use super::RailStat;

/// Every rail of every open segment, as [`crate::Engine::traffic_stats`]
/// found them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrafficStats {
    /// (segment name, rail).
    pub rails: Vec<(String, RailStat)>,
}

impl TrafficStats {
    /// Bytes every rail carried together.
    pub fn total_bytes(&self) -> u64 {
        self.rails.iter().map(|(_, r)| r.bytes).sum()
    }
}

impl fmt::Display for TrafficStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "=== Device Traffic Statistics ===")?;
        for (i, (segment, r)) in self.rails.iter().enumerate() {
            writeln!(
                f,
                "Dev {i}: Total={} bytes, EWMA BW={:.2} Gbps, Inflight={} bytes ({} {} -> {}, segment {segment}, tier {}, {})",
                r.bytes,
                r.bandwidth as f64 * 8.0 / 1e9,
                r.inflight_bytes,
                r.transport.name(),
                r.local,
                r.remote,
                r.tier,
                r.state.name(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::rails::RailState;
    use tent_rings::TransportKind;

    #[test]
    fn prints_in_the_seed_shape() {
        let rail = |local: &str, bytes, bw| RailStat {
            transport: TransportKind::Tcp,
            local: local.into(),
            remote: "b0@10.0.0.2:1".into(),
            up: true,
            bytes,
            moved: 0,
            state: RailState::Healthy,
            failures: 0,
            trips: 0,
            inflight: 1,
            inflight_bytes: 4096,
            bandwidth: bw,
            theoretical: 0,
            tier: 0,
        };
        let s = TrafficStats {
            rails: vec![
                ("p".into(), rail("veth0", 1000, 125_000_000)),
                ("p".into(), rail("veth1", 24, 25_000_000)),
            ],
        };
        let text = s.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "=== Device Traffic Statistics ===");
        assert!(
            lines[1].starts_with(
                "Dev 0: Total=1000 bytes, EWMA BW=1.00 Gbps, Inflight=4096 bytes (tcp veth0"
            ),
            "{}",
            lines[1]
        );
        assert!(lines[2].starts_with("Dev 1: Total=24 bytes, EWMA BW=0.20 Gbps"));
        assert_eq!(s.total_bytes(), 1024);
    }
}
