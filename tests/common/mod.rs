//! Shared helpers for the end-to-end tests.
#![allow(dead_code)]

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
