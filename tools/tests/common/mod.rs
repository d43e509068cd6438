//! What the tools' end-to-end tests share.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

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

/// `tent-bench args` with its log off, whatever its exit: the output.
#[allow(dead_code)] // Not every test crate runs the bench this way.
pub(crate) fn bench_output(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tent-bench"))
        .args(args)
        .env("TENT_LOG", "off")
        .output()
        .unwrap()
}

/// The JSON lines of a run's standard output.
#[allow(dead_code)] // As above.
pub(crate) fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
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

/// A TCP target started by hand (`--exit-on-stdin-eof`: dropping its
/// stdin stops it), and its segment name.
#[allow(dead_code)] // Not every test crate starts a target.
pub(crate) fn target() -> (Child, String) {
    let (child, _, name) = target_with_output();
    (child, name)
}

/// [`target`], with the rest of its standard output to read (its second
/// line says where to scrape it).
#[allow(dead_code)] // As above.
pub(crate) fn target_with_output() -> (Child, BufReader<ChildStdout>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tent-bench"))
        .args(["--mode", "target", "--transport", "tcp"])
        .args(["--buffer-size", "1M", "--exit-on-stdin-eof"])
        .env("TENT_LOG", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let name = line.trim().to_owned();
    assert!(!name.is_empty(), "the target printed no segment name");
    (child, out, name)
}
