//! Baselines measured in the same run as the engine: what the hardware does
//! without tent, so results read as ratios on a noisy machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::hist::Histogram;

/// A zeroed, page-aligned heap buffer: the baseline's buffers sit as the
/// engine's do (its memory is mmapped, page-aligned). Two `Vec<u8>`s from
/// the allocator can sit 16 bytes past a page multiple from each other,
/// which sends glibc's `rep movsb` copy into a slow case (2–3 GB/s at 4–32
/// KiB instead of 50–80): the printed tent/memcpy ratio was flattering.
struct PageBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl PageBuf {
    fn new(len: usize) -> PageBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).expect("buffer layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        PageBuf { ptr, layout }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` initialised (zeroed) bytes, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Single-thread memcpy of `size` bytes between page-aligned buffers,
/// GB/s, over about `dur`. `slots` > 1: each copy takes the next of that
/// many `size`-byte blocks on both sides, as a benchmark point with
/// `slots` ops in flight does (its data then lives in L2 or further, not
/// in L1 as one block copied over and over does).
pub(crate) fn memcpy_gbps(size: u64, slots: usize, dur: Duration) -> f64 {
    let size = size as usize;
    let slots = slots.max(1);
    let span = size * slots;
    let (mut a, mut b) = (PageBuf::new(span), PageBuf::new(span));
    let src: &[u8] = {
        let s = a.as_mut();
        s.fill(0x5a);
        s
    };
    let dst = b.as_mut();
    // Warm both buffers (page faults are not memcpy's cost).
    dst.copy_from_slice(src);
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut k = 0;
    while start.elapsed() < dur {
        for _ in 0..16 {
            let at = k * size;
            dst[at..at + size].copy_from_slice(std::hint::black_box(&src[at..at + size]));
            k = if k + 1 == slots { 0 } else { k + 1 };
            bytes += size as u64;
        }
        std::hint::black_box(&mut *dst);
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Cross-core cache-line ping-pong round trip between `a` and `b`.
pub(crate) fn ping_pong(a: Option<usize>, b: Option<usize>, dur: Duration) -> Histogram {
    let flag = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let (f2, s2) = (flag.clone(), stop.clone());
    let echo = std::thread::spawn(move || {
        if let Some(c) = b {
            core_affinity::set_for_current(core_affinity::CoreId { id: c });
        }
        let mut expect = 1;
        while s2.load(Ordering::Relaxed) == 0 {
            if f2.load(Ordering::Acquire) == expect {
                f2.store(expect + 1, Ordering::Release);
                expect += 2;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    if let Some(c) = a {
        core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
    let mut h = Histogram::new();
    let start = Instant::now();
    let mut v = 0u64;
    while start.elapsed() < dur {
        let t0 = Instant::now();
        flag.store(v + 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != v + 2 {
            std::hint::spin_loop();
        }
        h.record(t0.elapsed().as_nanos() as u64);
        v += 2;
    }
    stop.store(1, Ordering::Relaxed);
    let _ = echo.join();
    h
}

/// Plain TCP streaming over loopback with `conns` connections and
/// `size`-byte writes (an iperf3-like floor for the tcp transport), in GB/s.
pub(crate) fn tcp_stream_gbps(size: u64, conns: usize, dur: Duration) -> f64 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
        return 0.0;
    };
    let Ok(addr) = listener.local_addr() else {
        return 0.0;
    };
    let chunk = size.clamp(4096, 4 << 20) as usize;
    let writers: Vec<_> = (0..conns)
        .map(|_| {
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    return;
                };
                let _ = s.set_nodelay(true);
                let buf = vec![0xa5u8; chunk];
                let start = Instant::now();
                while start.elapsed() < dur {
                    if s.write_all(&buf).is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    let start = Instant::now();
    let readers: Vec<_> = (0..conns)
        .filter_map(|_| listener.accept().ok())
        .map(|(mut s, _)| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; chunk];
                let mut total = 0u64;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                total
            })
        })
        .collect();
    for w in writers {
        let _ = w.join();
    }
    let bytes: u64 = readers.into_iter().map(|r| r.join().unwrap_or(0)).sum();
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The rings alone: `batch` 8 B WRITE SQEs kept in flight from this thread
/// (on `app`) to an echo thread (on `worker`) that answers each with a CQE
/// through a completion ring, as the engine's worker does but with no
/// engine work between; the application refills as CQEs arrive, as
/// tent-bench's points do. Both sides publish every `PUBLISH_EVERY`
/// entries rather than once per pass, so the two cores overlap instead of
/// taking turns: at 32 in flight this moves the rings alone from 16-19 to
/// 24-27 M round trips/s here, and it is the best these rings do, hence the
/// honest floor. M round trips a second: the floor for small ops with a
/// CQE each between these two cores.
pub(crate) fn ring_round_trip_mops(
    batch: usize,
    app: Option<usize>,
    worker: Option<usize>,
    dur: Duration,
) -> f64 {
    use tent_rings::spsc;
    use tent_rings::{Cqe, LocalAddr, RemoteAddr, SegmentId, Sqe, op};
    const PUBLISH_EVERY: usize = 4;
    let depth = (batch * 2).max(64).next_power_of_two() as u32;
    let (mut sq, mut sq_rx) = spsc::channel::<Sqe>(depth).expect("ring depth");
    let (mut cq_tx, mut cq) = spsc::channel::<Cqe>(depth).expect("ring depth");
    let stop = Arc::new(AtomicU64::new(0));
    let s2 = stop.clone();
    let echo = std::thread::spawn(move || {
        if let Some(c) = worker {
            core_affinity::set_for_current(core_affinity::CoreId { id: c });
        }
        while s2.load(Ordering::Relaxed) == 0 {
            let mut n = 0;
            while let Some(sqe) = sq_rx.pop() {
                // The CQ has room: at most `batch` are in flight.
                let _ = cq_tx.push(Cqe::new(sqe.user_data(), Ok(sqe.len())));
                n += 1;
                if n % PUBLISH_EVERY == 0 {
                    cq_tx.sync();
                    sq_rx.sync();
                }
            }
            if n > 0 {
                sq_rx.sync();
                cq_tx.sync();
            } else {
                std::hint::spin_loop();
            }
        }
    });
    if let Some(c) = app {
        core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
    let sqe = op::Write::new(
        LocalAddr::new(tent_rings::RegionId(1), 0),
        RemoteAddr::new(SegmentId::LOCAL, 0x1000),
        8,
    )
    .build();
    let (mut in_flight, mut done) = (0usize, 0u64);
    let start = Instant::now();
    while start.elapsed() < dur {
        for _ in 0..64 {
            while in_flight < batch && sq.push(sqe).is_ok() {
                in_flight += 1;
                if sq.pending() == PUBLISH_EVERY {
                    sq.sync();
                }
            }
            sq.sync();
            let mut reaped = 0;
            while let Some(c) = cq.pop() {
                std::hint::black_box(c);
                reaped += 1;
            }
            if reaped > 0 {
                cq.sync();
                in_flight -= reaped;
                done += reaped as u64;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(1, Ordering::Relaxed);
    let _ = echo.join();
    done as f64 / secs / 1e6
}
