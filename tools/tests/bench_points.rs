//! A measurement point of `tent-bench` reports a figure only from ops that
//! completed inside its measured window (issue 13, "fix while there"): one
//! op longer than warm-up plus `--duration` used to leave the window empty
//! and the figure divided by nothing ("268435456.000 GB/s").

mod common;

use common::{bench_output as run, json_lines as lines, text};
use std::process::Output;

/// The result line of the one point (it has `block_size` and `gbps`).
fn result(out: &Output) -> serde_json::Value {
    lines(out)
        .into_iter()
        .find(|o| o.get("block_size").is_some() && o.get("gbps").is_some())
        .unwrap_or_else(|| panic!("no result line: {}", text(out)))
}

/// The baseline line called `name` (its `baseline` field).
fn baseline(out: &Output, name: &str) -> serde_json::Value {
    lines(out)
        .into_iter()
        .find(|l| l["baseline"] == name)
        .unwrap_or_else(|| panic!("no {name} line: {}", text(out)))
}

#[test]
fn a_point_shorter_than_one_op_reports_no_figure_from_zero_ops() {
    // A local 256 MiB copy takes tens of milliseconds; the point asks for
    // one millisecond (and a fifth of it as warm-up).
    let block: u64 = 256 << 20;
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "256M",
        "--duration",
        "0.001",
        "--json",
        "--no-baseline",
    ]);
    let all = text(&out);
    let r = result(&out);
    match r["gbps"].as_f64() {
        None => {
            assert!(r["gbps"].is_null(), "{all}");
            assert!(!out.status.success(), "no figure, yet exit 0: {all}");
            assert!(all.contains("no op completed"), "{all}");
        }
        Some(gbps) => {
            // No memory system copies a terabyte a second on one thread.
            assert!(
                gbps.is_finite() && gbps > 0.0 && gbps < 1000.0,
                "a figure from no completed op: {gbps} GB/s\n{all}"
            );
            let ops = r["ops"].as_u64().unwrap_or_else(|| panic!("no ops: {all}"));
            let secs = r["secs"]
                .as_f64()
                .unwrap_or_else(|| panic!("no secs: {all}"));
            assert!(ops >= 1 && secs > 0.0, "{all}");
            let expect = (ops * block) as f64 / secs / 1e9;
            assert!(
                (gbps - expect).abs() <= expect * 1e-6,
                "gbps {gbps} is not ops x block / secs = {expect}: {all}"
            );
            assert!(out.status.success(), "{all}");
        }
    }
}

#[test]
fn a_point_with_no_op_done_by_max_seconds_reports_null_and_exits_1() {
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "256M",
        "--duration",
        "0.001",
        "--max-seconds",
        "0.002",
        "--json",
        "--no-baseline",
    ]);
    let all = text(&out);
    let r = result(&out);
    assert!(r["gbps"].is_null() && r["mops"].is_null(), "{all}");
    assert!(r["p50_us"].is_null(), "{all}");
    assert_eq!(r["ops"].as_u64(), Some(0), "{all}");
    assert_eq!(r["in_flight_at_cap"].as_u64(), Some(1), "{all}");
    assert_eq!(out.status.code(), Some(1), "{all}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("tent-bench: FAILED: no op completed")),
        "{all}"
    );
    // A cap shorter than the point itself is refused up front.
    let out = run(&[
        "--transport",
        "local",
        "--duration",
        "1",
        "--max-seconds",
        "0.5",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-seconds"),
        "{}",
        text(&out)
    );
}

#[test]
fn interval_series_covers_the_run_and_agrees_with_the_summary() {
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "1M",
        "--batch",
        "4",
        "--duration",
        "1",
        "--interval-ms",
        "100",
        "--json",
        "--no-baseline",
    ]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let lines = lines(&out);
    // The live start line first, then the series, then the summary.
    assert_eq!(lines[0]["event"], "start", "{all}");
    assert_eq!(lines[0]["interval_ms"].as_u64(), Some(100), "{all}");
    let series: Vec<(u64, f64)> = lines
        .iter()
        .filter(|o| o.get("t_ms").is_some())
        .map(|o| (o["t_ms"].as_u64().unwrap(), o["gbps"].as_f64().unwrap()))
        .collect();
    let at = |pred: fn(&serde_json::Value) -> bool| lines.iter().position(pred).unwrap();
    assert!(
        at(|o| o.get("t_ms").is_some()) == 1,
        "the series follows the start line: {all}"
    );
    assert!(
        at(|o| o.get("block_size").is_some() && o.get("ops").is_some()) == series.len() + 1,
        "the summary follows the series: {all}"
    );
    // Warm-up 0.2 s plus 1 s: at least 12 whole intervals, back to back.
    assert!(series.len() >= 12, "{all}");
    for (i, &(t_ms, gbps)) in series.iter().enumerate() {
        assert_eq!(t_ms, (i as u64 + 1) * 100, "{all}");
        assert!(gbps.is_finite() && gbps >= 0.0, "{all}");
    }
    let summary = result(&out)["gbps"].as_f64().unwrap();
    let mean = series.iter().map(|s| s.1).sum::<f64>() / series.len() as f64;
    assert!(
        mean > summary * 0.5 && mean < summary * 2.0,
        "series mean {mean} GB/s vs the point's {summary} GB/s: {all}"
    );
}

/// A small-op point is printed next to the rings alone at the same
/// `--batch` (issue 16's floor), with the ratio.
#[test]
fn a_small_op_point_prints_the_ring_alone_floor() {
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "8",
        "--batch",
        "8",
        "--duration",
        "0.2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let ring = baseline(&out, "ring_alone");
    assert_eq!(ring["batch"], 8, "{ring}");
    assert!(ring["mops"].as_f64().is_some_and(|m| m > 0.0), "{ring}");
    assert!(
        ring["tent_mops"].as_f64().is_some_and(|m| m > 0.0),
        "{ring}"
    );
    assert!(ring["ratio"].as_f64().is_some(), "{ring}");
}

/// A 4 KiB point with ops in flight is printed next to two memcpy loops:
/// one block copied over and over (L1), and one block per op in flight on
/// each side, the footprint the engine's copies work in.
#[test]
fn a_copy_point_prints_memcpy_alone_and_over_its_footprint() {
    let out = run(&[
        "--transport",
        "local",
        "--block-size",
        "4K",
        "--batch",
        "8",
        "--duration",
        "0.2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let one = baseline(&out, "memcpy_1thread");
    let over = baseline(&out, "memcpy_1thread_footprint");
    assert_eq!(over["slots"], 8, "{over}");
    for l in [&one, &over] {
        assert_eq!(l["block_size"], 4096, "{l}");
        assert!(l["gbps"].as_f64().is_some_and(|g| g > 0.0), "{l}");
        assert!(l["ratio"].as_f64().is_some(), "{l}");
    }
}
