//! `tent-bench --peers N`: the initiator's in-flight slots go round robin
//! over N targets (slot b to peer b % N), spawned by it or named with
//! `--mode initiator --target A,B,..`; the peer count shows only when it
//! is above one.

mod common;

use common::{bench_output as run, json_lines as lines, target, text};
use std::process::Output;

/// A run that succeeded with no op failed: its point line and its rail
/// lines.
fn point_and_rails(out: &Output) -> (serde_json::Value, Vec<serde_json::Value>) {
    let all = text(out);
    assert!(out.status.success(), "{all}");
    let lines = lines(out);
    let point = lines
        .iter()
        .find(|o| o.get("block_size").is_some() && o.get("gbps").is_some())
        .unwrap_or_else(|| panic!("no result line: {all}"))
        .clone();
    assert_eq!(point["errors"].as_u64(), Some(0), "{all}");
    assert!(point["ops"].as_u64().is_some_and(|n| n > 0), "{all}");
    let rails = lines
        .into_iter()
        .filter(|o| o.get("rail_remote").is_some())
        .collect();
    (point, rails)
}

/// Every peer's rail carried bytes, and no two peers share a rail.
fn every_peer_written(rails: &[serde_json::Value], peers: usize, all: &str) {
    assert_eq!(rails.len(), peers, "one rail per peer: {all}");
    let mut remotes: Vec<&str> = rails
        .iter()
        .map(|r| r["rail_remote"].as_str().unwrap())
        .collect();
    remotes.sort_unstable();
    remotes.dedup();
    assert_eq!(remotes.len(), peers, "{all}");
    for r in rails {
        assert!(r["bytes"].as_u64().is_some_and(|b| b > 0), "{r}: {all}");
    }
}

#[test]
fn spawned_peers_each_receive_their_slots() {
    let out = run(&[
        "--transport",
        "tcp",
        "--peers",
        "3",
        "--block-size",
        "4K",
        "--batch",
        "6",
        "--duration",
        "0.2",
        "--json",
        "--no-baseline",
    ]);
    let all = text(&out);
    let (point, rails) = point_and_rails(&out);
    assert_eq!(point["peers"].as_u64(), Some(3), "{all}");
    every_peer_written(&rails, 3, &all);

    // The text header names the peers; one peer's has no count.
    let out = run(&[
        "--transport",
        "tcp",
        "--peers",
        "2",
        "--block-size",
        "4K",
        "--batch",
        "2",
        "--duration",
        "0.2",
        "--no-baseline",
    ]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let header = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert!(header.contains(" batch=2 peers=2 target="), "{all}");
}

#[test]
fn one_peer_prints_no_peer_count() {
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "4K",
        "--batch",
        "4",
        "--duration",
        "0.2",
        "--json",
        "--no-baseline",
    ]);
    let (point, _) = point_and_rails(&out);
    assert!(point.get("peers").is_none(), "{}", text(&out));
}

#[test]
fn an_initiator_takes_a_list_of_targets() {
    let (mut a, name_a) = target();
    let (mut b, name_b) = target();
    let list = format!("{name_a},{name_b}");
    let out = run(&[
        "--mode",
        "initiator",
        "--transport",
        "tcp",
        "--target",
        &list,
        "--block-size",
        "4K",
        "--batch",
        "4",
        "--duration",
        "0.2",
        "--json",
        "--no-baseline",
    ]);
    // A --peers that disagrees with the list is refused.
    let wrong = run(&[
        "--mode",
        "initiator",
        "--transport",
        "tcp",
        "--target",
        &list,
        "--peers",
        "3",
        "--batch",
        "4",
    ]);
    for child in [&mut a, &mut b] {
        drop(child.stdin.take());
        child.wait().unwrap();
    }
    let all = text(&out);
    let (point, rails) = point_and_rails(&out);
    assert_eq!(point["peers"].as_u64(), Some(2), "{all}");
    every_peer_written(&rails, 2, &all);
    assert_eq!(wrong.status.code(), Some(2), "{}", text(&wrong));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("--peers 3"),
        "{}",
        text(&wrong)
    );
}

#[test]
fn peers_are_refused_where_they_cannot_be_used() {
    for (args, says) in [
        (&["--peers", "0"][..], "out of range"),
        (&["--peers", "257", "--batch", "300"][..], "out of range"),
        (
            &["--peers", "2", "--transport", "local", "--batch", "2"][..],
            "--transport local",
        ),
        (
            &["--peers", "4", "--transport", "tcp", "--batch", "2"][..],
            "--batch 2",
        ),
        (
            &["--peers", "2", "--mode", "idle", "--batch", "2"][..],
            "applies to the initiator",
        ),
    ] {
        let out = run(args);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {all}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{args:?}: {all}"
        );
    }
}
