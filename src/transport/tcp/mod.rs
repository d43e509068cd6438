//! `tcp`: one-sided READ and WRITE over TCP, served by the target.
//!
//! The target runs a [`DataServer`] that moves bytes straight between its
//! sockets and registered memory, checking region, bounds and key per op.
//! The initiator reaches a peer over one or more **rails** (local interface,
//! remote interface), each with `connections_per_peer` bulk connections
//! and one express connection per worker ([`conn`]; a HIGH slice may take
//! any of them, a lower one only a bulk one: `TcpPeer::stride`); the
//! [`DeviceSelector`] sprays a request's slices over the rails whose link
//! is up. A link watch (rtnetlink) marks a rail down
//! the moment its interface goes down and breaks its connections; their
//! in-flight slices come back `RouteLost` and are re-posted on a sibling
//! rail before the worker ever sees them (DESIGN.md's recovery order). Only
//! when no rail is left does `RouteLost` reach the task.
//!
//! [`Transport::abort`] stops a task's slices: its queued slices complete
//! at once without being sent, and a connection with one of them on the
//! wire is reset, so each completes only once no thread of the connection
//! (nor the kernel) touches its buffer; the other tasks' slices caught on
//! that connection are re-posted, with no rail fault counted.
//! [`TcpTransport::stop`] joins every thread of the transport.

mod abort;
pub(crate) mod conn;
mod fence;
pub mod frame;
#[doc(hidden)]
pub mod handshake;
mod io;
pub mod server;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use tent_rings::{ErrorKind, Priority, TransportKind};

use abort::{AbortBoard, Tokens};
pub(crate) use conn::{BYSTANDER, Conn, ConnEnds, Endpoint, Op};
use fence::PeerFences;
pub(crate) use server::DataServer;

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
    Ask, DeviceSelector, LinkListener, MAX_RAIL_MOVES, Placement, RailDesc, RailLinks, RailPolicy,
    RailSet, SelectorConfig, WorkerRails, is_rail_fault,
};

/// Settings read once from the config.
#[derive(Debug, Clone, Copy)]
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
    rail_policy: RailPolicy,
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
    /// Every connection on this rail, for the link watch.
    conns: Mutex<Vec<Arc<Conn>>>,
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
            tracing::warn!(local = %self.local_name, remote = %self.remote_name, "rail down: link lost; in-flight slices move to sibling rails");
            for c in self.conns.lock().iter() {
                c.abort(ErrorKind::RouteLost);
            }
        } else if !was && up {
            tracing::info!(local = %self.local_name, remote = %self.remote_name, "rail up: link restored");
            return true;
        }
        false
    }
}

/// What a worker has on one peer.
struct PeerLinks {
    /// Connections, rail-major: `rail * (conns_per_rail + 1) + c`; the
    /// last of each rail's is its express connection ([`TcpPeer::stride`]).
    ends: Vec<ConnEnds>,
    /// This worker's loads, estimates and plan on the peer's rails.
    rails: WorkerRails,
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
}

/// The TCP transport (initiator side).
pub(crate) struct TcpTransport {
    settings: Settings,
    workers: PerWorker<WorkerState>,
    /// Per worker: the tokens it aborted, for its connections' threads.
    boards: Vec<Arc<AbortBoard>>,
    /// Every connection's sender thread (which joins its receiver).
    threads: Mutex<Vec<(Arc<Conn>, JoinHandle<()>)>>,
    selector: Arc<DeviceSelector>,
    /// Where the workers run (set at install).
    placement: OnceLock<Arc<Placement>>,
    /// The engine's link watch (set at install); attached peers listen.
    links: OnceLock<Arc<RailLinks>>,
    wakers: OnceLock<Arc<Wakers>>,
    /// `rpc_shared_secret`: proven on every data connection when set.
    secret: Option<Arc<[u8]>>,
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
    let tokens = tokens_per_worker(config);
    Tokens::bytes(tokens).saturating_add(AbortBoard::bytes(tokens))
}

