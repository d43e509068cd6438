//! The three roles: target, initiator, idle check.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use tent::{Config, Engine, SegmentId};

use crate::hist::Histogram;
use crate::point::{self, FirstError, Point, Rig};
use crate::{Args, OpArg, TransportArg, baseline, emit};

/// Largest footprint (one side) the footprint memcpy baseline copies over:
/// past it, L2 and L3 hold neither, and the one-block baseline tells as
/// much.
const FOOTPRINT_BASELINE_MAX: usize = 64 << 20;

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

/// The target's configuration: what `TENT_CONF` and the variables say,
/// with the target's own choices on top.
fn target_config(args: &Args) -> Result<Config, String> {
    let mut cfg = engine_config(args, 1, false)?;
    // A target serves memory of its own: never a daemon's client.
    cfg.daemon_socket.clear();
    // A tcp or rdma target serves from anonymous memory (huge pages where
    // THP allows); any other exports its buffer over shm.
    cfg.transports.shm.enable = !matches!(args.transport, TransportArg::Tcp | TransportArg::Rdma);
    cfg.transports.tcp.enable = true;
    if let Some(name) = &args.segment_name {
        cfg.metadata_segment_name = name.clone();
    }
    Ok(cfg)
}

/// Set by SIGHUP: the target reloads its configuration.
static HANGUP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_hangup(_: libc::c_int) {
    HANGUP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// On SIGHUP, read the configuration again (`TENT_CONF`, the variables)
/// and apply it with `Engine::reload`; say on stderr what happened.
fn reload_on_hangup(engine: &Engine, args: &Args, done: &std::sync::atomic::AtomicBool) {
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if !HANGUP.swap(false, std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        let line =
            match target_config(args).and_then(|c| engine.reload(c).map_err(|e| e.to_string())) {
                Ok(generation) => {
                    format!("tent-bench target: configuration reloaded (generation {generation})\n")
                }
                Err(e) => format!("tent-bench target: reload refused: {e}\n"),
            };
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

pub(crate) fn target(args: &Args) -> Result<(), String> {
    // Before anything else: a SIGHUP from the start on is a reload, never
    // the default death.
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGHUP, on_hangup as *const () as libc::sighandler_t) };
    let cfg = target_config(args)?;
    let engine = Engine::new(cfg).map_err(|e| e.to_string())?;
    let buf = engine
        .allocate_memory(args.buffer_size)
        .map_err(|e| e.to_string())?;
    // TENT's p2p naming: the control server's ip:port. An initiator on
    // this host fetches the descriptor there and maps the shm segment.
    let name = engine.segment_name();
    emit(&name);
    // The second line: where to scrape it.
    match engine.http_url() {
        Some(url) => emit(&format!("metrics: {url}/metrics")),
        None => emit("metrics: off"),
    }
    // One write, so the lines of targets started together (--peers) do
    // not interleave.
    let line = format!(
        "tent-bench target: segment {name} (shm {}), pid {}, exporting {} bytes at {:#x}\n",
        engine.local_segment_name().unwrap_or("-"),
        std::process::id(),
        buf.len(),
        buf.addr()
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
    let (engine, done) = (&engine, std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| reload_on_hangup(engine, args, &done));
        wait_for_the_end(args);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    Ok(())
}

/// Until stdin closes (`--exit-on-stdin-eof`), or for ever.
fn wait_for_the_end(args: &Args) {
    if args.exit_on_stdin_eof {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    } else {
        loop {
            std::thread::park();
        }
    }
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

pub(crate) fn idle(args: &Args) -> Result<(), String> {
    let engine = crate::engine(args, engine_config(args, args.threads, true)?)?;
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

/// `--mode topology`: build an engine as the configuration says (workers
/// pinned or not as `workers/pin` has it) and print its topology report;
/// with `--target`, the rails it would form to that peer.
pub(crate) fn topology(args: &Args) -> Result<(), String> {
    let pin = Config::load().map_err(|e| e.to_string())?.workers.pin;
    let engine = crate::engine(args, engine_config(args, args.threads, pin)?)?;
    // Workers pin themselves as they start: give them a moment, so the
    // report shows where they run rather than "not started yet".
    let started = std::time::Instant::now();
    while pin
        && engine.worker_cores().iter().any(Option::is_none)
        && started.elapsed() < Duration::from_secs(1)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut report = engine.topology_report();
    if let Some(target) = &args.target {
        let rails = engine
            .planned_rails(target, Duration::from_secs(10))
            .map_err(|e| format!("--target {target}: {e}"))?;
        report.rails_to = Some(rails);
    }
    if args.json {
        emit(&serde_json::to_string(&report).map_err(|e| e.to_string())?);
    } else {
        let mut o = std::io::stdout().lock();
        write!(o, "{report}").map_err(|e| e.to_string())?;
        o.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Every op a run completed, how many of them failed, and how many
/// points measured nothing (no op of their window succeeded).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    pub attempted: u64,
    pub failed: u64,
    pub first_error: Option<FirstError>,
    pub empty: u64,
}

fn human(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

/// Run the points against `targets` (none: in-process, over local) with
/// process ids `target_pids` (none when not spawned here); the tally says
/// how many ops failed (the caller turns any failure into a non-zero
/// exit).
pub(crate) fn initiator(
    args: &Args,
    targets: &[String],
    target_pids: &[u32],
) -> Result<Tally, String> {
    let points = sweep_points(args);
    if args.attach.is_some() && targets.is_empty() {
        return Err(
            "--attach needs a target of its own (--transport shm or tcp): a client of a daemon may not name the daemon's own segment"
                .into(),
        );
    }
    let engine = crate::engine(args, engine_config(args, args.threads, true)?)?;
    let _scraper = Scraper::start(&engine, args.scrape_hz)?;
    // One thread's footprint: the largest block times its ops in flight.
    let per_thread = points
        .iter()
        .map(|&(size, batch)| size * batch as u64)
        .max()
        .expect("non-empty");
    // Each peer's segment and the base of its region: a peer receives
    // ceil(batch / peers) slots of every thread (point::run_thread).
    let peers: Vec<(SegmentId, u64)> = if targets.is_empty() {
        let dst = engine
            .allocate_memory(per_thread * args.threads as u64)
            .map_err(|e| e.to_string())?;
        // The engine's region table keeps the memory registered.
        vec![(SegmentId::LOCAL, dst.addr())]
    } else {
        let need = points
            .iter()
            .map(|&(size, batch)| size * batch.div_ceil(targets.len()) as u64)
            .max()
            .expect("non-empty")
            * args.threads as u64;
        targets
            .iter()
            .map(|name| {
                let seg = engine.open_segment(name).map_err(|e| e.to_string())?;
                let regions = engine.segment_regions(seg).map_err(|e| e.to_string())?;
                let r = regions
                    .iter()
                    .find(|r| r.len >= need)
                    .ok_or_else(|| format!("target {name} exports no region of {need} bytes"))?;
                Ok((seg, r.addr))
            })
            .collect::<Result<_, String>>()?
    };
    let segments: Vec<SegmentId> = peers.iter().map(|p| p.0).collect();
    let sources: Vec<tent::Buffer> = (0..args.threads)
        .map(|_| engine.allocate_memory(per_thread))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let chunk = vec![0xa5; per_thread.min(1 << 20) as usize];
    for s in &sources {
        // Touch the source so page faults are not part of the first point.
        let mut at = 0;
        while at < per_thread {
            let n = (per_thread - at).min(chunk.len() as u64) as usize;
            s.write(at, &chunk[..n]).map_err(|e| e.to_string())?;
            at += n as u64;
        }
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
    if args.transport == TransportArg::Rdma {
        if let Some(i) = segments.iter().position(|&s| engine.rails(s).is_empty()) {
            return Err(format!(
                "no RDMA rail reaches {} (does the target have RDMA NICs?)",
                targets.get(i).map_or("the target", String::as_str)
            ));
        }
    }
    if !args.json {
        // The peer count only when there are several (the single-peer
        // header is as it was).
        let peer_count = if peers.len() > 1 {
            format!(" peers={}", peers.len())
        } else {
            String::new()
        };
        let pids: Vec<String> = target_pids.iter().map(u32::to_string).collect();
        emit(&format!(
            "# tent-bench: transport={transport} op={op_name} threads={} batch={}{peer_count} target={} target_pid={}",
            args.threads,
            if args.both_ways {
                "1 and up to 32 (each size both ways)".to_owned()
            } else {
                args.batch.to_string()
            },
            if targets.is_empty() {
                "(in-process)".to_owned()
            } else {
                targets.join(",")
            },
            if pids.is_empty() {
                "(none: in-process)".to_owned()
            } else {
                pids.join(",")
            }
        ));
        emit(&format!(
            "# workers on cores {worker_cores:?}; submitting threads on cores {app_cores:?}; {:.2} s per point",
            args.duration
        ));
        emit("BlkSize | Batch | Threads |     GB/s |     Mops |   p50 us |   p99 us |  p999 us");
    }
    // The cross-core floor drifts on a shared VM: measure it before and
    // after the points and compare against the faster of the two.
    let pp_before = (!args.no_baseline).then(|| {
        baseline::ping_pong(
            app_cores[0],
            worker_cores.first().copied().flatten(),
            Duration::from_millis(500),
        )
    });
    let mut results = Vec::new();
    let mut tally = Tally::default();
    let rig = Rig {
        engine: &engine,
        sources: &sources,
        peers: &peers,
        app_cores: &app_cores,
    };
    for (n, &(size, batch)) in points.iter().enumerate() {
        if points.len() > 1 {
            eprintln!(
                "tent-bench: [{}/{}] block size {}, {batch} in flight",
                n + 1,
                points.len(),
                human(size)
            );
        }
        let point_args = Args {
            batch,
            ..args.clone()
        };
        let args = &point_args;
        let p = point::run_point(args, &rig, size)?;
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
        let empty = p.gbps().is_none().then(|| empty_point(args, &p));
        if let Some(why) = &empty {
            tally.empty += 1;
            eprintln!("tent-bench: block size {}: {why}", human(size));
        }
        if let Some(ms) = args.interval_ms {
            report_series(args, &p, ms);
        }
        let q = |x: f64| p.latency_us(x);
        if args.json {
            let mut line = serde_json::json!({
                "transport": transport, "op": op_name, "block_size": size, "batch": args.batch,
                "threads": args.threads, "lockstep": args.lockstep, "gbps": p.gbps(), "mops": p.mops(),
                "p50_us": q(0.5), "p99_us": q(0.99), "p999_us": q(0.999), "errors": p.errors,
                "ops": p.ops, "bytes": p.bytes, "secs": p.secs, "in_flight_at_cap": p.stuck,
                "error": empty,
            });
            // Only when there are several, as in the text header.
            if peers.len() > 1 {
                line["peers"] = peers.len().into();
            }
            emit(&line.to_string());
        } else if let (Some(gbps), Some(mops)) = (p.gbps(), p.mops()) {
            let q = |x: f64| q(x).unwrap_or(f64::NAN);
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
        } else {
            emit(&format!(
                "{:>7} | {:>5} | {:>7} | {}",
                human(size),
                args.batch,
                args.threads,
                empty.as_deref().unwrap_or("no figure")
            ));
        }
        results.push((size, args.batch, p.gbps(), q(0.5), q(0.99), p.mops()));
    }
    rail_report(args, &engine, &segments);
    if !args.no_baseline {
        baselines(
            args,
            &results,
            app_cores[0],
            worker_cores.first().copied().flatten(),
            pp_before,
        );
    }
    Ok(tally)
}

/// Why a point has no figure, in words.
fn empty_point(args: &Args, p: &Point) -> String {
    if p.stuck > 0 {
        format!(
            "no op completed within --max-seconds {} ({} still in flight)",
            args.max_seconds, p.stuck
        )
    } else if p.errors > 0 {
        "no op succeeded (every op of the window failed)".to_owned()
    } else {
        format!("no op completed within --max-seconds {}", args.max_seconds)
    }
}

/// The point's throughput per `--interval-ms`, whole intervals only, from
/// the point's start (warm-up included): one JSON line each, or a compact
/// comment line in text mode.
fn report_series(args: &Args, p: &Point, interval_ms: u64) {
    let series: Vec<(u64, f64)> = p.series(interval_ms).collect();
    if args.json {
        for (t_ms, gbps) in series {
            emit(&serde_json::json!({"t_ms": t_ms, "gbps": gbps}).to_string());
        }
        return;
    }
    let row: Vec<String> = series.iter().map(|(_, g)| format!("{g:.3}")).collect();
    emit(&format!(
        "# GB/s per {interval_ms} ms from the start (warm-up {:.0} ms): {}",
        point::warmup(args.duration) * 1e3,
        row.join(" ")
    ));
}

/// The end-of-run per-rail report: which rails carried the bytes (for RDMA,
/// the run's functional proof), every peer's in turn. The `=== Device
/// Traffic Statistics ===` block, from `Engine::traffic_stats()`, is
/// printed here once the engine has it.
fn rail_report(args: &Args, engine: &Engine, segments: &[SegmentId]) {
    let by_peer: Vec<_> = segments.iter().map(|&s| engine.rails(s)).collect();
    for r in by_peer.iter().flatten() {
        if args.json {
            emit(&serde_json::json!({"rail_local": r.local, "rail_remote": r.remote, "bytes": r.bytes, "moved": r.moved, "up": r.up, "ewma_bps": r.bandwidth, "theoretical_bps": r.theoretical, "inflight_bytes": r.inflight_bytes, "tier": r.tier, "state": r.state.name()}).to_string());
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
    // A multi-rail run ends with seed 003's traffic statistics (on stderr
    // under --json, so the JSON lines stay machine-readable); several
    // peers of one rail each are not that.
    if by_peer.iter().any(|rails| rails.len() > 1) {
        let stats = engine.traffic_stats().to_string();
        if args.json {
            eprint!("{stats}");
        } else {
            for line in stats.lines() {
                emit(line);
            }
        }
    }
}

/// `a / b` when both are known and `b` is not zero.
fn ratio(a: Option<f64>, b: f64) -> Option<f64> {
    a.filter(|_| b > 0.0).map(|a| a / b)
}

/// `ratio` in text: two decimals and an x, or n/a.
fn show(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}x"))
}

/// (block size, GB/s, p50 µs, p99 µs, M ops/s) of a point.
/// A point's figures: block size, ops in flight, GB/s, p50 and p99 µs,
/// M ops/s.
type Measured = (
    u64,
    usize,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// Bytes in flight per thread the both-ways sweep aims at for its
/// throughput rows.
const SWEEP_IN_FLIGHT_BYTES: u64 = 256 << 20;

/// Ops in flight for a throughput row of `size`: 32, fewer for large
/// blocks (at most `SWEEP_IN_FLIGHT_BYTES` in flight over all
/// `threads`), at least 1.
pub(crate) fn in_flight_for(size: u64, threads: usize) -> usize {
    (SWEEP_IN_FLIGHT_BYTES / threads.max(1) as u64 / size.max(1)).clamp(1, 32) as usize
}

/// The points to run, `(block size, ops in flight)`: `--block-size` at
/// `--batch`; the sweep at `--batch`; or, with neither given
/// (`Args::both_ways`), each size of the sweep at one op in flight
/// (latency) and at `in_flight_for` (throughput) where that is more.
pub(crate) fn sweep_points(args: &Args) -> Vec<(u64, usize)> {
    let sizes: Vec<u64> = args.block_size.map_or(SWEEP.to_vec(), |b| vec![b]);
    let mut points = Vec::new();
    for size in sizes {
        if args.both_ways {
            points.push((size, 1));
            let n = in_flight_for(size, args.threads);
            if n > 1 {
                points.push((size, n));
            }
        } else {
            points.push((size, args.batch));
        }
    }
    points
}

/// A spawned target's bytes for the sweep's points (one peer receives
/// `ceil(batch / peers)` slots of every thread).
pub(crate) fn sweep_need(args: &Args) -> u64 {
    sweep_points(args)
        .iter()
        .map(|&(size, batch)| size * batch.div_ceil(args.peers.max(1)) as u64)
        .max()
        .unwrap_or(0)
        * args.threads as u64
}

fn baselines(
    args: &Args,
    results: &[Measured],
    app: Option<usize>,
    worker: Option<usize>,
    pp_before: Option<Histogram>,
) {
    let dur = Duration::from_secs_f64((args.duration / 2.0).clamp(0.1, 2.0));
    // Each baseline is one JSON line, or one comment line in text mode.
    let line = |json: serde_json::Value, text: String| {
        emit(&if args.json { json.to_string() } else { text });
    };
    if !args.json {
        emit("# baselines measured in this run");
    }
    if args.transport == TransportArg::Tcp {
        let conns = Config::load()
            .map(|c| c.transports.tcp.connections_per_peer as usize)
            .unwrap_or(4)
            * args.threads;
        let mut streams: Vec<(u64, f64)> = Vec::new();
        for &(size, batch, gbps, _, _, _) in results.iter().filter(|r| r.0 >= 4096) {
            let m = match streams.iter().find(|b| b.0 == size) {
                Some(&(_, m)) => m,
                None => {
                    let m = baseline::tcp_stream_gbps(size, conns, dur);
                    streams.push((size, m));
                    m
                }
            };
            line(
                serde_json::json!({"baseline": "tcp_stream_loopback", "connections": conns, "block_size": size, "batch": batch, "gbps": m, "tent_gbps": gbps, "ratio": ratio(gbps, m)}),
                format!(
                    "# raw TCP stream, {conns} connections, {:>7} writes: {:>8.3} GB/s   tent ({batch} in flight)/stream = {}",
                    human(size),
                    m,
                    show(ratio(gbps, m))
                ),
            );
        }
        return;
    }
    // memcpy of one block, measured once per size; each row compared with
    // it, and a row with ops in flight also with memcpy over its footprint.
    let mut one_block: Vec<(u64, f64)> = Vec::new();
    for &(size, batch, gbps, _, _, _) in results.iter().filter(|r| r.0 >= 4096) {
        let m = match one_block.iter().find(|b| b.0 == size) {
            Some(&(_, m)) => m,
            None => {
                let m = baseline::memcpy_gbps(size, 1, dur);
                one_block.push((size, m));
                m
            }
        };
        line(
            serde_json::json!({"baseline": "memcpy_1thread", "block_size": size, "batch": batch, "gbps": m, "tent_gbps": gbps, "ratio": ratio(gbps, m)}),
            format!(
                "# memcpy 1 thread {:>7}: {:>8.3} GB/s   tent ({batch} in flight)/memcpy = {}",
                human(size),
                m,
                show(ratio(gbps, m))
            ),
        );
        // The same copies over the point's footprint: one block per op in
        // flight on each side, where the engine's copies find their data
        // (skipped once that is beyond any cache anyway).
        let slots = batch;
        if slots > 1 && (size as usize).saturating_mul(slots) <= FOOTPRINT_BASELINE_MAX {
            let f = baseline::memcpy_gbps(size, slots, dur);
            line(
                serde_json::json!({"baseline": "memcpy_1thread_footprint", "block_size": size, "slots": slots, "batch": batch, "gbps": f, "tent_gbps": gbps, "ratio": ratio(gbps, f)}),
                format!(
                    "# memcpy 1 thread {:>7} over {slots} blocks each side (the point's footprint): {:>8.3} GB/s   tent ({batch} in flight)/memcpy = {}",
                    human(size),
                    f,
                    show(ratio(gbps, f))
                ),
            );
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
    line(
        serde_json::json!({"baseline": "ping_pong_round_trip", "cores": [app, worker],
                "p50_us": p50, "p99_us": p99,
                "p50_before_us": q(&before, 0.5), "p50_after_us": q(&after, 0.5)}),
        format!(
            "# cross-core ping-pong round trip (cores {app:?} <-> {worker:?}): p50 {:.3} us before the points, {:.3} us after; using the faster: p50 {p50:.3} us, p99 {p99:.3} us",
            q(&before, 0.5),
            q(&after, 0.5)
        ),
    );
    // The floor for a small op with a CQE each: SQE -> CQE through the
    // engine's own rings between the same two cores, no engine; for each
    // small row's ops in flight.
    for &(size, batch, _, _, _, mops) in results.iter().filter(|r| r.0 <= 64) {
        let floor = baseline::ring_round_trip_mops(batch, app, worker, dur);
        line(
            serde_json::json!({"baseline": "ring_alone", "batch": batch, "cores": [app, worker],
                "mops": floor, "tent_mops": mops, "block_size": size, "ratio": ratio(mops, floor)}),
            format!(
                "# ring alone (SQE -> CQE through tent-rings between cores {app:?} <-> {worker:?}, {batch} in flight, no engine): {floor:.2} M ops/s   tent {} B / ring = {}",
                size,
                show(ratio(mops, floor))
            ),
        );
    }
    // A round trip's latency: the smallest row with the fewest in flight.
    if let Some(&(size, batch, _, t50, t99, _)) =
        results.iter().filter(|r| r.0 <= 64).min_by_key(|r| r.1)
    {
        line(
            serde_json::json!({"baseline": "latency_ratio", "block_size": size, "batch": batch, "p50_ratio": ratio(t50, p50), "p99_ratio": ratio(t99, p99)}),
            format!(
                "# {} submit->CQE ({batch} in flight) vs ping-pong: p50 {}, p99 {}",
                human(size),
                show(ratio(t50, p50)),
                show(ratio(t99, p99))
            ),
        );
    }
}

/// `--scrape-hz`: a thread that GETs the engine's `/metrics` at a fixed
/// rate, as a Prometheus scrape loop would (at a far higher rate); stopped
/// and its count printed when dropped.
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

impl Scraper {
    fn start(engine: &Engine, hz: f64) -> Result<Option<Scraper>, String> {
        if hz <= 0.0 {
            return Ok(None);
        }
        let url = engine
            .http_url()
            .ok_or("--scrape-hz: the engine serves no HTTP endpoint (metrics/http_enable)")?;
        let addr: std::net::SocketAddr = url
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| format!("--scrape-hz: {url}: {e}"))?;
        let token = engine.http_bearer_token();
        let period = Duration::from_secs_f64(1.0 / hz);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
            let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}\r\n");
            let mut next = std::time::Instant::now();
            let mut n = 0u64;
            // One kept-alive connection, as Prometheus keeps one; a new one
            // when the server closed it.
            let mut conn: Option<std::io::BufReader<std::net::TcpStream>> = None;
            let (mut line, mut status) = (String::new(), String::new());
            let mut body = Vec::new();
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let reused = conn.is_some();
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => conn.insert(std::io::BufReader::new(
                        std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?,
                    )),
                };
                let scrape = (|| -> std::io::Result<(bool, bool)> {
                    use std::io::BufRead;
                    c.get_mut().write_all(req.as_bytes())?;
                    let (mut len, mut ok, mut close, mut first) = (0usize, false, false, true);
                    loop {
                        line.clear();
                        if c.read_line(&mut line)? == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        let l = line.trim_end();
                        if first {
                            ok = l.starts_with("HTTP/1.1 200");
                            l.clone_into(&mut status);
                            first = false;
                        } else if l.is_empty() {
                            break;
                        } else if let Some(v) = l.strip_prefix("Content-Length: ") {
                            len = v.parse().map_err(std::io::Error::other)?;
                        } else if l == "Connection: close" {
                            close = true;
                        }
                    }
                    body.resize(len, 0);
                    c.read_exact(&mut body)?;
                    Ok((ok, close))
                })();
                match scrape {
                    Ok((true, close)) => {
                        if close {
                            conn = None;
                        }
                    }
                    Ok((false, _)) => {
                        return Err(format!("--scrape-hz: {status}"));
                    }
                    // A kept connection the server closed (its idle
                    // deadline, its cap): once more on a new one. A new
                    // one that fails ends the loop, as before keep-alive.
                    Err(_) if reused => {
                        conn = None;
                        continue;
                    }
                    Err(e) => return Err(format!("--scrape-hz: {e}")),
                }
                n += 1;
                next += period;
                if let Some(d) = next.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(d);
                }
            }
            Ok(n)
        });
        Ok(Some(Scraper {
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Ok(n)) => eprintln!("tent-bench: {n} scrapes of /metrics"),
                Ok(Err(e)) => eprintln!("tent-bench: the scrape loop failed: {e}"),
                Err(_) => eprintln!("tent-bench: the scrape loop panicked"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{SWEEP, in_flight_for, sweep_points};
    use crate::Args;
    use clap::Parser;

    #[test]
    fn the_default_sweep_runs_each_size_at_one_and_at_many_in_flight() {
        let mut args = Args::try_parse_from(["tent-bench"]).unwrap();
        args.both_ways = true;
        let points = sweep_points(&args);
        for size in SWEEP {
            assert!(points.contains(&(size, 1)), "{size}: {points:?}");
            let n = in_flight_for(size, 1);
            assert!(n > 1, "{size}");
            assert!(points.contains(&(size, n)), "{size}: {points:?}");
            assert!(size * n as u64 <= 256 << 20);
        }
        assert_eq!(in_flight_for(8, 1), 32);
        assert_eq!(in_flight_for(64 << 20, 1), 4);
        assert_eq!(in_flight_for(64 << 20, 2), 2);
        // Either flag: one row per size, at --batch.
        let args = Args::try_parse_from(["tent-bench", "--batch", "8"]).unwrap();
        assert!(sweep_points(&args).iter().all(|&(_, b)| b == 8));
        assert_eq!(sweep_points(&args).len(), SWEEP.len());
    }
}
