//! One initiator-side data connection, driven by the worker that owns it
//! through its [`Backend`]: no thread of its own, no lock, no allocation
//! per slice.
//!
//! ```text
//! worker ─post─▶ queue[EXPRESS|BULK] ─batch─▶ sendmsg ──wire──▶ target
//!                                      │ wire (at most `window` bytes, 64 slices)
//! worker ◀─done── answered and sent ◀──┴── recv ◀──wire── target
//! ```
//! The worker queues a slice ([`Link::post`]); a HIGH one goes to the
//! express queue, sent before anything still in the bulk queue. When the
//! connection is up and its wire window has room (and, for bulk, the
//! rail's [`BulkCap`] while HIGH flows), the queued slices leave as one
//! batch: the peer's pending fences, then each slice's request
//! header and, for a WRITE, its payload straight from the caller's memory,
//! all in one `sendmsg`. Responses land in a small staging buffer; a READ's
//! payload is copied out of it as far as it arrived there, and the rest is
//! received straight into its destination. A slice completes (into
//! [`Link::done`]) once its response is in **and** its batch has left the
//! caller's memory, in wire order.
//!
//! **Lifetimes.** When the socket fails, a slice on it is aborted, or the
//! rail's link goes down, the connection is torn down: `SO_LINGER {on,0}`
//! (the kernel discards what it still had queued: no retransmission lands
//! later over a re-posted slice), `shutdown`, and a cancel of every
//! operation on the socket. Its slices complete only once every one of
//! those operations has its completion and the socket is closed: the
//! kernel touches none of their buffers again. A slice still queued was
//! never sent and completes at once.
//!
//! **Fencing.** A connection torn down with a WRITE on it is added to the
//! peer's [`PeerFences`]; every connection to the peer sends a fence for
//! it ahead of its next slice, so bytes of that WRITE still queued in the
//! target's socket cannot land after its failure reached the application,
//! nor over a re-posted copy (which goes to the same peer). A new socket
//! sends again the fences its predecessor sent, unless it saw them served.
//! A target that tells a connection it was fenced (by a connection that
//! claims this session, never this engine's own: it closes a connection
//! before fencing it) gets it torn down, its slices `Unreachable`, with a
//! line that says so: the target process is alive.
//!
//! **Opening.** The socket connects asynchronously, then runs the data
//! handshake ([`Opening`]) over the same queue, all by one deadline
//! (`connect_timeout`), cut at once when the link goes down. A target with
//! no room says [`BUSY`]: the slices wait (pausing 5 ms, doubling up to
//! 200 ms) until their patience runs out (`Timeout`). Any other failure to
//! open completes every queued slice with its kind (they move to a sibling
//! rail or fail). A connection idle for [`RECONNECT_IDLE`] is replaced
//! before its next slice, so a target evicting idle connections never
//! races a request.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tent_rings::{ErrorKind, Opcode};

use super::backend::{Backend, SockOp};
use super::cap::BulkCap;
use super::fence::{PEER_FENCES_MAX, PeerFences};
use super::frame::{BUSY, Fence, Ident, REQUEST_LEN, RESPONSE_LEN, Reply, Request};
use super::handshake::{Opening, Refused, Step};
use super::io;
use super::op::{BULK, BYSTANDER, EXPRESS, Endpoint, Op, Options, RECONNECT_IDLE, next_conn_id};

/// Slices in one send batch, at most.
const BATCH_MAX: usize = 32;
/// Most slices on a connection's wire at once, however small: what the
/// target queues answers for before it stops reading (its `TX_MAX`).
const WIRE_MAX: usize = 64;
/// iovecs of one batch: its fences, then a header and a payload per slice.
const IOV_MAX: usize = PEER_FENCES_MAX + 2 * BATCH_MAX;
/// Headers of one batch.
const HEADERS_MAX: usize = PEER_FENCES_MAX + BATCH_MAX;
/// The staging buffer responses land in.
const STAGE: usize = 16 * 1024;
/// A READ this large has its payload received straight into its
/// destination: the staging receive ahead of its response asks for the
/// header alone.
const DIRECT_MIN: u64 = 8 * 1024;
/// First and longest pause between tries at a busy target.
const BUSY_PAUSE_MIN: Duration = Duration::from_millis(5);
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(200);
/// How long a WRITE's response may precede the end of its batch's send.
/// An honest target answers only after reading the whole payload, so the
/// send's completion is microseconds away; past this the target answered
/// early: a protocol violation, and the connection is torn down.
const EARLY_RESPONSE_GRACE: u64 = 1_000_000_000;
/// Handshake bytes read at most at once (a hello; a proof is shorter).
const HANDSHAKE_MAX: usize = Opening::MAX_WANT;

/// What an operation's tag says besides its link.
const CONNECT: u64 = 1;
const SEND: u64 = 2;
const RECV: u64 = 3;

/// A link's tag for operation `what` on socket generation `gen`.
pub(super) fn tag(id: u32, gen_: u32, what: u64) -> u64 {
    (u64::from(id) << 32) | (u64::from(gen_ & 0x00ff_ffff) << 8) | what
}

/// The link id a tag names.
pub(super) fn tag_link(tag: u64) -> u32 {
    (tag >> 32) as u32
}

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No socket.
    Idle,
    /// Its connect is out.
    Connecting,
    /// Connected; the handshake runs.
    Opening,
    /// Carrying slices.
    Ready,
    /// The target was busy: no socket until then (monotonic ns).
    Backoff { until: u64 },
    /// Torn down; waiting for its operations' last completions.
    Closing,
}

/// Why the responses stopped being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The target broke the framing.
    Violation(&'static str),
    /// The target says another connection of this session fenced this one.
    Fenced,
}

