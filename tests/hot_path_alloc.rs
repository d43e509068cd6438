//! The hot path allocates nothing: 100 k ring ops after warm-up, over the
//! local, shm and tcp transports, under a counting global allocator.
//! (One test per binary: the counter is process-wide.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use tent::{Engine, LocalAddr, Priority, RemoteAddr, Ring, SegmentId, op};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Even ops are HIGH, odd ones MEDIUM. A TCP peer's connections open on
/// first use: MEDIUM slices go round-robin over the bulk connections and a
/// HIGH slice to the least-loaded one, the express connection first on a
/// tie. With HIGH alone, a bulk connection that load never made the least
/// loaded during warm-up could open (connect, accept, a server thread)
/// inside the measured window; with the mix, the first five ops of the
/// warm-up open every connection, and every one stays in use.
fn priority(i: u64) -> Priority {
    if i % 2 == 0 {
        Priority::High
    } else {
        Priority::Medium
    }
}

fn run(ring: &mut Ring, src: tent::RegionId, seg: SegmentId, dst: u64, ops: u64) {
    let mut sent = 0;
    let mut done = 0;
    while done < ops {
        {
            let mut sq = ring.submission();
            while sent < ops && sent - done < 32 {
                let off = (sent % 64) * 8;
                if sq
                    .push(
                        op::Write::new(
                            LocalAddr::new(src, off),
                            RemoteAddr::new(seg, dst + off),
                            8,
                        )
                        .priority(priority(sent))
                        .user_data(sent),
                    )
                    .is_err()
                {
                    break;
                }
                sent += 1;
            }
        }
        for c in ring.completion() {
            assert!(c.result().is_ok());
            done += 1;
        }
    }
}

/// Allocations during 100k ops, issued inline (`inline`) or by the worker.
fn measure(e: &Engine, seg: SegmentId, dst: u64, inline: bool) -> u64 {
    let src = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring_with_depth(64).unwrap();
    ring.set_inline(inline);
    run(&mut ring, src.id(), seg, dst, 20_000); // warm-up
    let before = ALLOCS.load(Ordering::Relaxed);
    run(&mut ring, src.id(), seg, dst, 100_000);
    ALLOCS.load(Ordering::Relaxed) - before
}

/// A config whose shm sockets live in a directory of this test's own: other
/// processes' engines sweep their shm directory for stale sockets by
/// connecting to each (`collect_stale`), and the handshake that such a
/// probe costs our handout server would be counted here.
fn config() -> tent::Config {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("tent-hot-path-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.to_str().unwrap().to_owned()
    });
    let mut c = common::test_config();
    c.transports.shm.dir = dir.clone();
    c
}

fn engine() -> Engine {
    Engine::new(config()).unwrap()
}

#[test]
fn zero_allocations_on_the_hot_path() {
    let e = engine();
    let local_dst = e.allocate_memory(4096).unwrap();
    let local = measure(&e, SegmentId::LOCAL, local_dst.addr(), false);
    let local_inline = measure(&e, SegmentId::LOCAL, local_dst.addr(), true);

    let target = engine();
    let remote = target.allocate_memory(4096).unwrap();
    let seg = e
        .open_segment(target.local_segment_name().unwrap())
        .unwrap();
    let shm = measure(&e, seg, remote.addr(), false);
    let shm_inline = measure(&e, seg, remote.addr(), true);

    // TCP: worker post and reap, the connection threads, and the target's
    // data server (all in this process, all counted).
    let mut c = config();
    c.transports.shm.enable = false;
    let over_tcp = Engine::new(c).unwrap();
    let seg = over_tcp.open_segment(&target.segment_name()).unwrap();
    let tcp = measure(&over_tcp, seg, remote.addr(), true);
    assert_eq!(
        (local, local_inline, shm, shm_inline, tcp),
        (0, 0, 0, 0, 0),
        "allocations during 100k ops (local by the worker, local inline, shm by the worker, shm inline, tcp)"
    );
    let _ = std::fs::remove_dir_all(&config().transports.shm.dir);
}
