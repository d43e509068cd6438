//! tent-bench: throughput and latency of tent on pinned cores.
//!
//! With no `--mode`, it spawns its own target process, runs an initiator
//! against it over shared memory and sweeps block sizes 8 B .. 64 MiB.
//! Baselines (single-thread memcpy, cross-core cache-line ping-pong) are
//! measured in the same run so results can be read as ratios.

// A program, not a library: its public items are the CLI, documented by
// clap's help.
#![allow(missing_docs)]

mod attach;
mod baseline;
mod blocks;
mod hist;
mod point;
mod qos;
mod run;
mod soak;
mod sq;

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Export a buffer and serve until killed; prints the segment name first.
    Target,
    /// Run against `--target NAME`.
    Initiator,
    /// Measure the CPU an idle engine burns over `--duration` seconds.
    Idle,
    /// Seeded failover soak: `--tasks` READs with `--completion-faults` and
    /// `--submit-faults` on the primary transport; 0 lost, 0 duplicated.
    Soak,
    /// Seed 004's send-queue flow control on the simulated verbs provider:
    /// bursts against a 256-deep QP with admission off and on, split
    /// policies over 4 QPs with one slow, the post path's cost per WR.
    Sq,
    /// Seed 001's QoS: HIGH 4 KiB WRITEs at `--high-rate` alone and under a
    /// saturating LOW stream (`--block-size`, default 4 MiB), over shm and
    /// TCP, in one process and in two sharing a slot file at 1, 2, 10 ms.
    Qos,
    /// A paged KV cache's transfer: `--blocks` blocks of `--block-size`
    /// (default 16 KiB) in one `submit_blocks` call over shm, scattered and
    /// contiguous, against one request of the same bytes.
    Blocks,
    /// The same small WRITEs (`--block-size`, default 8 B) from an embedded
    /// engine (inline issue off) and from a client attached to a daemon
    /// (`tent::daemon`), one and `--batch` in flight, over shm, same run.
    Attach,
    /// This host as the engine sees it: NUMA nodes and CPUs, each RDMA
    /// NIC (NUMA node, PCI address, port state, speed, the GID in use and
    /// why), where each of `--threads` workers is pinned and why; with
    /// `--target SEGMENT`, the RDMA rails the engine would form to that
    /// peer. Text, or one JSON object with `--json`.
    Topology,
    /// The LOW process of `--mode qos` (started by it).
    #[value(hide = true)]
    QosLow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    Local,
    Shm,
    Tcp,
    Rdma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpArg {
    Read,
    Write,
}

