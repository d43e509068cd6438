//! Back-pressure from a transport (`SqFull` while slices are in flight)
//! holds back only the task it answered: the worker's other tasks, bound
//! for memory the transport still has room for, go on. Smart scheduling
//! answers `SqFull` whenever a task's rails are at their depth (late
//! binding), so a worker that stopped its whole turn there would let one
//! slow peer hold up every other peer.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pattern, test_config};
use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};
use tent::{Engine, LocalAddr, RemoteAddr, SegmentId, TaskState, TransportKind, op};

const SLICE: u64 = 4096;

/// An asynchronous memcpy transport with two destinations: slices into
/// `[slow_lo, slow_hi)` ("the slow peer") have room for one in flight and
/// complete only once released; every other slice completes at the next
/// poll.
struct TwoPeers {
    slow_lo: AtomicU64,
    slow_hi: AtomicU64,
    slow: Mutex<VecDeque<SliceCompletion>>,
    fast: Mutex<VecDeque<SliceCompletion>>,
    release: AtomicBool,
    refused: AtomicU64,
    /// Refuse as a stalled queue does (`Completed(Err(SqFull))`: no wait
    /// will help), not as back-pressure.
    stall: AtomicBool,
}

impl TwoPeers {
    fn new(stall: bool) -> Arc<TwoPeers> {
        Arc::new(TwoPeers {
            slow_lo: AtomicU64::new(0),
            slow_hi: AtomicU64::new(0),
            slow: Mutex::new(VecDeque::new()),
            fast: Mutex::new(VecDeque::new()),
            release: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            stall: AtomicBool::new(stall),
        })
    }
}

impl Transport for TwoPeers {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            remote: true,
            slice_bytes: SLICE,
            ..Capabilities::default()
        }
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        for (s, o) in slices.iter().zip(out.iter_mut()) {
            let slow = (self.slow_lo.load(Ordering::Relaxed)..self.slow_hi.load(Ordering::Relaxed))
                .contains(&s.remote);
            let mut q = if slow { &self.slow } else { &self.fast }.lock().unwrap();
            if slow && !q.is_empty() && !self.release.load(Ordering::Relaxed) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                *o = if self.stall.load(Ordering::Relaxed) {
                    SubmitOutcome::Completed(Err(tent::ErrorKind::SqFull))
                } else {
                    SubmitOutcome::Rejected(tent::ErrorKind::SqFull)
                };
                continue;
            }
            assert_eq!(s.opcode, tent::Opcode::Write);
            // SAFETY: the engine checked `local`; the test names remote memory inside buffers of this engine's own segment.
            unsafe { std::ptr::copy(s.local as *const u8, s.remote as *mut u8, s.len as usize) };
            q.push_back(SliceCompletion {
                token: s.token,
                result: Ok(s.len),
            });
            *o = SubmitOutcome::Posted;
        }
    }
    fn poll(&self, _: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        let mut n = 0;
        let release = self.release.load(Ordering::Relaxed);
        for (q, go) in [(&self.fast, true), (&self.slow, release)] {
            if !go {
                continue;
            }
            let mut q = q.lock().unwrap();
            while n < out.len() {
                let Some(c) = q.pop_front() else { break };
                out[n] = c;
                n += 1;
            }
        }
        n
    }
    fn abort(&self, _: &WorkerCtx, _: u64, _: tent::ErrorKind) {}
}

/// An engine over `t` alone.
fn engine_over(t: &Arc<TwoPeers>) -> Engine {
    let mut c = test_config();
    c.transports.local.enable = false;
    c.transports.shm.enable = false;
    c.transports.tcp.enable = false;
    Engine::builder()
        .config(c)
        .transport(t.clone())
        .build()
        .unwrap()
}

/// Two 4-slice WRITEs of `data` submitted together over `t`: task 0 to
/// the slow peer, task 1 to the fast one. Buffers before the engine: they
/// drop first.
struct SlowThenFast {
    slow_dst: tent::Buffer,
    fast_dst: tent::Buffer,
    _src: tent::Buffer,
    b: tent::BatchId,
    e: Engine,
}

const LEN: u64 = 4 * SLICE;

fn submit_slow_then_fast(t: &Arc<TwoPeers>, data: &[u8]) -> SlowThenFast {
    let e = engine_over(t);
    let src = e.allocate_memory(LEN).unwrap();
    src.write(0, data).unwrap();
    let slow_dst = e.allocate_memory(LEN).unwrap();
    let fast_dst = e.allocate_memory(LEN).unwrap();
    t.slow_lo.store(slow_dst.addr(), Ordering::Relaxed);
    t.slow_hi.store(slow_dst.addr() + LEN, Ordering::Relaxed);
    let write = |dst: &tent::Buffer| {
        op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
            LEN,
        )
        .build()
    };
    // One worker: the slow task is queued first and stays at its lane's
    // head with its later slices refused.
    let b = e.allocate_batch(2).unwrap();
    e.submit(b, &[write(&slow_dst), write(&fast_dst)]).unwrap();
    SlowThenFast {
        slow_dst,
        fast_dst,
        _src: src,
        b,
        e,
    }
}

#[test]
fn a_task_refused_for_back_pressure_does_not_hold_up_the_workers_other_tasks() {
    let t = TwoPeers::new(false);
    let len = LEN;
    let data = pattern(3, len as usize);
    let run = submit_slow_then_fast(&t, &data);
    let (e, b, slow_dst, fast_dst) = (&run.e, run.b, &run.slow_dst, &run.fast_dst);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let fast_done = loop {
        if e.status(b, 1).unwrap().state == TaskState::Completed {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let refused = t.refused.load(Ordering::Relaxed);
    // Room again (before any assert: the engine's drop waits for the
    // slices in flight).
    t.release.store(true, Ordering::Relaxed);
    assert!(refused > 0, "the slow task was never refused");
    assert!(
        fast_done,
        "the task with room waited behind a refused one ({refused} refusals): {:?}",
        e.status_list(b).unwrap()
    );
    let mut got = vec![0; len as usize];
    fast_dst.read(0, &mut got).unwrap();
    assert_eq!(got, data);
    // The slow task completes too, every byte there.
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed, "{:?}", e.status_list(b));
    slow_dst.read(0, &mut got).unwrap();
    assert_eq!(got, data);
}

/// A slice a transport finishes `SqFull` (RDMA: its queues went
/// `sq_backoff_timeout_us` with no completion) is a failure, not
/// back-pressure: the task is not held to be posted again when room comes
/// back (with no other transport it fails `SqFull`), while a task with
/// room completes.
#[test]
fn a_stalled_queue_fails_its_task_instead_of_holding_it() {
    let t = TwoPeers::new(true);
    let run = submit_slow_then_fast(&t, &pattern(4, LEN as usize));
    let (e, b) = (&run.e, run.b);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while t.refused.load(Ordering::Relaxed) == 0
        || e.status(b, 1).unwrap().state != TaskState::Completed
    {
        if std::time::Instant::now() > deadline {
            t.release.store(true, Ordering::Relaxed);
            panic!(
                "no refusal, or the task with room did not complete: {:?}",
                e.status_list(b)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The slice posted before the stall completes; nothing more is posted.
    t.release.store(true, Ordering::Relaxed);
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    let slow = e.status(b, 0).unwrap();
    assert_eq!(slow.state, TaskState::Failed, "{s:?} {slow:?}");
    assert_eq!(slow.error, Some(tent::ErrorKind::SqFull), "{slow:?}");
}
