//! One measurement point: ops of one block size kept in flight for warm-up
//! plus `--duration`, counted only when submitted inside the measured
//! window. The window runs on past `--duration` until one of its ops has
//! completed (bounded by `--max-seconds`), so a figure is never divided by
//! an empty window.

use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use tent::{Engine, LocalAddr, RemoteAddr, SegmentId, op};

use crate::hist::Histogram;
use crate::{Args, OpArg, emit};

/// Warm-up before the window: a fifth of `--duration`, at most 0.2 s.
pub(crate) fn warmup(duration: f64) -> f64 {
    (duration / 5.0).min(0.2)
}

/// The first op that failed: its kind, and whether failover gave up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstError {
    pub kind: tent::ErrorKind,
    pub exhausted: bool,
    pub transport: tent::TransportKind,
}

impl std::fmt::Display for FirstError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (on {})",
            self.kind,
            describe(self.kind),
            self.transport
        )?;
        if self.exhausted {
            f.write_str("; Failover limit exceeded, all transports exhausted")?;
        }
        Ok(())
    }
}

/// What an error kind means, in words (a CQE carries only the kind).
fn describe(kind: tent::ErrorKind) -> &'static str {
    use tent::ErrorKind as K;
    match kind {
        K::Unreachable => "the peer cannot be reached (connection refused, or no usable path)",
        K::LocalNicFailed => "a local NIC failed",
        K::LocalNicReboot => "a local NIC is restarting",
        K::RemoteNicFailed => "the peer's NIC failed",
        K::RemoteNicReboot => "the peer's NIC is restarting",
        K::RouteLost => {
            "the route to the peer was lost (link down, host or network unreachable, user timeout)"
        }
        K::ProcessFailed => "the peer process is gone (crashed, killed, or closed the connection)",
        K::Timeout => "the request passed its deadline",
        K::SqFull => "the send queue stayed full",
        K::InvalidArgument => "the request is malformed",
        K::OutOfMemory => "out of memory or another resource",
        K::SegmentNotFound => "the segment is not open",
        K::AddressNotRegistered => "the address is not in registered memory",
        K::OutOfBounds => "the range runs past its region",
        K::AccessDenied => "the peer refused access to the range",
        K::Canceled => "the request was canceled",
        K::Shutdown => "the engine shut down",
        // A kind newer than this tool: its name says what it is.
        _ => "see the error kind's name",
    }
}

/// What one point measured (summed over its threads).
pub(crate) struct Point {
    /// Ops submitted inside the window that succeeded, and their bytes.
    pub ops: u64,
    pub bytes: u64,
    /// Failed ops, warm-up included.
    pub errors: u64,
    /// Every op that completed, good or not, warm-up included.
    pub attempted: u64,
    pub first_error: Option<FirstError>,
    /// Submit -> CQE of the window's good ops.
    pub hist: Histogram,
    /// From the window's first submit to its last completion; 0 when no op
    /// of the window completed.
    pub secs: f64,
    /// Ops still in flight when `--max-seconds` ran out.
    pub stuck: u64,
    /// With `--interval-ms`: bytes of good ops by completion time, one
    /// entry per interval from the point's start (warm-up included).
    pub intervals: Vec<u64>,
    /// From the point's start to the last thread's end.
    pub run_secs: f64,
}

impl Point {
    fn empty() -> Point {
        Point {
            ops: 0,
            bytes: 0,
            errors: 0,
            attempted: 0,
            first_error: None,
            hist: Histogram::new(),
            secs: 0.0,
            stuck: 0,
            intervals: Vec::new(),
            run_secs: 0.0,
        }
    }

    /// GB/s over the window; `None` when no op of the window succeeded.
    pub(crate) fn gbps(&self) -> Option<f64> {
        self.per_sec(self.bytes).map(|b| b / 1e9)
    }

    /// Million ops a second over the window; `None` as for [`Point::gbps`].
    pub(crate) fn mops(&self) -> Option<f64> {
        self.per_sec(self.ops).map(|n| n / 1e6)
    }

    fn per_sec(&self, n: u64) -> Option<f64> {
        (self.ops > 0 && self.secs > 0.0).then(|| n as f64 / self.secs)
    }

