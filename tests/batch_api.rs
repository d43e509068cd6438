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

/// A transport that holds its worker inside `submit` until opened (so the
/// batch ring fills up), then passes every call on.
struct Gated {
    inner: Arc<dyn tent::transport::Transport>,
    open: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
    entered: std::sync::atomic::AtomicUsize,
}

impl Gated {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// Opens the gate when dropped, so a failing test still lets the worker go.
struct OpenOnDrop(Arc<Gated>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl tent::transport::Transport for Gated {
    fn kind(&self) -> tent::TransportKind {
        self.inner.kind()
    }
    fn install(&self, ctx: &tent::transport::InstallContext) -> tent::Result<()> {
        self.inner.install(ctx)
    }
    fn capabilities(&self) -> tent::transport::Capabilities {
        self.inner.capabilities()
    }
    fn reaches(&self, segment: &tent::segment::Segment) -> bool {
        self.inner.reaches(segment)
    }
    fn submit(
        &self,
        ctx: &tent::transport::WorkerCtx,
        slices: &[tent::transport::Slice<'_>],
        out: &mut [tent::transport::SubmitOutcome],
    ) {
        self.entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        drop(open);
        self.inner.submit(ctx, slices, out)
    }
    fn poll(
        &self,
        ctx: &tent::transport::WorkerCtx,
        out: &mut [tent::transport::SliceCompletion],
    ) -> usize {
        self.inner.poll(ctx, out)
    }
    fn abort(&self, ctx: &tent::transport::WorkerCtx, token: u64, kind: ErrorKind) {
        self.inner.abort(ctx, token, kind)
    }
}

#[test]
fn submit_is_all_or_nothing_when_the_ring_is_short() {
    let mut c = common::test_config();
    // The batch ring holds max(ring_depth, max_batch_size) = 8 entries.
    c.ring_depth = 8;
    c.max_batch_size = 8;
    c.default_timeout_ms = Duration::from_millis(300);
    let e = Engine::new(c).unwrap();
    let inner = e.swap_transport(tent::TransportKind::Local, None).unwrap();
    let gate = Arc::new(Gated {
        inner,
        open: std::sync::Mutex::new(false),
        cv: std::sync::Condvar::new(),
        entered: std::sync::atomic::AtomicUsize::new(0),
    });
    e.swap_transport(tent::TransportKind::Local, Some(gate.clone()));
    let _open = OpenOnDrop(gate.clone());
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let far = tent::clock::monotonic_ns() + 60_000_000_000;
    let req = |i: u64| {
        op::Write::new(
            LocalAddr::new(src.id(), i * 64),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * 64),
            64,
        )
        .deadline_ns(far)
        .build()
    };
    let b = e.allocate_batch(8).unwrap();
    let b2 = e.allocate_batch(8).unwrap();
    // One task holds the worker inside the transport...
    e.submit(b, &[req(0)]).unwrap();
    let t0 = std::time::Instant::now();
    while gate.entered.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "worker never submitted"
        );
        std::thread::yield_now();
    }
    // ...five more take 5 of the batch ring's 8 entries...
    let five: Vec<_> = (1..6).map(req).collect();
    e.submit(b, &five).unwrap();
    // ...so six (another batch on the same worker) do not fit: refused
    // whole, none queued.
    let six: Vec<_> = (6..12).map(req).collect();
    let err = e.submit(b2, &six).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::SqFull, "{err}");
    for i in 0..6 {
        assert_eq!(
            e.status(b2, i).unwrap().state,
            TaskState::Initial,
            "task {i} of a refused submit was touched"
        );
    }
    gate.open();
    let s = e.wait_batch(b, Duration::from_secs(20)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
    assert_eq!(e.status_list(b).unwrap().len(), 6);
    assert!(
        e.status_list(b2).unwrap().is_empty(),
        "nothing of the refused call ran"
    );
    // Once there is room, the same submit goes through whole.
    e.submit(b2, &six).unwrap();
    let s = e.wait_batch(b2, Duration::from_secs(20)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
    assert_eq!(e.status_list(b2).unwrap().len(), 6);
    e.free_batch(b).unwrap();
    e.free_batch(b2).unwrap();
    // The largest batch the table allows goes in one call.
    let full = e.allocate_batch(8).unwrap();
    let eight: Vec<_> = (0..8).map(req).collect();
    e.submit(full, &eight).unwrap();
    let s = e.wait_batch(full, Duration::from_secs(20)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
    e.free_batch(full).unwrap();
}

#[test]
fn a_batch_of_max_batch_size_goes_in_one_submit_above_ring_depth() {
    // Defaults: ring_depth 1024 < max_batch_size 4096. All or nothing must
    // not cost TENT's batch size: the batch ring holds a whole batch.
    let e = common::engine();
    let cfg = e.config();
    assert!(cfg.max_batch_size > cfg.ring_depth);
    let n = cfg.max_batch_size as usize;
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let reqs: Vec<_> = (0..n as u64)
        .map(|i| {
            op::Write::new(
                LocalAddr::new(src.id(), i % 64 * 64),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i % 64 * 64),
                64,
            )
            .build()
        })
        .collect();
    let b = e.allocate_batch(n).unwrap();
    e.submit(b, &reqs).unwrap();
    let s = e.wait_batch(b, Duration::from_secs(30)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
    assert_eq!(e.status_list(b).unwrap().len(), n);
    e.free_batch(b).unwrap();
}

#[test]
fn wait_batch_answers_at_once_when_nothing_is_in_flight() {
    let e = engine();
    // Nothing submitted: nothing to wait for, whatever the timeout.
    let empty = e.allocate_batch(4).unwrap();
    let t0 = std::time::Instant::now();
    let s = e.wait_batch(empty, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (s.state, s.transferred_bytes, s.error),
        (TaskState::Initial, 0, None)
    );
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "an empty batch was waited on for {:?}",
        t0.elapsed()
    );
    let e = Arc::new(e);
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let req = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
        4096,
    )
    .build();
    // Every task ended: its state, as before.
    let done = e.allocate_batch(2).unwrap();
    e.submit(done, &[req, req]).unwrap();
    let s = e.wait_batch(done, Duration::from_secs(10)).unwrap();
    assert_eq!((s.state, s.transferred_bytes), (TaskState::Completed, 8192));
    // A task held inside the transport: still waited on, to the timeout.
    let inner = e.swap_transport(tent::TransportKind::Local, None).unwrap();
    let gate = Arc::new(Gated {
        inner,
        open: std::sync::Mutex::new(false),
        cv: std::sync::Condvar::new(),
        entered: std::sync::atomic::AtomicUsize::new(0),
    });
    e.swap_transport(tent::TransportKind::Local, Some(gate.clone()));
    let _open = OpenOnDrop(gate.clone());
    let held = e.allocate_batch(4).unwrap();
    e.submit(held, &[req]).unwrap();
    let err = e.wait_batch(held, Duration::from_millis(300)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    gate.open();
    let s = e.wait_batch(held, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
}
