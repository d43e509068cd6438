//! Building an engine (config, transports, the control and TCP data
//! servers, worker placement; the workers start in `workers.rs`) and
//! tearing it down.

use crate::incarnation::Incarnation;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use tent_rings::{SegmentId, TransportKind};

use super::batch::BatchTable;
use super::footprint;
use super::notify::Mailbox;
use super::segments::NETWORK;
use super::workers::WorkerPool;
use super::{Embedded, Engine, EngineShared};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::memory::RegionTable;
use crate::qos::{OpenGate, SendGate, SlotClock, SlotRotator};
use crate::segment::{Segment, SegmentKind, SegmentTable};
use crate::topology::Topology;
use crate::transport::local::LocalTransport;
use crate::transport::rdma::RdmaTransport;
use crate::transport::shm::ShmTransport;
use crate::transport::shm::{MapBudget, ShmExport};
use crate::transport::tcp::{self, DataServer, TcpTransport};
use crate::transport::{EngineId, InstallContext, Transport, TransportSlots};

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
    /// Use `config` (default: [`Config::load`]: the defaults, `TENT_CONF`,
    /// then the `TENT_<KEY>` variables).
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Use this topology instead of detecting it.
    #[cfg(any(test, feature = "testing"))]
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Gate priorities with `gate` (default: always open).
    #[cfg(any(test, feature = "testing"))]
    pub fn gate(mut self, gate: Arc<dyn SendGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Install `t` in its slot (replacing the built-in one of that kind).
    #[cfg(any(test, feature = "testing"))]
    pub fn transport(mut self, t: Arc<dyn Transport>) -> Self {
        self.extra.push(t);
        self
    }

    /// Start the engine: export the local segment, install transports, start
    /// and place workers; or, with `daemon_socket` set, attach to the
    /// daemon there (see [`Engine::attach`]), embedding an engine when
    /// none answers only with `daemon_embed_fallback`.
    pub fn build(mut self) -> Result<Engine> {
        let config = match self.config.take() {
            Some(c) => c,
            None => Config::load()?,
        };
        if config.daemon_socket.is_empty() {
            if config.daemon_embed_fallback {
                return Err(Error::invalid(
                    "daemon_embed_fallback is set but daemon_socket is not: there is no daemon to fall back from",
                ));
            }
            self.config = Some(config);
            return self.build_embedded().map(Engine::embedded_handle);
        }
        config.validate()?;
        if self.topology.is_some() || self.gate.is_some() || !self.extra.is_empty() {
            return Err(Error::invalid(
                "an engine attached to tentd (daemon_socket) takes no topology, gate or transport: they are the daemon's",
            ));
        }
        let socket = std::path::PathBuf::from(&config.daemon_socket);
        match crate::daemon::Attached::attach(&socket, config.clone()) {
            Ok(a) => Ok(Engine::attached_handle(a)),
            Err(e)
                if config.daemon_embed_fallback
                    && e.kind() == tent_rings::ErrorKind::Unreachable =>
            {
                tracing::info!(
                    socket = %socket.display(),
                    error = %e,
                    "no tentd answers: embedding an engine (daemon_embed_fallback)"
                );
                self.config = Some(config);
                self.build_embedded().map(Engine::embedded_handle)
            }
            Err(e) => Err(e),
        }
    }

    /// The engine, in this process.
    pub(crate) fn build_embedded(self) -> Result<Embedded> {
        let config = match self.config {
            // A configuration built in code is checked as a file's is
            // (`Config::load` has checked its own).
            Some(c) => {
                c.validate()?;
                c
            }
            None => Config::load()?,
        };
        // Values each in range can together need more memory than there
        // is: refuse before allocating rather than abort halfway.
        footprint::check(&config)?;
        // The metadata store first: etcd down is an error naming its
        // endpoints, before anything is started.
        let directory = crate::control::directory::Directory::start(&config)?;
        raise_open_file_limit();
        guard_proc_fds(&config)?;
        // Derived caps are shares of the address space left now.
        let shm_maps = Arc::new(MapBudget::from_config(&config.transports.shm));
        let topology = self.topology.unwrap_or_else(Topology::detect);
        // Drawn once: it tags every id this engine hands out.
        let incarnation = Incarnation::draw();
        let regions = Arc::new(ArcSwap::from_pointee(RegionTable::tagged(
            incarnation.tag(),
        )));
        let local = Arc::new(Segment::new(
            SegmentId::LOCAL,
            "local".into(),
            SegmentKind::Local,
        ));
        let segments = Arc::new(ArcSwap::from_pointee(
            SegmentTable::tagged(incarnation.tag()).with(local),
        ));
        let export = if config.transports.shm.enable {
            if matches!(
                config.hugepages,
                crate::config::HugePages::Huge2M | crate::config::HugePages::Huge1G
            ) {
                tracing::info!(
                    hugepages = config.hugepages.as_str(),
                    "hugepages: allocate_memory exports its regions over shm, so they stay on shmem pages advised as transparent huge pages (peers map only shmem files); hugetlbfs pages back allocate_memory with transports/shm/enable false"
                );
            }
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
                    let named = &r.devices;
                    let opts = crate::transport::rdma::NicOptions {
                        gid_index: r.gid_index.index(),
                        traffic_class: r.traffic_class.value(),
                        service_level: r.service_level,
                    };
                    match crate::transport::rdma::NicSet::open(named, opts) {
                        Ok(set) => {
                            tracing::info!(nics = ?set.entries().iter().map(|n| n.name.clone()).collect::<Vec<_>>(), "RDMA NICs opened");
                            Some(Arc::new(set))
                        }
                        Err(e) if !named.is_empty() || opts.gid_index.is_some() => return Err(e),
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
        let transports = Arc::new(TransportSlots::default());
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
            .map(|nics| Arc::new(RdmaTransport::new(&config, nics.clone(), incarnation.get())));
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
                    config.transports.rdma.slot_rotation_interval_ms,
                )?);
                let rotator = SlotRotator::start(clock.clone())?;
                tracing::info!(path = %clock.path().display(),
                    interval = ?config.transports.rdma.slot_rotation_interval_ms,
                    "QoS time slots shared through the slot file");
                (clock as Arc<dyn SendGate>, Some(rotator))
            }
            None => (Arc::new(OpenGate) as Arc<dyn SendGate>, None),
        };
        let shared = Arc::new(EngineShared {
            incarnation,
            rdma,
            tcp,
            regions,
            region_epoch: CachePadded::new(AtomicU64::new(0)),
            segments,
            transports,
            gate,
            metrics: Arc::new(crate::metrics::Metrics::default()),
            links,
            live: super::reload::LiveSettings::new(&config),
            registry: Mutex::new(()),
            peer_bell: Default::default(),
            inline: Default::default(),
            fair: Default::default(),
            config,
        });

        // The fallible servers first, then the workers: an error returns
        // before any worker runs, and whatever was started drops (each
        // server stops and joins on drop; the transports, link watch
        // included, go with the last `EngineShared`).
        let data = start_data_server(&shared)?;
        let rails = data.as_ref().map(|(_, r)| r.clone()).unwrap_or_default();
        // A notification's deadline is at most default_timeout_ms past its
        // requests' latest, itself at most max_timeout_ms away.
        let resend_max = shared.config.max_timeout_ms + shared.config.default_timeout_ms;
        let inbox = Arc::new(crate::notify::inbox::Inbox::new(resend_max));
        let mailboxes = Arc::new(crate::notify::mailboxes::Mailboxes::new(inbox.clone()));
        // The HTTP endpoint's listener, bound before anything serves or
        // runs (a failure leaves nothing behind), and its URL, which the
        // descriptor and /health say.
        let metrics_url = Arc::new(std::sync::OnceLock::new());
        let http_listener = {
            let control = control_addr(&shared.config.rpc_server_hostname)?;
            let scope = match control {
                std::net::SocketAddr::V6(a) => a.scope_id(),
                std::net::SocketAddr::V4(_) => 0,
            };
            let at = super::http::address(&shared.config, control.ip(), scope);
            let l = super::http::bind(&shared.config, at)?;
            if let Some(l) = &l {
                let addr = l
                    .local_addr()
                    .map_err(|e| Error::invalid("http listener").with_source(e))?;
                let _ = metrics_url.set(super::http::url_of(addr));
            }
            l
        };
        let control = start_control(
            &shared,
            export.clone(),
            rails,
            mailboxes.clone(),
            metrics_url.clone(),
        )?;
        let outbox = crate::notify::outbox::Outbox::new(
            control.local_addr().to_string(),
            shared.config.secret().map(<[u8]>::to_vec),
            shared.config.default_timeout_ms,
            inbox.clone(),
        );
        let control = Some(control);
        let batches = BatchTable::new(
            shared.config.max_batches as usize,
            shared.config.max_batch_size as usize,
            shared.incarnation.batch_tag(),
        );
        let workers = WorkerPool::start(&shared, id, cores, &wakers)?;
        let published = control
            .as_ref()
            .and_then(|c| published_record(&shared, &directory, c));
        let peers = Arc::new(super::peers::Peers::new(
            shared.clone(),
            shm_maps,
            workers.to_vec(),
            directory,
        ));
        let metadata = Some(super::peers::metadata::MetadataThread::start(
            peers.clone(),
            published,
            shared.incarnation.get(),
        )?);
        // The HTTP server's counters: its thread writes them, the observer
        // shows them in /metrics.
        let http_counters = http_listener
            .as_ref()
            .map(|_| Arc::new(crate::http::HttpCounters::default()));
        let observer = Arc::new(super::observe::Observer::new(
            shared.clone(),
            workers.to_vec(),
            slots.as_ref().map(|r| r.clock().clone()),
            topology,
            control.as_ref().map(|c| c.local_addr().to_string()),
            metrics_url,
            http_counters.clone(),
        ));
        let mut engine = Embedded {
            shared,
            workers,
            batches,
            export,
            control,
            data: data.map(|(d, _)| d),
            retiring: Default::default(),
            peers,
            metadata,
            closing: Default::default(),
            slots,
            mail: Mailbox::new(inbox, mailboxes, outbox),
            observer,
            http: None,
            run_pool: Default::default(),
        };
        // Its thread last: should it fail, dropping the engine tears down
        // everything started so far.
        if let (Some(l), Some(counters)) = (http_listener, http_counters) {
            engine.http = Some(super::http::start(
                &engine.shared.config,
                l,
                &engine.observer,
                counters,
            )?);
        }
        Ok(engine)
    }
}