    /// Latency quantile in µs; `None` when no op of the window succeeded.
    pub(crate) fn latency_us(&self, q: f64) -> Option<f64> {
        (self.ops > 0).then(|| self.hist.quantile(q) as f64 / 1e3)
    }

    /// `(end of the interval in ms from the point's start, GB/s)` for each
    /// whole `interval_ms` of the run (the partial last one is left out).
    pub(crate) fn series(&self, interval_ms: u64) -> impl Iterator<Item = (u64, f64)> + '_ {
        let whole = (self.run_secs * 1e3 / interval_ms as f64) as usize;
        (0..whole).map(move |i| {
            let bytes = self.intervals.get(i).copied().unwrap_or(0);
            let t_ms = (i as u64 + 1) * interval_ms;
            (t_ms, bytes as f64 / (interval_ms as f64 * 1e6))
        })
    }

    fn merge(&mut self, p: Point) {
        self.ops += p.ops;
        self.bytes += p.bytes;
        self.errors += p.errors;
        self.attempted += p.attempted;
        self.first_error = self.first_error.or(p.first_error);
        self.hist.merge(&p.hist);
        self.secs = self.secs.max(p.secs);
        self.stuck += p.stuck;
        if self.intervals.len() < p.intervals.len() {
            self.intervals.resize(p.intervals.len(), 0);
        }
        for (a, b) in self.intervals.iter_mut().zip(&p.intervals) {
            *a += b;
        }
        self.run_secs = self.run_secs.max(p.run_secs);
    }
}

/// Where a point's ops go: the engine, one source buffer per thread, each
/// peer's segment and region base (see [`run_thread`] for the layout) and
/// the cores the submitting threads run on.
pub(crate) struct Rig<'a> {
    pub engine: &'a Engine,
    pub sources: &'a [tent::Buffer],
    pub peers: &'a [(SegmentId, u64)],
    pub app_cores: &'a [Option<usize>],
}

