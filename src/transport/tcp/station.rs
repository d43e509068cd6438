//! The serving threads of the TCP target: a small fixed set of them (the
//! `transports/tcp/serving_threads` key), each driving any number of
//! connections on its own socket queue ([`Backend`]: an io_uring, or
//! epoll), handed to it by the accept threads.
//!
//! Each connection ([`Conn`]) is a state machine with two halves that move
//! on independently:
//! - the receiving half reads into a per-connection stage and parses what
//!   arrived: the handshake ([`handshake::Serving`]), then requests and
//!   fences. A WRITE's payload is copied from the stage into place, or,
//!   once the stage is empty and at least [`DIRECT_MIN`] bytes remain,
//!   received straight into region memory. A refused WRITE's payload is
//!   read and dropped.
//! - the sending half is a bounded queue of responses (a READ's payload
//!   named in place, its region held until the bytes have left), sent with
//!   one `sendmsg` for as many as fit.
//!
//! Requests are answered in the order they arrive, which is what lets the
//! initiator match responses without a lookup. When the response queue is
//! full the connection stops parsing until it drains (back-pressure goes
//! to the initiator through TCP).
//!
//! Limits are per-turn timers rather than socket timeouts: a sweep every
//! [`SWEEP`] closes a connection whose handshake passed its deadline,
//! whose frame in progress stalled or moves slower than
//! [`io::FLOOR_BYTES_PER_S`], whose peer stopped taking responses, that
//! idled [`IDLE_CLOSE`], or whose region was unregistered under a slow
//! frame; and one fenced or evicted from another thread.
//!
//! Lifetimes: a connection is dropped only once none of its operations is
//! outstanding in the kernel; `writing` (the fence handshake with
//! [`Live::fence`]) clears only once the payload's last receive into
//! region memory has been reaped, and a region is held for as long as a
//! payload or response names it.

use std::collections::VecDeque;
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tent_rings::{ErrorKind, Opcode};

use super::backend::{Backend, Choice, SockOp};
use super::frame::{Fenced, HELLO_LEN, Inbound, REQUEST_LEN, Request, Response};
use super::handshake::{self, Serve};
use super::io::FLOOR_BYTES_PER_S;
use super::live::{self, Live, STAGE_READY, STAGE_SERVING, Slot};
use crate::memory::{MemRegion, RegionHold, RegionTable};

/// Bytes staged per connection: headers, small payloads, the start of
/// larger ones.
const STAGE_LEN: usize = 32 << 10;
/// A WRITE payload with at least this much left once the stage is empty is
/// received in place; a shorter one through the stage.
const DIRECT_MIN: u64 = 8 << 10;
/// Responses queued per connection; past it the connection stops parsing
/// until they drain.
const TX_MAX: usize = 64;
/// Iovecs per `sendmsg`.
const IOV_MAX: usize = 64;
/// The most bytes one operation names (a completion's result is an i32).
const OP_MAX: u64 = 1 << 30;
/// Scratch a serving thread drops refused payloads into.
const SCRATCH_LEN: usize = 64 << 10;
/// How often the connections' timers are checked.
const SWEEP: Duration = Duration::from_millis(100);
/// How long a serving thread with no connection sleeps at a time.
const IDLE_WAIT: Duration = Duration::from_secs(5);
/// While a fence waits for another connection's write: how often it looks.
const FENCE_POLL: Duration = Duration::from_millis(1);
/// The whole handshake (hellos, proofs) must be done within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with nothing in progress this long is closed.
const IDLE_CLOSE: Duration = Duration::from_secs(60);
/// How long a refused connection is kept, its write side shut, so its
/// answer is read before the close (closing with unread input sends a
/// reset, which can overtake the answer).
const LINGER: Duration = crate::refusals::LINGER;
/// A frame on a region being unregistered is cut once it has lasted this
/// long (an unregister does not wait on a peer's pace; a transfer moving
/// at speed is done by then).
const REVOKED_GRACE: Duration = Duration::from_secs(1);
/// Fences served per connection per turn: each looks through every live
/// connection, and a fence is answered by nothing that would slow its
/// sender down.
const FENCES_PER_TURN: u32 = 16;
/// Connections refused in their handshake held at once while their answer
/// drains (past it they are closed at once).
const LINGERING_MAX: usize = 256;
/// Operations a serving thread's queue has room for at once (few in the
/// unit tests' build, so a full queue is met there).
const ENTRIES: u32 = if cfg!(test) { 8 } else { 1024 };

/// Why a fenced connection was closed.
const FENCED: &str = "fenced: a later connection of its initiator superseded it, or it was evicted";
/// Why a slow WRITE payload was cut: its region was unregistered (the
/// unregister waits for the op; it does not wait for a peer's pace).
const REVOKED_MID_WRITE: &str = "the region was unregistered while its WRITE payload trickled in";
/// Why a slow READ response was cut (as for a WRITE).
const REVOKED_MID_READ: &str =
    "the region was unregistered while the peer was slow to take its READ";

/// Tags: the connection's slab index, shifted, and which operation.
const TAG_RECV: u64 = 0;
const TAG_SEND: u64 = 1;
/// The bell's receive.
const TAG_BELL: u64 = 1 << 62;

/// What every serving thread of one server shares.
pub(super) struct Shared {
    pub(super) live: Live,
    pub(super) regions: Arc<ArcSwap<RegionTable>>,
    /// With a secret, every connection proves it before its first request.
    pub(super) secret: Option<Arc<[u8]>>,
    /// How long a frame in progress may stall.
    pub(super) stall: Duration,
    pub(super) stop: AtomicBool,
    /// Refused connections lingering now (see [`LINGERING_MAX`]).
    pub(super) lingering: AtomicUsize,
}