/// Start this engine's control server, describing its segment from the
/// live region table on every request.
/// The address the control plane listens on, with the scope of a
/// link-local IPv6 one (`fe80::1%eth0`).
fn control_addr(host: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok((ip, 0).into());
    }
    (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::invalid(format!("rpc_server_hostname {host:?} does not resolve")))
}

/// The address the control plane listens on, as an IP.
fn control_ip(host: &str) -> Result<std::net::IpAddr> {
    control_addr(host).map(|a| a.ip())
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
    let ut = tcp::user_timeout_ms(cfg.transports.tcp.user_timeout_ms);
    // Listen where we advertise, nowhere else (not the wildcard).
    let addrs = tcp::advertised_addrs(host);
    let ips: Vec<_> = addrs.iter().map(|(_, ip)| *ip).collect();
    let secret = cfg.secret().map(Arc::<[u8]>::from);
    let settings = tcp::ServeSettings {
        user_timeout_ms: ut,
        secret: secret.clone(),
        threads: cfg.transports.tcp.serving_threads,
        max_connections: cfg.transports.tcp.max_served_connections,
        backend: cfg.transports.tcp.backend,
    };
    let server = DataServer::start(&ips, shared.regions.clone(), settings)?;
    let rails = tcp::advertised_rails(host, server.local_addr().port());
    if secret.is_none() {
        tracing::warn!(addrs = ?server.local_addrs(), "tcp data port unauthenticated (no rpc_shared_secret): any host that reaches it can read and write registered memory with a key it has seen");
    }
    tracing::info!(rails = ?rails.iter().map(|r| &r.addr).collect::<Vec<_>>(), "tcp rails advertised");
    Ok(Some((server, rails)))
}

