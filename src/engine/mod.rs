//! The engine: configuration, registered memory, segments, workers, and the
//! batch and ring APIs over them.

mod batch;
pub mod footprint;
mod ring;
mod task;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use tent_rings::spsc;
use tent_rings::{Cqe, ErrorKind, RegionId, SegmentId, Sqe, TransportKind};

pub use batch::{BatchId, TaskState, TaskStatus};
pub use footprint::{Available, Footprint};
pub use ring::{CompletionQueue, Ring, SubmissionQueue};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::flow::{AdmissionToken, SqController};
use crate::memory::{MemRegion, RegionTable};
use crate::qos::{OpenGate, SendGate, SlotClock, SlotRotator};
use crate::segment::{
    Attachment, RemoteRegion, Segment, SegmentKind, SegmentTable, ShmExport, ShmPeer,
};
use crate::topology::{Topology, pin_current_thread};
use crate::transport::local::LocalTransport;
use crate::transport::rdma::RdmaTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::tcp::{self, DataServer, TcpTransport};
use crate::transport::{EngineId, InstallContext, Transport, TransportSlots, WorkerCtx};
use batch::BatchTable;
use worker::{RegionAck, Worker, WorkerRing, WorkerShared};

/// How often `unregister_memory` looks whether the workers and the TCP
/// data server are done with a region (and rings the workers that are not),
/// after `DRAIN_YIELDS` quick looks (a woken idle worker acknowledges within
/// microseconds).
const DRAIN_POLL: Duration = Duration::from_millis(1);
const DRAIN_YIELDS: u32 = 64;

/// What the workers share with the API side.
pub(crate) struct EngineShared {
    pub config: Config,
    pub regions: Arc<ArcSwap<RegionTable>>,
    /// The last unregister epoch (each `unregister_memory` takes the next),
    /// published after the region is revoked and out of `regions`; workers
    /// read it in housekeeping and acknowledge it (`RegionAck`).
    pub region_epoch: CachePadded<AtomicU64>,
    pub segments: Arc<ArcSwap<SegmentTable>>,
    pub transports: TransportSlots,
    pub gate: Arc<dyn SendGate>,
    /// The TCP transport, when it is the one installed (segments attach to it).
    pub tcp: Option<Arc<TcpTransport>>,
    /// The RDMA NICs in use (memory is registered on each).
    pub rdma: Option<Arc<crate::transport::rdma::NicSet>>,
    /// Failover counters.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The link watch every transport's rails listen to.
    pub links: Arc<crate::transport::rails::RailLinks>,
}

/// The transports that reach peers by descriptor, best first.
const NETWORK: &[TransportKind] = &[TransportKind::Rdma, TransportKind::Tcp];

#[inline]
pub(crate) fn slot_index(kind: TransportKind) -> usize {
    kind as usize
}

/// A transfer engine. `Send + Sync`: share it (e.g. in an `Arc`) across
/// threads; each submitting thread takes its own [`Ring`] or uses the
/// batch API.
pub struct Engine {
    shared: Arc<EngineShared>,
    workers: Vec<Arc<WorkerShared>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    batches: BatchTable,
    export: Option<Arc<ShmExport>>,
    control: Option<crate::control::ControlServer>,
    data: Option<DataServer>,
    registry: Mutex<()>,
    /// Regions out of the table whose `unregister_memory` has not finished
    /// (waiting, or timed out): held, and still registered, until it does.
    retiring: Mutex<Vec<Arc<MemRegion>>>,
    /// Segments out of the table whose `close_segment` has not finished:
    /// held until it does (tasks on them hold them by pointer, `Held`).
    closing: Mutex<Vec<Arc<Segment>>>,
    next_worker: AtomicUsize,
    /// This engine's share of the global slot clock (rotating or
    /// watching); dropped after the workers, handing the lease back.
    slots: Option<SlotRotator>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("workers", &self.workers.len())
            .field("segment", &self.local_segment_name())
            .field("transports", &self.shared.transports)
            .finish()
    }
}