/// What the log says when a target tells a connection it was fenced.
const FENCED_BY_A_COPY: &str = "tcp: the target closed a data connection because another connection claiming this engine's session fenced it (a copy of this session: a forked process, or a peer that read it off the wire without a shared secret?); the target process is alive";

/// What a teardown completes the slices on the wire with.
#[derive(Debug, Clone, Copy)]
struct Cause {
    kind: ErrorKind,
    /// Reset to stop another task's slice: the others come back
    /// [`BYSTANDER`] (re-posted, no fault).
    bystanders: bool,
    /// The socket failed while opening: what the queued slices get.
    opening: bool,
    /// Torn down by this side with nobody waiting on it (every queued
    /// slice was aborted): the queue is left alone.
    quiet: bool,
}

/// What a link needs from its worker for one step.
pub(super) struct Cx<'a> {
    pub(super) be: &'a mut Backend,
    pub(super) now: u64,
    /// The transport is stopping: slices complete `Shutdown`.
    pub(super) stopping: bool,
}

/// One connection (see the module docs).
pub(super) struct Link {
    id: u32,
    endpoint: Arc<Endpoint>,
    opts: Arc<Options>,
    fences: Arc<PeerFences>,
    /// The target's address as a `sockaddr` (connect names it).
    remote: socket2::SockAddr,
    state: State,
    sock: Option<socket2::Socket>,
    /// Bumped per socket; operation tags carry it.
    gen_: u32,
    /// Operations outstanding on the socket, by kind.
    out_connect: bool,
    out_send: bool,
    out_recv: bool,
    /// Slices to send: `[EXPRESS]` (HIGH, first) and `[BULK]`.
    queue: [VecDeque<Op>; 2],
    /// Slices in a batch sent or being sent, in wire order.
    wire: VecDeque<Op>,
    /// Of `wire`, how many from the front had their batch leave memory...
    sent: usize,
    /// ...and how many from the front were answered.
    answered: usize,
    /// The slice at `wire[answered]` is a READ whose payload is landing:
    /// bytes of it in place so far.
    landing: Option<u64>,
    /// Most bytes on the wire at once (`max_inflight_per_connection`
    /// full slices); past [`WIRE_MAX`] slices, small ones wait too.
    window: u64,
    /// Bytes of the slices on the wire.
    wire_bytes: u64,
    /// Of them, bulk (MEDIUM and LOW) bytes, also counted in `cap`.
    bulk_bytes: u64,
    /// The bulk every connection of this worker to the rail keeps on the
    /// wire while HIGH flows there.
    cap: Arc<BulkCap>,
    /// Completed slices, for the worker.
    pub(super) done: VecDeque<Op>,
    seq: u32,
    conn_id: u32,
    cause: Cause,
    // The send in progress.
    headers: Box<[[u8; REQUEST_LEN]]>,
    iov: Box<[libc::iovec]>,
    msg: Box<libc::msghdr>,
    /// `iov[iov_at..iov_end]` is what is left to send.
    iov_at: usize,
    iov_end: usize,
    /// Slices in the batch being sent (the back of `wire`)...
    batch: usize,
    /// ...how many of them have left memory whole...
    marked: usize,
    /// ...and for each, the iovec index its last byte is before.
    ends: [usize; BATCH_MAX],
    // The receive side.
    stage: Box<[u8]>,
    stage_lo: usize,
    stage_hi: usize,
    // The handshake.
    opening: Option<Opening>,
    hs_in: [u8; HANDSHAKE_MAX],
    hs_have: usize,
    hs_out: [u8; HANDSHAKE_MAX],
    deadline: u64,
    // Fences: the peer's generation sent so far, and where it stood when
    // this socket opened.
    fences_seen: u64,
    fences_from: u64,
    /// When the socket last sent a slice or opened (idle check).
    last_sent_ns: u64,
    pause: Duration,
    /// The open failure last logged (an `ErrorKind` code; 0: none since
    /// the last success).
    logged: u16,
    /// A WRITE was answered while its batch was still being sent: since
    /// when (monotonic ns; 0: none).
    early_ns: u64,
}

// SAFETY: the raw pointers in `iov` and `msg` point into the link's own boxes or into memory the engine lends for a slice's life; the link moves between threads only whole (built by the worker, dropped by whoever drops the transport), never shared.
unsafe impl Send for Link {}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("id", &self.id)
            .field("remote", &self.endpoint.remote)
            .field("state", &self.state)
            .field("wire", &self.wire.len())
            .finish_non_exhaustive()
    }
}

fn empty_iov() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

