//! The target side of `tcp`: serves one-sided READ and WRITE straight from
//! and into registered memory.
//!
//! One accept thread per listening address admits connections into
//! [`Live`] and hands each to one of a small fixed set of serving threads
//! ([`station`], the `transports/tcp/serving_threads` key), the one
//! serving fewest; each serving thread drives any number of connections
//! on its own io_uring (or epoll set). Threads do not grow with peers.
//!
//! Every request is checked against the registered regions, their bounds
//! and their key before a byte moves; a refused request fails alone (a
//! refused WRITE's payload is read and dropped) and the connection goes
//! on. Only a frame that breaks the byte stream's framing (bad magic,
//! unknown opcode, oversized length) closes the connection, with a logged
//! reason.
//!
//! Hostile peers: the server listens only on the addresses the engine
//! advertises; with a shared secret a connection proves it
//! ([`handshake`]) before its first request; refusals to a connection
//! that has not proven it reveal nothing about memory layout; the
//! handshake has one deadline, an idle connection is closed, a frame that
//! stalls (or a response the peer stops reading) for the [`stall_limit`]
//! closes its connection, and a full server evicts an unproven
//! connection, one that has served nothing (refused requests do not
//! count), or one that has served nothing for long, for a newcomer, or
//! tells it [`BUSY`]. How many connections it serves comes from the
//! configuration, the open-file limit and the memory available
//! ([`connection_limit`]); out of descriptors, a reserve one lets the
//! accept thread take the connection waiting and evict for it.
//!
//! Fences: each connection is registered under the ident its initiator's
//! hello gave (session, connection id). A [`Fence`](super::frame::Fence)
//! naming a connection of the sender's own session marks it fenced, shuts
//! its receiving side down, and is served once that connection is out of
//! any payload write into region memory (bounded by the stall limit); a
//! fenced connection writes no more (its serving thread checks the mark
//! after announcing a write, Dekker-style), sends its peer a
//! [`Fenced`](super::frame::Fenced) notice after the responses queued on
//! it, and is closed. So no byte of a superseded connection lands after
//! the slice moved off it is served, and an initiator whose connection a
//! copy of its session fenced is told so rather than seeing an EOF.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use arc_swap::ArcSwap;
use tent_rings::ErrorKind;

use super::backend::{self, Choice};
use super::frame::{BUSY, Hello};
use super::io;
use super::live::Live;
use super::station::{self, Arrival, Inbox, Shared};
use crate::error::{Error, Result};
use crate::memory::RegionTable;
use crate::refusals::Refusals;

/// Refused data connections held at once (see `Refusals`).
const REFUSED_KEPT: usize = 256;
/// What a served connection costs, for the limit memory sets: its kernel
/// socket buffers at their usual autotuned size, its stage and state.
const CONNECTION_BYTES: u64 = 256 << 10;
/// Descriptors kept for everything else the engine opens.
const FD_HEADROOM: u64 = 64;

/// The most data connections served at once: `configured` when set, else
/// half the open-file limit (each connection is a descriptor; the rest go
/// to the engine's other sockets and files) and what a sixteenth of
/// `avail_bytes` of memory holds at [`CONNECTION_BYTES`] each, whichever
/// is smaller; at least 16.
pub(crate) fn connection_limit(
    configured: u32,
    nofile: Option<u64>,
    avail_bytes: Option<u64>,
) -> usize {
    if configured > 0 {
        return configured as usize;
    }
    let by_fd = nofile.map_or(u64::MAX, |n| n.saturating_sub(FD_HEADROOM) / 2);
    let by_mem = avail_bytes.map_or(u64::MAX, |b| b / 16 / CONNECTION_BYTES);
    let n = by_fd.min(by_mem).clamp(16, 1 << 20);
    usize::try_from(n).unwrap_or(1 << 20)
}

/// How the server is set up.
#[derive(Debug, Clone)]
pub(crate) struct ServeSettings {
    /// `TCP_USER_TIMEOUT` of served sockets, ms (0: the kernel's).
    pub(crate) user_timeout_ms: u32,
    /// Proven on every connection when set.
    pub(crate) secret: Option<Arc<[u8]>>,
    /// Serving threads (0: one per core available).
    pub(crate) threads: u32,
    /// `transports/tcp/max_served_connections` (0: derived).
    pub(crate) max_connections: u32,
    /// How the serving threads reach the kernel.
    pub(crate) backend: Choice,
}

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