#[derive(Debug, Clone, Parser)]
#[command(name = "tent-bench", about = "tent throughput/latency benchmark")]
pub struct Args {
    /// Role; without it tent-bench spawns its own target and runs an initiator.
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// Segment name of the target (initiator mode); with --peers N, N
    /// names separated by commas.
    #[arg(long)]
    pub target: Option<String>,
    #[arg(long, value_enum, default_value = "shm")]
    pub transport: TransportArg,
    #[arg(long, value_enum, default_value = "write")]
    pub op: OpArg,
    /// Block size (bytes, or with K/M/G suffix); without it, a sweep 8 B .. 64 MiB.
    #[arg(long, value_parser = parse_size)]
    pub block_size: Option<u64>,
    /// Requests kept in flight per thread: each is submitted again as soon
    /// as its CQE is reaped (an application that refills as completions
    /// arrive), unless --lockstep.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Set when neither --block-size nor --batch is given: the sweep runs
    /// each size twice, one op in flight (latency) and `run::in_flight_for`
    /// ops (throughput).
    #[arg(skip)]
    pub both_ways: bool,
    /// Submit --batch requests together and the next batch only once all
    /// of them have completed (the old default).
    #[arg(long)]
    pub lockstep: bool,
    /// Submitting threads (each with its own ring and worker).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Targets the initiator spreads its ops over, round robin: in-flight
    /// slot b of every thread goes to peer b % N, always to the same place
    /// (slots on one peer never overlap). Without --mode, tent-bench
    /// spawns N target processes, each exporting --buffer-size bytes (or
    /// what its slots need, if more); with --mode initiator, --target takes
    /// N comma-separated segment names. 1 to 256, at most --batch; not with
    /// --transport local.
    #[arg(long, default_value_t = 1)]
    pub peers: usize,
    /// Worker cores, comma separated (default: chosen from the topology).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Seconds per measurement point, after a warm-up of a fifth of it (at
    /// most 0.2 s). A point runs on until at least one op submitted after
    /// the warm-up has completed.
    #[arg(long, default_value_t = 1.0)]
    pub duration: f64,
    /// Seconds a point may run in all, warm-up included: a point with no op
    /// completed by then reports no figure and the run exits 1.
    #[arg(long, default_value_t = 120.0)]
    pub max_seconds: f64,
    /// Initiator: also report throughput per this many ms (with --json one
    /// `{"t_ms", "gbps"}` line per interval, after a live `{"event":
    /// "start"}` line and before the point's summary). An op's bytes count
    /// when it completes: use ops short against the interval, several in
    /// flight (--batch), or the series is lumpy.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_ms: Option<u64>,
    /// Initiator: GET this engine's `/metrics` this many times a second
    /// while it runs, from a thread of its own (what a scrape loop costs
    /// the transfers: compare runs with and without); the count is printed
    /// on stderr at the end.
    #[arg(long, default_value_t = 0.0)]
    pub scrape_hz: f64,
    /// One JSON object per result line.
    #[arg(long)]
    pub json: bool,
    /// Bytes the target exports.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub buffer_size: u64,
    /// Target: the name to publish its segment under in etcd
    /// (`metadata_segment_name`; needs `TENT_METADATA_TYPE=etcd`), so that a
    /// restarted target takes the same name and its initiators reach it
    /// again.
    #[arg(long)]
    pub segment_name: Option<String>,
    /// Skip the memcpy / ping-pong baselines.
    #[arg(long)]
    pub no_baseline: bool,
    /// Blocks: how many blocks one call submits.
    #[arg(long, default_value_t = 10_000)]
    pub blocks: usize,
    /// Blocks: repetitions of each case (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Soak: tasks to run.
    #[arg(long, default_value_t = 1_000_000)]
    pub tasks: u64,
    /// Soak: probability that a completion on the primary is corrupted.
    #[arg(long, default_value_t = 0.3)]
    pub completion_faults: f64,
    /// Soak: probability that a submit on the primary is refused.
    #[arg(long, default_value_t = 0.05)]
    pub submit_faults: f64,
    /// Soak: seed of the fault generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sq: requests per configuration.
    #[arg(long, default_value_t = 400_000)]
    pub sq_requests: u64,
    /// Qos: HIGH WRITEs submitted per second (open loop).
    #[arg(long, default_value_t = 1000.0)]
    pub high_rate: f64,
    /// Qos: only HIGH alone, at each rate of --high-rates (comma separated),
    /// over shm and TCP (or --qos-transports), with the CPU the worker
    /// used: how fast an idle engine answers, and what keeping it ready
    /// costs.
    #[arg(long, value_delimiter = ',')]
    pub high_rates: Vec<f64>,
    /// Qos: only these cases (comma separated; default all): `one-process`,
    /// `two-processes` (without and with each slot file), `tentd`,
    /// `fairness`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub qos_cases: Vec<qos::QosCase>,
    /// Qos: only over these transports (comma separated: shm, tcp;
    /// default both).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub qos_transports: Vec<TransportArg>,
    /// Qos-low: the slot file's rotation interval (ms).
    #[arg(long, hide = true)]
    pub qos_slot_ms: Option<u64>,
    /// Qos-low: the slot file's shared-memory name.
    #[arg(long, hide = true)]
    pub qos_slot_file: Option<String>,
    /// Qos-low: LOW WRITEs kept in flight (default 4).
    #[arg(long, hide = true)]
    pub qos_in_flight: Option<usize>,
    /// Qos-low, attached: the name it gives the daemon
    /// (`daemon_client_name`: the daemon's weights name it).
    #[arg(long, hide = true)]
    pub client_name: Option<String>,
    /// Run the measuring engine as a client of the node's daemon (`tentd`)
    /// listening at this unix socket instead of embedding one (modes
    /// initiator and the default sweep, idle, topology and blocks): its
    /// memory and rings are the daemon's shared memory, its workers the
    /// daemon's. A target this run spawns is still a process of its own.
    #[arg(long)]
    pub attach: Option<std::path::PathBuf>,
    /// Target: exit when stdin closes (used when tent-bench spawns its own target).
    #[arg(long, hide = true)]
    pub exit_on_stdin_eof: bool,
    /// Print every configuration key (variable, type, allowed values,
    /// default, what it does) as a Markdown table, and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// The measuring engine: `cfg` embedded, or, with `--attach`, a client of
/// the daemon there, taking from `cfg` only what a client sets (its rings'
/// depth and its batches: the rest is the daemon's configuration).
pub(crate) fn engine(args: &Args, cfg: tent::Config) -> Result<tent::Engine, String> {
    // `--attach`, else the configuration's `daemon_socket`.
    let socket = match &args.attach {
        Some(s) => s.clone(),
        None if !cfg.daemon_socket.is_empty() => cfg.daemon_socket.clone().into(),
        None => return tent::Engine::new(cfg).map_err(|e| e.to_string()),
    };
    let mut client = tent::Config::default();
    client.daemon_socket = socket.display().to_string();
    client.ring_depth = cfg.ring_depth;
    client.max_batch_size = cfg.max_batch_size;
    client.max_batches = cfg.max_batches;
    client.log_level = cfg.log_level;
    client.daemon_embed_fallback = cfg.daemon_embed_fallback;
    client.daemon_client_name = cfg.daemon_client_name;
    tent::Engine::new(client).map_err(|e| format!("attach to {}: {e}", socket.display()))
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num
        .trim_end_matches(['i', 'B', 'b'])
        .parse()
        .map_err(|_| format!("bad size {s:?} (use e.g. 4096, 64K, 1M)"))?;
    n.checked_mul(mul)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("bad size {s:?}"))
}

