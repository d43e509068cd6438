//! A failed `Engine::new` stops and joins everything it had started: a
//! caller retrying a start that cannot succeed does not pile up threads.

mod common;

use std::net::TcpListener;

use common::test_config;
use tent::{Engine, ErrorKind};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn failed_start_leaks_no_threads() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut c = test_config();
    c.workers.count = 2;
    c.rpc_server_hostname = "127.0.0.1".into();
    c.rpc_server_port = port;
    // Warm up once (lazy runtime threads, if any, start here).
    let first = Engine::new(c.clone()).unwrap_err();
    assert_eq!(first.kind(), ErrorKind::InvalidArgument, "{first}");
    let before = threads();
    for i in 0..50 {
        let e = Engine::new(c.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "try {i}: {e}");
    }
    let after = threads();
    assert!(
        after <= before + 2,
        "50 failed starts left threads behind: {before} before, {after} after"
    );
    // The engine starts normally once the port is free.
    drop(taken);
    let e = Engine::new(c).expect("engine on a free port");
    drop(e);
}

/// Each worker's pinning is known when `Engine::new` returns: a report
/// taken at once names its core (before, it read "not pinned" until the
/// worker's thread first ran, and the Soft-RoCE topology test failed now
/// and then on it).
#[test]
fn workers_pinning_is_known_when_new_returns() {
    for _ in 0..20 {
        let mut c = test_config();
        c.workers.pin = true;
        let e = Engine::new(c).unwrap();
        let cores = e.worker_cores();
        assert!(cores.iter().all(Option::is_some), "{cores:?}");
    }
}
