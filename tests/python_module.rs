//! The Python module (`python/`, PyO3 + maturin): `python/test.sh` builds
//! it with `pip install ./python` into the venv `python/setup.sh` made (run
//! by `tools/setup.sh`) and runs its pytest suite: a two-process transfer
//! with verified data, an engine attached to a daemon this test starts,
//! notifications, block lists, the ring, and every
//! bad-input case at the boundary. Run from here so that the README's one
//! test command covers the bindings too.

mod common;

use std::process::Command;

#[test]
fn python_module_builds_and_its_pytest_suite_passes() {
    let root = env!("CARGO_MANIFEST_DIR");
    // A daemon for the tests of attached engines (`test_attach.py`).
    let sock = std::env::temp_dir().join(format!("tentd-py-{}.sock", std::process::id()));
    let daemon = tent::daemon::Daemon::start(
        tent::Engine::new(common::test_config()).expect("the daemon's engine"),
        &sock,
    )
    .expect("start a daemon");
    let out = Command::new(format!("{root}/python/test.sh"))
        .current_dir(root)
        .env("TENT_TEST_DAEMON", daemon.socket_path())
        .output()
        .expect("run python/test.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "python/test.sh failed:\n{text}");
    assert!(
        text.contains(" passed"),
        "pytest reported no passed tests:\n{text}"
    );
}
