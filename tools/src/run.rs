//! The three roles: target, initiator, idle check.

use std::io::Read as _;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use tent::{Config, Engine, LocalAddr, RemoteAddr, SegmentId, op};

use crate::hist::Histogram;
use crate::{Args, OpArg, TransportArg, baseline, emit};

const SWEEP: [u64; 10] = [
    8,
    64,
    512,
    4 << 10,
    32 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];

fn engine_config(args: &Args, workers: usize, pin: bool) -> Result<Config, String> {
    let mut cfg = Config::load().map_err(|e| e.to_string())?;
    cfg.workers.count = workers as u32;
    cfg.workers.pin = pin;
    if !args.cores.is_empty() {
        cfg.workers.cores = args.cores.clone();
    }
    cfg.transports.shm.enable = args.transport == TransportArg::Shm;
    // An rdma initiator has no tcp to fall back on: what it measures is
    // RDMA alone.
    if args.transport == TransportArg::Rdma {
        cfg.transports.tcp.enable = false;
    }
    let depth = (args.batch * 2).max(64).next_power_of_two() as u32;
    cfg.ring_depth = cfg.ring_depth.max(depth);
    Ok(cfg)
}

pub fn target(args: &Args) -> Result<(), String> {
    let mut cfg = engine_config(args, 1, false)?;
    // A tcp or rdma target serves from anonymous memory (huge pages where
    // THP allows); any other exports its buffer over shm.
    cfg.transports.shm.enable = !matches!(args.transport, TransportArg::Tcp | TransportArg::Rdma);
    cfg.transports.tcp.enable = true;
    let engine = Engine::new(cfg).map_err(|e| e.to_string())?;
    let buf = engine
        .allocate_memory(args.buffer_size)
        .map_err(|e| e.to_string())?;
    // TENT's p2p naming: the control server's ip:port. An initiator on
    // this host fetches the descriptor there and maps the shm segment.
    let name = engine.segment_name();
    emit(&name);
    eprintln!(
        "tent-bench target: segment {name} (shm {}), pid {}, exporting {} bytes at {:#x}",
        engine.local_segment_name().unwrap_or("-"),
        std::process::id(),
        buf.len(),
        buf.addr()
    );
    if args.exit_on_stdin_eof {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    } else {
        loop {
            std::thread::park();
        }
    }
    Ok(())
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into a zeroed, valid rusage struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

pub fn idle(args: &Args) -> Result<(), String> {
    let engine =
        Engine::new(engine_config(args, args.threads, true)?).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_time();
    let dur = Duration::from_secs_f64(args.duration);
    std::thread::sleep(dur);
    let used = cpu_time() - before;
    let ms = used.as_secs_f64() * 1e3;
    if args.json {
        emit(&serde_json::json!({"idle_seconds": args.duration, "cpu_ms": ms, "workers": args.threads}).to_string());
    } else {
        emit(&format!(
            "idle: utime+stime grew {ms:.2} ms over {:.1} s with {} worker(s) on cores {:?}",
            args.duration,
            args.threads,
            engine.worker_cores()
        ));
    }
    Ok(())
}

struct Point {
    ops: u64,
    bytes: u64,
    /// Failed ops, warm-up included (never reset).
    errors: u64,
    /// Every op that completed, good or not, warm-up included.
    attempted: u64,
    first_error: Option<FirstError>,
    hist: Histogram,
    secs: f64,
}

/// The first op that failed: its kind, and whether failover gave up.
#[derive(Debug, Clone, Copy)]
pub struct FirstError {
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
    }
}

/// Every op a run completed, and how many of them failed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub attempted: u64,
    pub failed: u64,
    pub first_error: Option<FirstError>,
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