/// A connection an accept thread hands to a serving thread.
#[derive(Debug)]
pub(super) struct Arrival {
    pub(super) slot: Arc<Slot>,
    pub(super) peer: SocketAddr,
    /// The address it was accepted on (the proofs are bound to it).
    pub(super) local: SocketAddr,
}

/// How the accept threads reach a serving thread.
#[derive(Debug)]
pub(super) struct Inbox {
    arrivals: Mutex<Vec<Arrival>>,
    /// Written (a byte) to wake the thread; it keeps a receive on the
    /// other end.
    bell: UnixStream,
    /// Connections it serves now (the accept threads pick the least).
    load: AtomicUsize,
}

impl Inbox {
    /// Connections it serves now.
    pub(super) fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Hand `a` over.
    pub(super) fn hand(&self, a: Arrival) {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.arrivals.lock().push(a);
        self.ring();
    }

    /// Wake the thread (a full bell already rings).
    pub(super) fn ring(&self) {
        let _ = (&self.bell).write(&[1]);
    }
}

/// Start serving thread `index` of a server; its inbox and its thread.
pub(super) fn spawn(
    index: usize,
    choice: Choice,
    shared: Arc<Shared>,
) -> std::io::Result<(Arc<Inbox>, std::thread::JoinHandle<()>)> {
    let (bell, ear) = UnixStream::pair()?;
    bell.set_nonblocking(true)?;
    ear.set_nonblocking(true)?;
    let inbox = Arc::new(Inbox {
        arrivals: Mutex::new(Vec::new()),
        bell,
        load: AtomicUsize::new(0),
    });
    let theirs = inbox.clone();
    // Built on its own thread: a ring's teardown signals the thread that
    // set it up.
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let t = std::thread::Builder::new()
        .name(format!("tent-tcp-serve-{index}"))
        .spawn(move || match Backend::new(choice, ENTRIES) {
            Ok(be) => {
                let _ = tx.send(Ok(()));
                Station::new(be, shared, theirs, ear).run();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        })?;
    match rx.recv() {
        Ok(Ok(())) => Ok((inbox, t)),
        Ok(Err(e)) => {
            let _ = t.join();
            Err(e)
        }
        Err(_) => {
            let _ = t.join();
            Err(std::io::Error::other("tcp serving thread died at start"))
        }
    }
}

/// A request refused for `why` (bad key, out of bounds, unregistered):
/// logged once per (operation, cause) and then counted, never per op (a
/// peer without the key could otherwise write a line per 32-byte frame).
fn refused(op: Opcode, why: ErrorKind) {
    crate::lograte::log_limited!(debug, (op as u8, why.code()), ?op, %why, "tcp request refused");
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
fn check(
    table: &RegionTable,
    req: &Request,
    proven: bool,
) -> Result<(*mut u8, RegionHold), ErrorKind> {
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
        Ok((region, ptr)) if req.key != 0 && region.key() == req.key => MemRegion::hold(region)
            .map(|h| (ptr, h))
            .ok_or(ErrorKind::AccessDenied),
        Ok(_) => Err(ErrorKind::AccessDenied),
        Err(e) => Err(detail(e)),
    }
}

/// A connection's stage: bytes received and not yet parsed. Reached only
/// through raw pointers and slices over ranges no receive is writing (a
/// receive writes past `tail` while parsing reads before it).
struct Stage(std::ptr::NonNull<[u8; STAGE_LEN]>);

impl Stage {
    fn new() -> Stage {
        Stage(std::ptr::NonNull::from(Box::leak(Box::new(
            [0u8; STAGE_LEN],
        ))))
    }

    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast()
    }

    /// `at..at + len`, which no receive is writing.
    ///
    /// # Safety
    /// `at + len <= STAGE_LEN`, and no outstanding receive writes there.
    unsafe fn bytes(&self, at: usize, len: usize) -> &[u8] {
        debug_assert!(at + len <= STAGE_LEN);
        // SAFETY: in bounds, initialised (zeroed at birth), and not being written, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr().add(at), len) }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // SAFETY: from `Box::leak` in `new`, dropped once; the connection (its only owner) is dropped only with no receive outstanding.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// One frame to send: a header (a response, or a handshake reply) and,
/// for a READ, its payload in place.
struct Out {
    head: [u8; HELLO_LEN],
    head_len: u8,
    payload: *const u8,
    len: u64,
    /// Keeps the payload's region registered until its bytes have left.
    hold: Option<RegionHold>,
    /// When it was queued.
    at: Instant,
}

impl Out {
    fn bytes(b: &[u8], at: Instant) -> Out {
        let mut head = [0u8; HELLO_LEN];
        head[..b.len()].copy_from_slice(b);
        Out {
            head,
            head_len: b.len() as u8,
            payload: std::ptr::null(),
            len: 0,
            hold: None,
            at,
        }
    }

    fn total(&self) -> u64 {
        u64::from(self.head_len) + self.len
    }
}

/// What the receiving half is doing.
enum Rx {
    /// The handshake.
    Hello(handshake::Serving),
    /// Between frames, or in a header.
    Requests,
    /// A fence waits for the connections it supersedes to be out of their
    /// writes; nothing more is parsed until then.
    Fencing {
        victims: Vec<Arc<Slot>>,
        since: Instant,
    },
    /// A WRITE's payload: `left` bytes still to land at `ptr`.
    Payload {
        ptr: *mut u8,
        left: u64,
        resp: Response,
        hold: RegionHold,
    },
    /// A refused WRITE's payload, dropped.
    Discard { left: u64, resp: Response },
    /// Refused, or fenced: its answer (a refusal, a [`Fenced`] notice)
    /// drains, then its write side is shut and what it sends is dropped
    /// until it closes or [`LINGER`] passes; closed then for `why`.
    Linger {
        until: Instant,
        shut: bool,
        why: &'static str,
    },
}

/// Where an outstanding receive lands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Land {
    Stage,
    Region,
    Scratch,
}

/// One connection.
struct Conn {
    slot: Arc<Slot>,
    fd: RawFd,
    peer: SocketAddr,
    rx: Rx,
    stage: Stage,
    head: usize,
    tail: usize,
    /// An outstanding receive, and where it lands.
    recv: Option<Land>,
    /// Proven the secret (every connection past its handshake, when the
    /// server has one).
    proven: bool,
    tx: VecDeque<Out>,
    /// Bytes of `tx`'s front already sent.
    tx_off: u64,
    /// A `sendmsg` is outstanding over `tx`'s first items.
    sending: bool,
    iov: [libc::iovec; IOV_MAX],
    msg: libc::msghdr,
    /// When a byte last came in; when the frame in progress began (a
    /// header's first byte, a payload), if one is.
    rx_at: Instant,
    frame_at: Option<Instant>,
    /// The frame in progress's length.
    frame_len: u64,
    /// When a byte last left, or the queue last became non-empty; when
    /// the front response became the front.
    tx_at: Instant,
    front_at: Instant,
    /// Why it is being torn down (its outstanding operations end first),
    /// and whether that is worth a warning.
    closing: Option<(String, bool)>,
    /// The peer shut its sending side: answer what was asked, then close.
    eof: bool,
    /// It has work it could not do this turn (a full queue, its fence
    /// quota): move it on again next turn.
    again: bool,
    /// Fences served this turn.
    fences: u32,
    /// It counts in [`Shared::lingering`].
    lingers: bool,
}

// SAFETY: `Conn`'s raw pointers (payload positions, the iovecs and msghdr
// into its own boxed state) name region memory held by a `RegionHold` or
// the connection's own heap state; a connection is only ever touched by the
// serving thread that owns it, and moved between threads only whole.
unsafe impl Send for Conn {}

/// What one turn of a connection needs from its thread.
struct Cx<'a> {
    be: &'a mut Backend,
    shared: &'a Shared,
    scratch: *mut u8,
    now: Instant,
}

