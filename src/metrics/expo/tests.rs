use super::*;
use crate::transport::rails::RailState;

fn rail(transport: TransportKind, local: &str, bytes: u64, state: RailState) -> RailStat {
    RailStat {
        transport,
        local: local.into(),
        remote: "eth0".into(),
        up: true,
        bytes,
        moved: 1,
        state,
        failures: 3,
        trips: 1,
        inflight: 2,
        inflight_bytes: 8192,
        bandwidth: 1000,
        theoretical: 5000,
        tier: 1,
    }
}

fn sq_row(segment: &str, qp: usize, cqes: u64, age: Option<u64>) -> SqRow {
    SqRow {
        segment: segment.into(),
        local: "mlx5_0".into(),
        remote: "mlx5_1".into(),
        qp,
        report: SqReport {
            posted: 12,
            stalls: 2,
            cqes,
            backlog_high: qp as u32,
            last_cqe_us_ago: age,
            ..SqReport::default()
        },
    }
}

/// The sample lines of family sample name `name` (`name{...} v` or
/// `name v`).
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .collect()
}

/// The value of a sample line.
fn value(line: &str) -> u64 {
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn renders_failover_pairs_rails_and_sq_rows() {
    let mut failover = [[0; KINDS]; KINDS];
    failover[TransportKind::Rdma as usize][TransportKind::Tcp as usize] = 2;
    let scrape = Scrape {
        failover,
        exhausted: 1,
        rails: vec![(
            "10.0.0.2:7000".into(),
            rail(TransportKind::Tcp, "veth0", 42, RailState::Paused),
        )],
        sq: vec![sq_row("10.0.0.2:7000", 1, 40, None)],
        ..Scrape::default()
    };
    let text = scrape.encode(64);
    assert!(text.ends_with("# EOF\n"), "{text}");
    // Counters: the family without `_total`, the samples with it, as ever.
    assert!(
        text.contains(
            "# HELP tent_transport_failover Tasks moved from one transport to the next after a transient failure.\n\
             # TYPE tent_transport_failover counter\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("tent_transport_failover_total{from=\"rdma\",to=\"tcp\"} 2\n"),
        "{text}"
    );
    // Every pair of real transports is there from the start, at 0.
    assert!(text.contains("tent_transport_failover_total{from=\"tcp\",to=\"shm\"} 0\n"));
    assert!(!text.contains("from=\"any\""));
    assert!(text.contains("tent_task_failover_exhausted_total 1\n"));
    assert!(text.contains(
        "tent_rail_state{transport=\"tcp\",segment=\"10.0.0.2:7000\",local=\"veth0\",remote=\"eth0\"} 3\n"
    ));
    assert!(text.contains("# TYPE tent_rail_state gauge\n"));
    assert!(text.contains("# TYPE tent_rail_trips counter\n"));
    assert!(text.contains(
        "tent_rail_bytes_total{transport=\"tcp\",segment=\"10.0.0.2:7000\",local=\"veth0\",remote=\"eth0\"} 42\n"
    ));
    assert!(text.contains("tent_rail_inflight_bytes{transport=\"tcp\",segment=\"10.0.0.2:7000\",local=\"veth0\",remote=\"eth0\"} 8192\n"), "{text}");
    assert!(text.contains("tent_rail_numa_tier{"));
    assert!(text.contains(
        "tent_sq_stalls_total{segment=\"10.0.0.2:7000\",local=\"mlx5_0\",remote=\"mlx5_1\",qp=\"1\"} 2\n"
    ), "{text}");
    assert!(text.contains(
        "tent_sq_posted_wr{segment=\"10.0.0.2:7000\",local=\"mlx5_0\",remote=\"mlx5_1\",qp=\"1\"} 12\n"
    ));
    assert!(text.contains("# TYPE tent_sq_cqes counter\n"));
    // No completion yet: the age has no sample, not a huge number.
    assert!(
        samples(&text, "tent_sq_last_cqe_age_us").is_empty(),
        "{text}"
    );
    // No HTTP server: no tent_http_*.
    assert!(!text.contains("tent_http_"));
    // Every other line is `name{labels} value` or `name value`, a number.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let v = line.rsplit(' ').next().unwrap();
        v.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
    }
}

#[test]
fn no_rdma_rail_no_sq_families() {
    let text = Scrape::default().encode(64);
    assert!(!text.contains("tent_sq_"), "{text}");
    // The rail families are described, with no sample.
    assert!(text.contains("# TYPE tent_rail_bytes counter\n"));
    assert!(samples(&text, "tent_rail_bytes_total").is_empty());
}

/// A segment and a NIC name from a hostile peer's descriptor: a quote, a
/// backslash and a newline that would end the label, and the line, and
/// forge a sample.
#[test]
fn label_values_from_peers_are_escaped() {
    let segment = "evil\"} 1\ntent_forged_total 9\n\\";
    let scrape = Scrape {
        rails: vec![(
            segment.into(),
            rail(TransportKind::Tcp, "nic\"\\\n", 7, RailState::Healthy),
        )],
        sq: vec![sq_row(segment, 0, 1, Some(5))],
        ..Scrape::default()
    };
    let text = scrape.encode(64);
    let esc_segment = r#"evil\"} 1\ntent_forged_total 9\n\\"#;
    let esc_nic = r#"nic\"\\\n"#;
    assert!(
        text.contains(&format!(
            "tent_rail_bytes_total{{transport=\"tcp\",segment=\"{esc_segment}\",local=\"{esc_nic}\",remote=\"eth0\"}} 7\n"
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "tent_sq_last_cqe_age_us{{segment=\"{esc_segment}\",local=\"mlx5_0\",remote=\"mlx5_1\",qp=\"0\"}} 5\n"
    )));
    assert!(
        !text.lines().any(|l| l.starts_with("tent_forged")),
        "{text}"
    );
    // One line per sample: 11 rail families and 11 SQ families, a sample
    // each; nothing split a line.
    let peer_lines = text
        .lines()
        .filter(|l| l.starts_with("tent_rail_") || l.starts_with("tent_sq_"))
        .count();
    assert_eq!(peer_lines, 22, "{text}");
}

/// prometheus-client writes label values as it is given them: hence
/// [`Esc`]. Should a version escape them itself, this fails, and `Esc`
/// would escape twice: drop it then.
#[test]
fn the_crate_does_not_escape_label_values() {
    #[derive(Debug)]
    struct Raw;
    impl Collector for Raw {
        fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
            let mut m = enc.encode_descriptor("x", "raw", None, MetricType::Gauge)?;
            m.encode_family(&[("v", "a\"b")])?.encode_gauge(&1i64)
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Raw));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    assert!(out.contains("x{v=\"a\"b\"} 1\n"), "{out}");
}

