//! The memory estimate behind "configuration that cannot fit" is honest: for a config whose preallocation dominates, the
//! process's resident memory grows by the estimate within a factor of 2.
//! (One test in its own binary, so no other test's memory is counted.)

use std::time::Duration;

use tent::engine::Footprint;
use tent::{Config, Engine};

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn estimate_is_within_2x_of_resident_growth() {
    let mut c = Config::default();
    c.workers.count = 2;
    c.workers.pin = false;
    c.max_tasks_per_worker = 1 << 18;
    c.ring_depth = 1 << 16;
    let estimate = Footprint::of(&c).total();
    let before = rss();
    let e = Engine::new(c).unwrap();
    // Let the workers start and touch what they touch.
    std::thread::sleep(Duration::from_millis(300));
    let grew = rss().saturating_sub(before);
    eprintln!(
        "estimate {estimate} bytes, resident growth {grew} bytes ({:.2}x)",
        estimate as f64 / grew as f64
    );
    assert!(
        estimate <= 2 * grew && grew <= 2 * estimate,
        "estimate {estimate} vs resident growth {grew}"
    );
    drop(e);
}