/// Builds an [`Engine`]; every part has a default.
#[derive(Default)]
pub struct EngineBuilder {
    config: Option<Config>,
    topology: Option<Topology>,
    gate: Option<Arc<dyn SendGate>>,
    extra: Vec<Arc<dyn Transport>>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder").finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// Use `config` (default: [`Config::load`], i.e. `TENT_CONF` or defaults).
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Use this topology instead of detecting it.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Gate priorities with `gate` (default: always open).
    pub fn gate(mut self, gate: Arc<dyn SendGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Install `t` in its slot (replacing the built-in one of that kind).
    pub fn transport(mut self, t: Arc<dyn Transport>) -> Self {
        self.extra.push(t);
        self
    }

    /// Start the engine: export the local segment, install transports, start
    /// and place workers.
    pub fn build(self) -> Result<Engine> {
        let config = match self.config {
            Some(c) => c,
            None => Config::load()?,
        };
        // Values each in range can together need more memory than there
        // is: refuse before allocating rather than abort halfway.
        footprint::check(&config)?;
        let topology = self.topology.unwrap_or_else(Topology::detect);
        let regions = Arc::new(ArcSwap::from_pointee(RegionTable::default()));
        let local = Arc::new(Segment::new(
            SegmentId::LOCAL,
            "local".into(),
            SegmentKind::Local,
        ));
        let segments = Arc::new(ArcSwap::from_pointee(SegmentTable::default().with(local)));
        let export = if config.transports.shm.enable {
            let secret = config.secret().map(<[u8]>::to_vec);
            Some(Arc::new(ShmExport::create(
                &config.transports.shm.dir,
                secret,
            )?))
        } else {
            None
        };

        // Say once what RDMA this machine has; with devices, open them (the
        // named ones, or all), register memory on them (rkeys go into the
        // descriptor) and post on them. A device named in the config that
        // is not there, or a GID index out of range, is a config error.
        let rdma = if config.transports.rdma.enable {
            match crate::transport::rdma::sys::devices() {
                Err(why) => {
                    tracing::info!("{why}");
                    None
                }
                Ok(_) => {
                    let r = &config.transports.rdma;
                    let named = r.device_list();
                    match crate::transport::rdma::NicSet::open(&named, r.gid()) {
                        Ok(set) => {
                            tracing::info!(nics = ?set.entries().iter().map(|n| n.name.clone()).collect::<Vec<_>>(), "RDMA NICs opened");
                            Some(Arc::new(set))
                        }
                        Err(e) if !named.is_empty() || r.gid().is_some() => return Err(e),
                        Err(e) => {
                            tracing::warn!(error = %e, "RDMA unavailable; using TCP/SHM");
                            None
                        }
                    }
                }
            }
        } else {
            None
        };
        let transports = TransportSlots::default();
        let wakers = Arc::new(crate::doorbell::Wakers::new(config.workers.count as usize));
        let id = EngineId::next();
        // Where the workers go, before the transports install: they rank
        // their rails per worker by NUMA distance.
        let count = config.workers.count as usize;
        let cores: Vec<Option<usize>> = if config.workers.pin {
            let explicit = &config.workers.cores;
            // Workers poll the NICs' CQs and touch their queues: place
            // them on the NICs' NUMA nodes when the machine says where.
            let near = rdma.as_ref().map(|n| n.numa_nodes()).unwrap_or_default();
            topology
                .place_workers_near(count, explicit, &near)
                .map_err(|e| Error::invalid("worker placement").with_source(e))?
                .into_iter()
                .map(Some)
                .collect()
        } else {
            vec![None; count]
        };
        let links = crate::transport::rails::RailLinks::new();
        let placement = Arc::new(crate::transport::rails::Placement {
            nodes: cores.iter().map(|&c| topology.worker_node(c)).collect(),
            topology: Some(topology.clone()),
        });
        let ctx = InstallContext {
            engine: id,
            workers: config.workers.count as usize,
            wakers: wakers.clone(),
            placement,
            links: links.clone(),
        };
        let mut wanted: Vec<Arc<dyn Transport>> = Vec::new();
        let rdma_t = rdma
            .as_ref()
            .map(|nics| Arc::new(RdmaTransport::new(&config, nics.clone())));
        if let Some(t) = &rdma_t {
            wanted.push(t.clone());
        }
        if config.transports.local.enable {
            wanted.push(Arc::new(LocalTransport::new(regions.clone())));
        }
        if config.transports.shm.enable {
            wanted.push(Arc::new(ShmTransport));
        }
        let tcp = config
            .transports
            .tcp
            .enable
            .then(|| Arc::new(TcpTransport::new(&config)));
        if let Some(t) = &tcp {
            wanted.push(t.clone());
        }
        for t in self.extra {
            wanted.retain(|w| w.kind() != t.kind());
            wanted.push(t);
        }
        for t in wanted {
            match t.install(&ctx) {
                Ok(()) => {
                    tracing::info!(transport = %t.kind(), "transport installed");
                    transports.swap(Some(t.clone()), t.kind());
                }
                Err(e) => {
                    tracing::warn!(transport = %t.kind(), error = %e, "transport failed to install; running without it")
                }
            }
        }

        // Ours only if a builder-supplied transport did not take its slot.
        let ours = |kind: TransportKind, p: *const ()| {
            transports
                .slot(kind)
                .load()
                .as_ref()
                .is_some_and(|i| std::ptr::addr_eq(Arc::as_ptr(&i.transport), p))
        };
        let tcp = tcp.filter(|t| ours(TransportKind::Tcp, Arc::as_ptr(t) as *const ()));
        // Seed 001's global time slots: join (or create) the slot file
        // before anything starts, so a refused file fails the build.
        let (gate, slots) = match self.gate {
            Some(g) => (g, None),
            None if !config.transports.rdma.shared_quota_shm_path.is_empty() => {
                let clock = Arc::new(SlotClock::open(
                    &config.transports.rdma.shared_quota_shm_path,
                    Duration::from_millis(config.transports.rdma.slot_rotation_interval_ms),
                )?);
                let rotator = SlotRotator::start(clock.clone())?;
                tracing::info!(path = %clock.path().display(),
                    interval_ms = config.transports.rdma.slot_rotation_interval_ms,
                    "QoS time slots shared through the slot file");
                (clock as Arc<dyn SendGate>, Some(rotator))
            }
            None => (Arc::new(OpenGate) as Arc<dyn SendGate>, None),
        };
        let shared = Arc::new(EngineShared {
            rdma,
            tcp,
            regions,
            region_epoch: CachePadded::new(AtomicU64::new(0)),
            segments,
            transports,
            gate,
            metrics: Arc::new(crate::metrics::Metrics::default()),
            links,
            config,
        });

        // The fallible servers first, then the workers: an error returns
        // before any worker runs, and whatever was started drops (each
        // server stops and joins on drop; the transports, link watch
        // included, go with the last `EngineShared`).
        let data = start_data_server(&shared)?;
        let rails = data.as_ref().map(|(_, r)| r.clone()).unwrap_or_default();
        let control = Some(start_control(&shared, export.clone(), rails)?);
        let batches = BatchTable::new(
            shared.config.max_batches as usize,
            shared.config.max_batch_size as usize,
        );
        let depth = shared.config.batch_ring_depth();
        let inflight = shared.config.max_inflight_slices;
        // Workers started so far; stopped and joined if a later one fails.
        let mut started = Workers::default();
        for (index, core) in cores.into_iter().enumerate() {
            let (bp, bc) = spsc::channel::<Sqe>(depth)
                .map_err(|e| Error::invalid("batch ring").with_source(e))?;
            let ws = Arc::new(WorkerShared {
                index,
                wakers: wakers.clone(),
                new_rings: Mutex::new(Vec::new()),
                has_new: CachePadded::new(AtomicBool::new(false)),
                shutdown: CachePadded::new(AtomicBool::new(false)),
                exited: CachePadded::new(AtomicBool::new(false)),
                batch_sq: Mutex::new(bp),
                core: AtomicI64::new(-1),
                // Nobody waits on a worker's window: the slice length is moot.
                credits: std::array::from_fn(|_| {
                    SqController::new(inflight, 0, Duration::from_millis(1))
                }),
                completed_ops: CachePadded::new(AtomicU64::new(0)),
                completed_bytes: CachePadded::new(AtomicU64::new(0)),
                region_ack: CachePadded::new(RegionAck::default()),
                qos: CachePadded::new(crate::qos::PriorityStats::default()),
            });
            let (ws2, engine) = (ws.clone(), shared.clone());
            let handle = std::thread::Builder::new()
                .name(format!("tent-worker-{index}"))
                .spawn(move || {
                    if let Some(core) = core
                        && pin_current_thread(core)
                    {
                        ws2.core.store(core as i64, Ordering::Relaxed);
                    }
                    // SAFETY: `id` is this engine's alone (EngineId::next) and it starts one thread per worker index: this is worker `index`'s, and the context (`!Send`) never leaves it.
                    let ctx = unsafe { WorkerCtx::new(id, index) };
                    Worker::new(ws2, engine, bc, ctx).run();
                })
                .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn worker").with_source(e))?;
            started.shared.push(ws);
            started.threads.push(handle);
        }
        let (workers, threads) = started.into_parts();
        Ok(Engine {
            shared,
            workers,
            threads: Mutex::new(threads),
            batches,
            export,
            control,
            data: data.map(|(d, _)| d),
            registry: Mutex::new(()),
            retiring: Mutex::new(Vec::new()),
            closing: Mutex::new(Vec::new()),
            next_worker: AtomicUsize::new(0),
            slots,
        })
    }
}

impl Engine {
    /// An engine from `config`.
    pub fn new(config: Config) -> Result<Engine> {
        EngineBuilder::default().config(config).build()
    }

