//! `tent-bench --mode qos`: seed 001's promise measured. Does a HIGH
//! stream keep its latency while a LOW stream saturates the path, and what
//! does LOW keep of its throughput?
//!
//! Two streams against one target process, over shm and over TCP:
//! - **LOW**: large WRITEs (`--block-size`, default 4 MiB), [`LOW_IN_FLIGHT`]
//!   kept in flight, priority LOW: the bulk that saturates the path.
//! - **HIGH**: 4 KiB WRITEs at a fixed rate (`--high-rate`, default
//!   1000/s), open loop (a late CQE does not delay the next submit), each
//!   timed from its submit to its CQE.
//!
//! Every case measures three phases in the same run, each warm-up plus
//! `--duration`: HIGH alone (`high_*_idle_us`), LOW alone
//! (`low_gbps_solo`), both at once (`high_*_loaded_us`,
//! `low_gbps_loaded`). Cases:
//! - one process: both streams on one engine with one worker, so they meet
//!   in the worker's lanes and in every transport queue below it;
//! - two processes: HIGH in this process, LOW in a child (`--mode
//!   qos-low`), without a slot file and sharing one at 1, 2 and 10 ms (the
//!   seed's trade-off table: HIGH p99 against LOW throughput). Each
//!   process's worker is pinned to its own core when there are two.
//! - two clients of one daemon (`tentd` in this process, one worker): the
//!   same two processes attached, their streams meeting in the daemon
//!   worker's lanes, with no slot file (slots column `tentd`).
//! - fairness: two LOW clients of one daemon at once, equal weights with
//!   one keeping 4x the other's WRITEs in flight, then weights 3:1: what
//!   each moved against its weighted share.
//!
//! Targets: HIGH p99 loaded ≤ 2x HIGH p99 idle; LOW loaded ≥ 80%
//! of LOW solo. The figures are printed, not judged: a run on a shared VM
//! is a measurement, not a test.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tent::{Config, Engine, LocalAddr, Priority, RemoteAddr, SegmentId, op};

use crate::hist::Histogram;
use crate::{Args, TransportArg, emit, point};

/// LOW WRITEs kept in flight.
const LOW_IN_FLIGHT: usize = 4;
/// LOW WRITEs a flooding client keeps in flight (the fairness cases).
const FLOOD_IN_FLIGHT: usize = 4 * LOW_IN_FLIGHT;
/// HIGH WRITE size.
const HIGH_BLOCK: u64 = 4 << 10;
/// Most HIGH WRITEs in flight (open loop: a stall queues, up to this).
const HIGH_MAX: usize = 256;
/// Slot intervals of the seed's trade-off table (ms); `None`: no slot file.
const SLOTS: [Option<u64>; 4] = [None, Some(1), Some(2), Some(10)];

/// Where one stream's WRITEs go and come from.
struct Stream<'a> {
    engine: &'a Engine,
    src: &'a tent::Buffer,
    segment: SegmentId,
    /// Remote address of this stream's range.
    remote: u64,
}

/// What a LOW stream measured.
#[derive(Debug, Default, Clone, Copy)]
struct LowResult {
    gbps: f64,
    errors: u64,
    /// Times the slot gate closed on LOW work during the run (the engine's
    /// `gate_holds`, counted once per closing).
    gate_holds: u64,
}

/// What a HIGH stream measured.
struct HighResult {
    hist: Histogram,
    ops: u64,
    errors: u64,
}

impl HighResult {
    fn us(&self, q: f64) -> Option<f64> {
        (self.ops > 0).then(|| self.hist.quantile(q) as f64 / 1e3)
    }
}

fn transport_name(t: TransportArg) -> &'static str {
    match t {
        TransportArg::Tcp => "tcp",
        _ => "shm",
    }
}

/// The config of a bench process: one worker on `core`, the transport
/// under test, and the slot file when `slots` names an interval.
fn config(
    transport: TransportArg,
    core: Option<usize>,
    slots: Option<(u64, &str)>,
) -> Result<Config, String> {
    let mut c = Config::load().map_err(|e| e.to_string())?;
    c.workers.count = 1;
    c.workers.pin = true;
    c.workers.cores = core.into_iter().collect();
    c.transports.shm.enable = transport == TransportArg::Shm;
    c.ring_depth = c.ring_depth.max(2 * HIGH_MAX as u32);
    if let Some((ms, name)) = slots {
        c.transports.rdma.slot_rotation_interval_ms = Duration::from_millis(ms);
        c.transports.rdma.shared_quota_shm_path = name.to_owned();
    }
    Ok(c)
}

