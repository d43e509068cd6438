//! [`HttpServer`]: one thread, `tent-http`, serving [`Routes`] over
//! non-blocking sockets.
//!
//! The thread sleeps in one `poll` over the listener, a wake eventfd (the
//! server's drop writes it: the thread stops at once, no timeout loop)
//! and its open connections, with the nearest connection deadline as the
//! timeout. A connection goes through three states: reading its head
//! into its buffer (8 KiB, allocated at accept), writing its response
//! (resumed on `POLLOUT` after a partial write), then reading the next
//! request (kept alive) or draining: the response is out and the write
//! side shut, what the client still sends is read and dropped until it
//! closes (closing with unread bytes would reset the connection and could
//! cost the client the response's tail). The deadline, [`EXCHANGE_TIMEOUT`]
//! from accept or from the previous answer, closes a connection in any
//! state.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{self, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{self, RecvFlags, SendFlags, Shutdown};

use super::request::{self, Outcome, Verdict};
use super::{Bearer, EXCHANGE_TIMEOUT, MAX_CONNECTIONS, MAX_HEAD, Routes};
use crate::error::{Error, ErrorKind, Result};
use crate::lograte::warn_limited;

/// Most connections accepted per wakeup, so a flood of connects cannot
/// keep the thread from the connections it has.
const ACCEPTS_PER_WAKE: usize = 2 * MAX_CONNECTIONS;
/// How long the listener is left alone after `accept` fails for want of
/// descriptors or memory (it stays readable; polling it would spin).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Most reads of a draining connection per wakeup.
const DRAIN_READS: usize = 4;
/// Requests one kept-alive connection carries before it is closed (so a
/// client cannot hold a connection, and its buffer, for ever).
const MAX_REQUESTS_PER_CONNECTION: u32 = 10_000;

/// The server's counters, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HttpStats {
    /// Connections accepted and kept.
    pub(crate) accepted: u64,
    /// Connections closed for a newcomer at the cap: the oldest one not
    /// being answered, or the newcomer when every slot is being answered.
    pub(crate) evicted: u64,
    /// Connections closed at their deadline before their response was out.
    pub(crate) timed_out: u64,
    /// Requests answered 400 or 405 (malformed, another method).
    pub(crate) bad_request: u64,
    /// Requests answered 413, 414 or 431 (a body, a long target, a large head).
    pub(crate) too_large: u64,
    /// Requests answered 401 (bearer missing or wrong).
    pub(crate) unauthorized: u64,
    /// Responses written out in full (any status).
    pub(crate) served: u64,
    /// Those by status class: `[0]` 1xx ... `[4]` 5xx.
    pub(crate) by_class: [u64; 5],
}

/// [`HttpStats`] as the server thread counts it. That thread is the only
/// writer, so a count is a relaxed load and a relaxed store (no locked
/// read-modify-write); any thread may read them (the engine's `/metrics`,
/// [`HttpServer::stats`]). Made before the server, so that what reports
/// it (the engine's observer) can hold it from the start.
#[derive(Debug, Default)]
pub(crate) struct HttpCounters {
    accepted: AtomicU64,
    evicted: AtomicU64,
    timed_out: AtomicU64,
    bad_request: AtomicU64,
    too_large: AtomicU64,
    unauthorized: AtomicU64,
    served: AtomicU64,
    by_class: [AtomicU64; 5],
}

impl HttpCounters {
    /// Add one; the server thread only (see the type's doc).
    fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// A response of `status` was written out in full.
    fn served(&self, status: u16) {
        Self::bump(&self.served);
        // Statuses are 100..=599 (the routes' and the server's own).
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        Self::bump(&self.by_class[class]);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> HttpStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HttpStats {
            accepted: l(&self.accepted),
            evicted: l(&self.evicted),
            timed_out: l(&self.timed_out),
            bad_request: l(&self.bad_request),
            too_large: l(&self.too_large),
            unauthorized: l(&self.unauthorized),
            served: l(&self.served),
            by_class: self.by_class.each_ref().map(l),
        }
    }
}

