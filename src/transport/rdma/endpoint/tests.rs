//! The endpoint against a fake provider: a real `ibv_context` whose ops
//! table is Rust functions, so the real `post_send` / `poll_cq` dispatch
//! runs, with SQ-full (`ENOMEM`) and any completion status injected per
//! work request from a seeded generator. No kernel, no device.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::error::{Error, Result};
use crate::transport::rdma::connector::Connector;
use crate::transport::rdma::sys::ffi::{
    ibv_context, ibv_cq, ibv_qp, ibv_send_wr, ibv_wc, ibv_wc_status as S,
};

/// A fake QP's state: the completions it has produced, and whether it is in
/// the error state (everything after a failed request is flushed).
#[derive(Default)]
struct FakeQueue {
    error: bool,
    cqes: VecDeque<ibv_wc>,
    /// With [`Plan::stall`]: requests the NIC has not finished, in order
    /// (wr_id, signalled, the status they will end with).
    pending: VecDeque<(u64, bool, S)>,
    /// Times it was moved to the error state by `to_error`.
    halts: u32,
}

/// What the provider injects.
struct Plan {
    rng: u64,
    p_enomem: f64,
    p_error: f64,
    /// Root-cause errors actually produced.
    roots: u64,
    enomems: u64,
    /// Successful requests stay on the NIC until [`progress`] finishes them.
    stall: bool,
    /// Most completions one `poll_cq` hands out (0: as many as asked).
    poll_max: i32,
    /// What `to_error` answers (0: it works).
    halt_rc: i32,
    /// QPs moved to the error state by `to_error`.
    halted: u64,
    /// The root-cause statuses injected, one drawn per failure.
    roots_of: &'static [S],
    /// Chance that `post_send` refuses a request for good (`EINVAL`, not
    /// its SQ being full), and how often it did.
    p_refuse: f64,
    refused: u64,
}

