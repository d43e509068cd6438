//! `--mode blocks`: a paged KV cache's transfer as one block-list call.
//!
//! `--blocks` blocks of `--block-size` (default 10 000 of 16 KiB) WRITTEN
//! into a target process over shm with `Engine::submit_blocks`, the remote
//! pages in a scattered order (a KV cache's pages are not contiguous, so
//! nothing merges) and then in order (everything merges into one request).
//! Reports the time inside the submit call (median and worst of `--reps`)
//! and the end-to-end rate, next to one request of the same total bytes.

use std::time::{Duration, Instant};

use tent::{BlockList, Engine, LocalAddr, Opcode, Priority, RemoteAddr, TaskState, op};

use crate::{Args, TransportArg};

/// A permutation of `0..n` from a fixed seed (xorshift; the bench wants
/// the same scatter every run, not randomness).
fn scatter(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

struct Round {
    submit: Duration,
    total: Duration,
    tasks: usize,
}

fn wait_done(engine: &Engine, batch: tent::BatchId) -> Result<(), String> {
    let s = engine
        .wait_batch(batch, Duration::from_secs(60))
        .map_err(|e| e.to_string())?;
    if s.state != TaskState::Completed {
        return Err(format!("batch ended {:?} ({:?})", s.state, s.error));
    }
    engine.free_batch(batch).map_err(|e| e.to_string())
}

pub(crate) fn blocks(args: &Args) -> Result<(), String> {
    let block = args.block_size.unwrap_or(16 << 10);
    let n = args.blocks;
    let total = block
        .checked_mul(n as u64)
        .ok_or("--blocks x --block-size overflows")?;
    let (mut child, name) = crate::spawn_target(TransportArg::Shm, total)?;
    let result = (|| {
        let mut cfg = tent::Config::load().map_err(|e| e.to_string())?;
        cfg.workers.count = 1;
        cfg.max_batch_size = cfg.max_batch_size.max(n as u32);
        let engine = crate::engine(args, cfg)?;
        let seg = engine.open_segment(&name).map_err(|e| e.to_string())?;
        let remote = engine
            .segment_regions(seg)
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|r| r.len >= total)
            .ok_or("the target exports no region that large")?
            .addr;
        let src = engine.allocate_memory(total).map_err(|e| e.to_string())?;
        src.write(0, &vec![0x5a; total as usize])
            .map_err(|e| e.to_string())?;
        let local: Vec<u64> = (0..n as u64).map(|i| src.addr() + i * block).collect();
        let order = scatter(n);
        let scattered: Vec<u64> = order.iter().map(|&p| remote + p as u64 * block).collect();
        let in_order: Vec<u64> = (0..n as u64).map(|i| remote + i * block).collect();

        let run = |remote_addrs: &[u64]| -> Result<Round, String> {
            let batch = engine.allocate_batch(n).map_err(|e| e.to_string())?;
            let list = BlockList {
                opcode: Opcode::Write,
                segment: seg,
                block_len: block,
                local_addrs: &local,
                remote_addrs,
                priority: Priority::High,
            };
            let t0 = Instant::now();
            let tasks = engine
                .submit_blocks(batch, &list)
                .map_err(|e| e.to_string())?;
            let submit = t0.elapsed();
            wait_done(&engine, batch)?;
            Ok(Round {
                submit,
                total: t0.elapsed(),
                tasks,
            })
        };
        let one = || -> Result<Round, String> {
            let batch = engine.allocate_batch(1).map_err(|e| e.to_string())?;
            let req = op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, remote),
                total,
            )
            .build();
            let t0 = Instant::now();
            engine.submit(batch, &[req]).map_err(|e| e.to_string())?;
            let submit = t0.elapsed();
            wait_done(&engine, batch)?;
            Ok(Round {
                submit,
                total: t0.elapsed(),
                tasks: 1,
            })
        };
        // Warm: the target's pages are faulted in by the first pass.
        one()?;
        let reps = args.reps.max(1);
        let report = |label: &str, f: &dyn Fn() -> Result<Round, String>| {
            let mut rounds: Vec<Round> = (0..reps).map(|_| f()).collect::<Result<_, _>>()?;
            rounds.sort_by_key(|r| r.submit);
            let med = &rounds[rounds.len() / 2];
            let worst = rounds.last().map_or(Duration::ZERO, |r| r.submit);
            let mut totals: Vec<Duration> = rounds.iter().map(|r| r.total).collect();
            totals.sort();
            let t = totals[totals.len() / 2];
            let gbps = total as f64 / t.as_secs_f64() / 1e9;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"mode": "blocks", "case": label, "blocks": n, "block_size": block,
                        "tasks": med.tasks, "submit_ms_median": med.submit.as_secs_f64() * 1e3,
                        "submit_ms_worst": worst.as_secs_f64() * 1e3, "gbps": gbps})
                );
            } else {
                println!(
                    "{label:<26} tasks {:>6}   submit call: median {:>7.3} ms, worst {:>7.3} ms   end to end {:>6.2} GB/s",
                    med.tasks,
                    med.submit.as_secs_f64() * 1e3,
                    worst.as_secs_f64() * 1e3,
                    gbps
                );
            }
            Ok::<f64, String>(gbps)
        };
        println!(
            "# tent-bench blocks: {n} blocks of {block} B over shm ({:.1} MiB), {reps} reps each",
            total as f64 / (1 << 20) as f64
        );
        let g_scattered = report("block list, scattered", &|| run(&scattered))?;
        let g_in_order = report("block list, contiguous", &|| run(&in_order))?;
        let g_one = report("one request, same bytes", &one)?;
        // What the memory itself does with the same scatter: memcpy from
        // the same source into a private buffer, block by block in the
        // list's order, and as one copy.
        let mut dst = vec![0u8; total as usize];
        // SAFETY: `src` is `total` bytes of this engine's memory, alive here.
        let from = unsafe { std::slice::from_raw_parts(src.addr() as *const u8, total as usize) };
        let copy = |scatter: bool, dst: &mut [u8]| {
            let t0 = Instant::now();
            if scatter {
                let b = block as usize;
                for (i, &p) in order.iter().enumerate() {
                    dst[p * b..(p + 1) * b].copy_from_slice(&from[i * b..(i + 1) * b]);
                }
            } else {
                dst.copy_from_slice(from);
            }
            std::hint::black_box(&dst);
            t0.elapsed()
        };
        let median_gbps = |scatter: bool, dst: &mut [u8]| {
            let mut t: Vec<Duration> = (0..reps).map(|_| copy(scatter, dst)).collect();
            t.sort();
            total as f64 / t[t.len() / 2].as_secs_f64() / 1e9
        };
        let m_scattered = median_gbps(true, &mut dst);
        let m_one = median_gbps(false, &mut dst);
        if args.json {
            println!(
                "{}",
                serde_json::json!({"mode": "blocks", "case": "memcpy", "scattered_gbps": m_scattered,
                    "contiguous_gbps": m_one})
            );
        } else {
            println!(
                "{:<26} scattered {m_scattered:.2} GB/s, one copy {m_one:.2} GB/s (this thread, no engine)",
                "memcpy, same blocks"
            );
        }
        println!(
            "# end to end vs one request: scattered {:.2}x, contiguous {:.2}x; memcpy's own scattered vs one copy {:.2}x",
            g_scattered / g_one,
            g_in_order / g_one,
            m_scattered / m_one
        );
        Ok(())
    })();
    drop(child.stdin.take());
    let _ = child.wait();
    result
}
