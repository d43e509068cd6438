//! One initiator-side data connection: a sender thread and a receiver
//! thread around a socket, fed by a worker through lock-free rings.
//!
//! ```text
//! worker ──submit──▶ sender ──wire──▶ target
//!                      │ inflight (bounded: the connection's credits)
//!                      ▼
//! worker ◀──done──── receiver ◀─wire── target
//! ```
//! The worker is the only producer of `submit` and the only consumer of
//! `done`; neither side ever locks or allocates per slice. `inflight` holds
//! at most `max_inflight_per_connection` slices, which bounds the bytes on
//! the wire per connection: a large transfer queues in `submit` instead of
//! piling up in socket buffers (UCX's unbounded puts collapse that way).
//!
//! When the socket fails, the connection is aborted ([`Conn::abort`]): the
//! receiver stops and hands its ring ends back to the sender through its
//! join handle; the sender resets the socket (RST: the kernel drops what it
//! still had queued) and only then completes every slice that was in
//! flight with the failure's kind (`RouteLost` when the rail's link went
//! down); it reconnects on the next slice. Slices still in `submit` were
//! never sent, so they are never reported twice.
//!
//! A WRITE that was sent on a connection that then failed remembers it
//! ([`Op::fence`]); wherever the slice is re-posted, a [`Fence`] for that
//! connection goes ahead of it, so the target lets the superseded
//! connection write nothing more before it serves the slice (bytes of it
//! still on their way, or queued in the target's socket, cannot land over
//! the slice or anything written after it).
//!
//! A connection opens with the [`handshake`] (proof of
//! the shared secret when one is set), naming itself: this process's
//! session and a fresh connection id ([`Ident`]). A target with no room says
//! [`BUSY`]: the slice waits and the sender retries with a growing pause
//! (back-pressure, no fault of the rail) until the slice's patience runs
//! out (`Timeout`). A connection idle for [`RECONNECT_IDLE`] is replaced
//! before its next slice, so a target closing idle connections never races
//! a request.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tent_rings::spsc::{self, Consumer, Entry, Producer};
use tent_rings::{ErrorKind, Opcode};

use super::frame::{BUSY, Fence, Ident, RESPONSE_LEN, Request, Response, SESSION_LEN};
use super::server::tune;
use super::{handshake, io};
use crate::clock::monotonic_ns;
use crate::doorbell::{Doorbell, Wakers};
use crate::error::{Error, Result};

/// How long a parked sender sleeps before looking at its rail again
/// (link events and new slices wake it sooner).
const SENDER_PARK: Duration = Duration::from_secs(1);
/// A connection idle this long is replaced before its next slice: shorter
/// than a target waits before it may evict an idle connection (30 s).
pub const RECONNECT_IDLE: Duration = Duration::from_secs(15);
/// Longest pause between tries at a busy target.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(200);

/// How a connection connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// `TCP_USER_TIMEOUT` (0: the kernel's).
    pub user_timeout_ms: u32,
    /// Connect plus handshake.
    pub connect_timeout: Duration,
    /// How long after it was posted a slice may still wait for a busy
    /// target to take the connection.
    pub patience: Duration,
    /// The shared secret, proven to the target when set.
    pub secret: Option<Arc<[u8]>>,
}

/// One slice as it travels through a connection's rings.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Op {
    /// The engine's slice token.
    pub token: u64,
    /// Local memory address (checked by the engine before submission).
    pub local: u64,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The target region's key.
    pub key: u64,
    /// When the worker posted it (monotonic ns): the rail's bandwidth
    /// estimate is fed from it.
    pub posted_ns: u64,
    /// Position on its connection (checked against the response).
    pub seq: u32,
    /// 0 = done, else the `ErrorKind` code.
    pub status: u16,
    /// 1 = WRITE, 2 = READ.
    pub opcode: u8,
    /// Times it was re-posted on a sibling rail.
    pub attempts: u8,
    /// Rail index within its peer.
    pub rail: u16,
    /// Slices ahead of it on its rail when posted (bandwidth estimate).
    pub ahead: u16,
    /// A WRITE only: the connection it last left after it was sent there
    /// (0: none). Set when the connection fails; wherever the slice is
    /// re-posted, a fence for that connection goes ahead of it.
    pub fence: u32,
}

