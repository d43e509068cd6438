//! One initiator-side data connection: a sender thread and a receiver
//! thread around a socket, fed by a worker through lock-free rings.
//!
//! ```text
//! worker ──submit──▶ sender ──wire──▶ target
//!                      │ inflight (bounded: the connection's wire window)
//!                      ▼
//! worker ◀──done──── receiver ◀─wire── target
//! ```
//! The worker is the only producer of `submit` and the only consumer of
//! `done`; neither side ever locks or allocates per slice. The connection's
//! wire window ([`Conn::window`], an [`SqController`]: the engine's one
//! flow-control type) holds at most `max_inflight_per_connection` slices:
//! the sender takes a credit as it puts a slice on the wire, and gives it
//! back when the slice's response arrives (the receiver takes it off the
//! wire) or the teardown completes it. That bounds the bytes on the wire
//! per connection: a large transfer queues in `submit` instead of piling
//! up in socket buffers (UCX's unbounded puts collapse that way).
//!
//! When the socket fails, the connection is aborted ([`Conn::abort`]): the
//! receiver stops and hands its ring ends back to the sender through its
//! join handle; the sender resets the socket (RST: the kernel drops what it
//! still had queued) and only then completes every slice that was in
//! flight with the failure's kind (`RouteLost` when the rail's link went
//! down); it reconnects on the next slice. Slices still in `submit` were
//! never sent, so they are never reported twice.
//!
//! A worker stops one task's slices (`Conn::claim`, `Conn::on_wire`,
//! `Conn::stop_slices`): the sender sends no queued slice of an aborted
//! token (it completes them at once, on `unsent`); a slice of it already
//! on the wire is stopped by resetting the connection, as above, so it
//! completes only once nothing touches its buffer. Slices of other tasks
//! caught on that connection come back as [`BYSTANDER`] and are re-posted
//! as if nothing happened.
//!
//! A WRITE that was sent on a connection that then failed remembers it
//! ([`Op::fence`]); wherever the slice is re-posted, a [`Fence`] for that
//! connection goes ahead of it, so the target lets the superseded
//! connection write nothing more before it serves the slice (bytes of it
//! still on their way, or queued in the target's socket, cannot land over
//! the slice or anything written after it). A connection reset with a
//! WRITE on it is also fenced by every connection to the peer before its
//! next slice (`PeerFences`): that WRITE's failure may have reached the
//! application, whose next WRITE must not be overwritten by its bytes.
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
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tent_rings::spsc::{self, Consumer, Producer};
use tent_rings::{ErrorKind, Opcode};

use super::abort::AbortBoard;
use super::fence::{FENCES_MAX, PEER_FENCES_MAX, PeerFences, fences_for, owe};
use super::frame::{BUSY, Fence, Ident, RESPONSE_LEN, Request, Response, SESSION_LEN};
use super::server::tune;
use super::{handshake, io};
use crate::clock::monotonic_ns;
use crate::doorbell::{Doorbell, Wakers};
use crate::error::{Error, Result};
use crate::flow::SqController;
use crate::transport::rails::{MAX_MEM_NODES, MAX_RAILS};

/// How long a parked sender sleeps before looking at its rail again
/// (link events and new slices wake it sooner).
const SENDER_PARK: Duration = Duration::from_secs(1);
/// A connection idle this long is replaced before its next slice: shorter
/// than a target waits before it may evict an idle connection (30 s).
pub(crate) const RECONNECT_IDLE: Duration = Duration::from_secs(15);
/// Longest pause between tries at a busy target.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(200);

/// `Op::opcode`'s flag of a HIGH slice.
pub(crate) const URGENT: u8 = 0x80;

/// The submit ring of HIGH slices (sent first).
pub(crate) const EXPRESS: usize = 0;
/// The submit ring of MEDIUM and LOW slices.
pub(crate) const BULK: usize = 1;

/// How a connection connects.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `TCP_USER_TIMEOUT` (0: the kernel's).
    pub user_timeout_ms: u32,
    /// Connect plus handshake.
    pub connect_timeout: Duration,
    /// How long after it was posted a slice may still wait for a busy
    /// target to take the connection.
    pub patience: Duration,
    /// The shared secret, proven to the target when set.
    pub secret: Option<Arc<[u8]>>,
    /// The session its hello names: one per attached peer (every worker's
    /// and rail's connections to that target share it, so a fence reaches
    /// them all), never shown to another target, so a peer that saw one of
    /// our sessions cannot use it to fence our connections elsewhere.
    pub session: [u8; SESSION_LEN],
}

/// A fresh session for the connections to one peer.
pub(crate) fn new_session() -> [u8; SESSION_LEN] {
    let mut s = [0u8; SESSION_LEN];
    s.copy_from_slice(&crate::control::auth::nonce()[..SESSION_LEN]);
    s
}

/// One slice as it travels through a connection's rings.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Op {
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
    /// 0 = done, [`BYSTANDER`], else the `ErrorKind` code.
    pub status: u16,
    /// 1 = WRITE, 2 = READ; [`URGENT`] set for a HIGH slice.
    pub opcode: u8,
    /// Times it was re-posted on a sibling rail.
    pub attempts: u8,
    /// Rail index within its peer (below `MAX_RAILS`).
    pub rail: u8,
    /// The NUMA node of its local memory, [`NO_NODE`] when unknown (or
    /// past `MAX_MEM_NODES`): a move to a sibling rail ranks rails from it.
    mem_node: u8,
    /// Slices ahead of it on its rail when posted (bandwidth estimate).
    pub ahead: u16,
    /// A WRITE only: the connection it last left after it was sent there
    /// (0: none). Set when the connection fails; wherever the slice is
    /// re-posted, a fence for that connection goes ahead of it.
    pub fence: u32,
}

const _: () = assert!(std::mem::size_of::<Op>() == 64);
const _: () = assert!(MAX_RAILS <= u8::MAX as usize && MAX_MEM_NODES < NO_NODE as usize);

