//! The cost of rail health on the healthy completion path: what a TCP or
//! RDMA slice pays per post and per completion with the `RailMonitor`
//! (gate, pause check), next to the one bytes counter the transports kept
//! before it; and what the `DeviceSelector` costs per slice
//! (`Spray::pick` + `posted` + `left` + `observed`) over 8 rails, smart vs
//! round robin, for a stream of 64-slice requests and of 1-slice requests.

// criterion_group! defines an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use tent::transport::rails::{
    DeviceSelector, RailMonitor, RailPolicy, RailSpec, SelectorConfig, Spray, Tiers,
};

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

/// Bytes per slice.
const SLICE: u64 = 65_536;
/// Slices in flight per worker in the selector bench: each pick completes
/// the slice posted this many picks before it.
const IN_FLIGHT: usize = 16;

fn selector(c: &mut Criterion) {
    let mut g = c.benchmark_group("selector");
    // Two NUMA tiers of four rails; the remote ones complete half as fast.
    let tiers = [0, 0, 0, 0, 1, 1, 1, 1];
    let slice_ns = [1_300, 1_300, 1_300, 1_300, 2_600, 2_600, 2_600, 2_600];
    let up = [true; 8];
    for (mode, smart) in [("smart", true), ("round_robin", false)] {
        let sel = DeviceSelector::new(SelectorConfig {
            smart,
            ..SelectorConfig::default()
        });
        // Deep enough that the late-binding check runs and never waits.
        let specs = [RailSpec {
            theoretical_bps: sel.config().theoretical_bps(None),
            depth: IN_FLIGHT as u32,
        }; 8];
        for slices in [64u64, 1] {
            let mut sp = Spray::new(&sel, &specs, &Tiers::of_worker(&tiers), 1);
            let (mut token, mut left) = (0u64, 0u64);
            // (rail, slices ahead of it) of the slices in flight.
            let mut flight = [(0usize, 0u32); IN_FLIGHT];
            let mut head = 0;
            let id = format!("{mode}: next+posted+left+observed, {slices}-slice requests");
            g.bench_function(id, |b| {
                b.iter(|| {
                    if left == 0 {
                        token += 1;
                        left = slices;
                    }
                    let r = sp
                        .next(&sel, None, token, left, SLICE, |r| black_box(up[r]))
                        .unwrap_or(0);
                    left -= 1;
                    let ahead = sp.posted(r, SLICE);
                    let (done, done_ahead) = std::mem::replace(&mut flight[head], (r, ahead));
                    head = (head + 1) % IN_FLIGHT;
                    sp.left(done, SLICE);
                    let elapsed = slice_ns[done] * (u64::from(done_ahead) + 1);
                    sp.observed(&sel, done, SLICE, black_box(elapsed), done_ahead);
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, healthy_path, selector);
criterion_main!(benches);
