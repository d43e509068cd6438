//! The control plane: how engines find each other's segments.
//!
//! Every engine listens on `rpc_server_hostname:rpc_server_port` (TENT's
//! p2p mode, the embedded default); its segment name is `ip:port`. Opening
//! such a segment connects, authenticates when a shared secret is set, and
//! fetches the segment descriptor (regions with keys, transports, rails).

#[doc(hidden)]
pub mod auth;
pub mod client;
pub(crate) mod directory;
pub mod etcd;
pub mod server;
pub mod wire;

pub use client::{connect_qp, fetch_descriptor, is_p2p_name, new_engine_id};
pub use server::ControlServer;
pub use wire::{RegionEntry, SegmentDescriptor};

/// This host's identity for "same host?" decisions: the kernel boot id
/// (shared by every process and namespace booted by the same kernel).
pub fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned())
}