impl<'a> Cx<'a> {
    /// A connection's view of its thread's queue, shared state and scratch
    /// at `now`.
    fn new(be: &'a mut Backend, shared: &'a Shared, scratch: &mut [u8], now: Instant) -> Cx<'a> {
        Cx {
            be,
            shared,
            scratch: scratch.as_mut_ptr(),
            now,
        }
    }
}

impl Conn {
    fn new(a: Arrival, secret: Option<Arc<[u8]>>, now: Instant) -> Box<Conn> {
        let fd = a.slot.stream.as_raw_fd();
        Box::new(Conn {
            fd,
            peer: a.peer,
            rx: Rx::Hello(handshake::Serving::new(secret, a.local)),
            slot: a.slot,
            stage: Stage::new(),
            head: 0,
            tail: 0,
            recv: None,
            proven: false,
            tx: VecDeque::with_capacity(TX_MAX + 1),
            tx_off: 0,
            sending: false,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; IOV_MAX],
            // SAFETY: a zeroed msghdr is a valid "no name, no control" message.
            msg: unsafe { std::mem::zeroed() },
            rx_at: now,
            frame_at: None,
            frame_len: 0,
            tx_at: now,
            front_at: now,
            closing: None,
            eof: false,
            again: false,
            fences: 0,
            lingers: false,
        })
    }

    fn avail(&self) -> usize {
        self.tail - self.head
    }

    fn outstanding(&self) -> bool {
        self.recv.is_some() || self.sending
    }

    /// Queue a frame to send.
    fn push_out(&mut self, o: Out, now: Instant) {
        if self.tx.is_empty() {
            self.tx_at = now;
            self.front_at = now;
        }
        self.tx.push_back(o);
    }

    /// A response with no payload.
    fn respond(&mut self, r: &Response, now: Instant) {
        self.push_out(Out::bytes(&r.encode(), now), now);
    }

    /// Tear down for `why` (`warn`: worth a line): outstanding operations
    /// are cancelled, and the connection is dropped once they are reaped.
    fn close(&mut self, be: &mut Backend, why: impl Into<String>, warn: bool) {
        if self.closing.is_some() {
            return;
        }
        self.closing = Some((why.into(), warn));
        // Ends a receive at once even if the cancel finds no room in the
        // queue this turn.
        let _ = self.slot.stream.shutdown(std::net::Shutdown::Both);
        if self.outstanding() {
            be.cancel(self.fd);
        }
    }

    /// Hold no room while the answer queued drains, then linger (see
    /// [`Rx::Linger`]) and close for `why`; false (nothing changed but the
    /// mark) past [`LINGERING_MAX`] of those: the caller closes at once.
    fn linger(&mut self, cx: &mut Cx<'_>, why: &'static str) -> bool {
        self.slot.fenced.store(true, Ordering::SeqCst);
        if cx.shared.lingering.fetch_add(1, Ordering::Relaxed) >= LINGERING_MAX {
            cx.shared.lingering.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        self.lingers = true;
        self.rx = Rx::Linger {
            until: cx.now + LINGER,
            shut: false,
            why,
        };
        true
    }

    /// Fenced or evicted from another thread: it writes nothing more into
    /// region memory. Fenced by a fence past its handshake, it tells its
    /// peer so ([`Fenced`], after the responses queued before) and
    /// lingers; else it closes.
    fn superseded(&mut self, cx: &mut Cx<'_>) {
        if self.closing.is_some() || matches!(self.rx, Rx::Linger { .. }) {
            return;
        }
        // Acquire: a fence's mark brings its `notice` with it.
        let fence =
            self.slot.fenced.load(Ordering::Acquire) && self.slot.notice.load(Ordering::Relaxed);
        let conn = self.slot.ident.get().map(|i| i.conn);
        // A queued frame is named by an outstanding send: the queue must
        // not grow past its capacity.
        let room = self.tx.len() < self.tx.capacity();
        let (true, false, true, Some(conn)) = (fence, matches!(self.rx, Rx::Hello(_)), room, conn)
        else {
            return self.close(cx.be, FENCED, false);
        };
        if self.recv == Some(Land::Region) {
            // Its receiving side is shut: that receive ends at once, and
            // its completion brings the connection back here.
            return;
        }
        // No receive into region memory is outstanding and none is posted
        // from here: the fence may be served.
        self.slot.writing.store(false, Ordering::Release);
        self.frame_at = None;
        self.push_out(Out::bytes(&Fenced { conn }.encode(), cx.now), cx.now);
        if !self.linger(cx, FENCED) {
            self.close(cx.be, FENCED, false);
        }
    }

    /// Parse and serve what is staged, as far as it goes.
    fn parse(&mut self, cx: &mut Cx<'_>) {
        while self.closing.is_none() {
            if !matches!(self.rx, Rx::Hello(_) | Rx::Linger { .. })
                && self.slot.fenced.load(Ordering::SeqCst)
            {
                return self.superseded(cx);
            }
            match &mut self.rx {
                Rx::Hello(m) => {
                    let want = m.want();
                    if self.tail - self.head < want {
                        return;
                    }
                    // SAFETY: `head + want <= tail`: received bytes, before where any receive writes.
                    let got = m.on_bytes(unsafe { self.stage.bytes(self.head, want) });
                    let done = m.want() == 0;
                    self.head += want;
                    match got {
                        Ok(Serve::Read) => {}
                        Ok(Serve::Hello { ident, reply }) => {
                            let _ = self.slot.ident.set(ident);
                            self.push_out(Out::bytes(&reply, cx.now), cx.now);
                            if done {
                                self.ready(cx);
                            }
                        }
                        Ok(Serve::Proven(reply)) => {
                            self.push_out(Out::bytes(&reply, cx.now), cx.now);
                            self.ready(cx);
                        }
                        Err(r) => {
                            if let Some(reply) = r.reply {
                                self.push_out(Out::bytes(reply.bytes(), cx.now), cx.now);
                            }
                            // One line per (peer, kind of refusal), then counts: a bad
                            // hello does not hide a failed proof after it.
                            let kind = r.reply.map(|reply| reply.status());
                            crate::lograte::warn_limited!((self.peer.ip(), kind), peer = %self.peer, reason = %r.why, "tcp data connection refused");
                            if !self.linger(cx, "refused") {
                                self.close(cx.be, r.why, false);
                                return;
                            }
                        }
                    }
                }
                Rx::Requests => {
                    if self.tx.len() >= TX_MAX {
                        return;
                    }
                    if self.fences >= FENCES_PER_TURN {
                        // Others on this thread go first; on next turn.
                        self.again = true;
                        return;
                    }
                    if self.avail() < REQUEST_LEN {
                        if self.avail() > 0 && self.frame_at.is_none() {
                            self.frame_at = Some(cx.now);
                            self.frame_len = REQUEST_LEN as u64;
                        }
                        return;
                    }
                    let mut h = [0u8; REQUEST_LEN];
                    // SAFETY: as above (`avail() >= REQUEST_LEN`).
                    h.copy_from_slice(unsafe { self.stage.bytes(self.head, REQUEST_LEN) });
                    self.head += REQUEST_LEN;
                    self.frame_at = None;
                    match Inbound::decode(&h) {
                        Err(e) => self.close(cx.be, format!("malformed request: {e}"), true),
                        Ok(Inbound::Fence(f)) => match cx.shared.live.fence(&self.slot, f) {
                            Ok(victims) => {
                                self.fences += 1;
                                self.rx = Rx::Fencing {
                                    victims,
                                    since: cx.now,
                                }
                            }
                            Err(why) => self.close(cx.be, why, true),
                        },
                        Ok(Inbound::Request(req)) => self.serve(req, cx),
                    }
                }
                Rx::Fencing { victims, since } => {
                    if !live::all_still(victims) {
                        if cx.now.duration_since(*since) >= cx.shared.stall {
                            let why = format!(
                                "fence: a superseded connection still writing after {:?}",
                                cx.shared.stall
                            );
                            self.close(cx.be, why, true);
                        }
                        return;
                    }
                    self.rx = Rx::Requests;
                }
                Rx::Payload { ptr, left, .. } => {
                    let n = (*left).min((self.tail - self.head) as u64) as usize;
                    if n > 0 {
                        // SAFETY: `ptr..ptr+left` lies inside a registered region held (`hold`) for the whole payload; the stage range is `n` initialised bytes of our own.
                        unsafe {
                            std::ptr::copy_nonoverlapping(self.stage.ptr().add(self.head), *ptr, n)
                        };
                        *ptr = ptr.wrapping_add(n);
                        *left -= n as u64;
                        self.head += n;
                    }
                    if *left > 0 {
                        return;
                    }
                    self.payload_done(cx.now);
                }
                Rx::Discard { left, resp } => {
                    let n = (*left).min((self.tail - self.head) as u64) as usize;
                    self.head += n;
                    *left -= n as u64;
                    if *left > 0 {
                        return;
                    }
                    let resp = *resp;
                    refused(
                        Opcode::Write,
                        resp.status.err().unwrap_or(ErrorKind::InvalidArgument),
                    );
                    self.frame_at = None;
                    self.rx = Rx::Requests;
                    self.respond(&resp, cx.now);
                }
                Rx::Linger { .. } => {
                    self.head = self.tail;
                    return;
                }
            }
        }
    }

    /// The handshake is done: requests from here.
    fn ready(&mut self, cx: &Cx<'_>) {
        self.proven = cx.shared.secret.is_some();
        self.slot.served();
        self.slot.stage.store(STAGE_READY, Ordering::Relaxed);
        self.rx = Rx::Requests;
    }

    /// A WRITE's payload has landed whole: answer it.
    fn payload_done(&mut self, now: Instant) {
        let Rx::Payload { resp, .. } = std::mem::replace(&mut self.rx, Rx::Requests) else {
            unreachable!("payload_done outside a payload");
        };
        // Release: the payload's bytes are in memory before a fencing
        // thread sees the write over. The hold went with the state.
        self.slot.writing.store(false, Ordering::Release);
        self.frame_at = None;
        self.respond(&resp, now);
    }

    /// Serve one request.
    fn serve(&mut self, req: Request, cx: &mut Cx<'_>) {
        let table = cx.shared.regions.load();
        let target = check(&table, &req, self.proven);
        if target.is_ok() {
            // Served (or about to be): what keeps it from eviction.
            self.slot.served();
            if self.slot.stage.load(Ordering::Relaxed) != STAGE_SERVING {
                self.slot.stage.store(STAGE_SERVING, Ordering::Relaxed);
            }
        }
        let mut resp = Response {
            status: target.as_ref().map(|_| ()).map_err(|e| *e),
            seq: req.seq,
            len: 0,
        };
        match (req.opcode, target) {
            (Opcode::Write, Ok((ptr, hold))) => {
                // Announce the write, then look for a fence (see Live::fence).
                self.slot.writing.store(true, Ordering::SeqCst);
                if self.slot.fenced.load(Ordering::SeqCst) {
                    self.slot.writing.store(false, Ordering::Release);
                    return self.superseded(cx);
                }
                resp.len = req.len;
                self.frame_at = Some(cx.now);
                self.frame_len = req.len;
                self.rx = Rx::Payload {
                    ptr,
                    left: req.len,
                    resp,
                    hold,
                };
            }
            (Opcode::Write, Err(_)) => {
                self.frame_at = Some(cx.now);
                self.frame_len = req.len;
                self.rx = Rx::Discard {
                    left: req.len,
                    resp,
                };
            }
            (Opcode::Read, Ok((ptr, hold))) => {
                resp.len = req.len;
                let mut o = Out::bytes(&resp.encode(), cx.now);
                o.payload = ptr;
                o.len = req.len;
                o.hold = Some(hold);
                self.push_out(o, cx.now);
            }
            (Opcode::Read, Err(why)) => {
                refused(Opcode::Read, why);
                self.respond(&resp, cx.now);
            }
        }
    }

    /// Post what the connection can use now: a receive where the receiving
    /// half wants bytes, a send when responses wait.
    fn arm(&mut self, tag: u64, cx: &mut Cx<'_>) {
        if self.closing.is_some() {
            return;
        }
        if self.eof && self.tx.is_empty() && !self.sending {
            match self.rx {
                Rx::Requests if self.avail() < REQUEST_LEN => {
                    return self.close(cx.be, "closed by the peer", false);
                }
                Rx::Payload { .. } | Rx::Discard { .. } if self.avail() == 0 => {
                    return self.close(cx.be, "the peer closed mid-frame", true);
                }
                _ => {}
            }
        }
        if let Rx::Linger { shut, .. } = &mut self.rx
            && !*shut
            && self.tx.is_empty()
        {
            // Its answer is out: EOF after it.
            *shut = true;
            let _ = self.slot.stream.shutdown(std::net::Shutdown::Write);
        }
        if self.recv.is_none()
            && let Some(into) = self.wants()
        {
            let (buf, len) = match into {
                Land::Stage => {
                    if self.head > 0 {
                        // SAFETY: no receive is outstanding (we are arming one); both ranges lie in the stage.
                        unsafe {
                            std::ptr::copy(
                                self.stage.ptr().add(self.head),
                                self.stage.ptr(),
                                self.tail - self.head,
                            )
                        };
                        self.tail -= self.head;
                        self.head = 0;
                    }
                    (
                        // SAFETY: in bounds of the stage (`tail <= STAGE_LEN`).
                        unsafe { self.stage.ptr().add(self.tail) },
                        (STAGE_LEN - self.tail) as u64,
                    )
                }
                Land::Region => match &self.rx {
                    Rx::Payload { ptr, left, .. } => (*ptr, *left),
                    _ => unreachable!("a receive into a region outside a payload"),
                },
                Land::Scratch => {
                    let left = match &self.rx {
                        Rx::Discard { left, .. } => *left,
                        _ => SCRATCH_LEN as u64,
                    };
                    (cx.scratch, left.min(SCRATCH_LEN as u64))
                }
            };
            let len = len.min(OP_MAX) as u32;
            if len > 0 {
                // SAFETY: `buf..buf+len` stays valid until the receive is reaped: the stage is the connection's own boxed buffer (dropped only once nothing is outstanding), a region is held by the payload state (left only once the receive is reaped), the scratch lives as long as the thread.
                let pushed = unsafe {
                    cx.be.push(
                        tag << 2 | TAG_RECV,
                        SockOp::Recv {
                            fd: self.fd,
                            buf,
                            len,
                        },
                    )
                };
                match pushed {
                    Ok(()) => self.recv = Some(into),
                    // The queue is full until its next flush: again then.
                    Err(_) => self.again = true,
                }
            }
        }
        if !self.sending && !self.tx.is_empty() {
            let mut n = 0;
            let mut total = 0u64;
            let mut skip = self.tx_off;
            for o in self.tx.iter() {
                let parts = [(o.head.as_ptr(), u64::from(o.head_len)), (o.payload, o.len)];
                for (p, l) in parts {
                    if skip >= l {
                        skip -= l;
                        continue;
                    }
                    if n == IOV_MAX || total >= OP_MAX {
                        break;
                    }
                    let take = (l - skip).min(OP_MAX - total);
                    self.iov[n] = libc::iovec {
                        iov_base: p.wrapping_add(skip as usize) as *mut libc::c_void,
                        iov_len: take as usize,
                    };
                    skip = 0;
                    total += take;
                    n += 1;
                }
                if n == IOV_MAX || total >= OP_MAX {
                    break;
                }
            }
            self.msg.msg_iov = self.iov.as_mut_ptr();
            self.msg.msg_iovlen = n;
            // SAFETY: the msghdr and iovecs are the connection's own boxed state; they name queued headers (in `tx`, which never reallocates: it holds at most `TX_MAX + 1` of the capacity it was built with) and READ payloads held by their `hold`; all stay put until the send is reaped.
            let pushed = unsafe {
                cx.be.push(
                    tag << 2 | TAG_SEND,
                    SockOp::Send {
                        fd: self.fd,
                        msg: &self.msg,
                    },
                )
            };
            match pushed {
                Ok(()) => self.sending = true,
                Err(_) => self.again = true,
            }
        }
    }

    /// Where the next receive should land, if one is wanted.
    fn wants(&self) -> Option<Land> {
        if self.eof {
            return None;
        }
        match &self.rx {
            Rx::Linger { shut, .. } => shut.then_some(Land::Scratch),
            Rx::Payload { left, .. } if self.avail() == 0 && *left >= DIRECT_MIN => {
                Some(Land::Region)
            }
            Rx::Discard { left, .. } if self.avail() == 0 && *left >= DIRECT_MIN => {
                Some(Land::Scratch)
            }
            // Back-pressure: a full response queue stops the reading too.
            Rx::Requests if self.tx.len() >= TX_MAX => None,
            _ if self.head == 0 && self.tail == STAGE_LEN => None,
            _ => Some(Land::Stage),
        }
    }

    /// A receive completed with `res`.
    fn on_recv(&mut self, res: i32, cx: &mut Cx<'_>) {
        let into = self.recv.take().expect("a receive was outstanding");
        if self.closing.is_some() || res == -libc::EAGAIN {
            // EAGAIN: nothing moved (io_uring's blocking pool on a
            // non-blocking socket); `arm` posts it again.
            return;
        }
        if res <= 0 && self.slot.fenced.load(Ordering::Relaxed) {
            if let Rx::Linger { shut, why, .. } = self.rx {
                // Before its answer is out, an end of input is its own
                // receiving side shut by a fence: the answer still goes.
                if res < 0 || shut {
                    self.close(cx.be, why, false);
                }
                return;
            }
            return self.superseded(cx);
        }
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            return self.close(
                cx.be,
                format!("reading: {e}"),
                !matches!(-res, libc::ECONNRESET),
            );
        }
        if res == 0 {
            if matches!(self.rx, Rx::Requests) && self.avail() < REQUEST_LEN {
                if self.avail() > 0 {
                    return self.close(cx.be, "the peer closed mid-frame", true);
                }
                // A half-close: what it asked is still answered.
                self.eof = true;
                return;
            }
            if matches!(
                self.rx,
                Rx::Hello(_) | Rx::Payload { .. } | Rx::Discard { .. }
            ) {
                return self.close(cx.be, "the peer closed mid-frame", true);
            }
            // Requests staged or a fence waiting: served, then closed.
            self.eof = true;
        }
        let n = res as usize;
        self.rx_at = cx.now;
        match into {
            Land::Stage => self.tail += n,
            Land::Region => {
                if let Rx::Payload { ptr, left, .. } = &mut self.rx {
                    *ptr = ptr.wrapping_add(n);
                    *left -= n as u64;
                    if *left == 0 {
                        self.payload_done(cx.now);
                    }
                }
            }
            Land::Scratch => {
                if let Rx::Discard { left, .. } = &mut self.rx {
                    *left -= (n as u64).min(*left);
                }
            }
        }
    }

    /// A send completed with `res`.
    fn on_send(&mut self, res: i32, cx: &mut Cx<'_>) {
        self.sending = false;
        if self.closing.is_some() || res == -libc::EAGAIN {
            // As for a receive.
            return;
        }
        if res < 0 {
            let e = std::io::Error::from_raw_os_error(-res);
            return self.close(
                cx.be,
                format!("sending a response: {e}"),
                !matches!(-res, libc::EPIPE | libc::ECONNRESET),
            );
        }
        let mut n = res as u64;
        if n > 0 {
            self.tx_at = cx.now;
        }
        while n > 0 {
            let front = self.tx.front().expect("bytes sent of a queued frame");
            let rest = front.total() - self.tx_off;
            if n < rest {
                self.tx_off += n;
                break;
            }
            n -= rest;
            self.tx_off = 0;
            // Its hold goes with it: the region may be unregistered.
            self.tx.pop_front();
            self.front_at = cx.now;
        }
    }

    /// The timers, at `now` (every [`SWEEP`]).
    fn sweep(&mut self, cx: &mut Cx<'_>) {
        if self.closing.is_some() {
            return;
        }
        let now = cx.now;
        let stall = cx.shared.stall;
        if self.slot.fenced.load(Ordering::Relaxed) && !matches!(self.rx, Rx::Linger { .. }) {
            return self.superseded(cx);
        }
        // Bytes moved at the floor rate earn this much time.
        let earned = |bytes: u64| {
            Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / FLOOR_BYTES_PER_S)
        };
        match &self.rx {
            Rx::Hello(_) if now.duration_since(self.slot.born) >= HANDSHAKE_TIMEOUT => {
                return self.close(
                    cx.be,
                    format!("handshake: not done within {HANDSHAKE_TIMEOUT:?}"),
                    true,
                );
            }
            Rx::Linger { until, why, .. } if now >= *until => {
                return self.close(cx.be, *why, false);
            }
            Rx::Payload { hold, .. }
                if hold.is_revoked()
                    && self
                        .frame_at
                        .is_some_and(|t| now.duration_since(t) >= REVOKED_GRACE) =>
            {
                return self.close(cx.be, REVOKED_MID_WRITE, true);
            }
            _ => {}
        }
        if let Some(t0) = self.frame_at {
            let left = match &self.rx {
                Rx::Payload { left, .. } | Rx::Discard { left, .. } => *left,
                _ => (REQUEST_LEN - self.avail().min(REQUEST_LEN)) as u64,
            };
            if now.duration_since(self.rx_at.max(t0)) >= stall {
                return self.close(
                    cx.be,
                    format!("the peer stalled mid-frame for over {stall:?}"),
                    true,
                );
            }
            // A frame must move at the floor rate on average (past a grace
            // of the stall limit), however regularly it trickles.
            let moved = self.frame_len.saturating_sub(left);
            if now.duration_since(t0) > stall.saturating_add(earned(moved)) {
                let why = format!(
                    "the peer moved a frame slower than {} KiB/s ({moved} bytes in {:?}, {left} left)",
                    FLOOR_BYTES_PER_S >> 10,
                    now.duration_since(t0)
                );
                return self.close(cx.be, why, true);
            }
        }
        if !self.tx.is_empty() {
            if now.duration_since(self.tx_at) >= stall {
                return self.close(
                    cx.be,
                    format!("the peer took no response byte for over {stall:?}"),
                    true,
                );
            }
            // What it has taken of the front response buys it time at the
            // floor rate, past a grace of the stall limit.
            let age = now.duration_since(self.front_at);
            if age > stall.saturating_add(earned(self.tx_off)) {
                let why = format!(
                    "the peer took a response slower than {} KiB/s ({} bytes in {age:?})",
                    FLOOR_BYTES_PER_S >> 10,
                    self.tx_off
                );
                return self.close(cx.be, why, true);
            }
            // Any queued READ on a region being unregistered, not gone
            // within the grace: the unregister does not wait on the peer.
            let revoked = self.tx.iter().any(|o| {
                now.duration_since(o.at) >= REVOKED_GRACE
                    && o.hold.as_ref().is_some_and(RegionHold::is_revoked)
            });
            if revoked {
                self.close(cx.be, REVOKED_MID_READ, true);
            }
        } else if matches!(self.rx, Rx::Requests)
            && self.frame_at.is_none()
            && now.duration_since(self.rx_at) >= IDLE_CLOSE
        {
            self.close(cx.be, format!("idle for {} s", IDLE_CLOSE.as_secs()), true);
        }
    }
}