/// An engine for `config`, the target's segment open, a source buffer of
/// `src_len`, and the base of a target region of at least `need` bytes.
fn open(
    engine: Engine,
    target: &str,
    src_len: u64,
    need: u64,
) -> Result<(Engine, SegmentId, tent::Buffer, u64), String> {
    let seg = engine.open_segment(target).map_err(|e| e.to_string())?;
    let regions = engine.segment_regions(seg).map_err(|e| e.to_string())?;
    let base = regions
        .iter()
        .find(|r| r.len >= need)
        .map(|r| r.addr)
        .ok_or_else(|| format!("target {target} exports no region of {need} bytes"))?;
    let src = engine.allocate_memory(src_len).map_err(|e| e.to_string())?;
    src.write(0, &vec![0x5a; src_len as usize])
        .map_err(|e| e.to_string())?;
    Ok((engine, seg, src, base))
}

/// Keep `in_flight` LOW WRITEs of `block` in flight for `warm` plus
/// `dur`; bytes count when their CQE lands inside the measured `dur`.
/// `measuring` is called once, when the measured window opens.
fn low(
    s: &Stream<'_>,
    in_flight: usize,
    block: u64,
    warm: Duration,
    dur: Duration,
    measuring: impl FnOnce(),
) -> Result<LowResult, String> {
    let mut ring = s.engine.ring().map_err(|e| e.to_string())?;
    let holds = || s.engine.qos_stats().level(Priority::Low).gate_holds;
    let holds_before = holds();
    let start = Instant::now();
    let (open_at, close_at) = (start + warm, start + warm + dur);
    let mut measuring = Some(measuring);
    let mut free: Vec<u64> = (0..in_flight as u64).collect();
    let (mut bytes, mut errors) = (0u64, 0u64);
    loop {
        let now = Instant::now();
        if now >= open_at {
            if let Some(f) = measuring.take() {
                f();
            }
        }
        let running = now < close_at;
        if !running && free.len() == in_flight {
            break;
        }
        if running && !free.is_empty() {
            let mut sq = ring.submission();
            while let Some(k) = free.pop() {
                let off = k * block;
                let sqe = op::Write::new(
                    LocalAddr::new(s.src.id(), off),
                    RemoteAddr::new(s.segment, s.remote + off),
                    block,
                )
                .priority(Priority::Low)
                .user_data(k)
                .build();
                if sq.push(sqe).is_err() {
                    free.push(k);
                    break;
                }
            }
        }
        match ring.wait_ready(Duration::from_secs(30)) {
            Ok(()) => {}
            Err(e) => return Err(format!("LOW stream: waiting for completions: {e}")),
        }
        let now = Instant::now();
        for cqe in ring.completion() {
            free.push(cqe.user_data());
            match cqe.result() {
                Ok(n) if now > open_at && now <= close_at => bytes += n,
                Ok(_) => {}
                Err(_) => errors += 1,
            }
        }
    }
    Ok(LowResult {
        gbps: bytes as f64 / dur.as_secs_f64() / 1e9,
        errors,
        gate_holds: holds() - holds_before,
    })
}

/// HIGH 4 KiB WRITEs at `rate` a second for `dur`, open loop.
fn high(s: &Stream<'_>, rate: f64, dur: Duration) -> Result<HighResult, String> {
    let mut ring = s.engine.ring().map_err(|e| e.to_string())?;
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut res = HighResult {
        hist: Histogram::new(),
        ops: 0,
        errors: 0,
    };
    let mut sent: Vec<Option<Instant>> = vec![None; HIGH_MAX];
    let mut in_flight = 0usize;
    let mut next_slot = 0usize;
    let start = Instant::now();
    let mut due = start;
    loop {
        let now = Instant::now();
        let running = now < start + dur;
        if !running && in_flight == 0 {
            break;
        }
        if running && now >= due && in_flight < HIGH_MAX {
            while sent[next_slot].is_some() {
                next_slot = (next_slot + 1) % HIGH_MAX;
            }
            let k = next_slot as u64;
            let sqe = op::Write::new(
                LocalAddr::new(s.src.id(), k * HIGH_BLOCK),
                RemoteAddr::new(s.segment, s.remote + k * HIGH_BLOCK),
                HIGH_BLOCK,
            )
            .priority(Priority::High)
            .user_data(k)
            .build();
            ring.submission()
                .push(sqe)
                .map_err(|_| "HIGH stream: submission ring full".to_string())?;
            sent[next_slot] = Some(Instant::now());
            in_flight += 1;
            due += period;
        }
        // Sleep until the next submit is due or a CQE lands, whichever
        // first; past the end, until the last CQEs land.
        let wait = if running {
            due.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(30)
        };
        if in_flight > 0 {
            match ring.wait_ready(wait) {
                Ok(()) => {}
                Err(e) if e.kind() == tent::ErrorKind::Timeout && running => {}
                Err(e) => return Err(format!("HIGH stream: waiting for completions: {e}")),
            }
        } else if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        for cqe in ring.completion() {
            let done = Instant::now();
            let at = usize::try_from(cqe.user_data())
                .ok()
                .and_then(|k| sent.get_mut(k))
                .and_then(Option::take)
                .ok_or("HIGH stream: a CQE for no WRITE in flight")?;
            in_flight -= 1;
            match cqe.result() {
                Ok(_) => {
                    res.ops += 1;
                    res.hist.record((done - at).as_nanos() as u64);
                }
                Err(_) => res.errors += 1,
            }
        }
    }
    Ok(res)
}

