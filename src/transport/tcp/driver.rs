//! A worker's TCP connections and the queue that carries their socket
//! operations ([`Backend`]): the worker posts into a connection, and one
//! [`Driver::turn`] per worker turn reaps what the kernel finished, moves
//! every connection with work in hand on, and hands the kernel what that
//! queued: at most one `io_uring_enter`.
//!
//! Connections ([`Link`]) live in a slab and are named by index (an
//! operation's tag carries it). A peer's per-worker state keeps the indices
//! of its connections; when the peer is gone, its connections are closed
//! by the next sweep (they hold nothing by then: a peer stays attached
//! while a worker has slices on it).

use std::sync::Weak;
use std::time::{Duration, Instant};

use tent_rings::ErrorKind;

use super::backend::{Backend, Choice};
use super::link::{Cx, Link, tag_link};
use super::op::Op;
use crate::error::{Error, Result};

/// How often the slab is swept for connections of peers that are gone.
const SWEEP_NS: u64 = 1_000_000_000;
/// How long dropping a driver waits for its sockets' last completions.
const DRAIN: Duration = Duration::from_secs(2);

/// One slab entry.
struct Entry {
    link: Box<Link>,
    /// Alive while its peer is.
    owner: Weak<()>,
    /// On the busy list.
    busy: bool,
}

/// A worker's TCP connections and their backend.
pub(super) struct Driver {
    choice: Choice,
    entries: u32,
    /// Built on the first connection (on the worker's thread).
    be: Option<Backend>,
    slab: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// Connections with something in hand, each once.
    busy: Vec<u32>,
    last_sweep: u64,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("backend", &self.be.as_ref().map(Backend::name))
            .field("links", &(self.slab.len() - self.free.len()))
            .field("busy", &self.busy.len())
            .finish()
    }
}

impl Driver {
    /// A driver whose backend (built with its first connection) is
    /// `choice`, with room for `entries` operations at once.
    pub(super) fn new(choice: Choice, entries: u32) -> Driver {
        Driver {
            choice,
            entries,
            be: None,
            slab: Vec::new(),
            free: Vec::new(),
            busy: Vec::with_capacity(64),
            last_sweep: 0,
        }
    }

    /// Add a connection built by `make(id)`, owned by whoever holds
    /// `owner`'s strong end.
    pub(super) fn add(
        &mut self,
        owner: Weak<()>,
        make: impl FnOnce(u32) -> Box<Link>,
    ) -> Result<u32> {
        if self.be.is_none() {
            let be = Backend::new(self.choice, self.entries).map_err(|e| {
                Error::new(
                    ErrorKind::OutOfMemory,
                    "tcp: cannot build the worker's socket queue",
                )
                .with_source(e)
            })?;
            tracing::debug!(backend = be.name(), "tcp worker socket queue up");
            self.be = Some(be);
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = u32::try_from(self.slab.len())
                    .map_err(|_| Error::new(ErrorKind::OutOfMemory, "tcp: too many connections"))?;
                self.slab.push(None);
                id
            }
        };
        self.slab[id as usize] = Some(Entry {
            link: make(id),
            owner,
            busy: false,
        });
        Ok(id)
    }

    /// Connection `id`.
    #[inline]
    pub(super) fn link(&mut self, id: u32) -> &mut Link {
        &mut self.slab[id as usize]
            .as_mut()
            .expect("a live connection id")
            .link
    }

    /// Slices on connection `id`'s wire.
    #[inline]
    pub(super) fn on_wire(&self, id: u32) -> usize {
        self.slab[id as usize]
            .as_ref()
            .map_or(0, |e| e.link.on_wire())
    }

    /// How a HIGH slice ranks connection `id` at `now` ([`Link::high_rank`]).
    #[inline]
    pub(super) fn high_rank(&self, id: u32, now: u64) -> usize {
        self.slab[id as usize]
            .as_ref()
            .map_or(usize::MAX, |e| e.link.high_rank(now))
    }

    /// Queue `op` on connection `id`; `Err` gives it back (queue full).
    #[inline]
    pub(super) fn post(&mut self, id: u32, op: Op, class: usize) -> std::result::Result<(), Op> {
        let e = self.slab[id as usize]
            .as_mut()
            .expect("a live connection id");
        e.link.post(op, class)?;
        if !e.busy {
            e.busy = true;
            self.busy.push(id);
        }
        Ok(())
    }

    /// Abort `token`'s slices on connection `id` (see [`Link::abort_token`]).
    pub(super) fn abort_token(&mut self, id: u32, token: u64, kind: ErrorKind, now: u64) {
        let Some(be) = self.be.as_mut() else {
            return;
        };
        if let Some(e) = self.slab[id as usize].as_mut() {
            let mut cx = Cx {
                be,
                now,
                stopping: false,
            };
            e.link.abort_token(token, kind, &mut cx);
        }
    }

    /// One worker turn: reap, move every busy connection on, flush.
    pub(super) fn turn(&mut self, now: u64) {
        let Some(be) = self.be.as_mut() else {
            return;
        };
        let slab = &mut self.slab;
        if matches!(be, Backend::Epoll(_)) {
            // Readiness is only learnt here: a target that closed an idle
            // connection is seen before a slice is sent on it.
            be.flush(None);
        }
        be_reap(be, slab, &mut self.busy, now);
        let mut cx = Cx {
            be,
            now,
            stopping: false,
        };
        let mut i = 0;
        while i < self.busy.len() {
            let id = self.busy[i] as usize;
            let Some(e) = slab[id].as_mut() else {
                self.busy.swap_remove(i);
                continue;
            };
            e.link.tick(&mut cx);
            if e.link.busy() {
                i += 1;
            } else {
                e.busy = false;
                self.busy.swap_remove(i);
            }
        }
        cx.be.flush(None);
        if now.saturating_sub(self.last_sweep) >= SWEEP_NS {
            self.last_sweep = now;
            self.sweep(now);
        }
    }

    /// Sleep the worker until a completion, its bell `word` moving off
    /// `seen`, or `timeout` (see [`Transport::park`]).
    ///
    /// [`Transport::park`]: crate::transport::Transport::park
    pub(super) fn park(
        &mut self,
        word: &std::sync::atomic::AtomicU32,
        seen: u32,
        timeout: Duration,
    ) {
        match self.be.as_mut() {
            Some(Backend::Uring(u)) => u.park(word, seen, timeout),
            _ => crate::doorbell::wait_on(word, seen, timeout),
        }
    }

    /// Slices on the wire over every busy connection.
    pub(super) fn wire_total(&self) -> u32 {
        self.busy
            .iter()
            .filter_map(|&id| self.slab[id as usize].as_ref())
            .map(|e| e.link.on_wire() as u32)
            .sum()
    }

    /// Close and free the connections of peers that are gone.
    fn sweep(&mut self, now: u64) {
        let Some(be) = self.be.as_mut() else {
            return;
        };
        let mut cx = Cx {
            be,
            now,
            stopping: false,
        };
        for (id, slot) in self.slab.iter_mut().enumerate() {
            let Some(e) = slot.as_mut() else {
                continue;
            };
            if e.owner.strong_count() != 0 || e.busy || e.link.busy() {
                continue;
            }
            // Its armed receive (if any) is cancelled; freed once back.
            e.link.close_idle(&mut cx);
            if e.link.outstanding() {
                if !e.busy && e.link.busy() {
                    e.busy = true;
                    self.busy.push(id as u32);
                }
                continue;
            }
            *slot = None;
            self.free.push(id as u32);
        }
    }
}

