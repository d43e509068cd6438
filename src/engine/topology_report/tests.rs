use super::*;
use crate::topology::NumaNode;
use crate::transport::rdma::gid::samples::{entry, link_local, v4};

/// An mlx5 port with one IPv4 address, as the NIC set opened it.
fn mlx5_facts(wanted: Option<u8>) -> NicFacts {
    let table = vec![
        entry(0, link_local(), GidType::RoceV1),
        entry(1, link_local(), GidType::RoceV2),
        entry(2, v4(1), GidType::RoceV1),
        entry(3, v4(1), GidType::RoceV2),
    ];
    let mut chosen = gid::choose(&table, LinkLayer::Ethernet, wanted).unwrap();
    chosen.prefix = Some(120);
    NicFacts {
        name: "mlx5_0".into(),
        port: 1,
        port_state: Ok(("ACTIVE", Some(100.0))),
        link: LinkLayer::Ethernet,
        chosen,
        wanted,
        table,
        numa_node: Some(1),
        pci_address: Some("0000:3b:00.0".into()),
        speed_gbps: Some(25.0),
        link_up: true,
        netdev: Some("eth2".into()),
        lid: 0,
        mtu: 5,
    }
}

#[test]
fn a_nic_reports_where_it_sits_and_why_its_gid() {
    let r = nic_report(&mlx5_facts(None));
    assert_eq!(r.name, "mlx5_0");
    assert_eq!(r.numa_node, Some(1));
    assert_eq!(r.pci_address.as_deref(), Some("0000:3b:00.0"));
    assert_eq!(r.port_state, "ACTIVE");
    assert_eq!(r.link_layer, "Ethernet");
    assert_eq!(
        r.speed_gbps,
        Some(100.0),
        "the port's rate now, not the one at open"
    );
    assert_eq!(r.mtu, 4096);
    assert_eq!(
        r.gid,
        GidReport {
            index: 3,
            ty: Some("RoCE v2".into()),
            address: "::ffff:10.0.0.1".into(),
            prefix: Some(120),
            reason: "RoCE v2, IPv4: preferred over [0] RoCE v1 link-local, \
                     [1] RoCE v2 link-local, [2] RoCE v1 IPv4"
                .into(),
        }
    );
}

#[test]
fn a_configured_gid_index_is_the_reason() {
    let r = nic_report(&mlx5_facts(Some(2)));
    assert_eq!((r.gid.index, r.gid.ty.as_deref()), (2, Some("RoCE v1")));
    assert!(
        r.gid
            .reason
            .starts_with("gid_index 2 from the configuration (transports/rdma/gid_index)"),
        "{}",
        r.gid.reason
    );
    assert!(
        r.gid.reason.contains("[3] (RoCE v2, IPv4)"),
        "{}",
        r.gid.reason
    );
}

#[test]
fn a_port_that_cannot_be_read_now_says_so_and_keeps_what_was_read_at_open() {
    let mut f = mlx5_facts(None);
    f.port_state = Err("ibv_query_port failed".into());
    f.table.clear();
    let r = nic_report(&f);
    assert_eq!(r.port_state, "unknown (ibv_query_port failed)");
    assert_eq!(r.speed_gbps, Some(25.0));
    assert_eq!(
        r.gid.reason,
        "RoCE v2, IPv4: chosen when the NIC was opened; the GID table now reads empty"
    );
}

fn two_nodes() -> Topology {
    Topology::from_nodes(vec![
        NumaNode {
            os_index: 0,
            cpus: vec![0, 1, 2, 3],
        },
        NumaNode {
            os_index: 1,
            cpus: vec![4, 5, 6, 7],
        },
    ])
}

fn nics(nodes: &[Option<u32>]) -> Vec<(String, Option<u32>)> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("mlx5_{i}"), n))
        .collect()
}

/// The cores the engine would pin to, as it places them.
fn placed(t: &Topology, count: usize, explicit: &[usize], near: &[u32]) -> Vec<Option<usize>> {
    t.place_workers_near(count, explicit, near)
        .unwrap()
        .into_iter()
        .map(Some)
        .collect()
}

#[test]
fn workers_near_the_nics_name_the_nics_on_their_node() {
    let t = two_nodes();
    let n = nics(&[Some(1), Some(1)]);
    let cores = placed(&t, 2, &[], &[1]);
    let w = worker_reports(true, &[], &n, &t, &cores);
    assert_eq!((w[0].core, w[0].numa_node), (Some(7), Some(1)));
    assert_eq!(
        w[0].reason,
        "near the RDMA NICs: NUMA node 1 holds mlx5_0, mlx5_1; workers spread over node(s) 1, last cores first"
    );
    assert_eq!(w[1].core, Some(6));
}

