//! `tent-bench --transport rdma` inside the Soft-RoCE guest (one boot of
//! `tools/rxe-vm.sh`): the default run (it spawns its own target) must exit
//! 0, report a figure for each block size, and show bytes on every rail.
//! Functional figures, not speed (the guest is emulated). Outside the guest
//! the same binary must say "RDMA unavailable" and exit non-zero.

#[test]
fn rdma_bench_outside_the_guest_says_rdma_unavailable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tent-bench"))
        .args(["--transport", "rdma"])
        .output()
        .unwrap();
    if std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        return; // a machine with RDMA devices: nothing to check here
    }
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RDMA unavailable"), "{err}");
}

#[path = "../../tests/support/rxe_guest.rs"]
mod rxe_guest;

#[test]
fn rxe_bench_runs_over_rdma_in_the_guest() {
    let bench = env!("CARGO_BIN_EXE_tent-bench");
    let run = format!(
        "{bench}::--transport rdma --op read --block-size 1M --batch 4 --duration 0.5 --buffer-size 16M --no-baseline"
    );
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let Some(text) = rxe_guest::boot(root, 2, &[run]) else {
        return;
    };
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("1MiB |"))
        .unwrap_or_else(|| panic!("no result row:\n{text}"));
    let gbps: f64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
    assert!(gbps > 0.0, "{row}");
    let rails: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("# rail rxe"))
        .collect();
    assert_eq!(rails.len(), 2, "{text}");
    for r in &rails {
        let bytes: u64 = r
            .split(": ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(bytes > 0, "every rail carried bytes: {r}");
    }
    rxe_guest::say(&format!("tent-bench over RDMA in the guest: {row}"));
    rxe_guest::say("SUBSTRATE rxe-guest: 1 tests passed");
}
