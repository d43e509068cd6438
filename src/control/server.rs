//! The control server: answers descriptor requests on `ip:port`.
//!
//! One accept thread and one short-lived thread per connection (bounded):
//! control traffic is a handful of messages per segment open, nowhere near
//! the data path. A malformed, oversized or truncated message closes that
//! connection with a logged reason and disturbs nothing else.
//!
//! Hostile peers: each connection has one deadline for its whole exchange
//! (a peer dripping a byte per read does not extend it). With a secret,
//! proofs are bound to this server's address as the client dialed it and
//! as this server accepted it ([`auth`]): a relay holding no secret cannot
//! pass an honest client's handshake on. When every slot is taken, the
//! longest-idle connection that has not proven the secret and is older
//! than [`PROTECTED_AGE`] is evicted for the newcomer; it is told it is
//! busy (an `Error` with `SqFull`) rather than reset. Without a secret no
//! connection proves anything (anybody can make the handshake, then hold
//! it), so every one is evictable once past that age. Authenticated
//! connections and young ones keep their slots, and a newcomer finding
//! only those is told it is busy too; the client retries a busy answer
//! within its timeout.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::auth::{self, Door};
use super::wire::{
    self, Message, NotifyFrame, QpBootstrap, QpRequest, RegionsPage, SegmentDescriptor, WireError,
};
use crate::deadline::ByDeadline;
use crate::error::{Error, Result};
use crate::refusals::Refusals;

/// Connections served at once (see the module doc for who gets evicted).
pub const MAX_CONNECTIONS: usize = 64;
/// Refused control connections held at once (see `Refusals`).
const REFUSED_KEPT: usize = 64;
/// Deadline of a connection's whole exchange, from accept to close.
pub(crate) const EXCHANGE_DEADLINE: Duration = Duration::from_secs(5);
/// A connection younger than this is never evicted: an honest client's
/// handshake takes a round trip or two, and a flood of fresh connections
/// must not push it out mid-handshake (the newcomers are told busy).
pub(crate) const PROTECTED_AGE: Duration = Duration::from_secs(1);
/// The busy answer.
fn busy(text: &str) -> Message {
    Message::Error {
        code: ErrorKind::SqFull.code(),
        text: text.into(),
    }
}

/// Produces the current descriptor of the local segment.
pub type DescriptorFn = dyn Fn() -> SegmentDescriptor + Send + Sync;

/// Connects an RC QP for a peer's request (who asks, initiator NIC, target
/// NIC, initiator's end) → this side's end, already connected.
pub(crate) type QpConnectFn = dyn Fn(&QpRequest) -> Result<QpBootstrap> + Send + Sync;

/// Files a peer's notification, sent from `IpAddr` (the engine's inbox):
/// `Ok` is answered with an acknowledgement, an error with its kind
/// (`SqFull`: full; `Shutdown`: the engine is going away).
pub(crate) type NotifyFn = dyn Fn(std::net::IpAddr, NotifyFrame) -> Result<()> + Send + Sync;

/// The page of regions starting at or after an address (`GetRegions`).
pub(crate) type RegionsFn = dyn Fn(u64) -> RegionsPage + Send + Sync;

/// What the server answers besides descriptors: `GetRegions` (a
/// descriptor's further pages), `QpConnect` (RDMA) and `Notify`. Without
/// one, such a request is refused with `Unreachable`.
#[derive(Default, Clone)]
pub struct Services {
    /// Pages of regions past a descriptor's first.
    pub regions: Option<Arc<RegionsFn>>,
    /// Connects an RC QP for a peer.
    pub qp: Option<Arc<QpConnectFn>>,
    /// Files a peer's notification.
    pub notify: Option<Arc<NotifyFn>>,
}