#[test]
fn every_other_placement_says_why() {
    let t = two_nodes();
    let reason = |pin, explicit: &[usize], n: &[(String, Option<u32>)], cores: &[Option<usize>]| {
        worker_reports(pin, explicit, n, &t, cores)[0]
            .reason
            .clone()
    };
    assert_eq!(
        reason(false, &[], &nics(&[Some(1)]), &[None]),
        "unpinned: workers/pin is false"
    );
    assert_eq!(
        reason(
            true,
            &[2, 5],
            &nics(&[Some(1)]),
            &placed(&t, 1, &[2, 5], &[1])
        ),
        "core 2 from workers/cores (entry 0 of 2)"
    );
    let spread = placed(&t, 1, &[], &[]);
    let r = reason(true, &[], &nics(&[Some(9)]), &spread);
    assert!(
        r.ends_with("the RDMA NICs' node(s) 9 hold no CPU this process may run on"),
        "{r}"
    );
    let r = reason(true, &[], &nics(&[None]), &spread);
    assert!(r.ends_with("the RDMA NICs' NUMA node is unknown"), "{r}");
    let r = reason(true, &[], &[], &spread);
    assert!(
        r.starts_with("topology default") && r.ends_with("no RDMA NIC to place near"),
        "{r}"
    );
    // Pinned in the configuration, not on a core: pinning failed.
    assert_eq!(
        reason(true, &[], &[], &[None]),
        "unpinned: pinning to core 3 failed, or the worker has not started yet"
    );
}

fn gid_choice(gid: [u8; 16], ty: GidType) -> GidChoice {
    GidChoice {
        index: 3,
        gid,
        ty: Some(ty),
        why: "RoCE v2, IPv4",
        prefix: Some(120),
    }
}

fn remote(name: &str, gid: [u8; 16], ty: GidType) -> NicEntry {
    NicEntry {
        name: name.into(),
        gid,
        lid: 0,
        mtu: 5,
        gid_type: Some(ty.code()),
        prefix: Some(120),
    }
}

#[test]
fn rails_to_a_peer_are_the_transports_pairs() {
    let ours = vec![
        ("rxe0".to_owned(), gid_choice(v4(1), GidType::RoceV2)),
        ("rxe1".to_owned(), gid_choice(v4(2), GidType::RoceV2)),
    ];
    let theirs = vec![
        remote("rxe0", v4(11), GidType::RoceV2),
        remote("rxe1", v4(12), GidType::RoceV2),
    ];
    let r = planned_rails("10.0.0.11:7000", &ours, &theirs);
    let pairs: Vec<_> = r
        .rdma
        .iter()
        .map(|p| (p.local.as_str(), p.remote.as_str()))
        .collect();
    assert_eq!(pairs, [("rxe0", "rxe0"), ("rxe1", "rxe1")]);
    assert_eq!(r.rdma[0].remote_gid, "::ffff:10.0.0.11");
    assert_eq!(r.note, None);
    // A RoCE v1 peer: no rail, and the types are named.
    let theirs = vec![remote("mlx5_0", v4(11), GidType::RoceV1)];
    let r = planned_rails("p", &ours, &theirs);
    assert!(r.rdma.is_empty());
    assert_eq!(
        r.note.as_deref(),
        Some(
            "no NIC here can reach one of the peer's (GID types here RoCE v2, RoCE v2, there RoCE v1)"
        )
    );
    assert_eq!(
        planned_rails("p", &ours, &[]).note.as_deref(),
        Some("the peer advertises no RDMA NIC")
    );
    assert_eq!(
        planned_rails("p", &[], &theirs).note.as_deref(),
        Some("no RDMA NIC here")
    );
}

fn rail(name: &str, addr: &str) -> RailEntry {
    RailEntry {
        name: name.to_owned(),
        addr: addr.to_owned(),
    }
}

/// A routing table: 10.0.1.x leaves through eth1 (down), 10.0.0.x through
/// eth0; nothing else is reached.
fn fake_route(e: &RailEntry) -> std::io::Result<Route> {
    let remote: std::net::SocketAddr = e.addr.parse().map_err(std::io::Error::other)?;
    let (local, ip, up) = match remote.ip().to_string() {
        a if a.starts_with("10.0.0.") => ("eth0", "10.0.0.1", true),
        a if a.starts_with("10.0.1.") => ("eth1", "10.0.1.1", false),
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NetworkUnreachable,
                "no route",
            ));
        }
    };
    Ok(Route {
        remote,
        local_ip: ip.parse().unwrap(),
        local_name: local.to_owned(),
        ifindex: 2,
        up,
        remote_name: format!("{}@{}", e.name, e.addr),
    })
}

