//! Cross-transport failover end to end: the real engine with fake
//! transports (asynchronous memcpy) wrapped in `FaultProxyTransport`, as
//! seed 000's suite does, plus the submit-stage cases that close TENT's
//! first known gap.
//!
//! The fakes sit in the RDMA slot (primary) and the TCP slot (fallback)
//! and reach this engine's own segment, so every byte is checked.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pattern, reap, test_config};
use tent::transport::fault::{FaultPolicy, FaultProxyTransport};
use tent::transport::{
    Capabilities, InstallContext, Slice, SliceCompletion, SubmitOutcome, Transport, WorkerCtx,
};
use tent::{
    Buffer, Config, Engine, ErrorKind, FAILOVER_EXHAUSTED, LocalAddr, RemoteAddr, SegmentId,
    TaskState, TransportKind, op,
};

/// An asynchronous memcpy transport: copies at submit, reports in `poll`,
/// logs every slice it was given, and can hold its completions back.
struct Fake {
    kind: TransportKind,
    pending: Mutex<VecDeque<SliceCompletion>>,
    /// (remote address, length) of every slice posted here.
    log: Mutex<Vec<(u64, u64)>>,
    hold: AtomicBool,
}

impl Fake {
    fn new(kind: TransportKind) -> Arc<Fake> {
        Arc::new(Fake {
            kind,
            pending: Mutex::new(VecDeque::new()),
            log: Mutex::new(Vec::new()),
            hold: AtomicBool::new(false),
        })
    }
    fn posted(&self) -> Vec<(u64, u64)> {
        self.log.lock().unwrap().clone()
    }
}

impl Transport for Fake {
    fn kind(&self) -> TransportKind {
        self.kind
    }
    fn install(&self, _: &InstallContext) -> tent::Result<()> {
        Ok(())
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            remote: true,
            ..Capabilities::default()
        }
    }
    fn reaches(&self, _: &tent::segment::Segment) -> bool {
        true
    }
    fn submit(&self, _: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        for (s, o) in slices.iter().zip(out.iter_mut()) {
            let (src, dst) = match s.opcode {
                tent::Opcode::Write => (s.local as *const u8, s.remote as *mut u8),
                tent::Opcode::Read => (s.remote as *const u8, s.local),
            };
            // SAFETY: the engine checked `local`; every test names remote memory inside a buffer of this engine's own segment.
            unsafe { std::ptr::copy(src, dst, s.len as usize) };
            self.log.lock().unwrap().push((s.remote, s.len));
            self.pending.lock().unwrap().push_back(SliceCompletion {
                token: s.token,
                result: Ok(s.len),
            });
            *o = SubmitOutcome::Posted;
        }
    }
    fn poll(&self, _: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        if self.hold.load(Ordering::Relaxed) {
            return 0;
        }
        let mut q = self.pending.lock().unwrap();
        let mut n = 0;
        while n < out.len() {
            let Some(c) = q.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        n
    }
    fn abort(&self, _: &WorkerCtx, _: u64, _: tent::ErrorKind) {
        // Every slice was copied in `submit`: those still pending finished
        // first, and keep their own results.
    }
}

struct Rig {
    engine: Engine,
    rdma: Arc<Fake>,
    tcp: Arc<Fake>,
    proxy: Arc<FaultProxyTransport>,
    tcp_proxy: Option<Arc<FaultProxyTransport>>,
}

fn config(max_failover: u32) -> Config {
    let mut c = test_config();
    c.transports.local.enable = false;
    c.transports.shm.enable = false;
    c.transports.tcp.enable = false;
    c.max_failover_attempts = max_failover;
    c
}

fn rig(max_failover: u32, primary: FaultPolicy, secondary: Option<FaultPolicy>) -> Rig {
    rig_with(max_failover, primary, secondary, |p| p)
}

fn rig_with(
    max_failover: u32,
    primary: FaultPolicy,
    secondary: Option<FaultPolicy>,
    edit: impl FnOnce(FaultProxyTransport) -> FaultProxyTransport,
) -> Rig {
    let rdma = Fake::new(TransportKind::Rdma);
    let tcp = Fake::new(TransportKind::Tcp);
    let proxy = Arc::new(edit(FaultProxyTransport::new(rdma.clone(), primary)));
    let tcp_proxy = secondary.map(|p| Arc::new(FaultProxyTransport::new(tcp.clone(), p)));
    let tcp_slot: Arc<dyn Transport> = match &tcp_proxy {
        Some(p) => p.clone(),
        None => tcp.clone(),
    };
    let engine = Engine::builder()
        .config(config(max_failover))
        .transport(proxy.clone())
        .transport(tcp_slot)
        .build()
        .unwrap();
    assert_eq!(
        engine.transports(),
        vec![TransportKind::Tcp, TransportKind::Rdma]
    );
    Rig {
        engine,
        rdma,
        tcp,
        proxy,
        tcp_proxy,
    }
}

