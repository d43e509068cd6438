//! The target side of `tcp`: serves one-sided READ and WRITE straight from
//! and into registered memory.
//!
//! One accept thread and one thread per connection (blocking I/O: the
//! connection's requests are served in order, which is what lets the
//! initiator match responses without a lookup). Every request is checked
//! against the registered regions, their bounds and their key before a byte
//! moves; a refused request fails alone (a refused WRITE's payload is read
//! and dropped) and the connection goes on. Only a frame that breaks the
//! byte stream's framing (bad magic, unknown opcode, oversized length)
//! closes the connection, with a logged reason.
//!
//! Hostile peers: the server listens only on the addresses the engine
//! advertises; with a shared secret a connection proves it
//! ([`handshake`]) before its first request; refusals to
//! a connection that has not proven it reveal nothing about memory layout
//! (`check`); the handshake has one deadline, an idle connection is
//! closed, a frame that stalls (or a response the peer stops reading) for
//! the [`stall_limit`] closes its connection, and a full server evicts an
//! unproven connection, one that has served nothing (refused requests
//! do not count), or one that has served nothing for long, for a
//! newcomer, or tells it [`BUSY`].
//!
//! Fences: each connection is registered under the ident its initiator's
//! hello gave (session, connection id). A [`Fence`] naming a connection of
//! the sender's own session marks it fenced, shuts its socket down and
//! waits (bounded by the stall limit) until its thread is out of any
//! payload `recv` into region memory; a fenced connection writes no more
//! (its thread checks the mark after announcing a write, Dekker-style:
//! one store and one load per WRITE) and is closed. So no byte of a
//! superseded connection lands after the slice moved off it is served.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tent_rings::{ErrorKind, Opcode};

use super::frame::{BUSY, Fence, Hello, Ident, Inbound, REQUEST_LEN, Request, Response};
use super::io::Pace;
use super::{handshake, io};
use crate::clock::monotonic_ns;
use crate::error::{Error, Result};
use crate::memory::{RegionTable, RegionUse};
use crate::refusals::Refusals;

/// Connections served at once; past it an idle or unproven one is evicted
/// for a newcomer, or the newcomer is told [`BUSY`].
pub(crate) const MAX_CONNECTIONS: usize = 512;
/// Refused data connections held at once (see `Refusals`).
const REFUSED_KEPT: usize = 256;
/// The whole handshake (hellos, proofs) must be done within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Socket read timeout of a connection between requests: the unit of its
/// idle count (it wakes this often when idle; stopping does not wait for
/// it: the server shuts its connections down).
const IDLE_POLL: Duration = Duration::from_secs(1);
/// A connection idle this many polls (60 s) is closed.
const IDLE_CLOSE_POLLS: u32 = 60;
/// A connection that has served requests may be evicted for a newcomer
/// once none has been served for this long: longer than an initiator lets
/// its own connection idle before it reconnects first
/// (`op::RECONNECT_IDLE`), so an eviction never races a request. A
/// refused request is no use: a peer that sends nothing but requests for
/// keys it lacks holds its connection no longer than one that is silent.
const EVICT_UNSERVED: Duration = Duration::from_secs(30);
/// A connection still in its handshake this long may be evicted (a real
/// initiator's handshake takes a round trip or two).
const EVICT_HANDSHAKE_AGE: Duration = Duration::from_secs(1);

/// How long a frame in progress may stall (no byte in, or none taken by
/// the peer) before the connection is closed, with `TCP_USER_TIMEOUT` at 0
/// (the OS default, many minutes).
const STALL_LIMIT_DEFAULT: Duration = Duration::from_secs(10);
/// The shortest stall limit, whatever `TCP_USER_TIMEOUT` says.
const STALL_LIMIT_MIN: Duration = Duration::from_secs(1);