fn main() {
    // TENT_LOG wins; else the config's `log_level` when TENT_CONF or
    // TENT_LOG_LEVEL sets it; else warnings only (the tables on stdout are
    // the output). Logging is up before the configuration is read, so what
    // the read warns about is heard; the level follows once it is known.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TENT_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_filter_reloading();
    let reload = builder.reload_handle();
    builder.init();
    // `Engine::reload` (SIGHUP in target mode) sets the level through this
    // handle; under TENT_LOG the filter decides and a new level is refused.
    let filtered = std::env::var_os("TENT_LOG").is_some();
    tent::logging::control_level({
        let reload = reload.clone();
        move |level| {
            if filtered {
                return Err("the TENT_LOG filter decides what tent-bench logs".to_owned());
            }
            reload
                .reload(tracing_subscriber::EnvFilter::new(level.as_str()))
                .map_err(|e| e.to_string())
        }
    });
    let chosen = std::env::var_os(tent::config::ENV_VAR).is_some()
        || std::env::var_os("TENT_LOG_LEVEL").is_some();
    if std::env::var_os("TENT_LOG").is_none()
        && chosen
        && let Ok(cfg) = tent::Config::load()
    {
        // A refused configuration is reported where the engine is built.
        let _ = reload.reload(tracing_subscriber::EnvFilter::new(cfg.log_level.as_str()));
    }
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    args.both_ways = args.block_size.is_none()
        && matches.value_source("batch") != Some(ValueSource::CommandLine);
    if args.print_config {
        print!("{}", tent::Config::key_table());
        return;
    }
    // Exit status: 0 every op succeeded; 1 the run finished but ops failed
    // (the summary line says how many and the first error) or a point
    // completed no op within --max-seconds; 2 the run could
    // not be made (bad arguments, no target, engine refused its config).
    match real_main(args) {
        Ok(t) if t.failed > 0 => {
            let first = t
                .first_error
                .map_or_else(|| "unknown".to_owned(), |f| f.to_string());
            eprintln!(
                "tent-bench: FAILED: {} of {} ops failed; first error: {first}",
                t.failed, t.attempted
            );
            std::process::exit(1);
        }
        Ok(t) if t.empty > 0 => {
            eprintln!(
                "tent-bench: FAILED: no op completed in {} point(s); no figure for them",
                t.empty
            );
            std::process::exit(1);
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("tent-bench: {e}");
            std::process::exit(2);
        }
    }
}