/// A running data server; stops when dropped.
pub(crate) struct DataServer {
    addrs: Vec<SocketAddr>,
    shared: Arc<Shared>,
    inboxes: Vec<Arc<Inbox>>,
    accepting: Vec<JoinHandle<()>>,
    serving: Vec<JoinHandle<()>>,
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
    /// `regions` as `settings` say.
    pub(crate) fn start(
        ips: &[IpAddr],
        regions: Arc<ArcSwap<RegionTable>>,
        settings: ServeSettings,
    ) -> Result<DataServer> {
        if ips.is_empty() {
            return Err(Error::invalid("tcp data server: no address to listen on"));
        }
        let (choice, _) = backend::resolve(settings.backend).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                "transports/tcp/backend is io_uring, but this kernel refuses one",
            )
            .with_source(e)
        })?;
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
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let avail = crate::engine::footprint::available().map(|a| a.bytes);
        let max = connection_limit(settings.max_connections, nofile, avail);
        let threads = match settings.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        };
        let shared = Arc::new(Shared {
            live: Live::new(max),
            regions,
            secret: settings.secret.clone(),
            stall: stall_limit(settings.user_timeout_ms),
            stop: std::sync::atomic::AtomicBool::new(false),
            lingering: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut server = DataServer {
            addrs: addrs.clone(),
            shared: shared.clone(),
            inboxes: Vec::new(),
            accepting: Vec::new(),
            serving: Vec::new(),
        };
        let spawn_failed = |e: std::io::Error| {
            Error::new(ErrorKind::OutOfMemory, "spawn tcp data server").with_source(e)
        };
        for i in 0..threads {
            let (inbox, t) = station::spawn(i, choice, shared.clone()).map_err(spawn_failed)?;
            server.inboxes.push(inbox);
            server.serving.push(t);
        }
        let inboxes: Arc<[Arc<Inbox>]> = server.inboxes.clone().into();
        for (listener, addr) in listeners.into_iter().zip(&addrs) {
            let (shared, inboxes) = (shared.clone(), inboxes.clone());
            let ut = settings.user_timeout_ms;
            let t = std::thread::Builder::new()
                .name(format!("tent-tcp-data-{}", addr.port()))
                .spawn(move || accept_loop(listener, &shared, &inboxes, ut))
                .map_err(spawn_failed)?;
            server.accepting.push(t);
        }
        tracing::info!(
            addrs = ?addrs,
            authenticated = settings.secret.is_some(),
            serving_threads = threads,
            backend = choice.as_str(),
            max_connections = max,
            "tcp data server listening"
        );
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
        self.shared.stop.store(true, Ordering::Release);
        // Unblock each accept() with a connection of our own.
        for a in &self.addrs {
            let _ = TcpStream::connect_timeout(a, Duration::from_millis(200));
        }
        for t in self.accepting.drain(..) {
            let _ = t.join();
        }
        // No connection is admitted past this: shut every one down and
        // wake the serving threads, which close them.
        self.shared.live.shut_all();
        for i in &self.inboxes {
            i.ring();
        }
        // Joined, not just told: a receive into region memory may still be
        // in the kernel until its serving thread reaps it, and the
        // application may free that memory once the engine's drop returns.
        for t in self.serving.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    shared: &Shared,
    inboxes: &[Arc<Inbox>],
    user_timeout_ms: u32,
) {
    let mut refused = Refusals::new(REFUSED_KEPT);
    let mut reserve = Reserve::new();
    loop {
        reserve.refill();
        let accepted = listener.accept();
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Out of descriptors: what admission would do for a full
                // server, done now (an unused or long-unserved connection
                // goes, its descriptor free once its serving thread lets
                // go of it), and the reserve given up so the pending
                // connection is accepted.
                let evicted = shared.live.evict_one();
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
        let local = match &shared.secret {
            Some(_) => match stream.local_addr() {
                Ok(a) => a,
                Err(_) => continue,
            },
            None => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        io::tune((&stream).into(), user_timeout_ms);
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let slot = match shared.live.admit(stream) {
            Ok(slot) => slot,
            Err(stream) => {
                // Full of connections in use: say so (the initiator backs
                // off and retries; a busy target is no fault of the rail).
                crate::lograte::warn_limited!("tcp-data-full", %peer, limit = shared.live.max(), "tcp data server: every connection in use; new ones are told to come back later");
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                let _ = io::send_header(&stream, &Hello::refusal(BUSY).encode());
                refused.hold(stream);
                continue;
            }
        };
        let to = inboxes
            .iter()
            .min_by_key(|i| i.load())
            .expect("at least one serving thread");
        to.hand(Arrival { slot, peer, local });
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Instant;

    use tent_rings::{Opcode, RegionId};

    use super::super::frame::{
        Fence, Fenced, Ident, REQUEST_LEN, RESPONSE_LEN, Reply, Request, Response, SESSION_LEN,
    };
    use super::super::handshake;
    use super::super::live::{STAGE_READY, STAGE_SERVING};
    use super::*;
    use crate::memory::MemRegion;

    const LEN: usize = 256 << 10;
    const S1: [u8; SESSION_LEN] = [0x51; SESSION_LEN];
    const S2: [u8; SESSION_LEN] = [0x52; SESSION_LEN];

    /// A data server on loopback serving one region of `LEN` zero bytes.
    fn served() -> (DataServer, Arc<MemRegion>) {
        served_on(Choice::Auto, 2)
    }

    /// [`served`] on `threads` serving threads driven by `backend`.
    fn served_on(backend: Choice, threads: u32) -> (DataServer, Arc<MemRegion>) {
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
            ServeSettings {
                user_timeout_ms: 0,
                secret: None,
                threads,
                max_connections: 0,
                backend,
            },
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
        // It is told it was fenced, naming itself, then closed.
        let mut h = [0u8; RESPONSE_LEN];
        old.read_exact(&mut h).unwrap();
        assert_eq!(Reply::decode(&h), Ok(Reply::Fenced(Fenced { conn: 1 })));
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
                .shared
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
            c.served_ns.fetch_sub(2_000_000_000, Ordering::Relaxed);
        }
        squatter.write_all(&bogus).unwrap();
        assert_eq!(response(&mut squatter).status, Err(ErrorKind::AccessDenied));
        assert_eq!(s.stage.load(Ordering::Relaxed), STAGE_READY);
        assert_eq!(u.stage.load(Ordering::Relaxed), STAGE_SERVING);
        let conns = server.shared.live.conns.lock().clone();
        let victim = Live::victim(&conns).map(|i| conns[i].id);
        assert_eq!(
            victim,
            Some(s.id),
            "the squatter goes first; the user is kept"
        );
    }

    #[test]
    fn the_connection_limit_is_the_key_else_the_smaller_of_descriptors_and_memory() {
        // Set: taken as it is.
        assert_eq!(connection_limit(512, Some(1024), Some(1 << 30)), 512);
        // Descriptors bind: half of what is left past the headroom.
        assert_eq!(
            connection_limit(0, Some(1024), Some(64 << 30)),
            (1024 - 64) / 2
        );
        // Memory binds: a sixteenth of it at 256 KiB a connection.
        assert_eq!(connection_limit(0, Some(1 << 20), Some(16 << 30)), 4096);
        // Neither known: bounded; a tiny budget still serves a few.
        assert_eq!(connection_limit(0, None, None), 1 << 20);
        assert_eq!(connection_limit(0, Some(10), Some(1 << 20)), 16);
    }

    fn read_req(region: &MemRegion, off: usize, len: usize) -> [u8; REQUEST_LEN] {
        Request {
            opcode: Opcode::Read,
            seq: 1,
            addr: region.addr() + off as u64,
            len: len as u64,
            key: region.key(),
        }
        .encode()
    }

    /// A peer that sends its requests and then shuts its sending side
    /// (a half-close) is still answered: the EOF comes after what it
    /// asked, and the answers were cancelled with the connection before.
    #[test]
    fn a_peer_that_half_closes_after_its_requests_gets_every_answer() {
        let (server, region) = served();
        let mut s = client(&server, S1, 1);
        s.write_all(&write_req(&region, 0, 8)).unwrap();
        s.write_all(&[7; 8]).unwrap();
        // 12 MiB, more than the socket buffers hold: answers still queued
        // at the target when its receive sees the EOF.
        for _ in 0..48 {
            s.write_all(&read_req(&region, 0, LEN)).unwrap();
        }
        s.shutdown(std::net::Shutdown::Write).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(response(&mut s).status, Ok(()));
        let mut payload = vec![0u8; LEN];
        for i in 0..48 {
            let r = response(&mut s);
            assert_eq!((r.status, r.len), (Ok(()), LEN as u64), "READ {i}");
            s.read_exact(&mut payload).unwrap();
            assert_eq!(&payload[..8], &[7; 8]);
        }
        assert!(closed(&mut s), "closed after the last answer");
    }

    /// More connections with work at once than a serving thread's queue
    /// holds (8 operations in the unit tests' build; epoll bounds its
    /// completions to that): every one is still answered, the ones the
    /// queue refused being moved on next turn (before, they waited for a
    /// byte that had already come, until their stall limit).
    #[test]
    fn connections_a_full_queue_refused_are_moved_on_next_turn() {
        let (server, region) = served_on(Choice::Epoll, 1);
        let mut conns: Vec<TcpStream> = (1..=40).map(|i| client(&server, S1, i)).collect();
        for s in &mut conns {
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            s.write_all(&read_req(&region, 0, 8)).unwrap();
        }
        for (i, s) in conns.iter_mut().enumerate() {
            let mut h = [0u8; RESPONSE_LEN];
            s.read_exact(&mut h)
                .unwrap_or_else(|e| panic!("connection {i}: {e}"));
            assert_eq!(Response::decode(&h).unwrap().status, Ok(()));
            s.read_exact(&mut [0u8; 8]).unwrap();
        }
    }
}