impl Plan {
    fn next(&mut self) -> f64 {
        // xorshift64*: deterministic from the seed.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

thread_local! {
    static QUEUES: RefCell<HashMap<u32, FakeQueue>> = RefCell::new(HashMap::new());
    static PLAN: RefCell<Plan> = const { RefCell::new(Plan { rng: 1, p_enomem: 0.0, p_error: 0.0, roots: 0, enomems: 0, stall: false, poll_max: 0, halt_rc: 0, halted: 0, roots_of: &RECOVERABLE, p_refuse: 0.0, refused: 0 }) };
    /// Local address of every request posted, by wr_id.
    static ADDRS: RefCell<HashMap<u64, u64>> = RefCell::new(HashMap::new());
    /// Local addresses in the order their requests were posted.
    static POSTED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    /// (local address, status) of every completion `poll_cq` handed out.
    static REAPED: RefCell<Vec<(u64, S)>> = const { RefCell::new(Vec::new()) };
}

/// Failures that are the request's own: it fails alone, the QP is
/// replaced at once.
const RECOVERABLE: [S; 3] = [
    S::IBV_WC_REM_OP_ERR,
    S::IBV_WC_LOC_LEN_ERR,
    S::IBV_WC_LOC_PROT_ERR,
];

/// Seed 004's fatal list: the endpoint goes terminal-degraded.
const FATAL: [S; 6] = [
    S::IBV_WC_RETRY_EXC_ERR,
    S::IBV_WC_RNR_RETRY_EXC_ERR,
    S::IBV_WC_LOC_QP_OP_ERR,
    S::IBV_WC_REM_ACCESS_ERR,
    S::IBV_WC_REM_INV_REQ_ERR,
    S::IBV_WC_FATAL_ERR,
];

unsafe extern "C" fn fake_post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> i32 {
    // SAFETY: the endpoint passes its live fake QP.
    let id = unsafe { (*qp).handle };
    QUEUES.with(|qs| {
        let mut qs = qs.borrow_mut();
        // Made on first use by the thread that posts (a source may connect
        // on another thread).
        let q = qs.entry(id).or_default();
        while !wr.is_null() {
            let enomem = PLAN.with(|p| {
                let mut p = p.borrow_mut();
                let hit = p.next() < p.p_enomem;
                p.enomems += hit as u64;
                hit
            });
            if enomem {
                // SAFETY: `bad` is the caller's out-parameter.
                unsafe { *bad = wr };
                return libc::ENOMEM;
            }
            let refuse = PLAN.with(|p| {
                let mut p = p.borrow_mut();
                let hit = p.p_refuse > 0.0 && p.next() < p.p_refuse;
                p.refused += hit as u64;
                hit
            });
            if refuse {
                // SAFETY: `bad` is the caller's out-parameter.
                unsafe { *bad = wr };
                return libc::EINVAL;
            }
            // SAFETY: `wr` is a valid element of the caller's list, with one SGE.
            let (wr_id, flags, next, addr) = unsafe {
                (
                    (*wr).wr_id,
                    (*wr).send_flags,
                    (*wr).next,
                    (*(*wr).sg_list).addr,
                )
            };
            ADDRS.with(|a| a.borrow_mut().insert(wr_id, addr));
            POSTED.with(|p| p.borrow_mut().push(addr));
            let signaled =
                flags & crate::transport::rdma::sys::ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            let status = if q.error {
                S::IBV_WC_WR_FLUSH_ERR
            } else {
                PLAN.with(|p| {
                    let mut p = p.borrow_mut();
                    if p.next() < p.p_error {
                        p.roots += 1;
                        let n = p.roots_of.len();
                        let i = (p.next() * n as f64) as usize % n;
                        p.roots_of[i]
                    } else {
                        S::IBV_WC_SUCCESS
                    }
                })
            };
            if !q.error && PLAN.with(|p| p.borrow().stall) {
                // Its end (and a failure's effect on the QP) comes with
                // `progress`, in order.
                q.pending.push_back((wr_id, signaled, status));
                wr = next;
                continue;
            }
            if status != S::IBV_WC_SUCCESS || signaled {
                // Errors and flushes always complete; successes only when asked.
                q.cqes.push_back(ibv_wc {
                    wr_id,
                    status,
                    ..Default::default()
                });
            }
            if status != S::IBV_WC_SUCCESS {
                q.error = true;
            }
            wr = next;
        }
        0
    })
}

unsafe extern "C" fn fake_poll_cq(cq: *mut ibv_cq, n: i32, wc: *mut ibv_wc) -> i32 {
    // SAFETY: the endpoint passes its live fake CQ.
    let id = unsafe { (*cq).handle };
    QUEUES.with(|qs| {
        let mut qs = qs.borrow_mut();
        let q = qs.entry(id).or_default();
        let max = match PLAN.with(|p| p.borrow().poll_max) {
            0 => n,
            m => m.min(n),
        };
        let mut k = 0;
        while k < max as usize {
            let Some(c) = q.cqes.pop_front() else { break };
            let addr = ADDRS.with(|a| a.borrow().get(&c.wr_id).copied().unwrap_or(0));
            REAPED.with(|r| r.borrow_mut().push((addr, c.status)));
            // SAFETY: the caller's `wc` holds `n` entries.
            unsafe { *wc.add(k) = c };
            k += 1;
        }
        k as i32
    })
}

/// `to_error` for a fake QP: every request the NIC still holds is flushed,
/// in order, signalled or not (as a real device does).
unsafe fn fake_to_error(qp: *mut ibv_qp) -> i32 {
    let rc = PLAN.with(|p| p.borrow().halt_rc);
    if rc != 0 {
        return rc;
    }
    PLAN.with(|p| p.borrow_mut().halted += 1);
    // SAFETY: the endpoint passes its live fake QP.
    let id = unsafe { (*qp).handle };
    QUEUES.with(|qs| {
        let mut qs = qs.borrow_mut();
        let q = qs.entry(id).or_default();
        q.error = true;
        q.halts += 1;
        q.flush_pending();
    });
    0
}

impl FakeQueue {
    /// The QP is in error: every request it holds is flushed, in order.
    fn flush_pending(&mut self) {
        while let Some((wr_id, _, _)) = self.pending.pop_front() {
            self.cqes.push_back(ibv_wc {
                wr_id,
                status: S::IBV_WC_WR_FLUSH_ERR,
                ..Default::default()
            });
        }
    }
}

/// The fake NIC finishes up to `n` of the requests it holds on each QP
/// (a failure puts the QP in error, flushing the rest).
fn progress(n: usize) {
    QUEUES.with(|qs| {
        for q in qs.borrow_mut().values_mut() {
            for _ in 0..n {
                let Some((wr_id, signaled, status)) = q.pending.pop_front() else {
                    break;
                };
                if status != S::IBV_WC_SUCCESS || signaled {
                    q.cqes.push_back(ibv_wc {
                        wr_id,
                        status,
                        ..Default::default()
                    });
                }
                if status != S::IBV_WC_SUCCESS {
                    q.error = true;
                    q.flush_pending();
                }
            }
        }
    });
}

/// The fake NIC will end the `i`-th request it holds (in order, on every
/// QP) with `status`.
fn fail_pending(i: usize, status: S) {
    QUEUES.with(|qs| {
        for q in qs.borrow_mut().values_mut() {
            if let Some(p) = q.pending.get_mut(i) {
                p.2 = status;
            }
        }
    });
}

/// Does a live fake QP still hold the request for `addr` (so the NIC may
/// still touch that buffer)?
fn on_nic(addr: u64) -> bool {
    QUEUES.with(|qs| {
        ADDRS.with(|a| {
            let a = a.borrow();
            qs.borrow()
                .values()
                .any(|q| q.pending.iter().any(|(w, _, _)| a.get(w) == Some(&addr)))
        })
    })
}

/// Times fake QP `id` was moved to the error state.
fn halts(id: u32) -> u32 {
    QUEUES.with(|qs| qs.borrow().get(&id).map_or(0, |q| q.halts))
}

/// Was the flush completion of the request at `addr` reaped?
fn flush_reaped(addr: u64) -> bool {
    REAPED.with(|r| {
        r.borrow()
            .iter()
            .any(|&(a, st)| a == addr && st == S::IBV_WC_WR_FLUSH_ERR)
    })
}

/// A fake QP and CQ over a context whose ops are the functions above.
struct FakeObjects {
    _ctx: Box<ibv_context>,
    _qp: Box<ibv_qp>,
    _cq: Box<ibv_cq>,
}

struct FakeSource {
    next_id: u32,
    connects: u32,
    fail_after: Option<u32>,
}

/// A fake source whose QPs are numbered from `next_id + 1`, connecting
/// every time.
fn fake(next_id: u32) -> FakeSource {
    FakeSource {
        next_id,
        connects: 0,
        fail_after: None,
    }
}

impl QueueSource for FakeSource {
    fn connect(&mut self) -> Result<Queue> {
        if self.fail_after.is_some_and(|n| self.connects >= n) {
            return Err(Error::new(
                ErrorKind::RemoteNicFailed,
                "fake peer refuses a new QP",
            ));
        }
        self.connects += 1;
        self.next_id += 1;
        let id = self.next_id;
        let mut ctx = Box::new(ibv_context::default());
        ctx.ops.post_send = Some(fake_post_send);
        ctx.ops.poll_cq = Some(fake_poll_cq);
        let ctxp: *mut ibv_context = &mut *ctx;
        let mut qp = Box::new(ibv_qp {
            context: ctxp,
            handle: id,
            ..Default::default()
        });
        let mut cq = Box::new(ibv_cq {
            context: ctxp,
            handle: id,
            ..Default::default()
        });
        let (qpp, cqp): (*mut ibv_qp, *mut ibv_cq) = (&mut *qp, &mut *cq);
        let owner = Box::new(FakeObjects {
            _ctx: ctx,
            _qp: qp,
            _cq: cq,
        });
        // SAFETY: `qpp` and `cqp` point into boxes `owner` keeps (a box's heap address does not move with it); their context's ops are the fake's; the queue is their only user.
        Ok(unsafe { Queue::new(qpp, cqp, fake_to_error, owner) })
    }
}

// SAFETY: the fake objects are only touched by the test's thread.
unsafe impl Send for FakeObjects {}

impl Drop for FakeObjects {
    fn drop(&mut self) {
        // A destroyed QP's NIC work stops. `try_with`: a queue may drop on
        // a connector thread, even as it exits.
        let id = self._qp.handle;
        let _ = QUEUES.try_with(|qs| qs.borrow_mut().remove(&id));
    }
}

fn slice(token: u64) -> RdmaSlice {
    RdmaSlice {
        token,
        opcode: if token % 2 == 0 {
            Opcode::Write
        } else {
            Opcode::Read
        },
        local: 0x1000 + token * 64,
        len: 64,
        lkey: 1,
        remote: 0x9000 + token * 64,
        rkey: 2,
        reposts: 0,
        ctx: 0,
        posted_ns: 0,
        ahead: 0,
        urgent: false,
    }
}

fn plan(seed: u64, p_enomem: f64, p_error: f64) {
    PLAN.with(|p| {
        *p.borrow_mut() = Plan {
            rng: seed | 1,
            p_enomem,
            p_error,
            roots: 0,
            enomems: 0,
            stall: false,
            poll_max: 0,
            halt_rc: 0,
            halted: 0,
            roots_of: &RECOVERABLE,
            p_refuse: 0.0,
            refused: 0,
        }
    });
}

/// No faults, and the NIC finishes nothing until [`progress`] says so.
fn stalled(seed: u64) {
    plan(seed, 0.0, 0.0);
    PLAN.with(|p| p.borrow_mut().stall = true);
}

/// A connector for one test, and an endpoint over `src` connected by it.
fn endpoint(src: impl QueueSource + 'static, depth: u32, backlog: usize) -> (Endpoint, Connector) {
    endpoint_sq(src, depth, backlog, SqSettings::default())
}

/// [`endpoint`] with the send-queue knobs `sq`.
fn endpoint_sq(
    src: impl QueueSource + 'static,
    depth: u32,
    backlog: usize,
    sq: SqSettings,
) -> (Endpoint, Connector) {
    let c = Connector::start().unwrap();
    let ep = Endpoint::with_settings(Box::new(src), depth, backlog, &c.handle(), sq);
    (ep, c)
}

/// Drive `n` slices to completion; every token's results.
fn run(ep: &mut Endpoint, n: u64) -> HashMap<u64, Vec<std::result::Result<u64, ErrorKind>>> {
    let mut seen: HashMap<u64, Vec<_>> = HashMap::new();
    let mut next = 0;
    let start = std::time::Instant::now();
    let mut total = 0;
    while total < n as usize {
        // The rail layer sends nothing to an endpoint not accepting.
        while next < n && ep.accepting() && ep.submit(slice(next)) {
            next += 1;
        }
        let mut k = 0;
        let mut done = |c: RdmaCompletion| {
            k += 1;
            seen.entry(c.token).or_default().push(c.result)
        };
        ep.flush(&mut done);
        ep.reap(&mut done);
        ep.fail_exhausted(&mut done);
        // Given up by a terminal degrade: the transport moves them on (here:
        // no sibling rail, so the route is lost).
        ep.extract_orphans(&mut |s| {
            k += 1;
            seen.entry(s.token)
                .or_default()
                .push(Err(ErrorKind::RouteLost))
        });
        if k == 0 {
            // Waiting for the connector (another thread).
            std::thread::yield_now();
        }
        total += k;
        assert!(start.elapsed().as_secs() < 60, "no progress");
    }
    seen
}

#[test]
fn every_slice_completes_exactly_once_and_credits_return_under_injected_faults() {
    for seed in [1u64, 7, 42, 1234, 99_999] {
        plan(seed, 0.05, 0.02);
        let src = fake(seed as u32 * 100);
        let (mut ep, _c) = endpoint(src, 16, 256);
        let n = 5_000;
        let seen = run(&mut ep, n);
        assert_eq!(seen.len(), n as usize, "seed {seed}: every token completed");
        assert!(
            seen.values().all(|v| v.len() == 1),
            "seed {seed}: exactly once"
        );
        assert_eq!(ep.credits_in_flight(), 0, "seed {seed}: credits returned");
        assert_eq!(ep.outstanding(), 0);
        let (roots, enomems) = PLAN.with(|p| (p.borrow().roots, p.borrow().enomems));
        let root_fails = seen
            .values()
            .filter(|v| matches!(v[0], Err(k) if k != ErrorKind::Unreachable))
            .count() as u64;
        // Each injected root cause fails its own slice and nothing else:
        // the slices flushed behind it were re-posted on a fresh QP.
        assert_eq!(root_fails, roots, "seed {seed}");
        assert!(
            roots > 0 && enomems > 0,
            "seed {seed}: faults were injected"
        );
        assert!(
            ep.replacements() >= roots,
            "seed {seed}: one QP per root error"
        );
        for v in seen.values() {
            if let Ok(b) = v[0] {
                assert_eq!(b, 64);
            }
        }
    }
}

#[test]
fn sq_full_from_the_provider_loses_nothing() {
    plan(5, 0.5, 0.0);
    let src = fake(9_000);
    let (mut ep, _c) = endpoint(src, 8, 64);
    let seen = run(&mut ep, 2_000);
    assert!(seen.values().all(|v| v == &vec![Ok(64)]));
    assert_eq!(
        ep.replacements(),
        0,
        "ENOMEM is back-pressure, not an error"
    );
    assert_eq!(ep.credits_in_flight(), 0);
}

#[test]
fn a_peer_that_refuses_a_new_qp_fails_the_waiting_slices_once() {
    plan(11, 0.0, 0.05);
    let src = FakeSource {
        next_id: 20_000,
        connects: 0,
        fail_after: Some(1),
    };
    let (mut ep, _c) = endpoint(src, 16, 512);
    let seen = run(&mut ep, 500);
    assert!(seen.values().all(|v| v.len() == 1));
    assert!(
        seen.values()
            .any(|v| v[0] == Err(ErrorKind::RemoteNicFailed)),
        "the connect failure reached the waiting slices"
    );
    assert_eq!(ep.credits_in_flight(), 0);
}

#[test]
fn a_lazy_endpoint_connects_on_first_work_and_evacuates_everything_it_holds() {
    plan(3, 0.0, 0.0);
    let src = fake(30_000);
    let (mut ep, _c) = endpoint(src, 8, 64);
    let mut none = |c: RdmaCompletion| panic!("nothing completes yet: {c:?}");
    ep.flush(&mut none);
    assert_eq!(ep.state(), EndpointState::Idle, "no work, no QP");
    for t in 0..20 {
        assert!(ep.submit(slice(t)));
    }
    let start = std::time::Instant::now();
    while !ep.is_connected() {
        ep.flush(&mut none);
        assert!(start.elapsed() < STEP, "connected for the first slices");
        std::thread::yield_now();
    }
    assert_eq!(ep.replacements(), 0, "a first QP is not a replacement");
    assert_eq!(ep.credits_in_flight(), 8, "posted up to the SQ depth");
    // The rail goes away: every slice, posted or waiting, comes back once,
    // oldest first, and no credit stays taken.
    let mut back = Vec::new();
    ep.evacuate(&mut |s: RdmaSlice| back.push(s.token), &mut |c| {
        panic!("nothing was aborted: {c:?}")
    });
    assert_eq!(back, (0..20).collect::<Vec<_>>());
    assert_eq!(ep.credits_in_flight(), 0);
    assert_eq!(ep.outstanding(), 0);
    assert!(!ep.is_connected());
}

/// A source whose every connect waits until the test lets it through (one
/// message on `gate` per connect): a peer whose control port accepts and
/// does not answer yet.
struct GatedSource {
    gate: std::sync::mpsc::Receiver<()>,
    inner: FakeSource,
}

impl QueueSource for GatedSource {
    fn connect(&mut self) -> Result<Queue> {
        self.gate
            .recv()
            .map_err(|_| Error::new(ErrorKind::Unreachable, "gate closed"))?;
        self.inner.connect()
    }
}

/// How long the test thread waits for one step of the endpoint's thread: a
/// flush that blocks on the connect fails the test instead of hanging it.
const STEP: std::time::Duration = std::time::Duration::from_secs(2);

/// Drive `ep` until `n` completions were seen (or `limit` passes).
fn drain(ep: &mut Endpoint, n: usize, limit: std::time::Duration) -> Vec<RdmaCompletion> {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    while seen.len() < n && start.elapsed() < limit {
        let mut done = |c: RdmaCompletion| seen.push(c);
        ep.flush(&mut done);
        ep.reap(&mut done);
        ep.fail_exhausted(&mut done);
        std::thread::yield_now();
    }
    seen
}

#[test]
fn a_connect_that_blocks_leaves_submit_and_flush_prompt_and_the_slices_wait() {
    let (open, gate) = std::sync::mpsc::channel();
    let (step, steps) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        plan(13, 0.0, 0.0);
        let src = GatedSource {
            gate,
            inner: fake(40_000),
        };
        let (mut ep, _c) = endpoint(src, 8, 64);
        for t in 0..20 {
            assert!(ep.submit(slice(t)));
        }
        let mut early = Vec::new();
        for _ in 0..100 {
            let mut done = |c: RdmaCompletion| early.push(c);
            ep.flush(&mut done);
            ep.reap(&mut done);
        }
        step.send((
            ep.state() == EndpointState::Connecting,
            ep.outstanding(),
            early.len(),
        ))
        .unwrap();
        let seen = drain(&mut ep, 20, std::time::Duration::from_secs(10));
        let ok = seen.iter().filter(|c| c.result == Ok(64)).count();
        step.send((ep.is_connected(), ep.outstanding(), ok))
            .unwrap();
    });
    let first = steps.recv_timeout(STEP);
    // Let the connect through in every case, so the thread ends.
    open.send(()).unwrap();
    assert_eq!(
        first,
        Ok((true, 20, 0)),
        "flush returned while the connect was pending, with all 20 slices waiting"
    );
    assert_eq!(
        steps.recv_timeout(STEP * 5),
        Ok((true, 0, 20)),
        "once connected, every waiting slice completed"
    );
    worker.join().unwrap();
}