/// A running control server; stops when dropped.
pub struct ControlServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("qp", &self.qp.is_some())
            .field("notify", &self.notify.is_some())
            .finish()
    }
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl ControlServer {
    /// Listen on `host:port` (port 0 = ephemeral); `describe` is built
    /// from the bound address (the segment's name).
    pub fn start(
        host: &str,
        port: u16,
        secret: Option<Vec<u8>>,
        describe: impl FnOnce(SocketAddr) -> Arc<DescriptorFn>,
    ) -> Result<ControlServer> {
        Self::start_with(host, port, secret, describe, Services::default())
    }

    /// [`ControlServer::start`], also answering `QpConnect` and `Notify`
    /// with `services`.
    pub fn start_with(
        host: &str,
        port: u16,
        secret: Option<Vec<u8>>,
        describe: impl FnOnce(SocketAddr) -> Arc<DescriptorFn>,
        services: Services,
    ) -> Result<ControlServer> {
        let listener = TcpListener::bind((host, port)).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("control server cannot listen on {host}:{port}"),
            )
            .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            Error::new(ErrorKind::Unreachable, "control server address").with_source(e)
        })?;
        let describe = describe(addr);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let secret = secret.map(Arc::new);
        let thread = std::thread::Builder::new()
            .name(format!("tent-control-{}", addr.port()))
            .spawn(move || accept_loop(listener, stop2, secret, describe, services))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "spawn control server").with_source(e)
            })?;
        tracing::info!(%addr, "control server listening (p2p segment name)");
        Ok(ControlServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on: this engine's p2p segment name.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock accept() with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection as the accept thread sees it.
struct Slot {
    id: usize,
    /// A handle to shut it down (eviction).
    stream: TcpStream,
    /// Has proven the shared secret: never evicted. Never set without a
    /// secret, where finishing the handshake proves nothing.
    authenticated: AtomicBool,
    /// Evicted for a newcomer: its thread tells the peer it is busy.
    evicted: AtomicBool,
    /// When it was accepted (ns since the server started).
    born_ns: u64,
    /// When it last received a byte (ns since the server started).
    last_read_ns: AtomicU64,
}

#[derive(Default)]
struct Live {
    next: AtomicUsize,
    conns: Mutex<Vec<Arc<Slot>>>,
}

impl Live {
    /// Track `s`, evicting the longest-idle unauthenticated connection
    /// older than [`PROTECTED_AGE`] when full; `None`: every slot is held
    /// by an authenticated or a young one.
    fn admit(&self, s: &TcpStream, now_ns: u64) -> Option<Arc<Slot>> {
        let slot = Arc::new(Slot {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            stream: s.try_clone().ok()?,
            authenticated: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            born_ns: now_ns,
            last_read_ns: AtomicU64::new(now_ns),
        });
        let protected = PROTECTED_AGE.as_nanos() as u64;
        let mut conns = self.conns.lock();
        if conns.len() >= MAX_CONNECTIONS {
            let (victim, _) = conns
                .iter()
                .enumerate()
                .filter(|(_, c)| {
                    !c.authenticated.load(Ordering::Acquire)
                        && now_ns.saturating_sub(c.born_ns) >= protected
                })
                .min_by_key(|(_, c)| (c.last_read_ns.load(Ordering::Relaxed), c.id))?;
            let v = conns.swap_remove(victim);
            // Wake its thread (a blocked read returns end of stream); it
            // answers busy, so the client retries instead of seeing a reset.
            // Only the read side is shut: a request it is answering still
            // gets its answer first.
            v.evicted.store(true, Ordering::Release);
            let _ = v.stream.shutdown(std::net::Shutdown::Read);
        }
        conns.push(slot.clone());
        Some(slot)
    }

    /// Shut every tracked connection down both ways (server stop).
    fn close_all(&self) {
        for c in self.conns.lock().iter() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn remove(&self, id: usize) {
        self.conns.lock().retain(|c| c.id != id);
    }
}

/// A connection's hold on its slot, owned by its thread: dropping it
/// leaves the live list, however the thread ends (a return, or a panic in
/// a service unwinding it), so no connection keeps a slot past its thread.
struct Claim {
    live: Arc<Live>,
    slot: Arc<Slot>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.live.remove(self.slot.id);
    }
}

/// A connection's stream with its one deadline ([`ByDeadline`]), stamping
/// its slot's `last_read_ns` whenever bytes arrive (eviction picks the
/// longest idle).
struct Timed<'a> {
    s: ByDeadline<&'a TcpStream>,
    slot: &'a Slot,
    epoch: Instant,
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.s.read(buf)?;
        if n > 0 {
            self.slot
                .last_read_ns
                .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.s.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    secret: Option<Arc<Vec<u8>>>,
    describe: Arc<DescriptorFn>,
    services: Services,
) {
    let live = Arc::new(Live::default());
    let epoch = Instant::now();
    let mut refused = Refusals::new(REFUSED_KEPT);
    // Every connection thread, joined before this loop returns: a thread
    // still serving after `ControlServer` drops would answer for memory
    // the engine has given back (descriptors, keys, QPs on its domain).
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        threads.retain(|t| !t.is_finished());
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "control: accept failed");
                continue;
            }
        };
        refused.prune();
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let Some(slot) = live.admit(&stream, epoch.elapsed().as_nanos() as u64) else {
            crate::lograte::warn_limited!("control-full", %peer, limit = MAX_CONNECTIONS, "control: every slot held by authenticated or new peers; new connections are told to retry");
            let mut s = &stream;
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = wire::write_message(&mut s, &busy("busy: retry later"));
            refused.hold(stream);
            continue;
        };
        let (secret, describe) = (secret.clone(), describe.clone());
        let (services, stopping) = (services.clone(), stop.clone());
        let id = slot.id;
        let claim = Claim {
            live: live.clone(),
            slot,
        };
        let spawned = std::thread::Builder::new()
            .name("tent-control-conn".into())
            .spawn(move || {
                let slot = &*claim.slot;
                let secret = secret.as_deref().map(Vec::as_slice);
                let mut t = Timed {
                    s: ByDeadline::new(&stream, Instant::now() + EXCHANGE_DEADLINE),
                    slot,
                    epoch,
                };
                let served = serve(&mut t, secret, &*describe, &services);
                if slot.evicted.load(Ordering::Acquire) {
                    // Evicted (the slot is already someone else's): a
                    // clean refusal the client retries on.
                    let mut s = &stream;
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = wire::write_message(&mut s, &busy("busy: evicted, retry"));
                    let _ = stream.shutdown(std::net::Shutdown::Write);
                    tracing::debug!(%peer, "control: evicted a connection for a newcomer");
                    return;
                }
                if let Err(why) = served
                    && !stopping.load(Ordering::Acquire)
                {
                    // One line per (peer address, kind of close), then
                    // counts: junk does not hide failed proofs after it.
                    let ip = peer.rsplit_once(':').map_or(&*peer, |(ip, _)| ip);
                    crate::lograte::warn_limited!((ip, std::mem::discriminant(&why)), %peer, reason = %why, "control: closing connection");
                }
                // `claim` drops here, or while unwinding from a panic.
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                // The unspawned closure's claim leaves when it is dropped;
                // removing an id twice is harmless.
                live.remove(id);
                crate::lograte::warn_limited!(e.kind(), error = %e, "control: cannot spawn a connection thread");
            }
        }
    }
    // Cut every connection (a blocked read returns at once) and wait for
    // its thread: once this returns, nothing answers for the engine.
    live.close_all();
    for t in threads {
        let _ = t.join();
    }
}

