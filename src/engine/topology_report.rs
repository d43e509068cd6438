//! The topology report (`/topology`, `tent-bench --mode topology`): this
//! host's NUMA nodes and CPUs, each RDMA NIC with where it sits, its port
//! and the GID in use with why, where every worker runs and why, and, for
//! a peer, the rails the engine would form to it.
//!
//! The reading (port queries, GID tables, sysfs, routes) happens in
//! `nic_facts` and the TCP transport's `route_to`; every decision the
//! report states is a pure function of what was read (`nic_report`,
//! `worker_reports`, `planned_rails`, `planned_tcp_rails`), the same
//! functions the engine decides with (`gid::choose`,
//! `Topology::place_workers_near`, `plan_rails`, the TCP transport's
//! `plan_routes`).

use serde::{Deserialize, Serialize};

use crate::control::wire::{NicEntry, RailEntry};
use crate::topology::Topology;
use crate::transport::rails::Sysfs;
use crate::transport::rdma::Nic;
use crate::transport::rdma::gid::{self, GidChoice, GidEntry, GidType, LinkLayer};
use crate::transport::rdma::transport::plan_rails;
use crate::transport::tcp::{Route, plan_routes};

/// What the engine knows about this host and how it uses it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopologyReport {
    /// NUMA nodes with the CPUs this process may run on.
    pub numa_nodes: Vec<NodeReport>,
    /// The RDMA NICs in use, in descriptor order.
    pub rdma_nics: Vec<NicReport>,
    /// Every worker: its core, node and why.
    pub workers: Vec<WorkerReport>,
    /// Installed transports (`rdma`, `tcp`, `shm`, `local`).
    pub transports: Vec<String>,
    /// The rails to a peer, when one was asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rails_to: Option<RailsTo>,
}

impl TopologyReport {
    /// The host's NUMA nodes alone: what a process without an engine of
    /// its own (attached to a daemon) knows.
    pub(crate) fn host_only(topology: &Topology) -> TopologyReport {
        TopologyReport {
            numa_nodes: node_reports(topology),
            rdma_nics: Vec::new(),
            workers: Vec::new(),
            transports: Vec::new(),
            rails_to: None,
        }
    }
}

/// The NUMA nodes of `topology`, with the CPUs this process may run on.
pub(crate) fn node_reports(topology: &Topology) -> Vec<NodeReport> {
    topology
        .nodes()
        .iter()
        .map(|n| NodeReport {
            node: n.os_index,
            cpus: n.cpus.clone(),
        })
        .collect()
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Its OS index.
    pub node: u32,
    /// The CPUs on it this process may run on.
    pub cpus: Vec<usize>,
}

/// One RDMA NIC in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicReport {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// The NUMA node it hangs off; `None` when sysfs does not say.
    pub numa_node: Option<u32>,
    /// Its PCI address; `None` for a device with none (Soft-RoCE).
    pub pci_address: Option<String>,
    /// The port used.
    pub port: u8,
    /// The port's state (`ACTIVE`, `DOWN`, ...), or why it could not be
    /// read.
    pub port_state: String,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
    /// The port's theoretical rate in Gbit/s; `None` when unknown.
    pub speed_gbps: Option<f64>,
    /// Whether the engine counts its link up (its rails take new slices).
    pub link_up: bool,
    /// The network device under the GID in use (RoCE).
    pub netdev: Option<String>,
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU in bytes.
    pub mtu: u32,
    /// The GID in use and why.
    pub gid: GidReport,
}

/// The GID a NIC uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidReport {
    /// Its index in the port's table.
    pub index: u8,
    /// `RoCE v2`, `RoCE v1`, `IB`; `None` when unknown.
    #[serde(rename = "type")]
    pub ty: Option<String>,
    /// The address, as IPv6 text (`::ffff:10.0.0.1` for IPv4).
    pub address: String,
    /// Its subnet prefix length, when known.
    pub prefix: Option<u8>,
    /// Why this entry: the class that won and what it was preferred
    /// over, or the configured index.
    pub reason: String,
}

/// One worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Its index.
    pub worker: usize,
    /// The core it is pinned to; `None` when unpinned.
    pub core: Option<usize>,
    /// The NUMA node of that core; `None` when unpinned or unknown.
    pub numa_node: Option<u32>,
    /// Why it runs there.
    pub reason: String,
}

