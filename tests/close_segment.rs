//! `close_segment` returns once the engine is done with the segment: a
//! task on it accepted before the call finishes first (its CQE is posted
//! when the call returns), and requests naming it afterwards fail
//! `SegmentNotFound`. Before, the call returned at once and the last task's
//! `Arc` dropped the segment (an shm mapping, a peer's connections)
//! whenever it happened to finish.

mod common;

use std::time::{Duration, Instant};

use common::{reap, test_config};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, op};

#[test]
fn close_segment_waits_for_the_tasks_on_it_and_refuses_new_ones() {
    let target = common::engine();
    let len = 64u64 << 20;
    let remote = target.allocate_memory(len).unwrap();
    let mut c = test_config();
    // Over TCP, one connection, one slice on the wire: the WRITE takes a
    // while.
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.max_inflight_per_connection = 1;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(len).unwrap();
    let mut ring = init.ring().unwrap();
    let write = |n: u64| {
        op::Write::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, remote.addr()),
            n,
        )
    };
    // Connect first.
    ring.submission().push(write(8).user_data(1)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(8));

    ring.submission().push(write(len).user_data(2)).unwrap();
    // Let the worker take it: once a slice of it is on the wire the task
    // is in flight (a close published before the worker took the SQE
    // would fail it SegmentNotFound instead, which happened under load
    // when this waited a fixed 2 ms).
    let end = Instant::now() + Duration::from_secs(10);
    while init.credits_in_flight() == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(50));
    }
    let t0 = Instant::now();
    init.close_segment(seg).unwrap();
    let took = t0.elapsed();
    // The task was done when the call returned: its CQE is there already.
    let done: Vec<tent::Cqe> = ring.completion().collect();
    assert_eq!(
        done.len(),
        1,
        "close_segment returned after {took:?} with the WRITE still in flight"
    );
    assert_eq!(done[0].result(), Ok(len));
    // Closed: new requests naming it are refused.
    ring.submission().push(write(8).user_data(3)).unwrap();
    assert_eq!(
        reap(&mut ring, 1)[0].result(),
        Err(ErrorKind::SegmentNotFound)
    );
    assert_eq!(
        init.close_segment(seg).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
}

/// An shm segment's refresher thread has ended when `close_segment`
/// returns, though a reference to the segment outlives the call (as a
/// parked worker's cached table does): that reference's drop, on whatever
/// thread, joins nothing. Before, the thread ran until the last drop,
/// which joined it there, a worker included.
#[test]
fn a_closed_shm_segment_s_refresher_has_ended_when_close_returns() {
    let target = common::engine();
    let remote = target.allocate_memory(1 << 16).unwrap();
    let init = common::engine();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 16).unwrap();
    let mut ring = init.ring().unwrap();
    let write = op::Write::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, remote.addr()),
        4096,
    );
    ring.submission().push(write.user_data(1)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    let late = init.segment_peer(seg).expect("an shm segment");
    assert!(!late.refresher_finished());
    init.close_segment(seg).unwrap();
    assert!(
        late.refresher_finished(),
        "the refresher still runs after close_segment returned"
    );
    drop(late);
}