/// The measured window of each phase and its warm-up.
fn phase(args: &Args) -> (Duration, Duration) {
    (
        Duration::from_secs_f64(point::warmup(args.duration)),
        Duration::from_secs_f64(args.duration),
    )
}

fn low_block(args: &Args) -> u64 {
    args.block_size.unwrap_or(4 << 20)
}

/// Target bytes both streams cover: LOW's range, then HIGH's.
fn span(args: &Args) -> u64 {
    low_block(args) * FLOOD_IN_FLIGHT as u64 + HIGH_BLOCK * HIGH_MAX as u64
}

/// Worker cores: the HIGH process's and the LOW child's (the first and the
/// last core the bench may use; the same one on a single core).
fn cores(args: &Args) -> (Option<usize>, Option<usize>) {
    let all: Vec<usize> = if args.cores.is_empty() {
        core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect()
    } else {
        args.cores.clone()
    };
    (all.first().copied(), all.last().copied())
}

/// One case's figures.
struct Case {
    transport: TransportArg,
    processes: u32,
    /// The processes are clients of one daemon (no slot file).
    daemon: bool,
    slot_ms: Option<u64>,
    idle: HighResult,
    loaded: HighResult,
    solo: LowResult,
    busy: LowResult,
    /// The HIGH engine's statistics at the end (`Engine::qos_stats`).
    stats: Value,
    /// One process: HIGH alone beside a spinning thread per core (no
    /// transfer): what a busy CPU alone does to HIGH's latency.
    cpu_busy: Option<HighResult>,
}