fn real_main(args: Args) -> Result<run::Tally, String> {
    match args.transport {
        TransportArg::Local | TransportArg::Shm | TransportArg::Tcp => {}
        TransportArg::Rdma => {
            if let Err(why) = tent::transport::rdma::sys::devices() {
                return Err(why.to_string());
            }
        }
    }
    if args.batch == 0 || args.threads == 0 {
        return Err("--batch and --threads must be positive".into());
    }
    check_peers(&args)?;
    // Both become Durations: finite, positive, and not past what one holds.
    let secs = |s: f64| s > 0.0 && Duration::try_from_secs_f64(s).is_ok();
    if !secs(args.duration) {
        return Err(format!(
            "--duration {} is not a positive number of seconds",
            args.duration
        ));
    }
    let least = point::warmup(args.duration) + args.duration;
    if !secs(args.max_seconds) || args.max_seconds < least {
        return Err(format!(
            "--max-seconds {} must cover the warm-up plus --duration ({least} s)",
            args.max_seconds
        ));
    }
    let none = |r: Result<(), String>| r.map(|()| run::Tally::default());
    match args.mode {
        Some(Mode::Soak | Mode::Sq | Mode::Qos | Mode::Attach | Mode::Target)
            if args.attach.is_some() =>
        {
            none(Err(
                "--attach: this mode does not run through a daemon (soak and sq inject faults into an engine of their own, qos and attach compare engines they start, a target serves its own memory); attached modes: initiator (and the default sweep), idle, topology, blocks"
                    .to_owned(),
            ))
        }
        Some(Mode::Target) => none(run::target(&args)),
        Some(Mode::Idle) => none(run::idle(&args)),
        Some(Mode::Topology) => none(run::topology(&args)),
        Some(Mode::Soak) => none(soak::soak(&args)),
        Some(Mode::Sq) => none(sq::sq(&args)),
        Some(Mode::Qos) => none(qos::qos(&args)),
        Some(Mode::Blocks) => none(blocks::blocks(&args)),
        Some(Mode::Attach) => none(attach::attach(&args)),
        Some(Mode::QosLow) => none(qos::low_child(&args)),
        Some(Mode::Initiator) => {
            let list = args
                .target
                .as_deref()
                .ok_or("--mode initiator needs --target NAME (the first line a target prints)")?;
            let names: Vec<String> = list.split(',').map(|n| n.trim().to_owned()).collect();
            if names.iter().any(String::is_empty) {
                return Err(format!("--target {list:?} has an empty segment name"));
            }
            if names.len() > MAX_PEERS {
                return Err(format!(
                    "--target names {} segments; at most {MAX_PEERS}",
                    names.len()
                ));
            }
            // --peers may be left out; given, it must agree with the list.
            if args.peers != 1 && args.peers != names.len() {
                return Err(format!(
                    "--peers {} but --target names {} segment(s): give one name per peer, separated by commas",
                    args.peers,
                    names.len()
                ));
            }
            if names.len() > args.batch {
                return Err(too_few_slots(names.len(), args.batch));
            }
            run::initiator(&args, &names, &[])
        }
        None if args.transport == TransportArg::Local => run::initiator(&args, &[], &[]),
        None => spawn_and_run(&args),
    }
}