    /// A builder.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    // ---- memory -------------------------------------------------------

    /// Allocate `len` bytes of registered memory, zeroed. With the shm
    /// transport on, it is exported so peers on this host can reach it.
    pub fn allocate_memory(&self, len: u64) -> Result<Buffer> {
        if len == 0 {
            return Err(Error::invalid("allocate_memory: zero length"));
        }
        let _g = self.registry.lock().expect("registry poisoned");
        let table = self.shared.regions.load_full();
        let id = table.next_id();
        let region = match &self.export {
            Some(export) => {
                let mem = export.allocate(len)?;
                let ptr = mem.data_ptr();
                let region = MemRegion::new(id, ptr, len, Some(Box::new(mem.clone())));
                // SAFETY: the region owns the mapping, which outlives its RDMA registration (dropped first).
                let region = Arc::new(unsafe { self.register_rdma(region, ptr, len)? });
                export.publish(&mem, id, len, region.key())?;
                region
            }
            None => {
                let heap = HeapMemory::new(len)?;
                let ptr = heap.ptr;
                let region = MemRegion::new(id, ptr, len, Some(Box::new(heap)));
                // SAFETY: as above, for the anonymous mapping.
                Arc::new(unsafe { self.register_rdma(region, ptr, len)? })
            }
        };
        self.shared
            .regions
            .store(Arc::new(table.with(region.clone())?));
        Ok(Buffer { region })
    }

    /// Register memory the application owns.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay valid (allocated, not freed or unmapped)
    /// until [`Engine::unregister_memory`] returns `Ok` for it (the engine
    /// is then done with it) or the engine is dropped.
    pub unsafe fn register_memory(&self, ptr: *mut u8, len: u64) -> Result<Buffer> {
        if len == 0 || ptr.is_null() {
            return Err(Error::invalid(
                "register_memory: null pointer or zero length",
            ));
        }
        let _g = self.registry.lock().expect("registry poisoned");
        let table = self.shared.regions.load_full();
        let region = MemRegion::new(table.next_id(), ptr, len, None);
        // SAFETY: the caller keeps the memory mapped while it is registered.
        let region = Arc::new(unsafe { self.register_rdma(region, ptr, len)? });
        self.shared
            .regions
            .store(Arc::new(table.with(region.clone())?));
        Ok(Buffer { region })
    }

    /// Register `region` on every RDMA NIC (a no-op without RDMA).
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay mapped while the region lives.
    unsafe fn register_rdma(&self, region: MemRegion, ptr: *mut u8, len: u64) -> Result<MemRegion> {
        let Some(nics) = &self.shared.rdma else {
            return Ok(region);
        };
        // SAFETY: forwarded from the caller.
        let reg = unsafe { nics.register(ptr, len as usize)? };
        let lkeys = (0..nics.nics().len()).filter_map(|i| reg.lkey(i)).collect();
        Ok(region.with_rdma(reg.rkeys(), lkeys, Box::new(reg)))
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
        let region = self.withdraw(id)?;
        self.drain(&region)?;
        region.release_rdma();
        self.retiring
            .lock()
            .expect("retiring regions poisoned")
            .retain(|r| r.id() != id);
        Ok(())
    }

