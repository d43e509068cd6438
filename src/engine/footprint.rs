//! What an engine preallocates, from its configuration, and whether the
//! machine has that much memory: a configuration whose keys are each in
//! range but together need more than there is (256 workers × 1 M tasks ×
//! 1 M ring depth is about 80 GiB) is refused with a typed error before
//! anything is allocated, instead of aborting in the allocator or being
//! killed by the OOM killer halfway through starting workers.
//!
//! Counted: what `Engine::build` and `Worker::new` allocate per worker
//! (task slots with their free and due lists, three priority lanes of
//! `max_tasks_per_worker` entries, the batch submission ring of
//! `ring_depth` SQEs, the reap buffer and lists), each from `size_of` of
//! the real structs, and what the TCP transport keeps per worker from the
//! start (its token table and abort board). Not counted, because they are allocated later and
//! on demand: application rings (`Engine::ring`, 2 × `ring_depth` entries
//! each, and as many staged SQEs and inline CQEs for inline issue), batches (`allocate_batch`, at most `max_batch_size` slots each),
//! registered memory, TCP connection rings (per opened peer) and RDMA queue
//! pairs (per worker and rail on first use); nor thread stacks (address
//! space, faulted in as used).
//!
//! ```
//! let cfg = tent::Config::default();
//! let f = tent::engine::Footprint::of(&cfg);
//! assert!(f.total() > 0 && f.total() < 64 << 20, "{f:?}");
//! ```

use crate::config::{Config, ConfigError};
use crate::procfs;

use super::worker::WorkerBytes;

/// Bytes an engine built from a config holds from the start, by the keys
/// that drive them (all workers together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// `workers/count`.
    pub workers: u32,
    /// `workers/count` × `max_tasks_per_worker`: task slots and lanes.
    pub tasks: u64,
    /// `workers/count` × `ring_depth`: the batch submission rings.
    pub batch_rings: u64,
    /// `workers/count` × what every worker holds whatever the keys.
    pub fixed: u64,
    /// `workers/count` × what the transports keep per worker from the
    /// start (TCP, when enabled: its table of tokens out and its abort
    /// board, `max_inflight_slices` or `max_tasks_per_worker` entries,
    /// the smaller).
    pub transports: u64,
    /// Task bytes per `max_tasks_per_worker` unit (slot, free-list and
    /// due-list entries, three lane entries).
    pub per_task: u64,
}

impl Footprint {
    /// The footprint of `cfg`.
    pub fn of(cfg: &Config) -> Footprint {
        let w = WorkerBytes::of(cfg);
        let n = u64::from(cfg.workers.count);
        Footprint {
            workers: cfg.workers.count,
            tasks: n.saturating_mul(w.tasks),
            batch_rings: n.saturating_mul(w.batch_ring),
            fixed: n.saturating_mul(w.fixed),
            transports: if cfg.transports.tcp.enable {
                n.saturating_mul(crate::transport::tcp::worker_bytes(cfg))
            } else {
                0
            },
            per_task: w.tasks / u64::from(cfg.max_tasks_per_worker.max(1)),
        }
    }

    /// All of it.
    pub fn total(&self) -> u64 {
        self.tasks
            .saturating_add(self.batch_rings)
            .saturating_add(self.fixed)
            .saturating_add(self.transports)
    }
}

/// Memory this process may still take, and what bounds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from (`MemAvailable in /proc/meminfo`, a
    /// cgroup's limit less its usage, or `RLIMIT_AS` less the mapped size).
    pub source: String,
}

/// The smallest of: `MemAvailable`, the memory cgroup's room (v2
/// `memory.max - memory.current`, v1 `memory.limit_in_bytes -
/// memory.usage_in_bytes`) and the address-space limit's room. `None` when
/// none can be read (not Linux): then nothing is refused.
pub fn available() -> Option<Available> {
    let mut best: Option<Available> = None;
    let mut offer = |bytes: u64, source: String| {
        if best.as_ref().is_none_or(|b| bytes < b.bytes) {
            best = Some(Available { bytes, source });
        }
    };
    if let Some(b) = meminfo("MemAvailable:") {
        offer(b, "MemAvailable in /proc/meminfo".into());
    }
    for (room, source) in cgroup_rooms() {
        offer(room, source);
    }
    if let Some(limit) = procfs::address_space_limit() {
        let room = procfs::address_space_room(limit);
        offer(room, "RLIMIT_AS less the mapped size (VmSize)".into());
    }
    best
}

/// Refuse `cfg` if what it preallocates exceeds what is available.
pub(crate) fn check(cfg: &Config) -> Result<(), ConfigError> {
    let Some(avail) = available() else {
        return Ok(());
    };
    check_against(cfg, &avail)
}