/// What a client whose proof fails is told: the secrets differ, or the
/// proof was made for another address (see `auth`).
pub(crate) const AUTH_FAILED: &str = "authentication failed: the shared secrets differ, or the client did not dial this server's own address (address translation, port forwarding or a relay between the engines; engines with a secret must reach each other directly)";

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum Close {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    #[error("authentication failed")]
    AuthFailed,
}

fn serve(
    s: &mut Timed<'_>,
    secret: Option<&[u8]>,
    describe: &DescriptorFn,
    services: &Services,
) -> std::result::Result<(), Close> {
    let _ = s.s.get_ref().set_nodelay(true);
    let client_nonce = match wire::read_message(s)? {
        Message::Hello { nonce } => nonce,
        other => return Err(unexpected(s, "Hello", &other)),
    };
    let server_nonce = auth::nonce();
    // The channel binding: this server's address as the client reached it.
    let binding = match (secret, s.s.get_ref().local_addr()) {
        (None, _) => [0; 18],
        (Some(_), Ok(a)) => auth::addr_binding(a),
        (Some(_), Err(e)) => return Err(Close::Wire(WireError::Io(e))),
    };
    wire::write_message(
        s,
        &Message::Challenge {
            nonce: server_nonce,
            auth_required: secret.is_some(),
        },
    )?;
    if let Some(secret) = secret {
        let proof = match wire::read_message(s)? {
            Message::Auth { mac } => mac,
            other => return Err(unexpected(s, "Auth", &other)),
        };
        if !auth::verify_client(
            Door::Control,
            secret,
            &server_nonce,
            &client_nonce,
            &binding,
            &proof,
        ) {
            let _ = wire::write_message(
                s,
                &Message::Error {
                    code: ErrorKind::AccessDenied.code(),
                    text: AUTH_FAILED.into(),
                },
            );
            return Err(Close::AuthFailed);
        }
        s.slot.authenticated.store(true, Ordering::Release);
        wire::write_message(
            s,
            &Message::AuthOk {
                mac: auth::server_proof(
                    Door::Control,
                    secret,
                    &server_nonce,
                    &client_nonce,
                    &binding,
                ),
            },
        )?;
    }
    // With a secret, the first notification binds the connection to its
    // sender (stream id and name): one authenticated session speaks for
    // one sender, as the outbox's lanes do.
    let mut sender: Option<(u64, String)> = None;
    loop {
        let msg = match wire::read_message(s) {
            Ok(m) => m,
            // The peer is done: a clean close between messages.
            Err(WireError::Truncated { have: 0, .. }) => return Ok(()),
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e @ (WireError::Io(_) | WireError::Truncated { .. })) => return Err(e.into()),
            Err(e) => {
                // A whole frame that does not decode: say why before closing,
                // so an older initiator learns which field it lacks (a
                // `QpConnect` without its initiator record, say).
                let _ = wire::write_message(
                    s,
                    &Message::Error {
                        code: ErrorKind::InvalidArgument.code(),
                        text: format!("malformed request: {e}"),
                    },
                );
                return Err(e.into());
            }
        };
        match msg {
            Message::GetDescriptor => wire::write_message(s, &Message::Descriptor(describe()))?,
            Message::GetRegions { from } => {
                let reply = answer(
                    services.regions.as_deref().map(|f| Ok(f(from))),
                    Message::Regions,
                    "this engine serves no region pages",
                );
                wire::write_message(s, &reply)?
            }
            Message::QpConnect(req) => {
                // A refused QP is an answer, not a protocol error: the
                // connection stays open for another request.
                let reply = answer(
                    services.qp.as_deref().map(|f| f(&req)),
                    |qp| Message::QpAccept { qp },
                    "this engine serves no RDMA",
                );
                wire::write_message(s, &reply)?
            }
            Message::Notify(frame) => {
                if secret.is_some()
                    && let Some(refusal) = bind_sender(&mut sender, &frame)
                {
                    wire::write_message(s, &refusal)?;
                    continue;
                }
                // A refusal (a full inbox) is an answer too; the sender
                // tries again on this connection.
                let seq = frame.seq;
                let from = s.s.get_ref().peer_addr().map(|a| a.ip());
                let reply = match (services.notify.as_deref(), from) {
                    (Some(f), Ok(ip)) => Some(f(ip, frame)),
                    (Some(_), Err(e)) => return Err(Close::Wire(WireError::Io(e))),
                    (None, _) => None,
                };
                let reply = answer(
                    reply,
                    |()| Message::NotifyAck { seq },
                    "this engine takes no notifications",
                );
                wire::write_message(s, &reply)?
            }
            other => {
                return Err(unexpected(
                    s,
                    "GetDescriptor, GetRegions, QpConnect or Notify",
                    &other,
                ));
            }
        }
    }
}

