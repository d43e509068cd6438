//! `tent-bench --mode soak` end to end: a seeded run with 30% completion
//! and 5% submit faults on the primary loses nothing, duplicates nothing,
//! and is reproducible from its seed. (The 1 M-task run is the release
//! command in README; CI runs a smaller one on the debug build.)

mod common;

fn soak(seed: &str) -> String {
    let text = common::bench_stdout(&["--mode", "soak", "--tasks", "50000", "--seed", seed]);
    text.lines()
        .find(|l| l.starts_with("soak:"))
        .unwrap_or_else(|| panic!("no soak line: {text}"))
        .to_owned()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split([' ', '|'])
        .find_map(|kv| kv.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn seeded_soak_loses_and_duplicates_nothing_and_reproduces() {
    let a = soak("11");
    assert_eq!(field(&a, "ok="), "50000", "{a}");
    for k in ["failed=", "lost=", "duplicated=", "exhausted="] {
        assert_eq!(field(&a, k), "0", "{a}");
    }
    assert_eq!(field(&a, "intact="), "true", "{a}");
    let rejected: u64 = field(&a, "rejected=").parse().unwrap();
    let corrupted: u64 = field(&a, "corrupted=").parse().unwrap();
    let moved: u64 = field(&a, "rdma->tcp=").parse().unwrap();
    assert!(rejected > 1000 && corrupted > 10_000, "{a}");
    assert_eq!(moved, rejected + corrupted, "one switch per fault: {a}");
    // Same seed, same faults (the timing part aside).
    let b = soak("11");
    for k in ["rejected=", "corrupted=", "fallback="] {
        assert_eq!(field(&a, k), field(&b, k), "{a}\n{b}");
    }
}
