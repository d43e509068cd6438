//! `tools/bench-rails.sh`'s driver (tools/bench_rails.py) end to end over
//! real links between namespaces, with this build's tent-bench: both
//! policies give a figure, and a mid-run `--cut` shows in the series (the
//! rail sum after it bounds what comes through). Needs root and iproute2;
//! with CI=true it must run.

mod common;

use common::text;
use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_tent-bench");
const DRIVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench_rails.py");
const NETNS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/netns.sh");

/// `None` (after saying why) where namespaces cannot be made.
fn driver(args: &[&str]) -> Option<Output> {
    if !Command::new(NETNS)
        .arg("check")
        .status()
        .is_ok_and(|s| s.success())
    {
        let why = "cannot create network namespaces here (needs root and iproute2)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: netns tests must run: {why}"
        );
        eprintln!("SKIP: {why}");
        return None;
    }
    Some(
        Command::new("python3")
            .arg(DRIVER)
            .args(["--bench", BENCH])
            .args(args)
            .env("TENT_LOG", "error")
            .output()
            .unwrap(),
    )
}

/// The number after `key` in `line` ("... KEY 0.42 Gbit/s ...").
fn after(line: &str, key: &str) -> f64 {
    let rest = line
        .split_once(key)
        .unwrap_or_else(|| panic!("no {key:?} in {line}"))
        .1;
    rest.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in {line}"))
}

#[test]
fn netns_bench_rails_prints_both_policies_and_the_cut() {
    let Some(out) = driver(&[
        "--rates",
        "200mbit,100mbit",
        "--size",
        "4M",
        "--duration",
        "1",
    ]) else {
        return;
    };
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for policy in ["smart", "rr"] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(policy))
            .unwrap_or_else(|| panic!("no {policy} row: {all}"));
        // GB/s then Gbit/s: one rate, two units; below the rail sum.
        let cols: Vec<f64> = row
            .split_whitespace()
            .skip(1)
            .take(2)
            .map(|c| c.parse().unwrap())
            .collect();
        assert!((cols[0] * 8.0 - cols[1]).abs() < 0.02, "{row}");
        assert!(cols[1] > 0.0 && cols[1] <= 0.3, "{row}");
    }
    assert!(stdout.contains("smart/rr: "), "{all}");

    // Both rails at 200 Mbit/s, rail 2 cut to 20 Mbit/s a second in.
    let Some(out) = driver(&[
        "--rails",
        "2",
        "--rate",
        "200mbit",
        "--cut",
        "2:20mbit@1",
        "--duration",
        "3",
        "--cut-block",
        "1M",
        "--cut-inflight",
        "4",
        "--policy",
        "rr",
    ]) else {
        return;
    };
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("rr: window"))
        .unwrap_or_else(|| panic!("no rr line: {all}"));
    let before = after(line, "the second before the cut");
    let late = after(line, "from 1 s after the cut");
    // 0.4 Gbit/s of rails before; 0.22 after, whatever the policy does.
    assert!(before > 0.15 && before <= 0.4, "{line}");
    assert!(late <= 0.22 * 1.1, "the cut did not take: {line}");
    assert!(
        stdout.lines().any(|l| l.contains(" | ")),
        "no cut mark in the series: {all}"
    );
}

#[test]
fn netns_bench_rails_refuses_a_cut_of_a_rail_it_does_not_have() {
    let Some(out) = driver(&["--rails", "2", "--cut", "3:10mbit@1"]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rail 3"),
        "{}",
        text(&out)
    );
}
