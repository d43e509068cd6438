//! `tcp`: one-sided READ and WRITE over TCP, served by the target.
//!
//! The target runs a [`DataServer`] that moves bytes straight between its
//! sockets and registered memory, checking region, bounds and key per op.
//! The initiator reaches a peer over one or more **rails** (local interface,
//! remote interface), each with `connections_per_peer` bulk connections
//! and one express connection per worker (a HIGH slice may take any of
//! them, a lower one only a bulk one: `TcpPeer::stride`); the
//! [`DeviceSelector`] sprays a request's slices over the rails whose link
//! is up. Each worker drives its own connections ([`link`]) through its own
//! socket queue ([`driver`]: io_uring, or epoll where io_uring is not
//! available; `transports/tcp/backend`), in the same loop that polls its
//! other transports: no thread per connection or per peer.
//!
//! A link watch (rtnetlink) marks a rail down the moment its interface
//! goes down; the worker's next turn tears down its connections on it, and
//! their in-flight slices come back `RouteLost` and are re-posted on a
//! sibling rail before the task ever sees them (DESIGN.md's recovery
//! order). Only when no rail is left does `RouteLost` reach the task.
//!
//! [`Transport::abort`] stops a task's slices: its queued slices complete
//! at once without being sent, and a connection with one of them on the
//! wire is reset, so each completes only once the kernel is done with its
//! buffer; the other tasks' slices caught on that connection are
//! re-posted, with no rail fault counted.

mod abort;
pub(crate) mod backend;
pub(super) mod cap;
mod driver;
mod fence;
pub mod frame;
#[doc(hidden)]
pub mod handshake;
mod io;
mod link;
mod live;
pub(crate) mod op;
pub mod server;
mod station;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tent_rings::{ErrorKind, Priority, TransportKind};

use abort::Tokens;
use backend::Choice;
use cap::{BulkCap, HighHold};
use driver::Driver;
use fence::PeerFences;
use link::Link;
pub(crate) use op::{BYSTANDER, Endpoint, Op};
pub(crate) use server::{DataServer, ServeSettings};

use super::{
    Capabilities, InstallContext, PeerActivity, PerWorker, RailStat, Slice, SliceCompletion,
    SubmitOutcome, Transport, WorkerCtx, submit_to_peers,
};
use crate::clock::monotonic_ns;
use crate::config::Config;
use crate::control::wire::RailEntry;
use crate::control::{RegionEntry, SegmentDescriptor};
use crate::doorbell::Wakers;
use crate::error::{Error, Result};
use crate::netlink;
use crate::segment::Segment;
use crate::transport::rails::{
    Ask, DeviceSelector, LinkListener, LiveRailPolicy, LiveSelector, MAX_RAIL_MOVES, Placement,
    RailDesc, RailLinks, RailPolicy, RailSet, SelectorConfig, WorkerRails, is_rail_fault,
};

/// Settings read once from the config.
#[derive(Debug, Clone)]
struct Settings {
    conns_per_rail: usize,
    inflight_per_conn: u32,
    /// Slices a worker may have queued on one connection (its credits).
    queue: u32,
    user_timeout_ms: u32,
    connect_timeout: Duration,
    /// How long a slice may wait for a busy target to take a connection.
    patience: Duration,
    slice_bytes: u64,
    /// `bulk_window_beside_high` (0: no cap) and `high_hold_us`.
    bulk_beside_high: u64,
    high_hold_ns: u64,
    rail_policy: Arc<LiveRailPolicy>,
    /// Which socket queue the workers drive (resolved at install).
    backend: Choice,
}

/// One rail to one peer.
#[derive(Debug)]
pub(crate) struct TcpRail {
    /// Local interface name (or the address when unknown).
    pub local_name: String,
    /// Local interface index (0: unknown, link state not watched).
    pub ifindex: u32,
    /// The peer's name for its end.
    pub remote_name: String,
    /// Addresses and link state.
    pub endpoint: Arc<Endpoint>,
}

impl TcpRail {
    /// Is the rail's local link up?
    #[inline]
    pub(crate) fn is_up(&self) -> bool {
        // Relaxed: a hint; a slice posted on a rail that just went down
        // comes back RouteLost and is re-posted.
        self.endpoint.up.load(Ordering::Relaxed)
    }

