//! Entries per second through `tent_rings::spsc` versus rtrb's chunk API,
//! 64-byte entries, producer and consumer pinned to different cores.
//!
//! Both rings move data the same way: the producer copies a batch in and
//! publishes it once, the consumer copies up to a batch out and releases the
//! slots once. Each measurement spawns the consumer, moves `iters * batch`
//! entries and times from the first push to the consumer's exit.

// criterion_group! defines an undocumented public function.
#![allow(missing_docs)]

use std::hint::{black_box, spin_loop};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use core_affinity::CoreId;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tent_rings::entry::Sqe;
use tent_rings::spsc;

const CAPACITY: usize = 4096;
const BATCHES: [usize; 2] = [32, 256];

#[derive(Clone, Copy)]
struct Cores {
    producer: Option<CoreId>,
    consumer: Option<CoreId>,
}

impl Cores {
    fn detect() -> Cores {
        match core_affinity::get_core_ids() {
            Some(ids) if ids.len() >= 2 => Cores {
                producer: Some(ids[0]),
                consumer: Some(ids[1]),
            },
            _ => Cores {
                producer: None,
                consumer: None,
            },
        }
    }
}

fn pin(core: Option<CoreId>) {
    if let Some(core) = core {
        core_affinity::set_for_current(core);
    }
}

/// One batch of distinct entries for the producer to copy in.
fn source(batch: usize) -> Vec<Sqe> {
    (0..batch as u64)
        .map(|i| Sqe::zeroed().with_user_data(i))
        .collect()
}

/// Start a consumer thread pinned to `core`; it runs `body` once both sides
/// are ready.
fn spawn_consumer<F>(core: Option<CoreId>, ready: &Arc<Barrier>, body: F) -> thread::JoinHandle<()>
where
    F: FnOnce() + Send + 'static,
{
    let ready = Arc::clone(ready);
    thread::spawn(move || {
        pin(core);
        ready.wait();
        body();
    })
}

fn tent(iters: u64, batch: usize, cores: Cores) -> Duration {
    let total = iters * batch as u64;
    let (mut tx, mut rx) = spsc::channel::<Sqe>(CAPACITY as u32).expect("ring");
    let ready = Arc::new(Barrier::new(2));
    let consumer = spawn_consumer(cores.consumer, &ready, move || {
        let mut buf = vec![Sqe::zeroed(); batch];
        let mut got = 0u64;
        let mut sum = 0u64;
        while got < total {
            let n = rx.pop_into(&mut buf);
            if n == 0 {
                spin_loop();
                continue;
            }
            for e in &buf[..n] {
                sum = sum.wrapping_add(e.user_data());
            }
            rx.sync();
            got += n as u64;
        }
        black_box(sum);
    });
    let src = source(batch);
    ready.wait();
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let want = (total - sent).min(batch as u64) as usize;
        let n = tx.push_slice(&src[..want]);
        if n == 0 {
            spin_loop();
            continue;
        }
        tx.sync();
        sent += n as u64;
    }
    consumer.join().expect("consumer");
    start.elapsed()
}

fn rtrb(iters: u64, batch: usize, cores: Cores) -> Duration {
    let total = iters * batch as u64;
    let (mut tx, mut rx) = rtrb::RingBuffer::<Sqe>::new(CAPACITY);
    let ready = Arc::new(Barrier::new(2));
    let consumer = spawn_consumer(cores.consumer, &ready, move || {
        let mut buf = vec![Sqe::zeroed(); batch];
        let mut got = 0u64;
        let mut sum = 0u64;
        while got < total {
            let n = rx.slots().min(batch);
            if n == 0 {
                spin_loop();
                continue;
            }
            let chunk = rx.read_chunk(n).expect("slots() said so");
            let (a, b) = chunk.as_slices();
            buf[..a.len()].copy_from_slice(a);
            buf[a.len()..n].copy_from_slice(b);
            chunk.commit_all();
            for e in &buf[..n] {
                sum = sum.wrapping_add(e.user_data());
            }
            got += n as u64;
        }
        black_box(sum);
    });
    let src = source(batch);
    ready.wait();
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let want = (total - sent).min(batch as u64) as usize;
        let n = tx.slots().min(want);
        if n == 0 {
            spin_loop();
            continue;
        }
        let chunk = tx.write_chunk_uninit(n).expect("slots() said so");
        chunk.fill_from_iter(src[..n].iter().copied());
        sent += n as u64;
    }
    consumer.join().expect("consumer");
    start.elapsed()
}

fn ring_64b(c: &mut Criterion) {
    let cores = Cores::detect();
    // The measuring thread is the producer.
    pin(cores.producer);
    let mut group = c.benchmark_group("ring_64B");
    for batch in BATCHES {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_with_input(BenchmarkId::new("tent", batch), &batch, |b, &batch| {
            b.iter_custom(|iters| tent(iters, batch, cores))
        });
        group.bench_with_input(BenchmarkId::new("rtrb", batch), &batch, |b, &batch| {
            b.iter_custom(|iters| rtrb(iters, batch, cores))
        });
    }
    group.finish();
}

criterion_group!(benches, ring_64b);
criterion_main!(benches);