/// HIGH alone for `dur` while a thread per core spins, each pinned to one
/// of `cores` (every core the bench may use; none named: as many unpinned
/// threads as this thread may run on): the latency a fully busy CPU alone
/// costs (no transfer competes).
fn high_beside_spinners(
    s: &Stream<'_>,
    rate: f64,
    dur: Duration,
    cores: &[usize],
) -> Result<HighResult, String> {
    let pins: Vec<Option<usize>> = if cores.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        vec![None; n]
    } else {
        cores.iter().copied().map(Some).collect()
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for pin in pins {
            let stop = &stop;
            sc.spawn(move || {
                if let Some(id) = pin {
                    core_affinity::set_for_current(core_affinity::CoreId { id });
                }
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let r = high(s, rate, dur);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        r
    })
}

/// An engine's QoS statistics per priority (seed 001's: accepted,
/// promoted, gate holds, queue wait p99 from intake to the first slice
/// out) and its slot clock's takeovers.
fn stats_json(e: &Engine) -> Value {
    let q = e.qos_stats();
    let lvl = |p: Priority| {
        let l = q.level(p);
        json!({"accepted": l.accepted, "promoted": l.promoted, "gate_holds": l.gate_holds,
               "queue_wait_p99_us": l.wait_quantile_us(0.99)})
    };
    json!({"high": lvl(Priority::High), "low": lvl(Priority::Low),
           "slot_takeovers": q.slots.map(|s| s.takeovers)})
}

/// Both streams in one engine with one worker.
fn one_process(args: &Args, transport: TransportArg, target: &str) -> Result<Case, String> {
    let block = low_block(args);
    let src_len = block * LOW_IN_FLIGHT as u64;
    let (engine, segment, src, base) = open(
        Engine::new(config(transport, cores(args).0, None)?).map_err(|e| e.to_string())?,
        target,
        src_len,
        span(args),
    )?;
    let hsrc = engine
        .allocate_memory(HIGH_BLOCK * HIGH_MAX as u64)
        .map_err(|e| e.to_string())?;
    let lo = Stream {
        engine: &engine,
        src: &src,
        segment,
        remote: base,
    };
    let hi = Stream {
        engine: &engine,
        src: &hsrc,
        segment,
        remote: base + src_len,
    };
    let (warm, dur) = phase(args);
    let rate = args.high_rate;
    // Warm the HIGH path (connections, page tables) before its idle figure.
    high(&hi, rate, warm)?;
    let idle = high(&hi, rate, dur)?;
    let solo = low(&lo, LOW_IN_FLIGHT, block, warm, dur, || {})?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (busy, loaded) = std::thread::scope(|sc| {
        let l = sc.spawn(|| {
            low(&lo, LOW_IN_FLIGHT, block, warm, dur, move || {
                let _ = tx.send(());
            })
        });
        let h = rx
            .recv()
            .map_err(|_| "the LOW stream ended before measuring".to_string())
            .and_then(|()| high(&hi, rate, dur.mul_f64(0.9)));
        (l.join().expect("LOW stream panicked"), h)
    });
    Ok(Case {
        transport,
        processes: 1,
        daemon: false,
        slot_ms: None,
        idle,
        loaded: loaded?,
        solo,
        busy: busy?,
        stats: stats_json(&engine),
        cpu_busy: Some(high_beside_spinners(&hi, rate, dur, &args.cores)?),
    })
}

/// The LOW child of a two-process case: its pipes.
struct LowChild {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl LowChild {
    fn spawn(
        args: &Args,
        transport: TransportArg,
        target: &str,
        slot: Option<(u64, &str)>,
        core: Option<usize>,
        client: Option<&Client<'_>>,
    ) -> Result<LowChild, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(["--mode", "qos-low", "--target", target])
            .args(["--transport", transport_name(transport)])
            .args(["--duration", &args.duration.to_string()])
            .args(["--block-size", &low_block(args).to_string()]);
        if let Some(c) = core {
            cmd.args(["--cores", &c.to_string()]);
        }
        if let Some((ms, name)) = slot {
            cmd.args(["--qos-slot-ms", &ms.to_string(), "--qos-slot-file", name]);
        }
        if let Some(c) = client {
            cmd.arg("--attach")
                .arg(c.socket)
                .args(["--client-name", c.name])
                .args(["--qos-in-flight", &c.in_flight.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the LOW process: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let mut c = LowChild { child, stdin, out };
        let ready = c.line()?;
        if ready["event"] != "ready" {
            return Err(format!("the LOW process said {ready} instead of ready"));
        }
        Ok(c)
    }

    /// The child's next line, as JSON.
    fn line(&mut self) -> Result<Value, String> {
        let mut l = String::new();
        match self.out.read_line(&mut l) {
            Ok(0) | Err(_) => Err("the LOW process exited (its stderr says why)".into()),
            Ok(_) => serde_json::from_str(&l).map_err(|e| format!("LOW process: {e}: {l}")),
        }
    }

    /// Start a LOW run; returns once its measured window opens.
    fn start(&mut self) -> Result<(), String> {
        self.ask_run()?;
        self.measuring()
    }

    /// Ask for a LOW run (its warm-up starts now).
    fn ask_run(&mut self) -> Result<(), String> {
        writeln!(self.stdin, "run").map_err(|e| e.to_string())
    }

    /// Wait until the run's measured window opens.
    fn measuring(&mut self) -> Result<(), String> {
        match self.line()? {
            v if v["event"] == "measuring" => Ok(()),
            v => Err(format!("the LOW process said {v} instead of measuring")),
        }
    }

    /// The run's result.
    fn result(&mut self) -> Result<LowResult, String> {
        let v = self.line()?;
        let field = |k: &str| v[k].as_f64().ok_or_else(|| format!("no {k} in {v}"));
        Ok(LowResult {
            gbps: field("gbps")?,
            errors: field("errors")? as u64,
            gate_holds: field("gate_holds")? as u64,
        })
    }
}

impl Drop for LowChild {
    fn drop(&mut self) {
        // Closing its stdin ends the child; it exits on EOF.
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.wait();
    }
}

/// A slot file's name for this run and interval (removed afterwards).
fn slot_name(ms: u64) -> String {
    format!("/tent-bench-qos-{}-{ms}", std::process::id())
}

/// A LOW child attached to a daemon: where, the name it gives, its
/// WRITEs in flight.
struct Client<'a> {
    socket: &'a std::path::Path,
    name: &'a str,
    in_flight: usize,
}

/// A daemon in this process for the clients of a case: one worker (on
/// `core`), serving the transport under test (and shm, which client
/// memory needs), with `weights`.
fn daemon(
    transport: TransportArg,
    core: Option<usize>,
    weights: Vec<tent::daemon::ClientWeight>,
) -> Result<(tent::daemon::Daemon, std::path::PathBuf), String> {
    let mut cfg = config(transport, core, None)?;
    cfg.transports.shm.enable = true;
    cfg.daemon_socket.clear();
    let socket = std::env::temp_dir().join(format!(
        "tent-bench-qos-{}-{}.sock",
        std::process::id(),
        transport_name(transport)
    ));
    let limits = tent::daemon::DaemonLimits {
        weights,
        ..Default::default()
    };
    let engine = Engine::new(cfg).map_err(|e| e.to_string())?;
    let d = tent::daemon::Daemon::start_with(engine, &socket, limits).map_err(|e| e.to_string())?;
    Ok((d, socket))
}

/// HIGH here, LOW in a child process, sharing a slot file at `slot_ms`;
/// or, with `daemon`, both clients of one daemon (in this process, its
/// worker where the HIGH process's would be), with no slot file.
fn two_processes(
    args: &Args,
    transport: TransportArg,
    target: &str,
    slot_ms: Option<u64>,
    daemon_case: bool,
) -> Result<Case, String> {
    let (hcore, lcore) = cores(args);
    let name = slot_ms.map(slot_name);
    let slot = slot_ms.zip(name.as_deref());
    let block = low_block(args);
    let served = daemon_case
        .then(|| daemon(transport, hcore, Vec::new()))
        .transpose()?;
    let client = served.as_ref().map(|(_, socket)| Client {
        socket,
        name: "low",
        in_flight: LOW_IN_FLIGHT,
    });
    let mut child = LowChild::spawn(args, transport, target, slot, lcore, client.as_ref())?;
    let mut cfg = config(transport, hcore, slot)?;
    let engine = match &served {
        Some((_, socket)) => {
            cfg.daemon_socket = socket.display().to_string();
            cfg.daemon_client_name = "high".into();
            crate::engine(args, cfg)?
        }
        None => Engine::new(cfg).map_err(|e| e.to_string())?,
    };
    let (engine, segment, src, base) =
        open(engine, target, HIGH_BLOCK * HIGH_MAX as u64, span(args))?;
    let hi = Stream {
        engine: &engine,
        src: &src,
        segment,
        remote: base + block * FLOOD_IN_FLIGHT as u64,
    };
    let (warm, dur) = phase(args);
    let rate = args.high_rate;
    high(&hi, rate, warm)?;
    let idle = high(&hi, rate, dur)?;
    if let Some(ms) = slot_ms {
        // HIGH's work just ended: its slots stay reserved for a cycle.
        // LOW alone is measured once they are given up.
        std::thread::sleep(Duration::from_millis(3 * ms + 5));
    }
    child.start()?;
    let solo = child.result()?;
    child.start()?;
    let loaded = high(&hi, rate, dur.mul_f64(0.9))?;
    let busy = child.result()?;
    drop(child);
    let stats = match &served {
        Some((d, _)) => stats_json(d.engine()),
        None => stats_json(&engine),
    };
    drop(engine);
    drop(served);
    if let Some(n) = name {
        let _ = std::fs::remove_file(format!("/dev/shm{n}"));
    }
    Ok(Case {
        transport,
        processes: 2,
        daemon: daemon_case,
        slot_ms,
        idle,
        loaded,
        solo,
        busy,
        stats,
        cpu_busy: None,
    })
}

/// `--mode qos-low`: the LOW process of a two-process case. Prints
/// `{"event":"ready"}`, then per `run` line on stdin one LOW run:
/// `{"event":"measuring"}` when its window opens and its result line.
pub(crate) fn low_child(args: &Args) -> Result<(), String> {
    let target = args
        .target
        .as_deref()
        .ok_or("--mode qos-low needs --target")?;
    let slot = match (args.qos_slot_ms, args.qos_slot_file.as_deref()) {
        (Some(ms), Some(name)) => Some((ms, name)),
        (None, None) => None,
        _ => return Err("--qos-slot-ms and --qos-slot-file go together".into()),
    };
    let block = low_block(args);
    let in_flight = args
        .qos_in_flight
        .unwrap_or(LOW_IN_FLIGHT)
        .clamp(1, FLOOD_IN_FLIGHT);
    let mut cfg = config(args.transport, args.cores.first().copied(), slot)?;
    if let Some(n) = &args.client_name {
        cfg.daemon_client_name = n.clone();
    }
    let (engine, segment, src, base) = open(
        crate::engine(args, cfg)?,
        target,
        block * in_flight as u64,
        span(args),
    )?;
    let lo = Stream {
        engine: &engine,
        src: &src,
        segment,
        remote: base,
    };
    let (warm, dur) = phase(args);
    emit(&json!({"event": "ready"}).to_string());
    for line in std::io::stdin().lock().lines() {
        match line.map_err(|e| e.to_string())?.trim() {
            "run" => {
                let r = low(&lo, in_flight, block, warm, dur, || {
                    emit(&json!({"event": "measuring"}).to_string());
                })?;
                emit(
                    &json!({"gbps": r.gbps, "errors": r.errors, "gate_holds": r.gate_holds})
                        .to_string(),
                );
            }
            _ => break,
        }
    }
    Ok(())
}

/// A case of `--mode qos` (`--qos-cases`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QosCase {
    /// HIGH and LOW streams in one engine.
    OneProcess,
    /// HIGH here, LOW in another process: without a slot file, then with
    /// each of [`SLOTS`]'s.
    TwoProcesses,
    /// HIGH and LOW as two clients of one daemon.
    Tentd,
    /// Two LOW clients of one daemon, one flooding, then weighted 3:1.
    Fairness,
}

/// The transports a qos run covers: `--qos-transports`, else shm and TCP.
fn transports(args: &Args) -> Result<Vec<TransportArg>, String> {
    Ok(match args.qos_transports.as_slice() {
        [] => vec![TransportArg::Shm, TransportArg::Tcp],
        some => {
            if let Some(t) = some
                .iter()
                .find(|t| !matches!(t, TransportArg::Shm | TransportArg::Tcp))
            {
                let name = clap::ValueEnum::to_possible_value(t)
                    .map_or_else(String::new, |v| v.get_name().to_owned());
                return Err(format!(
                    "--qos-transports {name}: the qos cases run over shm and tcp only"
                ));
            }
            [TransportArg::Shm, TransportArg::Tcp]
                .into_iter()
                .filter(|t| some.contains(t))
                .collect()
        }
    })
}

/// `--mode qos`: every case (or `--qos-cases`), over shm and TCP (or
/// `--qos-transports`).
pub(crate) fn qos(args: &Args) -> Result<(), String> {
    if !args.high_rates.is_empty() {
        return high_alone(args);
    }
    let transports = transports(args)?;
    let runs = |c: QosCase| args.qos_cases.is_empty() || args.qos_cases.contains(&c);
    let (placed, cores) = Cores::of(args);
    let args = &placed;
    if !(args.high_rate > 0.0 && args.high_rate <= 1e6) {
        return Err(format!(
            "--high-rate {} must be in (0, 1e6] WRITEs a second",
            args.high_rate
        ));
    }
    let block = low_block(args);
    let (warm, dur) = phase(args);
    if !args.json {
        emit(&format!(
            "# tent-bench qos: LOW {} B WRITEs x{LOW_IN_FLIGHT} in flight, HIGH {HIGH_BLOCK} B WRITEs at {}/s; {:.2} s per phase after {:.2} s warm-up",
            block,
            args.high_rate,
            dur.as_secs_f64(),
            warm.as_secs_f64()
        ));
        if let Some(core) = cores.first() {
            emit(&format!(
                "# one busy worker (one process, tentd, fairness): core {core} is that worker's alone, every other thread of the bench, the target and the LOW processes runs off it, as a node gives tentd's workers cores of their own"
            ));
        }
        emit(
            "transport | procs | slots | HIGH p50/p99 idle us | HIGH p50/p99 loaded us | p99 ratio | LOW solo GB/s | LOW loaded GB/s | LOW kept | LOW gate holds solo/loaded",
        );
    }
    let buffer = span(args);
    let mut failed = 0;
    for transport in transports {
        let mut cases = Vec::new();
        if runs(QosCase::OneProcess) {
            cases.push(
                cores.with_target(true, transport, buffer, |t| one_process(args, transport, t)),
            );
        }
        if runs(QosCase::TwoProcesses) {
            for s in SLOTS {
                cases.push(cores.with_target(false, transport, buffer, |t| {
                    two_processes(args, transport, t, s, false)
                }));
            }
        }
        if runs(QosCase::Tentd) {
            cases.push(cores.with_target(true, transport, buffer, |t| {
                two_processes(args, transport, t, None, true)
            }));
        }
        let shares = if runs(QosCase::Fairness) {
            cores.with_target(true, transport, buffer, |t| fairness(args, transport, t))
        } else {
            Ok(Vec::new())
        };
        for c in cases {
            let c = c?;
            failed += c.idle.errors + c.loaded.errors + c.solo.errors + c.busy.errors;
            report(args, &c);
        }
        for f in shares? {
            failed += f.a.errors + f.b.errors;
            report_share(args, transport, &f);
        }
    }
    if failed > 0 {
        return Err(format!("{failed} WRITEs failed"));
    }
    Ok(())
}

/// Where a case's threads run. With two cores or more and no `--cores`,
/// a case with one busy worker (one process; the daemon's in the tentd
/// and fairness cases) keeps every other thread, and every process it
/// starts, off the first core, which that worker is pinned to: a worker
/// that busy-polls keeps a thread queued behind it on its core for up to
/// a scheduler slice (milliseconds), which a node avoids by giving its
/// daemon's workers cores of their own. The two-process cases have a
/// worker on the first and on the last core, and run anywhere.
struct Cores {
    /// Every core this process may use (empty: no placing).
    all: Vec<usize>,
}

impl Cores {
    /// `args` naming every core this process may use, and where cases run.
    fn of(args: &Args) -> (Args, Cores) {
        let mut placed = args.clone();
        if !args.cores.is_empty() {
            return (placed, Cores { all: Vec::new() });
        }
        let all: Vec<usize> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.id)
            .collect();
        if all.len() < 2 {
            return (placed, Cores { all: Vec::new() });
        }
        placed.cores = all.clone();
        (placed, Cores { all })
    }

    /// The core kept for the one busy worker, if any.
    fn first(&self) -> Option<usize> {
        self.all.first().copied()
    }

    /// Run `case` from this thread kept off the first core (`alone`) or on
    /// every core; this thread is on every core again afterwards.
    fn placed<R>(
        &self,
        alone: bool,
        case: impl FnOnce() -> Result<R, String>,
    ) -> Result<R, String> {
        if self.all.is_empty() {
            return case();
        }
        let skip = usize::from(alone);
        set_affinity(&self.all[skip..])?;
        let r = case();
        set_affinity(&self.all)?;
        r
    }

    /// Run `case` against a target of its own exporting `buffer` bytes
    /// over `transport`, the target started and stopped where
    /// [`placed`](Self::placed) puts this thread.
    fn with_target<R>(
        &self,
        alone: bool,
        transport: TransportArg,
        buffer: u64,
        case: impl FnOnce(&str) -> Result<R, String>,
    ) -> Result<R, String> {
        self.placed(alone, || {
            let (target, name) = crate::spawn_target(transport, buffer)?;
            let _stop = crate::Targets(vec![target]);
            case(&name)
        })
    }
}

/// Let this thread (and what it starts from now on) run on `cores` only.
fn set_affinity(cores: &[usize]) -> Result<(), String> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 names this thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(format!(
            "placing the bench on cores {cores:?}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `--high-rates`: HIGH alone at each rate, over shm and TCP, one process,
/// with the CPU time the engine's workers used in the measured phase
/// (`/proc/self/task/*/schedstat` of the `tent-worker-*` threads).
fn high_alone(args: &Args) -> Result<(), String> {
    if let Some(r) = args.high_rates.iter().find(|r| !(**r > 0.0 && **r <= 1e6)) {
        return Err(format!(
            "--high-rates {r} must be in (0, 1e6] WRITEs a second"
        ));
    }
    let (warm, dur) = phase(args);
    if !args.json {
        emit(&format!(
            "# tent-bench qos, HIGH alone: {HIGH_BLOCK} B WRITEs through the worker (inline issue off), open loop; {:.2} s per rate after {:.2} s warm-up",
            dur.as_secs_f64(),
            warm.as_secs_f64()
        ));
        emit("transport |  ops/s |  p50 us |  p99 us | worker CPU ms/s");
    }
    for transport in transports(args)? {
        let (mut target, name) = crate::spawn_target(transport, span(args))?;
        // The worker's answer is what is measured: nothing issued inline.
        let mut cfg = config(transport, cores(args).0, None)?;
        cfg.inline_max_bytes = 0;
        let (engine, segment, src, base) = open(
            Engine::new(cfg).map_err(|e| e.to_string())?,
            &name,
            HIGH_BLOCK * HIGH_MAX as u64,
            span(args),
        )?;
        let hi = Stream {
            engine: &engine,
            src: &src,
            segment,
            remote: base,
        };
        for &rate in &args.high_rates {
            high(&hi, rate, warm)?;
            let (cpu0, t0) = (worker_cpu_ns(), Instant::now());
            let h = high(&hi, rate, dur)?;
            let cpu_ms_s =
                (worker_cpu_ns().saturating_sub(cpu0)) as f64 / 1e6 / t0.elapsed().as_secs_f64();
            if args.json {
                emit(
                    &json!({"high_alone": true, "transport": transport_name(transport), "rate": rate,
                        "high_p50_idle_us": h.us(0.5), "high_p99_idle_us": h.us(0.99),
                        "ops": h.ops, "errors": h.errors, "worker_cpu_ms_per_s": cpu_ms_s})
                    .to_string(),
                );
            } else {
                let us = |q| h.us(q).map_or("-".to_owned(), |v| format!("{v:.2}"));
                emit(&format!(
                    "{:>9} | {:>6} | {:>7} | {:>7} | {:>8.1}",
                    transport_name(transport),
                    rate,
                    us(0.5),
                    us(0.99),
                    cpu_ms_s
                ));
            }
            if h.errors > 0 {
                return Err(format!("{} HIGH WRITEs failed", h.errors));
            }
        }
        drop(engine);
        drop(target.stdin.take());
        let _ = target.wait();
    }
    Ok(())
}

/// CPU time (ns) of this process's `tent-worker-*` threads so far.
fn worker_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("tent-worker"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn report(args: &Args, c: &Case) {
    let ratio = match (c.loaded.us(0.99), c.idle.us(0.99)) {
        (Some(l), Some(i)) if i > 0.0 => Some(l / i),
        _ => None,
    };
    let kept = (c.solo.gbps > 0.0).then(|| c.busy.gbps / c.solo.gbps);
    if args.json {
        emit(
            &json!({
                "transport": transport_name(c.transport), "processes": c.processes,
                "clients_of_one_daemon": c.daemon,
                "slot_interval_ms": c.slot_ms,
                "high_p50_idle_us": c.idle.us(0.5), "high_p99_idle_us": c.idle.us(0.99),
                "high_p50_loaded_us": c.loaded.us(0.5), "high_p99_loaded_us": c.loaded.us(0.99),
                "high_p99_ratio": ratio, "high_ops_idle": c.idle.ops, "high_ops_loaded": c.loaded.ops,
                "low_gbps_solo": c.solo.gbps, "low_gbps_loaded": c.busy.gbps, "low_kept": kept,
                "errors": c.idle.errors + c.loaded.errors + c.solo.errors + c.busy.errors,
                "low_gate_holds_solo": c.solo.gate_holds, "low_gate_holds_loaded": c.busy.gate_holds,
                "high_p99_cpu_busy_us": c.cpu_busy.as_ref().and_then(|h| h.us(0.99)),
                "stats": c.stats,
            })
            .to_string(),
        );
        return;
    }
    let us = |h: &HighResult| {
        format!(
            "{:.1}/{:.1}",
            h.us(0.5).unwrap_or(f64::NAN),
            h.us(0.99).unwrap_or(f64::NAN)
        )
    };
    emit(&format!(
        "{:>9} | {:>5} | {:>5} | {:>20} | {:>22} | {:>9} | {:>13.3} | {:>15.3} | {:>8} | {}/{}",
        transport_name(c.transport),
        c.processes,
        match (c.daemon, c.slot_ms) {
            (true, _) => "tentd".to_owned(),
            (false, m) => m.map_or("-".to_owned(), |m| format!("{m}ms")),
        },
        us(&c.idle),
        us(&c.loaded),
        ratio.map_or("n/a".into(), |r| format!("{r:.2}x")),
        c.solo.gbps,
        c.busy.gbps,
        kept.map_or("n/a".into(), |k| format!("{:.0}%", k * 100.0)),
        c.solo.gate_holds,
        c.busy.gate_holds
    ));
    if let Some(h) = &c.cpu_busy {
        emit(&format!(
            "#   {}: HIGH alone beside a spinning thread per core (the CPU busy, no transfer): p50/p99 {}",
            transport_name(c.transport),
            us(h)
        ));
    }
}

/// A fairness case: two LOW clients of one daemon, what each moved.
struct Share {
    weights: (u32, u32),
    in_flight: (usize, usize),
    a: LowResult,
    b: LowResult,
}

/// Two LOW clients of one daemon at once (each a child process): equal
/// weights with B flooding four times A's WRITEs in flight, then weights
/// 3:1 with both flooding. What each moved is what it got of the path.
fn fairness(args: &Args, transport: TransportArg, target: &str) -> Result<Vec<Share>, String> {
    let (dcore, lcore) = cores(args);
    let mut out = Vec::new();
    for (weights, in_flight) in [
        ((1, 1), (LOW_IN_FLIGHT, FLOOD_IN_FLIGHT)),
        ((3, 1), (FLOOD_IN_FLIGHT, FLOOD_IN_FLIGHT)),
    ] {
        let rules = vec![
            format!("name:a={}", weights.0)
                .parse()
                .map_err(|e: tent::Error| e.to_string())?,
            format!("name:b={}", weights.1)
                .parse()
                .map_err(|e: tent::Error| e.to_string())?,
        ];
        let (d, socket) = daemon(transport, dcore, rules)?;
        let spawn = |name, n| {
            let c = Client {
                socket: &socket,
                name,
                in_flight: n,
            };
            LowChild::spawn(args, transport, target, None, lcore, Some(&c))
        };
        let mut a = spawn("a", in_flight.0)?;
        let mut b = spawn("b", in_flight.1)?;
        // Both asked at once: their windows open and close together.
        a.ask_run()?;
        b.ask_run()?;
        a.measuring()?;
        b.measuring()?;
        let (ra, rb) = (a.result()?, b.result()?);
        drop((a, b));
        drop(d);
        out.push(Share {
            weights,
            in_flight,
            a: ra,
            b: rb,
        });
    }
    Ok(out)
}

fn report_share(args: &Args, transport: TransportArg, f: &Share) {
    let total = f.a.gbps + f.b.gbps;
    let (wa, wb) = (f64::from(f.weights.0), f64::from(f.weights.1));
    // What A got against what its weight entitles it to.
    let a_of_share = (total > 0.0).then(|| f.a.gbps / (total * wa / (wa + wb)));
    let ratio = (f.b.gbps > 0.0).then(|| f.a.gbps / f.b.gbps);
    if args.json {
        emit(
            &json!({
                "case": "fairness", "transport": transport_name(transport),
                "weights": [f.weights.0, f.weights.1], "in_flight": [f.in_flight.0, f.in_flight.1],
                "a_gbps": f.a.gbps, "b_gbps": f.b.gbps, "a_of_its_share": a_of_share,
                "a_over_b": ratio, "errors": f.a.errors + f.b.errors,
            })
            .to_string(),
        );
        return;
    }
    emit(&format!(
        "fairness {:>5} | weights {}:{} | in flight {}:{} | A {:.3} GB/s, B {:.3} GB/s | A/B {} | A got {} of its weighted share",
        transport_name(transport),
        f.weights.0,
        f.weights.1,
        f.in_flight.0,
        f.in_flight.1,
        f.a.gbps,
        f.b.gbps,
        ratio.map_or("n/a".into(), |r| format!("{r:.2}")),
        a_of_share.map_or("n/a".into(), |k| format!("{:.0}%", k * 100.0)),
    ));
}