    /// The link changed; returns whether it came back.
    fn set_link(&self, up: bool) -> bool {
        let was = self.endpoint.up.swap(up, Ordering::AcqRel);
        if was && !up {
            // The workers' next turns tear its connections down.
            tracing::warn!(local = %self.local_name, remote = %self.remote_name, "rail down: link lost; in-flight slices move to sibling rails");
        } else if !was && up {
            tracing::info!(local = %self.local_name, remote = %self.remote_name, "rail up: link restored");
            return true;
        }
        false
    }
}

/// What a worker has on one peer.
struct PeerLinks {
    /// Connections in the worker's [`Driver`] (made on first use),
    /// rail-major: `rail * (conns_per_rail + 1) + c`; the last of each
    /// rail's is its express connection ([`TcpPeer::stride`]).
    links: Vec<Option<u32>>,
    /// This worker's loads, estimates and plan on the peer's rails.
    rails: WorkerRails,
    /// Per rail: the bulk this worker's connections on it keep on the
    /// wire while HIGH flows there.
    caps: Vec<Arc<BulkCap>>,
    conn_cursor: Vec<usize>,
    /// Its slices out, and whether the peer is on the active list.
    activity: PeerActivity,
}

/// A peer reachable over TCP: its regions' keys and its rails.
pub(crate) struct TcpPeer {
    name: String,
    regions: Vec<RegionEntry>,
    /// Each rail's interfaces, addresses and connections (index = rail).
    links: Vec<TcpRail>,
    /// The rails as the multi-rail layer keeps them.
    rails: RailSet,
    /// Bulk connections per rail (`connections_per_peer`); each rail has
    /// one express connection more.
    conns_per_rail: usize,
    per_worker: PerWorker<PeerLinks>,
    /// How its connections connect (one session for all of them).
    opts: Arc<op::Options>,
    /// Connections every connection to the peer fences.
    fences: Arc<PeerFences>,
    /// Per rail: whether HIGH flows there, from any worker.
    holds: Vec<Arc<HighHold>>,
    /// Held while the peer is: the workers' drivers close its connections
    /// once it is gone.
    alive: Arc<()>,
}

impl TcpPeer {
    /// Connections per rail: the bulk ones, then the express one. A HIGH
    /// slice may go on any of them (the one with the fewest slices on the
    /// wire); a MEDIUM or LOW one only on the bulk ones. So a HIGH slice
    /// behind a LOW flood finds a connection whose socket buffers and
    /// target thread hold no bulk: nothing in the kernel to wait behind.
    /// It connects on its first slice, like the others.
    fn stride(&self) -> usize {
        self.conns_per_rail + 1
    }
}

impl std::fmt::Debug for TcpPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpPeer")
            .field("name", &self.name)
            .field("links", &self.links)
            .finish()
    }
}

impl TcpPeer {
    /// Each rail's names, link state, health and counters.
    pub(crate) fn rail_stats(&self) -> Vec<RailStat> {
        self.rails.stats(|i| self.links[i].is_up())
    }

    /// Rail `i`'s link changed.
    fn set_link(&self, i: usize, up: bool) {
        if self.links[i].set_link(up) {
            self.rails.rail(i).monitor.link_restored();
        }
    }

    /// The key for `[addr, addr+len)`, checked against the peer's
    /// descriptor before anything is sent (the target checks again).
    #[inline]
    pub(crate) fn key_for(&self, addr: u64, len: u64) -> std::result::Result<u64, ErrorKind> {
        RegionEntry::find(&self.regions, addr, len).map(|r| r.key)
    }
}

impl LinkListener for TcpPeer {
    fn link_changed(&self, ifindex: u32, up: bool) {
        for i in 0..self.links.len() {
            if self.links[i].ifindex != 0 && self.links[i].ifindex == ifindex {
                self.set_link(i, up);
            }
        }
    }
}

struct WorkerState {
    /// Peers this worker has slices posted on (polled until they drain).
    active: Vec<Arc<TcpPeer>>,
    /// Its slices out here, per token, and the tokens it aborted.
    tokens: Tokens,
    /// Its connections and their socket queue.
    driver: Driver,
}