impl TcpTransport {
    /// A transport for an engine with `config`.
    pub(crate) fn new(config: &Config) -> TcpTransport {
        let t = &config.transports.tcp;
        let count = config.workers.count.max(1) as usize;
        let tokens = tokens_per_worker(config);
        let workers = PerWorker::new(count, |_| WorkerState {
            active: Vec::with_capacity(16),
            tokens: Tokens::new(tokens),
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
                rail_policy: RailPolicy::from_config(config),
            },
            workers,
            boards: (0..count)
                .map(|_| Arc::new(AbortBoard::new(tokens)))
                .collect(),
            threads: Mutex::new(Vec::new()),
            selector: Arc::new(DeviceSelector::new(SelectorConfig::from_config(config))),
            placement: OnceLock::new(),
            links: OnceLock::new(),
            wakers: OnceLock::new(),
            secret: config.secret().map(Arc::from),
        }
    }

    /// Connect-side view of a peer from its descriptor: one rail per
    /// advertised interface that a local route reaches, and per worker
    /// `connections_per_peer` connections on each (they connect lazily).
    pub(crate) fn attach(&self, desc: &SegmentDescriptor) -> Result<Arc<TcpPeer>> {
        let mut rails = Vec::new();
        for entry in &desc.rails {
            match self.rail_to(entry) {
                Ok(r) => rails.push(r),
                Err(e) => {
                    tracing::info!(peer = %desc.name, rail = %entry.name, error = %e, "tcp rail skipped")
                }
            }
        }
        if rails.is_empty() {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "{}: no advertised tcp rail is reachable from here",
                    desc.name
                ),
            ));
        }
        let s = self.settings;
        let set = RailSet::new(
            TransportKind::Tcp,
            self.selector.clone(),
            s.rail_policy,
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
        let fences = Arc::new(PeerFences::default());
        // One session for every connection to this peer (see Options).
        let session = conn::new_session();
        let mut per_worker = Vec::with_capacity(self.workers.workers());
        for w in 0..self.workers.workers() {
            let shared = conn::Shared {
                board: self.boards[w].clone(),
                fences: fences.clone(),
                notify: self.wakers.get().map(|k| (k.clone(), w)),
            };
            // Per rail, the bulk connections and the express one.
            let mut ends = Vec::with_capacity(rails.len() * (s.conns_per_rail + 1));
            for rail in &rails {
                for _ in 0..=s.conns_per_rail {
                    let (e, thread) = conn::open(
                        rail.endpoint.clone(),
                        s.queue,
                        s.inflight_per_conn,
                        conn::Options {
                            user_timeout_ms: s.user_timeout_ms,
                            connect_timeout: s.connect_timeout,
                            patience: s.patience,
                            secret: self.secret.clone(),
                            session,
                        },
                        shared.clone(),
                    )?;
                    {
                        let mut threads = self.threads.lock();
                        // Those of peers dropped since (their ends stop them).
                        threads.retain(|(_, h)| !h.is_finished());
                        threads.push((e.conn.clone(), thread));
                    }
                    rail.conns
                        .lock()
                        .push(e.conn.clone());
                    ends.push(e);
                }
            }
            per_worker.push(PeerLinks {
                ends,
                rails: set.worker(w),
                conn_cursor: vec![0; rails.len()],
                activity: PeerActivity::default(),
            });
        }
        let mut regions = desc.regions.clone();
        regions.sort_by_key(|r| r.addr);
        tracing::info!(peer = %desc.name, rails = rails.len(), conns_per_rail = s.conns_per_rail, smart = self.selector.is_smart(), "tcp peer attached");
        let peer = Arc::new(TcpPeer {
            name: desc.name.clone(),
            regions,
            links: rails,
            rails: set,
            conns_per_rail: s.conns_per_rail,
            per_worker: per_worker.into_iter().collect(),
        });
        if let Some(links) = self.links.get() {
            links.listen(Arc::downgrade(&peer) as Weak<dyn LinkListener>);
        }
        Ok(peer)
    }

    /// Pair an advertised remote interface with the local interface the
    /// kernel routes to it through.
    fn rail_to(&self, entry: &RailEntry) -> std::io::Result<TcpRail> {
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
        let remote_name = format!("{}@{}", entry.name, entry.addr);
        Ok(TcpRail {
            local_name,
            ifindex,
            remote_name,
            endpoint: Arc::new(Endpoint {
                local_ip,
                remote,
                up: AtomicBool::new(up),
            }),
            conns: Mutex::new(Vec::new()),
        })
    }

    /// Queue `op` on a connection of the rail the selector picks for it
    /// (`ask`: its request's next slice, or one going again) among those
    /// whose link is up.
    #[inline]
    fn post(
        &self,
        peer: &TcpPeer,
        links: &mut PeerLinks,
        mut op: Op,
        ask: Ask,
    ) -> std::result::Result<(), ErrorKind> {
        let urgent = op.is_urgent();
        let rail = peer
            .rails
            .pick(&mut links.rails, op.mem_node(), op.token, ask, op.len, |r| {
                peer.links[r].is_up()
            })?;
        let first = rail * peer.stride();
        let (c, class) = if urgent {
            // HIGH: the rail's connection with the fewest slices on the
            // wire, the express one included (first on a tie, so the first
            // HIGH slice to a peer connects it before bulk crowds the
            // others), into its express ring (sent before its queued bulk).
            let c = (0..peer.stride())
                .rev()
                .min_by_key(|&c| links.ends[first + c].conn.window().posted())
                .unwrap_or(0);
            (c, conn::EXPRESS)
        } else {
            let c = links.conn_cursor[rail];
            links.conn_cursor[rail] = (c + 1) % peer.conns_per_rail;
            (c, conn::BULK)
        };
        let ends = &mut links.ends[first + c];
        op.rail = rail as u8;
        op.ahead = peer.rails.posted(&mut links.rails, rail, op.len);
        if ends.submit[class].push(op).is_err() {
            peer.rails.left(&mut links.rails, rail, op.len);
            return Err(ErrorKind::SqFull);
        }
        ends.submit[class].sync();
        ends.conn.wake();
        Ok(())
    }
}