const _: () = assert!(std::mem::size_of::<Op>() == 64);

// SAFETY: Op is repr(C) integers only (the local address is held as an integer and only dereferenced under the transport's contract); every bit pattern is valid and no field constrains another.
unsafe impl Entry for Op {}

impl Op {
    /// A fresh op for a slice.
    pub fn new(token: u64, opcode: Opcode, local: *mut u8, addr: u64, len: u64, key: u64) -> Op {
        Op {
            token,
            local: local as u64,
            addr,
            len,
            key,
            opcode: match opcode {
                Opcode::Write => 1,
                Opcode::Read => 2,
            },
            ..Op::default()
        }
    }

    fn opcode(&self) -> Opcode {
        if self.opcode == 2 {
            Opcode::Read
        } else {
            Opcode::Write
        }
    }

    /// The slice's outcome.
    pub fn result(&self) -> std::result::Result<u64, ErrorKind> {
        match self.status {
            0 => Ok(self.len),
            c => Err(ErrorKind::from_code(c).unwrap_or(ErrorKind::Unreachable)),
        }
    }

    fn fail(mut self, kind: ErrorKind) -> Op {
        self.status = kind.code();
        self
    }
}

/// This process's session, named in every connection's hello: a target
/// lets a connection fence only connections of its own session.
fn session() -> [u8; SESSION_LEN] {
    static SESSION: OnceLock<[u8; SESSION_LEN]> = OnceLock::new();
    *SESSION.get_or_init(|| {
        let mut s = [0u8; SESSION_LEN];
        s.copy_from_slice(&crate::control::auth::nonce()[..SESSION_LEN]);
        s
    })
}

/// A fresh connection id in this process's session (never 0; unique
/// until 2^32 connections have opened).
fn next_conn_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    loop {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if id != 0 {
            return id;
        }
    }
}

/// Fences owed beyond the connection a slice left: `(b, a)` says a WRITE
/// failed on connection `b` after it was sent there behind a fence for
/// `a`. That fence may never have reached the target, so wherever the
/// slice goes next, `a` is fenced too (and what `a` owed). Touched only
/// when a moved slice is sent, or fails again.
static OWED: Mutex<VecDeque<(u32, u32)>> = Mutex::new(VecDeque::new());
/// Pairs kept in [`OWED`] (oldest forgotten first: it takes that many
/// slices failing twice before the first is served).
const OWED_MAX: usize = 256;
/// Fences sent ahead of one slice, at most.
const FENCES_MAX: usize = 8;

/// Remember that connection `b` owes the fence of `a`.
fn owe(b: u32, a: u32) {
    let mut owed = OWED.lock().expect("owed fences poisoned");
    if owed.contains(&(b, a)) {
        return;
    }
    if owed.len() >= OWED_MAX {
        owed.pop_front();
        crate::lograte::warn_limited!(
            "tcp-owed-fences",
            limit = OWED_MAX,
            "tcp: too many slices moved twice; the oldest owed fence is forgotten"
        );
    }
    owed.push_back((b, a));
}

/// The connections to fence ahead of a slice that left `conn`: `conn`,
/// then what it owes, transitively (at most [`FENCES_MAX`]).
fn fences_for(conn: u32, out: &mut [u32; FENCES_MAX]) -> usize {
    out[0] = conn;
    let mut n = 1;
    let owed = OWED.lock().expect("owed fences poisoned");
    let mut i = 0;
    while i < n {
        let c = out[i];
        i += 1;
        for &(b, a) in owed.iter() {
            if b != c || out[..n].contains(&a) {
                continue;
            }
            if n == FENCES_MAX {
                crate::lograte::warn_limited!(
                    "tcp-fence-chain",
                    limit = FENCES_MAX,
                    "tcp: a slice moved more often than fences are sent ahead of it; the oldest are left out"
                );
                return n;
            }
            out[n] = a;
            n += 1;
        }
    }
    n
}

/// A rail as a connection sees it: where to connect from and to, and
/// whether its local link is up.
#[derive(Debug)]
pub struct Endpoint {
    /// Local address to bind (pins the connection to the rail's interface).
    pub local_ip: IpAddr,
    /// The target's data server on the rail's remote interface.
    pub remote: SocketAddr,
    /// Link state, written by the link watch.
    pub up: AtomicBool,
}