/// Run the points; the tally says how many ops failed (the caller turns
/// any failure into a non-zero exit).
pub fn initiator(
    args: &Args,
    target: Option<&str>,
    target_pid: Option<u32>,
) -> Result<Tally, String> {
    let sizes: Vec<u64> = args.block_size.map_or(SWEEP.to_vec(), |b| vec![b]);
    let max_block = *sizes.iter().max().expect("non-empty");
    let engine =
        Engine::new(engine_config(args, args.threads, true)?).map_err(|e| e.to_string())?;
    let per_thread = max_block * args.batch as u64;
    let (segment, remote_base) = match target {
        Some(name) => {
            let seg = engine.open_segment(name).map_err(|e| e.to_string())?;
            let regions = engine.segment_regions(seg).map_err(|e| e.to_string())?;
            let need = per_thread * args.threads as u64;
            let r = regions
                .iter()
                .find(|r| r.len >= need)
                .ok_or_else(|| format!("target {name} exports no region of {need} bytes"))?;
            (seg, r.addr)
        }
        None => {
            let dst = engine
                .allocate_memory(per_thread * args.threads as u64)
                .map_err(|e| e.to_string())?;
            // The engine's region table keeps the memory registered.
            (SegmentId::LOCAL, dst.addr())
        }
    };
    let sources: Vec<tent::Buffer> = (0..args.threads)
        .map(|_| engine.allocate_memory(per_thread))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    for s in &sources {
        // Touch the source so page faults are not part of the first point.
        s.write(0, &vec![0xa5; per_thread as usize])
            .map_err(|e| e.to_string())?;
    }

    // Worker cores come from the engine; app threads go on the other cores.
    std::thread::sleep(Duration::from_millis(50));
    let worker_cores = engine.worker_cores();
    let all: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    let free: Vec<usize> = all
        .iter()
        .copied()
        .filter(|c| !worker_cores.contains(&Some(*c)))
        .collect();
    let app_cores: Vec<Option<usize>> = (0..args.threads)
        .map(|i| {
            if free.is_empty() {
                None
            } else {
                Some(free[i % free.len()])
            }
        })
        .collect();

    let op_name = match args.op {
        OpArg::Read => "read",
        OpArg::Write => "write",
    };
    let transport = match args.transport {
        TransportArg::Local => "local",
        TransportArg::Tcp => "tcp",
        TransportArg::Rdma => "rdma",
        TransportArg::Shm => "shm",
    };
    if args.transport == TransportArg::Rdma && engine.rails(segment).is_empty() {
        return Err(format!(
            "no RDMA rail reaches {} (does the target have RDMA NICs?)",
            target.unwrap_or("the target")
        ));
    }
    if !args.json {
        emit(&format!(
            "# tent-bench: transport={transport} op={op_name} threads={} batch={} target={} target_pid={}",
            args.threads,
            args.batch,
            target.unwrap_or("(in-process)"),
            target_pid.map_or("(none: in-process)".to_owned(), |p| p.to_string())
        ));
        emit(&format!(
            "# workers on cores {worker_cores:?}; submitting threads on cores {app_cores:?}; {:.2} s per point",
            args.duration
        ));
        emit("BlkSize | Batch | Threads |     GB/s |     Mops |   p50 us |   p99 us |  p999 us");
    }
    // The cross-core floor drifts on a shared VM: measure it before and
    // after the points and compare against the faster of the two.
    let pp_before = (!args.no_baseline)
        .then(|| baseline::ping_pong(app_cores[0], worker_cores[0], Duration::from_millis(500)));
    let mut results = Vec::new();
    let mut tally = Tally::default();
    for (n, &size) in sizes.iter().enumerate() {
        if sizes.len() > 1 {
            eprintln!(
                "tent-bench: [{}/{}] block size {}",
                n + 1,
                sizes.len(),
                human(size)
            );
        }
        let p = run_point(
            args,
            &engine,
            &sources,
            segment,
            remote_base,
            size,
            &app_cores,
        )?;
        let gbps = p.bytes as f64 / p.secs / 1e9;
        let mops = p.ops as f64 / p.secs / 1e6;
        let q = |x: f64| p.hist.quantile(x) as f64 / 1e3;
        tally.attempted += p.attempted;
        tally.failed += p.errors;
        tally.first_error = tally.first_error.or(p.first_error);
        if let Some(first) = p.first_error {
            eprintln!(
                "tent-bench: {} of {} ops failed at block size {} (first error: {first})",
                p.errors,
                p.attempted,
                human(size),
            );
        }
        if args.json {
            emit(
                &serde_json::json!({
                    "transport": transport, "op": op_name, "block_size": size, "batch": args.batch,
                    "threads": args.threads, "gbps": gbps, "mops": mops,
                    "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999), "errors": p.errors,
                })
                .to_string(),
            );
        } else {
            emit(&format!(
                "{:>7} | {:>5} | {:>7} | {:>8.3} | {:>8.3} | {:>8.2} | {:>8.2} | {:>8.2}",
                human(size),
                args.batch,
                args.threads,
                gbps,
                mops,
                q(0.5),
                q(0.99),
                q(0.999)
            ));
        }
        results.push((size, gbps, q(0.5), q(0.99)));
    }
    for r in engine.rails(segment) {
        // Which rails carried the bytes (RDMA): the run's functional proof.
        if args.json {
            emit(&serde_json::json!({"rail_local": r.local, "rail_remote": r.remote, "bytes": r.bytes, "moved": r.moved, "up": r.up}).to_string());
            continue;
        }
        emit(&format!(
            "# rail {} -> {}: {} bytes, {} slices moved off, link {}",
            r.local,
            r.remote,
            r.bytes,
            r.moved,
            if r.up { "up" } else { "down" }
        ));
    }
    if !args.no_baseline {
        baselines(args, &results, app_cores[0], worker_cores[0], pp_before);
    }
    Ok(tally)
}

