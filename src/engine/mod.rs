//! The engine: configuration, registered memory, segments, workers, and the
//! batch and ring APIs over them.
//!
//! Where each concept lives:
//! - `build`: [`EngineBuilder`] and `Engine::new`: transport install, worker
//!   placement, the control and TCP data servers; teardown (`Drop`).
//! - `workers`: the worker threads (`WorkerPool`): start, pick, stop.
//! - `memory`: registered memory ([`Buffer`]), `unregister_memory` and the
//!   unregister epochs and drain it shares with `close_segment`.
//! - `segments`: opening, probing and closing segments; their regions, shm
//!   peer and rails.
//! - `submit`: rings and batches: `ring`, `submit` and its RDMA admission,
//!   task status, cancel, wait.
//! - `stats`: read-only introspection: config, names and addresses, metrics,
//!   rails, QoS, credits, counters (and, with the `testing` feature,
//!   `swap_transport` and `shm_export`, the test hooks).
//! - `batch`: the batch table and task states; `ring`: [`Ring`] and its
//!   queues; `task`: a worker's task table; `worker`: the worker loop and
//!   what it shares; `footprint`: what an engine preallocates.

pub(crate) mod attached;
pub(crate) mod batch;
mod blocks;
mod build;
pub(crate) mod client_scope;
mod describe;
pub mod footprint;
mod handle;
mod http;
mod memory;
mod notify;
mod observe;
mod peers;
mod reload;
mod ring;
mod segments;
mod stats;
mod submit;
mod task;
pub mod topology_report;
mod withdrawn;
mod worker;
mod workers;

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use tent_rings::TransportKind;

pub use batch::{BatchId, TaskState, TaskStatus};
pub use blocks::BlockList;
pub use build::EngineBuilder;
pub use footprint::{Available, Footprint};
pub use handle::Engine;
pub use memory::Buffer;
pub use ring::{CompletionQueue, Ring, SubmissionQueue};
pub use topology_report::TopologyReport;

use crate::config::Config;
use crate::memory::{MemRegion, RegionTable};
use crate::qos::{SendGate, SlotRotator};
use crate::segment::{Segment, SegmentTable};
use crate::transport::TransportSlots;
use crate::transport::shm::ShmExport;
use crate::transport::tcp::{DataServer, TcpTransport};
use batch::BatchTable;
use withdrawn::Withdrawn;
use workers::WorkerPool;

/// What the workers share with the API side.
pub(crate) struct EngineShared {
    pub config: Config,
    /// Drawn at start; tags every id this engine hands out.
    pub incarnation: crate::incarnation::Incarnation,
    pub regions: Arc<ArcSwap<RegionTable>>,
    /// The last unregister epoch (each `unregister_memory` takes the next),
    /// published after the region is revoked and out of `regions`; workers
    /// read it in housekeeping and acknowledge it (`RegionAck`).
    pub region_epoch: CachePadded<AtomicU64>,
    pub segments: Arc<ArcSwap<SegmentTable>>,
    pub transports: Arc<TransportSlots>,
    pub gate: Arc<dyn SendGate>,
    /// The TCP transport, when it is the one installed (segments attach to it).
    pub tcp: Option<Arc<TcpTransport>>,
    /// The RDMA NICs in use (memory is registered on each).
    pub rdma: Option<Arc<crate::transport::rdma::NicSet>>,
    /// Failover counters.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The link watch every transport's rails listen to.
    pub links: Arc<crate::transport::rails::RailLinks>,
    /// The reloadable settings as applied now (`Engine::reload`).
    pub live: reload::LiveSettings,
    /// Held while the region or segment table changes (and around the
    /// network fetch of a segment being opened), so changes and their
    /// unregister epochs come one at a time.
    pub registry: Mutex<()>,
    /// Wakes the metadata threads: a worker rings it when a segment turns
    /// suspect, the engine's drop when they are to stop; they sleep on it
    /// while nothing is due.
    pub peer_bell: crate::doorbell::Doorbell,
    /// The rings that issue ops inline: what an unregister or a close
    /// waits on, and their counts.
    pub inline: Arc<ring::InlineRings>,
    /// A daemon's clients' shares of work within each priority (unused
    /// by an engine that serves no client).
    pub fair: crate::qos::FairShares,
}

impl EngineShared {
    /// Take the next unregister epoch (under the registry lock: taken by
    /// `unregister_memory`, `close_segment` and a peer's segment replaced):
    /// `retire(epoch)` marks what leaves a table at it and stores the table
    /// without it; the epoch is published after (Release), so a worker that
    /// reads it sees both.
    pub(crate) fn next_epoch(&self, retire: impl FnOnce(u64)) {
        use std::sync::atomic::Ordering;
        let epoch = self.region_epoch.load(Ordering::Relaxed) + 1;
        retire(epoch);
        self.region_epoch.store(epoch, Ordering::Release);
    }
}

#[inline]
pub(crate) fn slot_index(kind: TransportKind) -> usize {
    kind as usize
}

/// The engine running in this process (what an [`Engine`] is unless it
/// attached to a daemon).
pub(crate) struct Embedded {
    shared: Arc<EngineShared>,
    workers: WorkerPool,
    batches: BatchTable,
    export: Option<Arc<ShmExport>>,
    control: Option<crate::control::ControlServer>,
    data: Option<DataServer>,
    /// Regions out of the table whose `unregister_memory` has not finished
    /// (waiting, or timed out): held, and still registered, until it does.
    retiring: Withdrawn<MemRegion>,
    /// Opening segments, and replacing those whose peer restarted.
    peers: Arc<peers::Peers>,
    /// Keeps this engine's record in the metadata store and watches its
    /// peers; stopped first on drop.
    metadata: Option<peers::metadata::MetadataThread>,
    /// Segments out of the table whose `close_segment` has not finished:
    /// held until it does (tasks on them hold them by pointer, `Held`).
    closing: Withdrawn<Segment>,
    /// This engine's share of the global slot clock (rotating or
    /// watching); dropped after the workers, handing the lease back.
    /// Held for its drop (read by the tests' `slot_clock`).
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    slots: Option<SlotRotator>,
    /// Notifications received and not yet taken, and those to send.
    mail: notify::Mailbox,
    /// What the engine says about itself (metrics, health, topology), to
    /// the application and to the HTTP endpoint alike.
    observer: Arc<observe::Observer>,
    /// The HTTP endpoint (`metrics/http_enable`): stopped first on drop.
    http: Option<crate::http::HttpServer>,
    /// Block lists' run buffers, kept between lists.
    run_pool: Arc<blocks::RunPool>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("workers", &self.workers.len())
            .field("segment", &self.local_segment_name())
            .field("transports", &self.shared.transports)
            .finish()
    }
}