#[test]
fn a_replacement_qp_after_an_error_is_connected_off_the_worker_too() {
    let (open, gate) = std::sync::mpsc::channel();
    // The first QP connects at once; the replacement waits for the test.
    open.send(()).unwrap();
    let (step, steps) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        plan(17, 0.0, 0.0);
        let src = GatedSource {
            gate,
            inner: fake(50_000),
        };
        let (mut ep, _c) = endpoint(src, 8, 64);
        for t in 0..4 {
            assert!(ep.submit(slice(t)));
        }
        let ok = drain(&mut ep, 4, std::time::Duration::from_secs(10));
        assert!(ok.iter().all(|c| c.result == Ok(64)), "{ok:?}");
        // One slice fails on the wire: the QP is in error.
        plan(17, 0.0, 1.0);
        assert!(ep.submit(slice(4)));
        let failed = drain(&mut ep, 1, std::time::Duration::from_secs(10));
        assert!(matches!(
            failed[..],
            [RdmaCompletion {
                token: 4,
                result: Err(_),
                ..
            }]
        ));
        plan(17, 0.0, 0.0);
        for t in 5..10 {
            assert!(ep.submit(slice(t)));
        }
        let mut early = Vec::new();
        for _ in 0..100 {
            let mut done = |c: RdmaCompletion| early.push(c);
            ep.flush(&mut done);
            ep.reap(&mut done);
        }
        step.send((
            ep.state() == EndpointState::Connecting,
            ep.outstanding(),
            early.len(),
        ))
        .unwrap();
        let seen = drain(&mut ep, 5, std::time::Duration::from_secs(10));
        let ok = seen.iter().filter(|c| c.result == Ok(64)).count();
        step.send((ep.replacements() == 1, ep.outstanding(), ok))
            .unwrap();
    });
    let first = steps.recv_timeout(STEP);
    open.send(()).unwrap();
    assert_eq!(
        first,
        Ok((true, 5, 0)),
        "flush returned while the replacement QP was connecting, the 5 slices waiting"
    );
    assert_eq!(
        steps.recv_timeout(STEP * 5),
        Ok((true, 0, 5)),
        "once replaced, every waiting slice completed"
    );
    worker.join().unwrap();
}

/// Wraps a source: counts its connects and the queues it made that are
/// still alive (a queue's owner drops a [`Live`] with it).
struct Probe {
    inner: Box<dyn QueueSource>,
    tries: Arc<AtomicU32>,
    live: Arc<AtomicU32>,
}