/// The TCP state of `segment`, if TCP reaches it.
pub(crate) fn peer_of(segment: &Segment) -> Option<&TcpPeer> {
    segment.attached::<TcpPeer>(TransportKind::Tcp)
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
            // Every connection notifies its worker once install gave us
            // the bells (the engine reads capabilities after install).
            wakes_worker: self.wakers.get().is_some(),
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
        let board = &self.boards[ctx.index()];
        let mut n = 0;
        let mut i = 0;
        let mut now = 0;
        while i < ws.active.len() && n < out.len() {
            let peer = &ws.active[i];
            // Opened with this context when the peer joined `active`.
            let Ok(mut guard) = peer.per_worker.get(ctx) else {
                i += 1;
                continue;
            };
            let links = &mut *guard;
            let before = n;
            for e in 0..links.ends.len() {
                for unsent in [false, true] {
                    while n < out.len() {
                        let ends = &mut links.ends[e];
                        let ring = if unsent {
                            &mut ends.unsent
                        } else {
                            &mut ends.done
                        };
                        let Some(op) = ring.pop() else {
                            break;
                        };
                        if now == 0 {
                            now = monotonic_ns();
                        }
                        if let Some(c) = self.settle(peer, links, &mut ws.tokens, board, op, now) {
                            out[n] = c;
                            n += 1;
                        }
                    }
                    let ends = &mut links.ends[e];
                    if unsent {
                        ends.unsent.sync();
                    } else {
                        ends.done.sync();
                    }
                }
            }
            if n > before {
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

    fn rail_stats(&self, segment: &Segment) -> Vec<RailStat> {
        peer_of(segment)
            .map(TcpPeer::rail_stats)
            .unwrap_or_default()
    }

    fn stop(&self) {
        TcpTransport::stop(self);
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
        let board = &self.boards[ctx.index()];
        // Posted first (SeqCst), then the wires looked at: see Conn::claim.
        board.post(token, kind);
        for peer in &ws.active {
            let Ok(links) = peer.per_worker.get(ctx) else {
                continue;
            };
            for e in &links.ends {
                if e.conn.on_wire(token) {
                    e.conn.stop_slices();
                } else {
                    e.conn.aborted();
                }
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
        tokens: &mut Tokens,
        board: &AbortBoard,
        op: Op,
        now: u64,
    ) -> Option<SliceCompletion> {
        let r = op.rail as usize;
        let aborted = tokens.aborted(op.token);
        let result = match aborted {
            // Stopped: its own result if it finished first, else `kind`.
            Some(kind) if op.status != 0 => Err(kind),
            _ if op.status == BYSTANDER => {
                // Caught on a reset for another task's slice: no fault of
                // its own nor of the rail; it leaves the rail and goes again.
                peer.rails.left(&mut links.rails, r, op.len);
                let mut again = op;
                again.status = 0;
                match self.post(peer, links, again, Ask::Again(None)) {
                    Ok(()) => return None,
                    Err(e) => return Some(self.finish(links, tokens, board, op.token, Err(e))),
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
            if self.post(peer, links, again, Ask::Again(Some(r))).is_ok() {
                peer.rails.moved(r);
                // Per slice, and a target answering RouteLost drives it:
                // once per (peer, rail), then counts.
                crate::lograte::log_limited!(debug, (&*peer.name, op.rail), peer = %peer.name, from_rail = op.rail, "slice re-posted on a sibling rail");
                return None;
            }
        }
        Some(self.finish(links, tokens, board, op.token, result))
    }

    /// The slice of `token` is done with `result`.
    #[inline]
    fn finish(
        &self,
        links: &mut PeerLinks,
        tokens: &mut Tokens,
        board: &AbortBoard,
        token: u64,
        result: std::result::Result<u64, ErrorKind>,
    ) -> SliceCompletion {
        if tokens.finish(token) {
            board.remove(token);
        }
        links.activity.completed();
        SliceCompletion { token, result }
    }

    /// Slices on the wire over all its connections (their windows' taken
    /// credits; 0 when idle). Diagnostic: takes the connection list's lock.
    pub(crate) fn wire_in_flight(&self) -> u32 {
        self.threads
            .lock()
            .iter()
            .map(|(c, _)| c.window().posted())
            .sum()
    }

    /// Stop every connection's threads and join them:
    /// once this returns, no thread of this transport runs. The engine
    /// calls it when dropped, once its workers are done (nothing is in
    /// flight then); a slice still queued completes `Shutdown`.
    pub(crate) fn stop(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        for (conn, _) in &threads {
            conn.shut_down();
        }
        for (_, thread) in threads {
            if thread.join().is_err() {
                tracing::error!("a tcp connection thread panicked");
            }
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop();
    }
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

    fn sessions(p: &TcpPeer) -> Vec<[u8; frame::SESSION_LEN]> {
        p.links
            .iter()
            .flat_map(|r| {
                r.conns
                    .lock()
                    .iter()
                    .map(|c| c.session())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A fence reaches every connection to one peer (every worker, every
    /// rail), and a session one target has seen is worth nothing at
    /// another: each attached peer gets its own.
    #[test]
    fn every_connection_to_one_peer_shares_a_session_no_other_peer_sees() {
        let mut c = Config::default();
        c.workers.count = 2;
        let t = TcpTransport::new(&c);
        let a = t.attach(&desc("a", 1)).unwrap();
        let b = t.attach(&desc("b", 2)).unwrap();
        let (sa, sb) = (sessions(&a), sessions(&b));
        assert!(sa.len() >= 4, "{} connections", sa.len());
        assert!(sa.iter().all(|s| *s == sa[0]));
        assert!(sb.iter().all(|s| *s == sb[0]));
        assert_ne!(sa[0], sb[0], "two peers saw the same session");
        drop((a, b));
        t.stop();
    }
}
