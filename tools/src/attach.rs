//! `--mode attach`: the same small WRITEs from a process that embeds an
//! engine and from one attached to a daemon (`tent::daemon`), to one shm
//! target, in one run: `--block-size` (default 8 B) at one op in flight
//! (latency) and at `--batch` in flight (rate). The embedded engine runs
//! with inline issue off, as an attached client has none: the comparison
//! is of the rings and the worker, not of who copies.

use std::time::{Duration, Instant};

use tent::daemon::Daemon;
use tent::{Cqe, Engine, LocalAddr, RemoteAddr, Ring, SegmentId, Sqe, op};

use crate::{Args, TransportArg};

/// Push, submit, reap what is ready (slots handed back once per batch):
/// the same calls on both sides, the ring being the same type.
trait Side {
    fn push(&mut self, sqe: Sqe) -> bool;
    fn submit_now(&mut self);
    fn reap(&mut self, f: &mut dyn FnMut(Cqe)) -> usize;
}

impl Side for Ring {
    fn push(&mut self, sqe: Sqe) -> bool {
        self.submission().push(sqe).is_ok()
    }
    fn submit_now(&mut self) {
        let _ = Ring::submit(self);
    }
    fn reap(&mut self, f: &mut dyn FnMut(Cqe)) -> usize {
        let mut n = 0;
        for c in self.completion() {
            f(c);
            n += 1;
        }
        n
    }
}

/// Ops per second with `depth` in flight, and the p50 of submit to
/// completion (µs) measured at one in flight.
struct Figures {
    p50_us: f64,
    mops: f64,
}

fn measure(side: &mut Ring, sqe: Sqe, depth: usize, secs: f64) -> Result<Figures, String> {
    // Latency: one in flight, each op timed.
    let mut lat = Vec::with_capacity(1 << 20);
    let end = Instant::now() + Duration::from_secs_f64(secs / 2.0);
    while Instant::now() < end {
        let t0 = Instant::now();
        if !side.push(sqe) {
            return Err("ring full at one in flight".into());
        }
        side.submit_now();
        let mut res = Ok(0);
        while side.reap(&mut |c| res = c.result()) == 0 {}
        lat.push(t0.elapsed());
        res.map_err(|e| format!("op failed: {e:?}"))?;
    }
    lat.sort();
    let p50_us = lat[lat.len() / 2].as_secs_f64() * 1e6;
    // Rate: `depth` in flight, each slot refilled as its CQE arrives.
    for _ in 0..depth {
        if !side.push(sqe) {
            return Err("ring shallower than --batch".into());
        }
    }
    side.submit_now();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs / 2.0);
    let mut done = 0u64;
    let mut failed = None;
    while Instant::now() < end {
        let got = side.reap(&mut |c| {
            if let Err(e) = c.result() {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            return Err(format!("op failed: {e:?}"));
        }
        for _ in 0..got {
            side.push(sqe);
        }
        if got > 0 {
            side.submit_now();
        }
        done += got as u64;
    }
    let mops = done as f64 / start.elapsed().as_secs_f64() / 1e6;
    // Drain what is still in flight.
    let mut left = depth;
    let drain = Instant::now();
    while left > 0 && drain.elapsed() < Duration::from_secs(10) {
        left = left.saturating_sub(side.reap(&mut |_| {}));
    }
    Ok(Figures { p50_us, mops })
}

pub(crate) fn attach(args: &Args) -> Result<(), String> {
    let size = args.block_size.unwrap_or(8);
    let depth = args.batch.max(1);
    let secs = args.duration.max(0.5);
    let (mut child, name) = crate::spawn_target(TransportArg::Shm, size.max(4096))?;
    let result = (|| {
        let mut cfg = tent::Config::load().map_err(|e| e.to_string())?;
        // Both engines this mode compares are its own.
        cfg.daemon_socket.clear();
        cfg.workers.count = 1;
        cfg.inline_max_bytes = 0;
        let depth_ring = (depth as u32).next_power_of_two().max(64);
        // Embedded.
        let embedded = {
            let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
            pin_apart(&engine);
            let seg = engine.open_segment(&name).map_err(|e| e.to_string())?;
            let remote = remote_addr(&engine, seg)?;
            let src = engine.allocate_memory(size).map_err(|e| e.to_string())?;
            let mut ring = engine
                .ring_with_depth(depth_ring)
                .map_err(|e| e.to_string())?;
            let sqe = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, remote),
                size,
            )
            .build();
            measure(&mut ring, sqe, depth, secs)?
        };
        // Attached: the same configuration in a daemon, this process its client.
        let attached = {
            let sock =
                std::env::temp_dir().join(format!("tent-bench-attach-{}.sock", std::process::id()));
            let daemon = Daemon::start(Engine::new(cfg).map_err(|e| e.to_string())?, &sock)
                .map_err(|e| e.to_string())?;
            pin_apart(daemon.engine());
            let client = Engine::attach(&sock).map_err(|e| e.to_string())?;
            let seg = client.open_segment(&name).map_err(|e| e.to_string())?;
            let remote = {
                let s = daemon
                    .engine()
                    .open_segment(&name)
                    .map_err(|e| e.to_string())?;
                remote_addr(daemon.engine(), s)?
            };
            let src = client.allocate_memory(size).map_err(|e| e.to_string())?;
            let mut ring = client
                .ring_with_depth(depth_ring)
                .map_err(|e| e.to_string())?;
            let sqe = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, remote),
                size,
            )
            .build();
            let f = measure(&mut ring, sqe, depth, secs)?;
            drop(ring);
            drop(client);
            drop(daemon);
            f
        };
        println!(
            "# tent-bench attach: {size} B shm WRITE, embedded engine (inline issue off) vs a client attached to a daemon, same run"
        );
        for (label, f) in [("embedded", &embedded), ("attached", &attached)] {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"mode": "attach", "case": label, "block_size": size, "batch": depth,
                        "p50_us": f.p50_us, "mops": f.mops})
                );
            } else {
                println!(
                    "{label:<9} 1 in flight p50 {:>7.3} us   {depth} in flight {:>7.2} M ops/s",
                    f.p50_us, f.mops
                );
            }
        }
        println!(
            "# attached / embedded: p50 {:.2}x, rate {:.2}x",
            attached.p50_us / embedded.p50_us,
            attached.mops / embedded.mops
        );
        Ok(())
    })();
    drop(child.stdin.take());
    let _ = child.wait();
    result
}

/// Pin this thread to a core no worker of `engine` is on, as the default
/// sweep pins its submitting threads (on two cores, sharing the worker's
/// core costs 4x).
fn pin_apart(engine: &Engine) {
    let taken = engine.worker_cores();
    let free = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .find(|c| !taken.contains(&Some(c.id)));
    if let Some(c) = free {
        core_affinity::set_for_current(c);
    }
}

/// The target's exported buffer in segment `seg`.
fn remote_addr(engine: &Engine, seg: SegmentId) -> Result<u64, String> {
    engine
        .segment_regions(seg)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|r| r.addr)
        .next()
        .ok_or_else(|| "the target exports no region".into())
}