/// [`Op`]'s memory node when it is unknown.
const NO_NODE: u8 = u8::MAX;

/// [`Op::status`] of a slice caught on a connection that was reset to stop
/// another task's slice: it did not fail (re-post it, as if the connection
/// had not been there). Not an `ErrorKind` code.
pub(crate) const BYSTANDER: u16 = u16::MAX;
const _: () = assert!(ErrorKind::from_code(BYSTANDER).is_none());

// `Pod` (checked as it compiles: integers only, no padding) makes it a
// ring `Entry`. The local address is held as an integer and dereferenced
// only under the transport's contract.

impl Op {
    /// A fresh op for a slice.
    pub(crate) fn new(token: u64, opcode: Opcode, local: *mut u8, addr: u64, len: u64, key: u64) -> Op {
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
            mem_node: NO_NODE,
            ..Op::default()
        }
    }

    /// Its local memory is on NUMA node `node` (`None`: unknown).
    pub(crate) fn set_mem_node(&mut self, node: Option<u32>) {
        self.mem_node = node
            .filter(|&n| (n as usize) < MAX_MEM_NODES)
            .map_or(NO_NODE, |n| n as u8);
    }

    /// The NUMA node of its local memory (`None`: unknown).
    #[inline]
    pub(crate) fn mem_node(&self) -> Option<u32> {
        (self.mem_node != NO_NODE).then_some(u32::from(self.mem_node))
    }

    fn opcode(&self) -> Opcode {
        if self.opcode & !URGENT == 2 {
            Opcode::Read
        } else {
            Opcode::Write
        }
    }

    /// Is it a HIGH slice (express ring, urgent rail pick, also when
    /// re-posted)?
    pub(crate) fn is_urgent(&self) -> bool {
        self.opcode & URGENT != 0
    }

    /// Mark it HIGH.
    pub(crate) fn set_urgent(&mut self) {
        self.opcode |= URGENT;
    }

    /// The slice's outcome.
    pub(crate) fn result(&self) -> std::result::Result<u64, ErrorKind> {
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

/// A fresh connection id (never 0; unique in this process until 2^32
/// connections have opened, so unique in every session).
pub(super) fn next_conn_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    loop {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if id != 0 {
            return id;
        }
    }
}

/// A rail as a connection sees it: where to connect from and to, and
/// whether its local link is up.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// Local address to bind (pins the connection to the rail's interface).
    pub local_ip: IpAddr,
    /// The target's data server on the rail's remote interface.
    pub remote: SocketAddr,
    /// Link state, written by the link watch.
    pub up: AtomicBool,
}

/// What the worker, the sender, the receiver and the link watch share.
pub(crate) struct Conn {
    endpoint: Arc<Endpoint>,
    opts: Options,
    bell: Doorbell,
    sleeping: AtomicBool,
    broken: AtomicBool,
    stop: AtomicBool,
    /// Why the sender broke the link (an `ErrorKind` code, 0 = none).
    cause: AtomicU16,
    /// The socket was reset to stop an aborted token's slice: the other
    /// slices on it come back [`BYSTANDER`].
    bystanders: AtomicBool,
    /// The live socket, so the link watch and the worker can reset it at
    /// once (lock-free: the worker never waits on the sender).
    stream: ArcSwapOption<TcpStream>,
    /// The tokens the owning worker aborted.
    board: Arc<AbortBoard>,
    /// Connections every connection to this peer fences.
    fences: Arc<PeerFences>,
    /// The token of each slice sent and not finished, by `seq` modulo its
    /// length (`max_inflight_per_connection` + 1: one more than the ring
    /// holds, for the slice the receiver is landing).
    wire: Box<[AtomicU64]>,
    /// The last `seq` claimed for the wire (by the sender).
    sent: AtomicU32,
    /// The last `seq` finished (by the receiver, or the sender's teardown).
    finished: AtomicU32,
    /// The last `seq` whose request (and a WRITE's payload) fully left
    /// `send_all` (by the sender, Release): a response to a later one
    /// came before the sender was done reading its buffer.
    payload_sent: AtomicU32,
    /// The worker that owns this connection, woken on completions.
    notify: Option<(Arc<Wakers>, usize)>,
    /// Slices on the wire: taken by the sender only, given back by the
    /// receiver as responses arrive and by the sender's teardown.
    window: SqController,
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
    /// Its wire window: slices sent and not answered yet, at most
    /// `max_inflight_per_connection`.
    pub(crate) fn window(&self) -> &SqController {
        &self.window
    }

    /// The session this connection's hello names.
    #[cfg(test)]
    pub(super) fn session(&self) -> [u8; SESSION_LEN] {
        self.opts.session
    }

    /// Tell the owning worker that `done` has new completions.
    #[inline]
    fn completed(&self) {
        if let Some((wakers, w)) = &self.notify {
            wakers.completion_ready(*w);
        }
    }