/// Hand every ready completion to its connection; one that needs turns
/// from then on joins `busy`.
fn be_reap(be: &mut Backend, slab: &mut [Option<Entry>], busy: &mut Vec<u32>, now: u64) {
    // Completions are gathered first: a connection's step pushes to the
    // same backend.
    let mut ready = [(0u64, 0i32); 64];
    loop {
        let n = be.reap(&mut ready);
        if n == 0 {
            return;
        }
        let mut cx = Cx {
            be,
            now,
            stopping: false,
        };
        for &(tag, res) in &ready[..n] {
            let id = tag_link(tag);
            if let Some(Some(e)) = slab.get_mut(id as usize) {
                e.link.on_completion(tag, res, &mut cx);
                if !e.busy && e.link.busy() {
                    e.busy = true;
                    busy.push(id);
                }
            }
        }
        if n < ready.len() {
            return;
        }
    }
}

impl Driver {
    /// Close every socket; wait (bounded) for what was outstanding on
    /// them; let the backend go. The driver builds a new one if used again.
    pub(super) fn close(&mut self) {
        let Some(mut be) = self.be.take() else {
            return;
        };
        let start = Instant::now();
        loop {
            let mut left = false;
            {
                let mut cx = Cx {
                    be: &mut be,
                    now: crate::clock::monotonic_ns(),
                    stopping: true,
                };
                for e in self.slab.iter_mut().flatten() {
                    left |= e.link.shut(&mut cx);
                }
            }
            if !left {
                break;
            }
            if start.elapsed() > DRAIN {
                tracing::error!(
                    "tcp: socket operations still outstanding after {DRAIN:?}; leaving the queue open"
                );
                // The kernel may still write into their buffers (a stage,
                // a handshake buffer): never close the ring under them, nor
                // free the connections its operations point into.
                std::mem::forget(be);
                std::mem::forget(std::mem::take(&mut self.slab));
                self.free.clear();
                self.busy.clear();
                return;
            }
            be.flush(Some(Duration::from_millis(10)));
            be_reap(
                &mut be,
                &mut self.slab,
                &mut self.busy,
                crate::clock::monotonic_ns(),
            );
        }
        for e in self.slab.iter_mut().flatten() {
            e.busy = false;
        }
        self.busy.clear();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp::op::{BULK, Endpoint, Options, new_session};
    use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tent_rings::Opcode;

    /// Longer than any bound below: a wait that lasts until the connect
    /// gives up fails these tests.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
    /// How soon a cut connect hands its slice back. The netns chaos test
    /// allows 2 s for the whole move; this is the connection's share.
    const PROMPT: Duration = Duration::from_secs(1);

    const BACKENDS: [Choice; 2] = [Choice::IoUring, Choice::Epoll];

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

    /// The next connection to `l`, its handshake served (no secret).
    fn accept_served(l: &TcpListener) -> TcpStream {
        let (s, _) = l.accept().unwrap();
        crate::transport::tcp::handshake::serve(
            &s,
            None,
            Instant::now() + CONNECT_TIMEOUT,
            |_| {},
        )
        .unwrap();
        s
    }

    /// A loopback rail to `remote` (up), and connection options with
    /// connect timeout and patience `timeout`, no secret.
    fn loopback(remote: SocketAddr, timeout: Duration) -> (Arc<Endpoint>, Arc<Options>) {
        let endpoint = Arc::new(Endpoint {
            local_ip: IpAddr::from([127, 0, 0, 1]),
            remote,
            up: AtomicBool::new(true),
        });
        let opts = Arc::new(Options {
            user_timeout_ms: 0,
            connect_timeout: timeout,
            patience: timeout,
            secret: None,
            session: new_session(),
        });
        (endpoint, opts)
    }

    /// A driver with one connection to `remote`, owned by the returned
    /// token (connect timeout `timeout`).
    fn rig(choice: Choice, remote: SocketAddr, timeout: Duration) -> (Driver, u32, Arc<()>) {
        let mut d = Driver::new(choice, 64);
        let owner = Arc::new(());
        let (endpoint, opts) = loopback(remote, timeout);
        let id = d
            .add(Arc::downgrade(&owner), |id| {
                Link::new(id, endpoint, opts, Arc::default(), Arc::default(), 4, 2 << 20)
            })
            .unwrap();
        (d, id, owner)
    }

    /// Bulk WRITEs to a target that handshakes three connections and then
    /// reads nothing, from two workers' drivers (two connections on the
    /// first, one on the second) whose caps share one HIGH hold: while
    /// HIGH flows, each worker has one slice on the wire, whatever its
    /// connections' windows; once the hold runs out (the turns' clock
    /// moved past it), each connection fills its own window.
    #[test]
    fn while_high_flows_each_worker_keeps_one_cap_of_bulk_on_a_rail() {
        use crate::transport::tcp::cap::{BulkCap, HighHold};
        const CONNS: usize = 3;
        const SLICE: usize = 16 << 10;
        // Shorter than `RECONNECT_IDLE`: the clock moved past it leaves the
        // connections un-retired.
        const HOLD: Duration = Duration::from_secs(5);
        for choice in BACKENDS {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            let target =
                std::thread::spawn(move || (0..CONNS).map(|_| accept_served(&l)).collect::<Vec<_>>());
            // Connection n is driver n % 2's.
            let mut ds = [Driver::new(choice, 64), Driver::new(choice, 64)];
            let owner = Arc::new(());
            let (endpoint, opts) = loopback(at, CONNECT_TIMEOUT);
            let hold = Arc::new(HighHold::new(HOLD.as_nanos() as u64));
            let caps = [0, 1].map(|_| Arc::new(BulkCap::new(SLICE as u64, hold.clone())));
            let ids: Vec<u32> = (0..CONNS)
                .map(|n| {
                    let to = (&endpoint, &opts);
                    capped_link(&mut ds[n % 2], &owner, to, &caps[n % 2], 2 * SLICE as u64)
                })
                .collect();
            let held_from = crate::clock::monotonic_ns();
            hold.saw_high(held_from);
            let buf = vec![7u8; SLICE];
            for (n, &id) in ids.iter().enumerate() {
                for k in 0..2 {
                    let op = write_op((n * 2 + k) as u64, &buf);
                    ds[n % 2].post(id, op, BULK).unwrap();
                }
            }
            // Slices on the wire per driver.
            let on_wire = |ds: &mut [Driver; 2]| {
                let mut w = [0usize; 2];
                for (n, &id) in ids.iter().enumerate() {
                    w[n % 2] += ds[n % 2].on_wire(id);
                }
                w
            };
            let ready = |ds: &mut [Driver; 2]| {
                ids.iter()
                    .enumerate()
                    .all(|(n, &id)| ds[n % 2].link(id).is_ready())
            };
            // Held: every connection opens; each worker sends one slice.
            let t = Instant::now();
            let mut settled = 0;
            while settled < 20 {
                let now = crate::clock::monotonic_ns();
                assert!(now < held_from + HOLD.as_nanos() as u64);
                for d in &mut ds {
                    d.turn(now);
                }
                let w = on_wire(&mut ds);
                assert!(
                    w[0] <= 1 && w[1] <= 1,
                    "{choice:?}: {w:?} bulk slices on the wire beside HIGH"
                );
                if ready(&mut ds) && w == [1, 1] {
                    settled += 1;
                }
                assert!(t.elapsed() < PROMPT * 4, "{choice:?}: {w:?} never settled");
                std::thread::sleep(Duration::from_millis(1));
            }
            // The hold ran out: every connection fills its window.
            let t = Instant::now();
            loop {
                let now = crate::clock::monotonic_ns() + HOLD.as_nanos() as u64;
                for d in &mut ds {
                    d.turn(now);
                }
                let w = on_wire(&mut ds);
                if w == [4, 2] {
                    break;
                }
                assert!(t.elapsed() < PROMPT, "{choice:?}: {w:?} once the hold ran out");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(caps[0].on_wire(), (4 * SLICE) as u64, "{choice:?}");
            assert_eq!(caps[1].on_wire(), (2 * SLICE) as u64, "{choice:?}");
            drop(ds);
            drop(target.join().unwrap());
        }
    }

    /// Answers every request on `s` (a WRITE once its payload is read)
    /// until the initiator closes it.
    fn answer_writes(mut s: TcpStream) {
        use crate::transport::tcp::frame::{REQUEST_LEN, Request, Response};
        use std::io::{Read, Write};
        let mut payload = vec![0u8; 1 << 20];
        loop {
            let mut h = [0u8; REQUEST_LEN];
            if s.read_exact(&mut h).is_err() {
                return;
            }
            let Ok(r) = Request::decode(&h) else { return };
            if r.opcode == Opcode::Write && s.read_exact(&mut payload[..r.len as usize]).is_err() {
                return;
            }
            let answer = Response {
                status: Ok(()),
                seq: r.seq,
                len: r.len,
            };
            if s.write_all(&answer.encode()).is_err() {
                return;
            }
        }
    }

    /// A HIGH slice ranks a connection by its slices on the wire only while
    /// it would send at once: not before it is up, nor once it has idled
    /// long enough to be replaced before its next send.
    #[test]
    fn high_ranks_a_connection_only_while_it_would_send_at_once() {
        use crate::transport::tcp::op::{EXPRESS, RECONNECT_IDLE};
        for choice in BACKENDS {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            let target = std::thread::spawn(move || answer_writes(accept_served(&l)));
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let now = crate::clock::monotonic_ns();
            assert_eq!(d.high_rank(id, now), usize::MAX, "{choice:?}: not made");
            let buf = vec![7u8; 4096];
            let mut op = write_op(1, &buf);
            op.set_urgent();
            d.post(id, op, EXPRESS).unwrap();
            d.turn(now);
            assert_eq!(d.high_rank(id, now), usize::MAX, "{choice:?}: opening");
            let (op, _) = slice_back(&mut d, id, PROMPT).unwrap();
            assert_eq!(op.result(), Ok(4096));
            let sent = crate::clock::monotonic_ns();
            assert_eq!(d.high_rank(id, sent), 0, "{choice:?}: up and idle");
            let idle = RECONNECT_IDLE.as_nanos() as u64;
            assert_eq!(d.high_rank(id, sent + idle / 2), 0, "{choice:?}");
            assert_eq!(
                d.high_rank(id, sent + 2 * idle),
                usize::MAX,
                "{choice:?}: idle past RECONNECT_IDLE: replaced before it sends"
            );
            drop(d);
            target.join().unwrap();
        }
    }

    /// While HIGH flows, a bulk slice a worker queued on one connection is
    /// not passed over for ever by the newer bulk it keeps posting to
    /// another that ticks first in every turn: the cap lets the oldest
    /// slice it turned away go next.
    #[test]
    fn older_bulk_on_a_connection_late_in_the_turn_goes_while_another_is_kept_fed() {
        use crate::transport::tcp::cap::{BulkCap, HighHold};
        const SLICE: usize = 16 << 10;
        for choice in BACKENDS {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            let target = std::thread::spawn(move || {
                (0..2)
                    .map(|_| {
                        let s = accept_served(&l);
                        std::thread::spawn(move || answer_writes(s))
                    })
                    .collect::<Vec<_>>()
            });
            let mut d = Driver::new(choice, 64);
            let owner = Arc::new(());
            let (endpoint, opts) = loopback(at, CONNECT_TIMEOUT);
            let hold = Arc::new(HighHold::new(Duration::from_secs(10).as_nanos() as u64));
            let cap = Arc::new(BulkCap::new(SLICE as u64, hold.clone()));
            let to = (&endpoint, &opts);
            let a = capped_link(&mut d, &owner, to, &cap, 2 * SLICE as u64);
            let b = capped_link(&mut d, &owner, to, &cap, 2 * SLICE as u64);
            let buf = vec![7u8; SLICE];
            let mut token = 0u64;
            let mut slice = || {
                token += 1;
                write_op(token, &buf)
            };
            // Both connect and carry a slice before HIGH flows.
            d.post(a, slice(), BULK).unwrap();
            d.post(b, slice(), BULK).unwrap();
            let mut back = [0usize; 2];
            let t = Instant::now();
            while back != [1, 1] {
                d.turn(crate::clock::monotonic_ns());
                for (k, id) in [a, b].into_iter().enumerate() {
                    while d.link(id).done.pop_front().is_some() {
                        back[k] += 1;
                    }
                }
                assert!(t.elapsed() < PROMPT * 4, "{choice:?}: {back:?}");
                std::thread::sleep(Duration::from_micros(200));
            }
            d.turn(crate::clock::monotonic_ns());
            assert!(d.busy.is_empty(), "{choice:?}: {:?}", d.busy);
            // HIGH flows. B gets bulk first (so it ticks first in every
            // turn), A one slice after it; B is fed a new slice for each
            // that comes back.
            hold.saw_high(crate::clock::monotonic_ns());
            for _ in 0..4 {
                d.post(b, slice(), BULK).unwrap();
            }
            d.turn(crate::clock::monotonic_ns());
            d.post(a, slice(), BULK).unwrap();
            assert_eq!(d.busy.first(), Some(&b), "{choice:?}");
            let (mut from_a, mut from_b) = (0usize, 0usize);
            let t = Instant::now();
            while from_a == 0 {
                d.turn(crate::clock::monotonic_ns());
                assert!(d.on_wire(a) + d.on_wire(b) <= 1, "{choice:?}: past the cap");
                while d.link(b).done.pop_front().is_some() {
                    from_b += 1;
                    d.post(b, slice(), BULK).unwrap();
                }
                while d.link(a).done.pop_front().is_some() {
                    from_a += 1;
                }
                assert!(
                    t.elapsed() < PROMPT * 4,
                    "{choice:?}: A's slice passed over while B moved {from_b}"
                );
            }
            // B's four older slices went first, then A's, give or take a
            // newer one of B's each time this thread was off its core past
            // the waiter's silence (a loaded machine).
            assert!(from_b < 64, "{choice:?}: B moved {from_b} before A's older slice");
            drop(d);
            for h in target.join().unwrap() {
                let _ = h.join();
            }
        }
    }

    fn endpoint_of(d: &mut Driver, id: u32) -> Arc<Endpoint> {
        d.link(id).endpoint().clone()
    }

    /// A WRITE of `buf` to address 0 of key 1 (token `token`), posted now.
    fn write_op(token: u64, buf: &[u8]) -> Op {
        let mut op = Op::new(
            token,
            Opcode::Write,
            buf.as_ptr().cast_mut(),
            0,
            buf.len() as u64,
            1,
        );
        op.posted_ns = crate::clock::monotonic_ns();
        op
    }

    /// A connection on `d` to `endpoint` under `cap`, with a window of
    /// `window` bytes.
    fn capped_link(
        d: &mut Driver,
        owner: &Arc<()>,
        (endpoint, opts): (&Arc<Endpoint>, &Arc<Options>),
        cap: &Arc<crate::transport::tcp::cap::BulkCap>,
        window: u64,
    ) -> u32 {
        d.add(Arc::downgrade(owner), |id| {
            Link::new(
                id,
                endpoint.clone(),
                opts.clone(),
                Arc::default(),
                cap.clone(),
                4,
                window,
            )
        })
        .unwrap()
    }

    /// Queue one READ of `buf` (token `token`).
    fn post_read(d: &mut Driver, id: u32, token: u64, buf: &mut [u8]) {
        let mut op = Op::new(
            token,
            Opcode::Read,
            buf.as_mut_ptr(),
            0,
            buf.len() as u64,
            1,
        );
        op.posted_ns = crate::clock::monotonic_ns();
        d.post(id, op, BULK).unwrap();
    }

    /// Turn the driver until a slice comes back, up to `limit`.
    fn slice_back(d: &mut Driver, id: u32, limit: Duration) -> Option<(Op, Duration)> {
        let t = Instant::now();
        loop {
            d.turn(crate::clock::monotonic_ns());
            if let Some(op) = d.link(id).done.pop_front() {
                return Some((op, t.elapsed()));
            }
            if t.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Wait (up to `limit`, turning the driver) until a socket of this
    /// process is in SYN_SENT towards `remote`.
    fn until_syn_sent(d: &mut Driver, remote: SocketAddr, limit: Duration) {
        let want = format!("0100007F:{:04X}", remote.port());
        let t = Instant::now();
        loop {
            d.turn(crate::clock::monotonic_ns());
            if tcp_table().iter().any(|f| f[2] == want && f[3] == "02") {
                return;
            }
            assert!(t.elapsed() < limit, "the connect never went out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_connect_that_hangs_gives_its_slice_back_route_lost_when_the_link_goes_down() {
        for choice in BACKENDS {
            let (sink, _filler) = syn_sink();
            let at = sink.local_addr().unwrap().as_socket().unwrap();
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let mut buf = vec![0u8; 4096];
            post_read(&mut d, id, 7, &mut buf);
            until_syn_sent(&mut d, at, PROMPT);
            assert!(slice_back(&mut d, id, Duration::ZERO).is_none());
            endpoint_of(&mut d, id).up.store(false, Ordering::Release);
            let (op, took) = slice_back(&mut d, id, PROMPT).unwrap_or_else(|| {
                panic!("{choice:?}: the slice stayed with a hung connect for {PROMPT:?} after its link went down")
            });
            assert_eq!(
                op.result(),
                Err(ErrorKind::RouteLost),
                "{choice:?} after {took:?}"
            );
        }
    }

    #[test]
    fn a_handshake_that_hangs_gives_its_slice_back_route_lost_when_the_link_goes_down() {
        for choice in BACKENDS {
            // Takes the connection and never says hello.
            let mute = TcpListener::bind("127.0.0.1:0").unwrap();
            let (mut d, id, _owner) = rig(choice, mute.local_addr().unwrap(), CONNECT_TIMEOUT);
            let mut buf = vec![0u8; 4096];
            post_read(&mut d, id, 7, &mut buf);
            d.turn(crate::clock::monotonic_ns());
            let (_held, _) = mute.accept().unwrap();
            assert!(slice_back(&mut d, id, Duration::from_millis(20)).is_none());
            endpoint_of(&mut d, id).up.store(false, Ordering::Release);
            let (op, took) = slice_back(&mut d, id, PROMPT).unwrap_or_else(|| {
                panic!("{choice:?}: the slice stayed with a hung handshake for {PROMPT:?} after its link went down")
            });
            assert_eq!(
                op.result(),
                Err(ErrorKind::RouteLost),
                "{choice:?} after {took:?}"
            );
        }
    }

    #[test]
    fn a_connect_past_its_deadline_fails_every_queued_slice_with_timeout() {
        for choice in BACKENDS {
            let (sink, _filler) = syn_sink();
            let at = sink.local_addr().unwrap().as_socket().unwrap();
            let (mut d, id, _owner) = rig(choice, at, Duration::from_millis(100));
            let mut bufs = vec![vec![0u8; 64]; 3];
            for (i, b) in bufs.iter_mut().enumerate() {
                post_read(&mut d, id, i as u64 + 1, b);
            }
            let mut back = Vec::new();
            let t = Instant::now();
            while back.len() < 3 {
                let (op, _) = slice_back(&mut d, id, PROMPT).expect("queued slices stayed");
                back.push(op.result());
            }
            assert!(t.elapsed() < PROMPT, "{choice:?}: {:?}", t.elapsed());
            assert!(
                back.iter().all(|r| *r == Err(ErrorKind::Timeout)),
                "{choice:?}: {back:?}"
            );
        }
    }

    #[test]
    fn a_refused_connect_fails_every_queued_slice_at_once() {
        for choice in BACKENDS {
            // Bound and closed: nothing listens there.
            let at = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let mut bufs = vec![vec![0u8; 64]; 2];
            for (i, b) in bufs.iter_mut().enumerate() {
                post_read(&mut d, id, i as u64 + 1, b);
            }
            for _ in 0..2 {
                let (op, _) = slice_back(&mut d, id, PROMPT).expect("a queued slice stayed");
                assert_eq!(op.result(), Err(ErrorKind::ProcessFailed), "{choice:?}");
            }
        }
    }

    #[test]
    fn dropping_the_driver_cuts_a_connect_that_hangs() {
        for choice in BACKENDS {
            let (sink, _filler) = syn_sink();
            let at = sink.local_addr().unwrap().as_socket().unwrap();
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let mut buf = vec![0u8; 4096];
            post_read(&mut d, id, 7, &mut buf);
            until_syn_sent(&mut d, at, PROMPT);
            let t = Instant::now();
            drop(d);
            assert!(
                t.elapsed() < PROMPT,
                "{choice:?}: dropping took {:?}",
                t.elapsed()
            );
        }
    }

    /// A link that is down before the slice arrives: the slice comes back
    /// at once, never having waited on a connect.
    #[test]
    fn a_slice_for_a_rail_whose_link_is_down_comes_back_route_lost() {
        for choice in BACKENDS {
            let (sink, _filler) = syn_sink();
            let at = sink.local_addr().unwrap().as_socket().unwrap();
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            endpoint_of(&mut d, id).up.store(false, Ordering::Release);
            let mut buf = vec![0u8; 4096];
            post_read(&mut d, id, 7, &mut buf);
            let (op, _) = slice_back(&mut d, id, PROMPT).expect("the slice was not handed back");
            assert_eq!(op.result(), Err(ErrorKind::RouteLost), "{choice:?}");
        }
    }

    /// A target whose hello answers with any refusal kind ends the queued
    /// slices with it: the connection does not reconnect for them in a
    /// loop (a refusal of `Canceled` once looked like our own cancel).
    #[test]
    fn a_hello_refused_with_any_kind_ends_the_queued_slices() {
        use crate::transport::tcp::frame::{HELLO_LEN, Hello};
        use std::io::{Read, Write};
        for choice in BACKENDS {
            for kind in [
                ErrorKind::Canceled,
                ErrorKind::AccessDenied,
                ErrorKind::Timeout,
            ] {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let at = l.local_addr().unwrap();
                let target = std::thread::spawn(move || {
                    let mut accepted = 0;
                    l.set_nonblocking(true).unwrap();
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_millis(500) {
                        match l.accept() {
                            Ok((mut s, _)) => {
                                s.set_nonblocking(false).unwrap();
                                accepted += 1;
                                let mut h = [0u8; HELLO_LEN];
                                if s.read_exact(&mut h).is_ok() {
                                    let _ = s.write_all(&Hello::refusal(kind).encode());
                                }
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(1)),
                        }
                    }
                    accepted
                });
                let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
                let mut buf = vec![0u8; 64];
                post_read(&mut d, id, 7, &mut buf);
                let (op, _) = slice_back(&mut d, id, PROMPT).expect("the slice stayed queued");
                assert_eq!(op.result(), Err(kind), "{choice:?}");
                // Idle now: no connect goes out for nothing.
                for _ in 0..50 {
                    d.turn(crate::clock::monotonic_ns());
                    std::thread::sleep(Duration::from_millis(2));
                }
                let accepted = target.join().unwrap();
                assert_eq!(
                    accepted, 1,
                    "{choice:?} {kind:?}: connects with nothing queued"
                );
            }
        }
    }

    /// An honest target answers the first WRITE of a batch as soon as it
    /// has read it, while a large WRITE later in the same batch is still
    /// leaving (the target reads it slowly, for longer than the early-answer
    /// grace): the first completes at once, and nothing is torn down (the
    /// answer counted as early once the batch, not the slice, was judged).
    #[test]
    fn an_answer_to_a_slice_sent_whole_is_not_held_behind_a_large_payload_after_it() {
        use crate::transport::tcp::frame::{REQUEST_LEN, Request, Response};
        use std::io::{Read, Write};
        const SMALL: usize = 64;
        const LARGE: usize = 48 << 20;
        for choice in BACKENDS {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            let target = std::thread::spawn(move || {
                let mut s = accept_served(&l);
                let answer = |s: &mut TcpStream| {
                    let mut h = [0u8; REQUEST_LEN];
                    s.read_exact(&mut h).unwrap();
                    let req = Request::decode(&h).unwrap();
                    (req.seq, req.len)
                };
                let (seq, len) = answer(&mut s);
                let mut small = vec![0u8; len as usize];
                s.read_exact(&mut small).unwrap();
                s.write_all(
                    &Response {
                        status: Ok(()),
                        seq,
                        len,
                    }
                    .encode(),
                )
                .unwrap();
                // The large payload, slowly: 1 MiB every 40 ms (about 2 s).
                let (seq, len) = answer(&mut s);
                let mut chunk = vec![0u8; 1 << 20];
                let mut left = len as usize;
                while left > 0 {
                    let n = left.min(chunk.len());
                    s.read_exact(&mut chunk[..n]).unwrap();
                    left -= n;
                    std::thread::sleep(Duration::from_millis(40));
                }
                s.write_all(
                    &Response {
                        status: Ok(()),
                        seq,
                        len,
                    }
                    .encode(),
                )
                .unwrap();
                s
            });
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let small = vec![1u8; SMALL];
            let large = vec![2u8; LARGE];
            for (token, buf) in [(1u64, &small), (2u64, &large)] {
                d.post(id, write_op(token, buf), BULK).unwrap();
            }
            let (first, took) =
                slice_back(&mut d, id, Duration::from_secs(1)).unwrap_or_else(|| {
                    panic!("{choice:?}: the small WRITE's answer was held behind the large payload")
                });
            assert_eq!(
                (first.token, first.result()),
                (1, Ok(SMALL as u64)),
                "{choice:?} after {took:?}"
            );
            let (second, _) =
                slice_back(&mut d, id, Duration::from_secs(10)).expect("the large WRITE");
            assert_eq!(
                (second.token, second.result()),
                (2, Ok(LARGE as u64)),
                "{choice:?}"
            );
            drop(target.join().unwrap());
        }
    }

    /// A target that takes nothing for a while (its buffers full with a
    /// large WRITE) and then reads it all: the WRITE completes, the
    /// connection kept through the wait (a send the kernel answers
    /// `EAGAIN` is posted again; the target side's test that meets it is
    /// `server::tests::a_peer_that_half_closes_after_its_requests_gets_every_answer`).
    #[test]
    fn a_write_to_a_target_that_stops_reading_for_a_while_completes() {
        use crate::transport::tcp::frame::{REQUEST_LEN, Request, Response};
        use std::io::{Read, Write};
        const LARGE: usize = 48 << 20;
        for choice in BACKENDS {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let at = l.local_addr().unwrap();
            let target = std::thread::spawn(move || {
                let mut s = accept_served(&l);
                std::thread::sleep(Duration::from_millis(500));
                let mut h = [0u8; REQUEST_LEN];
                s.read_exact(&mut h).unwrap();
                let req = Request::decode(&h).unwrap();
                let mut payload = vec![0u8; req.len as usize];
                s.read_exact(&mut payload).unwrap();
                s.write_all(
                    &Response {
                        status: Ok(()),
                        seq: req.seq,
                        len: req.len,
                    }
                    .encode(),
                )
                .unwrap();
                s
            });
            let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
            let large = vec![2u8; LARGE];
            d.post(id, write_op(1, &large), BULK).unwrap();
            let (back, _) = slice_back(&mut d, id, Duration::from_secs(10)).expect("the WRITE");
            assert_eq!(back.result(), Ok(LARGE as u64), "{choice:?}");
            drop(target.join().unwrap());
        }
    }

    /// A target that breaks the response framing (a bad header, a wrong
    /// sequence number, a READ answered with another length, bytes with
    /// nothing outstanding) gets its connection torn down: the READ comes
    /// back `Unreachable` (or whole, when its own answer was good), and no
    /// byte lands past the READ's buffer. An error status is an answer, not
    /// a violation.
    #[test]
    fn a_target_breaking_the_response_framing_fails_the_slice_and_writes_nothing_past_it() {
        use crate::transport::tcp::frame::{REQUEST_LEN, RESPONSE_LEN, Request, Response};
        use std::io::{Read, Write};
        const LEN: usize = 4096;
        const CANARY: usize = 64;
        type Script = fn(u32, u64) -> Vec<u8>;
        let cases: [(&str, Script, std::result::Result<u64, ErrorKind>); 5] = [
            (
                "bad header",
                |_, _| vec![0x5a; RESPONSE_LEN],
                Err(ErrorKind::Unreachable),
            ),
            (
                "wrong seq",
                |seq, len| {
                    Response {
                        status: Ok(()),
                        seq: seq + 1,
                        len,
                    }
                    .encode()
                    .to_vec()
                },
                Err(ErrorKind::Unreachable),
            ),
            (
                "wrong len",
                |seq, len| {
                    let mut b = Response {
                        status: Ok(()),
                        seq,
                        len: len + 1,
                    }
                    .encode()
                    .to_vec();
                    b.extend(vec![0x77u8; len as usize + 1]);
                    b
                },
                Err(ErrorKind::Unreachable),
            ),
            (
                "bytes past the payload",
                |seq, len| {
                    let mut b = Response {
                        status: Ok(()),
                        seq,
                        len,
                    }
                    .encode()
                    .to_vec();
                    b.extend(vec![0x77u8; len as usize + 2 * RESPONSE_LEN]);
                    b
                },
                Ok(LEN as u64),
            ),
            (
                "an error status",
                |seq, _| {
                    Response {
                        status: Err(ErrorKind::AccessDenied),
                        seq,
                        len: 0,
                    }
                    .encode()
                    .to_vec()
                },
                Err(ErrorKind::AccessDenied),
            ),
        ];
        for choice in BACKENDS {
            for (what, script, want) in cases {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let at = l.local_addr().unwrap();
                let target = std::thread::spawn(move || {
                    let mut s = accept_served(&l);
                    let mut h = [0u8; REQUEST_LEN];
                    s.read_exact(&mut h).unwrap();
                    let req = Request::decode(&h).unwrap();
                    let _ = s.write_all(&script(req.seq, req.len));
                    // Held open until the initiator is done with it.
                    let mut sink = [0u8; 64];
                    let _ = s.read(&mut sink);
                });
                let (mut d, id, _owner) = rig(choice, at, CONNECT_TIMEOUT);
                let mut buf = vec![0xeeu8; LEN + CANARY];
                let mut op = Op::new(7, Opcode::Read, buf.as_mut_ptr(), 0, LEN as u64, 1);
                op.posted_ns = crate::clock::monotonic_ns();
                d.post(id, op, BULK).unwrap();
                let (back, _) = slice_back(&mut d, id, PROMPT)
                    .unwrap_or_else(|| panic!("{choice:?} {what}: the READ never came back"));
                assert_eq!(back.result(), want, "{choice:?} {what}");
                // Whatever follows, nothing is written past the buffer.
                for _ in 0..20 {
                    d.turn(crate::clock::monotonic_ns());
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(
                    buf[LEN..].iter().all(|&b| b == 0xee),
                    "{choice:?} {what}: bytes past the READ's buffer"
                );
                drop(d);
                target.join().unwrap();
            }
        }
    }

    /// A connection fenced by another that claims its session (a copy of
    /// this engine's session) while a WRITE's payload is half sent: the
    /// target tells it so, and the WRITE comes back `Unreachable`, not
    /// `ProcessFailed` (the target process is alive). The fence is served
    /// (the copy's next request is answered), on either backend.
    #[test]
    fn a_connection_fenced_by_a_copy_of_its_session_fails_unreachable_not_process_failed() {
        use crate::memory::{MemRegion, RegionTable};
        use crate::transport::tcp::frame::{Fence, REQUEST_LEN, RESPONSE_LEN, Request, Response};
        use crate::transport::tcp::server::{DataServer, ServeSettings};
        use std::io::{Read, Write};
        use tent_rings::RegionId;
        const LEN: usize = 64 << 20;
        for choice in BACKENDS {
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
                &[IpAddr::from([127, 0, 0, 1])],
                Arc::new(arc_swap::ArcSwap::from_pointee(table)),
                ServeSettings {
                    user_timeout_ms: 0,
                    secret: None,
                    threads: 1,
                    max_connections: 0,
                    backend: choice,
                },
            )
            .unwrap();
            let (mut d, id, _owner) = rig(choice, server.local_addr(), CONNECT_TIMEOUT);
            let payload = vec![0xabu8; LEN];
            let mut op = Op::new(
                1,
                Opcode::Write,
                payload.as_ptr().cast_mut(),
                region.addr(),
                LEN as u64,
                region.key(),
            );
            op.posted_ns = crate::clock::monotonic_ns();
            d.post(id, op, BULK).unwrap();
            // Turned until the payload starts landing, then left: the
            // WRITE stays half sent, the target inside its payload.
            let t = Instant::now();
            // SAFETY: the region's first byte is alive while `region` is; a racing write of it by the server is a plain byte store of 0xab.
            while unsafe { std::ptr::read_volatile(region.addr() as *const u8) } != 0xab {
                assert!(
                    t.elapsed() < PROMPT * 5,
                    "{choice:?}: the WRITE never reached the target"
                );
                d.turn(crate::clock::monotonic_ns());
                std::thread::sleep(Duration::from_micros(200));
            }
            let victim = d.link(id).ident();
            // The copy: the same session, another connection id.
            let mut copy = TcpStream::connect(server.local_addr()).unwrap();
            copy.set_read_timeout(Some(PROMPT * 5)).unwrap();
            let mine = crate::transport::tcp::frame::Ident {
                conn: victim.conn ^ 0x4000_0000,
                ..victim
            };
            crate::transport::tcp::handshake::open(
                &copy,
                None,
                Instant::now() + CONNECT_TIMEOUT,
                mine,
            )
            .unwrap();
            copy.write_all(&Fence { conn: victim.conn }.encode())
                .unwrap();
            let read = Request {
                opcode: Opcode::Read,
                seq: 1,
                addr: region.addr(),
                len: 8,
                key: region.key(),
            };
            copy.write_all(&read.encode()[..REQUEST_LEN]).unwrap();
            let mut h = [0u8; RESPONSE_LEN];
            copy.read_exact(&mut h)
                .unwrap_or_else(|e| panic!("{choice:?}: the fence was not served: {e}"));
            assert_eq!(
                Response::decode(&h).map(|r| r.status),
                Ok(Ok(())),
                "{choice:?}"
            );
            let (back, _) = slice_back(&mut d, id, PROMPT * 5)
                .unwrap_or_else(|| panic!("{choice:?}: the WRITE never came back"));
            assert_eq!(
                back.result(),
                Err(ErrorKind::Unreachable),
                "{choice:?}: a live target's fence is no dead process"
            );
        }
    }

    #[test]
    fn connections_of_a_peer_that_is_gone_are_swept() {
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mut d, id, owner) = rig(Choice::IoUring, mute.local_addr().unwrap(), CONNECT_TIMEOUT);
        drop(owner);
        d.sweep(crate::clock::monotonic_ns());
        assert!(d.slab[id as usize].is_none());
        assert_eq!(d.free, [id]);
    }
}
