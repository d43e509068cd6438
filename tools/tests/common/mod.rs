//! What the tools' end-to-end tests share.

use std::process::Output;

/// `tent-bench args`, which must succeed: its standard output.
#[allow(dead_code)] // Not every test crate runs the bench this way.
pub(crate) fn bench_stdout(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tent-bench"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A finished run's status and both streams, for an assertion message.
pub(crate) fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
