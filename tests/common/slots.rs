//! A shared QoS slot file for the tests that use one: its name, its
//! removal, and an engine on it.

use std::time::Duration;

use tent::Engine;

/// A slot-file name unique to this test process.
pub(crate) fn slot_name(tag: &str) -> String {
    format!("/tent-test-slots-{tag}-{}", std::process::id())
}

/// Removes the slot file and the seat sockets left.
pub(crate) struct Unlink(pub(crate) String);

impl Drop for Unlink {
    fn drop(&mut self) {
        let path = format!("/dev/shm{}", self.0);
        let _ = std::fs::remove_file(&path);
        for i in 0..64 {
            let _ = std::fs::remove_file(format!("{path}.s{i}"));
        }
    }
}

/// An engine on slot file `name` rotating every `interval_ms`.
pub(crate) fn engine_on_slots(name: &str, interval_ms: u64) -> tent::Result<Engine> {
    let mut c = super::test_config();
    c.transports.rdma.shared_quota_shm_path = name.to_owned();
    c.transports.rdma.slot_rotation_interval_ms = Duration::from_millis(interval_ms);
    Engine::new(c)
}
