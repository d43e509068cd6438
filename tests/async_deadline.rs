//! A deadline stops a task: at the deadline the engine tells the
//! transport to abort the task's slices in flight, and delivers `Timeout`
//! once the transport has handed every one of them back, never before (a
//! completion means no transport touches the memory any more). Every
//! credit comes back, and the engine goes on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::held::Held;
use common::{reap, test_config};
use tent::clock::deadline_after;
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TransportKind, op};
#[test]
fn a_timed_out_task_completes_once_its_transport_hands_its_slices_back() {
    let mut cfg = test_config();
    cfg.block_size = 4096;
    cfg.max_inflight_slices = 4; // 16 slices: the task waits in its lane for credits
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(1 << 16).unwrap();
    let dst = e.allocate_memory(1 << 16).unwrap();
    let held = Arc::new(Held::default());
    let local = e
        .swap_transport(TransportKind::Local, Some(held.clone()))
        .unwrap();
    let mut ring = e.ring().unwrap();
    let start = Instant::now();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                1 << 16,
            )
            .deadline_ns(deadline_after(Duration::from_millis(100)))
            .user_data(1),
        )
        .unwrap();
    ring.submit().unwrap();
    // At the deadline the task's four slices in flight are aborted, once.
    let until = Instant::now() + Duration::from_secs(5);
    while held.aborts().is_empty() {
        assert!(Instant::now() < until, "no abort at the deadline");
        std::thread::yield_now();
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(95),
        "aborted before its deadline: {took:?}"
    );
    let aborts = held.aborts();
    assert_eq!(aborts.len(), 1, "one token, aborted once: {aborts:?}");
    assert_eq!(aborts[0].1, ErrorKind::Timeout);
    // The transport still holds the buffer: no completion yet.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        ring.completion().count(),
        0,
        "Timeout delivered while the transport still held the task's slices"
    );
    assert_eq!(
        e.credits_in_flight(),
        4,
        "the four posted slices are still out"
    );

    // The transport lets go: the Timeout comes, credits come back.
    assert_eq!(held.release_all(), 4);
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Err(ErrorKind::Timeout));
    let until = Instant::now() + Duration::from_secs(5);
    while e.credits_in_flight() != 0 {
        assert!(Instant::now() < until, "credits never came back");
        std::thread::yield_now();
    }
    assert_eq!(ring.completion().count(), 0, "one CQE per task");

    // The engine goes on: a normal op over the real transport.
    e.swap_transport(TransportKind::Local, Some(local));
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                1 << 16,
            )
            .user_data(2),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 16));
}

#[test]
fn shutdown_waits_for_slices_in_flight_and_aborts_them() {
    let mut cfg = test_config();
    cfg.block_size = 4096;
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(1 << 14).unwrap();
    let dst = e.allocate_memory(1 << 14).unwrap();
    let held = Arc::new(Held::default());
    e.swap_transport(TransportKind::Local, Some(held.clone()));
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                1 << 14,
            )
            .user_data(3),
        )
        .unwrap();
    ring.submit().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while held.posted.lock().unwrap().len() < 4 {
        assert!(Instant::now() < until, "slices were not posted");
        std::thread::yield_now();
    }
    let dropper = std::thread::spawn(move || {
        drop(e);
        Instant::now()
    });
    let until = Instant::now() + Duration::from_secs(5);
    while held.aborts().is_empty() {
        assert!(Instant::now() < until, "shutdown did not abort the slices");
        std::thread::yield_now();
    }
    assert_eq!(held.aborts()[0].1, ErrorKind::Shutdown);
    // Longer than the drain used to wait before abandoning slices.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !dropper.is_finished(),
        "the engine's drop returned while a transport held a task's slices"
    );
    let released = Instant::now();
    assert_eq!(held.release_all(), 4);
    let returned = dropper.join().unwrap();
    assert!(returned >= released);
    let c = reap(&mut ring, 1);
    assert_eq!(
        (c[0].user_data(), c[0].result()),
        (3, Err(ErrorKind::Shutdown))
    );
}