/// `None` when `frame` comes from the sender `bound` names (binding it
/// on the first frame); else the refusal to answer with.
fn bind_sender(bound: &mut Option<(u64, String)>, frame: &NotifyFrame) -> Option<Message> {
    match bound {
        None => {
            *bound = Some((frame.sender, frame.from.clone()));
            None
        }
        Some((id, from)) if *id == frame.sender && *from == frame.from => None,
        Some((id, from)) => {
            crate::lograte::warn_limited!(
                "notify-sender-changed",
                bound = %from,
                claimed = %frame.from,
                "notification refused: an authenticated connection changed its sender"
            );
            Some(Message::Error {
                code: ErrorKind::InvalidArgument.code(),
                text: format!(
                    "this connection's notifications come from sender {id:#x} ({from}); \
                     one from {:#x} ({}) needs a connection of its own",
                    frame.sender, frame.from
                ),
            })
        }
    }
}

/// A service's answer to a request: `reply` with what it returned, the
/// refusal it gave (its kind and words), or `Unreachable` with `missing`
/// when this server does not offer it.
fn answer<T>(r: Option<Result<T>>, reply: impl FnOnce(T) -> Message, missing: &str) -> Message {
    match r {
        Some(Ok(v)) => reply(v),
        Some(Err(e)) => Message::Error {
            code: e.kind().code(),
            text: e.to_string(),
        },
        None => Message::Error {
            code: ErrorKind::Unreachable.code(),
            text: missing.into(),
        },
    }
}

fn unexpected(s: &mut Timed<'_>, expected: &'static str, got: &Message) -> Close {
    let _ = wire::write_message(
        s,
        &Message::Error {
            code: ErrorKind::InvalidArgument.code(),
            text: format!("expected {expected}"),
        },
    );
    Close::Unexpected {
        expected,
        got: got.name(),
    }
}
