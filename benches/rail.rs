//! The cost of rail health on the healthy completion path: what a TCP or
//! RDMA slice pays per post and per completion with the `RailMonitor`
//! (gate, pause check), next to the one bytes counter the transports kept
//! before it.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use tent::transport::rails::{RailMonitor, RailPolicy};

fn healthy_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("rail_healthy_slice");
    let m = RailMonitor::new(RailPolicy::default(), "mlx5_0", "mlx5_1");
    g.bench_function("monitor: available + mark_recovered", |b| {
        b.iter(|| {
            if black_box(&m).available() {
                m.mark_recovered(black_box(1_000), black_box(21_000));
            }
        })
    });
    let bytes = AtomicU64::new(0);
    g.bench_function("baseline: bytes counter only", |b| {
        b.iter(|| {
            black_box(&bytes).fetch_add(black_box(65_536), Ordering::Relaxed);
        })
    });
    g.finish();
}

criterion_group!(benches, healthy_path);
criterion_main!(benches);
