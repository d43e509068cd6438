//! `tent-bench --mode soak`: a seeded failover soak.
//!
//! The engine's own memcpy transport is wrapped twice in
//! `FaultProxyTransport`: once in the RDMA slot (primary, with
//! completion and submit faults drawn from `--seed`) and once in the TCP
//! slot (fallback, healthy). `--tasks` 64-byte READs, each into its own
//! destination, stream through one ring; every CQE is checked off a
//! bitmap, and at the end the destination must equal the source: 0 lost,
//! 0 duplicated, exactly one CQE per task.
//!
//! Before the soak, the healthy path is measured with failover enabled and
//! disabled (`max_failover_attempts` 3 vs 0, no faults), alternating, in
//! the same run: the cost of having failover armed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tent::transport::fault::{FaultPolicy, FaultProxyTransport};
use tent::{Engine, LocalAddr, RemoteAddr, SegmentId, TransportKind, op};

use crate::{Args, emit};

const OP: u64 = 64;
const IN_FLIGHT: usize = 512;

struct Rig {
    engine: Engine,
    primary: Arc<FaultProxyTransport>,
}

fn rig(args: &Args, max_failover: u32, faults: bool) -> Result<Rig, String> {
    let mut c = tent::Config::default();
    c.workers.count = 1;
    c.workers.pin = !args.cores.is_empty();
    c.workers.cores = args.cores.clone();
    c.transports.shm.enable = false;
    c.transports.tcp.enable = false;
    c.max_failover_attempts = max_failover;
    c.ring_depth = 1024;
    let engine = Engine::new(c).map_err(|e| e.to_string())?;
    let local = engine
        .swap_transport(TransportKind::Local, None)
        .ok_or("no local transport to wrap")?;
    let policy = FaultPolicy {
        seed: args.seed,
        status_corrupt_rate: if faults { args.completion_faults } else { 0.0 },
        submit_fail_rate: if faults { args.submit_faults } else { 0.0 },
        ..FaultPolicy::default()
    };
    let primary =
        Arc::new(FaultProxyTransport::new(local.clone(), policy).as_kind(TransportKind::Rdma));
    let fallback = Arc::new(
        FaultProxyTransport::new(local, FaultPolicy::default()).as_kind(TransportKind::Tcp),
    );
    engine.swap_transport(TransportKind::Rdma, Some(primary.clone()));
    engine.swap_transport(TransportKind::Tcp, Some(fallback));
    Ok(Rig { engine, primary })
}

/// What one pass saw.
struct Pass {
    secs: f64,
    ok: u64,
    failed: u64,
    duplicated: u64,
    fallback: u64,
    intact: bool,
}

/// `tasks` READs of 64 B, each into its own slot of `dst`.
fn pass(e: &Engine, tasks: u64) -> Result<Pass, String> {
    let bytes = tasks * OP;
    let src = e.allocate_memory(bytes).map_err(|e| e.to_string())?;
    let dst = e.allocate_memory(bytes).map_err(|e| e.to_string())?;
    let pattern: Vec<u8> = (0..bytes).map(|i| (i * 131 + (i >> 8)) as u8).collect();
    src.write(0, &pattern).map_err(|e| e.to_string())?;
    let mut seen = vec![0u8; tasks as usize];
    let mut ring = e.ring().map_err(|e| e.to_string())?;
    let (mut next, mut done) = (0u64, 0u64);
    let (mut ok, mut failed, mut duplicated, mut fallback) = (0, 0, 0, 0);
    let start = Instant::now();
    while done < tasks {
        let mut pushed = false;
        while next < tasks && (next - done) < IN_FLIGHT as u64 {
            let sqe = op::Read::new(
                LocalAddr::new(dst.id(), next * OP),
                RemoteAddr::new(SegmentId::LOCAL, src.addr() + next * OP),
                OP,
            )
            .user_data(next);
            if ring.submission().push(sqe).is_err() {
                break;
            }
            next += 1;
            pushed = true;
        }
        if pushed {
            ring.submit().map_err(|e| e.to_string())?;
        }
        let cqe = ring
            .wait_one(Duration::from_secs(30))
            .map_err(|e| format!("no completion for 30 s ({done} of {tasks} done): {e}"))?;
        let mut handle = |c: tent::Cqe| {
            let i = c.user_data() as usize;
            match seen.get_mut(i) {
                Some(s) if *s == 0 => *s = 1,
                _ => duplicated += 1,
            }
            match c.result() {
                Ok(_) => ok += 1,
                Err(_) => failed += 1,
            }
            if c.fallback() {
                fallback += 1;
            }
        };
        handle(cqe);
        done += 1;
        for c in ring.completion() {
            handle(c);
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut got = vec![0u8; bytes as usize];
    dst.read(0, &mut got).map_err(|e| e.to_string())?;
    Ok(Pass {
        secs,
        ok,
        failed,
        duplicated,
        fallback,
        intact: got == pattern && seen.iter().all(|&s| s == 1),
    })
}

pub(crate) fn soak(args: &Args) -> Result<(), String> {
    // Healthy path, failover armed vs off, alternating (noisy machines).
    let probe = (args.tasks / 2).clamp(10_000, 500_000);
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..5 {
        for (max, out) in [(3, &mut on), (0, &mut off)] {
            let r = rig(args, max, false)?;
            let p = pass(&r.engine, probe)?;
            if !p.intact || p.failed > 0 {
                return Err(format!(
                    "healthy pass {round} (max_failover {max}) lost data"
                ));
            }
            out.push(probe as f64 / p.secs);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (on, off) = (med(&mut on), med(&mut off));
    emit(&format!(
        "healthy path, {probe} x 64 B READs, median of 5 alternating runs: failover on {:.0} ops/s, off {:.0} ops/s, on/off {:.3}",
        on,
        off,
        on / off
    ));

    let r = rig(args, 3, true)?;
    let p = pass(&r.engine, args.tasks)?;
    let c = r.primary.counts();
    let m = r.engine.metrics();
    emit(&format!(
        "soak: tasks={} seed={} completion_faults={} submit_faults={}: ok={} failed={} lost={} duplicated={} fallback={} intact={} | primary: submitted={} rejected={} corrupted={} | failovers rdma->tcp={} exhausted={} | {:.2} s, {:.0} tasks/s",
        args.tasks,
        args.seed,
        args.completion_faults,
        args.submit_faults,
        p.ok,
        p.failed,
        args.tasks - (p.ok + p.failed).min(args.tasks),
        p.duplicated,
        p.fallback,
        p.intact,
        c.submitted,
        c.rejected,
        c.corrupted,
        m.failovers(TransportKind::Rdma, TransportKind::Tcp),
        m.exhausted_total(),
        p.secs,
        args.tasks as f64 / p.secs
    ));
    if !p.intact || p.failed > 0 || p.duplicated > 0 || p.ok != args.tasks {
        return Err("soak: a task was lost, duplicated or failed".into());
    }
    Ok(())
}
