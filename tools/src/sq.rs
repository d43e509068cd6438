//! `tent-bench --mode sq`: seed 004's send-queue flow control measured
//! against the simulated verbs provider (`tent::transport::rdma::sim`), so
//! it runs anywhere, RDMA or not.
//!
//! What runs is the engine's own code below the rings: real
//! [`Endpoint`]s (ledger, `SqController`, signalling, linked WR lists,
//! the provider dispatch), the per-peer [`AdmissionGate`] and the split
//! policies ([`choose`]). Around them this harness plays the rest: a
//! worker thread that holds what it cannot hand out (as the engine's task
//! table does), hands a slice to the QP its policy picks unless the rail
//! is at its depth (`qp_per_transfer` × `qp_depth`: the rail layer's
//! `SqFull`, which the engine's worker waits out), posts, reaps and
//! reports completions; and submitter threads that keep `outstanding`
//! requests in flight, through the gate or straight to the worker.
//!
//! Three parts, each a line per configuration (`--json`: an object):
//! 1. **Burst:** 1024 / 2048 / 4096 requests outstanding against one
//!    QP 256 deep, admission off and on: `sq_full_turns` (worker turns
//!    that found the queue full with work left to hand out: a count of
//!    turns, so it scales with CPU speed), `sq_full_errors` (requests
//!    failed `SqFull`), `lost` (neither completed nor refused when the
//!    run ended), `worker_held_max` (most requests the worker held beyond
//!    what its queue took).
//! 2. **Policy:** 4 QPs of one rail, one of them finishing a quarter as
//!    fast, 4096 outstanding: `static` vs `least_loaded` vs `capacity`,
//!    `depth_stddev` (per worker turn with work on the rail and every QP
//!    connected, across the 4 QPs' posted + waiting requests, averaged
//!    over the run). The QP is
//!    chosen by the same `choose` the RDMA post path uses (every QP open:
//!    the simulated ones never stall or fail).
//! 3. **Post path:** one thread, batches of 32 one-QP writes: ns per work
//!    request through the endpoint with admission off and on, and the
//!    provider alone (the same lists posted and polled with no endpoint)
//!    as the floor, measured alternately in the same run.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tent::clock::monotonic_ns;
use tent::config::SplitPolicy;
use tent::flow::split::{QueueLoad, choose, next_cursor};
use tent::flow::{AdmissionGate, AdmissionToken};
use tent::transport::rdma::sim::SimSource;
use tent::transport::rdma::{Connector, Endpoint, QueueSource, RdmaCompletion, RdmaSlice};
use tent_rings::{Opcode, Priority};

use crate::{Args, emit};

/// Send-queue depth of every simulated QP (MORI's test plan: 256).
const DEPTH: u32 = 256;
/// Requests a fast simulated QP finishes per poll of its CQ.
const FAST: u32 = 16;
/// The slow QP's rate: a quarter.
const SLOW: u32 = 4;
/// Submitting threads.
const SUBMITTERS: u64 = 2;
/// Longest admission wait before a submit fails `SqFull`.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(5);

/// One configuration of parts 1 and 2.
#[derive(Debug, Clone, Copy)]
struct Setup {
    outstanding: u64,
    admission: bool,
    policy: SplitPolicy,
    qps: usize,
    /// QP 0 finishes at [`SLOW`] instead of [`FAST`].
    slow_qp: bool,
    requests: u64,
}

/// What a configuration saw.
#[derive(Debug, Default)]
struct Outcome {
    ok: u64,
    sq_full_turns: u64,
    sq_full_errors: u64,
    failed: u64,
    duplicated: u64,
    lost: u64,
    worker_held_max: usize,
    depth_stddev: f64,
    admission_waits: u64,
    secs: f64,
}

/// A request on its way to the worker: its token (submitter in the top
/// bits) and, with admission, its charge.
struct Request {
    token: u64,
    /// Held until the request is handed to its endpoint; dropping it
    /// releases the charge.
    _charge: Option<AdmissionToken>,
}

