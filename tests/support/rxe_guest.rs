//! Booting the Soft-RoCE guest from a host test (shared by
//! `tests/rxe_verbs.rs`, `tests/rxe_device.rs` and
//! `tools/tests/rxe_bench.rs`, included by path).
//! Lines meant for `.ci/run` go straight to stderr, past libtest's capture.

/// Print `line` on stderr even while libtest captures output.
pub(crate) fn say(line: &str) {
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
}

/// Boot the guest once with `rails` rails and `runs` (`BINARY::ARGS`) and
/// return its console, asserting the run passed. `None` (after printing why)
/// when this machine cannot run the guest; with `CI=true` that fails.
pub(crate) fn boot(repo_root: &str, rails: u32, runs: &[String]) -> Option<String> {
    let script = format!("{repo_root}/tools/rxe-vm.sh");
    let ok = std::process::Command::new(&script)
        .arg("--check")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let why = "no Soft-RoCE guest here (tools/rxe-vm.sh --check failed: needs qemu and apt access; run tools/setup.sh)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: the real-verbs substrate must run: {why}"
        );
        say(&format!("SKIP: {why}"));
        return None;
    }
    let out = std::process::Command::new(&script)
        .arg("--rails")
        .arg(rails.to_string())
        .args(runs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "guest run failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(text)
}

/// The host side of a test binary whose `rxe_` tests run in the guest:
/// boot it once with this binary's `rxe_` tests (`rails` rails), require at
/// least one to pass there, and report the guest's `RXE-OK` lines and the
/// pass count for `.ci/run`. Does nothing inside the guest.
#[allow(dead_code)] // tools/tests/rxe_bench.rs includes this file too
pub(crate) fn run_this_binary(repo_root: &str, rails: u32) {
    if std::env::var("TENT_RXE_GUEST").as_deref() == Ok("1") {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let run = format!(
        "{}::rxe_ --skip rxe_guest --test-threads=1 --nocapture",
        exe.display()
    );
    let Some(text) = boot(repo_root, rails, &[run]) else {
        return;
    };
    let passed: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("rxe-vm: total passed: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(passed > 0, "no test passed in the guest:\n{text}");
    // What the guest measured (timings, rails), past libtest's capture.
    for l in text.lines().filter(|l| l.contains("RXE-OK")) {
        say(l.trim());
    }
    say(&format!("SUBSTRATE rxe-guest: {passed} tests passed"));
}
