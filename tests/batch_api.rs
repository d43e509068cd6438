//! End-to-end: the TENT-compatible batch API (Send + Sync, any thread).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{engine, pattern};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TaskState, op};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn engine_is_send_and_sync() {
    assert_send_sync::<Engine>();
}

#[test]
fn batch_lifecycle_and_status() {
    let e = engine();
    let src = e.allocate_memory(1 << 20).unwrap();
    let dst = e.allocate_memory(1 << 20).unwrap();
    src.write(0, &pattern(3, 1 << 20)).unwrap();
    let b = e.allocate_batch(8).unwrap();
    assert_eq!(e.batch_status(b).unwrap().state, TaskState::Initial);
    let reqs: Vec<_> = (0..4u64)
        .map(|i| {
            op::Write::new(
                LocalAddr::new(src.id(), i << 18),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr() + (i << 18)),
                1 << 18,
            )
            .build()
        })
        .collect();
    e.submit(b, &reqs).unwrap();
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(s.transferred_bytes, 1 << 20);
    for i in 0..4 {
        let t = e.status(b, i).unwrap();
        assert_eq!(
            (t.state, t.transferred_bytes, t.error),
            (TaskState::Completed, 1 << 18, None)
        );
    }
    assert_eq!(e.status(b, 5).unwrap().state, TaskState::Initial);
    assert_eq!(e.status_list(b).unwrap().len(), 4);
    let mut out = vec![0u8; 1 << 20];
    dst.read(0, &mut out).unwrap();
    assert!(out == pattern(3, 1 << 20));
    e.free_batch(b).unwrap();
    assert_eq!(e.credits_in_flight(), 0);
}

#[test]
fn batches_from_many_threads() {
    let e = Arc::new(engine());
    let dst = e.allocate_memory(8 * 4096).unwrap();
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let e = e.clone();
            let addr = dst.addr() + t * 4096;
            std::thread::spawn(move || {
                let src = e.allocate_memory(4096).unwrap();
                src.write(0, &pattern(t as u8, 4096)).unwrap();
                for _ in 0..50 {
                    let b = e.allocate_batch(1).unwrap();
                    e.submit(
                        b,
                        &[op::Write::new(
                            LocalAddr::new(src.id(), 0),
                            RemoteAddr::new(SegmentId::LOCAL, addr),
                            4096,
                        )
                        .build()],
                    )
                    .unwrap();
                    assert_eq!(
                        e.wait_batch(b, Duration::from_secs(10)).unwrap().state,
                        TaskState::Completed
                    );
                    e.free_batch(b).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for t in 0..8u64 {
        let mut out = vec![0u8; 4096];
        dst.read(t * 4096, &mut out).unwrap();
        assert_eq!(out, pattern(t as u8, 4096));
    }
}

#[test]
fn cancel_stops_a_large_queue() {
    let mut cfg = common::test_config();
    cfg.block_size = 4096;
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(64 << 20).unwrap();
    let dst = e.allocate_memory(64 << 20).unwrap();
    let b = e.allocate_batch(64).unwrap();
    let reqs: Vec<_> = (0..64u64)
        .map(|_| {
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                64 << 20,
            )
            .build()
        })
        .collect();
    e.submit(b, &reqs).unwrap();
    e.cancel(b).unwrap();
    e.wait_batch(b, Duration::from_secs(30)).unwrap();
    let list = e.status_list(b).unwrap();
    assert!(
        list.iter()
            .all(|s| matches!(s.state, TaskState::Completed | TaskState::Canceled))
    );
    assert!(
        list.iter().any(|s| s.state == TaskState::Canceled),
        "64 x 64 MiB cannot all finish before the cancel lands"
    );
    assert!(
        list.iter()
            .filter(|s| s.state == TaskState::Canceled)
            .all(|s| s.error == Some(ErrorKind::Canceled))
    );
    e.free_batch(b).unwrap();
    assert_eq!(e.credits_in_flight(), 0);
}

#[test]
fn timeout_state_from_deadline() {
    let e = engine();
    let m = e.allocate_memory(64).unwrap();
    let b = e.allocate_batch(1).unwrap();
    e.submit(
        b,
        &[op::Write::new(
            LocalAddr::new(m.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, m.addr()),
            8,
        )
        .deadline_ns(5)
        .build()],
    )
    .unwrap();
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (s.state, s.error),
        (TaskState::Timeout, Some(ErrorKind::Timeout))
    );
}