/// Tests: [`STALL_LIMIT_DEFAULT`] in ms, 0 = unchanged.
#[cfg(any(test, feature = "testing"))]
static STALL_LIMIT_DEFAULT_OVERRIDE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Tests only: replace [`STALL_LIMIT_DEFAULT`] (the stall limit of
/// connections served with `user_timeout_ms` 0) for servers' connections
/// accepted from now on, process-wide; `None` restores it.
#[cfg(any(test, feature = "testing"))]
pub fn set_default_stall_limit_for_tests(limit: Option<Duration>) {
    let ms = limit.map_or(0, |d| d.as_millis().max(1) as u64);
    STALL_LIMIT_DEFAULT_OVERRIDE_MS.store(ms, Ordering::Relaxed);
}

/// The stall limit of a serving connection: `transports/tcp/user_timeout_ms`
/// (how long the kernel itself lets data go unacknowledged), at least
/// `STALL_LIMIT_MIN`, or `STALL_LIMIT_DEFAULT` when it is 0.
pub(crate) fn stall_limit(user_timeout_ms: u32) -> Duration {
    match user_timeout_ms {
        0 => default_stall_limit(),
        ms => Duration::from_millis(ms as u64).max(STALL_LIMIT_MIN),
    }
}

/// The stall limit of connections served with `user_timeout_ms` 0.
fn default_stall_limit() -> Duration {
    #[cfg(any(test, feature = "testing"))]
    if let ms @ 1.. = STALL_LIMIT_DEFAULT_OVERRIDE_MS.load(Ordering::Relaxed) {
        return Duration::from_millis(ms);
    }
    STALL_LIMIT_DEFAULT
}

/// Where a connection is in its life (eviction order: lowest first).
const STAGE_HANDSHAKE: u8 = 0;
const STAGE_READY: u8 = 1;
const STAGE_SERVING: u8 = 2;

/// A running data server; stops when dropped.
pub(crate) struct DataServer {
    addrs: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    /// Accept threads; each hands back its connections' threads.
    threads: Vec<JoinHandle<Vec<JoinHandle<()>>>>,
    live: Arc<Live>,
}

/// One connection as the accept threads see it.
struct Slot {
    id: usize,
    /// A handle to shut it down (eviction, stop).
    stream: TcpStream,
    stage: AtomicU8,
    /// When it was accepted.
    born: Instant,
    /// Read timeouts in a row with nothing received (see [`IDLE_POLL`]).
    idle: AtomicU32,
    /// When (`clock::monotonic_ns`) it last served a request, or finished
    /// its handshake if it has served none; what eviction goes by.
    served_ns: AtomicU64,
    /// Who its initiator's hello said it is (set before the hello reply).
    ident: OnceLock<Ident>,
    /// Its thread is inside a WRITE payload's `recv` into region memory.
    writing: AtomicBool,
    /// Superseded (fenced or evicted): it may write no more into region
    /// memory. Its slot stays in [`Live`] until its thread is gone, so a
    /// fence still finds (and waits for) it.
    fenced: AtomicBool,
}

/// Why a fenced connection was closed.
const FENCED: &str = "fenced: a later connection of its initiator superseded it";
/// Why a slow WRITE payload was cut: its region was unregistered (the
/// unregister waits for the op; it does not wait for a peer's pace).
const REVOKED_MID_WRITE: &str = "the region was unregistered while its WRITE payload trickled in";
/// Why a slow READ response was cut (as for a WRITE).
const REVOKED_MID_READ: &str =
    "the region was unregistered while the peer was slow to take its READ";

/// A request refused for `why` (bad key, out of bounds, unregistered):
/// logged once per (operation, cause) and then counted, never per op (a
/// peer without the key could otherwise write a line per 32-byte frame).
fn refused(op: Opcode, why: ErrorKind) {
    crate::lograte::log_limited!(debug, (op as u8, why.code()), ?op, %why, "tcp request refused");
}

/// How long `c` has gone without serving a request, at `now`.
fn unserved(c: &Slot, now: u64) -> Duration {
    Duration::from_nanos(now.saturating_sub(c.served_ns.load(Ordering::Relaxed)))
}

/// The connections being served, so stopping can shut them down at once
/// and a full server can pick whom to evict.
#[derive(Default)]
struct Live {
    next: AtomicUsize,
    conns: Mutex<Vec<Arc<Slot>>>,
}

impl Live {
    /// Track `s`, evicting a victim first when full; `None`: no room.
    fn admit(&self, s: &TcpStream) -> Option<Arc<Slot>> {
        self.admit_up_to(s, MAX_CONNECTIONS)
    }

    /// [`Live::admit`] with room for `max` connections (tests use a small one).
    fn admit_up_to(&self, s: &TcpStream, max: usize) -> Option<Arc<Slot>> {
        let slot = Arc::new(Slot {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            stream: s.try_clone().ok()?,
            stage: AtomicU8::new(STAGE_HANDSHAKE),
            born: Instant::now(),
            idle: AtomicU32::new(0),
            served_ns: AtomicU64::new(monotonic_ns()),
            ident: OnceLock::new(),
            writing: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
        });
        let mut conns = self.conns.lock();
        // Superseded connections are closing: they hold no room (their
        // threads exit within the stall limit, then leave the list).
        let open = conns
            .iter()
            .filter(|c| !c.fenced.load(Ordering::Relaxed))
            .count();
        if open >= max {
            let victim = Self::victim(&conns)?;
            Self::evict(&conns[victim], "tcp data server full: evicted a connection");
        }
        conns.push(slot.clone());
        Some(slot)
    }

    /// Out of descriptors: evict a connection [`Live::victim`] names, so
    /// its descriptor comes free once its thread is gone. Whether there
    /// was one.
    fn evict_one(&self) -> bool {
        let conns = self.conns.lock();
        let Some(victim) = Self::victim(&conns) else {
            return false;
        };
        Self::evict(
            &conns[victim],
            "tcp data server out of file descriptors: evicted a connection",
        );
        true
    }

    /// Mark `v` fenced, then shut its socket down. Left in the list until
    /// its thread calls `remove`: a request already queued in its socket
    /// writes nothing (see `serve`), and a fence of it still waits for a
    /// write it is inside.
    fn evict(v: &Slot, why: &'static str) {
        v.fenced.store(true, Ordering::SeqCst);
        let _ = v.stream.shutdown(std::net::Shutdown::Both);
        tracing::debug!(
            stage = v.stage.load(Ordering::Relaxed),
            idle_s = v.idle.load(Ordering::Relaxed),
            unserved_ms = unserved(v, monotonic_ns()).as_millis() as u64,
            "{why}"
        );
    }

    /// Unproven (mid-handshake for [`EVICT_HANDSHAKE_AGE`]) first, then
    /// one that has served no request (for a poll since its handshake,
    /// however many it was refused), then the one unserved longest past
    /// [`EVICT_UNSERVED`]; oldest first among equals. A connection that
    /// an initiator is using right now is never one of them.
    fn victim(conns: &[Arc<Slot>]) -> Option<usize> {
        let now = monotonic_ns();
        conns
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.fenced.load(Ordering::Relaxed))
            .filter(|(_, c)| match c.stage.load(Ordering::Relaxed) {
                STAGE_HANDSHAKE => c.born.elapsed() >= EVICT_HANDSHAKE_AGE,
                STAGE_READY => unserved(c, now) >= IDLE_POLL,
                _ => unserved(c, now) >= EVICT_UNSERVED,
            })
            .min_by_key(|(_, c)| {
                (
                    c.stage.load(Ordering::Relaxed),
                    std::cmp::Reverse(unserved(c, now)),
                    c.id,
                )
            })
            .map(|(i, _)| i)
    }

    /// Serve `fence` from connection `me`: every other connection
    /// registered under `me`'s session and the fence's connection id is
    /// marked fenced and shut down, and this returns once none of them is
    /// inside a write into region memory (any later byte of theirs is
    /// refused), or `Err` after `bound`. A peer can fence only its own
    /// session's connections; a connection already gone needs nothing.
    fn fence(&self, me: &Slot, fence: Fence, bound: Duration) -> std::result::Result<(), String> {
        let Some(&mine) = me.ident.get() else {
            return Err("fence before a hello".into());
        };
        let who = Ident {
            session: mine.session,
            conn: fence.conn,
        };
        // Collected, not waited on under the lock (admissions go on).
        let victims: Vec<Arc<Slot>> = self
            .conns
            .lock()
            .iter()
            .filter(|c| c.id != me.id && c.ident.get() == Some(&who))
            .cloned()
            .collect();
        let start = Instant::now();
        for v in &victims {
            // SeqCst, paired with the writer's SeqCst store of `writing`
            // then load of `fenced` (serve): either it sees the mark and
            // writes nothing, or we see it writing and wait.
            v.fenced.store(true, Ordering::SeqCst);
            // Ends a payload `recv` at once (what was already received
            // still lands, before `writing` clears).
            let _ = v.stream.shutdown(std::net::Shutdown::Both);
        }
        for v in &victims {
            while v.writing.load(Ordering::SeqCst) {
                if start.elapsed() >= bound {
                    return Err(format!(
                        "fence of connection {}: still writing after {bound:?}",
                        fence.conn
                    ));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        // A peer may send fences at will: a line per cause, then counts.
        crate::lograte::log_limited!(
            debug,
            victims.len().min(2),
            conn = fence.conn,
            fenced = victims.len(),
            "tcp data connection fenced"
        );
        Ok(())
    }

    fn remove(&self, id: usize) {
        self.conns
            .lock()
            .retain(|c| c.id != id);
    }
}

impl std::fmt::Debug for DataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataServer")
            .field("addrs", &self.addrs)
            .finish()
    }
}

/// Bind every one of `ips` on one port (ephemeral: the first picks it).
fn bind_all(ips: &[IpAddr]) -> std::io::Result<Vec<TcpListener>> {
    let mut last = None;
    // Another socket may hold the first one's port on a later address:
    // then try again with a fresh port.
    for _ in 0..16 {
        let first = TcpListener::bind(SocketAddr::new(ips[0], 0))?;
        let port = first.local_addr()?.port();
        let mut all = vec![first];
        let rest: std::io::Result<Vec<TcpListener>> = ips[1..]
            .iter()
            .map(|ip| TcpListener::bind(SocketAddr::new(*ip, port)))
            .collect();
        match rest {
            Ok(r) => {
                all.extend(r);
                return Ok(all);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
}

impl DataServer {
    /// Listen on each of `ips` (one port for all, ephemeral) and serve
    /// `regions`; with `secret`, every connection proves it before its
    /// first request.
    pub(crate) fn start(
        ips: &[IpAddr],
        regions: Arc<ArcSwap<RegionTable>>,
        user_timeout_ms: u32,
        secret: Option<Arc<[u8]>>,
    ) -> Result<DataServer> {
        if ips.is_empty() {
            return Err(Error::invalid("tcp data server: no address to listen on"));
        }
        let listeners = bind_all(ips).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("tcp data server cannot listen on {ips:?}"),
            )
            .with_source(e)
        })?;
        let addrs = listeners
            .iter()
            .map(TcpListener::local_addr)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| {
                Error::new(ErrorKind::Unreachable, "tcp data server address").with_source(e)
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let mut server = DataServer {
            addrs: addrs.clone(),
            stop: stop.clone(),
            threads: Vec::new(),
            live: live.clone(),
        };
        for (listener, addr) in listeners.into_iter().zip(&addrs) {
            let (stop, live, regions, secret) =
                (stop.clone(), live.clone(), regions.clone(), secret.clone());
            let t = std::thread::Builder::new()
                .name(format!("tent-tcp-data-{}", addr.port()))
                .spawn(move || accept_loop(listener, stop, live, regions, user_timeout_ms, secret))
                .map_err(|e| {
                    Error::new(ErrorKind::OutOfMemory, "spawn tcp data server").with_source(e)
                })?;
            server.threads.push(t);
        }
        tracing::info!(addrs = ?addrs, authenticated = secret.is_some(), "tcp data server listening");
        Ok(server)
    }

    /// The first bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every bound address (one per advertised interface, one port).
    pub(crate) fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock each accept() with a connection of our own.
        for a in &self.addrs {
            let _ = TcpStream::connect_timeout(a, Duration::from_millis(200));
        }
        // No connection is accepted past this (the accept threads are
        // gone): every connection thread is in `serving`.
        let serving: Vec<JoinHandle<()>> = self
            .threads
            .drain(..)
            .flat_map(|t| t.join().unwrap_or_default())
            .collect();
        for c in self.live.conns.lock().iter() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        // Joined, not just shut down: a thread inside a WRITE payload's
        // `recv` still copies bytes already queued in its socket into
        // region memory, which the application may free once the engine's
        // drop returns. Each exits promptly on the shutdown (a fence it
        // serves waits at most the stall limit).
        for t in serving {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    live: Arc<Live>,
    regions: Arc<ArcSwap<RegionTable>>,
    user_timeout_ms: u32,
    secret: Option<Arc<[u8]>>,
) -> Vec<JoinHandle<()>> {
    let mut refused = Refusals::new(REFUSED_KEPT);
    // This listener's connection threads, for the server's drop to join:
    // the finished ones are joined at each accept, so it holds at most as
    // many as connections are live (about `MAX_CONNECTIONS`).
    let mut serving: Vec<JoinHandle<()>> = Vec::new();
    let mut reserve = Reserve::new();
    loop {
        reserve.refill();
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return serving;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of descriptors: what admission would do for a full
                // server, done now (an unused or long-unserved connection
                // goes, its descriptor free once its thread is), and the
                // reserve given up so the pending connection is accepted.
                let evicted = live.evict_one();
                crate::lograte::warn_limited!("tcp-data-emfile", error = %e, evicted, "tcp data server: out of file descriptors; evicting unused connections (raise RLIMIT_NOFILE)");
                if !reserve.release() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            Err(e) => {
                crate::lograte::warn_limited!(e.kind(), error = %e, "tcp data server: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        refused.prune();
        serving.retain(|t| !t.is_finished());
        let Some(slot) = live.admit(&stream) else {
            // Full of connections in use: say so (the initiator backs off
            // and retries; a busy target is no fault of the rail).
            crate::lograte::warn_limited!("tcp-data-full", %peer, limit = MAX_CONNECTIONS, "tcp data server: every connection in use; new ones are told to come back later");
            let _ = io::send_header(&stream, &Hello::refusal(BUSY).encode());
            refused.hold(stream);
            continue;
        };
        let (live2, stop2, regions2, secret2) =
            (live.clone(), stop.clone(), regions.clone(), secret.clone());
        let id = slot.id;
        let spawned = std::thread::Builder::new()
            .name("tent-tcp-serve".into())
            .spawn(move || {
                match serve(
                    &stream,
                    &slot,
                    &live2,
                    &stop2,
                    &regions2,
                    user_timeout_ms,
                    secret2.as_deref(),
                ) {
                    Ok(()) => tracing::debug!(%peer, "tcp data connection closed"),
                    Err(reason) => {
                        crate::lograte::warn_limited!(peer.ip(), %peer, %reason, "tcp data connection closed")
                    }
                }
                live2.remove(slot.id);
            });
        match spawned {
            Ok(t) => serving.push(t),
            Err(e) => {
                live.remove(id);
                crate::lograte::warn_limited!(e.kind(), %peer, error = %e, "tcp data server: cannot spawn a connection thread");
            }
        }
    }
}

/// A descriptor held in reserve by an accept loop: given up when `accept`
/// fails for want of descriptors, so the connection waiting can be taken
/// (and admission can make room for it), then taken back when one is free.
struct Reserve(Option<std::fs::File>);

impl Reserve {
    fn new() -> Reserve {
        let mut r = Reserve(None);
        r.refill();
        r
    }

    /// Take a descriptor back if it has none (a syscall only then).
    fn refill(&mut self) {
        if self.0.is_none() {
            self.0 = std::fs::File::open("/dev/null").ok();
        }
    }

    /// Give its descriptor up; whether it had one.
    fn release(&mut self) -> bool {
        self.0.take().is_some()
    }
}

/// Serve one connection until the peer closes, goes idle, the server
/// stops, or the stream's framing is lost (the `Err` carries the reason to
/// log).
fn serve(
    s: &TcpStream,
    slot: &Slot,
    live: &Live,
    stop: &AtomicBool,
    regions: &ArcSwap<RegionTable>,
    user_timeout_ms: u32,
    secret: Option<&[u8]>,
) -> std::result::Result<(), String> {
    io::tune(s.into(), user_timeout_ms);
    handshake::serve(s, secret, Instant::now() + HANDSHAKE_TIMEOUT, |ident| {
        let _ = slot.ident.set(ident);
    })?;
    // With a secret, every connection past the handshake has proven it.
    let proven = secret.is_some();
    slot.served_ns.store(monotonic_ns(), Ordering::Relaxed);
    slot.stage.store(STAGE_READY, Ordering::Relaxed);
    // Both ways, a blocked call comes back every poll, so a frame in
    // progress is held to its `Pace` (stalls, the rate floor, a region
    // unregistered under it) to within a poll.
    s.set_read_timeout(Some(IDLE_POLL))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IDLE_POLL))
        .map_err(|e| e.to_string())?;
    // A frame that has started is read to its end unless it stalls this
    // long; a response the peer stops taking fails after as long.
    let stall = stall_limit(user_timeout_ms);
    let respond = |resp: &Response| io::send_header_paced(s, &resp.encode(), &mut Pace::new(stall));
    let mut idle = 0u32;
    let mut serving = false;
    loop {
        let header = match io::recv_header::<REQUEST_LEN>(s, &mut Pace::new(stall)) {
            Ok(Some(h)) => h,
            Ok(None) if stop.load(Ordering::Acquire) => return Ok(()),
            Ok(None) => {
                idle += 1;
                slot.idle.store(idle, Ordering::Relaxed);
                if idle >= IDLE_CLOSE_POLLS {
                    return Err(format!("idle for {} s", idle));
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading a request: {e}")),
        };
        // Only stores when the connection was idle or new: nothing per op.
        if idle != 0 {
            idle = 0;
            slot.idle.store(0, Ordering::Relaxed);
        }
        let req = match Inbound::decode(&header).map_err(|e| format!("malformed request: {e}"))? {
            Inbound::Request(req) => req,
            Inbound::Fence(f) => {
                live.fence(slot, f, stall)?;
                continue;
            }
        };
        let table = regions.load();
        let target = check(&table, &req, proven);
        if target.is_ok() {
            // Served (or about to be): what keeps it from eviction.
            slot.served_ns.store(monotonic_ns(), Ordering::Relaxed);
            if !serving {
                serving = true;
                slot.stage.store(STAGE_SERVING, Ordering::Relaxed);
            }
        }
        let mut resp = Response {
            status: target.as_ref().map(|_| ()).map_err(|e| *e),
            seq: req.seq,
            len: 0,
        };
        match (req.opcode, target) {
            (Opcode::Write, Ok((ptr, in_use))) => {
                // Announce the write, then look for a fence (see Live::fence).
                slot.writing.store(true, Ordering::SeqCst);
                if slot.fenced.load(Ordering::SeqCst) {
                    slot.writing.store(false, Ordering::Release);
                    return Err(FENCED.into());
                }
                // An unregister waits for this op (`in_use`): a payload
                // that is slow is cut once the region is revoked, so the
                // wait ends within a poll.
                let revoked = || in_use.is_revoked();
                let mut pace = Pace::new(stall).cut_when(&revoked, REVOKED_MID_WRITE);
                // SAFETY: `ptr..ptr+len` lies inside a registered region, kept alive by `table` and in use (`in_use`: unregister_memory waits) for this whole op.
                let landed = unsafe { io::recv_exact(s, ptr, req.len as usize, &mut pace) };
                // Release: the payload's bytes are in memory before a
                // fencing thread sees the write over.
                slot.writing.store(false, Ordering::Release);
                // Done with the region: an unregister does not wait on the
                // response below (a peer slow to take it).
                drop(in_use);
                landed.map_err(|e| {
                    if slot.fenced.load(Ordering::Relaxed) {
                        FENCED.to_owned()
                    } else {
                        format!("WRITE payload: {e}")
                    }
                })?;
                resp.len = req.len;
                respond(&resp).map_err(|e| format!("WRITE response: {e}"))?;
            }
            (Opcode::Write, Err(why)) => {
                io::discard(s, req.len, &mut Pace::new(stall))
                    .map_err(|e| format!("refused WRITE payload: {e}"))?;
                refused(Opcode::Write, why);
                respond(&resp).map_err(|e| format!("WRITE response: {e}"))?;
            }
            (Opcode::Read, Ok((ptr, in_use))) => {
                resp.len = req.len;
                let revoked = || in_use.is_revoked();
                let mut pace = Pace::new(stall).cut_when(&revoked, REVOKED_MID_READ);
                // SAFETY: `ptr..ptr+len` lies inside a registered region, kept alive by `table` and in use (`in_use`) for this whole op.
                unsafe { io::send_paced(s, &resp.encode(), ptr, req.len as usize, &mut pace) }
                    .map_err(|e| format!("READ response: {e}"))?;
            }
            (Opcode::Read, Err(why)) => {
                refused(Opcode::Read, why);
                respond(&resp).map_err(|e| format!("READ response: {e}"))?;
            }
        }
    }
}

/// Where a request may touch memory, or why it may not.
///
/// A connection that has not proven the shared secret (every one, without
/// a secret) learns nothing about the layout of memory it holds no key
/// for: a miss is `AccessDenied` whether the address is registered, out of
/// bounds or nowhere, unless the key is the one of the region holding
/// `addr` (then bounds are no news to it). The success path is one lookup
/// and the region's use count (a region being unregistered takes no new
/// op: `AccessDenied`, as once it is out of the table).
fn check<'t>(
    table: &'t RegionTable,
    req: &Request,
    proven: bool,
) -> std::result::Result<(*mut u8, RegionUse<'t>), ErrorKind> {
    if req.len == 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    // Why not, told only to a caller who proved the secret or holds the
    // key of the region at `addr`.
    let detail = |why: ErrorKind| match table.find_addr(req.addr, 1) {
        _ if proven => why,
        Ok((region, _)) if req.key != 0 && region.key() == req.key => why,
        _ => ErrorKind::AccessDenied,
    };
    if req.addr.checked_add(req.len).is_none() {
        return Err(detail(ErrorKind::OutOfBounds));
    }
    match table.find_addr(req.addr, req.len) {
        Ok((region, ptr)) if req.key != 0 && region.key() == req.key => region
            .enter()
            .map(|u| (ptr, u))
            .ok_or(ErrorKind::AccessDenied),
        Ok(_) => Err(ErrorKind::AccessDenied),
        Err(e) => Err(detail(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tent_rings::RegionId;

    use super::super::frame::{RESPONSE_LEN, SESSION_LEN};
    use super::*;
    use crate::memory::MemRegion;

    const LEN: usize = 256 << 10;
    const S1: [u8; SESSION_LEN] = [0x51; SESSION_LEN];
    const S2: [u8; SESSION_LEN] = [0x52; SESSION_LEN];

    /// A data server on loopback serving one region of `LEN` zero bytes.
    fn served() -> (DataServer, Arc<MemRegion>) {
        let mut mem = vec![0u8; LEN];
        let base = mem.as_mut_ptr();
        // The Vec's heap buffer stays where it is when the Vec moves in.
        let region = Arc::new(MemRegion::new(
            RegionId(1),
            base,
            LEN as u64,
            Some(Box::new(mem)),
        ));
        let table = RegionTable::default().with(region.clone()).unwrap();
        let server = DataServer::start(
            &[IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            Arc::new(ArcSwap::from_pointee(table)),
            0,
            None,
        )
        .unwrap();
        (server, region)
    }

    /// The region's bytes (read once no connection writes to it).
    fn contents(region: &MemRegion) -> Vec<u8> {
        // SAFETY: the region is `LEN` bytes alive while `region` is; the callers read it after every write to it was answered or refused.
        unsafe { std::slice::from_raw_parts(region.addr() as *const u8, LEN) }.to_vec()
    }

    fn client(server: &DataServer, session: [u8; SESSION_LEN], conn: u32) -> TcpStream {
        let s = TcpStream::connect(server.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        handshake::open(&s, None, deadline, Ident { session, conn }).unwrap();
        s
    }

    fn write_req(region: &MemRegion, off: usize, len: usize) -> [u8; REQUEST_LEN] {
        Request {
            opcode: Opcode::Write,
            seq: 1,
            addr: region.addr() + off as u64,
            len: len as u64,
            key: region.key(),
        }
        .encode()
    }

    fn response(s: &mut TcpStream) -> Response {
        let mut h = [0u8; RESPONSE_LEN];
        s.read_exact(&mut h).unwrap();
        Response::decode(&h).unwrap()
    }

    fn closed(s: &mut TcpStream) -> bool {
        matches!(s.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn a_fenced_connection_lands_no_byte_after_the_fence() {
        let (server, region) = served();
        let (v1, v2) = (vec![0x11u8; LEN], vec![0x22u8; LEN]);
        // Connection 1 is mid-payload: half of version 1 is in.
        let mut old = client(&server, S1, 1);
        old.write_all(&write_req(&region, 0, LEN)).unwrap();
        old.write_all(&v1[..LEN / 2]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // Connection 2 of the same session fences it, then writes version 2.
        let mut new = client(&server, S1, 2);
        new.write_all(&Fence { conn: 1 }.encode()).unwrap();
        new.write_all(&write_req(&region, 0, LEN)).unwrap();
        new.write_all(&v2).unwrap();
        assert_eq!(response(&mut new).status, Ok(()));
        // The rest of version 1 arrives late: it must not land.
        let _ = old.write_all(&v1[LEN / 2..]);
        std::thread::sleep(Duration::from_millis(200));
        let got = contents(&region);
        let stale = got.iter().filter(|&&b| b != 0x22).count();
        assert_eq!(
            stale, 0,
            "bytes of the fenced connection landed after the fence"
        );
        assert!(closed(&mut old), "a fenced connection is closed");
        // The fencing connection goes on.
        new.write_all(&write_req(&region, 0, 8)).unwrap();
        new.write_all(&[0x22; 8]).unwrap();
        assert_eq!(response(&mut new).status, Ok(()));
    }

    #[test]
    fn a_fence_reaches_only_connections_of_the_senders_session() {
        let (server, region) = served();
        let mut victim = client(&server, S1, 7);
        // Another session names connection 7, and an unknown one.
        let mut other = client(&server, S2, 1);
        other.write_all(&Fence { conn: 7 }.encode()).unwrap();
        other.write_all(&Fence { conn: 99 }.encode()).unwrap();
        other.write_all(&write_req(&region, 0, 8)).unwrap();
        other.write_all(&[1; 8]).unwrap();
        assert_eq!(response(&mut other).status, Ok(()));
        // Connection 7 of session 1 still writes.
        victim.write_all(&write_req(&region, 8, 8)).unwrap();
        victim.write_all(&[2; 8]).unwrap();
        assert_eq!(response(&mut victim).status, Ok(()));
        assert_eq!(&contents(&region)[..16], &[[1u8; 8], [2u8; 8]].concat()[..]);
        // A fence with a reserved byte set breaks framing: closed.
        let mut f = Fence { conn: 7 }.encode();
        f[20] = 1;
        other.write_all(&f).unwrap();
        assert!(closed(&mut other));
    }

    /// Without a secret, a peer that sends requests it holds no key for
    /// (every few seconds, forever) must not hold its connection against
    /// a newcomer: a refused request is no activity for eviction, so such
    /// a connection stays "unused" and goes first, while one being served
    /// is kept.
    #[test]
    fn a_connection_whose_requests_are_all_refused_is_evicted_as_unused() {
        let (server, region) = served();
        let bogus = Request {
            opcode: Opcode::Read,
            seq: 1,
            addr: region.addr(),
            len: 8,
            key: region.key() ^ 1,
        }
        .encode();
        let good = Request {
            key: region.key(),
            ..Request::decode(&bogus).unwrap()
        }
        .encode();
        let mut squatter = client(&server, S1, 1);
        squatter.write_all(&bogus).unwrap();
        assert_eq!(response(&mut squatter).status, Err(ErrorKind::AccessDenied));
        let mut user = client(&server, S2, 2);
        user.write_all(&good).unwrap();
        assert_eq!(response(&mut user).status, Ok(()));
        user.read_exact(&mut [0u8; 8]).unwrap();
        let slot_of = |conn: u32| {
            server
                .live
                .conns
                .lock()
                .iter()
                .find(|c| c.ident.get().is_some_and(|i| i.conn == conn))
                .cloned()
                .unwrap()
        };
        let (s, u) = (slot_of(1), slot_of(2));
        // Both last did something two seconds ago; the squatter is refused
        // once more since.
        for c in [&s, &u] {
            c.served_ns
                .fetch_sub(2_000_000_000, Ordering::Relaxed);
        }
        squatter.write_all(&bogus).unwrap();
        assert_eq!(response(&mut squatter).status, Err(ErrorKind::AccessDenied));
        assert_eq!(s.stage.load(Ordering::Relaxed), STAGE_READY);
        assert_eq!(u.stage.load(Ordering::Relaxed), STAGE_SERVING);
        let conns = server.live.conns.lock().clone();
        let victim = Live::victim(&conns).map(|i| conns[i].id);
        assert_eq!(victim, Some(s.id), "the squatter goes first; the user is kept");
    }

    #[test]
    fn an_evicted_connection_is_fenced_and_a_fence_waits_for_its_write() {
        let live = Live::default();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dial = || TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, b, c) = (dial(), dial(), dial());
        let old = live.admit_up_to(&a, 1).unwrap();
        old.ident
            .set(Ident {
                session: S1,
                conn: 1,
            })
            .unwrap();
        old.stage.store(STAGE_READY, Ordering::Relaxed);
        old.served_ns
            .store(monotonic_ns() - 2_000_000_000, Ordering::Relaxed);
        // Its thread took a request queued before the eviction and is
        // inside the payload's `recv` into region memory.
        old.writing.store(true, Ordering::SeqCst);
        let _newcomer = live.admit_up_to(&b, 1).unwrap();
        assert!(
            old.fenced.load(Ordering::SeqCst),
            "an evicted connection may still write into region memory"
        );
        // A later connection of its initiator fences it: that must wait
        // until the evicted one's thread is out of its write.
        let me = live.admit_up_to(&c, 8).unwrap();
        me.ident
            .set(Ident {
                session: S1,
                conn: 2,
            })
            .unwrap();
        let bound = Duration::from_millis(100);
        assert!(
            live.fence(&me, Fence { conn: 1 }, bound).is_err(),
            "a fence passed an evicted connection still writing"
        );
        old.writing.store(false, Ordering::Release);
        assert!(live.fence(&me, Fence { conn: 1 }, bound).is_ok());
        live.remove(old.id);
        assert!(live.fence(&me, Fence { conn: 1 }, bound).is_ok());
    }
}