fn corrupt_all() -> FaultPolicy {
    FaultPolicy {
        status_corrupt_rate: 1.0,
        ..FaultPolicy::default()
    }
}

/// `n` requests of `len` bytes, WRITE from `src` into `dst` at the same
/// offsets.
fn writes(src: &Buffer, dst: &Buffer, n: u64, len: u64) -> Vec<tent::Sqe> {
    (0..n)
        .map(|i| {
            op::Write::new(
                LocalAddr::new(src.id(), i * len),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * len),
                len,
            )
            .user_data(i)
            .build()
        })
        .collect()
}

fn buffers(e: &Engine, len: usize) -> (Buffer, Buffer, Vec<u8>) {
    let src = e.allocate_memory(len as u64).unwrap();
    let dst = e.allocate_memory(len as u64).unwrap();
    let data = pattern(9, len);
    src.write(0, &data).unwrap();
    (src, dst, data)
}

/// One 4 KiB WRITE as a one-task batch: its status, the destination and
/// the data it should now hold.
fn one_write(e: &Engine) -> (tent::TaskStatus, Buffer, Vec<u8>) {
    let (src, dst, data) = buffers(e, 4096);
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &writes(&src, &dst, 1, 4096)).unwrap();
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    (s, dst, data)
}

fn contents(b: &Buffer, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    b.read(0, &mut v).unwrap();
    v
}

/// Seed 000: `StatusCorruptionTriggersFailoverToSecondary`.
#[test]
fn status_corruption_triggers_failover_to_secondary() {
    let r = rig(3, corrupt_all(), None);
    let e = &r.engine;
    let (s, dst, data) = one_write(e);
    assert_eq!(s.state, TaskState::Completed, "{s:?}");
    assert_eq!(s.transport, TransportKind::Tcp);
    assert_eq!(s.failover_count, 1);
    assert!(s.fallback());
    assert_eq!(contents(&dst, 4096), data);
    assert_eq!(r.rdma.posted().len(), 1);
    assert_eq!(r.tcp.posted().len(), 1);
    assert_eq!(r.proxy.counts().corrupted, 1);
    assert_eq!(
        e.metrics()
            .failovers(TransportKind::Rdma, TransportKind::Tcp),
        1
    );
    assert!(
        e.metrics_text()
            .contains("tent_transport_failover_total{from=\"rdma\",to=\"tcp\"} 1\n")
    );
}

/// Seed 000: `BothTransportsFailExhaustsFailoverBudget`.
#[test]
fn both_transports_fail_exhausts_failover_budget() {
    let r = rig(3, corrupt_all(), Some(corrupt_all()));
    let e = &r.engine;
    let (s, _, _) = one_write(e);
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.error, Some(ErrorKind::Unreachable));
    assert!(s.failover_exhausted);
    assert_eq!(s.reason(), Some(FAILOVER_EXHAUSTED));
    assert_eq!(
        FAILOVER_EXHAUSTED,
        "Failover limit exceeded, all transports exhausted"
    );
    assert_eq!(s.failover_count, 1, "one switch, then no transport left");
    assert_eq!(r.rdma.posted().len(), 1);
    assert_eq!(r.tcp.posted().len(), 1);
    assert_eq!(r.tcp_proxy.as_ref().unwrap().counts().corrupted, 1);
    assert_eq!(e.metrics().exhausted_total(), 1);
}

/// Seed 000: `MixedFaultsAcrossManySubmissions`.
#[test]
fn mixed_faults_across_many_submissions() {
    let policy = FaultPolicy {
        status_corrupt_rate: 0.3,
        seed: 42,
        ..FaultPolicy::default()
    };
    let r = rig(3, policy, None);
    let e = &r.engine;
    let (src, dst, data) = buffers(e, 10 * 4096);
    for i in 0..10u64 {
        let b = e.allocate_batch(1).unwrap();
        let req = op::Write::new(
            LocalAddr::new(src.id(), i * 4096),
            RemoteAddr::new(SegmentId::LOCAL, dst.addr() + i * 4096),
            4096,
        )
        .build();
        e.submit(b, &[req]).unwrap();
        let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
        assert_eq!(s.state, TaskState::Completed, "batch {i}: {s:?}");
        e.free_batch(b).unwrap();
    }
    assert_eq!(contents(&dst, 10 * 4096), data);
    let c = r.proxy.counts();
    // Submit-counter math: every request went to RDMA once; exactly the
    // corrupted ones went to TCP once more.
    assert_eq!(c.submitted, 10);
    assert_eq!(r.rdma.posted().len(), 10);
    assert_eq!(r.tcp.posted().len() as u64, c.corrupted);
    assert_eq!(
        e.metrics()
            .failovers(TransportKind::Rdma, TransportKind::Tcp),
        c.corrupted
    );
    assert!(c.corrupted > 0 && c.corrupted < 10, "seed 42: {c:?}");
}