/// What the worker, the sender, the receiver and the link watch share.
pub struct Conn {
    endpoint: Arc<Endpoint>,
    opts: Options,
    bell: Doorbell,
    sleeping: AtomicBool,
    broken: AtomicBool,
    stop: AtomicBool,
    /// Why the sender broke the link (an `ErrorKind` code, 0 = none).
    cause: AtomicU16,
    /// The live socket, so the link watch can shut it down at once.
    stream: Mutex<Option<Arc<TcpStream>>>,
    /// The worker that owns this connection, woken on completions.
    notify: Option<(Arc<Wakers>, usize)>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("remote", &self.endpoint.remote)
            .field("broken", &self.broken.load(Ordering::Relaxed))
            .finish()
    }
}

impl Conn {
    /// Tell the owning worker that `done` has new completions.
    #[inline]
    fn completed(&self) {
        if let Some((wakers, w)) = &self.notify {
            wakers.completion_ready(*w);
        }
    }

    /// Wake the sender if it sleeps (one load when it does not).
    #[inline]
    pub fn wake(&self) {
        // SeqCst, paired with the sender's SeqCst store of `sleeping` before
        // it re-checks its rings: either it sees our slice or we see it asleep.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.bell.ring();
        }
    }

    /// Abort the connection now, from any thread, without blocking: its
    /// in-flight slices complete with `cause` (`RouteLost` whenever the
    /// rail's link is down, `Shutdown` when the connection is stopping) and
    /// the next slice reconnects. The link watch calls it when a rail's
    /// link goes down; the sender and the receiver when the socket fails.
    ///
    /// The socket is reset, never closed gracefully: `SO_LINGER {on, 0}`,
    /// then `shutdown` wakes the sender out of `sendmsg` and the receiver
    /// out of `recv`, and the sender closes it, which sends RST and makes
    /// the kernel discard its send queue. A graceful close would leave the
    /// kernel retransmitting queued WRITE payload for up to
    /// `TCP_USER_TIMEOUT`, to land, once the link is back, over what a
    /// re-posted slice and later WRITEs put there since.
    ///
    /// Guarantee: each completion this produces is pushed to `done` only
    /// after the socket is closed and the receiver thread has returned, so
    /// once the worker pops it, neither thread of this connection (nor the
    /// kernel on its behalf) touches that slice's buffer again.
    pub fn abort(&self, cause: ErrorKind) {
        let _ = self
            .cause
            .compare_exchange(0, cause.code(), Ordering::AcqRel, Ordering::Relaxed);
        self.broken.store(true, Ordering::Release);
        if let Some(s) = self.stream.lock().expect("conn stream poisoned").as_ref() {
            reset(s);
        }
        self.bell.ring();
    }

    fn link_up(&self) -> bool {
        // Relaxed: a hint re-read every loop; the link watch also breaks
        // the connection explicitly.
        self.endpoint.up.load(Ordering::Relaxed)
    }

    /// The kind in-flight slices fail with after `own` broke the socket.
    fn failure_kind(&self, own: ErrorKind) -> ErrorKind {
        if self.stop.load(Ordering::Acquire) {
            return ErrorKind::Shutdown;
        }
        if !self.link_up() {
            return ErrorKind::RouteLost;
        }
        match self.cause.load(Ordering::Acquire) {
            0 => own,
            c => ErrorKind::from_code(c).unwrap_or(own),
        }
    }
}

/// Make closing `s` reset the connection (`SO_LINGER {on, 0}`: RST, send
/// queue discarded) and wake whoever blocks on it now.
fn reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// The worker's ends of a connection; dropping them stops its threads.
#[derive(Debug)]
pub struct ConnEnds {
    /// Shared state (the link watch breaks it through this).
    pub conn: Arc<Conn>,
    /// Slices to send.
    pub submit: Producer<Op>,
    /// Slices done.
    pub done: Consumer<Op>,
}

impl Drop for ConnEnds {
    fn drop(&mut self) {
        self.conn.stop.store(true, Ordering::Release);
        self.conn.bell.ring();
    }
}

