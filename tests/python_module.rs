//! The Python module (`python/`, PyO3 + maturin): `python/test.sh` builds
//! it with `pip install ./python` into the venv `python/setup.sh` made (run
//! by `tools/setup.sh`) and runs its pytest suite: a two-process transfer
//! with verified data, notifications, block lists, the ring, and every
//! bad-input case at the boundary. Run from here so that the README's one
//! test command covers the bindings too.

use std::process::Command;

#[test]
fn python_module_builds_and_its_pytest_suite_passes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/python/test.sh"))
        .current_dir(root)
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