/// The TCP transport (initiator side).
pub(crate) struct TcpTransport {
    settings: Settings,
    workers: PerWorker<WorkerState>,
    /// Per worker: slices on its connections' wires (after its last turn).
    wire: Box<[CachePadded<AtomicU32>]>,
    selector: Arc<LiveSelector>,
    /// Where the workers run (set at install).
    placement: OnceLock<Arc<Placement>>,
    /// The engine's link watch (set at install); attached peers listen.
    links: OnceLock<Arc<RailLinks>>,
    wakers: OnceLock<Arc<Wakers>>,
    /// `rpc_shared_secret`: proven on every data connection when set.
    secret: Option<Arc<[u8]>>,
    /// The workers' rings can sleep them (io_uring with futex waits).
    parks: AtomicBool,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("settings", &self.settings)
            .finish()
    }
}

/// A worker's tokens out on TCP at once: one per slice (its credits) and
/// one per task at most.
fn tokens_per_worker(config: &Config) -> usize {
    config
        .max_inflight_slices
        .min(config.max_tasks_per_worker)
        .max(1) as usize
}

/// Bytes the transport preallocates per worker at construction (its token
/// table and abort board), for the engine's footprint check.
/// `TCP_USER_TIMEOUT` in whole ms (what the socket option takes), saturating.
pub(crate) fn user_timeout_ms(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)
}

pub(crate) fn worker_bytes(config: &Config) -> u64 {
    Tokens::bytes(tokens_per_worker(config))
}

/// Socket operations a worker's queue has room for at once.
const QUEUE_ENTRIES: u32 = 1024;

impl TcpTransport {
    /// A transport for an engine with `config`.
    pub(crate) fn new(config: &Config) -> TcpTransport {
        let t = &config.transports.tcp;
        let count = config.workers.count.max(1) as usize;
        let tokens = tokens_per_worker(config);
        let backend = t.backend;
        let workers = PerWorker::new(count, |_| WorkerState {
            active: Vec::with_capacity(16),
            tokens: Tokens::new(tokens),
            driver: Driver::new(backend, QUEUE_ENTRIES),
        });
        TcpTransport {
            settings: Settings {
                conns_per_rail: t.connections_per_peer.max(1) as usize,
                inflight_per_conn: t.max_inflight_per_connection.max(1),
                queue: config.max_inflight_slices.max(1),
                user_timeout_ms: user_timeout_ms(t.user_timeout_ms),
                connect_timeout: config
                    .default_timeout_ms
                    .clamp(Duration::from_millis(100), Duration::from_secs(5)),
                patience: config.default_timeout_ms.max(Duration::from_millis(100)),
                slice_bytes: t.slice_size.min(frame::MAX_OP_LEN),
                bulk_beside_high: t.bulk_window_beside_high,
                high_hold_ns: crate::clock::nanos(t.high_hold_us),
                rail_policy: Arc::new(LiveRailPolicy::new(RailPolicy::from_config(config))),
                backend,
            },
            workers,
            wire: (0..count)
                .map(|_| CachePadded::new(AtomicU32::new(0)))
                .collect(),
            selector: Arc::new(LiveSelector::from_pointee(DeviceSelector::new(
                SelectorConfig::from_config(config),
            ))),
            placement: OnceLock::new(),
            links: OnceLock::new(),
            wakers: OnceLock::new(),
            secret: config.secret().map(Arc::from),
            parks: AtomicBool::new(false),
        }
    }

