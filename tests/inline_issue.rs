//! Inline issue: a small local or shm op is performed by the thread that
//! submits it, its CQE ready when `submit` returns, and only when that
//! changes nothing another path would see: never past an op of its ring
//! still at the worker, never for a ring or engine that turned it off, never
//! on memory an unregister has returned on. Ops issued inline count in the
//! engine's figures like the others.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{reap, test_config};
use tent::{Engine, ErrorKind, LocalAddr, Priority, RemoteAddr, SegmentId, TransportKind, op};

/// A LOW write (LOW: the worker never completes it at intake, so
/// `completed_inline` counts only ops issued on the submitting thread).
fn write(src: &tent::Buffer, off: u64, dst: u64, len: u64, user: u64) -> tent::Sqe {
    op::Write::new(
        LocalAddr::new(src.id(), off),
        RemoteAddr::new(SegmentId::LOCAL, dst),
        len,
    )
    .priority(Priority::Low)
    .user_data(user)
    .build()
}

#[test]
fn a_small_local_write_is_done_when_submit_returns() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    let before = e.completed_inline();
    for i in 0..100u64 {
        src.write(0, &i.to_le_bytes()).unwrap();
        let mut sq = ring.submission();
        sq.push(write(&src, 0, dst.addr() + 8 * (i % 64), 8, i))
            .unwrap();
        // Dropping the submission side submits: no wait after it at all,
        // the op ran inside.
        drop(sq);
        let c = ring
            .completion()
            .next()
            .expect("an inline op's CQE is there when submit returns");
        assert_eq!((c.user_data(), c.result()), (i, Ok(8)));
        assert_eq!(c.transport(), TransportKind::Local);
        let mut got = [0u8; 8];
        dst.read(8 * (i % 64), &mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), i);
    }
    assert_eq!(e.completed_inline() - before, 100);
    let (ops, bytes) = e.completed();
    assert!(ops >= 100 && bytes >= 800, "counted: {ops} ops, {bytes} B");
}

#[test]
fn an_op_behind_one_still_at_the_worker_goes_to_the_worker() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4 << 20).unwrap();
    let dst = e.allocate_memory(4 << 20).unwrap();
    let mut ring = e.ring().unwrap();
    let before = e.completed_inline();
    {
        let mut sq = ring.submission();
        // Larger than inline_max_bytes: the worker's.
        sq.push(write(&src, 0, dst.addr(), 4 << 20, 1)).unwrap();
        // Small, but pushed behind it: the worker's too.
        sq.push(write(&src, 0, dst.addr(), 8, 2)).unwrap();
    }
    let got = reap(&mut ring, 2);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|c| c.result().is_ok()));
    // Its CQE read, the one before it is no longer at the worker.
    ring.submission()
        .push(write(&src, 0, dst.addr(), 8, 3))
        .unwrap();
    reap(&mut ring, 1);
    assert_eq!(
        e.completed_inline() - before,
        1,
        "only the op pushed with nothing of its ring at the worker is issued inline"
    );
}

#[test]
fn a_ring_or_an_engine_that_turned_it_off_sends_every_op_to_the_worker() {
    // Off for one ring.
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    ring.set_inline(false);
    let before = e.completed_inline();
    for i in 0..10 {
        ring.submission()
            .push(write(&src, 0, dst.addr(), 8, i))
            .unwrap();
        assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));
    }
    assert_eq!(e.completed_inline(), before);
    ring.set_inline(true);
    ring.submission()
        .push(write(&src, 0, dst.addr(), 8, 10))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));
    assert_eq!(e.completed_inline(), before + 1);

    // Off for the engine.
    let mut c = test_config();
    c.inline_max_bytes = 0;
    let e = Engine::new(c).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    for i in 0..10 {
        ring.submission()
            .push(write(&src, 0, dst.addr(), 8, i))
            .unwrap();
        assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));
    }
    assert_eq!(e.completed_inline(), 0);
}