    /// Take region `id` out of the table and revoke it at the next
    /// unregister epoch, or find it withdrawn by an earlier call that has
    /// not finished.
    fn withdraw(&self, id: RegionId) -> Result<Arc<MemRegion>> {
        let _g = self.registry.lock().expect("registry poisoned");
        let table = self.shared.regions.load_full();
        let Some((next, removed)) = table.without(id) else {
            return self
                .retiring
                .lock()
                .expect("retiring regions poisoned")
                .iter()
                .find(|r| r.id() == id)
                .cloned()
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::AddressNotRegistered,
                        format!("region {} is not registered", id.0),
                    )
                });
        };
        self.next_epoch(|epoch| {
            removed.revoke(epoch);
            if let Some(export) = &self.export {
                export.revoke(id);
            }
            self.shared.regions.store(Arc::new(next));
            self.retiring
                .lock()
                .expect("retiring regions poisoned")
                .push(removed.clone());
        });
        Ok(removed)
    }

    /// Take the next unregister epoch (shared by `unregister_memory` and
    /// `close_segment`, its only writers, both under the registry lock):
    /// `retire(epoch)` marks what leaves a table at it and stores the table
    /// without it; the epoch is published after (Release), so a worker that
    /// reads it sees both.
    fn next_epoch(&self, retire: impl FnOnce(u64)) {
        let epoch = self.shared.region_epoch.load(Ordering::Relaxed) + 1;
        retire(epoch);
        self.shared.region_epoch.store(epoch, Ordering::Release);
    }

    /// Wait until no worker and no TCP data server thread uses `region`
    /// (revoked), ringing workers that have not acknowledged its epoch so a
    /// parked one wakes; `Timeout` past the bound (see
    /// [`Engine::unregister_memory`]).
    fn drain(&self, region: &MemRegion) -> Result<()> {
        self.drain_epoch(
            region.revoked_epoch(),
            || region.in_use(),
            |workers, served| {
                format!(
                    "region {} still in use past the drain bound ({workers} worker(s) with tasks on it, {served} TCP op(s) being served): it stays withdrawn and registered; do not free it, call unregister_memory again",
                    region.id().0
                )
            },
        )
    }

    /// Wait until every worker has acknowledged unregister epoch `epoch`
    /// (none holds a live task on what it took out) and `served()` is 0,
    /// ringing workers that have not so a parked one wakes; `Timeout` with
    /// `why(workers, served)` past the latest deadline of such a task (or
    /// the call) plus twice the TCP stall limit.
    fn drain_epoch(
        &self,
        epoch: u64,
        served: impl Fn() -> u64,
        why: impl Fn(usize, u64) -> String,
    ) -> Result<()> {
        let cfg = &self.shared.config;
        let stall = tcp::server::stall_limit(
            cfg.transports.tcp.user_timeout_ms.min(u32::MAX as u64) as u32,
        );
        let grace = u64::try_from(stall.as_nanos().saturating_mul(2)).unwrap_or(u64::MAX);
        let start = crate::clock::monotonic_ns();
        let mut look = 0u32;
        loop {
            // Ring on the first look and on every slow one, not per yield.
            let ring = look == 0 || look >= DRAIN_YIELDS;
            let (mut workers, mut latest) = (0, start);
            for w in &self.workers {
                // Acquire: pairs with the worker's Release of its ack: what
                // its tasks did to the memory happens before.
                if w.region_ack.epoch.load(Ordering::Acquire) >= epoch {
                    continue;
                }
                workers += 1;
                latest = latest.max(w.region_ack.wait_until.load(Ordering::Relaxed));
                if ring {
                    w.doorbell().ring();
                }
            }
            let served = served();
            if workers == 0 && served == 0 {
                return Ok(());
            }
            if crate::clock::monotonic_ns() > latest.saturating_add(grace) {
                return Err(Error::new(ErrorKind::Timeout, why(workers, served)));
            }
            if look < DRAIN_YIELDS {
                look += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(DRAIN_POLL);
            }
        }
    }

    // ---- segments -----------------------------------------------------

    /// This engine's shm export (tests forge descriptors through it).
    #[doc(hidden)]
    pub fn shm_export(&self) -> Option<&ShmExport> {
        self.export.as_deref()
    }

    /// The name of this engine's shared-memory segment (`None` with shm
    /// off): a peer on this host may open it directly.
    pub fn local_segment_name(&self) -> Option<&str> {
        self.export.as_deref().map(ShmExport::name)
    }

    /// Where this engine's TCP data server listens (`None` with tcp off).
    pub fn tcp_data_addr(&self) -> Option<std::net::SocketAddr> {
        self.data.as_ref().map(DataServer::local_addr)
    }

    /// This engine's p2p segment name, `ip:port` of its control server
    /// (TENT's segment naming): what peers pass to `open_segment`.
    pub fn segment_name(&self) -> String {
        match &self.control {
            Some(c) => c.local_addr().to_string(),
            None => self.local_segment_name().unwrap_or("local").to_owned(),
        }
    }

    /// The rails to an open segment (RDMA's, then TCP's), with their
    /// health and counters (empty when neither reaches it).
    pub fn rails(&self, id: SegmentId) -> Vec<crate::transport::RailStat> {
        self.shared
            .segments
            .load()
            .get(id)
            .map(|s| self.rails_of(s))
            .unwrap_or_default()
    }

    /// The rails every network transport has to `segment`, best first.
    fn rails_of(&self, segment: &Segment) -> Vec<crate::transport::RailStat> {
        NETWORK
            .iter()
            .filter_map(|&k| self.shared.transports.slot(k).load_full())
            .flat_map(|t| t.transport.rail_stats(segment))
            .collect()
    }

    /// Seed 003's traffic statistics: every rail of every open segment
    /// with the bytes it carried, its bandwidth estimate and what is on it
    /// now (`Display` prints `=== Device Traffic Statistics ===`).
    pub fn traffic_stats(&self) -> crate::transport::rails::TrafficStats {
        crate::transport::rails::TrafficStats {
            rails: self.all_rails(),
        }
    }

    /// Is the process behind `segment` still the one this engine opened
    /// (TENT's `probePeerAliveByID`)? A segment opened by `ip:port` asks
    /// the peer's control server (handshake and descriptor, each step
    /// within `timeout`): alive when it answers as the same process (host
    /// and pid of the descriptor the segment was opened with); not when it
    /// does not answer, refuses, or another process now answers there (a
    /// restarted peer: its memory and keys are not the ones opened). An
    /// shm segment is alive while its owner serves it; the local segment
    /// always is. For a caller deciding whether to close a segment whose
    /// transfers keep failing; it runs on the calling thread, never on a
    /// worker. `Err`: the segment is not open.
    pub fn probe_peer_alive(&self, segment: SegmentId, timeout: Duration) -> Result<bool> {
        if segment == SegmentId::LOCAL {
            return Ok(true);
        }
        let table = self.shared.segments.load_full();
        let seg = table.get(segment).ok_or_else(|| {
            Error::new(
                ErrorKind::SegmentNotFound,
                format!("segment {} is not open", segment.0),
            )
        })?;
        let (host, pid) = match seg.kind() {
            SegmentKind::Local => return Ok(true),
            SegmentKind::Shm(peer) if !crate::control::is_p2p_name(seg.name()) => {
                return Ok(peer.owner_alive());
            }
            SegmentKind::Shm(peer) => {
                if !peer.owner_alive() {
                    return Ok(false);
                }
                (None, peer.owner_pid())
            }
            SegmentKind::Remote(d) => (Some(d.host_id.clone()), d.pid),
        };
        let cfg = &self.shared.config;
        let secret = cfg.secret();
        let alive = match crate::control::fetch_descriptor(seg.name(), secret, timeout) {
            Ok(d) => d.pid == pid && host.is_none_or(|h| h == d.host_id),
            Err(e) => {
                tracing::debug!(segment = seg.name(), error = %e, "peer probe: no answer");
                false
            }
        };
        Ok(alive)
    }

    /// Open a segment by name (`"local"` or this engine's own name is
    /// segment 0). Opening the same name twice returns the same id.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        self.open_segment_edited(name, |_| {})
    }

    /// [`Engine::open_segment`] with the peer's descriptor passed through
    /// `edit` first: how tests present a forged or partial descriptor (a
    /// zeroed rkey, a NIC without keys) to the transports.
    #[doc(hidden)]
    pub fn open_segment_edited(
        &self,
        name: &str,
        edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<SegmentId> {
        if name == "local" || Some(name) == self.local_segment_name() || name == self.segment_name()
        {
            return Ok(SegmentId::LOCAL);
        }
        let _g = self.registry.lock().expect("registry poisoned");
        let table = self.shared.segments.load_full();
        if let Some(s) = table.find_name(name) {
            return Ok(s.id());
        }
        let (kind, attached) = if crate::control::is_p2p_name(name) {
            self.open_p2p(name, edit)?
        } else {
            (self.open_shm(name)?, Vec::new())
        };
        let id = table.next_id();
        let mut seg = Segment::new(id, name.to_owned(), kind);
        for (k, peer) in attached {
            seg = seg.with_attachment(k, peer);
        }
        let seg = Arc::new(seg);
        self.shared.segments.store(Arc::new(table.with(seg)));
        tracing::info!(segment = name, id = id.0, "segment opened");
        Ok(id)
    }

    fn open_shm(&self, name: &str) -> Result<SegmentKind> {
        if !self.shared.config.transports.shm.enable {
            return Err(Error::new(
                ErrorKind::SegmentNotFound,
                format!("segment {name:?}: no transport can open it (shm disabled)"),
            ));
        }
        let cfg = &self.shared.config;
        let secret = cfg.secret();
        // Connecting proves the owner lives: it serves the segment's socket.
        let peer = ShmPeer::attach(&cfg.transports.shm.dir, name, secret)?;
        Ok(SegmentKind::Shm(Arc::new(peer)))
    }

    /// Fetch the descriptor from the peer's control server; on the same
    /// host with shm exported, reach it through shared memory; else attach
    /// every network transport both ends have, best first (RDMA, TCP).
    fn open_p2p(
        &self,
        name: &str,
        edit: impl FnOnce(&mut crate::control::SegmentDescriptor),
    ) -> Result<(SegmentKind, Vec<(TransportKind, Attachment)>)> {
        let cfg = &self.shared.config;
        let secret = cfg.secret();
        let timeout = Duration::from_millis(cfg.default_timeout_ms.min(10_000));
        let mut desc = crate::control::fetch_descriptor(name, secret, timeout)?;
        edit(&mut desc);
        if cfg.transports.shm.enable
            && desc.host_id == crate::control::host_id()
            && let Some(shm) = &desc.shm_name
        {
            match self.open_shm(shm) {
                Ok(kind) => return Ok((kind, Vec::new())),
                // Same kernel, different /dev/shm (another mount namespace).
                Err(e) => {
                    tracing::info!(segment = name, error = %e, "peer on this host but its shm segment is not visible here")
                }
            }
        }
        let mut attached: Vec<(TransportKind, Attachment)> = Vec::new();
        for &k in NETWORK {
            let Some(t) = self.shared.transports.slot(k).load_full() else {
                continue;
            };
            match t.transport.attach_peer(name, &desc) {
                None => {}
                Some(Ok(peer)) => attached.push((k, peer)),
                // Not the network's fault (rings, threads): say so now.
                Some(Err(e)) if e.kind() != ErrorKind::Unreachable => return Err(e),
                Some(Err(e)) => {
                    tracing::warn!(segment = name, transport = %k, error = %e, "peer offers this transport but no rail reaches it")
                }
            }
        }
        if attached.is_empty() {
            tracing::warn!(
                segment = name,
                "no transport reaches this peer; its requests will fail Unreachable"
            );
        }
        Ok((SegmentKind::Remote(Arc::new(desc)), attached))
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
        if id == SegmentId::LOCAL {
            return Err(Error::invalid("the local segment cannot be closed"));
        }
        let segment = {
            let _g = self.registry.lock().expect("registry poisoned");
            let table = self.shared.segments.load_full();
            match table.without(id) {
                Some((next, removed)) => {
                    self.next_epoch(|epoch| {
                        removed.close(epoch);
                        self.shared.segments.store(Arc::new(next));
                        self.closing
                            .lock()
                            .expect("closing segments poisoned")
                            .push(removed.clone());
                    });
                    removed
                }
                // Closed by an earlier call that has not finished.
                None => self
                    .closing
                    .lock()
                    .expect("closing segments poisoned")
                    .iter()
                    .find(|s| s.id() == id)
                    .cloned()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::SegmentNotFound,
                            format!("segment {} is not open", id.0),
                        )
                    })?,
            }
        };
        self.drain_epoch(
            segment.closed_epoch(),
            || 0,
            |workers, _| {
                format!(
                    "segment {} ({}) still has tasks past the drain bound ({workers} worker(s)): it stays closed; call close_segment again",
                    id.0,
                    segment.name()
                )
            },
        )?;
        self.closing
            .lock()
            .expect("closing segments poisoned")
            .retain(|s| s.id() != id);
        Ok(())
    }

    /// The regions a segment offers (addresses are what remote offsets name).
    pub fn segment_regions(&self, id: SegmentId) -> Result<Vec<RemoteRegion>> {
        let table = self.shared.segments.load();
        let seg = table.get(id).ok_or_else(|| {
            Error::new(
                ErrorKind::SegmentNotFound,
                format!("segment {} is not open", id.0),
            )
        })?;
        Ok(match seg.kind() {
            SegmentKind::Local => self
                .shared
                .regions
                .load()
                .iter()
                .map(|r| RemoteRegion {
                    id: r.id(),
                    addr: r.addr(),
                    len: r.len(),
                })
                .collect(),
            SegmentKind::Shm(peer) => peer.regions(),
            SegmentKind::Remote(d) => d
                .regions
                .iter()
                .map(|r| RemoteRegion {
                    id: RegionId(r.id),
                    addr: r.addr,
                    len: r.len,
                })
                .collect(),
        })
    }

    /// The shm attachment of an open segment (tests present wrong keys through it).
    pub fn segment_peer(&self, id: SegmentId) -> Option<Arc<ShmPeer>> {
        match self.shared.segments.load().get(id)?.kind() {
            SegmentKind::Shm(p) => Some(p.clone()),
            SegmentKind::Local | SegmentKind::Remote(_) => None,
        }
    }

    // ---- rings --------------------------------------------------------

    /// A new ring of `ring_depth` entries, attached to the next worker.
    pub fn ring(&self) -> Result<Ring> {
        self.ring_with_depth(self.shared.config.ring_depth)
    }

    /// A new ring of `depth` entries (a power of two).
    pub fn ring_with_depth(&self, depth: u32) -> Result<Ring> {
        let (sp, sc) =
            spsc::channel::<Sqe>(depth).map_err(|e| Error::invalid("ring depth").with_source(e))?;
        let (cp, cc) =
            spsc::channel::<Cqe>(depth).map_err(|e| Error::invalid("ring depth").with_source(e))?;
        let w = self.pick_worker();
        let bell = Arc::new(crate::doorbell::CqBell::default());
        w.adopt(WorkerRing {
            sq: sc,
            cq: Some(cp),
            outstanding: 0,
            cq_dirty: false,
            cq_bell: Some(bell.clone()),
        });
        Ok(Ring::new(sp, cc, w.clone(), bell))
    }

    fn pick_worker(&self) -> &Arc<WorkerShared> {
        self.pick_worker_at().1
    }

    /// [`pick_worker`](Self::pick_worker), with its index.
    fn pick_worker_at(&self) -> (usize, &Arc<WorkerShared>) {
        let i = self.next_worker.fetch_add(1, Ordering::Relaxed) % self.workers.len();
        (i, &self.workers[i])
    }

    // ---- batches ------------------------------------------------------

    /// A batch able to hold `capacity` tasks.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        self.batches.allocate(capacity)
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
        let b = self.batches.get(batch)?;
        let n = requests.len();
        // Refuse what can never go before waiting for room.
        b.check_claim(n)?;
        let (wi, w) = self.pick_worker_at();
        // Admitted before the ring is touched (waiting here holds no
        // lock); what is not handed to a task below goes back on return.
        let mut admitted = self.admit(wi, requests)?;
        let mut sq = w.batch_sq.lock().expect("batch ring poisoned");
        if n > sq.capacity() {
            return Err(Error::invalid(format!(
                "submit of {n} requests exceeds the batch ring ({} entries): split it",
                sq.capacity()
            )));
        }
        let deadline =
            Instant::now() + Duration::from_millis(self.shared.config.default_timeout_ms);
        // Room for every request first; nothing is published until there is.
        // We hold the ring's only producer, so room found here stays.
        while !sq.has_slots(n) {
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::SqFull,
                    format!(
                        "batch ring had no room for {n} requests within the default timeout; nothing queued"
                    ),
                ));
            }
            w.doorbell().ring();
            std::thread::yield_now();
        }
        let range = b.claim(n)?;
        for (i, r) in requests.iter().enumerate() {
            if let Some(t) = admitted.get_mut(i).and_then(Option::take) {
                b.task(range.start + i).admission().put(t);
            }
            let sqe = r.with_user_data(b.task_ptr(range.start + i) as u64);
            // Cannot fail: `has_slots(n)` above, and only we push.
            let pushed = sq.push(sqe);
            debug_assert!(pushed.is_ok());
        }
        sq.sync();
        if sq.needs_wakeup() {
            w.doorbell().ring();
        }
        Ok(())
    }

    /// Seed 004's executor admission (`sq_executor_admission`): the
    /// requests of a `submit` bound for RDMA peers are charged to worker
    /// `w`'s endpoints to each peer (a request counts one work request per
    /// slice; a peer's charge is at most one endpoint's depth, or all of
    /// them under `capacity`), waiting up to `sq_admission_timeout_us` for
    /// room. Returns each request's share (empty: the gate is off).
    ///
    /// # Errors
    /// `SqFull` naming the endpoint and its counters when the wait ran
    /// out; nothing of the call is queued (shares taken so far go back).
    fn admit(&self, w: usize, requests: &[Sqe]) -> Result<Vec<Option<AdmissionToken>>> {
        let r = &self.shared.config.transports.rdma;
        if !r.sq_executor_admission || requests.is_empty() {
            return Ok(Vec::new());
        }
        let Some(rdma) = self.shared.transports.slot(TransportKind::Rdma).load_full() else {
            return Ok(Vec::new());
        };
        let slice = match rdma.caps.slice_bytes {
            0 => self.shared.config.block_size.max(1),
            n => n,
        };
        let timeout = Duration::from_micros(r.sq_admission_timeout_us);
        let start = Instant::now();
        let segments = self.shared.segments.load();
        let mut out: Vec<Option<AdmissionToken>> = requests.iter().map(|_| None).collect();
        let mut seen = vec![false; requests.len()];
        for i in 0..requests.len() {
            if seen[i] {
                continue;
            }
            // A call names few peers: one charge per peer, its requests'
            // shares in order.
            let id = requests[i].remote().segment;
            let members: Vec<usize> = (i..requests.len())
                .filter(|&k| !seen[k] && requests[k].remote().segment == id)
                .collect();
            for &k in &members {
                seen[k] = true;
            }
            // A bad segment fails validation in the worker; a peer RDMA
            // does not serve first (or a request pinned elsewhere) is not
            // charged here.
            let Some(segment) = segments.get(id) else {
                continue;
            };
            let Some(peer) = crate::transport::rdma::transport::peer_of(segment) else {
                continue;
            };
            if !self.rdma_serves_first(segment) {
                continue;
            }
            let Some(gate) = peer.gate(w) else {
                continue;
            };
            let shares: Vec<(usize, u32)> = members
                .into_iter()
                .filter(|&k| {
                    requests[k]
                        .transport_hint()
                        .is_some_and(|h| matches!(h, TransportKind::Any | TransportKind::Rdma))
                })
                .map(|k| {
                    let wrs = requests[k].len().div_ceil(slice).max(1);
                    (k, u32::try_from(wrs).unwrap_or(u32::MAX))
                })
                .collect();
            let need = shares.iter().fold(0u32, |a, &(_, n)| a.saturating_add(n));
            // The charge goes at its most urgent request's priority (a
            // priority no request names is refused by the worker later;
            // here it counts as LOW).
            let priority = shares
                .iter()
                .filter_map(|&(k, _)| requests[k].priority())
                .min_by_key(|p| p.index())
                .unwrap_or(tent_rings::Priority::Low);
            // `sq_admission_chunk_wr` caps one charge (0: the gate's own
            // cap, one endpoint's depth).
            let need = match r.sq_admission_chunk_wr {
                0 => need,
                c => need.min(c),
            };
            let left = timeout.saturating_sub(start.elapsed());
            let tokens = gate
                .admit(r.sq_split_policy, need, left, priority)
                .map_err(|(ep, e)| self.admission_refused(peer, w, ep, need, e))?;
            // Each task takes its share from the charge, in order, from one
            // token (one slot per task: a share across two tokens keeps the
            // first part, the rest stays with the next token); a charge
            // capped below the need leaves the last tasks none.
            let mut tokens = tokens.into_iter();
            let mut cur = tokens.next();
            for (k, want) in shares {
                while cur.as_ref().is_some_and(|t| t.count() == 0) {
                    cur = tokens.next();
                }
                let Some(t) = cur.as_mut() else { break };
                out[k] = Some(t.split(want));
            }
        }
        Ok(out)
    }

    /// Is RDMA the first transport the worker would give a request to
    /// `segment` (the worker's `RANKED` order)?
    fn rdma_serves_first(&self, segment: &Segment) -> bool {
        worker::RANKED.iter().find(|&&kind| {
            self.shared
                .transports
                .slot(kind)
                .load_full()
                .is_some_and(|t| t.transport.reaches(segment))
        }) == Some(&TransportKind::Rdma)
    }

    /// The error a refused admission ends `submit` with: the endpoint and
    /// its counters, so the line tells a stall from a drain from a burst.
    #[cold]
    fn admission_refused(
        &self,
        peer: &crate::transport::rdma::RdmaPeer,
        w: usize,
        ep: usize,
        need: u32,
        e: crate::flow::SqRefusal,
    ) -> Error {
        let q = peer.qp_per_transfer();
        let (rail, qp) = (ep / q, ep % q);
        let report = peer
            .sq_report(w, ep)
            .map_or_else(String::new, |r| r.to_string());
        let why = match e {
            crate::flow::SqRefusal::Degraded => "every endpoint is out of service",
            _ => "no room within sq_admission_timeout_us",
        };
        crate::lograte::warn_limited!(
            (peer.name(), w, why),
            peer = peer.name(),
            worker = w,
            rail,
            qp,
            need,
            %report,
            "rdma: admission refused ({why}); submit failed SqFull with nothing queued"
        );
        Error::new(
            ErrorKind::SqFull,
            format!(
                "admission to {} refused ({why}): {need} work requests, endpoint worker {w} rail {rail} qp {qp} \
                 (qp_per_transfer={q}, workers={}): {report}; nothing queued",
                peer.name(),
                self.workers.len()
            ),
        )
    }

    /// Status of task `task` of `batch`.
    pub fn status(&self, batch: BatchId, task: usize) -> Result<TaskStatus> {
        self.batches.get(batch)?.status(task)
    }

    /// Status of every submitted task of `batch`.
    pub fn status_list(&self, batch: BatchId) -> Result<Vec<TaskStatus>> {
        Ok(self.batches.get(batch)?.status_list())
    }

    /// One status for the whole batch.
    pub fn batch_status(&self, batch: BatchId) -> Result<TaskStatus> {
        Ok(self.batches.get(batch)?.overall())
    }

    /// Ask every task of `batch` to stop; each ends `Canceled` (or its
    /// natural state if it finished first).
    pub fn cancel(&self, batch: BatchId) -> Result<()> {
        self.batches.get(batch)?.cancel(None)
    }

    /// Cancel one task.
    pub fn cancel_task(&self, batch: BatchId, task: usize) -> Result<()> {
        self.batches.get(batch)?.cancel(Some(task))
    }

    /// Free a batch; refused while any task is pending, and for an id that
    /// is not allocated (a double free).
    pub fn free_batch(&self, batch: BatchId) -> Result<()> {
        self.batches.free(batch)
    }

    /// Wait until no task of `batch` is pending (or `timeout`).
    pub fn wait_batch(&self, batch: BatchId, timeout: Duration) -> Result<TaskStatus> {
        let b = self.batches.get(batch)?;
        let start = Instant::now();
        loop {
            let s = b.overall();
            if s.state.is_terminal() {
                return Ok(s);
            }
            if start.elapsed() > timeout {
                return Err(Error::new(ErrorKind::Timeout, "batch still pending"));
            }
            std::thread::yield_now();
        }
    }

    // ---- transports and diagnostics -------------------------------------

    /// Replace the transport in `kind`'s slot (tests wrap transports with
    /// fault injection this way); returns the previous one. `t` is not
    /// installed again; one with per-worker state serves the engine that
    /// installed it or else whose worker first uses it, and refuses the
    /// others' slices with `InvalidArgument`.
    pub fn swap_transport(
        &self,
        kind: TransportKind,
        t: Option<Arc<dyn Transport>>,
    ) -> Option<Arc<dyn Transport>> {
        self.shared.transports.swap(t, kind)
    }

    /// Failover counters.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.shared.metrics
    }

    /// Every rail of every open segment (RDMA and TCP), with the segment's
    /// name.
    pub fn all_rails(&self) -> Vec<(String, crate::transport::RailStat)> {
        let segments = self.shared.segments.load();
        segments
            .iter()
            .flat_map(|s| {
                self.rails_of(s)
                    .into_iter()
                    .map(|r| (s.name().to_owned(), r))
            })
            .collect()
    }

    /// Every RDMA rail's send- and completion-queue counters (seed 004's
    /// SQ/CQE diagnostics), a row per QP slot of the rail
    /// (`qp_per_transfer`), every worker's endpoint there together.
    pub fn sq_rows(&self) -> Vec<crate::flow::SqRow> {
        self.shared
            .segments
            .load()
            .iter()
            .filter_map(|s| crate::transport::rdma::transport::peer_of(s))
            .flat_map(|p| p.sq_reports())
            .collect()
    }

    /// Failover counters and per-rail state and bytes, in Prometheus text
    /// exposition format.
    pub fn metrics_text(&self) -> String {
        let mut out = self
            .shared
            .metrics
            .render(&self.all_rails(), &self.sq_rows());
        crate::metrics::render_qos(&mut out, &self.qos_stats());
        out
    }

    /// Per-priority statistics summed over the workers (seed 001): lane
    /// depths, tasks accepted, promotions, slot-gate holds, queue-wait
    /// histograms, and the shared slot clock when one is configured.
    pub fn qos_stats(&self) -> crate::qos::QosSnapshot {
        let mut q = crate::qos::QosSnapshot::default();
        for w in &self.workers {
            w.qos.sum_into(&mut q);
        }
        q.slots = self.slots.as_ref().map(|r| {
            let c = r.clock();
            crate::qos::SlotSnapshot {
                slot: c.slot(),
                owner: c.is_owner(),
                takeovers: c.takeovers(),
            }
        });
        q
    }

    /// The shared slot clock this engine follows (`None`: single-process
    /// mode, `shared_quota_shm_path` empty).
    pub fn slot_clock(&self) -> Option<&Arc<SlotClock>> {
        self.slots.as_ref().map(SlotRotator::clock)
    }

    /// Installed transports.
    pub fn transports(&self) -> Vec<TransportKind> {
        self.shared.transports.installed()
    }

    /// Flow-control credits taken and not given back (0 when idle): every
    /// worker's window on each transport, plus every TCP connection's wire
    /// window (a TCP slice on the wire holds one in each).
    pub fn credits_in_flight(&self) -> u32 {
        let workers: u32 = self
            .workers
            .iter()
            .flat_map(|w| w.credits.iter())
            .map(SqController::posted)
            .sum();
        let tcp = self.shared.tcp.as_ref().map_or(0, |t| t.wire_in_flight());
        workers + tcp
    }

    /// The core each worker is pinned to (`None`: not pinned).
    pub fn worker_cores(&self) -> Vec<Option<usize>> {
        self.workers
            .iter()
            .map(|w| usize::try_from(w.core.load(Ordering::Relaxed)).ok())
            .collect()
    }

    /// Operations and bytes completed successfully so far.
    pub fn completed(&self) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(o, b), w| {
            (
                o + w.completed_ops.load(Ordering::Relaxed),
                b + w.completed_bytes.load(Ordering::Relaxed),
            )
        })
    }
}