/// With etcd, the name this engine publishes under, its key and its
/// record (see `control::directory::etcd`).
fn published_record(
    shared: &EngineShared,
    directory: &crate::control::directory::Directory,
    control: &crate::control::ControlServer,
) -> Option<(String, Vec<u8>, Vec<u8>)> {
    let dir = directory.etcd()?;
    let at = control.local_addr();
    if at.ip().is_loopback() {
        tracing::warn!(address = %at, "this engine publishes a loopback control address in etcd: only peers on this host can reach it (set rpc_server_hostname to an address other hosts reach)");
    }
    let addr = at.to_string();
    let name =
        crate::control::directory::published_name(&shared.config)?.unwrap_or_else(|| addr.clone());
    let head = crate::control::SegmentDescriptor {
        name: addr,
        host_id: crate::control::host_id(),
        pid: std::process::id(),
        incarnation: shared.incarnation.get(),
        published_as: Some(name.clone()),
        ..Default::default()
    };
    let record = crate::control::directory::etcd::encode_record(&head);
    Some((name.clone(), dir.key(&name), record))
}

fn start_control(
    shared: &Arc<EngineShared>,
    export: Option<Arc<ShmExport>>,
    rails: Vec<crate::control::wire::RailEntry>,
    mailboxes: Arc<crate::notify::mailboxes::Mailboxes>,
    metrics_url: Arc<std::sync::OnceLock<String>>,
) -> Result<crate::control::ControlServer> {
    let cfg = &shared.config;
    let secret = cfg.secret().map(<[u8]>::to_vec);
    let host_id = crate::control::host_id();
    let incarnation = shared.incarnation.get();
    let (regions, transports) = (shared.regions.clone(), shared.clone());
    let page_regions = shared.regions.clone();
    let nics = shared
        .rdma
        .as_ref()
        .map(|n| n.entries())
        .unwrap_or_default();
    let published = crate::control::directory::published_name(cfg);
    let describe = move |addr: std::net::SocketAddr| -> Arc<crate::control::server::DescriptorFn> {
        let name = addr.to_string();
        let published_as = published
            .as_ref()
            .map(|p| p.clone().unwrap_or_else(|| name.clone()));
        let regions = regions.clone();
        let metrics_url = metrics_url.clone();
        Arc::new(move || {
            let first = super::describe::region_page(&regions.load(), 0);
            crate::control::SegmentDescriptor {
                name: name.clone(),
                host_id: host_id.clone(),
                pid: std::process::id(),
                shm_name: export.as_ref().map(|e| e.name().to_owned()),
                transports: transports
                    .transports
                    .installed()
                    .into_iter()
                    .map(|k| k as u8)
                    .collect(),
                rails: rails.clone(),
                nics: nics.clone(),
                regions: first.regions,
                regions_version: first.version,
                regions_from: first.from,
                metrics_url: metrics_url.get().cloned(),
                incarnation,
                published_as: published_as.clone(),
            }
        })
    };
    let pages = Arc::new(move |from| super::describe::region_page(&page_regions.load(), from))
        as Arc<crate::control::server::RegionsFn>;
    let qp = shared.rdma.as_ref().map(|nics| {
        let r = crate::transport::rdma::Responder::new(nics.clone());
        Arc::new(move |req: &crate::control::wire::QpRequest| r.accept(req))
            as Arc<crate::control::server::QpConnectFn>
    });
    let notify = Arc::new(move |ip, f: crate::control::wire::NotifyFrame| {
        mailboxes.file(ip, f, std::time::Instant::now())
    }) as Arc<crate::control::server::NotifyFn>;
    let server = crate::control::ControlServer::start_with(
        &cfg.rpc_server_hostname,
        cfg.rpc_server_port,
        secret,
        describe,
        crate::control::server::Services {
            regions: Some(pages),
            qp,
            notify: Some(notify),
        },
    )?;
    Ok(server)
}