    /// Connect-side view of a peer from its descriptor: one rail per
    /// advertised interface that a local route reaches, and per worker
    /// `connections_per_peer` connections on each (they connect lazily).
    pub(crate) fn attach(&self, desc: &SegmentDescriptor) -> Result<Arc<TcpPeer>> {
        let (routes, skipped) = plan_routes(&desc.rails, route_to);
        for (entry, e) in skipped {
            tracing::info!(peer = %desc.name, rail = %entry.name, error = %e, "tcp rail skipped")
        }
        let rails: Vec<TcpRail> = routes.into_iter().map(|(_, r)| TcpRail::from(r)).collect();
        if rails.is_empty() {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "{}: no advertised tcp rail is reachable from here",
                    desc.name
                ),
            ));
        }
        let s = &self.settings;
        let set = RailSet::new(
            TransportKind::Tcp,
            self.selector.clone(),
            s.rail_policy.clone(),
            self.placement.get().cloned().unwrap_or_default(),
            rails
                .iter()
                .map(|r| {
                    // The local interface's NUMA node and link speed (an
                    // address with no interface found: neither known).
                    let dev = crate::transport::rails::Sysfs::default().netdev(&r.local_name);
                    RailDesc {
                        local: r.local_name.clone(),
                        remote: r.remote_name.clone(),
                        numa_node: dev.numa_node,
                        speed_gbps: dev.speed_gbps,
                        // What the rail's connections serve at once.
                        depth: (s.conns_per_rail as u32).saturating_mul(s.inflight_per_conn),
                    }
                })
                .collect(),
            self.workers.workers(),
        );
        let hold_ns = if s.bulk_beside_high == 0 {
            0
        } else {
            s.high_hold_ns
        };
        let holds: Vec<Arc<HighHold>> = (0..rails.len())
            .map(|_| Arc::new(HighHold::new(hold_ns)))
            .collect();
        let per_worker = (0..self.workers.workers())
            .map(|w| PeerLinks {
                links: vec![None; rails.len() * (s.conns_per_rail + 1)],
                rails: set.worker(w),
                caps: holds
                    .iter()
                    .map(|h| Arc::new(BulkCap::new(s.bulk_beside_high, h.clone())))
                    .collect(),
                conn_cursor: vec![0; rails.len()],
                activity: PeerActivity::default(),
            })
            .collect();
        let mut regions = desc.regions.clone();
        regions.sort_by_key(|r| r.addr);
        tracing::info!(peer = %desc.name, rails = rails.len(), conns_per_rail = s.conns_per_rail, smart = self.selector.load().is_smart(), "tcp peer attached");
        let peer = Arc::new(TcpPeer {
            name: desc.name.clone(),
            regions,
            links: rails,
            rails: set,
            conns_per_rail: s.conns_per_rail,
            per_worker,
            opts: Arc::new(op::Options {
                user_timeout_ms: s.user_timeout_ms,
                connect_timeout: s.connect_timeout,
                patience: s.patience,
                secret: self.secret.clone(),
                // One session for every connection to this peer (see Options).
                session: op::new_session(),
            }),
            fences: Arc::new(PeerFences::default()),
            holds,
            alive: Arc::new(()),
        });
        if let Some(links) = self.links.get() {
            links.listen(Arc::downgrade(&peer) as Weak<dyn LinkListener>);
        }
        Ok(peer)
    }

    /// Queue `op` on a connection of the rail the selector picks for it
    /// (`ask`: its request's next slice, or one going again) among those
    /// whose link is up; the worker's next turn sends it.
    #[inline]
    fn post(
        &self,
        peer: &TcpPeer,
        links: &mut PeerLinks,
        driver: &mut Driver,
        mut op: Op,
        ask: Ask,
    ) -> std::result::Result<(), ErrorKind> {
        let urgent = op.is_urgent();
        let rail = peer.rails.pick(
            &mut links.rails,
            op.mem_node(),
            op.token,
            ask,
            op.len,
            |r| peer.links[r].is_up(),
        )?;
        let first = rail * peer.stride();
        let (c, class) = if urgent {
            // HIGH: the rail's connection with the fewest slices on the
            // wire, the express one included (first on a tie, so the first
            // HIGH slice to a peer connects it before bulk crowds the
            // others), into its express queue (sent before its queued bulk).
            // A bulk connection that would not send at once (not made yet,
            // opening, down, or idle long enough to be replaced first) is a
            // candidate only when none would: HIGH would wait for its
            // connect (and bulk kept on one connection while capped leaves
            // the others idle). The express one ranks by its wire whatever
            // its state, so a HIGH slice brings it back up when it is down
            // or stale rather than leaving HIGH behind bulk for good.
            let express = peer.conns_per_rail;
            let c = (0..peer.stride())
                .rev()
                .min_by_key(|&c| match links.links[first + c] {
                    Some(id) if c == express => driver.on_wire(id),
                    Some(id) => driver.high_rank(id, op.posted_ns),
                    None if c == express => 0,
                    None => usize::MAX,
                })
                .unwrap_or(express);
            peer.holds[rail].saw_high(op.posted_ns);
            (c, op::EXPRESS)
        } else {
            // Round robin; while HIGH flows and the rail's bulk is capped,
            // one connection takes it all, so it leaves in posting order.
            let c = links.conn_cursor[rail];
            if !links.caps[rail].holds(op.posted_ns) {
                links.conn_cursor[rail] = (c + 1) % peer.conns_per_rail;
            }
            (c, op::BULK)
        };
        let id = match links.links[first + c] {
            Some(id) => id,
            None => {
                // First use: off the per-slice path (one allocation).
                let s = &self.settings;
                let id = driver
                    .add(Arc::downgrade(&peer.alive), |id| {
                        Link::new(
                            id,
                            peer.links[rail].endpoint.clone(),
                            peer.opts.clone(),
                            peer.fences.clone(),
                            links.caps[rail].clone(),
                            s.queue as usize,
                            u64::from(s.inflight_per_conn).saturating_mul(s.slice_bytes),
                        )
                    })
                    .map_err(|e| e.kind())?;
                links.links[first + c] = Some(id);
                id
            }
        };
        op.rail = rail as u8;
        op.ahead = peer.rails.posted(&mut links.rails, rail, op.len);
        if driver.post(id, op, class).is_err() {
            peer.rails.left(&mut links.rails, rail, op.len);
            return Err(ErrorKind::SqFull);
        }
        Ok(())
    }
}