/// Start this engine's control server, describing its segment from the
/// live region table on every request.
/// The address the control plane listens on, as an IP.
fn control_ip(host: &str) -> Result<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.parse() {
        return Ok(ip);
    }
    (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip())
        .ok_or_else(|| Error::invalid(format!("rpc_server_hostname {host:?} does not resolve")))
}

/// Start the TCP data server (when TCP is in use) and say which rails it
/// offers.
fn start_data_server(
    shared: &Arc<EngineShared>,
) -> Result<Option<(DataServer, Vec<crate::control::wire::RailEntry>)>> {
    if shared.tcp.is_none() {
        return Ok(None);
    }
    let cfg = &shared.config;
    let host = control_ip(&cfg.rpc_server_hostname)?;
    let ut = cfg.transports.tcp.user_timeout_ms.min(u32::MAX as u64) as u32;
    // Listen where we advertise, nowhere else (not the wildcard).
    let addrs = tcp::advertised_addrs(host);
    let ips: Vec<_> = addrs.iter().map(|(_, ip)| *ip).collect();
    let secret = cfg.secret().map(Arc::<[u8]>::from);
    let server = DataServer::start(&ips, shared.regions.clone(), ut, secret.clone())?;
    let rails = tcp::advertised_rails(host, server.local_addr().port());
    if secret.is_none() {
        tracing::warn!(addrs = ?server.local_addrs(), "tcp data port unauthenticated (no rpc_shared_secret): any host that reaches it can read and write registered memory with a key it has seen");
    }
    tracing::info!(rails = ?rails.iter().map(|r| &r.addr).collect::<Vec<_>>(), "tcp rails advertised");
    Ok(Some((server, rails)))
}