impl Link {
    /// A connection (not connected yet) to `endpoint`: `queue` slices may
    /// wait on it (the worker's credits), `window` bytes of them be on the
    /// wire (at least one slice, at most [`WIRE_MAX`]), its bulk within
    /// `cap` too.
    pub(super) fn new(
        id: u32,
        endpoint: Arc<Endpoint>,
        opts: Arc<Options>,
        fences: Arc<PeerFences>,
        cap: Arc<BulkCap>,
        queue: usize,
        window: u64,
    ) -> Box<Link> {
        let remote = socket2::SockAddr::from(endpoint.remote);
        // Every fence the peer still keeps is sent ahead of its first
        // slice (a connection torn down before this one was made may still
        // have bytes queued at the target).
        let fences_seen = fences.generation().saturating_sub(PEER_FENCES_MAX as u64);
        Box::new(Link {
            id,
            endpoint,
            opts,
            fences,
            remote,
            state: State::Idle,
            sock: None,
            gen_: 0,
            out_connect: false,
            out_send: false,
            out_recv: false,
            queue: [
                VecDeque::with_capacity(queue),
                VecDeque::with_capacity(queue),
            ],
            wire: VecDeque::with_capacity(WIRE_MAX),
            sent: 0,
            answered: 0,
            landing: None,
            window,
            wire_bytes: 0,
            bulk_bytes: 0,
            cap,
            done: VecDeque::with_capacity(queue.max(WIRE_MAX)),
            seq: 0,
            conn_id: 0,
            cause: Cause {
                kind: ErrorKind::Unreachable,
                bystanders: false,
                opening: false,
                quiet: false,
            },
            headers: vec![[0u8; REQUEST_LEN]; HEADERS_MAX].into_boxed_slice(),
            iov: vec![empty_iov(); IOV_MAX].into_boxed_slice(),
            // SAFETY: a zeroed msghdr is a valid "no name, no control" message.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            iov_at: 0,
            iov_end: 0,
            batch: 0,
            marked: 0,
            ends: [0; BATCH_MAX],
            stage: Box::default(),
            stage_lo: 0,
            stage_hi: 0,
            opening: None,
            hs_in: [0; HANDSHAKE_MAX],
            hs_have: 0,
            hs_out: [0; HANDSHAKE_MAX],
            deadline: 0,
            fences_seen,
            fences_from: fences_seen,
            last_sent_ns: 0,
            pause: Duration::ZERO,
            logged: 0,
            early_ns: 0,
        })
    }

    /// Slices on the wire (sent, or in the batch being sent).
    #[inline]
    pub(super) fn on_wire(&self) -> usize {
        self.wire.len()
    }

    /// How a HIGH slice ranks it at `now`: its slices on the wire when its
    /// socket is up and would send at once, else [`usize::MAX`] (opening,
    /// closing, down, or idle long enough to be replaced before sending:
    /// the slice would wait for a connect and a handshake).
    #[inline]
    pub(super) fn high_rank(&self, now: u64) -> usize {
        if self.state == State::Ready && !self.stale(now) {
            self.wire.len()
        } else {
            usize::MAX
        }
    }

    /// Idle, with nothing on the wire, past [`RECONNECT_IDLE`] since its
    /// last send (or its open) at `now`: the target may close it any time,
    /// so it is replaced before it sends again.
    #[inline]
    fn stale(&self, now: u64) -> bool {
        self.wire.is_empty()
            && now.saturating_sub(self.last_sent_ns) > RECONNECT_IDLE.as_nanos() as u64
    }

    /// Does it need the worker's turns: slices queued, on the wire or
    /// done, or a socket opening, closing or pausing? (A connection up
    /// and idle keeps a receive armed to notice the target closing it;
    /// that completion finds it without a turn.)
    pub(super) fn busy(&self) -> bool {
        !self.queue[EXPRESS].is_empty()
            || !self.queue[BULK].is_empty()
            || !self.wire.is_empty()
            || !self.done.is_empty()
            || !matches!(self.state, State::Idle | State::Ready)
    }

    /// Is any operation outstanding on its socket?
    pub(super) fn outstanding(&self) -> bool {
        self.out_connect || self.out_send || self.out_recv
    }