    /// Wake the sender if it sleeps (one load when it does not).
    #[inline]
    pub(crate) fn wake(&self) {
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
    pub(crate) fn abort(&self, cause: ErrorKind) {
        let _ = self
            .cause
            .compare_exchange(0, cause.code(), Ordering::AcqRel, Ordering::Relaxed);
        self.break_now();
    }

    /// Mark the connection broken and reset its socket, if one is up. No
    /// lock: the worker calls it too.
    fn break_now(&self) {
        self.broken.store(true, Ordering::SeqCst);
        // SeqCst, paired with `connect_aborted`: either this finds a
        // socket being opened, or its opener sees `broken`.
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(s) = self.stream.load().as_deref() {
            reset(s);
        }
        self.bell.ring();
    }

    /// Is a slice of `token` on the wire here (sent, or being sent, and
    /// not finished)? Worker only, after posting the token on its
    /// [`AbortBoard`]; SeqCst, paired with [`Conn::claim`].
    pub(super) fn on_wire(&self, token: u64) -> bool {
        let finished = self.finished.load(Ordering::SeqCst);
        let sent = self.sent.load(Ordering::SeqCst);
        let n = self.wire.len() as u32;
        // At most `n` slices are past `finished`; a racing read may see
        // more: the newest `n` are the ones that can still be out.
        let live = sent.wrapping_sub(finished).min(n);
        (0..live).any(|k| {
            let seq = sent.wrapping_sub(k);
            self.wire[(seq % n) as usize].load(Ordering::SeqCst) == token
        })
    }

    /// Stop the slices of an aborted token that are on the wire here:
    /// reset the connection; what else was on it comes back
    /// [`BYSTANDER`]. Non-blocking (worker).
    pub(super) fn stop_slices(&self) {
        self.bystanders.store(true, Ordering::SeqCst);
        self.break_now();
    }

    /// The owning worker aborted a token: a sender looks through its
    /// queued slices for it. Non-blocking.
    pub(super) fn aborted(&self) {
        self.bell.ring();
    }

    /// Stop the connection for good (the transport is stopping): the
    /// sender completes what it has with `Shutdown` and returns.
    pub(super) fn shut_down(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.break_now();
    }

    /// Claim the wire for `op`, sent as `seq`, unless its token is aborted
    /// (then the kind). SeqCst, paired with the worker's post on the board
    /// then [`Conn::on_wire`]: either this sees the token aborted, or the
    /// worker sees the slice on the wire and resets the connection.
    fn claim(&self, op: &Op, seq: u32) -> Option<ErrorKind> {
        let n = self.wire.len() as u32;
        self.wire[(seq % n) as usize].store(op.token, Ordering::SeqCst);
        self.sent.store(seq, Ordering::SeqCst);
        let kind = self.board.kind_of(op.token)?;
        self.sent.store(seq.wrapping_sub(1), Ordering::SeqCst);
        Some(kind)
    }

    fn link_up(&self) -> bool {
        // Relaxed: a hint re-read every loop; the link watch also breaks
        // the connection explicitly.
        self.endpoint.up.load(Ordering::Relaxed)
    }

    /// The status a slice on the wire gets after `own` broke the socket:
    /// its token's abort kind; else `Shutdown` when stopping, `RouteLost`
    /// when the link is down, [`BYSTANDER`] when the socket was reset for
    /// another token's slice, else the cause.
    fn failure_status(&self, op: &Op, own: ErrorKind) -> u16 {
        if let Some(k) = self.board.kind_of(op.token) {
            return k.code();
        }
        if self.stop.load(Ordering::Acquire) {
            return ErrorKind::Shutdown.code();
        }
        if !self.link_up() {
            return ErrorKind::RouteLost.code();
        }
        if self.bystanders.load(Ordering::Acquire) {
            return BYSTANDER;
        }
        match self.cause.load(Ordering::Acquire) {
            0 => own.code(),
            c => ErrorKind::from_code(c).unwrap_or(own).code(),
        }
    }

    /// Was the connect in progress cut (the socket reset, the link gone,
    /// the transport stopping)? How, if so.
    fn connect_cut(&self) -> Option<Cut> {
        // SeqCst, paired with `break_now`: the socket was published before
        // this reads `broken`, so either this sees the abort or the abort
        // finds the socket.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.stop.load(Ordering::Acquire) {
            return Some(Cut::Fail(ErrorKind::Shutdown));
        }
        if !self.link_up() {
            return Some(Cut::Fail(ErrorKind::RouteLost));
        }
        if !self.broken.load(Ordering::SeqCst) {
            return None;
        }
        match self.cause.load(Ordering::Acquire) {
            // A reset to stop another task's slices on the socket before
            // this one (`stop_slices`) landed here: nothing failed.
            0 if self.bystanders.load(Ordering::Acquire) => Some(Cut::Again),
            c => Some(Cut::Fail(
                ErrorKind::from_code(c).unwrap_or(ErrorKind::ProcessFailed),
            )),
        }
    }

    /// Finish opening `s` (published in `stream`, its connect in
    /// progress): wait for the connect by `deadline`, then hand-shake by
    /// the same deadline. An abort resets `s`, which ends either wait at
    /// once; how it cut the connect then wins over what the socket said.
    fn establish(
        &self,
        s: &TcpStream,
        deadline: Instant,
        ident: Ident,
    ) -> std::result::Result<(), (Cut, String)> {
        let io_failed = |e: std::io::Error| self.failed(io::kind_of(&e), e.to_string());
        self.unless_cut()?;
        crate::deadline::wait_for(s.as_fd(), rustix::event::PollFlags::OUT, deadline).map_err(io_failed)?;
        match s.take_error() {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => return Err(io_failed(e)),
        }
        self.unless_cut()?;
        s.set_nonblocking(false).map_err(io_failed)?;
        tune(s, self.opts.user_timeout_ms);
        // The handshake leaves the socket's timeouts alone: each read
        // waits only for what is left of `deadline`.
        handshake::open(s, self.opts.secret.as_deref(), deadline, ident)
            .map_err(|r| self.failed(r.kind, r.why))?;
        // Cut after the handshake: no slice has gone on it yet.
        self.unless_cut()
    }

    /// A connect step failed with `own` (`why`): how the connect ends. An
    /// abort's cut wins over what the socket says of the reset that
    /// carried it out.
    fn failed(&self, own: ErrorKind, why: String) -> (Cut, String) {
        match self.connect_cut() {
            Some(cut) => (cut, "cut while connecting".to_owned()),
            None => (Cut::Fail(own), why),
        }
    }

    /// Go on with the connect unless it was cut.
    fn unless_cut(&self) -> std::result::Result<(), (Cut, String)> {
        match self.connect_cut() {
            Some(cut) => Err((cut, "cut while connecting".to_owned())),
            None => Ok(()),
        }
    }
}

