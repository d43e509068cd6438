//! The engine handle: an engine running in this process ([`Embedded`]),
//! or this process attached to the node's daemon (`tentd`), whose engine
//! serves its rings in shared memory. The same calls work on both, so an
//! application switches by configuration alone (`daemon_socket`).
//!
//! An attached engine serves memory, segments, rings, the batch API and
//! block lists (kept on its side over a ring of its own,
//! `daemon::batches`; a block list is one request per run), and
//! notifications (the daemon sends and receives them for it, under a
//! mailbox of its own: `daemon::mail`). What it does not serve yet is
//! refused with a typed error naming the call (`InvalidArgument`), never
//! faked: heap registration (allocate through the engine: the daemon
//! cannot reach this process's heap), cancel, reload.
//! Reports (rails, SQ rows,
//! metrics, QoS) are the daemon's, on its own HTTP endpoint: an attached
//! engine reports only what it holds (see [`Engine`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tent_rings::{RegionId, SegmentId, Sqe, TransportKind};

use super::{BatchId, BlockList, Buffer, Embedded, EngineBuilder, Ring, TaskStatus};
use crate::config::Config;
use crate::daemon::Attached;
use crate::error::Result;
use crate::notify::{Notification, Received};
use crate::segment::RemoteRegion;
#[cfg(any(test, feature = "testing"))]
use crate::transport::shm::{ShmExport, ShmPeer};

/// A transfer engine. `Send + Sync`: share it (e.g. in an `Arc`) across
/// threads; each submitting thread takes its own [`Ring`] or uses the
/// batch API.
///
/// Either the engine runs in this process (the default), or this process
/// is a client of the node's daemon (`tentd`, configured by
/// `daemon_socket`, or [`Engine::attach`]): then memory and rings are
/// shared memory the daemon's workers serve, and the hot path makes no
/// system call either way.
///
/// # An attached engine
/// Serves memory ([`allocate_memory`](Self::allocate_memory), mapped in
/// both processes), segments (opened for it by the daemon; never the
/// daemon's own, nor `"local"`: `AccessDenied`), rings, the batch API,
/// block lists (one request per run of contiguous blocks, not per
/// registration) and notifications. Refuses, `InvalidArgument` naming the
/// call: `register_memory` (allocate through the engine), `cancel`,
/// `reload`, `probe_peer_alive`, `planned_rails`. A ring's
/// `completion_fd` is written by a thread of this process when the
/// daemon's worker bumps the ring's CQ bell. Reports what this process holds, the rest being the
/// daemon's (its `/metrics`): [`segment_name`](Self::segment_name) is the
/// daemon's segment with this engine's mailbox (`owner#mailbox`): a peer
/// that opens it reaches this process's memory at each buffer's
/// [`peer_addr`](Buffer::peer_addr) (where the daemon maps it), and its
/// notifications reach this engine alone; `config` is
/// the configuration it attached with (the daemon's applies to every
/// other key), at generation 1; no transport, worker, rail, SQ row, HTTP
/// endpoint, QoS or traffic figure, completion count or metric family of
/// its own (empty lists, zeros, `None`, an empty OpenMetrics text).
pub struct Engine {
    inner: Inner,
}

/// Which engine a handle is.
pub(crate) enum Inner {
    Embedded(Box<Embedded>),
    Attached(Box<Attached>),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Embedded(e) => e.fmt(f),
            Inner::Attached(a) => a.fmt(f),
        }
    }
}

impl Engine {
    /// An engine from `config`: attached to the daemon at
    /// `daemon_socket` when that is set, else started in this process.
    pub fn new(config: Config) -> Result<Engine> {
        EngineBuilder::default().config(config).build()
    }

    /// A builder.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// Attach to the daemon (`tentd`) listening at `socket`: shorthand for
    /// [`Engine::new`] with `daemon_socket` set to it and every other key
    /// at its default.
    ///
    /// # Errors
    /// `Unreachable` when no daemon answers there; `AccessDenied` when it
    /// runs as another user (neither this one nor root) or refuses this
    /// one; `InvalidArgument` when its layout version is not this
    /// library's (the message names both).
    pub fn attach(socket: impl AsRef<Path>) -> Result<Engine> {
        Attached::attach(socket.as_ref(), Config::default()).map(Engine::attached_handle)
    }