/// Open (lazily: the socket connects on the first slice) a connection to
/// `endpoint`. `queue` bounds the slices the worker may hand it (its credit
/// pool size), `inflight` the slices on the wire.
pub fn open(
    endpoint: Arc<Endpoint>,
    queue: u32,
    inflight: u32,
    opts: Options,
    notify: Option<(Arc<Wakers>, usize)>,
) -> Result<ConnEnds> {
    let ring = |cap: u32| {
        // Rings hold at least two entries; the in-flight bound is counted
        // separately (`Sender::room`), so a bound of 1 stays exact.
        spsc::channel::<Op>(cap.max(2).next_power_of_two())
            .map_err(|e| Error::invalid("tcp connection ring").with_source(e))
    };
    let (submit_p, submit_c) = ring(queue)?;
    let (done_p, done_c) = ring(queue)?;
    let (infl_p, infl_c) = ring(inflight)?;
    let conn = Arc::new(Conn {
        endpoint,
        opts,
        bell: Doorbell::default(),
        sleeping: AtomicBool::new(false),
        broken: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        cause: AtomicU16::new(0),
        stream: Mutex::new(None),
        notify,
    });
    let sender = Sender {
        conn: conn.clone(),
        submit: submit_c,
        inflight: infl_p,
        inflight_cap: inflight as usize,
        parts: Some((infl_c, done_p)),
        receiver: None,
        stream: None,
        conn_id: 0,
        seq: 0,
        held: None,
        last_post_ns: 0,
        pause: Duration::ZERO,
        logged: 0,
    };
    std::thread::Builder::new()
        .name("tent-tcp-send".into())
        .spawn(move || sender.run())
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn tcp sender").with_source(e))?;
    Ok(ConnEnds {
        conn,
        submit: submit_p,
        done: done_c,
    })
}

type Parts = (Consumer<Op>, Producer<Op>);

/// What a receiver hands back when it stops.
struct Stopped {
    parts: Parts,
    /// A slice it had taken from `inflight` but not completed.
    pending: Option<Op>,
    /// What its socket said.
    own: ErrorKind,
}

struct Sender {
    conn: Arc<Conn>,
    submit: Consumer<Op>,
    inflight: Producer<Op>,
    inflight_cap: usize,
    /// The receiver's ring ends while no receiver runs.
    parts: Option<Parts>,
    receiver: Option<JoinHandle<Stopped>>,
    stream: Option<Arc<TcpStream>>,
    /// The connected socket's id in this process's session (0: none).
    conn_id: u32,
    seq: u32,
    /// A slice popped but not sent: the target was busy.
    held: Option<Op>,
    /// When the last slice sent was posted (idle check, no clock read).
    last_post_ns: u64,
    /// Current pause between tries at a busy target.
    pause: Duration,
    /// The connect failure last logged (an `ErrorKind` code; 0 = none
    /// since the last success): each cause is logged once.
    logged: u16,
}

impl Sender {
    fn run(mut self) {
        loop {
            if self.conn.stop.load(Ordering::Acquire) {
                self.teardown();
                self.fail_queued(ErrorKind::Shutdown);
                return;
            }
            if self.stream.is_some()
                && (self.conn.broken.load(Ordering::Acquire) || !self.conn.link_up())
            {
                self.teardown();
            }
            if self.stream.is_none() && !self.conn.link_up() {
                // Never sent: safe for the worker to re-post elsewhere.
                self.fail_queued(ErrorKind::RouteLost);
            }
            let seen = self.conn.bell.value();
            let next = match self.held.take() {
                Some(op) => Some(op),
                None if self.room() => {
                    let op = self.submit.pop();
                    if op.is_some() {
                        self.submit.sync();
                    }
                    op
                }
                None => None,
            };
            let Some(op) = next else {
                self.park(seen);
                continue;
            };
            if self.stream.is_some()
                && op.posted_ns.saturating_sub(self.last_post_ns) > RECONNECT_IDLE.as_nanos() as u64
                && self.inflight.slots() == self.inflight.capacity()
            {
                // Idle long enough that the target may close it any time.
                self.teardown();
            }
            if self.stream.is_none() {
                match self.connect() {
                    Ok(()) => {}
                    Err(BUSY)
                        if monotonic_ns()
                            < op.posted_ns
                                .saturating_add(self.conn.opts.patience.as_nanos() as u64) =>
                    {
                        // Back-pressure: the slice waits, nothing failed.
                        self.held = Some(op);
                        self.pause =
                            (self.pause * 2).clamp(Duration::from_millis(5), BUSY_PAUSE_MAX);
                        self.conn.bell.wait(self.conn.bell.value(), self.pause);
                        continue;
                    }
                    Err(BUSY) => {
                        self.complete(op.fail(ErrorKind::Timeout));
                        continue;
                    }
                    Err(kind) => {
                        self.complete(op.fail(kind));
                        continue;
                    }
                }
            }
            self.last_post_ns = self.last_post_ns.max(op.posted_ns);
            self.send(op);
        }
    }