fn start_control(
    shared: &Arc<EngineShared>,
    export: Option<Arc<ShmExport>>,
    rails: Vec<crate::control::wire::RailEntry>,
) -> Result<crate::control::ControlServer> {
    let cfg = &shared.config;
    let secret = cfg.secret().map(<[u8]>::to_vec);
    let host_id = crate::control::host_id();
    let (regions, transports) = (shared.regions.clone(), shared.clone());
    let nics = shared
        .rdma
        .as_ref()
        .map(|n| n.entries())
        .unwrap_or_default();
    let describe = move |addr: std::net::SocketAddr| -> Arc<crate::control::server::DescriptorFn> {
        let name = addr.to_string();
        Arc::new(move || crate::control::SegmentDescriptor {
            name: name.clone(),
            host_id: host_id.clone(),
            pid: std::process::id(),
            shm_name: export.as_ref().map(|e| e.name().to_owned()),
            regions: regions
                .load()
                .iter()
                .map(|r| crate::control::RegionEntry {
                    id: r.id().0,
                    addr: r.addr(),
                    len: r.len(),
                    key: r.key(),
                    rkeys: r.rkeys().to_vec(),
                })
                .collect(),
            transports: transports
                .transports
                .installed()
                .into_iter()
                .map(|k| k as u8)
                .collect(),
            rails: rails.clone(),
            nics: nics.clone(),
        })
    };
    let qp = shared.rdma.as_ref().map(|nics| {
        let r = crate::transport::rdma::Responder::new(nics.clone());
        Arc::new(move |req: &crate::control::wire::QpRequest| r.accept(req))
            as Arc<crate::control::server::QpConnectFn>
    });
    let server = crate::control::ControlServer::start_with_qp(
        &cfg.rpc_server_hostname,
        cfg.rpc_server_port,
        secret,
        describe,
        qp,
    )?;
    Ok(server)
}