#[test]
fn request_and_qos_histograms_and_counters() {
    let mut ops = OpSnapshot::default();
    let (local, high) = (TransportKind::Local as usize, Priority::High.index());
    let w = tent_rings::Opcode::Write as usize;
    ops.ok[w][local] = 3;
    ops.bytes[w][local] = 300;
    ops.failed[w][0] = 1;
    ops.latency[local][high][0] = 2;
    ops.latency[local][high][3] = 1;
    ops.latency_sum_ns[local][high] = 5_000;
    let queue = super::super::ops::Stage::Queue as usize;
    ops.stage[queue][local][high][2] = 3;
    ops.stage_sum_ns[queue][local][high] = 9_000;
    let mut qos = QosSnapshot::default();
    qos.levels[high].accepted = 4;
    qos.levels[high].wait[1] = 4;
    qos.levels[high].wait_sum_ns = 4_000;
    qos.slots = Some(crate::qos::SlotSnapshot {
        slot: 2,
        owner: true,
        takeovers: 1,
    });
    let text = Scrape {
        ops,
        qos,
        ..Scrape::default()
    }
    .encode(64);
    assert!(
        text.contains("# TYPE tent_write_requests counter\n"),
        "{text}"
    );
    assert!(text.contains("# HELP tent_write_requests Requests completed, failed ones included, WRITEs, by transport.\n"));
    assert!(text.contains("tent_write_requests_total{transport=\"local\"} 3\n"));
    assert!(text.contains("tent_write_requests_total{transport=\"none\"} 1\n"));
    assert!(text.contains("tent_write_bytes_total{transport=\"local\"} 300\n"));
    assert!(!text.contains("tent_write_bytes_total{transport=\"none\"}"));
    let fam = "tent_request_duration_seconds";
    let lh = "transport=\"local\",priority=\"high\"";
    // The crate writes `le` first, then the family's labels.
    assert!(text.contains(&format!("# TYPE {fam} histogram\n")));
    for want in [
        format!("{fam}_bucket{{le=\"0.000001\",{lh}}} 2\n"),
        format!("{fam}_bucket{{le=\"0.000004\",{lh}}} 2\n"),
        format!("{fam}_bucket{{le=\"0.000008\",{lh}}} 3\n"),
        format!("{fam}_bucket{{le=\"+Inf\",{lh}}} 3\n"),
        format!("{fam}_count{{{lh}}} 3\n"),
        format!("{fam}_sum{{{lh}}} 0.000005\n"),
    ] {
        assert!(text.contains(&want), "{want} in {text}");
    }
    // Only the pairs that served a request.
    assert_eq!(samples(&text, &format!("{fam}_count")).len(), 1);
    let stage = "tent_request_stage_seconds";
    let q = format!("stage=\"queue\",{lh}");
    assert!(text.contains(&format!("# TYPE {stage} histogram\n")));
    for want in [
        format!("{stage}_bucket{{le=\"0.000002\",{q}}} 0\n"),
        format!("{stage}_bucket{{le=\"0.000004\",{q}}} 3\n"),
        format!("{stage}_count{{{q}}} 3\n"),
        format!("{stage}_sum{{{q}}} 0.000009\n"),
    ] {
        assert!(text.contains(&want), "{want} in {text}");
    }
    assert_eq!(samples(&text, &format!("{stage}_count")).len(), 1);
    assert!(text.contains("tent_qos_accepted_total{priority=\"high\"} 4\n"));
    assert!(text.contains("tent_qos_wait_seconds_bucket{le=\"0.000002\",priority=\"high\"} 4\n"));
    // Every priority's wait histogram, served or not.
    assert_eq!(samples(&text, "tent_qos_wait_seconds_count").len(), 3);
    assert!(text.contains("tent_qos_slot 2\n"));
    assert!(text.contains("tent_qos_slot_owner 1\n"));
    assert!(text.contains("tent_qos_slot_takeovers_total 1\n"));
}

