//! What registering and unregistering memory costs against how much is
//! registered already: 1 000, 10 000 and 100 000 regions (a paged KV cache
//! registered block by block reaches the last). Per call, one at a time and
//! in batches of 1 000 (`register_memory_batch`, `unregister_memory_batch`),
//! with the ratio of the 100 000 figure to the 1 000 one measured in the same
//! run. A figure, not a timed test: `cargo bench --bench registration`.

#![allow(missing_docs)]

use std::time::Instant;

use tent::{Config, Engine, RegionId};

/// Bytes per registered block (the cost does not depend on it).
const BLOCK: usize = 64;
/// Calls timed at each size.
const CALLS: usize = 1_000;
/// Sizes of the table the calls are timed against.
const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn engine() -> Engine {
    let mut c = Config::default();
    c.rpc_server_hostname = "127.0.0.1".into();
    c.transports.shm.enable = false;
    c.transports.rdma.enable = false;
    Engine::new(c).expect("engine")
}

/// Per-call microseconds: (register, unregister, batch register, batch
/// unregister) with `n` regions registered.
fn measure(n: usize) -> [f64; 4] {
    let e = engine();
    let mut mem = vec![0u8; (n + 2 * CALLS) * BLOCK];
    let base = mem.as_mut_ptr();
    let block = |i: usize| (base.wrapping_add(i * BLOCK), BLOCK as u64);
    // SAFETY: every block lies in `mem`, which outlives the engine's use of it (unregistered or the engine dropped below, before `mem`).
    let held = unsafe { e.register_memory_batch(&(0..n).map(block).collect::<Vec<_>>()) }
        .expect("preregister");
    let mut ids: Vec<RegionId> = Vec::with_capacity(CALLS);
    let t = Instant::now();
    for i in n..n + CALLS {
        let (p, l) = block(i);
        // SAFETY: as above.
        ids.push(unsafe { e.register_memory(p, l) }.expect("register").id());
    }
    let reg = t.elapsed();
    let t = Instant::now();
    for id in ids.drain(..) {
        e.unregister_memory(id).expect("unregister");
    }
    let unreg = t.elapsed();
    let ranges: Vec<_> = (n + CALLS..n + 2 * CALLS).map(block).collect();
    let t = Instant::now();
    // SAFETY: as above.
    let batch = unsafe { e.register_memory_batch(&ranges) }.expect("batch register");
    let breg = t.elapsed();
    let ids: Vec<RegionId> = batch.iter().map(|b| b.id()).collect();
    let t = Instant::now();
    e.unregister_memory_batch(&ids).expect("batch unregister");
    let bunreg = t.elapsed();
    drop(held);
    drop(e);
    drop(mem);
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / CALLS as f64;
    [per(reg), per(unreg), per(breg), per(bunreg)]
}

fn main() {
    // `cargo test --benches` runs bench targets with no arguments but
    // `--bench` absent; only measure when asked to.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rows: Vec<(usize, [f64; 4])> = SIZES.iter().map(|&n| (n, measure(n))).collect();
    let out = std::io::stdout();
    let mut o = out.lock();
    use std::io::Write;
    let _ = writeln!(
        o,
        "regions registered | register us | unregister us | batch register us/region | batch unregister us/region"
    );
    for (n, r) in &rows {
        let _ = writeln!(
            o,
            "{n:>18} | {:>11.2} | {:>13.2} | {:>24.3} | {:>26.3}",
            r[0], r[1], r[2], r[3]
        );
    }
    let (first, last) = (rows[0].1, rows[rows.len() - 1].1);
    let _ = writeln!(
        o,
        "100 000 / 1 000 (want <= 2.0): register {:.2}, unregister {:.2}, batch register {:.2}, batch unregister {:.2}",
        last[0] / first[0],
        last[1] / first[1],
        last[2] / first[2],
        last[3] / first[3]
    );
}
