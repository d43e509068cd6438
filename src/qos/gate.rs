use std::time::Duration;

use tent_rings::Priority;

/// Decides whether work of a priority may be posted right now. The worker
/// asks before every slice, so LOW work can be held back between slices.
pub trait SendGate: Send + Sync + std::fmt::Debug {
    /// May a slice of priority `p` be posted now (`now`: the caller's
    /// [`monotonic_ns`](crate::clock::monotonic_ns), read once per turn)?
    fn can_send(&self, p: Priority, now: u64) -> bool;

    /// A worker now has work of priority `p` (`busy`: its first such task
    /// arrived) or no longer (its last finished). Called on those changes
    /// only; a gate that reserves time for classes with work (the slot
    /// clock) publishes it.
    fn demand(&self, _p: Priority, _busy: bool) {}

    /// Does [`demand`](Self::demand) mean anything to this gate? When not,
    /// workers do not count their live tasks for it (two calls per op
    /// saved on the single-process path).
    fn tracks_demand(&self) -> bool {
        true
    }

    /// Does [`can_send`](Self::can_send) answer true for every priority
    /// at every instant? A worker that is told so does not ask it on its
    /// small-op path (a virtual call per op).
    fn always_open(&self) -> bool {
        false
    }

    /// How soon a worker whose every queued lane is closed looks again
    /// (it naps that long instead of spinning on a closed gate).
    fn recheck_after(&self) -> Duration {
        Duration::from_millis(1)
    }
}

/// The single-process gate: every priority may always send (TENT with an
/// empty `shared_quota_shm_path`).
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenGate;

impl SendGate for OpenGate {
    #[inline]
    fn can_send(&self, _p: Priority, _now: u64) -> bool {
        true
    }

    fn tracks_demand(&self) -> bool {
        false
    }

    fn always_open(&self) -> bool {
        true
    }
}