    /// May one more slice go on the wire (the connection's credits)?
    fn room(&mut self) -> bool {
        self.inflight.capacity() - self.inflight.slots() < self.inflight_cap
    }

    /// Sleep until woken, unless work arrived after `seen` was read.
    fn park(&mut self, seen: u32) {
        // SeqCst: see Conn::wake.
        self.conn.sleeping.store(true, Ordering::SeqCst);
        let busy = (!self.submit.is_empty() && self.room())
            || self.conn.stop.load(Ordering::SeqCst)
            || (self.stream.is_some() && self.conn.broken.load(Ordering::SeqCst));
        if !busy {
            self.conn.bell.wait(seen, SENDER_PARK);
        }
        self.conn.sleeping.store(false, Ordering::Relaxed);
    }

    /// Log a connect failure once per cause (until a connect succeeds).
    fn note(&mut self, kind: ErrorKind, why: &dyn std::fmt::Display) {
        if std::mem::replace(&mut self.logged, kind.code()) != kind.code() {
            tracing::warn!(remote = %self.conn.endpoint.remote, %kind, error = %why, "tcp data connection cannot open");
        }
    }

    fn connect(&mut self) -> std::result::Result<(), ErrorKind> {
        let ep = self.conn.endpoint.clone();
        let started = Instant::now();
        let domain = socket2::Domain::for_address(ep.remote);
        let sock =
            socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
                .map_err(|e| io::kind_of(&e))?;
        if !ep.local_ip.is_unspecified() {
            sock.bind(&SocketAddr::new(ep.local_ip, 0).into())
                .map_err(|e| io::kind_of(&e))?;
        }
        if let Err(e) = sock.connect_timeout(&ep.remote.into(), self.conn.opts.connect_timeout) {
            let kind = io::kind_of(&e);
            self.note(kind, &e);
            return Err(kind);
        }
        let stream: TcpStream = sock.into();
        tune(&stream, self.conn.opts.user_timeout_ms);
        let deadline = started + self.conn.opts.connect_timeout;
        let ident = Ident {
            session: session(),
            conn: next_conn_id(),
        };
        // The handshake leaves the socket's timeouts alone: reads block.
        if let Err(r) = handshake::open(&stream, self.conn.opts.secret.as_deref(), deadline, ident)
        {
            self.note(r.kind, &r.why);
            return Err(r.kind);
        }
        self.logged = 0;
        self.pause = Duration::ZERO;
        let stream = Arc::new(stream);
        let (infl, done) = self
            .parts
            .take()
            .expect("no receiver runs while disconnected");
        let (conn, s) = (self.conn.clone(), stream.clone());
        let spawned = std::thread::Builder::new()
            .name("tent-tcp-recv".into())
            .spawn(move || receive(conn, s, infl, done));
        match spawned {
            Ok(h) => self.receiver = Some(h),
            Err(e) => {
                // The closure (and the ring ends in it) is gone with the
                // failed spawn: nothing can complete this connection's
                // slices any more, so say so loudly.
                tracing::error!(error = %e, "cannot spawn a tcp receiver thread; connection unusable");
                return Err(ErrorKind::OutOfMemory);
            }
        }
        *self.conn.stream.lock().expect("conn stream poisoned") = Some(stream.clone());
        self.conn.cause.store(0, Ordering::Relaxed);
        self.conn.broken.store(false, Ordering::Release);
        self.stream = Some(stream);
        self.conn_id = ident.conn;
        tracing::debug!(remote = %ep.remote, local = %ep.local_ip, conn = ident.conn, "tcp data connection up");
        Ok(())
    }