/// A serving thread.
struct Station {
    be: Backend,
    shared: Arc<Shared>,
    inbox: Arc<Inbox>,
    /// The inbox's bell, read end; a receive is kept on it.
    ear: UnixStream,
    ear_buf: [u8; 64],
    ear_armed: bool,
    slab: Vec<Option<Box<Conn>>>,
    free: Vec<u32>,
    /// Connections with work left from last turn (a full queue, their
    /// fence quota).
    again: Vec<u32>,
    /// Connections that have a fence waiting.
    fencing: Vec<u32>,
    scratch: Box<[u8]>,
    reaped: Vec<(u64, i32)>,
    /// Connections moved on this turn (each once).
    touched: Vec<u32>,
    last_sweep: Instant,
}

impl Station {
    fn new(be: Backend, shared: Arc<Shared>, inbox: Arc<Inbox>, ear: UnixStream) -> Station {
        Station {
            be,
            shared,
            inbox,
            ear,
            ear_buf: [0; 64],
            ear_armed: false,
            slab: Vec::new(),
            free: Vec::new(),
            fencing: Vec::new(),
            again: Vec::new(),
            scratch: vec![0u8; SCRATCH_LEN].into_boxed_slice(),
            reaped: vec![(0, 0); 256],
            touched: Vec::with_capacity(256),
            last_sweep: Instant::now(),
        }
    }