/// The HTTP endpoint's thread; dropping it stops and joins the thread and
/// closes every connection.
pub(crate) struct HttpServer {
    addr: SocketAddr,
    /// Written once by drop: the thread's signal to stop.
    wake: Arc<OwnedFd>,
    counters: Arc<HttpCounters>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    // The bearer lives on the thread; nothing here prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Bind `addr` (an IPv6 one keeps its scope). A taken port
    /// (`EADDRINUSE`) falls back to an ephemeral one and says so (`true`):
    /// the caller reports it.
    /// Port 0 is ephemeral from the start (`false`).
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<(TcpListener, bool)> {
        match TcpListener::bind(addr) {
            Ok(l) => Ok((l, false)),
            Err(e) if addr.port() != 0 && e.kind() == io::ErrorKind::AddrInUse => {
                let mut any = addr;
                any.set_port(0);
                Ok((TcpListener::bind(any)?, true))
            }
            Err(e) => Err(e),
        }
    }

    /// Serve `routes` on `listener` from one thread named `tent-http`,
    /// counting into `counters`; with a `bearer`, every path but its open
    /// ones needs its token.
    pub(crate) fn start(
        listener: TcpListener,
        routes: Arc<dyn Routes>,
        bearer: Option<Bearer>,
        counters: Arc<HttpCounters>,
    ) -> Result<HttpServer> {
        let io_err = |what: &'static str| {
            move |e: io::Error| Error::new(ErrorKind::InvalidArgument, what).with_source(e)
        };
        let addr = listener
            .local_addr()
            .map_err(io_err("http listener address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("http listener non-blocking"))?;
        let wake = Arc::new(
            event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "http wake eventfd")
                    .with_source(io::Error::from(e))
            })?,
        );
        let (wake2, counters2) = (Arc::clone(&wake), Arc::clone(&counters));
        let thread = std::thread::Builder::new()
            .name("tent-http".into())
            .spawn(move || serve(&listener, &wake2, &*routes, bearer.as_ref(), &counters2))
            .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn http server").with_source(e))?;
        Ok(HttpServer {
            addr,
            wake,
            counters,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters since start.
    pub(crate) fn stats(&self) -> HttpStats {
        self.counters.snapshot()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        // A non-blocking eventfd write fails only at a counter near
        // u64::MAX, which one write per server never reaches.
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a connection is in its one exchange.
enum State {
    /// Reading the request head into the buffer.
    Reading,
    /// Writing `outcome`'s head then body; `sent` bytes of the two are out.
    /// `again`: the connection reads the next request after it (keep-alive,
    /// and nothing was sent past this request's head).
    Writing {
        head: Vec<u8>,
        outcome: Outcome,
        sent: usize,
        again: bool,
    },
    /// Response out, write side shut: reading and dropping until EOF.
    Draining,
}

/// One accepted connection.
struct Conn {
    stream: TcpStream,
    /// Its place in accept order (the oldest is the first to make room).
    seq: u64,
    /// Closed then, whatever its state.
    deadline: Instant,
    /// The request head (and, draining, whatever follows it).
    buf: Box<[u8]>,
    filled: usize,
    state: State,
    /// Responses written in full on it.
    served: u32,
}

/// What a step did to a connection.
enum Step {
    /// Keep it.
    Open,
    /// Close it.
    Close,
}

impl Conn {
    /// How early this connection makes room for a newcomer at the cap
    /// (lower first; the oldest first within a rank), or `None` while it
    /// is answering its first request (bounded by its deadline):
    /// draining, then kept alive and idle, then sending a request, then
    /// answering a later request on a kept-alive connection (a client that
    /// reads each answer slowly and asks again would otherwise hold the
    /// slot for as long as it keeps asking).
    fn make_room_rank(&self) -> Option<u8> {
        match self.state {
            State::Draining => Some(0),
            State::Reading if self.served > 0 && self.filled == 0 => Some(1),
            State::Reading => Some(2),
            State::Writing { .. } if self.served > 0 => Some(3),
            State::Writing { .. } => None,
        }
    }

    fn interest(&self) -> PollFlags {
        match self.state {
            State::Writing { .. } => PollFlags::OUT,
            State::Reading | State::Draining => PollFlags::IN,
        }
    }

    /// Move what is ready, without blocking.
    fn step(
        &mut self,
        routes: &dyn Routes,
        bearer: Option<&Bearer>,
        counters: &HttpCounters,
    ) -> Step {
        if let State::Reading = self.state {
            let before = self.filled;
            match net::recv(&self.stream, &mut self.buf[before..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Step::Close,
                Ok((n, _)) => self.filled += n,
                Err(Errno::AGAIN | Errno::INTR) => return Step::Open,
                Err(_) => return Step::Close,
            }
            let (mut outcome, pipelined) = match request::head_end(&self.buf[..self.filled], before)
            {
                Some(end) => (
                    request::answer(&self.buf[..end], routes, bearer),
                    end < self.filled,
                ),
                None if self.filled == MAX_HEAD => (Outcome::head_too_large(), false),
                None => return Step::Open,
            };
            count(&outcome, counters);
            // Bytes past the head (a pipelined request, a body) are not
            // read: the connection closes after this answer. So does the
            // last one a connection may carry.
            outcome.keep_alive &= !pipelined && self.served + 1 < MAX_REQUESTS_PER_CONNECTION;
            self.state = State::Writing {
                head: outcome.head(),
                again: outcome.keep_alive,
                outcome,
                sent: 0,
            };
        }
        if let State::Writing {
            head,
            outcome,
            sent,
            again,
        } = &mut self.state
        {
            loop {
                let body = outcome.body();
                let rest = if *sent < head.len() {
                    &head[*sent..]
                } else if *sent - head.len() < body.len() {
                    &body[*sent - head.len()..]
                } else {
                    break;
                };
                match net::send(
                    &self.stream,
                    rest,
                    SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
                ) {
                    Ok(n) => *sent += n,
                    Err(Errno::INTR) => {}
                    Err(Errno::AGAIN) => return Step::Open,
                    Err(_) => return Step::Close,
                }
            }
            counters.served(outcome.response.status);
            self.served += 1;
            if *again {
                // The next exchange on it, with its own deadline.
                self.state = State::Reading;
                self.filled = 0;
                self.deadline = Instant::now() + EXCHANGE_TIMEOUT;
                return Step::Open;
            }
            if net::shutdown(&self.stream, Shutdown::Write).is_err() {
                return Step::Close;
            }
            self.state = State::Draining;
        }
        // Draining: drop what arrives until the client closes (a few
        // buffers a step, so a client that streams cannot hold the thread).
        for _ in 0..DRAIN_READS {
            match net::recv(&self.stream, &mut self.buf[..], RecvFlags::DONTWAIT) {
                Ok((0, _)) => return Step::Close,
                Ok(_) | Err(Errno::INTR) => {}
                Err(Errno::AGAIN) => return Step::Open,
                Err(_) => return Step::Close,
            }
        }
        Step::Open
    }
}

/// Count and log (once per cause, with counts) what `outcome` says of its request.
fn count(outcome: &Outcome, counters: &HttpCounters) {
    let status = outcome.response.status;
    match outcome.verdict {
        Verdict::Routed => return,
        Verdict::BadRequest => HttpCounters::bump(&counters.bad_request),
        Verdict::TooLarge => HttpCounters::bump(&counters.too_large),
        Verdict::Unauthorized => HttpCounters::bump(&counters.unauthorized),
    }
    warn_limited!(("http refused", status), status, "http: request refused");
}

/// The server thread: until the wake fd fires.
fn serve(
    listener: &TcpListener,
    wake: &OwnedFd,
    routes: &dyn Routes,
    bearer: Option<&Bearer>,
    counters: &HttpCounters,
) {
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut ready: Vec<PollFlags> = Vec::with_capacity(MAX_CONNECTIONS);
    let mut accept_paused_until: Option<Instant> = None;
    let mut accepted: u64 = 0;
    loop {
        let now = Instant::now();
        if accept_paused_until.is_some_and(|t| t <= now) {
            accept_paused_until = None;
        }
        let wake_at = conns
            .iter()
            .map(|c| c.deadline)
            .chain(accept_paused_until)
            .min();
        // Rounded up a millisecond: poll's granularity, so a wakeup is
        // never a hair before the deadline it is for.
        let timeout = wake_at.map(|t| {
            let d = t.saturating_duration_since(now) + Duration::from_millis(1);
            Timespec::try_from(d).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let listen = if accept_paused_until.is_some() {
            PollFlags::empty()
        } else {
            PollFlags::IN
        };
        let (woken, accept_ready) = {
            let mut fds = Vec::with_capacity(2 + conns.len());
            fds.push(PollFd::new(wake, PollFlags::IN));
            fds.push(PollFd::new(listener, listen));
            fds.extend(conns.iter().map(|c| PollFd::new(&c.stream, c.interest())));
            match event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(Errno::INTR) => {}
                Err(e) => {
                    tracing::error!(error = %io::Error::from(e), "http: poll failed; the endpoint stops");
                    return;
                }
            }
            ready.clear();
            ready.extend(fds[2..].iter().map(PollFd::revents));
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
        };
        if woken {
            return;
        }
        // The connections first (their indices match `ready`), then the
        // deadlines, then newcomers.
        let mut r = ready.iter();
        conns.retain_mut(|c| {
            let flags = r.next().copied().unwrap_or(PollFlags::empty());
            if flags.is_empty() {
                return true;
            }
            matches!(c.step(routes, bearer, counters), Step::Open)
        });
        let now = Instant::now();
        conns.retain(|c| {
            if c.deadline > now {
                return true;
            }
            // Draining, or kept alive and idle since its last answer: a
            // close, not a client that failed its exchange.
            let idle = matches!(c.state, State::Reading) && c.served > 0 && c.filled == 0;
            if !matches!(c.state, State::Draining) && !idle {
                HttpCounters::bump(&counters.timed_out);
                warn_limited!(
                    "http deadline",
                    timeout_ms = EXCHANGE_TIMEOUT.as_millis() as u64,
                    "http: a connection's exchange passed its deadline; closed"
                );
            }
            false
        });
        if accept_ready {
            accept_paused_until = accept(listener, &mut conns, &mut accepted, counters, now);
        }
    }
}

/// Accept what is waiting (at most [`ACCEPTS_PER_WAKE`]); `accepted`
/// counts every connection ever accepted (the next one's `seq`). Over the
/// cap a connection makes room for a newcomer in the order
/// [`Conn::make_room_rank`] gives, but only one accepted before this call: one of
/// this batch has not been read yet, so the rest wait in the listen queue
/// until the next round has read it (a flood accepted in one batch would
/// otherwise close its own members, a probe among them, unread). With
/// every slot answering, a newcomer is closed. Returns when to poll the
/// listener again after it failed for want of resources.
fn accept(
    listener: &TcpListener,
    conns: &mut Vec<Conn>,
    accepted: &mut u64,
    counters: &HttpCounters,
    now: Instant,
) -> Option<Instant> {
    let batch = *accepted;
    for _ in 0..ACCEPTS_PER_WAKE {
        let mut room = None;
        if conns.len() >= MAX_CONNECTIONS {
            room = conns
                .iter()
                .enumerate()
                .filter(|(_, c)| c.seq < batch)
                .filter_map(|(i, c)| Some(((c.make_room_rank()?, c.seq), i)))
                .min()
                .map(|(_, i)| i);
            if room.is_none() && conns.iter().any(|c| c.make_room_rank().is_some()) {
                // Only this batch's are left to close: read them first.
                return None;
            }
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue;
            }
            Err(e) => {
                warn_limited!(("http accept", e.kind()), error = %e, "http: accept failed; pausing accepts");
                return Some(now + ACCEPT_BACKOFF);
            }
        };
        if conns.len() >= MAX_CONNECTIONS {
            HttpCounters::bump(&counters.evicted);
            warn_limited!(
                "http cap",
                cap = MAX_CONNECTIONS,
                "http: connection cap reached; the oldest unanswered connection is closed for a newcomer"
            );
            match room {
                Some(i) => drop(conns.swap_remove(i)),
                // Every slot is answering: the newcomer goes.
                None => continue,
            }
        }
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let _ = stream.set_nodelay(true);
        HttpCounters::bump(&counters.accepted);
        let seq = *accepted;
        *accepted += 1;
        conns.push(Conn {
            stream,
            seq,
            deadline: now + EXCHANGE_TIMEOUT,
            buf: vec![0; MAX_HEAD].into_boxed_slice(),
            filled: 0,
            state: State::Reading,
            served: 0,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read};
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    use super::{Conn, HttpCounters, MAX_CONNECTIONS, accept};

    /// Open and accepted: a read finds nothing yet (closed: EOF or reset).
    fn open(c: &mut TcpStream) -> bool {
        matches!(c.read(&mut [0; 1]), Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    /// A flood accepted in one batch over a full table does not close its
    /// own unread members: a probe in the middle of it stays open (before,
    /// each newcomer past the old ones closed the one accepted just before
    /// it, and a probe at position 63..126 of a batch of 128 was closed
    /// unread).
    #[test]
    fn a_flood_in_one_accept_batch_does_not_close_its_own_members() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let a = l.local_addr().unwrap();
        let (counters, now) = (HttpCounters::default(), Instant::now());
        let (mut conns, mut seq): (Vec<Conn>, u64) = (Vec::new(), 0);
        let mut clients: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(a).unwrap())
            .collect();
        while conns.len() < MAX_CONNECTIONS {
            assert!(now.elapsed() < Duration::from_secs(5), "first batch not accepted");
            accept(&l, &mut conns, &mut seq, &counters, now);
        }
        // A second batch, queued before the server looks: 80 stalled
        // connections, a probe, 40 more.
        for _ in 0..80 {
            clients.push(TcpStream::connect(a).unwrap());
        }
        let mut probe = TcpStream::connect(a).unwrap();
        for _ in 0..40 {
            clients.push(TcpStream::connect(a).unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
        accept(&l, &mut conns, &mut seq, &counters, now);
        assert_eq!(conns.len(), MAX_CONNECTIONS);
        assert!(
            conns.iter().all(|c| c.seq >= MAX_CONNECTIONS as u64),
            "the first batch made room"
        );
        probe.set_nonblocking(true).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(open(&mut probe), "the probe was closed unread");
        // The next round (its batch read by then) makes room from it, the
        // oldest first: the probe is accepted in time.
        accept(&l, &mut conns, &mut seq, &counters, now);
        std::thread::sleep(Duration::from_millis(50));
        assert!(open(&mut probe), "the probe was closed unread");
        drop(clients);
    }

    /// A kept-alive connection answering a later request makes room at the
    /// cap (a client that reads each answer slowly and asks again cannot
    /// hold a slot for ever); one answering its first does not (its
    /// deadline bounds it).
    #[test]
    fn at_the_cap_a_kept_alive_connection_answering_again_makes_room() {
        use super::State;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let a = l.local_addr().unwrap();
        let (counters, now) = (HttpCounters::default(), Instant::now());
        let (mut conns, mut seq): (Vec<Conn>, u64) = (Vec::new(), 0);
        let _clients: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(a).unwrap())
            .collect();
        while conns.len() < MAX_CONNECTIONS {
            assert!(now.elapsed() < Duration::from_secs(5), "not accepted");
            accept(&l, &mut conns, &mut seq, &counters, now);
        }
        let writing = || {
            let outcome = super::Outcome::head_too_large();
            State::Writing {
                head: outcome.head(),
                outcome,
                sent: 0,
                again: true,
            }
        };
        // Every slot answering its first request: a newcomer is closed.
        for c in &mut conns {
            c.state = writing();
        }
        let mut late = TcpStream::connect(a).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        accept(&l, &mut conns, &mut seq, &counters, now);
        assert!(conns.iter().all(|c| c.seq < MAX_CONNECTIONS as u64));
        late.set_nonblocking(true).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!open(&mut late), "a first answer lost its slot");
        // The same slots answering later requests on kept-alive
        // connections: the oldest makes room.
        for c in &mut conns {
            c.served = 3;
        }
        let mut probe = TcpStream::connect(a).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        accept(&l, &mut conns, &mut seq, &counters, now);
        assert!(conns.iter().all(|c| c.seq != 0), "the oldest made room");
        assert!(conns.iter().any(|c| c.seq == MAX_CONNECTIONS as u64), "the newcomer has it");
        probe.set_nonblocking(true).unwrap();
        assert!(open(&mut probe), "the newcomer was closed");
    }
}