    fn send(&mut self, mut op: Op) {
        self.seq = self.seq.wrapping_add(1);
        op.seq = self.seq;
        let pushed = self.inflight.push(op).is_ok();
        debug_assert!(pushed, "inflight room was checked");
        self.inflight.sync();
        let req = Request {
            opcode: op.opcode(),
            seq: op.seq,
            addr: op.addr,
            len: op.len,
            key: op.key,
        }
        .encode();
        let stream = self.stream.as_ref().expect("connected");
        if op.fence != 0 {
            // A moved WRITE: its old connections write no more first.
            let mut fences = [0u32; FENCES_MAX];
            let n = fences_for(op.fence, &mut fences);
            for &conn in &fences[..n] {
                if let Err(e) = io::send_header(&**stream, &Fence { conn }.encode()) {
                    self.conn.abort(io::kind_of(&e));
                    return;
                }
            }
        }
        let (payload, len) = match op.opcode() {
            Opcode::Write => (op.local as *const u8, op.len as usize),
            Opcode::Read => (std::ptr::null(), 0),
        };
        // SAFETY: a WRITE's local range was checked against its registration by the engine, which keeps the task (and its region) alive until this slice completes.
        if let Err(e) = unsafe { io::send_all(&**stream, &req, payload, len) } {
            // The op is in `inflight`: teardown completes it.
            self.conn.abort(io::kind_of(&e));
        }
    }

    /// Complete a slice directly (only while no receiver runs).
    fn complete(&mut self, op: Op) {
        let (_, done) = self.parts.as_mut().expect("no receiver runs");
        push_done(done, op);
        done.sync();
        self.conn.completed();
    }

    fn fail_queued(&mut self, kind: ErrorKind) {
        let mut any = false;
        if let Some(op) = self.held.take() {
            let (_, done) = self.parts.as_mut().expect("no receiver runs");
            push_done(done, op.fail(kind));
            any = true;
        }
        while let Some(op) = self.submit.pop() {
            let (_, done) = self.parts.as_mut().expect("no receiver runs");
            push_done(done, op.fail(kind));
            any = true;
        }
        if any {
            self.submit.sync();
            if let Some((_, done)) = self.parts.as_mut() {
                done.sync();
            }
            self.conn.completed();
        }
    }

    /// `op`, sent on this connection, leaves it unfinished: a WRITE
    /// remembers the connection (and what a fence it carried here owed),
    /// so that wherever it is re-posted the target fences them first.
    fn left(&self, mut op: Op) -> Op {
        if op.opcode() == Opcode::Write {
            if op.fence != 0 && op.fence != self.conn_id {
                owe(self.conn_id, op.fence);
            }
            op.fence = self.conn_id;
        }
        op
    }

    /// Close the socket, take the ring ends back from the receiver, then
    /// complete what was in flight with the failure's kind. A connection
    /// that failed or still has slices in flight is reset (see
    /// [`Conn::abort`]); an idle one (replaced, or stopping) closes
    /// gracefully.
    fn teardown(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        *self.conn.stream.lock().expect("conn stream poisoned") = None;
        let failed = self.conn.broken.load(Ordering::Acquire);
        // Wakes the receiver (and is all a graceful close needs).
        let _ = stream.shutdown(std::net::Shutdown::Both);
        let Stopped {
            parts: (mut infl, mut done),
            pending,
            own,
        } = self
            .receiver
            .take()
            .expect("a receiver runs while connected")
            .join()
            .expect("tcp receiver panicked");
        if failed || pending.is_some() || !infl.is_empty() {
            reset(&stream);
        }
        // The last reference (the receiver dropped its own): the socket
        // closes here, before any slice that was on it completes.
        drop(stream);
        let kind = self.conn.failure_kind(own);
        let mut any = false;
        for op in pending.into_iter().chain(std::iter::from_fn(|| infl.pop())) {
            push_done(&mut done, self.left(op).fail(kind));
            any = true;
        }
        if any {
            infl.sync();
            done.sync();
            self.conn.completed();
        }
        self.parts = Some((infl, done));
        self.conn_id = 0;
        self.conn.broken.store(false, Ordering::Relaxed);
        self.conn.cause.store(0, Ordering::Relaxed);
    }
}