    pub(crate) fn embedded_handle(e: Embedded) -> Engine {
        Engine {
            inner: Inner::Embedded(Box::new(e)),
        }
    }

    pub(crate) fn attached_handle(a: Attached) -> Engine {
        Engine {
            inner: Inner::Attached(Box::new(a)),
        }
    }

    /// The engine in this process, unless this one is attached to a daemon.
    pub(crate) fn embedded(&self) -> Option<&Embedded> {
        match &self.inner {
            Inner::Embedded(e) => Some(e),
            Inner::Attached(_) => None,
        }
    }

    /// Is this process a client of a daemon (`tentd`) rather than running
    /// an engine of its own?
    pub fn is_attached(&self) -> bool {
        matches!(self.inner, Inner::Attached(_))
    }

    /// Submit a block list into `batch` as one call: one request per local
    /// registration the blocks use (one, for blocks in one registration),
    /// blocks contiguous on both sides merged. Returns how many tasks it
    /// appended to the batch: their indices follow the batch's earlier
    /// tasks, in the order their registrations first appear in the list.
    /// All or nothing, as [`Engine::submit`]. The addresses are copied.
    ///
    /// A task is one request: it completes with all of its blocks; a block
    /// the transport refuses (its remote side outside the segment's memory)
    /// fails it; a transient fault fails it over whole (its blocks move
    /// again on the next transport); a cancel or deadline stops it between
    /// slices; and toward RDMA peers (`sq_executor_admission`) its
    /// admission is held until its last slice is posted.
    ///
    /// # Errors
    /// `SegmentNotFound` for a segment not open; `InvalidArgument` for a
    /// zero block length, no blocks, address lists of different lengths,
    /// or more requests than the batch has room for; `AddressNotRegistered` /
    /// `OutOfBounds` for a block outside registered local memory (the
    /// message names the block); the errors of [`Engine::submit`].
    pub fn submit_blocks(&self, batch: BatchId, blocks: &BlockList<'_>) -> Result<usize> {
        match &self.inner {
            Inner::Embedded(e) => e.submit_blocks(batch, blocks),
            Inner::Attached(a) => a.submit_blocks(batch, blocks),
        }
    }

    /// Allocate `len` bytes of registered memory, zeroed. With the shm
    /// transport on, it is exported so peers on this host can reach it.
    ///
    /// The engine does not place it: an exported region's pages are
    /// committed here (on the calling thread's node, under the default
    /// policy), and that node is recorded for ranking rails; heap memory is
    /// faulted in by its first use, so its node is unknown at allocation
    /// (the rails rank from each worker's node).
    pub fn allocate_memory(&self, len: u64) -> Result<Buffer> {
        match &self.inner {
            Inner::Embedded(e) => e.allocate_memory(len),
            Inner::Attached(a) => a.allocate_memory(len),
        }
    }

    /// Register memory the application owns.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay valid (allocated, not freed or unmapped)
    /// until [`Engine::unregister_memory`] returns `Ok` for it (the engine
    /// is then done with it) or the engine is dropped.
    pub unsafe fn register_memory(&self, ptr: *mut u8, len: u64) -> Result<Buffer> {
        match &self.inner {
            // SAFETY: the caller's promise, passed on.
            Inner::Embedded(e) => unsafe { e.register_memory(ptr, len) },
            Inner::Attached(a) => a.register_memory(ptr, len),
        }
    }

    /// Register every range of `ranges` (pointer, length), changing the
    /// region table once: a paged cache registered block by block pays one
    /// table change per call rather than per block. All or nothing: a range
    /// refused (null, zero length, wrapping, overlapping a registered
    /// region or another range) refuses the call and registers none.
    ///
    /// # Safety
    /// As [`Engine::register_memory`], for every range.
    pub unsafe fn register_memory_batch(&self, ranges: &[(*mut u8, u64)]) -> Result<Vec<Buffer>> {
        match &self.inner {
            // SAFETY: the caller's promise, passed on.
            Inner::Embedded(e) => unsafe { e.register_memory_batch(ranges) },
            Inner::Attached(a) => a.register_memory_batch(ranges),
        }
    }