fn slice(token: u64) -> RdmaSlice {
    RdmaSlice {
        token,
        opcode: Opcode::Write,
        local: 0x10_0000,
        len: 4096,
        lkey: 1,
        remote: 0x20_0000,
        rkey: 2,
        reposts: 0,
        ctx: 0,
        posted_ns: 0,
        ahead: 0,
        urgent: false,
    }
}

/// `qps` endpoints over simulated QPs (QP 0 slow if asked); each
/// connects its QP when it first has work.
fn endpoints(connector: &Connector, qps: usize, slow_qp: bool, backlog: usize) -> Vec<Endpoint> {
    (0..qps)
        .map(|k| {
            let rate = if slow_qp && k == 0 { SLOW } else { FAST };
            Endpoint::new(
                Box::new(SimSource::new(DEPTH, rate)),
                DEPTH,
                backlog,
                &connector.handle(),
            )
        })
        .collect()
}

/// Population standard deviation of `xs`.
fn stddev(xs: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = xs.clone().count() as f64;
    if n == 0.0 {
        return 0.0;
    }
    let mean = xs.clone().sum::<f64>() / n;
    (xs.map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt()
}

/// Run one configuration of parts 1 and 2.
fn run(connector: &Connector, s: Setup) -> Result<Outcome, String> {
    let eps = endpoints(connector, s.qps, s.slow_qp, s.requests as usize);
    let gate = Arc::new(AdmissionGate::new(
        eps.iter().map(|e| e.published_sq().clone()).collect(),
        0,
        0,
    ));
    let diags: Vec<_> = eps.iter().map(|e| e.diagnostics().clone()).collect();
    let (tx, rx) = mpsc::channel::<Request>();
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..SUBMITTERS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Requests the gate refused (their submit failed `SqFull`).
    let refused = Arc::new(AtomicU64::new(0));
    let per = s.requests / SUBMITTERS;
    let total = per * SUBMITTERS;
    let start = Instant::now();
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|t| {
            let (tx, gate, done, stop, refused) = (
                tx.clone(),
                gate.clone(),
                done.clone(),
                stop.clone(),
                refused.clone(),
            );
            let window = (s.outstanding / SUBMITTERS).max(1);
            std::thread::spawn(move || {
                let mut sent = 0;
                while sent < per {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let finished = done[t as usize].load(Ordering::Acquire);
                    if sent - finished >= window {
                        std::thread::yield_now();
                        continue;
                    }
                    let charge = if s.admission {
                        match gate.admit(s.policy, 1, ADMISSION_TIMEOUT, Priority::High) {
                            Ok(mut tokens) => tokens.pop(),
                            Err(_) => {
                                // `submit` fails SqFull: the request is
                                // not sent, and counted as such.
                                refused.fetch_add(1, Ordering::Release);
                                done[t as usize].fetch_add(1, Ordering::Release);
                                sent += 1;
                                continue;
                            }
                        }
                    } else {
                        None
                    };
                    let token = (t << 48) | sent;
                    if tx
                        .send(Request {
                            token,
                            _charge: charge,
                        })
                        .is_err()
                    {
                        break;
                    }
                    sent += 1;
                }
            })
        })
        .collect();
    drop(tx);
    let worker = {
        let (done, refused) = (done.clone(), refused.clone());
        std::thread::spawn(move || worker(eps, rx, done, refused, s, total))
    };
    let mut out = worker.join().map_err(|_| "sq: the worker panicked")?;
    // A worker that gave up (deadline) lets the submitters go too.
    stop.store(true, Ordering::Relaxed);
    for h in submitters {
        h.join().map_err(|_| "sq: a submitter panicked")?;
    }
    out.secs = start.elapsed().as_secs_f64();
    out.sq_full_errors = refused.load(Ordering::Acquire);
    out.lost = total.saturating_sub(out.ok + out.failed + out.sq_full_errors);
    for d in &diags {
        out.admission_waits += d.report(0, 0, DEPTH).admission_waits;
    }
    Ok(out)
}

