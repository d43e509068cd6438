//! `tent-bench --mode topology` prints this host's topology report: as
//! JSON with `--json` (nodes, NICs, workers with why), as text without;
//! with `--target`, the rails it would form to that peer.

mod common;

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_tent-bench");

fn topology(extra: &[&str]) -> String {
    let out = Command::new(BENCH)
        .args(["--mode", "topology", "--transport", "tcp", "--threads", "2"])
        .args(extra)
        .env("TENT_LOG", "off")
        .env_remove("TENT_CONF")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_json_report_has_nodes_workers_and_why() {
    let text = topology(&["--json"]);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    let nodes = v["numa_nodes"].as_array().unwrap();
    assert!(!nodes.is_empty(), "{v}");
    assert!(
        nodes
            .iter()
            .all(|n| !n["cpus"].as_array().unwrap().is_empty()),
        "{v}"
    );
    let workers = v["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "{v}");
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(w["worker"], i, "{v}");
        let reason = w["reason"].as_str().unwrap();
        // Pinned by default, each on a core of its own, and why.
        assert!(w["core"].is_u64(), "{v}");
        assert!(reason.starts_with("topology default"), "{v}");
    }
    assert!(v["rdma_nics"].is_array(), "{v}");
    for n in v["rdma_nics"].as_array().unwrap() {
        assert!(!n["gid"]["reason"].as_str().unwrap().is_empty(), "{v}");
    }
    assert!(
        v["transports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "tcp"),
        "{v}"
    );
    assert!(v.get("rails_to").is_none(), "no --target, no rails: {v}");
}

#[test]
fn the_text_report_has_a_line_per_node_and_worker() {
    let text = topology(&[]);
    assert!(text.starts_with("NUMA nodes:\n  node "), "{text}");
    assert!(text.contains("\nworkers:\n  worker 0: core "), "{text}");
    assert!(!text.contains("core ?"), "every worker pinned: {text}");
    assert!(text.contains("\n  worker 1: core "), "{text}");
    assert!(text.contains("\ntransports: "), "{text}");
}

#[test]
fn with_a_target_it_shows_the_rails_to_it() {
    let (mut target, name) = common::target();
    let text = topology(&["--json", "--target", &name]);
    let plain = topology(&["--target", &name]);
    drop(target.stdin.take());
    assert!(target.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    let rails = &v["rails_to"];
    assert_eq!(rails["segment"], name.as_str(), "{v}");
    if v["rdma_nics"].as_array().unwrap().is_empty() {
        assert_eq!(rails["note"], "no RDMA NIC here", "{v}");
        assert!(rails["rdma"].as_array().unwrap().is_empty(), "{v}");
    } else {
        assert!(!rails["rdma"].as_array().unwrap().is_empty(), "{v}");
    }
    // The target serves TCP on the address its name holds: a rail to it,
    // leaving through the interface that holds the route's local address.
    let host = name.rsplit_once(':').unwrap().0;
    let tcp = rails["tcp"].as_array().unwrap();
    assert!(!tcp.is_empty(), "no TCP rail to a TCP target: {v}");
    assert!(
        tcp.iter()
            .any(|r| r["remote_addr"].as_str().unwrap().starts_with(host)
                && !r["local"].as_str().unwrap().is_empty()
                && !r["local_addr"].as_str().unwrap().is_empty()),
        "{v}"
    );
    assert!(rails["tcp_note"].is_null(), "{v}");
    // And the text form lists it.
    assert!(
        plain.contains(&format!("TCP rails to {name}:\n  ")),
        "{plain}"
    );
}

#[test]
fn an_unreachable_target_is_an_error_naming_it() {
    let out = Command::new(BENCH)
        .args(["--mode", "topology", "--transport", "tcp"])
        .args(["--target", "127.0.0.1:1"])
        .env("TENT_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--target 127.0.0.1:1: "), "{err}");
}
