//! `tent-bench --mode target` prints where to scrape it as the second line
//! of its stdout, after the segment name, and that URL serves Prometheus
//! text.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_tent-bench");

#[test]
fn a_target_prints_its_metrics_url_second_and_it_serves_metrics() {
    // Another target on this host may hold the default port: then this
    // exercises the fallback to an ephemeral one.
    let (mut child, mut out, name) = common::target_with_output();
    let mut metrics = String::new();
    out.read_line(&mut metrics).unwrap();
    assert!(name.contains(':'), "first line: the segment name: {name:?}");
    let url = metrics
        .trim()
        .strip_prefix("metrics: http://")
        .and_then(|u| u.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("second line: {metrics:?}"));
    let addr: SocketAddr = url.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("tent_transport_failover_total"), "{body}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// `--scrape-hz`: an initiator scrapes its own engine's `/metrics` while it
/// runs, and says how many scrapes it made.
#[test]
fn an_initiator_scrapes_its_own_metrics_while_it_runs() {
    let out = Command::new(BENCH)
        .args(["--transport", "local"])
        .args(["--block-size", "4096", "--batch", "8", "--duration", "1"])
        .args(["--no-baseline", "--json", "--scrape-hz", "50"])
        .env("TENT_LOG", "off")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let n: u64 = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("tent-bench: ")?
                .strip_suffix(" scrapes of /metrics")
        })
        .unwrap_or_else(|| panic!("no scrape count: {stderr}"))
        .parse()
        .unwrap();
    assert!(n >= 10, "{n} scrapes in about a second at 50 Hz");
}

/// A TCP target reading `conf` (`TENT_LOG=off` when `quiet`, else neither
/// `TENT_LOG` nor `TENT_LOG_LEVEL`), past its first stdout line (the
/// segment name): the child, its stderr lines as they come, its stdout.
fn sighup_target(
    conf: &std::path::Path,
    quiet: bool,
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<String>,
    BufReader<std::process::ChildStdout>,
) {
    let mut cmd = Command::new(BENCH);
    cmd.args(["--mode", "target", "--transport", "tcp"])
        .args(["--buffer-size", "1M", "--exit-on-stdin-eof"])
        .env("TENT_CONF", conf)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if quiet {
        cmd.env("TENT_LOG", "off");
    } else {
        cmd.env_remove("TENT_LOG").env_remove("TENT_LOG_LEVEL");
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for l in err.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    (child, rx, out)
}

/// SIGHUP makes a target read its configuration again and apply it with
/// `Engine::reload`: a reloadable key is applied (the generation moves),
/// one that needs a restart is refused by name.
#[test]
fn sighup_reloads_a_targets_configuration() {
    let dir = std::env::temp_dir().join(format!("tent-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("tent.json");
    std::fs::write(&conf, r#"{"max_failover_attempts": 3}"#).unwrap();
    let (mut child, rx, _out) = sighup_target(&conf, true);
    let pid = child.id() as i32;
    let hup_and_wait = |text: &str| {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let l = rx.recv_timeout(left).expect("the target said nothing");
            if l.contains("reload") {
                assert!(l.contains(text), "{l}");
                return;
            }
        }
    };
    std::fs::write(&conf, r#"{"max_failover_attempts": 5}"#).unwrap();
    hup_and_wait("configuration reloaded (generation 2)");
    std::fs::write(&conf, r#"{"max_failover_attempts": 5, "block_size": 4096}"#).unwrap();
    hup_and_wait("reload refused: InvalidArgument: reload: block_size cannot change");
    // TENT_LOG decides what this target logs: a new log_level is refused.
    std::fs::write(
        &conf,
        r#"{"max_failover_attempts": 5, "log_level": "debug"}"#,
    )
    .unwrap();
    hup_and_wait("reload refused: InvalidArgument: reload: log_level cannot change here");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without TENT_LOG the target logs at its configuration's `log_level`,
/// and SIGHUP with another applies it: the reload's own INFO line shows.
#[test]
fn sighup_applies_a_new_log_level() {
    let dir = std::env::temp_dir().join(format!("tent-sighup-level-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("tent.json");
    std::fs::write(&conf, r#"{"log_level": "warn"}"#).unwrap();
    let (mut child, rx, _out) = sighup_target(&conf, false);
    std::fs::write(&conf, r#"{"log_level": "info"}"#).unwrap();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    let mut traced = false;
    while !traced {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let l = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no INFO line: {lines:#?}"));
        assert!(!l.contains("reload refused"), "{l}");
        // The tracing line (colours or not), not the target's own line.
        traced = l.contains("INFO") && l.contains("configuration reloaded") && l.contains("keys");
        lines.push(l);
    }
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}
