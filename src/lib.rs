//! tent: a data-transfer engine for RDMA clusters.
//!
//! Applications register memory, open remote segments, and post READ/WRITE
//! requests into lock-free submission rings; pinned workers slice them and
//! move the bytes through a transport; completions come back on completion
//! rings (or as TENT-style batch task states).
//!
//! The map, following the data:
//! - [`config`]: `transfer-engine.json`, validated; [`topology`]: NUMA and cores.
//! - [`memory`]: registered regions; [`segment`]: this and other engines' memory.
//! - [`engine`]: the [`Engine`], its [`Ring`]s, batches and workers.
//! - [`qos`]: priority lanes and the `can_send` gate.
//! - [`flow`]: flow control, one concept for every bounded queue
//!   (`SqController`: a worker's window on a transport, an RDMA send
//!   queue, a TCP connection's wire window), admission and split policies.
//! - [`transport`]: the `Transport` trait and every transport under it:
//!   `local` / `shm` / `tcp` / `rdma` (with its `verbs` and `sys`);
//!   `rails`: the multi-rail layer the network transports share
//!   (`DeviceSelector`: which rail a slice takes; `RailMonitor`: rail
//!   health); [`netlink`]: link state.
//! - `worker_ctx` (re-exported by [`transport`]): `WorkerCtx` / `PerWorker`,
//!   per-worker state only that worker opens (transports' peers, an shm
//!   peer's per-worker view of its table).
//! - [`refusals`]: refused connections held a moment so their busy answer
//!   is read (control server and TCP data server).
//! - [`notify`]: notifications to peers, alone or after a submission's
//!   data landed (over the control plane: an outbox lane per peer, an
//!   inbox per engine).
//! - [`metrics`]: failover and rail counters, Prometheus text.
//! - [`error`]: the error taxonomy; [`lograte`]: failure logs once per cause
//!   per second (`warn_limited!`); [`deadline`]: socket I/O bounded by one
//!   deadline for a whole exchange (handshakes, control).
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod clock;
pub mod config;
pub mod control;
pub mod deadline;
pub mod doorbell;
pub mod engine;
pub mod error;
pub mod flow;
pub mod lograte;
pub mod memory;
pub mod metrics;
pub mod netlink;
pub mod notify;
pub mod qos;
pub mod refusals;
pub mod secret;
pub mod segment;
pub mod topology;
pub mod transport;
mod worker_ctx;

pub use config::Config;
pub use engine::{BatchId, BlockList, Buffer, Engine, EngineBuilder, Ring, TaskState, TaskStatus};
pub use error::{Error, ErrorKind, Result};
pub use notify::{Notification, Received};
pub use secret::Secret;
pub use tent_rings::{
    Cqe, FAILOVER_EXHAUSTED, LocalAddr, Opcode, Priority, RegionId, RemoteAddr, SegmentId, Sqe,
    TransportKind, op,
};
