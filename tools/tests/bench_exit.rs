//! `tent-bench`'s exit status (issue 11, item 6b): a run in which ops
//! failed exits non-zero with a summary line (how many failed out of how
//! many, and the first error's kind and message); a clean run exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_tent-bench");

#[test]
fn initiator_whose_target_is_killed_exits_non_zero_with_a_summary() {
    for transport in ["shm", "tcp"] {
        let mut target = Command::new(BENCH)
            .args(["--mode", "target", "--transport", transport])
            .args(["--buffer-size", "1M"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(target.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let name = line.trim().to_owned();
        assert!(!name.is_empty(), "the target printed no segment name");
        let initiator = Command::new(BENCH)
            .args(["--mode", "initiator", "--transport", transport])
            .args(["--target", &name, "--block-size", "8", "--batch", "8"])
            .args(["--duration", "2", "--no-baseline"])
            .env("TENT_LOG", "off")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        target.kill().unwrap();
        target.wait().unwrap();
        let out = initiator.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!out.status.success(), "{transport}: ops failed: {all}");
        assert_eq!(out.status.code(), Some(1), "{transport}: {all}");
        let summary = stderr
            .lines()
            .find(|l| l.starts_with("tent-bench: FAILED:"))
            .unwrap_or_else(|| panic!("{transport}: no summary line: {all}"));
        // "tent-bench: FAILED: N of M ops failed; first error: Kind: message"
        let nums: Vec<u64> = summary
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(
            nums.len() >= 2 && nums[0] > 0 && nums[0] <= nums[1],
            "{transport}: {summary}"
        );
        let first = summary
            .split_once("first error: ")
            .map(|(_, f)| f)
            .unwrap_or_else(|| panic!("{transport}: no first error: {summary}"));
        let (kind, msg) = first
            .split_once(": ")
            .unwrap_or_else(|| panic!("{transport}: no message: {summary}"));
        assert!(
            tent::ErrorKind::ALL.iter().any(|k| k.name() == kind),
            "{transport}: {kind:?} is not a kind: {summary}"
        );
        assert!(!msg.trim().is_empty(), "{transport}: {summary}");
    }
}

#[test]
fn clean_run_exits_zero() {
    let out = Command::new(BENCH)
        .args(["--transport", "local", "--block-size", "4K"])
        .args(["--duration", "0.2", "--no-baseline"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("FAILED"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