/// Seed 000: `MaxFailoverAttemptsZeroDisablesFailover`.
#[test]
fn max_failover_attempts_zero_disables_failover() {
    let r = rig(0, corrupt_all(), None);
    let e = &r.engine;
    let (s, _, _) = one_write(e);
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.error, Some(ErrorKind::Unreachable));
    assert_eq!(s.failover_count, 0);
    assert!(r.tcp.posted().is_empty(), "TCP is never touched");
    assert_eq!(e.metrics().failovers_total(), 0);
}

/// `max_failover_attempts` is reloadable: raised from 0 while the engine
/// runs, the next task that fails over does (issue #42, hot reload).
#[test]
fn a_reloaded_failover_budget_applies_to_the_next_task() {
    let r = rig(0, corrupt_all(), None);
    let e = &r.engine;
    assert_eq!(one_write(e).0.state, TaskState::Failed, "no failover at 0");
    let mut c = e.config().clone();
    c.max_failover_attempts = 1;
    assert_eq!(e.reload(c).unwrap(), 2, "the generation moves");
    assert_eq!(e.live_config().max_failover_attempts, 1);
    assert_eq!(
        e.config().max_failover_attempts,
        0,
        "config() is the start's"
    );
    let (s, dst, data) = one_write(e);
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(s.failover_count, 1);
    assert_eq!(contents(&dst, 4096), data);

    // A key that needs a restart is refused by name, with nothing applied.
    let mut c = (*e.live_config()).clone();
    c.max_failover_attempts = 0;
    c.workers.count = 2;
    c.block_size = 4096;
    let err = e.reload(c).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let text = err.to_string();
    assert!(text.contains("block_size, workers/count"), "{text}");
    assert!(
        text.contains("max_failover_attempts"),
        "names what reload applies: {text}"
    );
    assert_eq!(e.config_generation(), 2);
    assert_eq!(e.live_config().max_failover_attempts, 1, "nothing applied");

    // The bandwidth keys fix a rail at attach: restart-only, by name.
    let mut c = (*e.live_config()).clone();
    c.transports.rdma.default_bandwidth_gbps = 100.0;
    let text = e.reload(c).unwrap_err().to_string();
    assert!(
        text.contains("default_bandwidth_gbps cannot change"),
        "{text}"
    );
    // This test process installed no subscriber through tent and
    // registered no setter: a new log_level is refused by name, and the
    // reloadable keys beside it are not applied either.
    let mut c = (*e.live_config()).clone();
    c.log_level = tent::config::LogLevel::Debug;
    c.max_failover_attempts = 2;
    let err = e.reload(c).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let text = err.to_string();
    assert!(text.contains("log_level cannot change here"), "{text}");
    assert!(text.contains("did not install"), "{text}");
    assert_eq!(e.live_config().max_failover_attempts, 1, "nothing applied");
    // The selector's and the QoS intervals' keys are reloadable.
    let mut c = (*e.live_config()).clone();
    c.transports.rdma.bandwidth_learning_rate = 0.5;
    c.transports.rdma.slot_rotation_interval_ms = std::time::Duration::from_millis(4);
    c.transports.rdma.local_rotation_interval_us = std::time::Duration::from_micros(50);
    assert_eq!(e.reload(c).unwrap(), 3);
}

/// Seed 000: `MaxFailoverAttemptsOneAllowsSingleFailover`.
#[test]
fn max_failover_attempts_one_allows_single_failover() {
    let r = rig(1, corrupt_all(), None);
    let e = &r.engine;
    let (s, dst, data) = one_write(e);
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(s.failover_count, 1);
    assert_eq!(contents(&dst, 4096), data);

    // The same budget with a failing fallback: one switch, then the
    // limit.
    let r = rig(1, corrupt_all(), Some(corrupt_all()));
    let e = &r.engine;
    let (s, _, _) = one_write(e);
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.failover_count, 1);
    assert!(s.failover_exhausted);
}