#[test]
fn http_server_counters() {
    let http = HttpStats {
        accepted: 9,
        evicted: 2,
        timed_out: 1,
        bad_request: 3,
        too_large: 1,
        unauthorized: 4,
        served: 7,
        by_class: [0, 5, 0, 1, 1],
    };
    let text = Scrape {
        http: Some(http),
        ..Scrape::default()
    }
    .encode(64);
    for want in [
        "tent_http_connections_accepted_total 9\n",
        "tent_http_connections_evicted_total 2\n",
        "tent_http_connections_timed_out_total 1\n",
        "tent_http_requests_refused_total{reason=\"bad_request\"} 3\n",
        "tent_http_requests_refused_total{reason=\"too_large\"} 1\n",
        "tent_http_requests_refused_total{reason=\"unauthorized\"} 4\n",
        "tent_http_responses_total{class=\"2xx\"} 5\n",
        "tent_http_responses_total{class=\"4xx\"} 1\n",
        "tent_http_responses_total{class=\"5xx\"} 1\n",
        "# TYPE tent_http_responses counter\n",
    ] {
        assert!(text.contains(want), "{want} in {text}");
    }
}

/// 200 peers, one TCP rail each and one RDMA rail with two QP slots for
/// every other: at most `cap` peers' series plus one `_other` per family
/// and unnamed label (transport, QP slot), and the sums unchanged.
#[test]
fn two_hundred_peers_make_at_most_cap_plus_one_series_per_family() {
    let cap = 64;
    let mut rails = Vec::new();
    let mut sq = Vec::new();
    for p in 0..200u64 {
        let seg = format!("10.0.{}.{}:7000", p / 250, p % 250);
        let state = if p == 3 {
            RailState::Paused
        } else {
            RailState::Healthy
        };
        rails.push((
            seg.clone(),
            rail(TransportKind::Tcp, &format!("veth{p}"), 1000 + p, state),
        ));
        if p % 2 == 0 {
            for qp in 0..2 {
                sq.push(sq_row(&seg, qp, p, Some(100 + p)));
            }
        }
    }
    let text = Scrape {
        rails: rails.clone(),
        sq: sq.clone(),
        ..Scrape::default()
    }
    .encode(cap);
    let sum = |name: &str| samples(&text, name).iter().map(|l| value(l)).sum::<u64>();
    for name in RAIL.families.map(|f| f.0) {
        let n = samples(&text, name).len();
        assert!(n <= cap + 1, "{name}: {n} series");
        assert_eq!(n, cap + 1, "{name}");
    }
    // Bytes add up; the kept peers are the busiest ones (bytes 1000 + p).
    assert_eq!(
        sum("tent_rail_bytes_total"),
        rails.iter().map(|(_, r)| r.bytes).sum::<u64>()
    );
    assert_eq!(sum("tent_rail_failures_total"), 3 * 200);
    assert_eq!(sum("tent_rail_inflight_bytes"), 8192 * 200);
    assert_eq!(sum("tent_rail_up"), 200);
    assert!(text.contains("segment=\"10.0.0.199:7000\",local=\"veth199\""));
    assert!(!text.contains("segment=\"10.0.0.135:7000\""));
    let other =
        "tent_rail_state{transport=\"tcp\",segment=\"_other\",local=\"_other\",remote=\"_other\"}";
    // Peer 3 (paused) is summed into _other: the worst state shows.
    assert!(text.contains(&format!("{other} 3\n")), "{text}");
    assert!(text.contains("tent_rail_numa_tier{transport=\"tcp\",segment=\"_other\",local=\"_other\",remote=\"_other\"} 1\n"));
    // SQ: 100 peers, two slots each; kept peers' slots, and one `_other`
    // per slot.
    for name in SQ.families.map(|f| f.0) {
        let n = samples(&text, name).len();
        let kept_with_sq = 32; // the even peers among the 64 kept (136..=199)
        assert_eq!(n, 2 * (kept_with_sq + 1), "{name}");
        assert!(n <= 2 * (cap + 1));
    }
    assert_eq!(
        sum("tent_sq_cqes_total"),
        sq.iter().map(|r| r.report.cqes).sum::<u64>()
    );
    assert_eq!(sum("tent_sq_posted_wr"), 12 * 200);
    // The newest completion of those summed (peer 0: 100 us), the highest
    // watermark (slot 1).
    assert!(text.contains("tent_sq_last_cqe_age_us{segment=\"_other\",local=\"_other\",remote=\"_other\",qp=\"0\"} 100\n"), "{text}");
    assert!(text.contains("tent_sq_backlog_high_watermark{segment=\"_other\",local=\"_other\",remote=\"_other\",qp=\"1\"} 1\n"));
    // Under the cap nothing is summed.
    let all = Scrape {
        rails,
        sq,
        ..Scrape::default()
    }
    .encode(200);
    assert!(!all.contains("_other"));
    assert_eq!(samples(&all, "tent_rail_bytes_total").len(), 200);
}