impl Drop for Embedded {
    /// When this returns, nothing of the engine touches memory it was
    /// given: each worker has stopped every task and waited for all its
    /// slices to come back (a transport hands one back only once nothing
    /// touches its buffer), then the TCP transport's connection threads
    /// and link watch are joined here; the data and control servers join
    /// theirs as they drop with the engine's fields.
    fn drop(&mut self) {
        // No segment is replaced during teardown, and with etcd the lease
        // is revoked first: peers see this engine leave at once.
        drop(self.metadata.take());
        self.observer.stopping();
        // Nothing is served once teardown starts: its thread is joined here.
        drop(self.http.take());
        // No notification is taken or leaves once teardown starts: peers
        // are told `Shutdown` (their message fails rather than land where
        // nobody reads), and what is queued here fails `Shutdown` (its
        // submission's tasks end with the workers).
        self.mail.close();
        // No op is issued inline once the workers stop: a submit from here
        // on goes to the ring (and is answered `Shutdown`).
        self.shared.inline.close();
        self.workers.stop();
        for &k in NETWORK {
            if let Some(t) = self.shared.transports.slot(k).load_full() {
                t.transport.stop();
            }
        }
        self.shared.links.stop();
        // The application may free what it registered once this returns:
        // no `Buffer` copy or TCP op starts on it from here, and those in
        // progress end first.
        self.revoke_application_memory();
    }
}