fn baselines(
    args: &Args,
    results: &[(u64, f64, f64, f64)],
    app: Option<usize>,
    worker: Option<usize>,
    pp_before: Option<Histogram>,
) {
    let dur = Duration::from_secs_f64((args.duration / 2.0).clamp(0.1, 2.0));
    if !args.json {
        emit("# baselines measured in this run");
    }
    if args.transport == TransportArg::Tcp {
        let conns = Config::load()
            .map(|c| c.transports.tcp.connections_per_peer as usize)
            .unwrap_or(4)
            * args.threads;
        for &(size, gbps, _, _) in results.iter().filter(|r| r.0 >= 4096) {
            let m = baseline::tcp_stream_gbps(size, conns, dur);
            if args.json {
                emit(&serde_json::json!({"baseline": "tcp_stream_loopback", "connections": conns, "block_size": size, "gbps": m, "tent_gbps": gbps, "ratio": gbps / m}).to_string());
            } else {
                emit(&format!(
                    "# raw TCP stream, {conns} connections, {:>7} writes: {:>8.3} GB/s   tent/stream = {:.2}x",
                    human(size),
                    m,
                    gbps / m
                ));
            }
        }
        return;
    }
    for &(size, gbps, _, _) in results.iter().filter(|r| r.0 >= 4096) {
        let m = baseline::memcpy_gbps(size, dur);
        if args.json {
            emit(&serde_json::json!({"baseline": "memcpy_1thread", "block_size": size, "gbps": m, "tent_gbps": gbps, "ratio": gbps / m}).to_string());
        } else {
            emit(&format!(
                "# memcpy 1 thread {:>7}: {:>8.3} GB/s   tent/memcpy = {:.2}x",
                human(size),
                m,
                gbps / m
            ));
        }
    }
    let after = baseline::ping_pong(app, worker, dur);
    let q = |h: &Histogram, x: f64| h.quantile(x) as f64 / 1e3;
    let before = pp_before.unwrap_or_else(|| baseline::ping_pong(app, worker, dur));
    let pp = if q(&before, 0.5) <= q(&after, 0.5) {
        &before
    } else {
        &after
    };
    let (p50, p99) = (q(pp, 0.5), q(pp, 0.99));
    if args.json {
        emit(
            &serde_json::json!({"baseline": "ping_pong_round_trip", "cores": [app, worker],
                "p50_us": p50, "p99_us": p99,
                "p50_before_us": q(&before, 0.5), "p50_after_us": q(&after, 0.5)})
            .to_string(),
        );
    } else {
        emit(&format!(
            "# cross-core ping-pong round trip (cores {app:?} <-> {worker:?}): p50 {:.3} us before the points, {:.3} us after; using the faster: p50 {p50:.3} us, p99 {p99:.3} us",
            q(&before, 0.5),
            q(&after, 0.5)
        ));
    }
    if let Some(&(size, _, t50, t99)) = results.iter().find(|r| r.0 <= 64) {
        if args.json {
            emit(&serde_json::json!({"baseline": "latency_ratio", "block_size": size, "p50_ratio": t50 / p50, "p99_ratio": t99 / p99}).to_string());
        } else {
            emit(&format!(
                "# {} submit->CQE vs ping-pong: p50 {:.2}x, p99 {:.2}x",
                human(size),
                t50 / p50,
                t99 / p99
            ));
        }
    }
}