/// The TCP state of `segment`, if TCP reaches it.
pub(crate) fn peer_of(segment: &Segment) -> Option<&TcpPeer> {
    segment.attached::<TcpPeer>(TransportKind::Tcp)
}

/// Where one of a peer's advertised rails leaves this host: what
/// [`TcpTransport::attach`] makes a rail of, and what the topology report
/// plans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// The peer's address on the rail.
    pub(crate) remote: SocketAddr,
    /// The local address the routing table picks for it.
    pub(crate) local_ip: IpAddr,
    /// The local interface holding it (the address when none is found).
    pub(crate) local_name: String,
    /// Its index (0: unknown, link state not watched).
    pub(crate) ifindex: u32,
    /// Its link is up (unknown: up).
    pub(crate) up: bool,
    /// The peer's name for its end: `name@addr`.
    pub(crate) remote_name: String,
}

impl From<Route> for TcpRail {
    fn from(r: Route) -> TcpRail {
        TcpRail {
            local_name: r.local_name,
            ifindex: r.ifindex,
            remote_name: r.remote_name,
            endpoint: Arc::new(Endpoint {
                local_ip: r.local_ip,
                remote: r.remote,
                up: AtomicBool::new(r.up),
            }),
        }
    }
}

/// The route from this host to the advertised rail `entry`: the local
/// address the routing table picks for its address, and that address's
/// interface. An error when the address is not one, or no route reaches
/// it.
pub(crate) fn route_to(entry: &RailEntry) -> std::io::Result<Route> {
    let remote: SocketAddr = entry
        .addr
        .parse()
        .map_err(|_| std::io::Error::other(format!("bad rail address {:?}", entry.addr)))?;
    // A connected UDP socket sends nothing; it only asks the routing
    // table which local address reaches `remote`.
    let probe = UdpSocket::bind(SocketAddr::new(unspecified(remote.ip()), 0))?;
    probe.connect(remote)?;
    let local_ip = probe.local_addr()?.ip();
    let iface = netlink::interface_of(local_ip).ok().flatten();
    let (local_name, ifindex, up) = match &iface {
        Some(i) => (i.name.clone(), i.index, i.up),
        None => (local_ip.to_string(), 0, true),
    };
    Ok(Route {
        remote,
        local_ip,
        local_name,
        ifindex,
        up,
        remote_name: format!("{}@{}", entry.name, entry.addr),
    })
}

/// A peer's advertised rails as routed from here, or why not.
type Routed<'a> = (
    Vec<(&'a RailEntry, Route)>,
    Vec<(&'a RailEntry, std::io::Error)>,
);

/// The rails to a peer that advertises `entries`: one per entry `route`
/// reaches, in the peer's order, and the entries it does not with why.
pub(crate) fn plan_routes(
    entries: &[RailEntry],
    route: impl Fn(&RailEntry) -> std::io::Result<Route>,
) -> Routed<'_> {
    let (mut routes, mut skipped) = (Vec::new(), Vec::new());
    for entry in entries {
        match route(entry) {
            Ok(r) => routes.push((entry, r)),
            Err(e) => skipped.push((entry, e)),
        }
    }
    (routes, skipped)
}

fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn install(&self, ctx: &InstallContext) -> Result<()> {
        if ctx.workers > self.workers.workers() {
            return Err(Error::invalid(format!(
                "tcp transport built for {} workers, engine has {}",
                self.workers.workers(),
                ctx.workers
            )));
        }
        self.workers.bind(ctx.engine)?;
        match backend::resolve(self.settings.backend) {
            Ok((b, parks)) => {
                tracing::info!(
                    backend = b.as_str(),
                    parks,
                    "tcp: workers drive their connections on {}",
                    b.as_str()
                );
                self.parks.store(parks, Ordering::Relaxed);
            }
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    "transports/tcp/backend is io_uring, but this kernel refuses one",
                )
                .with_source(e));
            }
        }
        let _ = self.placement.set(ctx.placement.clone());
        // Watching from install on: a rail's link read at attach is
        // then kept up to date.
        ctx.links.start();
        let _ = self.links.set(ctx.links.clone());
        let _ = self.wakers.set(ctx.wakers.clone());
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            atomic_submit: false,
            synchronous: false,
            remote: true,
            slice_bytes: self.settings.slice_bytes,
            // The worker drives its connections itself: it polls while
            // slices are out, and parks in its ring where it can.
            wakes_worker: false,
            parks_worker: self.parks.load(Ordering::Relaxed),
        }
    }

    fn reaches(&self, segment: &Segment) -> bool {
        peer_of(segment).is_some()
    }

    fn submit(&self, ctx: &WorkerCtx, slices: &[Slice<'_>], out: &mut [SubmitOutcome]) {
        let now = monotonic_ns();
        let kind = TransportKind::Tcp;
        submit_to_peers(
            kind,
            &self.workers,
            ctx,
            slices,
            out,
            |ws, attached, peer: &TcpPeer, s| {
                let key = match peer.key_for(s.remote, s.len) {
                    Ok(k) => k,
                    Err(e) => return SubmitOutcome::Completed(Err(e)),
                };
                let mut links = match peer.per_worker.get(ctx) {
                    Ok(l) => l,
                    Err(e) => return SubmitOutcome::Rejected(e),
                };
                if !ws.tokens.add(s.token) {
                    // Cannot happen: the table has room for every credit.
                    return SubmitOutcome::Rejected(ErrorKind::SqFull);
                }
                let mut op = Op::new(s.token, s.opcode, s.local, s.remote, s.len, key);
                op.posted_ns = now;
                op.set_mem_node(s.region.numa_node());
                if s.priority == Priority::High {
                    op.set_urgent();
                }
                let posted = self.post(
                    peer,
                    &mut links,
                    &mut ws.driver,
                    op,
                    Ask::next(op.is_urgent(), s.slices_left()),
                );
                if posted.is_err() {
                    ws.tokens.finish(s.token);
                }
                // Rare (first slice since the peer drained): the only
                // reference-count update on this path.
                if posted.is_ok()
                    && links.activity.posted()
                    && let Ok(p) = Arc::downcast::<TcpPeer>(attached.clone())
                {
                    ws.active.push(p);
                }
                SubmitOutcome::of_post(posted)
            },
        );
    }

    fn poll(&self, ctx: &WorkerCtx, out: &mut [SliceCompletion]) -> usize {
        // Refused at submit too: nothing of this worker's is in flight here.
        let Ok(mut ws) = self.workers.get(ctx) else {
            return 0;
        };
        let ws = &mut *ws;
        let mut now = monotonic_ns();
        ws.driver.turn(now);
        let mut n = 0;
        let mut i = 0;
        let mut reposted = false;
        while i < ws.active.len() && n < out.len() {
            let peer = ws.active[i].clone();
            // Opened with this context when the peer joined `active`.
            let Ok(mut guard) = peer.per_worker.get(ctx) else {
                i += 1;
                continue;
            };
            let links = &mut *guard;
            let before = n;
            for e in 0..links.links.len() {
                let Some(id) = links.links[e] else {
                    continue;
                };
                while n < out.len() {
                    let Some(op) = ws.driver.link(id).done.pop_front() else {
                        break;
                    };
                    match self.settle(&peer, links, ws, op, now) {
                        Some(c) => {
                            out[n] = c;
                            n += 1;
                        }
                        None => reposted = true,
                    }
                }
            }
            if n > before {
                now = monotonic_ns();
                peer.rails.review(now, |i| peer.links[i].is_up());
            }
            let drained = links.activity.drained();
            drop(guard);
            if drained {
                ws.active.swap_remove(i);
            } else {
                i += 1;
            }
        }
        if reposted {
            // Slices moved to other connections go out now, not after the
            // worker's next park (rare: only after a failure).
            ws.driver.turn(monotonic_ns());
        }
        self.wire[ctx.index()].store(ws.driver.wire_total(), Ordering::Relaxed);
        n
    }

    fn attach_peer(
        &self,
        _name: &str,
        desc: &SegmentDescriptor,
    ) -> Option<Result<crate::segment::Attachment>> {
        desc.transports
            .contains(&(TransportKind::Tcp as u8))
            .then(|| self.attach(desc).map(|p| p as crate::segment::Attachment))
    }

    fn live_rail_policy(&self) -> Option<Arc<LiveRailPolicy>> {
        Some(self.settings.rail_policy.clone())
    }

    fn live_selector(&self) -> Option<Arc<LiveSelector>> {
        Some(self.selector.clone())
    }

    fn rail_stats(&self, segment: &Segment) -> Vec<RailStat> {
        peer_of(segment)
            .map(TcpPeer::rail_stats)
            .unwrap_or_default()
    }

    fn stop(&self) {
        TcpTransport::stop(self);
    }

    fn park(&self, ctx: &WorkerCtx, word: &AtomicU32, seen: u32, timeout: Duration) {
        match self.workers.get(ctx) {
            Ok(mut ws) => ws.driver.park(word, seen, timeout),
            Err(_) => crate::doorbell::wait_on(word, seen, timeout),
        }
    }

    fn worker_exit(&self, ctx: &WorkerCtx) {
        if let Ok(mut ws) = self.workers.get(ctx) {
            // Its sockets close and its ring goes on this thread: the
            // ring's teardown signals the thread that set it up, which must
            // not be an application's (its blocking calls would see EINTR).
            ws.driver.close();
        }
    }

    fn abort(&self, ctx: &WorkerCtx, token: u64, kind: ErrorKind) {
        let Ok(mut ws) = self.workers.get(ctx) else {
            return;
        };
        let ws = &mut *ws;
        // Nothing of it out here, or aborted already.
        if !ws.tokens.abort(token, kind) {
            return;
        }
        let now = monotonic_ns();
        for peer in &ws.active {
            let Ok(links) = peer.per_worker.get(ctx) else {
                continue;
            };
            for id in links.links.iter().flatten() {
                ws.driver.abort_token(*id, token, kind, now);
            }
        }
    }
}