struct Live(Arc<AtomicU32>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Probe {
    /// The probe, its connect count and its live-queue count.
    fn new(inner: impl QueueSource + 'static) -> (Probe, Arc<AtomicU32>, Arc<AtomicU32>) {
        let (tries, live) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let p = Probe {
            inner: Box::new(inner),
            tries: tries.clone(),
            live: live.clone(),
        };
        (p, tries, live)
    }
}

impl QueueSource for Probe {
    fn connect(&mut self) -> Result<Queue> {
        self.tries.fetch_add(1, Ordering::SeqCst);
        let q = self.inner.connect()?;
        self.live.fetch_add(1, Ordering::SeqCst);
        Ok(q.also_owning(Live(self.live.clone())))
    }
}

fn refusing(next_id: u32) -> FakeSource {
    FakeSource {
        next_id,
        connects: 0,
        fail_after: Some(0),
    }
}

#[test]
fn a_failed_connect_fails_the_waiting_slices_once_typed_and_retries_only_after_the_backoff() {
    plan(19, 0.0, 0.0);
    let (probe, tries, _) = Probe::new(refusing(60_000));
    let (mut ep, _c) = endpoint(probe, 8, 64);
    for t in 0..10 {
        assert!(ep.submit(slice(t)));
    }
    let seen = drain(&mut ep, 10, STEP);
    let mut tokens: Vec<u64> = seen.iter().map(|c| c.token).collect();
    tokens.sort();
    assert_eq!(tokens, (0..10).collect::<Vec<_>>(), "each slice once");
    assert!(
        seen.iter()
            .all(|c| c.result == Err(ErrorKind::RemoteNicFailed))
    );
    let EndpointState::Broken { kind, retry_ns } = ep.state() else {
        panic!("{:?}", ep.state())
    };
    assert_eq!(kind, ErrorKind::RemoteNicFailed);
    assert_eq!(tries.load(Ordering::SeqCst), 1);
    // Until the backoff has passed, new work fails at once with the same
    // kind and no connect is tried (a flush that ended before `retry_ns`
    // read its clock before it too).
    let mut fast = 0;
    for t in 100.. {
        assert!(ep.submit(slice(t)));
        let mut got = Vec::new();
        ep.flush(&mut |c| got.push(c.result));
        if monotonic_ns() >= retry_ns {
            break;
        }
        assert_eq!(got, vec![Err(ErrorKind::RemoteNicFailed)]);
        assert_eq!(tries.load(Ordering::SeqCst), 1, "no connect in the backoff");
        fast += 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(fast > 0, "flushes inside the backoff were seen");
    // After it, work connects again (and fails again, backing off longer).
    let failed_at = monotonic_ns();
    assert!(ep.submit(slice(999)));
    let waiting = ep.outstanding();
    let seen = drain(&mut ep, waiting, STEP);
    assert_eq!(seen.len(), waiting);
    assert_eq!(
        tries.load(Ordering::SeqCst),
        2,
        "one retry after the backoff"
    );
    let EndpointState::Broken { retry_ns, .. } = ep.state() else {
        panic!("{:?}", ep.state())
    };
    assert!(
        retry_ns >= failed_at + 2 * BACKOFF_MIN_NS,
        "the backoff doubled"
    );
}

#[test]
fn while_connecting_the_backlog_is_bounded_and_then_drains() {
    plan(23, 0.0, 0.0);
    let (open, gate) = std::sync::mpsc::channel();
    let (go, went) = std::sync::mpsc::channel::<()>();
    // Opens the gate when told, or after STEP: a flush that blocked on the
    // connect would return then, and the state check below fails.
    let opener = std::thread::spawn(move || {
        let _ = went.recv_timeout(STEP);
        open.send(()).unwrap();
    });
    let src = GatedSource {
        gate,
        inner: fake(70_000),
    };
    let (mut ep, _c) = endpoint(src, 4, 16);
    for t in 0..16 {
        assert!(ep.submit(slice(t)));
    }
    assert!(!ep.submit(slice(16)), "a full backlog refuses");
    let mut none = |c: RdmaCompletion| panic!("nothing completes yet: {c:?}");
    ep.flush(&mut none);
    ep.flush(&mut none);
    assert_eq!(ep.state(), EndpointState::Connecting);
    assert!(!ep.submit(slice(16)), "still full while connecting");
    assert_eq!(ep.outstanding(), 16);
    go.send(()).unwrap();
    let seen = drain(&mut ep, 16, STEP);
    assert_eq!(seen.len(), 16);
    assert!(seen.iter().all(|c| c.result == Ok(64)));
    assert!(ep.submit(slice(16)), "room again");
    opener.join().unwrap();
}

#[test]
fn a_connect_outliving_its_endpoint_destroys_its_qp_and_a_stopped_connector_fails_new_work() {
    plan(29, 0.0, 0.0);
    let c = Connector::start().unwrap();
    let handle = c.handle();
    let (open, gate) = std::sync::mpsc::channel();
    let (probe, tries, live) = Probe::new(GatedSource {
        gate,
        inner: fake(80_000),
    });
    let mut ep = Endpoint::new(Box::new(probe), 8, 16, &handle);
    assert!(ep.submit(slice(0)));
    ep.flush(&mut |c| panic!("{c:?}"));
    let start = std::time::Instant::now();
    while tries.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < STEP, "the connector took the job");
        std::thread::yield_now();
    }
    // The endpoint goes away while its QP is being connected; dropping
    // the connector waits for that connect, then stops.
    drop(ep);
    let stopper = std::thread::spawn(move || drop(c));
    open.send(()).unwrap();
    stopper.join().unwrap();
    assert_eq!(tries.load(Ordering::SeqCst), 1);
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "the QP made for nobody was destroyed"
    );
    // An endpoint whose connector is gone: its work fails, typed, at once.
    let (mut ep, _, _) = {
        let (probe, t, l) = Probe::new(fake(81_000));
        (Endpoint::new(Box::new(probe), 8, 16, &handle), t, l)
    };
    assert!(ep.submit(slice(1)));
    let seen = drain(&mut ep, 1, STEP);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].result, Err(ErrorKind::Unreachable));
    assert!(matches!(
        ep.state(),
        EndpointState::Broken {
            kind: ErrorKind::Unreachable,
            ..
        }
    ));
}

/// Piece `i` of task `token`, with a local address of its own.
fn piece(token: u64, i: u64) -> RdmaSlice {
    RdmaSlice {
        local: 0x10_0000 + (token * 64 + i) * 64,
        ..slice(token)
    }
}

type End = (u64, u64, std::result::Result<u64, ErrorKind>);

/// (token, local address, result) of each completion, in order.
fn ends(seen: &[RdmaCompletion]) -> Vec<End> {
    seen.iter()
        .map(|c| (c.token, c.slice.local, c.result))
        .collect()
}

fn end(s: RdmaSlice, result: std::result::Result<u64, ErrorKind>) -> End {
    (s.token, s.local, result)
}

/// Flush until a QP is connected (the flush that takes it posts at once).
fn connect(ep: &mut Endpoint, seen: &mut Vec<RdmaCompletion>) {
    let start = std::time::Instant::now();
    while !ep.is_connected() {
        ep.flush(&mut |c| seen.push(c));
        assert!(start.elapsed() < STEP, "a QP connected");
        std::thread::yield_now();
    }
}

/// Let the fake NIC finish everything, and drive `ep` until `n` more
/// slices completed.
fn finish(ep: &mut Endpoint, n: usize) -> Vec<RdmaCompletion> {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    while seen.len() < n {
        let mut done = |c: RdmaCompletion| seen.push(c);
        ep.flush(&mut done);
        progress(usize::MAX);
        ep.reap(&mut done);
        ep.fail_exhausted(&mut done);
        assert!(start.elapsed() < STEP, "{} of {n} completed", seen.len());
        std::thread::yield_now();
    }
    seen
}

/// Completions reaped, the fake CQ one completion per `poll_cq`.
fn reap_one(ep: &mut Endpoint) -> Vec<RdmaCompletion> {
    PLAN.with(|p| p.borrow_mut().poll_max = 1);
    let mut seen = Vec::new();
    ep.reap(&mut |c| seen.push(c));
    PLAN.with(|p| p.borrow_mut().poll_max = 0);
    seen
}

