//! Shared helpers for the end-to-end tests.
#![allow(dead_code)]

pub(crate) mod slots;
pub(crate) mod stub;

use std::time::Duration;

use tent::{Config, Cqe, Engine, Ring};

/// One unpinned worker that parks quickly (these machines have 2 cores).
pub(crate) fn test_config() -> Config {
    let mut c = Config::default();
    c.workers.count = 1;
    c.workers.pin = false;
    c.workers.spin_us = Duration::from_micros(20);
    c.workers.yield_us = Duration::from_micros(50);
    c.workers.park_timeout_ms = Duration::from_millis(20);
    c.default_timeout_ms = Duration::from_millis(10_000);
    // The HTTP endpoint on an ephemeral port: many engines run at once.
    c.metrics.http_port = 0;
    // CI runs the TCP tests once more on the epoll fallback.
    if let Ok(b) = std::env::var("TENT_TRANSPORTS_TCP_BACKEND") {
        c.transports.tcp.backend = tent::config::TcpBackend::from_name(&b)
            .expect("TENT_TRANSPORTS_TCP_BACKEND: auto, io_uring or epoll");
    }
    c
}

pub(crate) fn engine() -> Engine {
    Engine::new(test_config()).expect("engine")
}

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Submit what was pushed and collect `n` CQEs.
pub(crate) fn reap(ring: &mut Ring, n: usize) -> Vec<Cqe> {
    if let Err(e) = ring.submit() {
        // Completions queued before a shutdown are still there to reap.
        assert_eq!(e.kind(), tent::ErrorKind::Shutdown, "{e}");
    }
    let mut out = Vec::with_capacity(n);
    let start = std::time::Instant::now();
    while out.len() < n {
        out.extend(ring.completion());
        if out.len() < n {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for CQEs ({} of {n})",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}
pub(crate) mod held;
pub(crate) mod netns;

/// Run this binary's test `test` as a target child (with `env` set): the
/// child, its output (kept open for whatever it prints later), and the
/// words after `marker` on the line it prints once ready.
// The child is handed to the caller, who waits for (or kills) it.
#[allow(clippy::zombie_processes)]
pub(crate) fn target_child(
    test: &str,
    env: &str,
    marker: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
    Vec<String>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let marker = format!("{marker} ");
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            let status = child.wait();
            panic!("child exited early: {status:?}");
        }
        // libtest prints "test NAME ... " on the same line.
        if let Some(at) = line.find(&marker) {
            let words = line[at + marker.len()..]
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            return (child, out, words);
        }
    }
}