    fn run(mut self) {
        tracing::debug!(backend = self.be.name(), "tcp serving thread up");
        let mut busy = false;
        loop {
            let stopping = self.shared.stop.load(Ordering::Acquire);
            if !self.ear_armed && !stopping {
                // SAFETY: `ear_buf` is ours for the thread's life; the receive is reaped before the thread ends (below).
                let pushed = unsafe {
                    self.be.push(
                        TAG_BELL,
                        SockOp::Recv {
                            fd: self.ear.as_raw_fd(),
                            buf: self.ear_buf.as_mut_ptr(),
                            len: self.ear_buf.len() as u32,
                        },
                    )
                };
                self.ear_armed = pushed.is_ok();
            }
            if stopping {
                self.stop_all();
                if self.slab.iter().all(Option::is_none) && !self.ear_armed {
                    return;
                }
            }
            let wait = if busy {
                None
            } else if !self.fencing.is_empty() {
                Some(FENCE_POLL)
            } else if self.free.len() == self.slab.len() {
                // No connection, no timer: the bell wakes it.
                Some(IDLE_WAIT)
            } else {
                Some(SWEEP)
            };
            self.be.flush(wait);
            busy = self.turn();
        }
    }

    /// Reap, move connections on, sweep; whether anything happened.
    fn turn(&mut self) -> bool {
        let now = Instant::now();
        let mut any = false;
        loop {
            let n = self.be.reap(&mut self.reaped);
            if n == 0 {
                break;
            }
            any = true;
            for i in 0..n {
                let (tag, res) = self.reaped[i];
                if tag == TAG_BELL {
                    self.ear_armed = false;
                    self.take_arrivals(now);
                    continue;
                }
                let id = (tag >> 2) as u32;
                let Some(c) = self.slab.get_mut(id as usize).and_then(Option::as_mut) else {
                    continue;
                };
                let mut cx = Cx::new(&mut self.be, &self.shared, &mut self.scratch, now);
                if tag & 3 == TAG_RECV {
                    c.on_recv(res, &mut cx);
                } else {
                    c.on_send(res, &mut cx);
                }
                self.touched.push(id);
            }
        }
        if !self.fencing.is_empty() {
            self.touched.extend_from_slice(&self.fencing);
            self.fencing.clear();
        }
        if !self.again.is_empty() {
            any = true;
            self.touched.extend_from_slice(&self.again);
            self.again.clear();
        }
        let sweep = now.duration_since(self.last_sweep) >= SWEEP;
        if sweep {
            self.last_sweep = now;
            for id in 0..self.slab.len() as u32 {
                if let Some(c) = self.slab[id as usize].as_mut() {
                    let mut cx = Cx::new(&mut self.be, &self.shared, &mut self.scratch, now);
                    c.sweep(&mut cx);
                    if c.closing.is_some() {
                        self.touched.push(id);
                    }
                }
            }
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        for &id in &touched {
            self.advance(id, now);
        }
        touched.clear();
        self.touched = touched;
        any
    }

    /// Move connection `id` on: parse, post, or drop it once closed.
    fn advance(&mut self, id: u32, now: Instant) {
        let Some(c) = self.slab.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        let mut cx = Cx::new(&mut self.be, &self.shared, &mut self.scratch, now);
        c.again = false;
        c.fences = 0;
        c.parse(&mut cx);
        c.arm(u64::from(id), &mut cx);
        if c.closing.is_none() {
            if c.again {
                self.again.push(id);
            } else if matches!(c.rx, Rx::Fencing { .. }) {
                self.fencing.push(id);
            }
        }
        if c.closing.is_some() && !c.outstanding() {
            self.finish(id);
        }
    }

    /// Connection `id` has nothing outstanding and is closed: let it go.
    fn finish(&mut self, id: u32) {
        let Some(c) = self.slab[id as usize].take() else {
            return;
        };
        // Nothing of it is in the kernel: no byte lands from here.
        c.slot.writing.store(false, Ordering::Release);
        if c.lingers {
            self.shared.lingering.fetch_sub(1, Ordering::Relaxed);
        }
        self.be.forget(c.fd);
        let (why, warn) = c.closing.clone().unwrap_or_default();
        if warn {
            crate::lograte::warn_limited!(c.peer.ip(), peer = %c.peer, reason = %why, "tcp data connection closed");
        } else {
            tracing::debug!(peer = %c.peer, reason = %why, "tcp data connection closed");
        }
        self.shared.live.remove(c.slot.id);
        self.inbox.load.fetch_sub(1, Ordering::Relaxed);
        self.free.push(id);
        // The slot (and its socket) goes when its last holder lets go.
        drop(c);
    }

    /// Take the connections handed over.
    fn take_arrivals(&mut self, now: Instant) {
        // Drain the bell (it may have rung more than once), into a buffer
        // of its own: the ring's receive may still name `ear_buf`.
        let mut drained = [0u8; 64];
        while matches!((&self.ear).read(&mut drained), Ok(n) if n > 0) {}
        let arrivals = std::mem::take(&mut *self.inbox.arrivals.lock());
        for a in arrivals {
            if self.shared.stop.load(Ordering::Acquire) {
                self.shared.live.remove(a.slot.id);
                self.inbox.load.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let id = match self.free.pop() {
                Some(id) => id,
                None => {
                    self.slab.push(None);
                    (self.slab.len() - 1) as u32
                }
            };
            let conn = Conn::new(a, self.shared.secret.clone(), now);
            self.slab[id as usize] = Some(conn);
            self.touched.push(id);
        }
    }

    /// The server stops: close every connection (they go once their
    /// operations are reaped), and stop listening to the bell.
    fn stop_all(&mut self) {
        if self.ear_armed {
            self.be.cancel(self.ear.as_raw_fd());
        }
        self.take_arrivals(Instant::now());
        for id in 0..self.slab.len() as u32 {
            if let Some(c) = self.slab[id as usize].as_mut() {
                c.close(&mut self.be, "the server stopped", false);
                let _ = c.slot.stream.shutdown(std::net::Shutdown::Both);
                self.touched.push(id);
            }
        }
    }
}