/// Seed 000: `PerTaskFailoverCountsAreIndependent` (with the per-request
/// predicate proxy).
#[test]
fn per_task_failover_counts_are_independent() {
    let (src_len, len) = (4 * 4096usize, 4096u64);
    let poisoned_addr = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let p2 = poisoned_addr.clone();
    let r = rig_with(3, FaultPolicy::default(), None, move |p| {
        p.poison_when(Arc::new(move |s: &Slice<'_>| {
            s.remote == p2.load(Ordering::Relaxed)
        }))
    });
    let e = &r.engine;
    let (src, dst, data) = buffers(e, src_len);
    // Task 1 (the second) is poisoned; the others are not.
    poisoned_addr.store(dst.addr() + len, Ordering::Relaxed);
    let b = e.allocate_batch(4).unwrap();
    e.submit(b, &writes(&src, &dst, 4, len)).unwrap();
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed);
    let list = e.status_list(b).unwrap();
    let counts: Vec<u8> = list.iter().map(|t| t.failover_count).collect();
    assert_eq!(counts, [0, 1, 0, 0]);
    let kinds: Vec<TransportKind> = list.iter().map(|t| t.transport).collect();
    assert_eq!(
        kinds,
        [
            TransportKind::Rdma,
            TransportKind::Tcp,
            TransportKind::Rdma,
            TransportKind::Rdma
        ]
    );
    assert_eq!(contents(&dst, src_len), data);
    assert_eq!(r.tcp.posted(), vec![(dst.addr() + len, len)]);
}

/// Every byte range of `dst` posted exactly once across both fakes.
fn assert_each_range_once(rdma: &[(u64, u64)], tcp: &[(u64, u64)], base: u64, total: u64) {
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut covered = 0;
    for &(addr, len) in rdma.iter().chain(tcp) {
        *seen.entry(addr).or_default() += 1;
        covered += len;
        assert!(addr >= base && addr + len <= base + total);
    }
    let dup: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "posted twice: {dup:?}");
    assert_eq!(covered, total, "every byte posted once: none lost");
}

/// TENT's first known gap, closed: a transport that enqueues the first k
/// requests and then fails. The k already enqueued complete where they
/// are; only the others move on; nothing is posted twice or lost.
#[test]
fn submit_stage_failover_moves_only_what_was_not_enqueued() {
    let policy = FaultPolicy {
        fail_after_n_submits: Some(4),
        ..FaultPolicy::default()
    };
    let r = rig(3, policy, None);
    let e = &r.engine;
    let (src, dst, data) = buffers(e, 10 * 4096);
    let b = e.allocate_batch(10).unwrap();
    e.submit(b, &writes(&src, &dst, 10, 4096)).unwrap();
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(contents(&dst, 10 * 4096), data);
    let (rd, tc) = (r.rdma.posted(), r.tcp.posted());
    assert_eq!(rd.len(), 4);
    assert_eq!(tc.len(), 6);
    assert_each_range_once(&rd, &tc, dst.addr(), 10 * 4096);
    let list = e.status_list(b).unwrap();
    assert_eq!(list.iter().filter(|t| t.failover_count == 0).count(), 4);
    assert_eq!(list.iter().filter(|t| t.failover_count == 1).count(), 6);
}

/// The same inside one request: its first slices are enqueued on RDMA,
/// the rest of the request continues on TCP from where RDMA stopped.
#[test]
fn submit_stage_failover_mid_request_continues_at_the_cursor() {
    let policy = FaultPolicy {
        fail_after_n_submits: Some(3),
        ..FaultPolicy::default()
    };
    let r = rig(3, policy, None);
    let e = &r.engine;
    let block = e.config().block_size;
    let total = 8 * block;
    let (src, dst, data) = buffers(e, total as usize);
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                total,
            )
            .user_data(77),
        )
        .unwrap();
    let cqe = reap(&mut ring, 1)[0];
    assert_eq!(cqe.result(), Ok(total));
    assert_eq!(cqe.transport(), TransportKind::Tcp);
    assert!(cqe.fallback());
    assert_eq!(cqe.failover_count(), 1);
    let (rd, tc) = (r.rdma.posted(), r.tcp.posted());
    assert_eq!(rd.len(), 3);
    assert_eq!(tc.len(), 5);
    assert_each_range_once(&rd, &tc, dst.addr(), total);
    assert_eq!(contents(&dst, total as usize), data);
}