impl Drop for Engine {
    /// When this returns, nothing of the engine touches memory it was
    /// given: each worker has stopped every task and waited for all its
    /// slices to come back (a transport hands one back only once nothing
    /// touches its buffer), then the TCP transport's connection threads
    /// and link watch are joined here; the data and control servers join
    /// theirs as they drop with the engine's fields.
    fn drop(&mut self) {
        stop_workers(
            &self.workers,
            &mut self.threads.lock().expect("threads poisoned"),
        );
        for &k in NETWORK {
            if let Some(t) = self.shared.transports.slot(k).load_full() {
                t.transport.stop();
            }
        }
        self.shared.links.stop();
    }
}

/// Ask every worker to stop, wake it, and join its thread.
fn stop_workers(workers: &[Arc<WorkerShared>], threads: &mut Vec<JoinHandle<()>>) {
    for w in workers {
        w.shutdown.store(true, Ordering::Release);
        w.doorbell().ring();
    }
    for h in threads.drain(..) {
        let _ = h.join();
    }
}

/// Workers started during [`EngineBuilder::build`]: a guard that stops and
/// joins them if the build fails after some were started.
#[derive(Default)]
struct Workers {
    shared: Vec<Arc<WorkerShared>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// The build succeeded: hand the workers to the engine.
    fn into_parts(mut self) -> (Vec<Arc<WorkerShared>>, Vec<JoinHandle<()>>) {
        (
            std::mem::take(&mut self.shared),
            std::mem::take(&mut self.threads),
        )
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        stop_workers(&self.shared, &mut self.threads);
    }
}