    /// Where `[addr, addr + len)` lies in registered memory: its region
    /// and the offset into it, for callers that hold raw addresses (TENT's
    /// requests name their source by address; the C and Python bindings
    /// use this).
    ///
    /// # Errors
    /// `InvalidArgument` for a zero length; `AddressNotRegistered` when no
    /// registered region holds `addr`; `OutOfBounds` when one does but the
    /// range runs past its end (an end past `u64::MAX` included).
    pub fn local_addr(&self, addr: u64, len: u64) -> Result<tent_rings::LocalAddr> {
        match &self.inner {
            Inner::Embedded(e) => e.local_addr(addr, len),
            Inner::Attached(a) => a.local_addr(addr, len),
        }
    }

    /// Withdraw a registration, and return once the engine is done with it.
    ///
    /// At once: new requests naming the region fail `AddressNotRegistered`
    /// (a worker whose cached table still has it sees it revoked), the TCP
    /// data server refuses ops on it (`AccessDenied`; `AddressNotRegistered`
    /// to a peer that proved the shared secret), and shm peers find its live
    /// key zeroed (`AccessDenied`; `AddressNotRegistered` once they re-read
    /// the descriptor). Then the call waits until every worker has
    /// refreshed its cached region table and holds no task on the region
    /// (tasks accepted before it finish normally) and no TCP op into or out
    /// of it is being served. Only then is its RDMA registration dropped on
    /// every NIC (a peer's WRITE with the old rkey fails with a remote
    /// access error) and `Ok` returned: the engine never touches the memory
    /// again.
    ///
    /// Not drained: an shm peer's copy that passed its live-key check just
    /// before the revoke (one slice per peer worker, a memcpy long) may
    /// still land; it lands in the region's memfd, never in other memory.
    ///
    /// # Errors
    /// `AddressNotRegistered` if `id` names no region (or one already
    /// unregistered). `Timeout` if what is in flight on it has not drained
    /// by the bound: the latest deadline of a task holding it (or the call)
    /// plus twice the TCP stall limit (a stalled TCP frame is cut after one
    /// stall limit and one idle poll; slices still posted when their task's
    /// deadline passed get as long). The region then stays withdrawn (new
    /// requests refused, shm and TCP keys revoked) but held and registered
    /// for RDMA, since the engine may still write it: do not free it; call
    /// again to finish (each call waits anew).
    pub fn unregister_memory(&self, id: RegionId) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.unregister_memory(id),
            Inner::Attached(a) => a.unregister_memory(id),
        }
    }

    /// Unregister every region of `ids` as [`Engine::unregister_memory`]
    /// does one, with one table change and one unregister epoch for all:
    /// the workers acknowledge once. An id that names no region refuses
    /// the call before anything is withdrawn. On `Timeout` the regions not
    /// yet drained stay withdrawn and registered (call again for them).
    pub fn unregister_memory_batch(&self, ids: &[RegionId]) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.unregister_memory_batch(ids),
            Inner::Attached(a) => a.unregister_memory_batch(ids),
        }
    }

    /// Deliver `n` to the engine that owns `segment` (`SegmentId::LOCAL`:
    /// this one); returns once it is in that engine's inbox. Messages to
    /// one peer arrive once each, in the order of the calls (and of
    /// [`Engine::submit_with_notification`]'s), behind any attached one
    /// still waiting for its data.
    ///
    /// # Errors
    /// `InvalidArgument` for a name or message over its limit, or a segment
    /// opened by its shm name (open it by its `ip:port` name: the control
    /// plane carries notifications); `SegmentNotFound` for a segment not
    /// open; `Unreachable` when the peer's engine is gone (its port refuses
    /// connections); `Timeout` when it did not take the message within
    /// `default_timeout_ms`; `AccessDenied` when the shared secrets differ.
    pub fn send_notification(&self, segment: SegmentId, n: &Notification) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.send_notification(segment, n),
            Inner::Attached(a) => a.send_notification(segment, n),
        }
    }

    /// [`Engine::submit`], and deliver `n` to the owner of the requests'
    /// target segment once every one of these requests has completed: the
    /// receiver sees it only after all of their data has landed (TENT's
    /// `submitTransfer` with a notification). The batch's overall status
    /// ([`Engine::batch_status`], [`Engine::wait_batch`]) stays `Pending`
    /// until it is delivered, and turns `Failed` (with the reason's kind)
    /// if it cannot be: if a request fails the message is not sent, and if
    /// the peer dies the submission fails rather than the message
    /// vanishing. The batch cannot be freed while it is pending.
    ///
    /// # Errors
    /// As [`Engine::submit`] (nothing queued); `InvalidArgument` also when
    /// `requests` is empty or names more than one segment, and the errors
    /// of [`Engine::send_notification`] that can be told before sending.
    /// `Shutdown` (the engine is stopping) or `OutOfMemory` (no thread to
    /// send notifications) after the requests were queued: the batch then
    /// reports that failure too.
    pub fn submit_with_notification(
        &self,
        batch: BatchId,
        requests: &[Sqe],
        n: &Notification,
    ) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.submit_with_notification(batch, requests, n),
            Inner::Attached(a) => a.submit_with_notification(batch, requests, n),
        }
    }

    /// Every notification received and not yet taken, oldest first; never
    /// blocks.
    pub fn recv_notifications(&self) -> Vec<Received> {
        match &self.inner {
            Inner::Embedded(e) => e.recv_notifications(),
            Inner::Attached(a) => a.recv_notifications(),
        }
    }

    /// The oldest notification not yet taken, if one is waiting; never
    /// blocks (a poll that finds none allocates nothing).
    pub fn try_notification(&self) -> Option<Received> {
        match &self.inner {
            Inner::Embedded(e) => e.try_notification(),
            Inner::Attached(a) => a.try_notification(),
        }
    }

    /// The oldest notification not yet taken, waiting up to `timeout` for
    /// one.
    ///
    /// # Errors
    /// `Timeout` when none arrived in time.
    pub fn wait_notification(&self, timeout: Duration) -> Result<Received> {
        match &self.inner {
            Inner::Embedded(e) => e.wait_notification(timeout),
            Inner::Attached(a) => a.wait_notification(timeout),
        }
    }

    /// Apply `config`'s reloadable keys ([`crate::config::RELOADABLE`]:
    /// the failover budget, the promotion timeout, the rails' thresholds
    /// and cooldowns, the rail selector's parameters, priority filtering,
    /// the QoS slot interval, the log level) while the engine runs; each
    /// takes effect at the next decision that reads it. Returns the
    /// configuration generation now (`/health` says it).
    ///
    /// `log_level` is the process's: it is applied where tent installed
    /// the `tracing` subscriber (`tent-bench`, the C and Python libraries)
    /// or the application registered a setter
    /// ([`crate::logging::control_level`]). `slot_rotation_interval_ms`
    /// with a slot file is the group's: every participant follows it.
    ///
    /// # Errors
    /// `InvalidArgument` when `config` does not validate, when it changes
    /// a key that needs a restart (each is named), or when it changes
    /// `log_level` and nothing in this process can apply it (named, with
    /// why). Nothing is applied then.
    pub fn reload(&self, config: Config) -> Result<u64> {
        match &self.inner {
            Inner::Embedded(e) => e.reload(config),
            Inner::Attached(a) => a.reload(config),
        }
    }

    /// The configuration with every [`reload`](Self::reload) applied
    /// ([`config`](Self::config) is the one the engine started with).
    pub fn live_config(&self) -> Arc<Config> {
        match &self.inner {
            Inner::Embedded(e) => e.live_config(),
            Inner::Attached(a) => a.live_config(),
        }
    }

    /// 1 at start, one more per reload that changed something.
    pub fn config_generation(&self) -> u64 {
        match &self.inner {
            Inner::Embedded(e) => e.config_generation(),
            Inner::Attached(a) => a.config_generation(),
        }
    }

    /// The rails to an open segment (RDMA's, then TCP's), with their
    /// health and counters (empty when neither reaches it).
    pub fn rails(&self, id: SegmentId) -> Vec<crate::transport::RailStat> {
        match &self.inner {
            Inner::Embedded(e) => e.rails(id),
            Inner::Attached(a) => a.rails(id),
        }
    }

    /// Is the process behind `segment` still the one this engine opened
    /// (TENT's `probePeerAliveByID`)? A segment opened by `ip:port` asks
    /// the peer's control server (handshake and descriptor, all within
    /// `timeout`): alive when it answers as the same process (host
    /// and pid of the descriptor the segment was opened with); not when it
    /// does not answer, refuses, or another process now answers there (a
    /// restarted peer: its memory and keys are not the ones opened). An
    /// shm segment is alive while its owner serves it; the local segment
    /// always is. For a caller deciding whether to close a segment whose
    /// transfers keep failing; it runs on the calling thread, never on a
    /// worker. `Err`: the segment is not open.
    pub fn probe_peer_alive(&self, segment: SegmentId, timeout: Duration) -> Result<bool> {
        match &self.inner {
            Inner::Embedded(e) => e.probe_peer_alive(segment, timeout),
            Inner::Attached(a) => a.probe_peer_alive(segment, timeout),
        }
    }

    /// Open a segment by name (`"local"` or this engine's own name is
    /// segment 0). Opening the same name twice returns the same id.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        match &self.inner {
            Inner::Embedded(e) => e.open_segment(name),
            Inner::Attached(a) => a.open_segment(name),
        }
    }

    /// [`Engine::open_segment`] with the peer's descriptor passed through
    /// `edit` first: how tests present a forged or partial descriptor (a
    /// zeroed rkey, a NIC without keys) to the transports.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_segment_edited(
        &self,
        name: &str,
        edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<SegmentId> {
        match &self.inner {
            Inner::Embedded(e) => e.open_segment_edited(name, edit),
            Inner::Attached(a) => a.open_segment_edited(name, edit),
        }
    }

    /// Close a segment, and return once the engine is done with it.
    ///
    /// At once: requests naming it fail `SegmentNotFound` (a worker whose
    /// cached table still has it sees it closed). Then the call waits until
    /// every worker has refreshed its cached segment table and holds no
    /// task on it (tasks accepted before it finish normally, failing over
    /// or timing out as they would have). Only then is it dropped: an shm
    /// peer's mapping is gone, and nothing of the engine reaches the peer
    /// through it again.
    ///
    /// # Errors
    /// `SegmentNotFound` if `id` names no open segment. `Timeout` if tasks
    /// on it have not finished by the latest of their deadlines plus twice
    /// the TCP stall limit: it stays closed (requests refused) and held;
    /// call again to finish.
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.close_segment(id),
            Inner::Attached(a) => a.close_segment(id),
        }
    }

    /// The regions a segment offers (addresses are what remote offsets name).
    pub fn segment_regions(&self, id: SegmentId) -> Result<Vec<RemoteRegion>> {
        match &self.inner {
            Inner::Embedded(e) => e.segment_regions(id),
            Inner::Attached(a) => a.segment_regions(id),
        }
    }

    /// The shm attachment of an open segment (tests present wrong keys through it).
    #[cfg(any(test, feature = "testing"))]
    pub fn segment_peer(&self, id: SegmentId) -> Option<Arc<ShmPeer>> {
        match &self.inner {
            Inner::Embedded(e) => e.segment_peer(id),
            Inner::Attached(a) => a.segment_peer(id),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        match &self.inner {
            Inner::Embedded(e) => e.config(),
            Inner::Attached(a) => a.config(),
        }
    }

    /// This engine's shm export (tests forge descriptors through it).
    #[cfg(any(test, feature = "testing"))]
    pub fn shm_export(&self) -> Option<&ShmExport> {
        match &self.inner {
            Inner::Embedded(e) => e.shm_export(),
            Inner::Attached(a) => a.shm_export(),
        }
    }

    /// The name of this engine's shared-memory segment (`None` with shm
    /// off): a peer on this host may open it directly.
    pub fn local_segment_name(&self) -> Option<&str> {
        match &self.inner {
            Inner::Embedded(e) => e.local_segment_name(),
            Inner::Attached(a) => a.local_segment_name(),
        }
    }

    /// Where this engine's TCP data server listens (`None` with tcp off).
    pub fn tcp_data_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.inner {
            Inner::Embedded(e) => e.tcp_data_addr(),
            Inner::Attached(a) => a.tcp_data_addr(),
        }
    }

    /// This engine's p2p segment name, `ip:port` of its control server
    /// (TENT's segment naming): what peers pass to `open_segment`. An
    /// attached engine's is its daemon's, `#`, and its mailbox in 16 hex
    /// digits: the daemon's memory, where this engine's is, and this
    /// engine as the receiver of notifications. Any engine opens such a
    /// name (but another client of the same daemon, which is refused the
    /// daemon's own segment); several names of one owner share its
    /// connections.
    pub fn segment_name(&self) -> String {
        match &self.inner {
            Inner::Embedded(e) => e.segment_name(),
            Inner::Attached(a) => a.segment_name(),
        }
    }

    /// Replace the transport in `kind`'s slot (tests wrap transports with
    /// fault injection this way); returns the previous one. `t` is not
    /// installed again; one with per-worker state serves the engine that
    /// installed it or else whose worker first uses it, and refuses the
    /// others' slices with `InvalidArgument`.
    #[cfg(any(test, feature = "testing"))]
    pub fn swap_transport(
        &self,
        kind: TransportKind,
        t: Option<std::sync::Arc<dyn crate::transport::Transport>>,
    ) -> Option<std::sync::Arc<dyn crate::transport::Transport>> {
        match &self.inner {
            Inner::Embedded(e) => e.swap_transport(kind, t),
            Inner::Attached(a) => a.swap_transport(kind, t),
        }
    }

    /// Failover counters.
    #[cfg(any(test, feature = "testing"))]
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        match &self.inner {
            Inner::Embedded(e) => e.metrics(),
            Inner::Attached(a) => a.metrics(),
        }
    }

    /// Every rail of every open segment (RDMA and TCP), with the segment's
    /// name.
    pub fn all_rails(&self) -> Vec<(String, crate::transport::RailStat)> {
        match &self.inner {
            Inner::Embedded(e) => e.all_rails(),
            Inner::Attached(a) => a.all_rails(),
        }
    }

    /// Every RDMA rail's send- and completion-queue counters (seed 004's
    /// SQ/CQE diagnostics), a row per QP slot of the rail
    /// (`qp_per_transfer`), every worker's endpoint there together.
    pub fn sq_rows(&self) -> Vec<crate::flow::SqRow> {
        match &self.inner {
            Inner::Embedded(e) => e.sq_rows(),
            Inner::Attached(a) => a.sq_rows(),
        }
    }

    /// Every metric `/metrics` serves, as OpenMetrics text (ending in
    /// `# EOF`): failover counters, per-rail and per-SQ series (at most
    /// `metrics/max_labelled_peers` peers with their own, the rest summed
    /// under `segment="_other"`), request counters and latencies, QoS
    /// figures, and the HTTP server's counters when it runs.
    pub fn metrics_text(&self) -> String {
        match &self.inner {
            Inner::Embedded(e) => e.metrics_text(),
            Inner::Attached(a) => a.metrics_text(),
        }
    }

    /// Per-priority statistics summed over the workers (seed 001): lane
    /// depths, tasks accepted, promotions, slot-gate holds, queue-wait
    /// histograms, and the shared slot clock when one is configured.
    pub fn qos_stats(&self) -> crate::qos::QosSnapshot {
        match &self.inner {
            Inner::Embedded(e) => e.qos_stats(),
            Inner::Attached(a) => a.qos_stats(),
        }
    }

    /// The shared slot clock this engine follows (`None`: single-process
    /// mode, `shared_quota_shm_path` empty).
    #[cfg(any(test, feature = "testing"))]
    pub fn slot_clock(&self) -> Option<&std::sync::Arc<crate::qos::SlotClock>> {
        match &self.inner {
            Inner::Embedded(e) => e.slot_clock(),
            Inner::Attached(a) => a.slot_clock(),
        }
    }

    /// This host as the engine sees and uses it (what `/topology`
    /// serves): NUMA nodes and their CPUs; each RDMA NIC's NUMA node, PCI
    /// address, port state, speed and the GID in use with why; where each
    /// worker runs and why. Reads each NIC's port and GID table now.
    pub fn topology_report(&self) -> crate::engine::TopologyReport {
        match &self.inner {
            Inner::Embedded(e) => e.topology_report(),
            Inner::Attached(a) => a.topology_report(),
        }
    }

    /// The RDMA and TCP rails this engine would form to the peer
    /// `segment`, from its descriptor (fetched with this engine's secret
    /// within `timeout`), with why there are none when there are none.
    /// Connects no QP and no TCP connection (the TCP rails' local ends are
    /// the routing table's, as the TCP transport asks it). An error when
    /// the descriptor cannot be fetched.
    pub fn planned_rails(
        &self,
        segment: &str,
        timeout: std::time::Duration,
    ) -> crate::Result<crate::engine::topology_report::RailsTo> {
        match &self.inner {
            Inner::Embedded(e) => e.planned_rails(segment, timeout),
            Inner::Attached(a) => a.planned_rails(segment, timeout),
        }
    }

    /// Where the HTTP endpoint listens (`http://ip:port`; `None` with
    /// `metrics/http_enable` off): `/metrics`, `/metrics/json`, `/health`,
    /// `/health/live`, `/health/ready` and `/topology`.
    pub fn http_url(&self) -> Option<&str> {
        match &self.inner {
            Inner::Embedded(e) => e.http_url(),
            Inner::Attached(a) => a.http_url(),
        }
    }

    /// The bearer token the HTTP endpoint requires on every path but
    /// `/health/live` when `rpc_shared_secret` is set (`None` without a
    /// secret): what a Prometheus scrape config's `authorization:
    /// credentials:` takes. It is derived from the secret, so every engine
    /// sharing the secret takes the same token.
    pub fn http_bearer_token(&self) -> Option<String> {
        match &self.inner {
            Inner::Embedded(e) => e.http_bearer_token(),
            Inner::Attached(a) => a.http_bearer_token(),
        }
    }

    /// Installed transports.
    pub fn transports(&self) -> Vec<TransportKind> {
        match &self.inner {
            Inner::Embedded(e) => e.transports(),
            Inner::Attached(a) => a.transports(),
        }
    }

    /// Flow-control credits taken and not given back (0 when idle): every
    /// worker's window on each transport, plus every TCP connection's wire
    /// window (a TCP slice on the wire holds one in each).
    pub fn credits_in_flight(&self) -> u32 {
        match &self.inner {
            Inner::Embedded(e) => e.credits_in_flight(),
            Inner::Attached(a) => a.credits_in_flight(),
        }
    }

    /// The core each worker is pinned to (`None`: not pinned).
    pub fn worker_cores(&self) -> Vec<Option<usize>> {
        match &self.inner {
            Inner::Embedded(e) => e.worker_cores(),
            Inner::Attached(a) => a.worker_cores(),
        }
    }

    /// Operations and bytes completed successfully so far.
    pub fn completed(&self) -> (u64, u64) {
        match &self.inner {
            Inner::Embedded(e) => e.completed(),
            Inner::Attached(a) => a.completed(),
        }
    }

    /// Of [`completed`](Self::completed)'s ops, how many completed at
    /// intake, with no task (a small op on a synchronous transport with
    /// nothing ready queued ahead of it: see `docs/ARCHITECTURE.md`).
    pub fn completed_inline(&self) -> u64 {
        match &self.inner {
            Inner::Embedded(e) => e.completed_inline(),
            Inner::Attached(a) => a.completed_inline(),
        }
    }

    /// Seed 003's traffic statistics: every rail of every open segment
    /// with the bytes it carried, its bandwidth estimate and what is on it
    /// now (`Display` prints `=== Device Traffic Statistics ===`).
    pub fn traffic_stats(&self) -> crate::transport::rails::TrafficStats {
        match &self.inner {
            Inner::Embedded(e) => e.traffic_stats(),
            Inner::Attached(a) => a.traffic_stats(),
        }
    }

    /// A new ring of `ring_depth` entries, attached to the next worker.
    pub fn ring(&self) -> Result<Ring> {
        match &self.inner {
            Inner::Embedded(e) => e.ring(),
            Inner::Attached(a) => a.ring(),
        }
    }

    /// A new ring of `depth` entries (a power of two).
    pub fn ring_with_depth(&self, depth: u32) -> Result<Ring> {
        match &self.inner {
            Inner::Embedded(e) => e.ring_with_depth(depth),
            Inner::Attached(a) => a.ring_with_depth(depth),
        }
    }

    /// A batch able to hold `capacity` tasks.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        match &self.inner {
            Inner::Embedded(e) => e.allocate_batch(capacity),
            Inner::Attached(a) => a.allocate_batch(capacity),
        }
    }

    /// Submit `requests` into `batch` (appending to earlier submits). All or
    /// nothing: on an error no request of this call was queued and the
    /// batch's tasks are as they were (an `Initial` task stays `Initial`).
    /// Each SQE's `user_data` is replaced by the engine.
    ///
    /// The requests go to one worker's batch ring together; that ring holds
    /// a whole batch (`Config::batch_ring_depth`: `max_batch_size`, at
    /// least `ring_depth`), so any batch the table accepts fits in one
    /// call. When the ring has less room than the call needs, it waits up
    /// to `default_timeout_ms` for the worker to make room, then fails
    /// `SqFull` with nothing queued.
    pub fn submit(&self, batch: BatchId, requests: &[Sqe]) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.submit(batch, requests),
            Inner::Attached(a) => a.submit(batch, requests),
        }
    }

    /// Status of task `task` of `batch`.
    pub fn status(&self, batch: BatchId, task: usize) -> Result<TaskStatus> {
        match &self.inner {
            Inner::Embedded(e) => e.status(batch, task),
            Inner::Attached(a) => a.status(batch, task),
        }
    }

    /// Status of every submitted task of `batch`.
    pub fn status_list(&self, batch: BatchId) -> Result<Vec<TaskStatus>> {
        match &self.inner {
            Inner::Embedded(e) => e.status_list(batch),
            Inner::Attached(a) => a.status_list(batch),
        }
    }

    /// One status for the whole batch.
    pub fn batch_status(&self, batch: BatchId) -> Result<TaskStatus> {
        match &self.inner {
            Inner::Embedded(e) => e.batch_status(batch),
            Inner::Attached(a) => a.batch_status(batch),
        }
    }

    /// Ask every task of `batch` to stop; each ends `Canceled` (or its
    /// natural state if it finished first).
    pub fn cancel(&self, batch: BatchId) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.cancel(batch),
            Inner::Attached(a) => a.cancel(batch),
        }
    }

    /// Cancel one task.
    pub fn cancel_task(&self, batch: BatchId, task: usize) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.cancel_task(batch, task),
            Inner::Attached(a) => a.cancel_task(batch, task),
        }
    }

    /// Free a batch; refused while any task is pending, and for an id that
    /// is not allocated (a double free).
    pub fn free_batch(&self, batch: BatchId) -> Result<()> {
        match &self.inner {
            Inner::Embedded(e) => e.free_batch(batch),
            Inner::Attached(a) => a.free_batch(batch),
        }
    }

    /// Wait until nothing of `batch` is in flight (or `timeout`), and return
    /// its state: at once for a batch with nothing submitted (`Initial`:
    /// there is nothing to wait for), else once every task has ended and,
    /// if they all completed, every attached notification is delivered.
    /// Looks and yields the core for the first 200 µs (short transfers end
    /// within it; as `Ring::wait_ready`), then sleeps between looks, 10 µs
    /// doubling to 1 ms, so a caller waiting on a long transfer does not
    /// hold a core the workers need.
    pub fn wait_batch(&self, batch: BatchId, timeout: Duration) -> Result<TaskStatus> {
        match &self.inner {
            Inner::Embedded(e) => e.wait_batch(batch, timeout),
            Inner::Attached(a) => a.wait_batch(batch, timeout),
        }
    }
}