impl TcpTransport {
    /// One slice back from a connection: its completion, or `None` when
    /// it was posted again (moved to a sibling rail off a lost one, or
    /// caught on a connection reset for another task's slice: neither is
    /// a fault of the slice, nor the second one of the rail).
    #[inline]
    fn settle(
        &self,
        peer: &TcpPeer,
        links: &mut PeerLinks,
        ws: &mut WorkerState,
        op: Op,
        now: u64,
    ) -> Option<SliceCompletion> {
        let r = op.rail as usize;
        let aborted = ws.tokens.aborted(op.token);
        let result = match aborted {
            // Stopped: its own result if it finished first, else `kind`.
            Some(kind) if op.status != 0 => Err(kind),
            _ if op.status == BYSTANDER => {
                // Caught on a reset for another task's slice: no fault of
                // its own nor of the rail; it leaves the rail and goes again.
                peer.rails.left(&mut links.rails, r, op.len);
                let mut again = op;
                again.status = 0;
                again.posted_ns = now;
                match self.post(peer, links, &mut ws.driver, again, Ask::Again(None)) {
                    Ok(()) => return None,
                    Err(e) => return Some(finish(links, &mut ws.tokens, op.token, Err(e))),
                }
            }
            _ => op.result(),
        };
        let fault = match result {
            Ok(_) => {
                peer.rails
                    .completed(&mut links.rails, r, op.len, op.posted_ns, now, op.ahead);
                false
            }
            Err(k) => {
                peer.rails.left(&mut links.rails, r, op.len);
                // An aborted slice is no fault of the rail. A rail whose
                // link is down is out already; its monitor counts the
                // faults the link state cannot see.
                match aborted {
                    Some(_) => false,
                    None if peer.links[r].is_up() => peer.rails.fault(r, k),
                    None => is_rail_fault(k),
                }
            }
        };
        if fault && op.attempts < MAX_RAIL_MOVES {
            let mut again = op;
            again.attempts += 1;
            again.status = 0;
            again.posted_ns = now;
            if self
                .post(peer, links, &mut ws.driver, again, Ask::Again(Some(r)))
                .is_ok()
            {
                peer.rails.moved(r);
                // Per slice, and a target answering RouteLost drives it:
                // once per (peer, rail), then counts.
                crate::lograte::log_limited!(debug, (&*peer.name, op.rail), peer = %peer.name, from_rail = op.rail, "slice re-posted on a sibling rail");
                return None;
            }
        }
        Some(finish(links, &mut ws.tokens, op.token, result))
    }