/// Most targets one initiator spreads its ops over (`--peers`).
const MAX_PEERS: usize = 256;

/// `--peers` is 1 ..= [`MAX_PEERS`], at most `--batch` (slot b goes to
/// peer b % N, so a peer past the batch would get nothing), and needs
/// targets in other processes.
fn check_peers(args: &Args) -> Result<(), String> {
    let n = args.peers;
    if !(1..=MAX_PEERS).contains(&n) {
        return Err(format!("--peers {n} is out of range (1 to {MAX_PEERS})"));
    }
    if n == 1 {
        return Ok(());
    }
    if !matches!(args.mode, None | Some(Mode::Initiator)) {
        return Err(format!(
            "--peers {n} applies to the initiator (no --mode, or --mode initiator)"
        ));
    }
    if args.transport == TransportArg::Local {
        return Err(format!(
            "--peers {n} needs target processes, and --transport local has none: use shm, tcp or rdma"
        ));
    }
    if n > args.batch {
        return Err(too_few_slots(n, args.batch));
    }
    Ok(())
}

fn too_few_slots(peers: usize, batch: usize) -> String {
    format!(
        "{peers} peers but --batch {batch}: in-flight slot b goes to peer b % peers, so {} peer(s) would get no op; raise --batch to at least {peers}",
        peers - batch
    )
}

/// Start `--peers` target processes, read their segment names, run the
/// initiator against all of them, stop them.
fn spawn_and_run(args: &Args) -> Result<run::Tally, String> {
    // One peer receives ceil(batch / peers) slots of every thread.
    let slots = args.batch.div_ceil(args.peers) * args.threads;
    let need = (args.block_size.unwrap_or(64 << 20) * slots as u64).max(run::sweep_need(args));
    let buffer = args.buffer_size.max(need);
    // All started before any is waited for, so they come up together; the
    // guard stops those started, whatever returns early.
    let mut targets = Targets(Vec::with_capacity(args.peers));
    for _ in 0..args.peers {
        targets.0.push(start_target(args.transport, buffer)?);
    }
    let names = targets
        .0
        .iter_mut()
        .map(target_name)
        .collect::<Result<Vec<_>, _>>()?;
    let pids: Vec<u32> = targets.0.iter().map(std::process::Child::id).collect();
    run::initiator(args, &names, &pids)
}

/// Spawned targets: on drop, every stdin is closed (each exits on it) and
/// then each is waited for.
struct Targets(Vec<std::process::Child>);

impl Drop for Targets {
    fn drop(&mut self) {
        for child in &mut self.0 {
            drop(child.stdin.take());
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

/// A target process exporting `buffer` bytes over `transport` (shm unless
/// tcp or rdma), and its segment name. It exits when its stdin closes.
pub fn spawn_target(
    transport: TransportArg,
    buffer: u64,
) -> Result<(std::process::Child, String), String> {
    let mut child = start_target(transport, buffer)?;
    let name = target_name(&mut child)?;
    Ok((child, name))
}

/// Start a target process (see [`spawn_target`]); its name is read with
/// [`target_name`].
fn start_target(transport: TransportArg, buffer: u64) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(exe)
        .args([
            "--mode",
            "target",
            "--transport",
            match transport {
                TransportArg::Tcp => "tcp",
                TransportArg::Rdma => "rdma",
                _ => "shm",
            },
            "--exit-on-stdin-eof",
        ])
        .args(["--buffer-size", &buffer.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the target process: {e}"))
}

/// The segment name a started target prints first; it is killed when it
/// prints none.
fn target_name(child: &mut std::process::Child) -> Result<String, String> {
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    let name = line.trim().to_owned();
    if name.is_empty() {
        let _ = child.kill();
        return Err("the target process exited before printing its segment name".into());
    }
    Ok(name)
}

/// Flush stdout after a line (results stream while a sweep runs).
pub fn emit(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}