#[test]
fn a_refused_op_is_refused_as_the_worker_refuses_it_and_counted() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let gone = e.allocate_memory(4096).unwrap();
    e.unregister_memory(gone.id()).unwrap();
    let mut ring = e.ring().unwrap();
    // Out of bounds, an unregistered region, a deadline already past, a
    // segment never opened.
    let past = tent::clock::monotonic_ns() - 1;
    let cases = [
        (write(&src, 4090, dst.addr(), 8, 1), ErrorKind::OutOfBounds),
        (
            write(&gone, 0, dst.addr(), 8, 2),
            ErrorKind::AddressNotRegistered,
        ),
        (
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                8,
            )
            .deadline_ns(past)
            .user_data(3)
            .build(),
            ErrorKind::Timeout,
        ),
        (
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId(12345), 0),
                8,
            )
            .user_data(4)
            .build(),
            ErrorKind::SegmentNotFound,
        ),
    ];
    for (sqe, want) in cases {
        let user = sqe.user_data();
        ring.submission().push(sqe).unwrap();
        ring.submit().unwrap();
        let c = ring
            .completion()
            .next()
            .expect("refused when submit returns");
        assert_eq!((c.user_data(), c.result()), (user, Err(want)));
    }
    let m = e.metrics_text();
    assert!(
        m.lines()
            .any(|l| l == "tent_write_failures_total{transport=\"none\"} 4"),
        "the refusals are counted:\n{}",
        m.lines()
            .filter(|l| l.starts_with("tent_write_failures"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn unregister_returns_only_after_an_inline_copy_from_the_region_ended() {
    // 1 MiB copies: long enough that an unregister lands during one.
    let mut c = test_config();
    c.inline_max_bytes = 1 << 20;
    c.block_size = 1 << 20;
    let e = Engine::new(c).unwrap();
    let len = 1u64 << 20;
    for round in 0..20 {
        let src = e.allocate_memory(len).unwrap();
        let dst = e.allocate_memory(len).unwrap();
        src.write(0, &vec![0x11; len as usize]).unwrap();
        let started = AtomicBool::new(false);
        std::thread::scope(|s| {
            let copier = s.spawn(|| {
                let mut ring = e.ring().unwrap();
                let mut n = 0u64;
                loop {
                    ring.submission()
                        .push(write(&src, 0, dst.addr(), len, n))
                        .unwrap();
                    let c = reap(&mut ring, 1);
                    started.store(true, Ordering::Relaxed);
                    match c[0].result() {
                        Ok(_) => n += 1,
                        Err(k) => {
                            assert_eq!(k, ErrorKind::AddressNotRegistered);
                            return n;
                        }
                    }
                }
            });
            while !started.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_micros(50 * (round % 5)));
            e.unregister_memory(src.id()).unwrap();
            // Nothing copies from the region any more: bytes written now
            // never reach dst (its tail first: a copy still running reads
            // it last).
            src.write(len - 64, &[0xEE; 64]).unwrap();
            assert!(copier.join().unwrap() > 0);
        });
        let mut got = vec![0u8; len as usize];
        dst.read(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == 0x11),
            "round {round}: bytes written after unregister_memory returned were copied"
        );
    }
}

#[test]
fn a_ring_outliving_its_engine_issues_nothing() {
    let e = Engine::new(test_config()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(write(&src, 0, dst.addr(), 8, 1))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));
    drop(e);
    src.write(0, &[0xAB; 8]).unwrap();
    ring.submission()
        .push(write(&src, 0, dst.addr(), 8, 2))
        .unwrap();
    assert_eq!(ring.submit().unwrap_err().kind(), ErrorKind::Shutdown);
    let mut got = [0u8; 8];
    dst.read(0, &mut got).unwrap();
    assert_ne!(got, [0xAB; 8], "an op was issued after the engine dropped");
}