    /// Slices on the wire over all its connections (0 when idle), as of
    /// each worker's last turn.
    pub(crate) fn wire_in_flight(&self) -> u32 {
        self.wire.iter().map(|w| w.load(Ordering::Relaxed)).sum()
    }

    /// Nothing to join: the workers drive the connections, and dropping
    /// the transport closes them.
    pub(crate) fn stop(&self) {}
}

/// The slice of `token` is done with `result`.
#[inline]
fn finish(
    links: &mut PeerLinks,
    tokens: &mut Tokens,
    token: u64,
    result: std::result::Result<u64, ErrorKind>,
) -> SliceCompletion {
    tokens.finish(token);
    links.activity.completed();
    SliceCompletion { token, result }
}

/// The addresses (with interface names) this engine advertises, and its
/// data server listens on: the loopback address alone when the control
/// plane listens on loopback, else every up IPv4 interface (the control
/// plane's first), else the control address itself (loopback for a
/// wildcard one).
pub(crate) fn advertised_addrs(host: IpAddr) -> Vec<(String, IpAddr)> {
    if host.is_loopback() {
        let name = netlink::interface_of(host)
            .ok()
            .flatten()
            .map_or_else(|| "lo".to_owned(), |i| i.name);
        return vec![(name, host)];
    }
    let mut addrs = Vec::new();
    for i in netlink::interfaces().unwrap_or_default() {
        if !i.up {
            continue;
        }
        for ip in i.addrs.iter().map(|a| &a.ip) {
            if ip.is_ipv4() && !ip.is_loopback() && (host.is_unspecified() || host.is_ipv4()) {
                let e = (i.name.clone(), *ip);
                if *ip == host {
                    addrs.insert(0, e);
                } else {
                    addrs.push(e);
                }
            }
        }
    }
    if addrs.is_empty() {
        // No up IPv4 interface: the control address, or loopback for a
        // wildcard one (never the wildcard itself).
        addrs.push(if host.is_unspecified() {
            ("lo".to_owned(), IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
        } else {
            ("host".to_owned(), host)
        });
    }
    addrs.truncate(crate::control::wire::MAX_RAILS);
    addrs
}

/// The rails this engine advertises for a data server on `port` (see
/// [`advertised_addrs`]).
pub(crate) fn advertised_rails(host: IpAddr, port: u16) -> Vec<RailEntry> {
    advertised_addrs(host)
        .into_iter()
        .map(|(name, ip)| RailEntry {
            name,
            addr: SocketAddr::new(ip, port).to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(name: &str, port: u16) -> SegmentDescriptor {
        SegmentDescriptor {
            name: name.into(),
            rails: vec![
                RailEntry {
                    name: "a".into(),
                    addr: format!("127.0.0.1:{port}"),
                },
                RailEntry {
                    name: "b".into(),
                    addr: format!("127.0.0.2:{port}"),
                },
            ],
            ..Default::default()
        }
    }

    /// Every connection to one peer (every worker, every rail) names the
    /// peer's one session (they share its `Options`), so a fence reaches
    /// them all; a session one target has seen is worth nothing at
    /// another: each attached peer gets its own.
    #[test]
    fn each_peer_gets_a_session_no_other_peer_sees() {
        let mut c = Config::default();
        c.workers.count = 2;
        let t = TcpTransport::new(&c);
        let a = t.attach(&desc("a", 1)).unwrap();
        let b = t.attach(&desc("b", 2)).unwrap();
        assert_ne!(
            a.opts.session, b.opts.session,
            "two peers saw the same session"
        );
        drop((a, b));
        t.stop();
    }
}
