//! Nothing can hang: a transport that posts slices and never completes
//! them still yields a `Timeout` at the deadline; its late completions are
//! reaped without harm and every credit comes back.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{reap, test_config};
use tent::clock::deadline_after;
use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TransportKind, op};

/// Accepts every slice (Posted) and completes them only when released.
#[derive(Default)]
struct Held {
    posted: Mutex<Vec<u64>>,
    released: Mutex<Vec<u64>>,
}

impl Held {
    fn release_all(&self) -> usize {
        let mut p = self.posted.lock().unwrap();
        let n = p.len();
        self.released.lock().unwrap().append(&mut p);
        n
    }
}

impl Transport for Held {
    fn kind(&self) -> TransportKind {
        TransportKind::Local
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: false,
            remote: false,
            slice_bytes: 0,
            wakes_worker: false,
        }
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let mut p = self.posted.lock().unwrap();
        for (s, o) in slices.iter().zip(out) {
            p.push(s.token);
            *o = SubmitOutcome::Posted;
        }
    }
    fn poll(&self, _: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        let mut r = self.released.lock().unwrap();
        let n = r.len().min(out.len());
        for (o, token) in out.iter_mut().zip(r.drain(..n)) {
            *o = SliceCompletion {
                token,
                result: Ok(4096),
            };
        }
        n
    }
}

#[test]
fn hung_transport_times_out_then_drains() {
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
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Err(ErrorKind::Timeout));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(95),
        "reported before its deadline: {took:?}"
    );
    assert_eq!(
        e.credits_in_flight(),
        4,
        "the four posted slices are still out"
    );

    // The late completions arrive: reaped, ignored, credits returned; no
    // second CQE for the task.
    assert_eq!(held.release_all(), 4);
    let until = Instant::now() + Duration::from_secs(5);
    while e.credits_in_flight() != 0 {
        assert!(Instant::now() < until, "credits never came back");
        std::thread::yield_now();
    }
    assert_eq!(ring.completion().count(), 0, "no CQE for a reported task");

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
