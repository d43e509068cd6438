//! tent: a data-transfer engine for RDMA clusters.
//!
//! Applications register memory, open remote segments, and post READ/WRITE
//! requests into lock-free submission rings; pinned workers slice them and
//! move the bytes through a transport; completions come back on completion
//! rings (or as TENT-style batch task states).
//!
//! What a program uses:
//! - [`Engine`] (built by [`Engine::new`] or [`EngineBuilder`]) registers
//!   memory ([`Buffer`]), opens remote segments by name, and hands out
//!   [`Ring`]s: push [`op`] requests ([`Sqe`]), `submit`, reap [`Cqe`]s.
//!   The TENT-style batch API ([`BatchId`], [`TaskStatus`]) and
//!   [`BlockList`] sit beside the rings.
//! - [`config`]: [`Config`], TENT's `transfer-engine.json` keys, loaded in
//!   layers ([`Config::load`]) and checked key by key.
//! - [`notify`]: notifications to peers, alone or after a submission's data.
//! - [`stats`]: what an engine reports (rails, send queues, QoS, traffic).
//! - [`error`]: one taxonomy ([`ErrorKind`]) for every failure.
//!
//! The engine's internals (transports, workers, flow control, the control
//! plane) are private; `docs/ARCHITECTURE.md` is their map. The `testing`
//! feature opens them to the integration tests; it is no API.
#![warn(unnameable_types)]

/// A module the engine keeps to itself: crate-private, and public only with
/// the `testing` feature, for the integration tests that drive its parts.
///
/// Inside such a module, `pub` marks what those tests use and everything
/// else is `pub(crate)` (`unreachable_pub` holds every other module to
/// that, and the `testing` build reports an accessor nothing uses). What
/// only the tests use looks unused, and its `pub` unreachable, to the
/// default build, which therefore does not warn about either; the
/// `testing` build, which `cargo clippy --all-targets` checks with
/// warnings denied, still finds what nothing uses.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "testing")]
        pub mod $name;
        #[cfg(not(feature = "testing"))]
        #[allow(dead_code, unused_imports, unreachable_pub)]
        mod $name;
    )*};
}

pub mod config;
pub mod daemon;
pub mod engine;
pub mod error;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod incarnation;
pub mod logging;
mod memfd;
pub mod notify;
mod procfs;
pub mod secret;
#[cfg(feature = "stderr-log")]
pub mod stderr_log;
internal!(
    clock, control, deadline, doorbell, flow, http, lograte, memory, metrics, netlink, qos,
    refusals, segment, topology, transport, worker_ctx,
);

/// What an engine reports about itself: [`Engine::rails`] and
/// [`Engine::all_rails`], [`Engine::sq_rows`], [`Engine::qos_stats`],
/// [`Engine::traffic_stats`].
pub mod stats {
    pub use crate::flow::diag::{SqReport, SqRow};
    pub use crate::qos::stats::{LevelSnapshot, QosSnapshot, SlotSnapshot};
    pub use crate::qos::stats::{WAIT_BUCKETS, bucket_upper_us};
    pub use crate::transport::RailStat;
    pub use crate::transport::rails::RailState;
    pub use crate::transport::rails::TrafficStats;
}

pub use config::Config;
pub use engine::{BatchId, BlockList, Buffer, Engine, EngineBuilder, Ring, TaskState, TaskStatus};
pub use error::{Error, ErrorKind, Result};
pub use notify::{Notification, Received};
pub use secret::Secret;
pub use segment::RemoteRegion;
/// Longest segment name (an engine's `ip:port`, a shm name), in bytes.
pub const MAX_SEGMENT_NAME: usize = control::wire::MAX_NAME;
pub use tent_rings::{
    Cqe, FAILOVER_EXHAUSTED, LocalAddr, Opcode, Priority, RegionId, RemoteAddr, SegmentId, Sqe,
    TransportKind, op,
};
