//! End-to-end: the ring API over the local transport.

mod common;

use std::time::Duration;

use common::{engine, pattern, reap, test_config};
use tent::{Engine, ErrorKind, LocalAddr, Priority, RemoteAddr, SegmentId, TransportKind, op};

#[test]
fn write_then_read_back_verified() {
    let e = engine();
    let len = 3 * (1 << 20) + 123; // several slices and a ragged tail
    let src = e.allocate_memory(len).unwrap();
    let dst = e.allocate_memory(len).unwrap();
    let back = e.allocate_memory(len).unwrap();
    let data = pattern(7, len as usize);
    src.write(0, &data).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                len,
            )
            .user_data(1),
        )
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!((c[0].user_data(), c[0].result()), (1, Ok(len)));
    assert_eq!(c[0].transport(), TransportKind::Local);
    assert!(!c[0].fallback());
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(back.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                len,
            )
            .user_data(2),
        )
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Ok(len));
    let mut out = vec![0u8; len as usize];
    back.read(0, &mut out).unwrap();
    assert!(out == data, "read-back differs");
    assert_eq!(e.credits_in_flight(), 0);
}

#[test]
fn many_small_ops_all_priorities_complete_in_any_order() {
    let e = engine();
    let src = e.allocate_memory(1 << 16).unwrap();
    let dst = e.allocate_memory(1 << 16).unwrap();
    let mut ring = e.ring_with_depth(256).unwrap();
    let mut seen = vec![false; 10_000];
    let mut submitted = 0u64;
    let mut done = 0;
    while done < seen.len() {
        {
            let mut sq = ring.submission();
            while submitted < seen.len() as u64 {
                let off = (submitted % 8192) * 8;
                let p = Priority::ALL[(submitted % 3) as usize];
                let sqe = op::Write::new(
                    LocalAddr::new(src.id(), off),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr() + off),
                    8,
                )
                .priority(p)
                .user_data(submitted);
                if sq.push(sqe).is_err() {
                    break;
                }
                submitted += 1;
            }
        }
        for c in ring.completion() {
            assert_eq!(c.result(), Ok(8));
            assert!(!seen[c.user_data() as usize], "duplicate CQE");
            seen[c.user_data() as usize] = true;
            done += 1;
        }
        std::thread::yield_now();
    }
    assert_eq!(e.credits_in_flight(), 0);
    let (ops, bytes) = e.completed();
    assert_eq!((ops, bytes), (10_000, 80_000));
}

#[test]
fn several_rings_on_several_threads() {
    let mut cfg = test_config();
    cfg.workers.count = 2;
    let e = Engine::new(cfg).unwrap();
    let dst = e.allocate_memory(4 * 4096).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let e = &e;
            let dst = &dst;
            s.spawn(move || {
                let src = e.allocate_memory(4096).unwrap();
                src.write(0, &pattern(t as u8, 4096)).unwrap();
                let mut ring = e.ring().unwrap();
                for i in 0..200 {
                    ring.submission()
                        .push(
                            op::Write::new(
                                LocalAddr::new(src.id(), 0),
                                RemoteAddr::new(SegmentId::LOCAL, dst.addr() + t * 4096),
                                4096,
                            )
                            .user_data(i),
                        )
                        .unwrap();
                    let c = reap(&mut ring, 1);
                    assert_eq!(c[0].result(), Ok(4096));
                }
            });
        }
    });
    for t in 0..4u64 {
        let mut out = vec![0u8; 4096];
        dst.read(t * 4096, &mut out).unwrap();
        assert_eq!(out, pattern(t as u8, 4096));
    }
}

#[test]
fn deadline_in_the_past_times_out() {
    let e = engine();
    let b = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(b.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, b.addr()),
                8,
            )
            .deadline_ns(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Err(ErrorKind::Timeout));
}

#[test]
fn transport_hint_must_reach_the_segment() {
    let e = engine();
    let b = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    let w = |hint| {
        op::Write::new(
            LocalAddr::new(b.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, b.addr() + 8),
            8,
        )
        .transport_hint(hint)
    };
    ring.submission()
        .push(w(TransportKind::Shm).user_data(1))
        .unwrap();
    ring.submission()
        .push(w(TransportKind::Local).user_data(2))
        .unwrap();
    let mut c = reap(&mut ring, 2);
    c.sort_by_key(|c| c.user_data());
    assert_eq!(c[0].result(), Err(ErrorKind::Unreachable));
    assert_eq!(c[1].result(), Ok(8));
}

#[test]
fn dropping_the_engine_completes_pending_work() {
    let e = engine();
    let b = e.allocate_memory(1 << 20).unwrap();
    let mut ring = e.ring().unwrap();
    for i in 0..16 {
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(b.id(), 0),
                    RemoteAddr::new(SegmentId::LOCAL, b.addr()),
                    1 << 20,
                )
                .user_data(i),
            )
            .unwrap();
    }
    drop(e);
    // Every SQE gets a CQE: done before shutdown or Shutdown.
    let c = reap(&mut ring, 16);
    assert!(
        c.iter()
            .all(|c| c.result() == Ok(1 << 20) || c.result() == Err(ErrorKind::Shutdown))
    );
}

#[test]
fn wait_ready_sleeps_until_the_worker_posts_and_reports_shutdown() {
    let e = common::engine();
    // A copy long enough that the waiter goes past its spin and yield
    // phases and sleeps on the completion bell.
    let len = 64 << 20;
    let src = e.allocate_memory(len).unwrap();
    let dst = e.allocate_memory(len).unwrap();
    let mut ring = e.ring().unwrap();
    for round in 0..3u64 {
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(src.id(), 0),
                    RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                    len,
                )
                .user_data(round),
            )
            .unwrap();
        let c = ring.wait_one(Duration::from_secs(20)).unwrap();
        assert_eq!((c.user_data(), c.result()), (round, Ok(len)));
    }
    // Nothing in flight and nothing will come: a timeout, then Shutdown.
    let t = std::time::Instant::now();
    assert_eq!(
        ring.wait_ready(Duration::from_millis(30))
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
    assert!(t.elapsed() >= Duration::from_millis(30));
    drop(e);
    let t = std::time::Instant::now();
    assert_eq!(
        ring.wait_ready(Duration::from_secs(10)).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    // A wait that runs out before it looks (a zero timeout; a short one
    // on a loaded machine) still says the engine stopped.
    assert_eq!(
        ring.wait_ready(Duration::ZERO).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
}