#[test]
fn submit_after_the_engine_stopped_says_so() {
    let e = Engine::new(test_config()).unwrap();
    let m = e.allocate_memory(64).unwrap();
    let mut ring = e.ring().unwrap();
    let (id, addr) = (m.id(), m.addr());
    drop(e);
    // Pushing still fits in the ring; publishing reports the stopped engine.
    ring.submission()
        .push(op::Write::new(
            LocalAddr::new(id, 0),
            RemoteAddr::new(SegmentId::LOCAL, addr),
            8,
        ))
        .unwrap();
    assert_eq!(ring.submit().unwrap_err().kind(), ErrorKind::Shutdown);
    assert_eq!(
        ring.wait_one(Duration::from_millis(10)).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
}

#[test]
fn swapping_a_slot_does_not_orphan_posted_slices() {
    let mut cfg = test_config();
    cfg.block_size = 4096;
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(1 << 14).unwrap();
    let dst = e.allocate_memory(1 << 14).unwrap();
    let held = Arc::new(Held::default());
    let local = e
        .swap_transport(TransportKind::Local, Some(held.clone()))
        .unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                1 << 14,
            )
            .user_data(7),
        )
        .unwrap();
    ring.submit().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while held.posted.lock().unwrap().len() < 4 {
        assert!(Instant::now() < until, "slices were not posted");
        std::thread::yield_now();
    }
    // The slot moves on while four slices are still out on the old instance.
    e.swap_transport(TransportKind::Local, Some(local));
    assert_eq!(held.release_all(), 4);
    let c = reap(&mut ring, 1);
    assert_eq!((c[0].user_data(), c[0].result()), (7, Ok(1 << 14)));
    assert_eq!(e.credits_in_flight(), 0);
}

/// Ops done at intake read no clock. A task whose slices are in flight on
/// an asynchronous transport must still time out on schedule while a
/// stream of such ops keeps the worker busy: housekeeping reads the clock
/// every few turns (`CLOCKLESS_TURNS`) if nothing else did.
#[test]
fn a_deadline_fires_while_ops_done_at_intake_stream_past() {
    let mut cfg = test_config();
    cfg.block_size = 4096;
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(1 << 14).unwrap();
    let dst = e.allocate_memory(1 << 14).unwrap();
    // The held transport sits in the TCP slot; local stays real (inline).
    let held = Arc::new(Held::default());
    e.swap_transport(TransportKind::Tcp, Some(held.clone()));
    // A failed assertion must not leave the engine's drop waiting forever
    // on the held slice: hand it back first (dropped before `e`).
    let _release = ReleaseOnDrop(held.clone());
    let mut ring = e.ring().unwrap();
    let write = |off: u64, len: u64| {
        op::Write::new(
            LocalAddr::new(src.id(), off),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr() + off),
            len,
        )
    };
    ring.submission()
        .push(
            write(0, 4096)
                .transport_hint(TransportKind::Tcp)
                .deadline_ns(deadline_after(Duration::from_millis(50)))
                .user_data(1),
        )
        .unwrap();
    ring.submit().unwrap();
    held.wait_posted();
    let inline_before = e.completed_inline();
    let start = Instant::now();
    let mut out = 0u32;
    let mut timed_out = None;
    while timed_out.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no abort at the deadline while ops streamed past"
        );
        // Keep 32 HIGH 8 B WRITEs in flight, so the worker never idles.
        {
            let mut sq = ring.submission();
            while out < 32 {
                sq.push(write(8192, 8).priority(tent::Priority::High).user_data(2))
                    .unwrap();
                out += 1;
            }
        }
        for c in ring.completion() {
            assert_eq!((c.user_data(), c.result()), (2, Ok(8)));
            out -= 1;
        }
        if !held.aborts().is_empty() {
            timed_out = Some(start.elapsed());
        }
    }
    assert!(
        e.completed_inline() - inline_before >= 32,
        "the stream was not done at intake: this test proves nothing"
    );
    assert_eq!(held.aborts()[0].1, ErrorKind::Timeout);
    assert_eq!(held.release_all(), 1);
    let mut got = None;
    let until = Instant::now() + Duration::from_secs(5);
    while got.is_none() {
        assert!(Instant::now() < until, "no Timeout completion");
        // The stream's CQEs may still come; the held task's is the one.
        got = ring
            .completion()
            .find(|c| c.user_data() == 1)
            .map(|c| c.result());
    }
    assert_eq!(got, Some(Err(ErrorKind::Timeout)));
}

/// Releases whatever a [`Held`] transport still holds when dropped.
struct ReleaseOnDrop(Arc<Held>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release_all();
    }
}

/// A deadline further ahead than `max_timeout_ms` is refused at intake
/// (`InvalidArgument`, nothing moved): an unregister or a segment close
/// never waits longer than that cap for an op; one within the cap is
/// served.
#[test]
fn a_deadline_past_max_timeout_ms_is_refused_and_one_within_it_served() {
    let mut cfg = test_config();
    cfg.max_timeout_ms = Duration::from_secs(60);
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    let write = |deadline: Duration, tag: u64| {
        op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
            4096,
        )
        .deadline_ns(deadline_after(deadline))
        .user_data(tag)
        .build()
    };
    ring.submission()
        .push(write(Duration::from_secs(3600), 1))
        .unwrap();
    ring.submission()
        .push(write(Duration::from_secs(30), 2))
        .unwrap();
    ring.submit().unwrap();
    let mut got = reap(&mut ring, 2);
    got.sort_by_key(|c| c.user_data());
    assert_eq!(
        got[0].result(),
        Err(ErrorKind::InvalidArgument),
        "an hour ahead, past the 60 s cap"
    );
    assert_eq!(got[1].result(), Ok(4096));
}
