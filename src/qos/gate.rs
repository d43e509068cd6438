use tent_rings::Priority;

/// Decides whether work of a priority may be posted right now. The worker
/// asks before every slice, so LOW work can be held back between slices.
pub trait SendGate: Send + Sync + std::fmt::Debug {
    /// May a slice of priority `p` be posted now?
    fn can_send(&self, p: Priority) -> bool;
}

/// The single-process gate: every priority may always send (TENT with an
/// empty `shared_quota_shm_path`).
#[derive(Debug, Default, Clone, Copy)]
pub struct OpenGate;

impl SendGate for OpenGate {
    #[inline]
    fn can_send(&self, _p: Priority) -> bool {
        true
    }
}