fn check_against(cfg: &Config, avail: &Available) -> Result<(), ConfigError> {
    let f = Footprint::of(cfg);
    let need = f.total();
    if need <= avail.bytes {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let key = if f.tasks >= f.batch_rings {
        "max_tasks_per_worker"
    } else {
        "ring_depth"
    };
    Err(ConfigError::Invalid {
        file: cfg.source.clone(),
        key: key.to_owned(),
        reason: format!(
            "the engine would preallocate {need} bytes ({:.1} GiB) but {} bytes ({:.1} GiB) are available ({}): \
             workers/count {} x max_tasks_per_worker {} x {} bytes = {} bytes (task slots and priority lanes); \
             workers/count {} x a batch ring of {} SQEs (ring_depth {}, max_batch_size {}: the larger, a power of two) = {} bytes (batch rings); {} bytes fixed per worker; {} bytes of transport state (tcp). \
             Lower workers/count, max_tasks_per_worker, ring_depth or max_batch_size",
            gib(need),
            avail.bytes,
            gib(avail.bytes),
            avail.source,
            f.workers,
            cfg.max_tasks_per_worker,
            f.per_task,
            f.tasks,
            f.workers,
            cfg.batch_ring_depth(),
            cfg.ring_depth,
            cfg.max_batch_size,
            f.batch_rings,
            f.fixed / u64::from(f.workers.max(1)),
            f.transports,
        ),
    })
}

/// A `/proc/meminfo` line's value in bytes.
fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    procfs::kib_field(&text, field)
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Room left under each memory cgroup limit this process is in.
fn cgroup_rooms() -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
        return out;
    };
    let mut room = |limit: Option<u64>, usage: Option<u64>, dir: &str| {
        // v1 writes "no limit" as a huge page-rounded number.
        if let Some(limit) = limit.filter(|&l| l < 1 << 60) {
            let used = usage.unwrap_or(0);
            out.push((
                limit.saturating_sub(used),
                format!("memory cgroup {dir}: limit {limit} less usage {used}"),
            ));
        }
    };
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            // cgroup v2 ("max" = no limit).
            let dir = format!("/sys/fs/cgroup{}", path.trim_end_matches('/'));
            room(
                read_u64(&format!("{dir}/memory.max")),
                read_u64(&format!("{dir}/memory.current")),
                &dir,
            );
        } else if ctrl.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{}", path.trim_end_matches('/'));
            room(
                read_u64(&format!("{dir}/memory.limit_in_bytes")),
                read_u64(&format!("{dir}/memory.usage_in_bytes")),
                &dir,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn huge() -> Config {
        let mut c = Config::default();
        c.workers.count = 256;
        c.max_tasks_per_worker = 1 << 20;
        c.ring_depth = 1 << 20;
        c
    }

    #[test]
    fn the_estimate_grows_with_the_keys_that_drive_it() {
        let d = Config::default();
        let base = Footprint::of(&d);
        let mut c = d.clone();
        c.workers.count *= 4;
        assert_eq!(Footprint::of(&c).total(), 4 * base.total());
        let mut c = d.clone();
        c.max_tasks_per_worker *= 2;
        assert_eq!(Footprint::of(&c).tasks, 2 * base.tasks);
        let mut c = d.clone();
        c.ring_depth = d.batch_ring_depth() * 2;
        assert!(Footprint::of(&c).batch_rings > base.batch_rings);
        let mut c = d.clone();
        c.max_batch_size = d.batch_ring_depth() * 2;
        assert!(Footprint::of(&c).batch_rings > base.batch_rings);
        // 256 x 1 M tasks x ~200 B + 256 x 1 M x 64 B: tens of GiB.
        assert!(Footprint::of(&huge()).total() > 32 << 30);
    }

    #[test]
    fn the_tcp_transports_per_worker_state_is_counted_when_tcp_is_on() {
        let mut c = Config::default();
        c.workers.count = 4;
        c.max_inflight_slices = 1 << 20;
        c.max_tasks_per_worker = 1 << 20;
        let on = Footprint::of(&c);
        c.transports.tcp.enable = false;
        let off = Footprint::of(&c);
        assert_eq!(off.transports, 0);
        assert_eq!(
            on.transports,
            4 * crate::transport::tcp::worker_bytes(&c),
            "{on:?}"
        );
        // 2^20 tokens: a 2^21-slot table (16 B a slot) per worker.
        assert!(on.transports >= 4 * (32 << 20), "{on:?}");
        assert_eq!(on.total() - off.total(), on.transports);
    }

    #[test]
    fn refused_with_the_figures_and_keys() {
        let avail = Available {
            bytes: 8 << 30,
            source: "test".into(),
        };
        let err = check_against(&huge(), &avail).unwrap_err();
        let text = err.to_string();
        let need = Footprint::of(&huge()).total().to_string();
        for want in [
            need.as_str(),
            "8589934592 bytes",
            "workers/count 256",
            "max_tasks_per_worker 1048576",
            "ring_depth 1048576",
            "(test)",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
        assert!(check_against(&Config::default(), &avail).is_ok());
    }

    #[test]
    fn a_memory_figure_is_found_on_linux() {
        // On Linux at least MemAvailable is there.
        let a = available().expect("a memory figure on Linux");
        assert!(a.bytes > 0, "{a:?}");
    }
}
