//! Engine latency: one 8 B WRITE, submit -> CQE, over `local` (in-process)
//! and `shm` (into a separate target process), beside a cross-core
//! cache-line ping-pong round trip as the floor.
//!
//! The worker is pinned to one core and this thread to another. The shm
//! target is this bench binary re-run with `TENT_BENCH_TARGET=1`.

// criterion_group! defines an undocumented public function.
#![allow(missing_docs)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use tent::{Config, Engine, LocalAddr, RemoteAddr, Ring, SegmentId, op};

fn cores() -> (Option<usize>, Option<usize>) {
    let ids: Vec<usize> = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect();
    match ids.len() {
        0 => (None, None),
        1 => (Some(ids[0]), Some(ids[0])),
        n => (Some(ids[0]), Some(ids[n - 1])),
    }
}

fn engine(worker_core: Option<usize>) -> Engine {
    let mut c = Config::default();
    c.workers.count = 1;
    c.workers.pin = worker_core.is_some();
    c.workers.cores = worker_core.into_iter().collect();
    Engine::new(c).expect("engine")
}

fn one_op(ring: &mut Ring, src: tent::RegionId, seg: SegmentId, dst: u64) {
    ring.submission()
        .push(op::Write::new(
            LocalAddr::new(src, 0),
            RemoteAddr::new(seg, dst),
            8,
        ))
        .expect("room");
    loop {
        if let Some(c) = ring.completion().next() {
            assert!(c.result().is_ok());
            return;
        }
        std::hint::spin_loop();
    }
}

fn bench_engine(c: &mut Criterion) {
    let (app, worker) = cores();
    if let Some(a) = app {
        core_affinity::set_for_current(core_affinity::CoreId { id: a });
    }
    let mut g = c.benchmark_group("submit_to_cqe_8B");

    let e = engine(worker);
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring_with_depth(64).unwrap();
    g.bench_function("local", |b| {
        b.iter(|| one_op(&mut ring, src.id(), SegmentId::LOCAL, dst.addr()))
    });

    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("TENT_BENCH_TARGET", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn target");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut it = line.split_whitespace();
    let (name, addr): (String, u64) = (
        it.next().unwrap().into(),
        it.next().unwrap().parse().unwrap(),
    );
    let seg = e.open_segment(&name).unwrap();
    g.bench_function("shm_other_process", |b| {
        b.iter(|| one_op(&mut ring, src.id(), seg, addr))
    });

    let flag = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let (f2, s2) = (flag.clone(), stop.clone());
    let echo = std::thread::spawn(move || {
        if let Some(w) = worker {
            core_affinity::set_for_current(core_affinity::CoreId { id: w });
        }
        let mut expect = 1;
        while s2.load(Ordering::Relaxed) == 0 {
            if f2.load(Ordering::Acquire) == expect {
                f2.store(expect + 1, Ordering::Release);
                expect += 2;
            }
            std::hint::spin_loop();
        }
    });
    drop(e);
    let mut v = 0u64;
    g.bench_function("ping_pong_baseline", |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                flag.store(v + 1, Ordering::Release);
                while flag.load(Ordering::Acquire) != v + 2 {
                    std::hint::spin_loop();
                }
                v += 2;
            }
            t.elapsed()
        })
    });
    stop.store(1, Ordering::Relaxed);
    echo.join().unwrap();
    g.finish();
    drop(child.stdin.take());
    let _ = child.wait();
}

fn target() {
    let mut c = Config::default();
    c.workers.pin = false;
    let e = Engine::new(c).expect("engine");
    let buf = e.allocate_memory(4096).unwrap();
    println!("{} {}", e.local_segment_name().unwrap(), buf.addr());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench_engine
}

fn main() {
    if std::env::var_os("TENT_BENCH_TARGET").is_some() {
        target();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