/// How a connect in progress was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The slice waiting on it completes with this kind (stopping, the
    /// link down, the socket failed or timed out, the target refused).
    Fail(ErrorKind),
    /// A reset meant for the slices of the socket before this one
    /// (`stop_slices`) landed on it: nothing failed, connect again.
    Again,
}

/// Make closing `s` reset the connection (`SO_LINGER {on, 0}`: RST, send
/// queue discarded) and wake whoever blocks on it now.
fn reset(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// The worker's ends of a connection; dropping them stops its threads.
#[derive(Debug)]
pub(crate) struct ConnEnds {
    /// Shared state (the link watch breaks it through this).
    pub conn: Arc<Conn>,
    /// Slices to send: `[EXPRESS]` (HIGH, sent first) and `[BULK]`.
    pub submit: [Producer<Op>; 2],
    /// Slices done that were on the wire (the receiver's, or the sender's
    /// once it has taken them back).
    pub done: Consumer<Op>,
    /// Slices done that never went on the wire (the sender's).
    pub unsent: Consumer<Op>,
}

impl Drop for ConnEnds {
    fn drop(&mut self) {
        self.conn.stop.store(true, Ordering::Release);
        self.conn.bell.ring();
    }
}

/// What a connection shares with others: the owning worker's abort board
/// and bell, the peer's fences.
#[derive(Debug, Clone)]
pub(super) struct Shared {
    /// The tokens the owning worker aborted.
    pub(super) board: Arc<AbortBoard>,
    /// Connections every connection to the peer fences.
    pub(super) fences: Arc<PeerFences>,
    /// The owning worker's bell, rung on completions.
    pub(super) notify: Option<(Arc<Wakers>, usize)>,
}

/// Open (lazily: the socket connects on the first slice) a connection to
/// `endpoint`. `queue` bounds the slices the worker may hand it (its credit
/// pool size), `inflight` the slices on the wire. The sender thread's
/// handle comes back with the ends: whoever stops the transport joins it
/// (it joins the receiver).
pub(super) fn open(
    endpoint: Arc<Endpoint>,
    queue: u32,
    inflight: u32,
    opts: Options,
    shared: Shared,
) -> Result<(ConnEnds, JoinHandle<()>)> {
    let ring = |cap: u32| {
        // Rings hold at least two entries; the in-flight bound is the
        // connection's window (`Sender::room`), so a bound of 1 stays exact.
        spsc::channel::<Op>(cap.max(2).next_power_of_two())
            .map_err(|e| Error::invalid("tcp connection ring").with_source(e))
    };
    let (express_p, express_c) = ring(queue)?;
    let (submit_p, submit_c) = ring(queue)?;
    let (done_p, done_c) = ring(queue)?;
    let (unsent_p, unsent_c) = ring(queue)?;
    let (infl_p, infl_c) = ring(inflight)?;
    let conn = Arc::new(Conn {
        endpoint,
        opts,
        bell: Doorbell::default(),
        sleeping: AtomicBool::new(false),
        broken: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        cause: AtomicU16::new(0),
        bystanders: AtomicBool::new(false),
        stream: ArcSwapOption::empty(),
        board: shared.board,
        fences: shared.fences,
        wire: (0..=inflight.max(1)).map(|_| AtomicU64::new(0)).collect(),
        sent: AtomicU32::new(0),
        finished: AtomicU32::new(0),
        payload_sent: AtomicU32::new(0),
        notify: shared.notify,
        // Nobody waits on it (the sender parks on its bell instead).
        window: SqController::new(inflight, 0, Duration::from_millis(1)),
    });
    let sender = Sender {
        conn: conn.clone(),
        backlog: [
            VecDeque::with_capacity(express_p.capacity()),
            VecDeque::with_capacity(submit_p.capacity()),
        ],
        submit: [express_c, submit_c],
        unsent: unsent_p,
        inflight: infl_p,
        parts: Some((infl_c, done_p)),
        receiver: None,
        stream: None,
        conn_id: 0,
        seq: 0,
        held: None,
        board_seen: 0,
        fences_seen: 0,
        fences_from: 0,
        last_post_ns: 0,
        pause: Duration::ZERO,
        logged: 0,
    };
    let thread = std::thread::Builder::new()
        .name("tent-tcp-send".into())
        .spawn(move || sender.run())
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn tcp sender").with_source(e))?;
    Ok((
        ConnEnds {
            conn,
            submit: [express_p, submit_p],
            done: done_c,
            unsent: unsent_c,
        },
        thread,
    ))
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
    /// `[EXPRESS]` then `[BULK]`: a HIGH slice goes on the wire before any
    /// bulk slice still queued here (seed 001).
    submit: [Consumer<Op>; 2],
    /// Per class, slices taken from `submit` early (to fail those of an
    /// aborted token at once), sent before anything still in `submit`.
    backlog: [VecDeque<Op>; 2],
    /// Completions of slices that never went on the wire.
    unsent: Producer<Op>,
    inflight: Producer<Op>,
    /// The receiver's ring ends while no receiver runs.
    parts: Option<Parts>,
    receiver: Option<JoinHandle<Stopped>>,
    stream: Option<Arc<TcpStream>>,
    /// The connected socket's id in its peer's session (0: none).
    conn_id: u32,
    seq: u32,
    /// A slice popped but not sent: the target was busy.
    held: Option<Op>,
    /// The abort board's generation last looked through.
    board_seen: u64,
    /// The peer's fences sent so far (a [`PeerFences`] generation)...
    fences_seen: u64,
    /// ...and where they stood when this socket connected: a socket torn
    /// down with slices on it may not have had its fences served, so the
    /// next one sends them again.
    fences_from: u64,
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
            let board = self.conn.board.generation();
            if board != self.board_seen {
                self.board_seen = board;
                self.sweep();
            }
            let seen = self.conn.bell.value();
            let next = match self.held.take() {
                Some(op) => Some(op),
                None if self.room() => self.next_queued(),
                None => None,
            };
            let Some(op) = next else {
                self.park(seen);
                continue;
            };
            if let Some(kind) = self.conn.board.kind_of(op.token) {
                self.complete(op.fail(kind));
                continue;
            }
            if self.stream.is_some()
                && op.posted_ns.saturating_sub(self.last_post_ns) > RECONNECT_IDLE.as_nanos() as u64
                && self.conn.window.posted() == 0
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

    /// The next slice to send: express before bulk, and within a class
    /// what was taken early before what is still in its ring.
    fn next_queued(&mut self) -> Option<Op> {
        for c in [EXPRESS, BULK] {
            if let Some(op) = self.backlog[c].pop_front() {
                return Some(op);
            }
            if let Some(op) = self.submit[c].pop() {
                self.submit[c].sync();
                return Some(op);
            }
        }
        None
    }

    /// Anything queued, in either class?
    fn has_queued(&mut self) -> bool {
        let mut any = false;
        for c in [EXPRESS, BULK] {
            any |= !self.submit[c].is_empty() || !self.backlog[c].is_empty();
        }
        any
    }

    /// May one more slice go on the wire (a free credit in the window)?
    /// The sender is the window's only taker, so the answer holds until
    /// it takes one.
    fn room(&mut self) -> bool {
        self.conn.window.available() > 0
    }

    /// The worker aborted a token: complete its queued slices now (held,
    /// backlog, and everything still in `submit`, which moves to the
    /// backlog in order), without waiting for room on the wire.
    fn sweep(&mut self) {
        let board = &self.conn.board;
        let mut any = false;
        if let Some(op) = self.held
            && let Some(kind) = board.kind_of(op.token)
        {
            self.held = None;
            push_done(&mut self.unsent, op.fail(kind));
            any = true;
        }
        for c in [EXPRESS, BULK] {
            let mut taken = false;
            while let Some(op) = self.submit[c].pop() {
                // Room: each backlog is as large as its ring, and together
                // they hold at most the worker's credits.
                self.backlog[c].push_back(op);
                taken = true;
            }
            if taken {
                self.submit[c].sync();
            }
            let before = self.backlog[c].len();
            let unsent = &mut self.unsent;
            self.backlog[c].retain(|op| match board.kind_of(op.token) {
                Some(kind) => {
                    push_done(unsent, op.fail(kind));
                    false
                }
                None => true,
            });
            any |= self.backlog[c].len() != before;
        }
        if any {
            self.unsent.sync();
            self.conn.completed();
        }
    }

    /// Sleep until woken, unless work arrived after `seen` was read.
    fn park(&mut self, seen: u32) {
        // SeqCst: see Conn::wake.
        self.conn.sleeping.store(true, Ordering::SeqCst);
        let busy = (self.has_queued() && self.room())
            || self.conn.stop.load(Ordering::SeqCst)
            || (self.stream.is_some() && self.conn.broken.load(Ordering::SeqCst))
            || self.conn.board.generation() != self.board_seen;
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

    /// Connect and hand-shake, cancellable at every step. The socket is
    /// published in [`Conn::stream`] from the moment its SYN is out, so an
    /// abort (the link watch's, a stop) resets it and whatever this waits
    /// on (the connect's completion, the target's hello) wakes at once: a
    /// slice held across a connect on a rail that goes down comes back
    /// `RouteLost` as promptly as a slice on the wire, not when the
    /// connect gives up (`connect_timeout`, up to 5 s).
    fn connect(&mut self) -> std::result::Result<(), ErrorKind> {
        let deadline = crate::deadline::after(self.conn.opts.connect_timeout);
        loop {
            match self.try_connect(deadline) {
                Ok(()) => return Ok(()),
                // Bounded: each `Again` is one more reset by the worker, and
                // `deadline` holds across the tries.
                Err((Cut::Again, _)) => continue,
                Err((Cut::Fail(kind), why)) => {
                    // A stop is no failure worth a warning.
                    if kind != ErrorKind::Shutdown {
                        self.note(kind, &why);
                    }
                    return Err(kind);
                }
            }
        }
    }

    /// One connect by `deadline`, handshake included.
    fn try_connect(&mut self, deadline: Instant) -> std::result::Result<(), (Cut, String)> {
        let ep = self.conn.endpoint.clone();
        let io_failed = |e: std::io::Error| (Cut::Fail(io::kind_of(&e)), e.to_string());
        let domain = socket2::Domain::for_address(ep.remote);
        let sock =
            socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
                .map_err(io_failed)?;
        if !ep.local_ip.is_unspecified() {
            sock.bind(&SocketAddr::new(ep.local_ip, 0).into())
                .map_err(io_failed)?;
        }
        sock.set_nonblocking(true).map_err(io_failed)?;
        // Cleared before the socket is published: an abort from now on
        // either finds the socket (and resets it) or is seen by
        // `Conn::connect_cut` right after the publication.
        self.conn.cause.store(0, Ordering::Relaxed);
        self.conn.bystanders.store(false, Ordering::Relaxed);
        self.conn.broken.store(false, Ordering::SeqCst);
        match sock.connect(&ep.remote.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(self.conn.failed(io::kind_of(&e), e.to_string())),
        }
        let stream = Arc::new(TcpStream::from(sock));
        self.conn.stream.store(Some(stream.clone()));
        let ident = Ident {
            session: self.conn.opts.session,
            conn: next_conn_id(),
        };
        if let Err(e) = self.conn.establish(&stream, deadline, ident) {
            // Nothing was sent on it: no slice waits for this socket.
            self.conn.stream.store(None);
            return Err(e);
        }
        self.logged = 0;
        self.pause = Duration::ZERO;
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
                self.conn.stream.store(None);
                tracing::error!(error = %e, "cannot spawn a tcp receiver thread; connection unusable");
                return Err((Cut::Fail(ErrorKind::OutOfMemory), e.to_string()));
            }
        }
        // An abort since the check after the handshake left `broken` set
        // (and the socket reset): the next turn tears the connection down.
        self.stream = Some(stream);
        self.conn_id = ident.conn;
        self.fences_from = self.fences_seen;
        tracing::debug!(remote = %ep.remote, local = %ep.local_ip, conn = ident.conn, "tcp data connection up");
        Ok(())
    }

    fn send(&mut self, mut op: Op) {
        let seq = self.seq.wrapping_add(1);
        if let Some(kind) = self.conn.claim(&op, seq) {
            // Aborted since it was taken: it never goes out.
            self.complete(op.fail(kind));
            return;
        }
        self.seq = seq;
        op.seq = seq;
        // Room was checked and only this thread takes credits: this one
        // is never refused (the window is never degraded).
        let credit = self.conn.window.try_reserve(1);
        debug_assert!(credit.is_ok(), "wire window room was checked");
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
        if let Err(e) = send_fences(&self.conn, &mut self.fences_seen, stream, op.fence) {
            // The op is in `inflight`: teardown completes it.
            self.conn.abort(io::kind_of(&e));
            return;
        }
        let (payload, len) = match op.opcode() {
            Opcode::Write => (op.local as *const u8, op.len as usize),
            Opcode::Read => (std::ptr::null(), 0),
        };
        // SAFETY: a WRITE's local range was checked against its registration by the engine, which keeps the task (and its region) alive until this slice completes.
        match unsafe { io::send_all(&**stream, &req, payload, len) } {
            // Release: the receiver that sees it may complete the slice.
            Ok(()) => self.conn.payload_sent.store(seq, Ordering::Release),
            Err(e) => self.conn.abort(io::kind_of(&e)),
        }
    }

    /// Complete a slice that never went on the wire.
    fn complete(&mut self, op: Op) {
        push_done(&mut self.unsent, op);
        self.unsent.sync();
        self.conn.completed();
    }

    /// Complete every slice not on the wire with `kind`.
    fn fail_queued(&mut self, kind: ErrorKind) {
        let mut any = false;
        if let Some(op) = self.held.take() {
            push_done(&mut self.unsent, op.fail(kind));
            any = true;
        }
        let mut taken = false;
        for c in [EXPRESS, BULK] {
            while let Some(op) = self.backlog[c].pop_front() {
                push_done(&mut self.unsent, op.fail(kind));
                any = true;
            }
            let mut popped = false;
            while let Some(op) = self.submit[c].pop() {
                push_done(&mut self.unsent, op.fail(kind));
                popped = true;
            }
            if popped {
                self.submit[c].sync();
            }
            taken |= popped;
        }
        if any || taken {
            self.unsent.sync();
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
        self.conn.stream.store(None);
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
        // The socket closes here, before any slice that was on it
        // completes: the receiver dropped its reference; a thread resetting
        // it (the worker, the link watch) holds one for a few instructions
        // (the store above made every such holder a counted one).
        while Arc::strong_count(&stream) > 1 {
            std::thread::yield_now();
        }
        drop(stream);
        let mut any = false;
        let mut wrote = false;
        // `pending` gave its credit back when the receiver took it.
        let mut off_wire = 0;
        for op in pending.into_iter().chain(std::iter::from_fn(|| {
            let op = infl.pop();
            off_wire += u32::from(op.is_some());
            op
        })) {
            wrote |= op.opcode() == Opcode::Write;
            let status = self.conn.failure_status(&op, own);
            let mut op = self.left(op);
            op.status = status;
            push_done(&mut done, op);
            any = true;
        }
        if wrote {
            // Bytes of those WRITEs may sit in the target's socket: every
            // connection to the peer fences this one before its next slice.
            self.conn.fences.add(self.conn_id);
        }
        self.conn.window.release(off_wire, monotonic_ns());
        if any {
            infl.sync();
            done.sync();
            self.conn.completed();
            // Fences sent on it may not have been served: send them again.
            self.fences_seen = self.fences_from;
        }
        self.parts = Some((infl, done));
        self.conn.finished.store(self.seq, Ordering::SeqCst);
        self.conn_id = 0;
        self.conn.bystanders.store(false, Ordering::Relaxed);
        self.conn.broken.store(false, Ordering::Relaxed);
        self.conn.cause.store(0, Ordering::Relaxed);
    }
}

/// Send the fences that must precede the next slice on `s`: those the
/// peer's connections owe ([`PeerFences`], new since `seen`), then for a
/// WRITE moved off connection `left` (0: none), that one; each with what
/// it owed in turn ([`fences_for`]).
fn send_fences(conn: &Conn, seen: &mut u64, s: &TcpStream, left: u32) -> std::io::Result<()> {
    let fence = |c: u32| -> std::io::Result<()> {
        let mut chain = [0u32; FENCES_MAX];
        let n = fences_for(c, &mut chain);
        for &conn in &chain[..n] {
            io::send_header(s, &Fence { conn }.encode())?;
        }
        Ok(())
    };
    if conn.fences.generation() != *seen {
        let mut owed = [0u32; PEER_FENCES_MAX];
        let (n, g) = conn.fences.since(*seen, &mut owed);
        *seen = g;
        for &c in &owed[..n] {
            fence(c)?;
        }
    }
    if left != 0 {
        // A moved WRITE: its old connections write no more first.
        fence(left)?;
    }
    Ok(())
}

/// How long a response may precede the sender's return from sending its
/// WRITE's payload. An honest target answers only after receiving every
/// byte, so the sender is a few instructions from done (or preempted);
/// past this the target answered early: a protocol violation.
const EARLY_RESPONSE_GRACE: Duration = Duration::from_secs(1);

/// Has the sender finished sending `seq` (its payload out of our buffer)?
/// Waits up to [`EARLY_RESPONSE_GRACE`] for it, less if the connection
/// breaks. Receiver only.
fn payload_left(conn: &Conn, seq: u32) -> bool {
    // Within the connection's window, `seq` is at or before the last sent.
    let sent = || (conn.payload_sent.load(Ordering::Acquire).wrapping_sub(seq) as i32) >= 0;
    let start = Instant::now();
    let mut spins = 0u32;
    while !sent() {
        if conn.broken.load(Ordering::SeqCst) || start.elapsed() >= EARLY_RESPONSE_GRACE {
            return sent();
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    true
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
        let h = match io::recv_header::<RESPONSE_LEN>(&*s, &mut io::Pace::unlimited()) {
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
        // Off the wire (its response is here): the sender may send another
        // while this one lands (`Conn::wire` has a place for it).
        conn.window.release(1, monotonic_ns());
        if resp.seq != op.seq {
            crate::lograte::warn_limited!(conn.endpoint.remote, remote = %conn.endpoint.remote, want = op.seq, got = resp.seq, "tcp: response out of order; closing the connection");
            pending = Some(op);
            break ErrorKind::Unreachable;
        }
        // A WRITE completes only once the sender is done reading its
        // buffer: an answer before that (or for other than the whole
        // payload) is a violation; the slice goes back to the teardown,
        // which completes it once the socket is closed.
        if op.opcode() == Opcode::Write {
            let whole = resp.status.is_err() || resp.len == op.len;
            if !whole || !payload_left(&conn, op.seq) {
                let why = if whole {
                    "answered before its payload was sent"
                } else {
                    "wrong length"
                };
                crate::lograte::warn_limited!((conn.endpoint.remote, why), remote = %conn.endpoint.remote, seq = op.seq, why, "tcp: bad WRITE response; closing the connection");
                pending = Some(op);
                break ErrorKind::Unreachable;
            }
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
                        &mut io::Pace::unlimited(),
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
        // After the push: a slice whose token the worker finds on the wire
        // until now has not been handed back yet.
        conn.finished.store(op.seq, Ordering::SeqCst);
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
    use std::net::TcpListener;

    /// A fresh op's memory node is unknown (not node 0); a node the tier
    /// tables cover travels, one past them reads as unknown.
    #[test]
    fn an_op_carries_its_memory_s_node_for_moves() {
        let mut op = Op::new(1, Opcode::Write, std::ptr::null_mut(), 0, 1, 1);
        assert_eq!(op.mem_node(), None);
        for n in [0, 1, MAX_MEM_NODES as u32 - 1] {
            op.set_mem_node(Some(n));
            assert_eq!(op.mem_node(), Some(n));
        }
        op.set_mem_node(Some(MAX_MEM_NODES as u32));
        assert_eq!(op.mem_node(), None);
        op.set_mem_node(Some(3));
        op.set_mem_node(None);
        assert_eq!(op.mem_node(), None);
    }

    /// Longer than any bound below: a wait that lasts until the connect
    /// gives up fails these tests.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
    /// How soon a cut connect hands its slice back. The netns chaos test
    /// allows 2 s for the whole move; this is the connection's share.
    const PROMPT: Duration = Duration::from_secs(1);

    /// A listener whose accept queue is full: the kernel drops every
    /// further SYN, so a connect to it hangs in SYN_SENT (the filler is
    /// kept alive with it).
    fn syn_sink() -> (socket2::Socket, TcpStream) {
        let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        // Backlog 0 holds one connection; the filler takes it.
        l.listen(0).unwrap();
        let at = l.local_addr().unwrap().as_socket().unwrap();
        let filler = TcpStream::connect(at).unwrap();
        // The filler is in the accept queue (a LISTEN socket's rx_queue in
        // /proc/net/tcp) before anything else connects.
        let me = format!("0100007F:{:04X}", at.port());
        let t = Instant::now();
        while !tcp_table()
            .iter()
            .any(|f| f[1] == me && f[3] == "0A" && f[4].ends_with(":00000001"))
        {
            assert!(
                t.elapsed() < PROMPT,
                "the filler never reached the accept queue"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        (l, filler)
    }

    /// This namespace's IPv4 TCP sockets, a row of fields each.
    fn tcp_table() -> Vec<Vec<String>> {
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    fn opened(remote: SocketAddr) -> (ConnEnds, JoinHandle<()>) {
        open(
            Arc::new(Endpoint {
                local_ip: IpAddr::from([127, 0, 0, 1]),
                remote,
                up: AtomicBool::new(true),
            }),
            4,
            2,
            Options {
                user_timeout_ms: 0,
                connect_timeout: CONNECT_TIMEOUT,
                patience: CONNECT_TIMEOUT,
                secret: None,
                session: new_session(),
            },
            Shared {
                board: Arc::new(AbortBoard::new(16)),
                fences: Arc::default(),
                notify: None,
            },
        )
        .unwrap()
    }

    /// Hand the sender one READ (it connects for it).
    fn submit_read(ends: &mut ConnEnds, buf: &mut [u8]) {
        let op = Op::new(7, Opcode::Read, buf.as_mut_ptr(), 0, buf.len() as u64, 1);
        ends.submit[BULK].push(op).unwrap();
        ends.submit[BULK].sync();
        ends.conn.wake();
    }

    /// Wait (up to `limit`) until a socket of this process is in SYN_SENT
    /// towards `remote` (`/proc/net/tcp`): the sender's connect is out and
    /// hanging.
    fn until_syn_sent(remote: SocketAddr, limit: Duration) {
        let want = format!("0100007F:{:04X}", remote.port());
        let t = Instant::now();
        loop {
            if tcp_table().iter().any(|f| f[2] == want && f[3] == "02") {
                return;
            }
            assert!(t.elapsed() < limit, "the sender never began connecting");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A connection whose sender is in a connect that nothing answers, for
    /// one READ: the sink (and its filler), the ends, the sender's thread
    /// and the READ's buffer, each to be kept alive.
    #[allow(clippy::type_complexity)]
    fn hanging_connect() -> (
        (socket2::Socket, TcpStream),
        ConnEnds,
        JoinHandle<()>,
        Vec<u8>,
    ) {
        let sink = syn_sink();
        let at = sink.0.local_addr().unwrap().as_socket().unwrap();
        let (mut ends, sender) = opened(at);
        let mut buf = vec![0u8; 4096];
        submit_read(&mut ends, &mut buf);
        until_syn_sent(at, PROMPT);
        (sink, ends, sender, buf)
    }

    /// The slice back from either completion ring, and how long it took.
    fn slice_back(ends: &mut ConnEnds, limit: Duration) -> Option<(Op, Duration)> {
        let t = Instant::now();
        loop {
            for ring in [&mut ends.unsent, &mut ends.done] {
                if let Some(op) = ring.pop() {
                    ring.sync();
                    return Some((op, t.elapsed()));
                }
            }
            if t.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// What the link watch does when a rail's link goes down.
    fn link_down(ends: &ConnEnds) {
        ends.conn.endpoint.up.store(false, Ordering::Release);
        ends.conn.abort(ErrorKind::RouteLost);
    }

    /// Stop the sender and join it, unless it is stuck (a failed test
    /// must not hang the binary on it).
    fn finish(ends: ConnEnds, sender: JoinHandle<()>) {
        ends.conn.shut_down();
        drop(ends);
        let t = Instant::now();
        while !sender.is_finished() && t.elapsed() < PROMPT {
            std::thread::sleep(Duration::from_millis(1));
        }
        if sender.is_finished() {
            sender.join().unwrap();
        }
    }

    #[test]
    fn a_connect_that_hangs_gives_its_slice_back_route_lost_when_the_link_goes_down() {
        let (_sink, mut ends, sender, _buf) = hanging_connect();
        // The SYN is out and dropped: nothing answers it.
        assert!(slice_back(&mut ends, Duration::ZERO).is_none());
        link_down(&ends);
        let (op, took) = slice_back(&mut ends, PROMPT).unwrap_or_else(|| {
            panic!("the slice stayed with a hung connect for {PROMPT:?} after its link went down")
        });
        assert_eq!(op.result(), Err(ErrorKind::RouteLost), "after {took:?}");
        finish(ends, sender);
    }

    #[test]
    fn a_handshake_that_hangs_gives_its_slice_back_route_lost_when_the_link_goes_down() {
        // Takes the connection and never says hello.
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut ends, sender) = opened(mute.local_addr().unwrap());
        let mut buf = vec![0u8; 4096];
        submit_read(&mut ends, &mut buf);
        // Connected: the sender is in (or on its way into) the handshake.
        let (_held, _) = mute.accept().unwrap();
        assert!(slice_back(&mut ends, Duration::ZERO).is_none());
        link_down(&ends);
        let (op, took) = slice_back(&mut ends, PROMPT).unwrap_or_else(|| {
            panic!("the slice stayed with a hung handshake for {PROMPT:?} after its link went down")
        });
        assert_eq!(op.result(), Err(ErrorKind::RouteLost), "after {took:?}");
        finish(ends, sender);
    }

    #[test]
    fn stopping_cuts_a_connect_that_hangs() {
        let (_sink, mut ends, sender, _buf) = hanging_connect();
        let t = Instant::now();
        ends.conn.shut_down();
        let (op, _) = slice_back(&mut ends, PROMPT).expect("the slice stayed with a hung connect");
        assert_eq!(op.result(), Err(ErrorKind::Shutdown));
        drop(ends);
        while !sender.is_finished() {
            assert!(
                t.elapsed() < PROMPT,
                "the sender stayed in a hung connect after its stop"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        sender.join().unwrap();
    }

    /// The worker resets a connection to stop another task's slices on it
    /// (`stop_slices`) just as the sender has opened the next socket: the
    /// reset lands on a connect that carries nothing yet. Nothing failed,
    /// so the slice waiting on it is not failed: the sender connects again.
    #[test]
    fn a_reset_meant_for_the_last_socket_s_slices_connects_again() {
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut ends, sender) = opened(mute.local_addr().unwrap());
        let mut buf = vec![0u8; 4096];
        submit_read(&mut ends, &mut buf);
        let (_first, _) = mute.accept().unwrap();
        ends.conn.stop_slices();
        mute.set_nonblocking(true).unwrap();
        let t = Instant::now();
        let _second = loop {
            match mute.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Some((op, _)) = slice_back(&mut ends, Duration::ZERO) {
                        panic!("a bystander reset failed the slice: {:?}", op.result());
                    }
                    assert!(t.elapsed() < PROMPT, "the sender did not connect again");
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(slice_back(&mut ends, Duration::ZERO).is_none());
        link_down(&ends);
        let (op, _) = slice_back(&mut ends, PROMPT).expect("the slice was not handed back");
        assert_eq!(op.result(), Err(ErrorKind::RouteLost));
        finish(ends, sender);
    }

    /// A link that is down before the slice arrives: the slice comes back
    /// at once, never having waited on a connect.
    #[test]
    fn a_slice_for_a_rail_whose_link_is_down_comes_back_route_lost() {
        let (sink, _filler) = syn_sink();
        let (mut ends, sender) = opened(sink.local_addr().unwrap().as_socket().unwrap());
        ends.conn.endpoint.up.store(false, Ordering::Release);
        let mut buf = vec![0u8; 4096];
        submit_read(&mut ends, &mut buf);
        let (op, _) = slice_back(&mut ends, PROMPT).expect("the slice was not handed back");
        assert_eq!(op.result(), Err(ErrorKind::RouteLost));
        finish(ends, sender);
    }
}