/// Many multi-slice requests with 30% completion and 5% submit faults on
/// the primary: each completes exactly once, data intact.
#[test]
fn seeded_mixed_submit_and_completion_faults_lose_nothing() {
    let policy = FaultPolicy {
        status_corrupt_rate: 0.3,
        submit_fail_rate: 0.05,
        seed: 7,
        ..FaultPolicy::default()
    };
    let r = rig(3, policy, None);
    let e = &r.engine;
    let block = e.config().block_size;
    let (n, len) = (200u64, 3 * block);
    let (src, dst, data) = buffers(e, (n * len) as usize);
    let mut ring = e.ring_with_depth(256).unwrap();
    for sqe in writes(&src, &dst, n, len) {
        ring.submission().push(sqe).unwrap();
    }
    let cqes = reap(&mut ring, n as usize);
    let mut ids: Vec<u64> = cqes.iter().map(|c| c.user_data()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n).collect::<Vec<_>>(), "one CQE per request");
    assert!(cqes.iter().all(|c| c.result() == Ok(len)), "{cqes:?}");
    assert!(cqes.iter().any(|c| c.fallback()));
    assert_eq!(contents(&dst, (n * len) as usize), data);
    std::thread::sleep(Duration::from_millis(50));
    let mut more = ring.completion();
    assert!(more.next().is_none(), "no second CQE for any request");
    let c = r.proxy.counts();
    assert!(c.rejected > 0 && c.corrupted > 0, "{c:?}");
}

/// A request with the no-failover flag fails where it is.
#[test]
fn no_failover_flag_disables_it_per_request() {
    let r = rig(3, corrupt_all(), None);
    let e = &r.engine;
    let (src, dst, _) = buffers(e, 4096);
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                4096,
            )
            .no_failover(true)
            .user_data(1),
        )
        .unwrap();
    let cqe = reap(&mut ring, 1)[0];
    assert_eq!(cqe.result(), Err(ErrorKind::Unreachable));
    assert_eq!(cqe.transport(), TransportKind::Rdma);
    assert!(!cqe.fallback() && !cqe.failover_exhausted());
    assert!(r.tcp.posted().is_empty());
}

/// Permanent kinds are never retried.
#[test]
fn permanent_errors_are_not_failed_over() {
    for kind in [
        ErrorKind::AccessDenied,
        ErrorKind::OutOfBounds,
        ErrorKind::InvalidArgument,
    ] {
        let r = rig(
            3,
            FaultPolicy {
                status_corrupt_rate: 1.0,
                status_error: kind,
                ..FaultPolicy::default()
            },
            None,
        );
        let e = &r.engine;
        let (s, _, _) = one_write(e);
        assert_eq!(s.error, Some(kind));
        assert_eq!(s.state, TaskState::Failed);
        assert!(r.tcp.posted().is_empty(), "{kind}: never retried");
    }
}

/// While it retries on the fallback, a task reads PENDING (the batch does
/// not latch FAILED).
#[test]
fn retrying_task_reads_pending() {
    let r = rig(3, corrupt_all(), None);
    let e = &r.engine;
    r.tcp.hold.store(true, Ordering::Relaxed);
    let (src, dst, data) = buffers(e, 4096);
    let b = e.allocate_batch(1).unwrap();
    e.submit(b, &writes(&src, &dst, 1, 4096)).unwrap();
    let start = std::time::Instant::now();
    while r.tcp.posted().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::yield_now();
    }
    for _ in 0..20 {
        assert_eq!(e.batch_status(b).unwrap().state, TaskState::Pending);
        std::thread::sleep(Duration::from_millis(2));
    }
    r.tcp.hold.store(false, Ordering::Relaxed);
    let s = e.wait_batch(b, Duration::from_secs(10)).unwrap();
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(contents(&dst, 4096), data);
}

/// `fail_install`: the primary never comes up, so requests go straight to
/// the fallback with no failover at all.
#[test]
fn failed_install_leaves_only_the_fallback() {
    let rdma = Fake::new(TransportKind::Rdma);
    let tcp = Fake::new(TransportKind::Tcp);
    let e = Engine::builder()
        .config(config(3))
        .transport(Arc::new(FaultProxyTransport::new(
            rdma.clone(),
            FaultPolicy {
                fail_install: true,
                ..FaultPolicy::default()
            },
        )))
        .transport(tcp.clone())
        .build()
        .unwrap();
    assert_eq!(e.transports(), vec![TransportKind::Tcp]);
    let (s, dst, data) = one_write(&e);
    assert_eq!(s.state, TaskState::Completed);
    assert_eq!(s.failover_count, 0);
    assert!(rdma.posted().is_empty());
    assert_eq!(contents(&dst, 4096), data);
}
