//! `tent-bench --mode sq` end to end on the simulated verbs provider (a
//! small run on the debug build; README has the release command): every
//! configuration prints its JSON line, nothing is lost or duplicated, the
//! admission gate turns a burst's refusals into waits with no SqFull
//! error, and least_loaded keeps 4 QPs with a slow one more even than
//! static does.

mod common;

use serde_json::Value;

#[test]
fn sq_mode_reports_every_configuration_and_admission_holds_bursts_back() {
    let text = common::bench_stdout(&["--mode", "sq", "--sq-requests", "20000", "--json"]);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let part = |p: &str| -> Vec<&Value> { lines.iter().filter(|l| l["part"] == p).collect() };
    let burst = part("burst");
    assert_eq!(burst.len(), 6, "{text}");
    for l in &burst {
        for k in ["lost", "duplicated", "failed", "sq_full_errors"] {
            assert_eq!(l[k], 0, "{k}: {l}");
        }
        let held = l["worker_held_max"].as_u64().unwrap();
        if l["admission"] == true {
            // The gate kept the worker's work within the queue's depth.
            assert_eq!((l["sq_full_turns"].as_u64(), held), (Some(0), 0), "{l}");
        } else {
            assert!(l["sq_full_turns"].as_u64().unwrap() > 0, "{l}");
            assert!(held > 0, "{l}");
        }
    }
    assert!(
        burst
            .iter()
            .any(|l| l["admission_waits"].as_u64() > Some(0)),
        "the gate never made a submitter wait: {text}"
    );
    let policy = part("policy");
    assert_eq!(policy.len(), 3, "{text}");
    let stddev = |name: &str| {
        policy
            .iter()
            .find(|l| l["policy"] == name)
            .and_then(|l| l["depth_stddev"].as_f64())
            .unwrap()
    };
    assert!(
        stddev("least_loaded") < stddev("static") / 2.0,
        "least_loaded {} vs static {}: {text}",
        stddev("least_loaded"),
        stddev("static")
    );
    let post = part("post");
    assert_eq!(post.len(), 1, "{text}");
    assert!(
        post[0]["ns_per_wr_admission_off"].as_f64() > Some(0.0),
        "{text}"
    );
}