/// The worker: holds what it cannot hand out, hands slices to the QP the
/// policy picks while the rail has room, posts, reaps.
fn worker(
    mut eps: Vec<Endpoint>,
    rx: mpsc::Receiver<Request>,
    done: Arc<Vec<AtomicU64>>,
    refused: Arc<AtomicU64>,
    s: Setup,
    total: u64,
) -> Outcome {
    let mut out = Outcome::default();
    let mut held: VecDeque<Request> = VecDeque::with_capacity(s.outstanding as usize);
    let mut seen = vec![false; total as usize];
    let per = total / SUBMITTERS;
    let (mut cursor, mut turns) = (0usize, 0u64);
    let mut stddev_sum = 0.0;
    let rail_depth = DEPTH as usize * s.qps;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut closed = false;
    // Until every request completed once or was refused at the gate;
    // what is neither by the deadline is lost.
    while out.ok + out.failed + refused.load(Ordering::Acquire) < total {
        if Instant::now() > deadline {
            break;
        }
        if !closed {
            loop {
                match rx.try_recv() {
                    Ok(r) => held.push_back(r),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
        }
        // The rail layer's bound: the rail holds at most its QPs' depth
        // of this worker's slices; the rest waits in the worker.
        let mut on_rail: usize = eps.iter().map(Endpoint::outstanding).sum();
        while let Some(r) = held.front() {
            if on_rail >= rail_depth {
                out.sq_full_turns += 1;
                break;
            }
            let Some(k) = choose(s.policy, eps.len(), cursor, |k| QueueLoad {
                open: true,
                load: eps[k].outstanding() as u32,
                depth: DEPTH,
            }) else {
                break;
            };
            let token = r.token;
            if !eps[k].submit(slice(token)) {
                out.sq_full_turns += 1;
                break;
            }
            // Handed to its endpoint: the charge goes back (the engine
            // does so at the task's last slice).
            drop(held.pop_front());
            cursor = next_cursor(s.policy, k);
            on_rail += 1;
        }
        out.worker_held_max = out.worker_held_max.max(held.len());
        let now = monotonic_ns();
        let mut complete = |c: RdmaCompletion| {
            let (t, i) = (c.token >> 48, c.token & ((1 << 48) - 1));
            let idx = (t * per + i) as usize;
            match c.result {
                Ok(_) if !seen[idx] => {
                    seen[idx] = true;
                    out.ok += 1;
                }
                Ok(_) => out.duplicated += 1,
                Err(_) => out.failed += 1,
            }
            done[t as usize].fetch_add(1, Ordering::Release);
        };
        for ep in &mut eps {
            ep.polled_at(now);
            ep.flush(&mut complete);
            ep.reap(&mut complete);
        }
        // The balance a policy keeps, once every QP is up: while one is
        // still connecting (on the connector's thread, as slow as the
        // machine is busy) its requests wait whatever the policy, and how
        // many turns that lasts is the scheduler's, not the policy's.
        if eps.len() > 1
            && eps.iter().any(|e| e.outstanding() > 0)
            && eps.iter().all(Endpoint::is_connected)
        {
            turns += 1;
            stddev_sum += stddev(eps.iter().map(|e| e.outstanding() as f64));
        }
        if held.is_empty() && eps.iter().all(|e| e.outstanding() == 0) {
            std::thread::yield_now();
        }
    }
    out.depth_stddev = if turns == 0 {
        0.0
    } else {
        stddev_sum / turns as f64
    };
    out
}

fn report(args: &Args, part: &str, s: &Setup, o: &Outcome) {
    let lost = o.lost;
    let mwr = o.ok as f64 / o.secs / 1e6;
    if args.json {
        emit(&format!(
            "{{\"mode\":\"sq\",\"part\":\"{part}\",\"outstanding\":{},\"admission\":{},\"policy\":\"{}\",\"qps\":{},\"depth\":{DEPTH},\"slow_qp\":{},\"requests\":{},\"sq_full_errors\":{},\"sq_full_turns\":{},\"failed\":{},\"lost\":{lost},\"duplicated\":{},\"worker_held_max\":{},\"depth_stddev\":{:.2},\"admission_waits\":{},\"mwr_per_s\":{mwr:.3}}}",
            s.outstanding,
            s.admission,
            s.policy.as_str(),
            s.qps,
            s.slow_qp,
            s.requests,
            o.sq_full_errors,
            o.sq_full_turns,
            o.failed,
            o.duplicated,
            o.worker_held_max,
            o.depth_stddev,
            o.admission_waits,
        ));
    } else {
        emit(&format!(
            "sq {part:<6} outstanding {:>5} admission {:<3} policy {:<12} qps {} | sq_full_errors {:>4} full_turns {:>8} lost {lost} dup {} held_max {:>5} depth_stddev {:>7.2} waits {:>6} | {mwr:.2} M WR/s",
            s.outstanding,
            if s.admission { "on" } else { "off" },
            s.policy.as_str(),
            s.qps,
            o.sq_full_errors,
            o.sq_full_turns,
            o.duplicated,
            o.worker_held_max,
            o.depth_stddev,
            o.admission_waits,
        ));
    }
}

/// Part 3: ns per work request of the post path, one thread.
#[derive(Debug, Default, Clone, Copy)]
struct PostCost {
    off: f64,
    on: f64,
    raw: f64,
    /// One admission (admit + release) on its own.
    admit: f64,
}

const BATCH: usize = 32;

/// ns per request through an endpoint; with a `gate`, each batch is
/// admitted as one charge (as `Engine::submit` charges one call) and each
/// request's share goes back as it is handed to the endpoint.
fn endpoint_round(ep: &mut Endpoint, gate: Option<&AdmissionGate>, rounds: u64) -> f64 {
    let start = Instant::now();
    let mut token = 0;
    for _ in 0..rounds {
        let mut charge = gate.and_then(|g| {
            g.admit(
                SplitPolicy::Static,
                BATCH as u32,
                ADMISSION_TIMEOUT,
                Priority::High,
            )
            .ok()?
            .pop()
        });
        for _ in 0..BATCH {
            let share = charge.as_mut().map(|c| c.split(1));
            ep.submit(slice(token));
            drop(share);
            token += 1;
        }
        let mut got = 0;
        while got < BATCH {
            let mut count = |_c: RdmaCompletion| got += 1;
            ep.flush(&mut count);
            ep.reap(&mut count);
        }
    }
    start.elapsed().as_nanos() as f64 / (rounds * BATCH as u64) as f64
}

/// ns per admission of one request (admitted, released), one thread.
fn admission_round(gate: &AdmissionGate, rounds: u64) -> f64 {
    let start = Instant::now();
    for _ in 0..rounds {
        drop(gate.admit(SplitPolicy::Static, 1, ADMISSION_TIMEOUT, Priority::High));
    }
    start.elapsed().as_nanos() as f64 / rounds as f64
}

/// ns per request posting the same lists straight to a simulated QP.
fn raw_round(q: &mut tent::transport::rdma::Queue, rounds: u64) -> f64 {
    use tent::transport::rdma::sys::ffi::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wc};
    let mut sges = [ibv_sge::default(); BATCH];
    let mut wrs = [ibv_send_wr::default(); BATCH];
    let mut wcs = [ibv_wc::default(); 16];
    let start = Instant::now();
    for r in 0..rounds {
        // Written through one raw pointer per array (never a `&mut` to an
        // element after the links are made: that would invalidate them).
        let (w, g) = (wrs.as_mut_ptr(), sges.as_mut_ptr());
        for i in 0..BATCH {
            let last = i + 1 == BATCH;
            let wr = ibv_send_wr {
                wr_id: r * BATCH as u64 + i as u64,
                sg_list: g.wrapping_add(i),
                num_sge: 1,
                send_flags: if last {
                    ibv_send_flags::IBV_SEND_SIGNALED.0
                } else {
                    0
                },
                next: if last {
                    std::ptr::null_mut()
                } else {
                    w.wrapping_add(i + 1)
                },
                ..Default::default()
            };
            // SAFETY: `i < BATCH`, both arrays' length.
            unsafe {
                g.add(i).write(ibv_sge {
                    addr: 0x10_0000,
                    length: 4096,
                    lkey: 1,
                });
                w.add(i).write(wr);
            }
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: `w` heads a valid list of BATCH WRs into `sges`, both alive across the call; the simulated NIC touches no memory.
        let rc = unsafe { q.post_send(w, &mut bad) };
        assert_eq!(rc, 0, "simulated post_send");
        while q.poll_cq(&mut wcs[..16]) == 0 {}
    }
    start.elapsed().as_nanos() as f64 / (rounds * BATCH as u64) as f64
}

fn post_cost(connector: &Connector, rounds: u64, reps: usize) -> Result<PostCost, String> {
    let mut eps = endpoints(connector, 1, false, BATCH * 2);
    let mut ep = eps.pop().ok_or("sq: no endpoint")?;
    let gate = AdmissionGate::new(vec![ep.published_sq().clone()], 0, 0);
    // The endpoint's QP's rate: the floor pays the same polls.
    let mut raw = SimSource::new(DEPTH, FAST)
        .connect()
        .map_err(|e| e.to_string())?;
    // Warm up, then alternate and keep each one's best (least disturbed).
    endpoint_round(&mut ep, None, rounds / 10 + 1);
    let mut best = PostCost {
        off: f64::MAX,
        on: f64::MAX,
        raw: f64::MAX,
        admit: f64::MAX,
    };
    for _ in 0..reps {
        best.off = best.off.min(endpoint_round(&mut ep, None, rounds));
        best.on = best.on.min(endpoint_round(&mut ep, Some(&gate), rounds));
        best.raw = best.raw.min(raw_round(&mut raw, rounds));
        best.admit = best.admit.min(admission_round(&gate, rounds));
    }
    Ok(best)
}

/// `--mode sq`.
pub(crate) fn sq(args: &Args) -> Result<(), String> {
    let connector = Connector::start().map_err(|e| e.to_string())?;
    let requests = args.sq_requests.max(SUBMITTERS);
    let burst = [1024, 2048, 4096].into_iter().flat_map(|outstanding| {
        [false, true].map(|admission| Setup {
            outstanding,
            admission,
            policy: SplitPolicy::Static,
            qps: 1,
            slow_qp: false,
            requests,
        })
    });
    let policy = [
        SplitPolicy::Static,
        SplitPolicy::LeastLoaded,
        SplitPolicy::Capacity,
    ]
    .map(|policy| Setup {
        outstanding: 4096,
        admission: false,
        policy,
        qps: 4,
        slow_qp: true,
        requests,
    });
    let mut bad = Vec::new();
    for (part, s) in burst
        .map(|s| ("burst", s))
        .chain(policy.map(|s| ("policy", s)))
    {
        let o = run(&connector, s)?;
        report(args, part, &s, &o);
        if o.lost > 0 || o.failed > 0 || o.duplicated > 0 {
            bad.push(format!("{part} {s:?}: {o:?}"));
        }
    }
    let c = post_cost(&connector, 20_000, 5)?;
    if args.json {
        emit(&format!(
            "{{\"mode\":\"sq\",\"part\":\"post\",\"batch\":{BATCH},\"ns_per_wr_admission_off\":{:.1},\"ns_per_wr_admission_on\":{:.1},\"ns_per_wr_provider_only\":{:.1},\"ns_per_admission\":{:.1},\"on_over_off\":{:.3},\"endpoint_over_provider\":{:.3}}}",
            c.off,
            c.on,
            c.raw,
            c.admit,
            c.on / c.off,
            c.off / c.raw
        ));
    } else {
        emit(&format!(
            "sq post   batch {BATCH}: {:.1} ns/WR admission off, {:.1} on, one charge per batch ({:.3}x); provider alone {:.1} (endpoint {:.2}x); one admission alone {:.1} ns",
            c.off,
            c.on,
            c.on / c.off,
            c.raw,
            c.off / c.raw,
            c.admit
        ));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "sq: requests lost or duplicated: {}",
            bad.join("; ")
        ))
    }
}
