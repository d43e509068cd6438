//! `hugepages`: `allocate_memory`'s pages, read back from the kernel
//! (`KernelPageSize` in `/proc/self/smaps`). One test in this binary: it
//! grows the system's 2 MiB page pool (as root) and puts it back.

use tent::config::HugePages;
use tent::{Buffer, Config, Engine};

fn heap_engine(pages: HugePages) -> Engine {
    let mut c = Config::default();
    c.workers.count = 1;
    c.workers.pin = false;
    c.transports.tcp.enable = false;
    c.transports.rdma.enable = false;
    c.transports.shm.enable = false;
    c.hugepages = pages;
    Engine::new(c).expect("engine")
}

/// The page size, in KiB, the kernel backs the mapping holding `addr`
/// with (`KernelPageSize` in `/proc/self/smaps`).
fn kernel_page_kib(addr: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
        {
            inside = (lo..hi).contains(&addr);
        } else if inside && let Some(kib) = line.strip_prefix("KernelPageSize:") {
            return kib.trim().trim_end_matches("kB").trim().parse().ok();
        }
    }
    None
}

/// The system's 2 MiB page pool, put back as it was on drop.
struct Pool {
    before: u64,
}

const POOL: &str = "/proc/sys/vm/nr_hugepages";

impl Pool {
    fn size() -> u64 {
        std::fs::read_to_string(POOL)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Grow the pool by `more` pages; `None` where this process may
    /// not (not root) or the kernel found no memory for them.
    fn grow(more: u64) -> Option<Pool> {
        let before = Pool::size();
        std::fs::write(POOL, (before + more).to_string()).ok()?;
        let pool = Pool { before };
        (Pool::size() >= before + more).then_some(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::write(POOL, self.before.to_string());
    }
}

/// A 3 MiB buffer and its last bytes, written and read back.
fn three_mib(e: &Engine) -> Buffer {
    let b = e.allocate_memory(3 << 20).expect("allocate");
    b.write((3 << 20) - 8, &[7; 8]).unwrap();
    let mut got = [0; 8];
    b.read((3 << 20) - 8, &mut got).unwrap();
    assert_eq!(got, [7; 8]);
    b
}

/// `hugepages`: `2m` takes two whole pages from the reserved pool for
/// a 3 MiB buffer, `1g` falls back to them where there is no 1 GiB
/// page, and with the pool empty both fall back to base pages; `off`
/// and `transparent` map base pages (transparent ones may be promoted
/// later, by the kernel's setting).
#[test]
fn hugepages_come_from_the_pool_and_fall_back_when_it_is_empty() {
    for pages in [HugePages::Off, HugePages::Transparent] {
        let b = three_mib(&heap_engine(pages));
        assert_eq!(kernel_page_kib(b.addr()), Some(4), "{pages:?}");
    }
    let free_2m = || {
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    if free_2m() == 0 {
        for pages in [HugePages::Huge2M, HugePages::Huge1G] {
            let b = three_mib(&heap_engine(pages));
            assert_eq!(kernel_page_kib(b.addr()), Some(4), "{pages:?}: fallback");
        }
    }
    let Some(_pool) = Pool::grow(4) else {
        // Not root, or no memory to reserve: the fallbacks above are
        // what this machine can show.
        eprintln!("hugepages: could not reserve 2 MiB pages here; pool part not run");
        return;
    };
    // `1g` takes 2 MiB pages for a buffer shorter than a 1 GiB page.
    for pages in [HugePages::Huge2M, HugePages::Huge1G] {
        let e = heap_engine(pages);
        let b = three_mib(&e);
        assert_eq!(kernel_page_kib(b.addr()), Some(2048), "{pages:?}");
    }
}
