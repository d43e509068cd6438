//! An idle engine parks: its workers burn (almost) no CPU.

use std::time::Duration;

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills a zeroed, valid rusage struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn idle_engine_parks() {
    // Default worker settings (spin, then yield, then park), two workers.
    let mut cfg = tent::Config::default();
    cfg.workers.count = 2;
    cfg.workers.pin = false;
    let e = tent::Engine::new(cfg).unwrap();
    let _ring = e.ring().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(5));
    let used = cpu_time() - before;
    assert!(
        used < Duration::from_millis(20),
        "idle engine used {used:?} of CPU in 5 s"
    );

    // An application that drops its ring with a full completion ring and
    // more SQEs queued must not keep the worker busy: the ring is retired.
    let m = e.allocate_memory(64).unwrap();
    let mut ring = e.ring_with_depth(4).unwrap();
    for round in 0..2 {
        let mut sq = ring.submission();
        for i in 0..4 {
            let w = tent::op::Write::new(
                tent::LocalAddr::new(m.id(), 0),
                tent::RemoteAddr::new(tent::SegmentId::LOCAL, m.addr() + 8),
                8,
            );
            sq.push(w.user_data(round * 4 + i)).unwrap();
        }
        drop(sq);
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(ring);
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_time() - before;
    assert!(
        used < Duration::from_millis(10),
        "worker busy after its ring was dropped: {used:?} in 1 s"
    );
}