#[test]
fn tcp_rails_to_a_peer_are_the_routes_the_transport_would_take() {
    let theirs = vec![
        rail("eth0", "10.0.0.11:7001"),
        rail("ib0", "192.168.9.11:7001"),
        rail("eth1", "10.0.1.11:7001"),
    ];
    let (rails, note) = planned_tcp_rails(true, true, &theirs, fake_route);
    assert_eq!(
        rails,
        [
            PlannedTcpRail {
                local: "eth0".to_owned(),
                local_addr: "10.0.0.1".to_owned(),
                remote: "eth0".to_owned(),
                remote_addr: "10.0.0.11:7001".to_owned(),
                link_up: true,
            },
            PlannedTcpRail {
                local: "eth1".to_owned(),
                local_addr: "10.0.1.1".to_owned(),
                remote: "eth1".to_owned(),
                remote_addr: "10.0.1.11:7001".to_owned(),
                link_up: false,
            },
        ]
    );
    assert_eq!(
        note.as_deref(),
        Some("left out: ib0@192.168.9.11:7001: no route")
    );
    let (none, why) = planned_tcp_rails(true, true, &theirs[1..2], fake_route);
    assert!(none.is_empty());
    assert_eq!(
        why.as_deref(),
        Some("no advertised TCP rail is reachable from here (ib0@192.168.9.11:7001: no route)")
    );
    assert_eq!(
        planned_tcp_rails(false, true, &theirs, fake_route)
            .1
            .as_deref(),
        Some("TCP is not installed here")
    );
    assert_eq!(
        planned_tcp_rails(true, false, &theirs, fake_route)
            .1
            .as_deref(),
        Some("the peer advertises no TCP rail")
    );
}

#[test]
fn the_text_form_has_a_line_per_node_nic_and_worker() {
    let t = two_nodes();
    let report = TopologyReport {
        numa_nodes: t
            .nodes()
            .iter()
            .map(|n| NodeReport {
                node: n.os_index,
                cpus: n.cpus.clone(),
            })
            .collect(),
        rdma_nics: vec![nic_report(&mlx5_facts(None))],
        workers: worker_reports(true, &[], &nics(&[Some(1)]), &t, &placed(&t, 1, &[], &[1])),
        transports: vec!["rdma".into(), "tcp".into()],
        rails_to: None,
    };
    let text = report.to_string();
    assert!(text.contains("  node 1: cpus 4-7\n"), "{text}");
    assert!(
        text.contains(
            "  mlx5_0: numa node 1, pci 0000:3b:00.0, port 1 ACTIVE (Ethernet), 100 Gb/s"
        ),
        "{text}"
    );
    assert!(
        text.contains("    gid [3] RoCE v2 ::ffff:10.0.0.1: RoCE v2, IPv4: preferred over"),
        "{text}"
    );
    assert!(
        text.contains("  worker 0: core 7, numa node 1: near the RDMA NICs"),
        "{text}"
    );
    assert!(text.ends_with("transports: rdma, tcp\n"), "{text}");
    // JSON round trip.
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("\"type\":\"RoCE v2\""), "{json}");
    assert_eq!(
        serde_json::from_str::<TopologyReport>(&json).unwrap(),
        report
    );
    // With a peer: a line per RDMA and TCP rail, and the notes.
    let mut with = report.clone();
    let (tcp, tcp_note) = planned_tcp_rails(
        true,
        true,
        &[rail("eth0", "10.0.0.11:7001"), rail("x", "1.2.3.4:5")],
        fake_route,
    );
    with.rails_to = Some(RailsTo {
        tcp,
        tcp_note,
        ..planned_rails("10.0.0.11:7000", &[], &[])
    });
    let text = with.to_string();
    assert!(
        text.ends_with(
            "RDMA rails to 10.0.0.11:7000:\n  (no RDMA NIC here)\n\
             TCP rails to 10.0.0.11:7000:\n  eth0 10.0.0.1 -> eth0 10.0.0.11:7001, link up\n  \
             (left out: x@1.2.3.4:5: no route)\n"
        ),
        "{text}"
    );
    let json = serde_json::to_string(&with).unwrap();
    assert_eq!(serde_json::from_str::<TopologyReport>(&json).unwrap(), with);
    assert_eq!(cpu_ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    assert_eq!(cpu_ranges(&[]), "");
}