/// The rails the engine would form to a peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailsTo {
    /// The peer's segment name.
    pub segment: String,
    /// The RDMA rails, best spread first.
    pub rdma: Vec<PlannedRail>,
    /// Why there are no RDMA rails, or what was left out.
    pub note: Option<String>,
    /// The TCP rails, in the peer's order.
    #[serde(default)]
    pub tcp: Vec<PlannedTcpRail>,
    /// Why there are no TCP rails, or which advertised ones no route
    /// reaches.
    #[serde(default)]
    pub tcp_note: Option<String>,
}

/// One TCP rail: the local interface the routing table picks for one of
/// the peer's advertised addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTcpRail {
    /// Local interface name (the address when no interface holds it).
    pub local: String,
    /// Local address.
    pub local_addr: String,
    /// The peer's rail name (its interface).
    pub remote: String,
    /// The peer's address on it.
    pub remote_addr: String,
    /// Whether the local interface's link is up.
    pub link_up: bool,
}

/// One rail between a local and a remote NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedRail {
    /// Local NIC name.
    pub local: String,
    /// Local GID address.
    pub local_gid: String,
    /// Remote NIC name.
    pub remote: String,
    /// Remote GID address.
    pub remote_gid: String,
}

/// What was read about one NIC: the input of [`nic_report`].
#[derive(Debug, Clone)]
pub(crate) struct NicFacts {
    pub(crate) name: String,
    pub(crate) port: u8,
    /// `ibv_query_port`'s state name and rate, or its error.
    pub(crate) port_state: Result<(&'static str, Option<f64>), String>,
    pub(crate) link: LinkLayer,
    /// The GID in use.
    pub(crate) chosen: GidChoice,
    /// The configured index.
    pub(crate) wanted: Option<u8>,
    /// The port's GID table as it reads now.
    pub(crate) table: Vec<GidEntry>,
    pub(crate) numa_node: Option<u32>,
    pub(crate) pci_address: Option<String>,
    /// The rate read at open, for when the port cannot be read now.
    pub(crate) speed_gbps: Option<f64>,
    pub(crate) link_up: bool,
    pub(crate) netdev: Option<String>,
    pub(crate) lid: u16,
    /// An `ibv_mtu` value.
    pub(crate) mtu: u32,
}

/// Read what the report says about `nic`: its port now, its GID table,
/// its PCI address from `sysfs`.
pub(crate) fn nic_facts(nic: &Nic, sysfs: &Sysfs) -> NicFacts {
    let name = nic.ctx.name().to_owned();
    let info = nic.ctx.port(nic.port);
    let table = info
        .as_ref()
        .map(|i| nic.ctx.gid_table(nic.port, i, sysfs))
        .unwrap_or_default();
    NicFacts {
        port_state: info
            .as_ref()
            .map(|i| (i.state_name(), i.speed_gbps()))
            .map_err(ToString::to_string),
        port: nic.port,
        link: nic.addressing().link,
        chosen: nic.gid(),
        wanted: nic.wanted_gid(),
        table,
        numa_node: nic.numa_node,
        pci_address: sysfs.ibdev_pci(&name),
        speed_gbps: nic.speed_gbps,
        link_up: nic.is_up(),
        netdev: nic.netdev().map(|(n, _)| n),
        lid: nic.lid,
        mtu: nic.mtu,
        name,
    }
}

/// The report's entry for a NIC.
pub(crate) fn nic_report(f: &NicFacts) -> NicReport {
    let c = &f.chosen;
    let reason = if f.table.iter().any(|e| e.index == c.index && e.gid == c.gid) {
        gid::reason(&f.table, f.link, f.wanted, c)
    } else {
        // The table cannot be read now, or it changed since the choice
        // (a new choice follows the change event).
        format!(
            "{}: chosen when the NIC was opened; the GID table now reads {}",
            c.why,
            if f.table.is_empty() {
                "empty"
            } else {
                "differently"
            }
        )
    };
    let (port_state, speed) = match &f.port_state {
        Ok((state, speed)) => ((*state).to_owned(), speed.or(f.speed_gbps)),
        Err(e) => (format!("unknown ({e})"), f.speed_gbps),
    };
    NicReport {
        name: f.name.clone(),
        numa_node: f.numa_node,
        pci_address: f.pci_address.clone(),
        port: f.port,
        port_state,
        link_layer: format!("{:?}", f.link),
        speed_gbps: speed,
        link_up: f.link_up,
        netdev: f.netdev.clone(),
        lid: f.lid,
        // IBV_MTU_256 is 1, each next code doubles it.
        mtu: if (1..=5).contains(&f.mtu) {
            128 << f.mtu
        } else {
            0
        },
        gid: GidReport {
            index: c.index,
            ty: c.ty.map(|t| t.to_string()),
            address: std::net::Ipv6Addr::from(c.gid).to_string(),
            prefix: c.prefix,
            reason,
        },
    }
}

/// Where the workers run and why: `pin` and `explicit` are
/// `workers/pin` and `workers/cores`, `nics` the RDMA NICs' names and
/// NUMA nodes, `cores` where each worker is pinned now (`None`: not).
/// Placement is `Topology::place_workers_near` over the NICs' nodes, as
/// the engine places them.
pub(crate) fn worker_reports(
    pin: bool,
    explicit: &[usize],
    nics: &[(String, Option<u32>)],
    topology: &Topology,
    cores: &[Option<usize>],
) -> Vec<WorkerReport> {
    let mut near: Vec<u32> = nics.iter().filter_map(|n| n.1).collect();
    near.sort_unstable();
    near.dedup();
    let near_usable = topology
        .nodes()
        .iter()
        .any(|n| !n.cpus.is_empty() && near.contains(&n.os_index));
    let planned = if pin {
        topology
            .place_workers_near(cores.len(), explicit, &near)
            .ok()
    } else {
        None
    };
    cores
        .iter()
        .enumerate()
        .map(|(i, &core)| {
            let numa_node = topology.worker_node(core);
            let reason = match core {
                _ if !pin => "unpinned: workers/pin is false".to_owned(),
                None => match planned.as_ref().and_then(|p| p.get(i)) {
                    Some(c) => format!(
                        "unpinned: pinning to core {c} failed, or the worker has not started yet"
                    ),
                    None => "unpinned: no core could be chosen".to_owned(),
                },
                Some(c) if !explicit.is_empty() => format!(
                    "core {c} from workers/cores (entry {} of {})",
                    i % explicit.len(),
                    explicit.len()
                ),
                Some(_) if near_usable => {
                    let here: Vec<&str> = nics
                        .iter()
                        .filter(|n| n.1.is_some() && n.1 == numa_node)
                        .map(|n| n.0.as_str())
                        .collect();
                    format!(
                        "near the RDMA NICs: NUMA node {} holds {}; workers spread over node(s) {}, last cores first",
                        numa_node.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                        here.join(", "),
                        list(&near)
                    )
                }
                Some(_) if !near.is_empty() => format!(
                    "topology default (spread over every NUMA node, last cores first): the RDMA NICs' node(s) {} hold no CPU this process may run on",
                    list(&near)
                ),
                Some(_) if !nics.is_empty() => "topology default (spread over every NUMA node, last cores first): the RDMA NICs' NUMA node is unknown".to_owned(),
                Some(_) => "topology default (spread over every NUMA node, last cores first): no RDMA NIC to place near".to_owned(),
            };
            WorkerReport {
                worker: i,
                core,
                numa_node,
                reason,
            }
        })
        .collect()
}

fn list(nodes: &[u32]) -> String {
    nodes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The RDMA rails to the peer `segment`, whose descriptor lists `theirs`,
/// from NICs `ours` (name, GID in use): what the RDMA transport would
/// connect (`plan_rails`).
pub(crate) fn planned_rails(
    segment: &str,
    ours: &[(String, GidChoice)],
    theirs: &[NicEntry],
) -> RailsTo {
    let gids: Vec<GidChoice> = ours.iter().map(|o| o.1).collect();
    let addr = |g: [u8; 16]| std::net::Ipv6Addr::from(g).to_string();
    let ty = |t: Option<GidType>| t.map_or_else(|| "?".to_owned(), |t| t.to_string());
    let (rdma, note) = if ours.is_empty() {
        (Vec::new(), Some("no RDMA NIC here".to_owned()))
    } else if theirs.is_empty() {
        (
            Vec::new(),
            Some("the peer advertises no RDMA NIC".to_owned()),
        )
    } else {
        let plan = plan_rails(&gids, theirs);
        let rails: Vec<PlannedRail> = plan
            .pairs
            .iter()
            .map(|&(a, b)| PlannedRail {
                local: ours[a].0.clone(),
                local_gid: addr(ours[a].1.gid),
                remote: theirs[b].name.clone(),
                remote_gid: addr(theirs[b].gid),
            })
            .collect();
        let note = if rails.is_empty() {
            Some(format!(
                "no NIC here can reach one of the peer's (GID types here {}, there {})",
                gids.iter().map(|g| ty(g.ty)).collect::<Vec<_>>().join(", "),
                theirs
                    .iter()
                    .map(|n| ty(n.gid_type.and_then(GidType::from_code)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        } else if plan.across > 0 {
            Some(format!(
                "{} reachable pair(s) left out: NICs with a partner on their own subnet pair only there",
                plan.across
            ))
        } else {
            None
        };
        (rails, note)
    };
    RailsTo {
        segment: segment.to_owned(),
        rdma,
        note,
        tcp: Vec::new(),
        tcp_note: None,
    }
}

/// The TCP rails to a peer that advertises `theirs` (and serves TCP:
/// `they_serve`), from an engine with TCP installed (`here`), each
/// advertised rail routed by `route` (the transport's `route_to`), kept or
/// left out as the transport's `plan_routes` does when it attaches.
pub(crate) fn planned_tcp_rails(
    here: bool,
    they_serve: bool,
    theirs: &[RailEntry],
    route: impl Fn(&RailEntry) -> std::io::Result<Route>,
) -> (Vec<PlannedTcpRail>, Option<String>) {
    if !here {
        return (Vec::new(), Some("TCP is not installed here".to_owned()));
    }
    if !they_serve || theirs.is_empty() {
        return (
            Vec::new(),
            Some("the peer advertises no TCP rail".to_owned()),
        );
    }
    let (routes, skipped) = plan_routes(theirs, route);
    let rails: Vec<PlannedTcpRail> = routes
        .into_iter()
        .map(|(e, r)| PlannedTcpRail {
            local: r.local_name,
            local_addr: r.local_ip.to_string(),
            remote: e.name.clone(),
            remote_addr: e.addr.clone(),
            link_up: r.up,
        })
        .collect();
    let left_out: Vec<String> = skipped
        .iter()
        .map(|(e, why)| format!("{}@{}: {why}", e.name, e.addr))
        .collect();
    let note = match (rails.is_empty(), left_out.is_empty()) {
        (_, true) => None,
        (true, false) => Some(format!(
            "no advertised TCP rail is reachable from here ({})",
            left_out.join("; ")
        )),
        (false, false) => Some(format!("left out: {}", left_out.join("; "))),
    };
    (rails, note)
}

impl std::fmt::Display for TopologyReport {
    /// The report as text, one line per node, NIC, worker and rail.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |v: Option<String>| v.unwrap_or_else(|| "?".to_owned());
        writeln!(f, "NUMA nodes:")?;
        for n in &self.numa_nodes {
            writeln!(f, "  node {}: cpus {}", n.node, cpu_ranges(&n.cpus))?;
        }
        if self.rdma_nics.is_empty() {
            writeln!(f, "RDMA NICs: none")?;
        } else {
            writeln!(f, "RDMA NICs:")?;
        }
        for n in &self.rdma_nics {
            writeln!(
                f,
                "  {}: numa node {}, pci {}, port {} {} ({}), {} Gb/s, link {}, netdev {}, mtu {}",
                n.name,
                opt(n.numa_node.map(|v| v.to_string())),
                opt(n.pci_address.clone()),
                n.port,
                n.port_state,
                n.link_layer,
                opt(n.speed_gbps.map(|v| v.to_string())),
                if n.link_up { "up" } else { "down" },
                opt(n.netdev.clone()),
                n.mtu
            )?;
            writeln!(
                f,
                "    gid [{}] {} {}: {}",
                n.gid.index,
                opt(n.gid.ty.clone()),
                n.gid.address,
                n.gid.reason
            )?;
        }
        writeln!(f, "workers:")?;
        for w in &self.workers {
            writeln!(
                f,
                "  worker {}: core {}, numa node {}: {}",
                w.worker,
                opt(w.core.map(|v| v.to_string())),
                opt(w.numa_node.map(|v| v.to_string())),
                w.reason
            )?;
        }
        writeln!(f, "transports: {}", self.transports.join(", "))?;
        if let Some(r) = &self.rails_to {
            writeln!(f, "RDMA rails to {}:", r.segment)?;
            for rail in &r.rdma {
                writeln!(
                    f,
                    "  {} {} -> {} {}",
                    rail.local, rail.local_gid, rail.remote, rail.remote_gid
                )?;
            }
            if let Some(note) = &r.note {
                writeln!(f, "  ({note})")?;
            }
            writeln!(f, "TCP rails to {}:", r.segment)?;
            for rail in &r.tcp {
                writeln!(
                    f,
                    "  {} {} -> {} {}, link {}",
                    rail.local,
                    rail.local_addr,
                    rail.remote,
                    rail.remote_addr,
                    if rail.link_up { "up" } else { "down" }
                )?;
            }
            if let Some(note) = &r.tcp_note {
                writeln!(f, "  ({note})")?;
            }
        }
        Ok(())
    }
}

/// `0-3,8,10-11`.
fn cpu_ranges(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests;