fn run_point(
    args: &Args,
    engine: &Engine,
    sources: &[tent::Buffer],
    segment: SegmentId,
    remote_base: u64,
    size: u64,
    app_cores: &[Option<usize>],
) -> Result<Point, String> {
    let total = Duration::from_secs_f64(args.duration);
    let warmup = Duration::from_secs_f64((args.duration / 5.0).min(0.2));
    let barrier = Barrier::new(args.threads);
    let per_thread = size * args.batch as u64;
    let points: Vec<Result<Point, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let barrier = &barrier;
                let src = &sources[t];
                let core = app_cores[t];
                s.spawn(move || -> Result<Point, String> {
                    if let Some(c) = core {
                        core_affinity::set_for_current(core_affinity::CoreId { id: c });
                    }
                    let mut ring = engine.ring().map_err(|e| e.to_string())?;
                    let remote = remote_base + t as u64 * per_thread;
                    let mut p = Point {
                        ops: 0,
                        bytes: 0,
                        errors: 0,
                        attempted: 0,
                        first_error: None,
                        hist: Histogram::new(),
                        secs: 0.0,
                    };
                    barrier.wait();
                    let start = Instant::now();
                    let mut measure_from = None;
                    loop {
                        // One clock read serves both the loop's end test and
                        // the op's start: the ping-pong baseline also reads
                        // the clock twice per round trip.
                        let t0 = Instant::now();
                        let now = t0;
                        let elapsed = now - start;
                        if elapsed >= warmup + total {
                            break;
                        }
                        if measure_from.is_none() && elapsed >= warmup {
                            measure_from = Some(now);
                            p = Point {
                                hist: Histogram::new(),
                                ..p
                            };
                            p.ops = 0;
                            p.bytes = 0;
                        }
                        {
                            let mut sq = ring.submission();
                            for b in 0..args.batch as u64 {
                                let local = LocalAddr::new(src.id(), b * size);
                                let rem = RemoteAddr::new(segment, remote + b * size);
                                let sqe = match args.op {
                                    OpArg::Write => {
                                        op::Write::new(local, rem, size).user_data(b).build()
                                    }
                                    OpArg::Read => {
                                        op::Read::new(local, rem, size).user_data(b).build()
                                    }
                                };
                                sq.push(sqe)
                                    .map_err(|_| "submission ring full".to_string())?;
                            }
                        }
                        let mut got = 0;
                        while got < args.batch {
                            // Spins briefly, then sleeps until the worker
                            // posts a CQE: a large transfer's bytes need
                            // the CPU more than this thread does.
                            let left = Duration::from_secs(60).saturating_sub(t0.elapsed());
                            ring.wait_ready(left)
                                .map_err(|e| format!("waiting for completions: {e}"))?;
                            for cqe in ring.completion() {
                                got += 1;
                                p.attempted += 1;
                                let lat = t0.elapsed().as_nanos() as u64;
                                match cqe.result() {
                                    Ok(n) => {
                                        p.ops += 1;
                                        p.bytes += n;
                                        p.hist.record(lat);
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
                    }
                    p.secs = measure_from.map_or(1e-9, |m| m.elapsed().as_secs_f64());
                    Ok(p)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let mut all = Point {
        ops: 0,
        bytes: 0,
        errors: 0,
        attempted: 0,
        first_error: None,
        hist: Histogram::new(),
        secs: 0.0,
    };
    for p in points {
        let p = p?;
        all.ops += p.ops;
        all.bytes += p.bytes;
        all.errors += p.errors;
        all.attempted += p.attempted;
        all.first_error = all.first_error.or(p.first_error);
        all.hist.merge(&p.hist);
        all.secs = all.secs.max(p.secs);
    }
    Ok(all)
}