/// `non_dumpable`: make the process non-dumpable, so no same-uid process
/// opens the region memfds through `/proc/<pid>/fd` (which needs no
/// secret); with a secret set and the process dumpable, say once that the
/// secret does not guard that door.
fn guard_proc_fds(config: &Config) -> Result<()> {
    use rustix::process::{DumpableBehavior, dumpable_behavior, set_dumpable_behavior};
    static WARNED: std::sync::Once = std::sync::Once::new();
    if config.non_dumpable {
        set_dumpable_behavior(DumpableBehavior::NotDumpable).map_err(|e| {
            Error::new(
                crate::ErrorKind::InvalidArgument,
                "non_dumpable: prctl(PR_SET_DUMPABLE) refused",
            )
            .with_source(std::io::Error::from(e))
        })?;
        return Ok(());
    }
    let secret = config.secret().is_some();
    if secret && matches!(dumpable_behavior(), Ok(DumpableBehavior::Dumpable)) {
        WARNED.call_once(|| {
            tracing::warn!("rpc_shared_secret is set but the process is dumpable: a process of the same user can open its registered memory through /proc/<pid>/fd without the secret; set non_dumpable to close that door");
        });
    }
    Ok(())
}

/// Raise the process's soft limit on open files to its hard limit, once:
/// every TCP connection, served or opened, costs a descriptor, and the
/// usual soft limit (1024) is far below what a target serving many
/// initiators holds. Logged once; a failure leaves the limit as it was.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let lim = getrlimit(Resource::Nofile);
        // `None` is unlimited (Linux bounds open files by `nr_open`, so a
        // hard limit is a number there).
        let (Some(from), Some(to)) = (lim.current, lim.maximum) else {
            return;
        };
        if from >= to {
            return;
        }
        let raised = rustix::process::Rlimit {
            current: Some(to),
            maximum: Some(to),
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => tracing::info!(
                from,
                to,
                "raised the soft limit on open files to the hard limit"
            ),
            Err(e) => tracing::debug!(error = %e, "could not raise the soft limit on open files"),
        }
    });
}