/// Run one point of `size`-byte ops on `args.threads` threads.
pub(crate) fn run_point(args: &Args, rig: &Rig<'_>, size: u64) -> Result<Point, String> {
    let barrier = Barrier::new(args.threads);
    // One origin for every thread, so their interval series add up.
    let origin = OnceLock::new();
    let points: Vec<Result<Point, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let (barrier, origin) = (&barrier, &origin);
                s.spawn(move || {
                    if let Some(c) = rig.app_cores[t] {
                        core_affinity::set_for_current(core_affinity::CoreId { id: c });
                    }
                    let mut ring = rig.engine.ring().map_err(|e| e.to_string())?;
                    let leader = barrier.wait().is_leader();
                    let start = *origin.get_or_init(Instant::now);
                    if leader && args.json {
                        if let Some(ms) = args.interval_ms {
                            // Live, so a driver can time an action (a
                            // `tc change`) against the series' origin.
                            emit(
                                &serde_json::json!({"event": "start", "block_size": size,
                                "warmup_ms": warmup(args.duration) * 1e3, "interval_ms": ms})
                                .to_string(),
                            );
                        }
                    }
                    run_thread(args, rig, &mut ring, t, size, start)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let mut all = Point::empty();
    for p in points {
        all.merge(p?);
    }
    Ok(all)
}

/// One thread's ops: `--batch` in flight, each slot resubmitted as soon as
/// its op completes; with `--lockstep`, `--batch` ops submitted together
/// and the next batch once all of them completed.
///
/// Slot b of thread t always goes to the same place: peer b % N (of N),
/// block t * k + b / N of that peer's region, k = ceil(batch / N) being
/// the slots one thread has on one peer. With one peer, thread t's slots
/// lie back to back from `base + t * block * batch`.
fn run_thread(
    args: &Args,
    rig: &Rig<'_>,
    ring: &mut tent::Ring,
    thread: usize,
    size: u64,
    start: Instant,
) -> Result<Point, String> {
    let warmup = Duration::from_secs_f64(warmup(args.duration));
    let end = warmup + Duration::from_secs_f64(args.duration);
    let cap = Duration::from_secs_f64(args.max_seconds);
    let interval = args.interval_ms.map(|ms| u128::from(ms) * 1_000_000);
    let src = &rig.sources[thread];
    let n = rig.peers.len();
    let per_peer = args.batch.div_ceil(n);
    // Each slot's segment and remote address, fixed for the point.
    let dest: Vec<(SegmentId, u64)> = (0..args.batch)
        .map(|b| {
            let (segment, base) = rig.peers[b % n];
            let block = thread * per_peer + b / n;
            (segment, base + block as u64 * size)
        })
        .collect();
    let mut p = Point::empty();
    // When each slot's op was submitted; `None`: the slot is free.
    let mut sent: Vec<Option<Instant>> = vec![None; args.batch];
    let mut in_flight = 0usize;
    let mut window: Option<Instant> = None;
    // Ops of the window that completed (good or not), and the last one's time.
    let mut window_done = 0u64;
    let mut last_done = None;
    // One clock read per pass: the time CQEs were reaped is also when the
    // slots they free are submitted again (the next pass starts at once).
    let mut now = Instant::now();
    loop {
        let elapsed = now - start;
        let ended = elapsed >= cap || (elapsed >= end && window_done > 0);
        if ended && in_flight == 0 {
            break;
        }
        if !ended && (!args.lockstep || in_flight == 0) && in_flight < args.batch {
            if window.is_none() && elapsed >= warmup {
                window = Some(now);
            }
            let mut sq = ring.submission();
            for (b, (slot, &(segment, remote))) in sent
                .iter_mut()
                .zip(&dest)
                .enumerate()
                .filter(|(_, (s, _))| s.is_none())
            {
                let (local, rem) = (
                    LocalAddr::new(src.id(), b as u64 * size),
                    RemoteAddr::new(segment, remote),
                );
                let sqe = match args.op {
                    OpArg::Write => op::Write::new(local, rem, size).user_data(b as u64).build(),
                    OpArg::Read => op::Read::new(local, rem, size).user_data(b as u64).build(),
                };
                sq.push(sqe)
                    .map_err(|_| "submission ring full".to_string())?;
                *slot = Some(now);
                in_flight += 1;
            }
        }
        // Spins briefly, then sleeps until the worker posts a CQE: a large
        // transfer's bytes need the CPU more than this thread does.
        let left = (start + cap).saturating_duration_since(now);
        match ring.wait_ready(left) {
            Ok(()) => {}
            Err(e) if e.kind() == tent::ErrorKind::Timeout => {
                p.stuck = in_flight as u64;
                break;
            }
            Err(e) => return Err(format!("waiting for completions: {e}")),
        }
        // One clock read per reaped batch: the CQEs it holds were all
        // there when the wait returned, so they share its timestamp.
        let done = Instant::now();
        now = done;
        for cqe in ring.completion() {
            let sent_at = usize::try_from(cqe.user_data())
                .ok()
                .and_then(|b| sent.get_mut(b))
                .and_then(Option::take)
                .ok_or_else(|| {
                    format!(
                        "a completion for no op in flight (user_data {})",
                        cqe.user_data()
                    )
                })?;
            in_flight -= 1;
            p.attempted += 1;
            let counted = window.is_some_and(|w| sent_at >= w);
            if counted {
                window_done += 1;
                last_done = Some(done);
            }
            match cqe.result() {
                Ok(n) => {
                    if let Some(iv) = interval {
                        let i = usize::try_from((done - start).as_nanos() / iv)
                            .map_err(|_| "interval index past usize".to_string())?;
                        if p.intervals.len() <= i {
                            p.intervals.resize(i + 1, 0);
                        }
                        p.intervals[i] += n;
                    }
                    if counted {
                        p.ops += 1;
                        p.bytes += n;
                        p.hist.record((done - sent_at).as_nanos() as u64);
                    }
                }
                Err(kind) => {
                    p.errors += 1;
                    p.first_error.get_or_insert(FirstError {
                        kind,
                        exhausted: cqe.failover_exhausted(),
                        transport: cqe.transport(),
                    });
                }
            }
        }
    }
    p.run_secs = start.elapsed().as_secs_f64();
    p.secs = match (window, last_done) {
        (Some(w), Some(d)) => (d - w).as_secs_f64(),
        _ => 0.0,
    };
    Ok(p)
}
