//! `tent-bench --mode qos` end to end (a short run on the debug build;
//! README has the release command): every case prints its JSON line with
//! the figures issue 15 names, no WRITE fails, and the slot file works
//! across the two processes: LOW alone is never held (the slots are
//! work-conserving), LOW beside another process's HIGH stream is. The
//! two streams as clients of one daemon, and two LOW clients sharing one
//! by weight, report too.
//! Figures are not judged here: speed targets live in the benchmark.

mod common;

use serde_json::Value;

/// A short `--mode qos --json` run with `extra` flags: its output, and
/// each line parsed.
fn short_qos_run(extra: &[&str]) -> (String, Vec<Value>) {
    let mut args = vec![
        "--mode",
        "qos",
        "--duration",
        "0.3",
        "--block-size",
        "1M",
        "--high-rate",
        "2000",
        "--json",
    ];
    args.extend_from_slice(extra);
    let text = common::bench_stdout(&args);
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (text, lines)
}

#[test]
fn qos_mode_reports_every_case_and_slots_hold_low_only_beside_high() {
    let (text, lines) = short_qos_run(&[]);
    assert_eq!(lines.len(), 16, "{text}");
    for t in ["shm", "tcp"] {
        let cases: Vec<&Value> = lines
            .iter()
            .filter(|l| l["transport"] == t && l["case"] != "fairness")
            .collect();
        let slots: Vec<Value> = cases
            .iter()
            .map(|l| l["slot_interval_ms"].clone())
            .collect();
        let procs: Vec<u64> = cases
            .iter()
            .map(|l| l["processes"].as_u64().unwrap())
            .collect();
        let daemon: Vec<bool> = cases
            .iter()
            .map(|l| l["clients_of_one_daemon"].as_bool().unwrap())
            .collect();
        assert_eq!(procs, [1, 2, 2, 2, 2, 2], "{text}");
        assert_eq!(
            slots,
            [
                Value::Null,
                Value::Null,
                1.into(),
                2.into(),
                10.into(),
                Value::Null
            ],
            "{text}"
        );
        assert_eq!(daemon, [false, false, false, false, false, true], "{text}");
        // Two LOW clients of one daemon at once: equal weights with one
        // flooding, then 3:1; both move data, no WRITE fails.
        let shares: Vec<&Value> = lines
            .iter()
            .filter(|l| l["transport"] == t && l["case"] == "fairness")
            .collect();
        let weights: Vec<Value> = shares.iter().map(|l| l["weights"].clone()).collect();
        assert_eq!(
            weights,
            [serde_json::json!([1, 1]), serde_json::json!([3, 1])],
            "{text}"
        );
        for l in &shares {
            for k in ["a_gbps", "b_gbps"] {
                assert!(l[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {l}");
            }
            assert_eq!(l["errors"], 0, "{l}");
        }
        for l in &cases {
            for k in [
                "high_p99_idle_us",
                "high_p99_loaded_us",
                "low_gbps_solo",
                "low_gbps_loaded",
            ] {
                assert!(l[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {l}");
            }
            assert_eq!(l["errors"], 0, "{l}");
            assert!(l["high_ops_loaded"].as_u64() > Some(0), "{l}");
            let holds = |k: &str| l[k].as_u64().unwrap();
            if l["slot_interval_ms"].is_null() {
                // No slot file: nothing ever holds LOW back.
                assert_eq!(holds("low_gate_holds_solo"), 0, "{l}");
                assert_eq!(holds("low_gate_holds_loaded"), 0, "{l}");
            } else {
                // A slot file: LOW alone goes in every slot; beside the
                // other process's HIGH stream, slots 0 and 1 hold it.
                assert_eq!(holds("low_gate_holds_solo"), 0, "{l}");
                assert!(holds("low_gate_holds_loaded") > 0, "{l}");
            }
            let cpu = &l["high_p99_cpu_busy_us"];
            assert_eq!(cpu.is_null(), l["processes"] == 2, "{l}");
            // Seed 001's statistics ride along.
            assert!(l["stats"]["high"]["accepted"].as_u64() > Some(0), "{l}");
        }
    }
}

/// `--qos-cases` and `--qos-transports` run only the cases named, over
/// only the transports named; a transport the cases cannot use is refused.
#[test]
fn qos_mode_runs_only_the_cases_and_transports_named() {
    let (text, lines) = short_qos_run(&[
        "--qos-cases",
        "tentd,one-process",
        "--qos-transports",
        "tcp",
    ]);
    let rows: Vec<(&str, u64, bool)> = lines
        .iter()
        .map(|l| {
            (
                l["transport"].as_str().unwrap_or("?"),
                l["processes"].as_u64().unwrap_or(0),
                l["clients_of_one_daemon"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    assert_eq!(rows, [("tcp", 1, false), ("tcp", 2, true)], "{text}");
    for l in &lines {
        assert_eq!(l["errors"], 0, "{l}");
    }

    let out = common::bench_output(&["--mode", "qos", "--qos-transports", "rdma"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--qos-transports rdma: the qos cases run over shm and tcp only"),
        "{err}"
    );
}