/// Push to `done`, which always has room (it is as large as the worker's
/// credits for this transport); spins politely if the worker lags anyway.
fn push_done(done: &mut Producer<Op>, mut op: Op) {
    loop {
        match done.push(op) {
            Ok(()) => return,
            Err(spsc::PushError(back)) => {
                op = back;
                done.sync();
                std::thread::yield_now();
            }
        }
    }
}

/// The receiver thread: match responses to in-flight slices, land READ
/// payloads in local memory, complete slices; on failure abort the
/// connection and hand the ring ends back (the sender completes the rest
/// once the socket is closed).
fn receive(
    conn: Arc<Conn>,
    s: Arc<TcpStream>,
    mut inflight: Consumer<Op>,
    mut done: Producer<Op>,
) -> Stopped {
    let mut pending = None;
    let own = loop {
        let h = match io::recv_header::<RESPONSE_LEN>(&*s, io::NO_STALL_LIMIT) {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) => break io::kind_of(&e),
        };
        let resp = match Response::decode(&h) {
            Ok(r) => r,
            Err(e) => {
                crate::lograte::warn_limited!(conn.endpoint.remote, remote = %conn.endpoint.remote, error = %e, "tcp: malformed response; closing the connection");
                break ErrorKind::Unreachable;
            }
        };
        let Some(mut op) = inflight.pop() else {
            crate::lograte::warn_limited!(conn.endpoint.remote, remote = %conn.endpoint.remote, "tcp: response with nothing outstanding; closing the connection");
            break ErrorKind::Unreachable;
        };
        inflight.sync();
        if resp.seq != op.seq {
            crate::lograte::warn_limited!(conn.endpoint.remote, remote = %conn.endpoint.remote, want = op.seq, got = resp.seq, "tcp: response out of order; closing the connection");
            pending = Some(op);
            break ErrorKind::Unreachable;
        }
        match resp.status {
            Ok(()) if op.opcode() == Opcode::Read => {
                if resp.len != op.len {
                    pending = Some(op);
                    break ErrorKind::Unreachable;
                }
                // SAFETY: a READ's local range was checked against its registration by the engine, which keeps it alive until this slice completes.
                if let Err(e) = unsafe {
                    io::recv_exact(
                        &*s,
                        op.local as *mut u8,
                        op.len as usize,
                        io::NO_STALL_LIMIT,
                    )
                } {
                    pending = Some(op);
                    break io::kind_of(&e);
                }
                op.status = 0;
            }
            Ok(()) => op.status = 0,
            Err(kind) => op.status = kind.code(),
        }
        push_done(&mut done, op);
        done.sync();
        conn.completed();
        conn.wake();
    };
    tracing::debug!(remote = %conn.endpoint.remote, kind = %own, "tcp data connection failed");
    // Wakes the sender (out of `sendmsg` too), which closes the socket,
    // then completes what was in flight. (After the sender's own teardown
    // began, the socket is no longer the connection's: nothing to reset.)
    conn.abort(own);
    Stopped {
        parts: (inflight, done),
        pending,
        own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_moved_twice_fences_every_connection_it_left() {
        let fences = |conn| {
            let mut out = [0u32; FENCES_MAX];
            let n = fences_for(conn, &mut out);
            out[..n].to_vec()
        };
        let (a, b, c) = (next_conn_id(), next_conn_id(), next_conn_id());
        assert_eq!(fences(a), [a]);
        // Failed on b behind a fence for a, then on c behind one for b.
        owe(b, a);
        owe(c, b);
        owe(c, b);
        assert_eq!(fences(c), [c, b, a]);
        // The walk ends even on a cycle.
        owe(a, c);
        assert_eq!(fences(c), [c, b, a]);
    }

    #[test]
    fn fences_ahead_of_one_slice_are_bounded() {
        let first = next_conn_id();
        let mut last = first;
        for _ in 0..2 * FENCES_MAX {
            let next = next_conn_id();
            owe(next, last);
            last = next;
        }
        let mut out = [0u32; FENCES_MAX];
        assert_eq!(fences_for(last, &mut out), FENCES_MAX);
        assert_eq!(out[0], last);
    }
}