/// Registered memory handed out by the engine.
#[derive(Debug, Clone)]
pub struct Buffer {
    region: Arc<MemRegion>,
}

impl Buffer {
    /// Region id (for SQEs' local side).
    pub fn id(&self) -> RegionId {
        self.region.id()
    }

    /// Access key.
    pub fn key(&self) -> u64 {
        self.region.key()
    }

    /// Address in this process (what a peer's remote offset names).
    pub fn addr(&self) -> u64 {
        self.region.addr()
    }

    /// Length.
    pub fn len(&self) -> u64 {
        self.region.len()
    }

    /// Never true (zero-length registrations are refused).
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// Raw pointer to the start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.addr() as *mut u8
    }

    /// Copy `data` in at `offset`. Byte-wise relaxed atomic stores, so a
    /// transfer touching the same bytes at the same time is a race on the
    /// values (the bytes are undefined, as for any transfer error) but not
    /// undefined behaviour.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let p = self
            .region
            .slice_ptr(offset, data.len() as u64)
            .map_err(|k| Error::new(k, "buffer write out of bounds"))?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above), the region is alive while `self` is, and AtomicU8 has the layout of u8.
            unsafe { (*(p.add(i) as *const AtomicU8)).store(*b, Ordering::Relaxed) };
        }
        Ok(())
    }

    /// Copy out `out.len()` bytes from `offset` (byte-wise relaxed atomic
    /// loads, see [`Buffer::write`]).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let p = self
            .region
            .slice_ptr(offset, out.len() as u64)
            .map_err(|k| Error::new(k, "buffer read out of bounds"))?;
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: as in `write`.
            *b = unsafe { (*(p.add(i) as *const AtomicU8)).load(Ordering::Relaxed) };
        }
        Ok(())
    }
}

/// Page-aligned, zeroed heap memory (when shm export is off).
/// Anonymous memory for `allocate_memory` without shm: mapped zeroed, and
/// advised to use transparent huge pages, so large buffers cost few TLB
/// entries when the kernel copies through them (TCP moves every byte
/// through a kernel copy).
struct HeapMemory {
    ptr: *mut u8,
    _map: memmap2::MmapMut,
}

// SAFETY: HeapMemory exclusively owns its mapping.
unsafe impl Send for HeapMemory {}
// SAFETY: no interior mutability through &HeapMemory.
unsafe impl Sync for HeapMemory {}

impl HeapMemory {
    fn new(len: u64) -> Result<HeapMemory> {
        let oom = |e: Option<std::io::Error>| {
            let err = Error::new(
                ErrorKind::OutOfMemory,
                format!("cannot allocate {len} bytes"),
            );
            match e {
                Some(e) => err.with_source(e),
                None => err,
            }
        };
        let n = usize::try_from(len).map_err(|_| oom(None))?;
        let mut map = memmap2::MmapOptions::new()
            .len(n)
            .map_anon()
            .map_err(|e| oom(Some(e)))?;
        if n >= 2 << 20 {
            // Best effort: THP may be off system-wide.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(HeapMemory {
            ptr: map.as_mut_ptr(),
            _map: map,
        })
    }
}