#[test]
fn an_abort_fails_waiting_slices_at_once_and_posted_ones_only_once_their_flush_is_reaped() {
    stalled(31);
    let (probe, tries, live) = Probe::new(fake(90_000));
    let (mut ep, _c) = endpoint(probe, 2, 16);
    let (a, b) = (1, 2);
    let order = [
        piece(a, 0),
        piece(b, 0),
        piece(a, 1),
        piece(b, 1),
        piece(a, 2),
    ];
    for s in order {
        assert!(ep.submit(s));
    }
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    assert_eq!(ep.credits_in_flight(), 2, "a0 and b0 on the NIC");
    ep.abort(a, ErrorKind::Timeout, &mut |c| seen.push(c));
    // The waiting pieces end at once; a0 not yet: the NIC may still be
    // writing into its buffer.
    assert_eq!(
        ends(&seen),
        [
            end(piece(a, 1), Err(ErrorKind::Timeout)),
            end(piece(a, 2), Err(ErrorKind::Timeout))
        ]
    );
    assert_eq!(halts(90_001), 1, "the QP was moved to the error state");
    assert_eq!(
        live.load(Ordering::SeqCst),
        1,
        "and kept to reap its flushes"
    );
    assert_eq!(ep.outstanding(), 3);
    // Nothing is posted on a QP in error.
    assert!(ep.submit(piece(b, 2)));
    ep.flush(&mut |c| panic!("{c:?}"));
    assert!(!POSTED.with(|p| p.borrow().contains(&piece(b, 2).local)));
    // a0's flush is the first completion: reaping it ends a0, and with no
    // aborted piece left on it, the QP goes; b0 waits for a fresh one.
    let got = reap_one(&mut ep);
    assert_eq!(ends(&got), [end(piece(a, 0), Err(ErrorKind::Timeout))]);
    assert!(flush_reaped(piece(a, 0).local));
    assert_eq!(
        live.load(Ordering::SeqCst),
        0,
        "the QP in error is destroyed"
    );
    assert_eq!(ep.state(), EndpointState::Idle);
    assert_eq!(ep.credits_in_flight(), 0);
    // b0 (flushed with it), b1 and b2 end well on a fresh QP, and b0's
    // flush does not count against it.
    let mut rest = finish(&mut ep, 3);
    rest.sort_by_key(|c| c.slice.local);
    assert_eq!(
        ends(&rest),
        [
            end(piece(b, 0), Ok(64)),
            end(piece(b, 1), Ok(64)),
            end(piece(b, 2), Ok(64))
        ]
    );
    assert!(rest.iter().all(|c| c.slice.reposts == 0), "{rest:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    assert_eq!(ep.replacements(), 1);
    assert_eq!((ep.outstanding(), ep.credits_in_flight()), (0, 0));
}

#[test]
fn with_selective_signalling_each_aborted_request_ends_at_its_own_flush_and_the_rest_repost_in_order()
 {
    stalled(37);
    let (probe, _tries, live) = Probe::new(fake(91_000));
    // Depth 8: one list of 8, signalled at the 4th and the 8th.
    let (mut ep, _c) = endpoint(probe, 8, 16);
    let (a, b) = (3, 4);
    for i in 0..4 {
        assert!(ep.submit(piece(a, i)));
        assert!(ep.submit(piece(b, i)));
    }
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    assert_eq!(ep.credits_in_flight(), 8);
    // The NIC finishes a0 and b0 (unsignalled: no completion yet).
    progress(2);
    ep.abort(a, ErrorKind::Canceled, &mut |c| seen.push(c));
    assert!(seen.is_empty(), "every piece of a was posted: {seen:?}");
    assert_eq!(halts(91_001), 1);
    let canceled = Err(ErrorKind::Canceled);
    // Flushes come for a1 b1 a2 b2 a3 b3, in order.
    let steps: Vec<Vec<End>> = (0..5).map(|_| ends(&reap_one(&mut ep))).collect();
    assert_eq!(
        steps,
        [
            // a1's flush: a0 and b0 before it had finished.
            vec![
                end(piece(a, 0), Ok(64)),
                end(piece(b, 0), Ok(64)),
                end(piece(a, 1), canceled)
            ],
            vec![],
            vec![end(piece(a, 2), canceled)],
            vec![],
            vec![end(piece(a, 3), canceled)],
        ]
    );
    for i in 1..4 {
        assert!(flush_reaped(piece(a, i).local), "a{i} ended at its flush");
    }
    assert_eq!(live.load(Ordering::SeqCst), 0);
    assert_eq!(ep.outstanding(), 3);
    POSTED.with(|p| p.borrow_mut().clear());
    let rest = finish(&mut ep, 3);
    assert_eq!(
        ends(&rest),
        [
            end(piece(b, 1), Ok(64)),
            end(piece(b, 2), Ok(64)),
            end(piece(b, 3), Ok(64))
        ]
    );
    assert_eq!(
        POSTED.with(|p| p.borrow().clone()),
        [piece(b, 1).local, piece(b, 2).local, piece(b, 3).local],
        "the flushed pieces went out again oldest first"
    );
    assert_eq!((ep.outstanding(), ep.credits_in_flight()), (0, 0));
}

#[test]
fn aborting_twice_or_a_token_with_nothing_here_changes_nothing() {
    stalled(41);
    let (mut ep, _c) = endpoint(fake(92_000), 8, 16);
    let (a, b, stranger) = (5, 6, 99);
    assert!(ep.submit(piece(a, 0)));
    assert!(ep.submit(piece(b, 0)));
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    ep.abort(stranger, ErrorKind::Timeout, &mut |c| seen.push(c));
    assert!(seen.is_empty());
    assert_eq!(
        halts(92_001),
        0,
        "no QP halted for a token it does not hold"
    );
    let first = finish(&mut ep, 2);
    assert!(first.iter().all(|c| c.result == Ok(64)), "{first:?}");
    // Twice: one halt, one end per piece.
    assert!(ep.submit(piece(a, 1)));
    assert!(ep.submit(piece(b, 1)));
    assert!(ep.submit(piece(a, 2)));
    ep.flush(&mut |c| seen.push(c));
    assert_eq!(ep.credits_in_flight(), 3);
    for _ in 0..2 {
        ep.abort(a, ErrorKind::Timeout, &mut |c| seen.push(c));
    }
    assert_eq!(halts(92_001), 1);
    let rest = finish(&mut ep, 3);
    seen.extend(rest);
    seen.sort_by_key(|c| c.slice.local);
    assert_eq!(
        ends(&seen),
        [
            end(piece(a, 1), Err(ErrorKind::Timeout)),
            end(piece(a, 2), Err(ErrorKind::Timeout)),
            end(piece(b, 1), Ok(64))
        ]
    );
    // Once it is all over, another abort finds nothing.
    ep.abort(a, ErrorKind::Timeout, &mut |c| panic!("{c:?}"));
    assert_eq!((ep.outstanding(), ep.credits_in_flight()), (0, 0));
}

#[test]
fn pieces_flushed_by_other_tasks_aborts_are_reposted_without_limit_and_without_blame() {
    stalled(43);
    let (mut ep, _c) = endpoint(fake(93_000), 4, 16);
    let victim = piece(7, 0);
    assert!(ep.submit(victim));
    // Far more rounds than a slice may be flushed by QP errors.
    let rounds = 3 * MAX_REPOSTS as u64;
    for r in 0..rounds {
        let aborted = piece(8, r);
        assert!(ep.submit(aborted));
        let mut seen = Vec::new();
        connect(&mut ep, &mut seen);
        assert_eq!(ep.credits_in_flight(), 2, "round {r}: both on the NIC");
        ep.abort(8, ErrorKind::Timeout, &mut |c| seen.push(c));
        let start = std::time::Instant::now();
        while seen.is_empty() {
            ep.reap(&mut |c| seen.push(c));
            assert!(start.elapsed() < STEP);
        }
        assert_eq!(ends(&seen), [end(aborted, Err(ErrorKind::Timeout))]);
        assert_eq!(ep.state(), EndpointState::Idle);
    }
    let got = finish(&mut ep, 1);
    assert_eq!(ends(&got), [end(victim, Ok(64))]);
    assert_eq!(got[0].slice.reposts, 0);
    assert_eq!(ep.replacements(), rounds);
}

#[test]
fn an_abort_while_connecting_ends_the_waiting_pieces_and_the_rest_go_out_once_connected() {
    plan(47, 0.0, 0.0);
    let (open, gate) = std::sync::mpsc::channel();
    let src = GatedSource {
        gate,
        inner: fake(94_000),
    };
    let (mut ep, _c) = endpoint(src, 8, 16);
    // Dropped before the connector, which joins its thread: a failed
    // assert does not leave it waiting on the gate.
    let open = open;
    let (a, b) = (9, 10);
    for s in [piece(a, 0), piece(b, 0), piece(a, 1)] {
        assert!(ep.submit(s));
    }
    ep.flush(&mut |c| panic!("{c:?}"));
    assert_eq!(ep.state(), EndpointState::Connecting);
    let mut seen = Vec::new();
    ep.abort(a, ErrorKind::Shutdown, &mut |c| seen.push(c));
    assert_eq!(
        ends(&seen),
        [
            end(piece(a, 0), Err(ErrorKind::Shutdown)),
            end(piece(a, 1), Err(ErrorKind::Shutdown))
        ]
    );
    assert_eq!(ep.outstanding(), 1);
    open.send(()).unwrap();
    let rest = drain(&mut ep, 1, STEP);
    assert_eq!(ends(&rest), [end(piece(b, 0), Ok(64))]);
}

#[test]
fn a_rail_lost_while_draining_an_abort_ends_the_aborted_pieces_once_the_qp_is_destroyed() {
    stalled(53);
    let (probe, _tries, live) = Probe::new(fake(95_000));
    let (mut ep, _c) = endpoint(probe, 8, 16);
    let (a, b) = (11, 12);
    assert!(ep.submit(piece(a, 0)));
    assert!(ep.submit(piece(b, 0)));
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    ep.abort(a, ErrorKind::Timeout, &mut |c| seen.push(c));
    assert!(seen.is_empty());
    let mut out = Vec::new();
    ep.evacuate(&mut |s| out.push(s), &mut |c| {
        assert_eq!(live.load(Ordering::SeqCst), 0, "ended after the QP went");
        seen.push(c)
    });
    assert_eq!(ends(&seen), [end(piece(a, 0), Err(ErrorKind::Timeout))]);
    // b0 leaves for another rail (counted as a move, as any evacuation).
    let moved: Vec<(u64, u64)> = out.iter().map(|s| (s.token, s.local)).collect();
    assert_eq!(moved, [(b, piece(b, 0).local)]);
    assert_eq!((ep.outstanding(), ep.credits_in_flight()), (0, 0));
}

#[test]
fn when_the_qp_cannot_be_moved_to_error_it_is_destroyed_and_the_aborted_pieces_end_then() {
    stalled(59);
    PLAN.with(|p| p.borrow_mut().halt_rc = libc::EIO);
    let (probe, _tries, live) = Probe::new(fake(96_000));
    let (mut ep, _c) = endpoint(probe, 8, 16);
    let (a, b) = (13, 14);
    assert!(ep.submit(piece(a, 0)));
    assert!(ep.submit(piece(b, 0)));
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    ep.abort(a, ErrorKind::Timeout, &mut |c| {
        assert_eq!(live.load(Ordering::SeqCst), 0, "ended after the QP went");
        seen.push(c)
    });
    assert_eq!(ends(&seen), [end(piece(a, 0), Err(ErrorKind::Timeout))]);
    let rest = finish(&mut ep, 1);
    assert_eq!(ends(&rest), [end(piece(b, 0), Ok(64))]);
    assert_eq!(rest[0].slice.reposts, 0);
}

#[test]
fn random_aborts_among_faults_end_every_piece_once_and_never_while_the_nic_holds_it() {
    const KINDS: [ErrorKind; 3] = [ErrorKind::Timeout, ErrorKind::Canceled, ErrorKind::Shutdown];
    let (mut halted, mut stopped) = (0, 0);
    for (k, seed) in [3u64, 17, 256, 9_001, 123_457].into_iter().enumerate() {
        stalled(seed);
        PLAN.with(|p| p.borrow_mut().p_error = 0.01);
        let rand = || PLAN.with(|p| p.borrow_mut().next());
        let (mut ep, _c) = endpoint(fake(300_000 + k as u32 * 10_000), 16, 256);
        let tasks = 400u64;
        // Per task: its pieces not ended yet, and its abort if any.
        let mut open: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut aborted: HashMap<u64, ErrorKind> = HashMap::new();
        let mut ended: HashMap<u64, std::result::Result<u64, ErrorKind>> = HashMap::new();
        let mut pieces = 0;
        let (mut next, mut steps) = (0u64, 0u64);
        let mut done = |c: RdmaCompletion,
                        open: &mut HashMap<u64, Vec<u64>>,
                        aborted: &HashMap<u64, ErrorKind>| {
            let a = c.slice.local;
            assert!(
                !on_nic(a),
                "seed {seed}: {c:?} ended while the NIC holds it"
            );
            assert!(
                ended.insert(a, c.result).is_none(),
                "seed {seed}: {c:?} twice"
            );
            let left = open.get_mut(&c.token).expect("a known task");
            left.retain(|&x| x != a);
            if let Some(&kind) = aborted.get(&c.token) {
                assert!(
                    c.result == Ok(64) || c.result == Err(kind),
                    "seed {seed}: aborted {kind:?}, ended {c:?}"
                );
            }
        };
        while next < tasks || open.values().any(|v| !v.is_empty()) {
            steps += 1;
            assert!(steps < 1_000_000, "seed {seed}: no progress");
            // A short backlog: aborts often find their pieces posted.
            if next < tasks && ep.outstanding() < 40 {
                let n = 1 + (rand() * 4.0) as u64;
                let v: Vec<u64> = (0..n).map(|i| piece(next, i).local).collect();
                for i in 0..n {
                    assert!(ep.submit(piece(next, i)));
                }
                pieces += n;
                open.insert(next, v);
                next += 1;
            }
            let mut got = Vec::new();
            ep.flush(&mut |c| got.push(c));
            progress((rand() * 6.0) as usize);
            ep.reap(&mut |c| got.push(c));
            ep.fail_exhausted(&mut |c| got.push(c));
            if next > 0 && rand() < 0.2 {
                // One of the latest tasks: likely still on the NIC.
                let t = next - 1 - (rand() * next.min(16) as f64) as u64;
                if open.get(&t).is_some_and(|v| !v.is_empty()) && !aborted.contains_key(&t) {
                    let kind = KINDS[(rand() * 3.0) as usize % 3];
                    // Ends already made belong to before the abort.
                    for c in got.drain(..) {
                        done(c, &mut open, &aborted);
                    }
                    aborted.insert(t, kind);
                    ep.abort(t, kind, &mut |c| got.push(c));
                }
            }
            for c in got {
                done(c, &mut open, &aborted);
            }
            if ep.state() != EndpointState::Ready {
                // A connect is under way on a connector thread.
                std::thread::yield_now();
            }
        }
        assert_eq!(ended.len() as u64, pieces, "seed {seed}: every piece ended");
        assert_eq!(
            (ep.outstanding(), ep.credits_in_flight()),
            (0, 0),
            "seed {seed}"
        );
        let roots = PLAN.with(|p| p.borrow().roots);
        assert!(roots > 0, "seed {seed}: faults were injected");
        halted += PLAN.with(|p| p.borrow().halted);
        stopped += ended
            .values()
            .filter(|r| matches!(r, Err(k) if KINDS.contains(k)))
            .count();
    }
    assert!(
        halted >= 10 && stopped > 0,
        "aborts stopped posted work: {halted} QPs halted, {stopped} pieces stopped"
    );
}

#[test]
fn a_slice_failing_exhausted_while_a_drain_puts_others_back_leaves_the_backlog_consistent() {
    stalled(61);
    let (mut ep, _c) = endpoint(fake(97_000), 8, 16);
    let (a, b, c) = (15, 16, 17);
    // b was moved between rails more often than a QP may flush it: it is
    // posted (it came in with this poll) and fails once it is back.
    let tired = RdmaSlice {
        reposts: MAX_REPOSTS + 1,
        ..piece(b, 0)
    };
    for s in [tired, piece(c, 0), piece(a, 0)] {
        assert!(ep.submit(s));
    }
    let mut seen = Vec::new();
    connect(&mut ep, &mut seen);
    assert_eq!(ep.credits_in_flight(), 3);
    ep.abort(a, ErrorKind::Timeout, &mut |c| seen.push(c));
    // b's flush puts it back, and it fails exhausted there; then c's.
    seen.extend(reap_one(&mut ep));
    ep.fail_exhausted(&mut |c| seen.push(c));
    seen.extend(reap_one(&mut ep));
    seen.extend(reap_one(&mut ep));
    assert_eq!(
        ends(&seen),
        [
            end(tired, Err(ErrorKind::Unreachable)),
            end(piece(a, 0), Err(ErrorKind::Timeout))
        ]
    );
    let rest = finish(&mut ep, 1);
    assert_eq!(ends(&rest), [end(piece(c, 0), Ok(64))]);
    assert_eq!((ep.outstanding(), ep.credits_in_flight()), (0, 0));
}

/// An endpoint over a fresh fake source with the send-queue knobs `sq`.
fn endpoint_with(depth: u32, next_id: u32, sq: SqSettings) -> (Endpoint, Connector) {
    let src = fake(next_id);
    endpoint_sq(src, depth, 64, sq)
}

/// Which of the requests the fake NIC holds (in order) are signalled.
fn signalled() -> Vec<bool> {
    QUEUES.with(|qs| {
        qs.borrow()
            .values()
            .flat_map(|q| q.pending.iter().map(|&(_, s, _)| s))
            .collect()
    })
}

#[test]
fn the_signal_interval_signals_every_nth_request_of_a_list() {
    for (interval, want) in [
        // Default: every depth/2-th (8 of 16), and the last of the list.
        (0, vec![7, 9]),
        (4, vec![3, 7, 9]),
        (1, (0..10).collect()),
    ] {
        stalled(5);
        let sq = SqSettings {
            signal_interval: interval,
            ..SqSettings::default()
        };
        let (mut ep, _c) = endpoint_with(16, 120_000 + interval * 100, sq);
        for t in 0..10 {
            assert!(ep.submit(slice(t)));
        }
        let mut seen = Vec::new();
        connect(&mut ep, &mut seen);
        let flags = signalled();
        let at: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
        assert_eq!(at, want, "interval {interval}: {flags:?}");
        assert_eq!(finish(&mut ep, 10).len(), 10);
        QUEUES.with(|qs| qs.borrow_mut().clear());
    }
}

#[test]
fn the_resume_watermark_holds_posting_until_enough_of_the_queue_is_free() {
    for (watermark, want) in [(4, [7, 6, 5, 8]), (0, [8, 8, 8, 8])] {
        stalled(6);
        let sq = SqSettings {
            resume_watermark: watermark,
            // Every request completes on its own: one credit at a time.
            signal_interval: 1,
            ..SqSettings::default()
        };
        let (mut ep, _c) = endpoint_with(8, 130_000 + watermark * 100, sq);
        for t in 0..20 {
            assert!(ep.submit(slice(t)));
        }
        let mut seen = Vec::new();
        connect(&mut ep, &mut seen);
        assert_eq!(ep.credits_in_flight(), 8);
        let mut got = Vec::new();
        // Requests finish one at a time: with the watermark nothing is
        // posted until 4 are free, then 4 at once; without it, each freed
        // slot is taken again at once.
        for n in [1, 1, 1, 1] {
            progress(n);
            ep.reap(&mut |c| seen.push(c));
            ep.flush(&mut |c| seen.push(c));
            got.push(ep.credits_in_flight());
        }
        assert_eq!(got, want, "watermark {watermark}");
        assert_eq!(finish(&mut ep, 16).len() + seen.len(), 20);
        QUEUES.with(|qs| qs.borrow_mut().clear());
    }
}

#[test]
fn a_path_that_kills_every_qp_at_once_is_not_reconnected_in_a_storm() {
    // Every request fails: each QP dies on its first list.
    plan(13, 0.0, 1.0);
    let src = fake(140_000);
    let (mut ep, _c) = endpoint(src, 8, 64);
    let old = ep.sq().clone();
    let start = std::time::Instant::now();
    let (mut next, mut ended, mut unreachable) = (0, 0u64, 0u64);
    let mut terminal_seen = false;
    while start.elapsed() < std::time::Duration::from_millis(1_000) {
        // The application keeps sending.
        while ep.submit(slice(next)) {
            next += 1;
        }
        let mut done = |c: RdmaCompletion| {
            ended += 1;
            unreachable += u64::from(c.result == Err(ErrorKind::Unreachable));
        };
        ep.flush(&mut done);
        ep.reap(&mut done);
        ep.fail_exhausted(&mut done);
        terminal_seen |= old.is_terminal();
        std::thread::yield_now();
    }
    // Dead QPs in a row: the 2nd waits 250 ms, the 3rd 500 ms, the 4th
    // 1 s: at most 3 replacements in the first second (it was one per
    // flush: thousands).
    let r = ep.replacements();
    assert!((2..=4).contains(&r), "{r} QPs replaced in 1 s");
    assert!(
        terminal_seen,
        "the dead QP's SqController was taken out of service"
    );
    assert!(
        !Arc::ptr_eq(&old, ep.sq()),
        "each QP gets a fresh controller"
    );
    assert!(
        ended > 0 && unreachable > 0,
        "{ended} ended, {unreachable} Unreachable"
    );
}

#[test]
fn a_qp_that_did_work_before_it_died_is_replaced_at_once() {
    // One request in 40 fails; a QP completes some before dying: no QP
    // death is "at once", so nothing waits.
    plan(17, 0.0, 0.025);
    let src = fake(150_000);
    let (mut ep, _c) = endpoint(src, 16, 256);
    let start = std::time::Instant::now();
    let seen = run(&mut ep, 3_000);
    assert!(seen.values().all(|v| v.len() == 1));
    assert!(ep.replacements() > 10, "{}", ep.replacements());
    assert!(
        start.elapsed() < std::time::Duration::from_millis(2_000),
        "{:?}",
        start.elapsed()
    );
}

/// Knobs for tests that go terminal often: a 1 ms first backoff.
fn fast_backoff() -> SqSettings {
    SqSettings {
        backoff_min: std::time::Duration::from_millis(1),
        ..SqSettings::default()
    }
}

/// A 16-deep endpoint on a stalled fake NIC (plan `seed`, QP ids from
/// `next_id`), with slices 0..8 posted and nothing completed; what ended
/// meanwhile.
fn eight_posted(seed: u64, next_id: u32) -> (Endpoint, Connector, Vec<RdmaCompletion>) {
    stalled(seed);
    let (mut ep, c) = endpoint_with(16, next_id, SqSettings::default());
    let mut seen = Vec::new();
    for t in 0..8 {
        assert!(ep.submit(slice(t)));
    }
    connect(&mut ep, &mut seen);
    ep.flush(&mut |c| seen.push(c));
    (ep, c, seen)
}

/// Every status of seed 004's fatal list, at the 4th of 8 posted requests:
/// the three before it complete, it fails with its kind, the endpoint is
/// terminal-degraded (its controller refuses admission, it takes no new
/// work for the backoff), and the four after it, and two waiting in the
/// backlog, are handed out once each to move on; no credit is held.
#[test]
fn a_fatal_completion_makes_the_endpoint_terminal_and_its_work_moves_on_once() {
    for (k, status) in FATAL.into_iter().enumerate() {
        let (mut ep, _c, mut seen) = eight_posted(71 + k as u64, 400_000 + k as u32 * 100);
        assert_eq!(ep.ledger_records(), 8);
        let old = ep.sq().clone();
        for t in 8..10 {
            assert!(ep.submit(slice(t)));
        }
        fail_pending(3, status);
        progress(usize::MAX);
        ep.reap(&mut |c| seen.push(c));
        let kind = match outcome(status) {
            Outcome::Fatal(kind) => kind,
            o => panic!("{status:?} is on the fatal list, mapped {o:?}"),
        };
        let got: Vec<_> = seen.iter().map(|c| (c.token, c.result)).collect();
        assert_eq!(
            got,
            [(0, Ok(64)), (1, Ok(64)), (2, Ok(64)), (3, Err(kind))],
            "{status:?}"
        );
        assert!(old.is_terminal(), "{status:?}: its controller is terminal");
        assert_eq!(old.try_admit(1).err(), Some(SqRefusal::Degraded));
        assert!(
            !ep.accepting(),
            "{status:?}: no new work during the backoff"
        );
        assert!(matches!(ep.state(), EndpointState::Broken { .. }));
        assert_eq!(ep.last_terminal(), Some(TerminalCause::Cqe(kind)));
        assert_eq!((ep.terminals(), ep.credits_in_flight()), (1, 0));
        let mut moved = vec![];
        ep.extract_orphans(&mut |s| moved.push(s.token));
        assert_eq!(moved, [4, 5, 6, 7, 8, 9], "{status:?}: in order, once");
        ep.extract_orphans(&mut |s| panic!("{s:?} handed out twice"));
        assert_eq!(ep.outstanding(), 0);
    }
}

/// A failure that is the request's own (not on the fatal list) leaves the
/// endpoint in service: the requests flushed behind it are posted again
/// on a fresh QP at once, nothing is handed out.
#[test]
fn a_recoverable_failure_replaces_the_qp_and_reposts_in_place() {
    for (k, status) in RECOVERABLE.into_iter().enumerate() {
        let (mut ep, _c, mut seen) = eight_posted(81 + k as u64, 410_000 + k as u32 * 100);
        fail_pending(3, status);
        progress(usize::MAX);
        ep.reap(&mut |c| seen.push(c));
        assert!(ep.accepting() && ep.terminals() == 0, "{status:?}");
        seen.extend(finish(&mut ep, 4));
        ep.extract_orphans(&mut |s| panic!("{s:?} moved on a recoverable failure"));
        let failed: Vec<_> = seen.iter().filter(|c| c.result.is_err()).collect();
        assert_eq!(failed.len(), 1, "{status:?}: only the root fails");
        assert_eq!(seen.len(), 8);
        assert_eq!(ep.replacements(), 1);
    }
}

/// Seeded faults on all four failure paths at once, over many seeds:
/// a reserve refused (the controller degraded from outside, as a QP-fatal
/// async event does), a re-check that fails (degraded between reserve and
/// post), `post_send` refusing work, and fatal completions, among SQ-full
/// refusals and recoverable failures. Every slice ends exactly once
/// (a completion, or handed out to move on), none is lost, credits come
/// back to the initial count, and each path was taken.
#[test]
fn the_four_failure_paths_converge_exactly_once_under_seeded_faults() {
    thread_local! {
        static RECHECK_FAULTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    fn degrade_sometimes(sq: &SqController) {
        if PLAN.with(|p| p.borrow_mut().next()) < 0.01 {
            RECHECK_FAULTS.with(|c| c.set(c.get() + 1));
            sq.mark_terminal();
        }
    }
    static MIXED: [S; 6] = [
        S::IBV_WC_RETRY_EXC_ERR,
        S::IBV_WC_REM_ACCESS_ERR,
        S::IBV_WC_LOC_QP_OP_ERR,
        S::IBV_WC_REM_OP_ERR,
        S::IBV_WC_LOC_LEN_ERR,
        S::IBV_WC_FATAL_ERR,
    ];
    let mut causes: HashMap<&'static str, u64> = HashMap::new();
    for seed in [2u64, 31, 577, 4_099, 65_537, 900_001] {
        plan(seed, 0.03, 0.01);
        PLAN.with(|p| {
            let mut p = p.borrow_mut();
            p.roots_of = &MIXED;
            p.p_refuse = 0.003;
        });
        let (mut ep, _c) = endpoint_sq(
            fake(500_000 + (seed % 1000) as u32 * 50),
            16,
            128,
            fast_backoff(),
        );
        ep.pre_post = Some(degrade_sometimes);
        let n = 4_000u64;
        let mut ends: HashMap<u64, u32> = HashMap::new();
        let (mut next, mut total, mut terminals) = (0u64, 0usize, 0u64);
        let start = std::time::Instant::now();
        while total < n as usize {
            while next < n && ep.accepting() && ep.submit(slice(next)) {
                next += 1;
            }
            if ep.is_connected() && PLAN.with(|p| p.borrow_mut().next()) < 0.005 {
                // A QP-fatal async event: the reserve path.
                ep.sq().mark_terminal();
            }
            let mut k = 0;
            let mut end = |t: u64| {
                k += 1;
                *ends.entry(t).or_default() += 1;
            };
            ep.flush(&mut |c| end(c.token));
            ep.reap(&mut |c| end(c.token));
            ep.fail_exhausted(&mut |c| end(c.token));
            ep.extract_orphans(&mut |s| end(s.token));
            if ep.terminals() > terminals {
                terminals = ep.terminals();
                let cause = match ep.last_terminal().expect("a cause") {
                    TerminalCause::Reserve => "reserve",
                    TerminalCause::Recheck => "recheck",
                    TerminalCause::Post(_) => "post",
                    TerminalCause::Cqe(_) => "cqe",
                    TerminalCause::Poll(_) => "poll",
                };
                *causes.entry(cause).or_default() += 1;
            }
            if k == 0 {
                std::thread::yield_now();
            }
            total += k;
            assert!(start.elapsed().as_secs() < 60, "seed {seed}: no progress");
        }
        assert_eq!(ends.len() as u64, n, "seed {seed}: none lost");
        assert!(ends.values().all(|&c| c == 1), "seed {seed}: exactly once");
        assert_eq!(
            (
                ep.outstanding(),
                ep.credits_in_flight(),
                ep.sq().available()
            ),
            (0, 0, 16),
            "seed {seed}: credits back to the initial count"
        );
    }
    for path in ["reserve", "recheck", "post", "cqe"] {
        assert!(
            causes.get(path).copied().unwrap_or(0) > 0,
            "path {path} never taken: {causes:?}"
        );
    }
}

/// The seed's three pending-unsignalled orphaning paths: requests posted
/// without a signal have no completion of their own, so only the ledger
/// knows them; when the queue goes terminal they are orphaned and handed
/// out once.
#[test]
fn pending_unsignalled_requests_are_orphaned_once_when_a_recheck_fails() {
    fn degrade(sq: &SqController) {
        sq.mark_terminal();
    }
    stalled(91);
    let sq = SqSettings {
        signal_interval: 1_000,
        ..SqSettings::default()
    };
    let (mut ep, _c) = endpoint_with(32, 420_000, sq);
    let mut seen = Vec::new();
    for t in 0..8 {
        assert!(ep.submit(slice(t)));
    }
    connect(&mut ep, &mut seen);
    ep.flush(&mut |c| seen.push(c));
    // One list of 8: only its last request is signalled.
    assert_eq!(signalled().iter().filter(|&&s| s).count(), 1);
    for t in 8..12 {
        assert!(ep.submit(slice(t)));
    }
    ep.pre_post = Some(degrade);
    ep.flush(&mut |c| seen.push(c));
    assert!(seen.is_empty(), "nothing ends: {seen:?}");
    assert_eq!(ep.last_terminal(), Some(TerminalCause::Recheck));
    assert_eq!((ep.ledger_records(), ep.credits_in_flight()), (0, 0));
    let mut moved = vec![];
    ep.extract_orphans(&mut |s| moved.push(s.token));
    assert_eq!(
        moved,
        (0..12).collect::<Vec<_>>(),
        "the posted 8, then the 4 waiting"
    );
    // The QP was destroyed: its NIC work is gone, nothing more completes.
    progress(usize::MAX);
    assert_eq!(ep.reap(&mut |c| seen.push(c)), 0);
    assert!(seen.is_empty());
}

/// Two endpoints, several tasks on each: a degrade on one (the reserve
/// path) orphans its tasks' pieces, each once; the other keeps moving.
#[test]
fn a_reserve_refused_on_one_endpoint_orphans_only_its_tasks() {
    stalled(93);
    let sq = SqSettings {
        signal_interval: 1_000,
        ..SqSettings::default()
    };
    let (mut a, _ca) = endpoint_with(32, 430_000, sq);
    let (mut b, _cb) = endpoint_with(32, 431_000, sq);
    let mut seen = Vec::new();
    for task in 0..3 {
        for i in 0..3 {
            assert!(a.submit(piece(task, i)));
            assert!(b.submit(piece(10 + task, i)));
        }
    }
    connect(&mut a, &mut seen);
    connect(&mut b, &mut seen);
    a.flush(&mut |c| seen.push(c));
    b.flush(&mut |c| seen.push(c));
    // More work for both, then a's queue is degraded from outside.
    assert!(a.submit(piece(3, 0)));
    assert!(b.submit(piece(13, 0)));
    a.sq().mark_terminal();
    a.flush(&mut |c| seen.push(c));
    assert_eq!(a.last_terminal(), Some(TerminalCause::Reserve));
    let mut moved: Vec<(u64, u64)> = vec![];
    a.extract_orphans(&mut |s| moved.push((s.token, s.local)));
    assert_eq!(
        moved.len(),
        10,
        "9 posted (unsignalled but the last), 1 waiting"
    );
    let mut tasks: Vec<u64> = moved.iter().map(|m| m.0).collect();
    tasks.dedup();
    assert_eq!(tasks, [0, 1, 2, 3]);
    // b is untouched: all its pieces complete.
    seen.extend(finish(&mut b, 10));
    assert!(seen.iter().all(|c| c.token >= 10 && c.result == Ok(64)));
    assert_eq!((b.terminals(), b.credits_in_flight()), (0, 0));
}

/// Admission is closed the moment the queue degrades, before any recovery:
/// an admission held across it gives its count back, and that does not
/// open the old queue again; the endpoint's next QP gets a fresh
/// controller that admits.
#[test]
fn admission_is_closed_before_recovery() {
    stalled(97);
    let (mut ep, _c) = endpoint_sq(fake(440_000), 8, 64, fast_backoff());
    let mut seen = Vec::new();
    assert!(ep.submit(slice(0)));
    connect(&mut ep, &mut seen);
    let old = ep.sq().clone();
    let token = old.try_admit(2).expect("room");
    ep.flush(&mut |c| seen.push(c));
    fail_pending(0, S::IBV_WC_RETRY_EXC_ERR);
    progress(usize::MAX);
    ep.reap(&mut |c| seen.push(c));
    assert_eq!(seen.len(), 1);
    assert_eq!(old.try_admit(1).err(), Some(SqRefusal::Degraded));
    drop(token);
    assert_eq!(old.queued(), 0);
    assert_eq!(
        old.try_admit(1).err(),
        Some(SqRefusal::Degraded),
        "stays closed"
    );
    // After the backoff, new work connects a fresh QP with a fresh
    // controller that admits again.
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert!(ep.accepting());
    assert!(ep.submit(slice(1)));
    seen.extend(finish(&mut ep, 1));
    assert!(!Arc::ptr_eq(&old, ep.sq()));
    assert!(ep.sq().try_admit(1).is_ok());
    assert_eq!(seen.last().map(|c| c.result), Some(Ok(64)));
}

/// `sq_backoff_timeout_us`: an endpoint holding posted requests with no
/// completion for longer than the timeout is stalled. It sheds its waiting
/// slices (oldest first, once, counted once per stall), a completion ends
/// the stall, and the diagnostics tell a slow drain (polled, nothing came
/// back) from a poll stall.
#[test]
fn an_endpoint_with_no_completion_for_the_timeout_is_stalled_and_sheds_its_backlog() {
    stalled(91);
    let sq = SqSettings {
        stall_timeout: std::time::Duration::from_millis(5),
        ..SqSettings::default()
    };
    // Depth 4: four posted, the rest wait in the backlog.
    let (mut ep, _c) = endpoint_with(4, 420_000, sq);
    let mut seen = Vec::new();
    for t in 0..7 {
        assert!(ep.submit(slice(t)));
    }
    let t0 = 1_000_000_000;
    ep.polled_at(t0);
    connect(&mut ep, &mut seen);
    ep.flush(&mut |c| seen.push(c));
    ep.reap(&mut |c| seen.push(c));
    assert_eq!((ep.ledger_records(), ep.outstanding()), (4, 7));
    // Within the timeout: not stalled, however long the NIC holds them.
    assert!(!ep.stalled(t0 + 5_000_000));
    let late = t0 + 5_000_001;
    ep.polled_at(late);
    ep.reap(&mut |c| seen.push(c));
    assert!(ep.stalled(late));
    let mut shed = vec![];
    assert!(
        ep.shed_backlog(&mut |s| shed.push(s.token)),
        "first time: report"
    );
    assert_eq!(shed, [4, 5, 6], "the waiting slices, oldest first");
    assert!(
        !ep.shed_backlog(&mut |s| panic!("{s:?} shed twice")),
        "once per stall"
    );
    let r = ep.report(late);
    assert_eq!(
        (r.stalls, r.ledger_records, r.backlog, r.posted),
        (1, 4, 0, 4)
    );
    assert_eq!(r.last_poll_us_ago, Some(0), "polled: not a poll stall");
    assert_eq!(r.last_cqe_us_ago, None, "no completion ever: a drain stall");
    assert!(r.to_string().contains("last_cqe=never"), "{r}");
    // The NIC moves again: the stall ends at the first completion.
    progress(usize::MAX);
    let back = late + 1_000;
    ep.polled_at(back);
    ep.reap(&mut |c| seen.push(c));
    assert!(
        !ep.stalled(back + 10_000_000),
        "nothing posted: never stalled"
    );
    let r = ep.report(back);
    // Signalled every depth/2: two completions released the four.
    assert_eq!(
        (r.cqes, r.recent_release_wr, r.last_cqe_us_ago),
        (2, 4, Some(0))
    );
    let done: Vec<_> = seen.iter().map(|c| (c.token, c.result)).collect();
    assert_eq!(done, [(0, Ok(64)), (1, Ok(64)), (2, Ok(64)), (3, Ok(64))]);
    // A busy period after the stall starts its own clock, and a new stall
    // is reported again.
    assert!(ep.submit(slice(7)));
    ep.flush(&mut |c| seen.push(c));
    assert!(!ep.stalled(back + 5_000_000));
    assert!(ep.stalled(back + 5_000_001));
    assert!(ep.shed_backlog(&mut |s| panic!("{s:?}: nothing waits")));
    assert_eq!(ep.report(back).stalls, 2);
}

/// A zero `sq_backoff_timeout_us` never stalls an endpoint.
#[test]
fn a_zero_stall_timeout_is_off() {
    stalled(92);
    let sq = SqSettings {
        stall_timeout: std::time::Duration::ZERO,
        ..SqSettings::default()
    };
    let (mut ep, _c) = endpoint_with(4, 421_000, sq);
    let mut seen = Vec::new();
    assert!(ep.submit(slice(0)));
    connect(&mut ep, &mut seen);
    ep.polled_at(1);
    ep.flush(&mut |c| seen.push(c));
    assert_eq!(ep.ledger_records(), 1);
    assert!(!ep.stalled(u64::MAX));
}