    fn link_up(&self) -> bool {
        // Relaxed: a hint read every turn; a slice sent on a rail that just
        // went down fails and is re-posted.
        self.endpoint.up.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn fd(&self) -> RawFd {
        self.sock.as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    fn tag(&self, what: u64) -> u64 {
        tag(self.id, self.gen_, what)
    }

    /// Queue `op` in `class`; `Err` gives it back when the queue is full.
    #[inline]
    pub(super) fn post(&mut self, op: Op, class: usize) -> Result<(), Op> {
        let q = &mut self.queue[class];
        if q.len() == q.capacity() {
            return Err(op);
        }
        q.push_back(op);
        Ok(())
    }

    /// Complete `op` with `status` (it never went on the wire, or its
    /// socket is closed).
    fn finish(&mut self, mut op: Op, status: u16) {
        if !op.is_urgent() {
            // Queued bulk leaving unsent no longer waits for the cap.
            self.cap.gone(op.posted_ns);
        }
        op.status = status;
        self.done.push_back(op);
    }

    /// Complete every queued slice with `kind` (never sent).
    fn fail_queued(&mut self, kind: ErrorKind) {
        for c in [EXPRESS, BULK] {
            while let Some(op) = self.queue[c].pop_front() {
                self.finish(op, kind.code());
            }
        }
    }

    /// The worker aborted `token` with `kind`: its queued slices complete
    /// now; one on the wire resets the connection (the others on it come
    /// back [`BYSTANDER`]).
    pub(super) fn abort_token(&mut self, token: u64, kind: ErrorKind, cx: &mut Cx<'_>) {
        for c in [EXPRESS, BULK] {
            let mut i = 0;
            while i < self.queue[c].len() {
                if self.queue[c][i].token == token {
                    let op = self.queue[c].remove(i).expect("index in range");
                    self.finish(op, kind.code());
                } else {
                    i += 1;
                }
            }
        }
        if self.wire.iter().any(|op| op.token == token) {
            self.teardown(cx, ErrorKind::Canceled, true);
        }
        if self.queue[EXPRESS].is_empty()
            && self.queue[BULK].is_empty()
            && matches!(self.state, State::Connecting | State::Opening)
        {
            // Nobody waits for the connect any more.
            self.teardown(cx, ErrorKind::Canceled, false);
            self.cause.quiet = true;
        }
    }

    /// Look at the link: its rail's state, deadlines, and whether a
    /// connect or a batch can start. Called every worker turn while busy.
    pub(super) fn tick(&mut self, cx: &mut Cx<'_>) {
        if cx.stopping {
            self.teardown(cx, ErrorKind::Shutdown, false);
            if self.sock.is_none() {
                self.fail_queued(ErrorKind::Shutdown);
            }
            return;
        }
        if !self.link_up() {
            self.teardown(cx, ErrorKind::RouteLost, false);
            if self.sock.is_none() {
                // Never sent: safe for the worker to re-post elsewhere.
                self.fail_queued(ErrorKind::RouteLost);
            }
            return;
        }
        if self.early_ns != 0 && cx.now.saturating_sub(self.early_ns) > EARLY_RESPONSE_GRACE {
            crate::lograte::warn_limited!((self.endpoint.remote, "early"), remote = %self.endpoint.remote, "tcp: a WRITE answered before its payload was sent; closing the connection");
            self.teardown(cx, ErrorKind::Unreachable, false);
            return;
        }
        match self.state {
            State::Connecting | State::Opening if cx.now >= self.deadline => {
                self.note(ErrorKind::Timeout, &"connect and handshake took too long");
                self.teardown(cx, ErrorKind::Timeout, false);
            }
            State::Backoff { until } => {
                self.expire_patience(cx.now);
                if cx.now >= until {
                    self.state = State::Idle;
                }
            }
            _ => {}
        }
        self.pump(cx);
    }

    /// Start what can start: a connect for queued slices, or a batch.
    fn pump(&mut self, cx: &mut Cx<'_>) {
        let queued = !self.queue[EXPRESS].is_empty() || !self.queue[BULK].is_empty();
        if !queued {
            return;
        }
        // Idle since its last send, at the moment it would send again (a
        // slice may have waited in the queue for the bulk cap).
        if self.state == State::Ready && !self.out_send && self.stale(cx.now) {
            self.retire(cx);
        }
        match self.state {
            State::Idle => self.connect(cx),
            State::Ready => self.send_batch(cx),
            _ => {}
        }
    }

    /// Complete queued slices whose patience with a busy target ran out.
    fn expire_patience(&mut self, now: u64) {
        let patience = self.opts.patience.as_nanos() as u64;
        for c in [EXPRESS, BULK] {
            let mut i = 0;
            while i < self.queue[c].len() {
                if now >= self.queue[c][i].posted_ns.saturating_add(patience) {
                    let op = self.queue[c].remove(i).expect("index in range");
                    self.finish(op, ErrorKind::Timeout.code());
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Log an open failure once per cause (until an open succeeds).
    fn note(&mut self, kind: ErrorKind, why: &dyn std::fmt::Display) {
        if kind != ErrorKind::Shutdown
            && std::mem::replace(&mut self.logged, kind.code()) != kind.code()
        {
            tracing::warn!(remote = %self.endpoint.remote, %kind, error = %why, "tcp data connection cannot open");
        }
    }

    /// Open a socket and send its connect.
    fn connect(&mut self, cx: &mut Cx<'_>) {
        let ep = &self.endpoint;
        let sock = match open_socket(ep.local_ip, ep.remote) {
            Ok(s) => s,
            Err(e) => {
                let kind = io::kind_of(&e);
                self.note(kind, &e);
                self.fail_queued(kind);
                return;
            }
        };
        self.sock = Some(sock);
        self.gen_ = self.gen_.wrapping_add(1);
        self.state = State::Connecting;
        self.deadline = cx
            .now
            .saturating_add(self.opts.connect_timeout.as_nanos() as u64);
        self.cause = Cause {
            kind: ErrorKind::Unreachable,
            bystanders: false,
            opening: false,
            quiet: false,
        };
        let op = SockOp::Connect {
            fd: self.fd(),
            addr: self.remote.as_ptr().cast(),
            len: self.remote.len(),
        };
        // SAFETY: `remote` lives in this boxed link, which outlives every operation on its socket (a link is dropped only with none outstanding).
        if unsafe { cx.be.push(self.tag(CONNECT), op) }.is_ok() {
            self.out_connect = true;
        } else {
            self.teardown(cx, ErrorKind::SqFull, false);
        }
    }

    /// An operation of this link completed with `res`.
    pub(super) fn on_completion(&mut self, tag: u64, res: i32, cx: &mut Cx<'_>) {
        let what = tag & 0xff;
        debug_assert_eq!(tag, self.tag(what), "a completion of another socket");
        match what {
            CONNECT => {
                self.out_connect = false;
                self.connected(res, cx);
            }
            // EAGAIN: nothing moved (io_uring hands a socket operation
            // that polled ready too often without progress to its
            // blocking pool, which on a non-blocking socket answers
            // that): the same operation is posted again.
            SEND if res == -libc::EAGAIN => {
                self.out_send = false;
                if self.state != State::Closing {
                    self.push_send(cx);
                }
            }
            SEND => {
                self.out_send = false;
                self.sent_bytes(res, cx);
            }
            RECV if res == -libc::EAGAIN => {
                self.out_recv = false;
                match self.state {
                    State::Opening => self.recv_handshake(cx),
                    State::Ready => self.arm_recv(cx),
                    _ => {}
                }
            }
            RECV => {
                self.out_recv = false;
                self.received(res, cx);
            }
            _ => {}
        }
        if self.state == State::Closing {
            self.try_close(cx);
        }
    }

    /// The connect finished: start the handshake.
    fn connected(&mut self, res: i32, cx: &mut Cx<'_>) {
        if self.state != State::Connecting {
            return;
        }
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            let kind = io::kind_of(&e);
            self.note(kind, &e);
            self.teardown(cx, kind, false);
            return;
        }
        let sock = self.sock.as_ref().expect("a socket while connecting");
        io::tune(sock.into(), self.opts.user_timeout_ms);
        let ident = Ident {
            session: self.opts.session,
            conn: next_conn_id(),
        };
        let (opening, hello) = Opening::new(self.opts.secret.clone(), ident);
        self.conn_id = ident.conn;
        self.opening = Some(opening);
        self.state = State::Opening;
        self.hs_out[..hello.len()].copy_from_slice(&hello);
        self.send_handshake(hello.len(), cx);
        self.hs_have = 0;
        self.recv_handshake(cx);
    }

    /// Send `hs_out[..len]`.
    fn send_handshake(&mut self, len: usize, cx: &mut Cx<'_>) {
        self.iov[0] = libc::iovec {
            iov_base: self.hs_out.as_mut_ptr().cast(),
            iov_len: len,
        };
        self.iov_at = 0;
        self.iov_end = 1;
        self.batch = 0;
        self.marked = 0;
        self.push_send(cx);
    }

    /// Receive what the handshake wants next.
    fn recv_handshake(&mut self, cx: &mut Cx<'_>) {
        let want = self.opening.as_ref().map_or(0, Opening::want);
        if want == 0 || want > HANDSHAKE_MAX || self.hs_have >= want {
            return;
        }
        let op = SockOp::Recv {
            fd: self.fd(),
            // SAFETY: `hs_have < want <= HANDSHAKE_MAX`: inside `hs_in`.
            buf: unsafe { self.hs_in.as_mut_ptr().add(self.hs_have) },
            len: (want - self.hs_have) as u32,
        };
        // SAFETY: `hs_in` lives in this boxed link, which outlives its operations.
        if unsafe { cx.be.push(self.tag(RECV), op) }.is_ok() {
            self.out_recv = true;
        } else {
            self.teardown(cx, ErrorKind::SqFull, false);
        }
    }

    /// Handshake bytes arrived (or the socket failed while opening).
    fn handshake_bytes(&mut self, res: i32, cx: &mut Cx<'_>) {
        let Some(opening) = self.opening.as_mut() else {
            return;
        };
        if res <= 0 {
            let r = opening.recv_failed(recv_error(res));
            self.refused(r, cx);
            return;
        }
        self.hs_have += res as usize;
        let want = opening.want();
        if self.hs_have < want {
            self.recv_handshake(cx);
            return;
        }
        let got = self.hs_in;
        let step = opening.on_bytes(&got[..want]);
        let step = match step {
            Ok(Step::Prove) => Ok((Step::Prove, Some(opening.proof(self.endpoint.remote)))),
            Ok(s) => Ok((s, None)),
            Err(r) => Err(r),
        };
        match step {
            Err(r) => self.refused(r, cx),
            Ok((Step::Read, _)) => {
                self.hs_have = 0;
                self.recv_handshake(cx);
            }
            Ok((Step::Prove, proof)) => {
                let proof = proof.expect("a proof is made for Prove");
                self.hs_have = 0;
                self.hs_out[..proof.len()].copy_from_slice(&proof);
                if self.out_send {
                    // The hello is still leaving: cannot happen with an
                    // honest target (it answers after reading it).
                    self.teardown(cx, ErrorKind::Unreachable, false);
                    return;
                }
                self.send_handshake(proof.len(), cx);
                self.recv_handshake(cx);
            }
            Ok((Step::Done, _)) => {
                self.opening = None;
                if self.out_send {
                    self.teardown(cx, ErrorKind::Unreachable, false);
                    return;
                }
                self.opened(cx);
            }
        }
    }

    /// The target refused the connection, or it failed while opening.
    fn refused(&mut self, r: Refused, cx: &mut Cx<'_>) {
        if r.kind != BUSY {
            self.note(r.kind, &r.why);
        }
        self.teardown(cx, r.kind, false);
    }

    /// The handshake is done: carry slices.
    fn opened(&mut self, cx: &mut Cx<'_>) {
        self.state = State::Ready;
        self.logged = 0;
        self.pause = Duration::ZERO;
        self.fences_from = self.fences_seen;
        if self.stage.is_empty() {
            self.stage = vec![0u8; STAGE].into_boxed_slice();
        }
        self.stage_lo = 0;
        self.stage_hi = 0;
        // A fresh socket is not idle, even while its slices wait (a bulk
        // cap beside HIGH): it is not retired before it carried one.
        self.last_sent_ns = self.last_sent_ns.max(cx.now);
        tracing::debug!(remote = %self.endpoint.remote, local = %self.endpoint.local_ip, conn = self.conn_id, "tcp data connection up");
        self.send_batch(cx);
        self.arm_recv(cx);
    }

    /// Put a batch on the wire: fences owed, then queued slices while the
    /// window has room, in one `sendmsg`.
    fn send_batch(&mut self, cx: &mut Cx<'_>) {
        if self.state != State::Ready || self.out_send {
            return;
        }
        let mut n_iov = 0;
        let mut n_hdr = 0;
        if self.fences.generation() != self.fences_seen {
            let mut owed = [0u32; PEER_FENCES_MAX];
            let (n, g) = self.fences.since(self.fences_seen, &mut owed);
            self.fences_seen = g;
            for &conn in &owed[..n] {
                self.headers[n_hdr] = Fence { conn }.encode();
                self.iov[n_iov] = libc::iovec {
                    iov_base: self.headers[n_hdr].as_mut_ptr().cast(),
                    iov_len: REQUEST_LEN,
                };
                n_hdr += 1;
                n_iov += 1;
            }
        }
        let mut batch = 0;
        while self.wire.len() < WIRE_MAX && batch < BATCH_MAX {
            let class = if self.queue[EXPRESS].is_empty() {
                BULK
            } else {
                EXPRESS
            };
            let Some(next) = self.queue[class].front() else {
                break;
            };
            // The first slice on an empty wire goes whatever its size.
            if !self.wire.is_empty() && self.wire_bytes.saturating_add(next.len) > self.window {
                break;
            }
            let bulk = !next.is_urgent();
            if bulk && !self.cap.admits(next.len, next.posted_ns, cx.now) {
                break;
            }
            let Some(mut op) = self.queue[class].pop_front() else {
                break;
            };
            self.wire_bytes = self.wire_bytes.saturating_add(op.len);
            if bulk {
                self.bulk_bytes = self.bulk_bytes.saturating_add(op.len);
                self.cap.sent(op.len, op.posted_ns);
            }
            self.seq = self.seq.wrapping_add(1);
            op.seq = self.seq;
            self.last_sent_ns = self.last_sent_ns.max(cx.now);
            self.headers[n_hdr] = Request {
                opcode: op.opcode(),
                seq: op.seq,
                addr: op.addr,
                len: op.len,
                key: op.key,
            }
            .encode();
            self.iov[n_iov] = libc::iovec {
                iov_base: self.headers[n_hdr].as_mut_ptr().cast(),
                iov_len: REQUEST_LEN,
            };
            n_hdr += 1;
            n_iov += 1;
            if op.opcode() == Opcode::Write && op.len > 0 {
                self.iov[n_iov] = libc::iovec {
                    iov_base: op.local as *mut libc::c_void,
                    iov_len: op.len as usize,
                };
                n_iov += 1;
            }
            self.wire.push_back(op);
            self.ends[batch] = n_iov;
            batch += 1;
        }
        if n_iov == 0 {
            return;
        }
        self.iov_at = 0;
        self.iov_end = n_iov;
        self.batch = batch;
        self.marked = 0;
        self.push_send(cx);
        if batch > 0 {
            self.arm_recv(cx);
        }
    }

    /// Send `iov[iov_at..iov_end]`.
    fn push_send(&mut self, cx: &mut Cx<'_>) {
        self.msg.msg_iov = self.iov[self.iov_at..].as_mut_ptr();
        self.msg.msg_iovlen = self.iov_end - self.iov_at;
        let op = SockOp::Send {
            fd: self.fd(),
            msg: &*self.msg,
        };
        // SAFETY: the message, its iovecs and headers live in this boxed link, which outlives its operations; the payloads are slices' memory, which the engine keeps alive until the slice completes, and a slice completes only after its batch's send did.
        if unsafe { cx.be.push(self.tag(SEND), op) }.is_ok() {
            self.out_send = true;
        } else {
            self.teardown(cx, ErrorKind::SqFull, false);
        }
    }

    /// A send took `res` bytes (or failed).
    fn sent_bytes(&mut self, res: i32, cx: &mut Cx<'_>) {
        if self.state == State::Closing {
            return;
        }
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            if self.state == State::Opening {
                let r = self.opening.as_ref().map(|o| o.send_failed(e));
                if let Some(r) = r {
                    self.refused(r, cx);
                }
            } else {
                self.teardown(cx, io::kind_of(&e), false);
            }
            return;
        }
        let mut left = res as usize;
        while left > 0 && self.iov_at < self.iov_end {
            let v = &mut self.iov[self.iov_at];
            if left >= v.iov_len {
                left -= v.iov_len;
                self.iov_at += 1;
            } else {
                v.iov_base = v.iov_base.wrapping_byte_add(left).cast();
                v.iov_len -= left;
                left = 0;
            }
        }
        // Each slice whose bytes all left its memory is sent: a short
        // send moves them one by one, so an answered slice completes
        // without waiting for the rest of its batch.
        while self.marked < self.batch && self.iov_at >= self.ends[self.marked] {
            self.marked += 1;
            self.sent += 1;
        }
        if self.answered <= self.sent {
            self.early_ns = 0;
        }
        self.complete_front();
        if self.iov_at < self.iov_end {
            self.push_send(cx);
            return;
        }
        if self.state != State::Ready {
            // A handshake message: the machine moves on its reply.
            return;
        }
        self.batch = 0;
        self.marked = 0;
        self.send_batch(cx);
    }

    /// Complete the slices at the front that were both sent and answered.
    fn complete_front(&mut self) {
        while self.sent > 0 && self.answered > 0 {
            let Some(op) = self.wire.pop_front() else {
                break;
            };
            self.wire_bytes = self.wire_bytes.saturating_sub(op.len);
            if !op.is_urgent() {
                self.bulk_bytes = self.bulk_bytes.saturating_sub(op.len);
                self.cap.left(op.len);
            }
            self.sent -= 1;
            self.answered -= 1;
            self.done.push_back(op);
        }
    }

    /// Receive what comes next: a READ's payload straight into place, else
    /// responses into the staging buffer (the header alone ahead of a large
    /// READ's, so its payload lands in place).
    ///
    /// Armed while the connection is up, even with nothing on the wire: a
    /// target that closes an idle connection (eviction, its idle timeout,
    /// a restart) is seen at once and the next slice connects afresh
    /// instead of failing on a dead socket; bytes that arrive with nothing
    /// outstanding are a violation.
    fn arm_recv(&mut self, cx: &mut Cx<'_>) {
        if self.out_recv || self.state != State::Ready {
            return;
        }
        let (buf, len) = match self.landing {
            Some(got) => {
                let op = &self.wire[self.answered];
                let left = (op.len - got).min(u32::MAX as u64) as u32;
                ((op.local + got) as *mut u8, left)
            }
            None => {
                if self.stage_lo == self.stage_hi {
                    self.stage_lo = 0;
                    self.stage_hi = 0;
                } else if self.stage_hi + RESPONSE_LEN > STAGE {
                    self.stage.copy_within(self.stage_lo..self.stage_hi, 0);
                    self.stage_hi -= self.stage_lo;
                    self.stage_lo = 0;
                }
                let next = self.wire.get(self.answered).copied();
                let have = self.stage_hi - self.stage_lo;
                let len = if next.is_some_and(|n| n.opcode() == Opcode::Read && n.len >= DIRECT_MIN)
                {
                    RESPONSE_LEN.saturating_sub(have).max(1)
                } else {
                    STAGE - self.stage_hi
                };
                (
                    // SAFETY: `stage_hi + len <= STAGE`.
                    unsafe { self.stage.as_mut_ptr().add(self.stage_hi) },
                    len as u32,
                )
            }
        };
        let op = SockOp::Recv {
            fd: self.fd(),
            buf,
            len,
        };
        // SAFETY: the staging buffer lives in this boxed link; a READ's destination is the slice's memory, which the engine keeps alive until the slice completes, which happens only after this receive's completion.
        if unsafe { cx.be.push(self.tag(RECV), op) }.is_ok() {
            self.out_recv = true;
        } else {
            self.teardown(cx, ErrorKind::SqFull, false);
        }
    }

    /// A receive completed with `res`.
    fn received(&mut self, res: i32, cx: &mut Cx<'_>) {
        match self.state {
            State::Opening => return self.handshake_bytes(res, cx),
            State::Ready => {}
            _ => return,
        }
        if res <= 0 {
            let e = recv_error(res);
            tracing::debug!(remote = %self.endpoint.remote, error = %e, "tcp data connection failed");
            self.teardown(cx, io::kind_of(&e), false);
            return;
        }
        let n = res as u64;
        if let Some(got) = self.landing {
            let got = got + n;
            let len = self.wire[self.answered].len;
            if got < len {
                self.landing = Some(got);
            } else {
                self.landing = None;
                self.answered += 1;
                self.complete_front();
            }
        } else {
            self.stage_hi += n as usize;
            match self.parse() {
                Ok(()) => {}
                Err(Stop::Violation(why)) => {
                    crate::lograte::warn_limited!((self.endpoint.remote, why), remote = %self.endpoint.remote, why, "tcp: protocol violation by the peer (a bad response); closing the connection");
                    // What was answered well before the violation stands.
                    self.complete_front();
                    self.teardown(cx, ErrorKind::Unreachable, false);
                    return;
                }
                Err(Stop::Fenced) => {
                    // Not this engine's own fence: it closes a connection
                    // before it fences it, and never reads this.
                    crate::lograte::warn_limited!((self.endpoint.remote, "fenced"), remote = %self.endpoint.remote, conn = self.conn_id, slices = self.wire.len() - self.answered, "{FENCED_BY_A_COPY}; its slices fail Unreachable");
                    self.complete_front();
                    self.teardown(cx, ErrorKind::Unreachable, false);
                    return;
                }
            }
            // A WRITE answered while its payload is still being sent: an
            // honest target reads the payload whole first.
            let early = (self.sent..self.answered.min(self.wire.len()))
                .any(|i| self.wire[i].opcode() == Opcode::Write);
            if early && self.early_ns == 0 {
                self.early_ns = cx.now.max(1);
            }
            self.complete_front();
        }
        self.arm_recv(cx);
    }

    /// Match the responses in the staging buffer to the slices on the wire,
    /// up to a [`Fenced`](super::frame::Fenced) notice (what follows it is
    /// not read).
    fn parse(&mut self) -> Result<(), Stop> {
        while self.landing.is_none() && self.stage_hi - self.stage_lo >= RESPONSE_LEN {
            let mut h = [0u8; RESPONSE_LEN];
            h.copy_from_slice(&self.stage[self.stage_lo..self.stage_lo + RESPONSE_LEN]);
            let resp = match Reply::decode(&h) {
                Ok(Reply::Response(r)) => r,
                Ok(Reply::Fenced(f)) if f.conn == self.conn_id => return Err(Stop::Fenced),
                Ok(Reply::Fenced(_)) => {
                    return Err(Stop::Violation("a fenced notice for another connection"));
                }
                Err(_) => return Err(Stop::Violation("malformed response")),
            };
            let Some(op) = self.wire.get_mut(self.answered) else {
                return Err(Stop::Violation("response with nothing outstanding"));
            };
            if resp.seq != op.seq {
                return Err(Stop::Violation("response out of order"));
            }
            self.stage_lo += RESPONSE_LEN;
            match resp.status {
                Err(kind) => op.status = kind.code(),
                Ok(()) if resp.len != op.len => return Err(Stop::Violation("wrong length")),
                Ok(()) => op.status = 0,
            }
            if resp.status.is_ok() && op.opcode() == Opcode::Read && op.len > 0 {
                let here = ((self.stage_hi - self.stage_lo) as u64).min(op.len);
                // SAFETY: a READ's local range was checked against its registration by the engine, which keeps it alive until this slice completes; `here` bytes are in the staging buffer past `stage_lo`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.stage.as_ptr().add(self.stage_lo),
                        op.local as *mut u8,
                        here as usize,
                    );
                }
                self.stage_lo += here as usize;
                if here < op.len {
                    self.landing = Some(here);
                    if self.stage_lo != self.stage_hi {
                        return Err(Stop::Violation("payload bytes past the staging buffer"));
                    }
                    break;
                }
            }
            self.answered += 1;
        }
        Ok(())
    }

    /// Let an idle connection go: closed at once when nothing is
    /// outstanding on it, else torn down (its armed receive cancelled).
    fn retire(&mut self, cx: &mut Cx<'_>) {
        if self.outstanding() {
            self.teardown(cx, ErrorKind::Shutdown, false);
        } else {
            self.close_quietly(cx);
        }
    }

    /// Close an idle socket (nothing outstanding, nothing on it): the
    /// target sees a plain FIN.
    fn close_quietly(&mut self, cx: &mut Cx<'_>) {
        if let Some(s) = self.sock.take() {
            cx.be.forget(s.as_raw_fd());
        }
        self.reset_socket_state();
    }

    /// Tear the socket down (see the module docs); its slices complete once
    /// its last operation has. Torn down while opening, what is queued then
    /// waits (`BUSY`) or fails with `kind`.
    fn teardown(&mut self, cx: &mut Cx<'_>, kind: ErrorKind, bystanders: bool) {
        if self.state == State::Closing {
            self.cause.bystanders |= bystanders;
            return;
        }
        let Some(sock) = self.sock.as_ref() else {
            return;
        };
        let _ = sock.set_linger(Some(Duration::ZERO));
        let _ = sock.shutdown(std::net::Shutdown::Both);
        let fd = sock.as_raw_fd();
        if self.outstanding() {
            cx.be.cancel(fd);
        }
        self.cause = Cause {
            kind,
            bystanders,
            opening: matches!(self.state, State::Connecting | State::Opening),
            quiet: false,
        };
        self.state = State::Closing;
        self.try_close(cx);
    }

    /// A closing socket's last operation is back: close it, then complete
    /// what was on it.
    fn try_close(&mut self, cx: &mut Cx<'_>) {
        if self.state != State::Closing || self.outstanding() {
            return;
        }
        if let Some(s) = self.sock.take() {
            cx.be.forget(s.as_raw_fd());
            drop(s);
        }
        let cause = self.cause;
        let mut wrote = false;
        self.wire_bytes = 0;
        self.cap.left(std::mem::take(&mut self.bulk_bytes));
        if let Some(front) = self.queue[BULK].front() {
            // Silent until the connection is back: newer bulk need not wait.
            self.cap.gone(front.posted_ns);
        }
        while let Some(op) = self.wire.pop_front() {
            wrote |= op.opcode() == Opcode::Write;
            let status = self.failure_status(cause, cx.stopping);
            self.finish(op, status);
        }
        if wrote {
            // Bytes of those WRITEs may sit in the target's socket: every
            // connection to the peer fences this one before its next slice.
            self.fences.add(self.conn_id);
        }
        if self.fences_seen != self.fences_from {
            // Fences sent on it may not have been served: send them again.
            self.fences_seen = self.fences_from;
        }
        self.reset_socket_state();
        if cause.opening {
            if cause.kind == BUSY && !cx.stopping {
                // Back-pressure: the slices wait, nothing failed.
                self.pause = (self.pause * 2).clamp(BUSY_PAUSE_MIN, BUSY_PAUSE_MAX);
                self.state = State::Backoff {
                    until: cx.now.saturating_add(self.pause.as_nanos() as u64),
                };
                self.expire_patience(cx.now);
            } else if !cause.quiet {
                // Whatever the target said (any kind it names), the queued
                // slices end with it: nothing reconnects for them in a loop.
                let kind = if cx.stopping {
                    ErrorKind::Shutdown
                } else if !self.link_up() {
                    ErrorKind::RouteLost
                } else {
                    cause.kind
                };
                self.fail_queued(kind);
            }
        }
    }

    /// The status a slice on the wire gets from a teardown: `Shutdown` when
    /// stopping, `RouteLost` when the link is down, [`BYSTANDER`] when the
    /// socket was reset for another task's slice, else the cause. (The
    /// worker gives an aborted token's slices its abort kind.)
    fn failure_status(&self, cause: Cause, stopping: bool) -> u16 {
        if stopping {
            ErrorKind::Shutdown.code()
        } else if !self.link_up() {
            ErrorKind::RouteLost.code()
        } else if cause.bystanders {
            BYSTANDER
        } else {
            cause.kind.code()
        }
    }

    /// Back to no socket.
    fn reset_socket_state(&mut self) {
        self.state = State::Idle;
        self.sent = 0;
        self.answered = 0;
        self.landing = None;
        self.batch = 0;
        self.marked = 0;
        self.iov_at = 0;
        self.iov_end = 0;
        self.stage_lo = 0;
        self.stage_hi = 0;
        self.opening = None;
        self.hs_have = 0;
        self.conn_id = 0;
        self.early_ns = 0;
    }

    /// Drop-time: close the socket, cancelling what is outstanding; true
    /// when something still is (the caller reaps until it is not).
    pub(super) fn shut(&mut self, cx: &mut Cx<'_>) -> bool {
        self.teardown(cx, ErrorKind::Shutdown, false);
        self.close_idle(cx);
        self.outstanding()
    }

    /// Let the socket go if nothing is in hand on it (see `retire`).
    pub(super) fn close_idle(&mut self, cx: &mut Cx<'_>) {
        if self.state != State::Closing && !self.busy() && self.sock.is_some() {
            self.retire(cx);
        }
    }
}

/// What a receive that came back `res <= 0` means: the peer closed (0),
/// or the socket's error.
fn recv_error(res: i32) -> std::io::Error {
    if res == 0 {
        std::io::Error::from(std::io::ErrorKind::UnexpectedEof)
    } else {
        std::io::Error::from_raw_os_error(-res)
    }
}

/// A non-blocking TCP socket bound to `local` (unless unspecified), for
/// `remote`.
fn open_socket(local: std::net::IpAddr, remote: SocketAddr) -> std::io::Result<socket2::Socket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(remote),
        socket2::Type::STREAM.nonblocking().cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    if !local.is_unspecified() {
        sock.bind(&SocketAddr::new(local, 0).into())?;
    }
    Ok(sock)
}

#[cfg(test)]
impl Link {
    /// Is its socket up and carrying slices?
    pub(super) fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// Its rail (tests flip the link state).
    pub(super) fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// Who its hello names it (connection id 0 before one).
    pub(super) fn ident(&self) -> Ident {
        Ident {
            session: self.opts.session,
            conn: self.conn_id,
        }
    }
}
