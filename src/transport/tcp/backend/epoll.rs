//! The readiness-driven backend: non-blocking socket syscalls, tried when
//! they are pushed and, when they would block, tried again by a later
//! [`Epoll::flush`] once an edge-triggered epoll set says their socket is
//! ready.
//!
//! Its completions read exactly as io_uring's `res` for the same
//! operations (`IORING_OP_SENDMSG`, `IORING_OP_RECV`, `IORING_OP_CONNECT`):
//! the bytes moved (a send may be short; a receive of 0 is the peer's
//! close) or `-errno`; a connect is 0 once the connection is up, or the
//! socket's error. An operation that would block has done nothing, so a
//! cancelled one always completes with `-ECANCELED`.
//!
//! Nothing here allocates per operation: the per-socket state lives in a
//! `Vec` indexed by the fd number (grown when a larger number first
//! shows up), the completions in a queue sized for `entries` up front, and
//! `epoll_wait` fills a buffer made once.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::{Full, SockOp};

/// What a socket is registered for: every readiness, edge-triggered (each
/// operation is tried until it would block before it waits).
const INTEREST: u32 =
    (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;
/// Readiness that lets a waiting receive make progress (or fail).
const RECV_READY: u32 = (libc::EPOLLIN
    | libc::EPOLLPRI
    | libc::EPOLLRDHUP
    | libc::EPOLLERR
    | libc::EPOLLHUP) as u32;
/// Readiness that lets a waiting send or connect make progress (or fail).
const SEND_READY: u32 = (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32;
/// The most events one `epoll_wait` returns.
const MAX_EVENTS: usize = 1024;
/// The fewest.
const MIN_EVENTS: usize = 16;
/// fd numbers whose state is made up front.
const INITIAL_FDS: usize = 64;

/// A send waiting for its socket to take bytes.
#[derive(Debug, Clone, Copy)]
struct PendingSend {
    tag: u64,
    msg: *const libc::msghdr,
}

/// A receive waiting for bytes (or the peer's close).
#[derive(Debug, Clone, Copy)]
struct PendingRecv {
    tag: u64,
    buf: *mut u8,
    len: u32,
}

/// A connect waiting for its handshake to end.
#[derive(Debug, Clone, Copy)]
struct PendingConnect {
    tag: u64,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
}

/// One fd number's state.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// In the epoll set (since its first operation, until
    /// [`Epoll::forget`]).
    registered: bool,
    send: Option<PendingSend>,
    recv: Option<PendingRecv>,
    connect: Option<PendingConnect>,
}

impl Slot {
    /// How many of its operations wait.
    fn waiting(&self) -> usize {
        usize::from(self.send.is_some())
            + usize::from(self.recv.is_some())
            + usize::from(self.connect.is_some())
    }
}

/// A worker's epoll-driven socket operation queue (see the module doc).
pub(crate) struct Epoll {
    /// The epoll set.
    ep: OwnedFd,
    /// Operations outstanding (waiting plus completed and not yet reaped)
    /// at most.
    entries: usize,
    /// Operations waiting for readiness.
    waiting: usize,
    /// Completions not yet reaped, oldest first.
    done: VecDeque<(u64, i32)>,
    /// Per fd number.
    fds: Vec<Slot>,
    /// `epoll_wait`'s buffer.
    events: Vec<libc::epoll_event>,
}

// SAFETY: the raw pointers held are the pushers' buffers, which the push contract keeps valid until their completions are reaped, whichever thread then owns the queue; they are only handed to syscalls made by that owner (`&mut self`), never shared.
unsafe impl Send for Epoll {}

impl fmt::Debug for Epoll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Epoll")
            .field("ep", &self.ep.as_raw_fd())
            .field("entries", &self.entries)
            .field("waiting", &self.waiting)
            .field("done", &self.done.len())
            .field("fds", &self.fds.len())
            .finish()
    }
}

/// The calling thread's `errno`.
fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// A syscall's byte count as a completion (the kernel caps one transfer
/// at `MAX_RW_COUNT`, below `i32::MAX`).
fn res(n: isize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// One `sendmsg` attempt: `Some(result)` when it completed, `None` when
/// it would block.
///
/// # Safety
/// `msg` and what it points to are valid, as [`SockOp::Send`] requires.
unsafe fn try_send(fd: RawFd, msg: *const libc::msghdr) -> Option<i32> {
    loop {
        // SAFETY: `msg`, its iovecs and their buffers are valid by the caller's contract; the kernel only reads them. MSG_NOSIGNAL turns a dead peer into EPIPE instead of SIGPIPE.
        let r = unsafe { libc::sendmsg(fd, msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Some(res(r));
        }
        match errno() {
            libc::EINTR => continue,
            libc::EAGAIN => return None,
            e => return Some(-e),
        }
    }
}

/// One `recv` attempt: `Some(result)` when it completed (0: the peer
/// closed), `None` when it would block.
///
/// # Safety
/// `buf` is valid for `len` bytes of writes, as [`SockOp::Recv`] requires.
unsafe fn try_recv(fd: RawFd, buf: *mut u8, len: u32) -> Option<i32> {
    loop {
        // SAFETY: `buf .. buf + len` is valid for writes by the caller's contract.
        let r = unsafe { libc::recv(fd, buf.cast(), len as usize, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Some(res(r));
        }
        match errno() {
            libc::EINTR => continue,
            libc::EAGAIN => return None,
            e => return Some(-e),
        }
    }
}

/// The socket's pending error (`SO_ERROR`, which reading clears), or the
/// reason it could not be read.
fn sock_error(fd: RawFd) -> i32 {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are live locals of the sizes announced.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&raw mut err).cast(),
            &mut len,
        )
    };
    if r < 0 { errno() } else { err }
}

/// One `connect` attempt: `Some(result)` when the handshake ended (0: the
/// connection is up), `None` while it goes on. `again`: a connect was
/// started before, so `EISCONN` means it succeeded and the socket's error
/// says how it ended (as io_uring reads it); `err_seen`: the readiness
/// reported `EPOLLERR`, so the socket's error is read first.
///
/// # Safety
/// `addr` is valid for `len` bytes, as [`SockOp::Connect`] requires.
unsafe fn try_connect(
    fd: RawFd,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
    again: bool,
    err_seen: bool,
) -> Option<i32> {
    if err_seen {
        let e = sock_error(fd);
        if e != 0 {
            return Some(-e);
        }
    }
    loop {
        // SAFETY: `addr .. addr + len` is valid for reads by the caller's contract.
        let r = unsafe { libc::connect(fd, addr, len) };
        if r == 0 {
            return Some(0);
        }
        match errno() {
            libc::EINTR => continue,
            libc::EINPROGRESS | libc::EALREADY | libc::EAGAIN => return None,
            libc::EISCONN if again => return Some(-sock_error(fd)),
            e => return Some(-e),
        }
    }
}

impl Epoll {
    /// A queue for up to `entries` operations outstanding.
    pub(crate) fn new(entries: u32) -> io::Result<Epoll> {
        // SAFETY: plain syscall, no pointers.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` was just opened and is owned by nothing else.
        let ep = unsafe { OwnedFd::from_raw_fd(raw) };
        let entries = (entries as usize).max(1);
        let events = entries.clamp(MIN_EVENTS, MAX_EVENTS);
        Ok(Epoll {
            ep,
            entries,
            waiting: 0,
            done: VecDeque::with_capacity(entries),
            fds: vec![Slot::default(); INITIAL_FDS],
            events: vec![libc::epoll_event { events: 0, u64: 0 }; events],
        })
    }

    /// Queue `op`, answered later (by [`Epoll::reap`]) with `tag`. The
    /// operation is tried at once; it waits for its socket only when it
    /// would block.
    ///
    /// # Safety
    /// Every pointer `op` names stays valid until its completion is reaped.
    pub(crate) unsafe fn push(&mut self, tag: u64, op: SockOp) -> Result<(), Full> {
        debug_assert_ne!(tag, u64::MAX, "tcp backend: tag u64::MAX is reserved");
        // Operations waiting for readiness are kept per socket (one of
        // each kind at most), so only completions not yet reaped are
        // bounded: an idle connection's armed receive takes no room.
        if self.done.len() >= self.entries {
            return Err(Full);
        }
        let fd = op.fd();
        let Ok(at) = usize::try_from(fd) else {
            self.done.push_back((tag, -libc::EBADF));
            return Ok(());
        };
        if at >= self.fds.len() {
            self.fds.resize(at + 1, Slot::default());
        }
        // An fd epoll refuses (not a pollable file) still gets its attempt:
        // its answer, when it has one, is the one io_uring would give.
        let mut refused = 0;
        if !self.fds[at].registered {
            match self.register(fd) {
                Ok(()) => self.fds[at].registered = true,
                Err(e) => refused = e,
            }
        }
        let slot = &mut self.fds[at];
        let busy = match op {
            SockOp::Send { .. } => slot.send.is_some(),
            SockOp::Recv { .. } => slot.recv.is_some(),
            SockOp::Connect { .. } => slot.connect.is_some(),
        };
        if busy {
            // Against the contract: two of a kind would race for the bytes.
            if cfg!(debug_assertions) {
                panic!("tcp backend: a second {op:?} outstanding on fd {fd}");
            }
            tracing::error!(fd, ?op, "tcp backend: a second operation of a kind outstanding");
            self.done.push_back((tag, -libc::EBUSY));
            return Ok(());
        }
        let now = match op {
            // SAFETY: forwarded from the caller.
            SockOp::Send { msg, .. } => unsafe { try_send(fd, msg) },
            // SAFETY: forwarded from the caller.
            SockOp::Recv { buf, len, .. } => unsafe { try_recv(fd, buf, len) },
            // SAFETY: forwarded from the caller.
            SockOp::Connect { addr, len, .. } => unsafe { try_connect(fd, addr, len, false, false) },
        };
        match now {
            Some(r) => self.done.push_back((tag, r)),
            None if refused != 0 => self.done.push_back((tag, -refused)),
            None => {
                match op {
                    SockOp::Send { msg, .. } => slot.send = Some(PendingSend { tag, msg }),
                    SockOp::Recv { buf, len, .. } => slot.recv = Some(PendingRecv { tag, buf, len }),
                    SockOp::Connect { addr, len, .. } => {
                        slot.connect = Some(PendingConnect { tag, addr, len })
                    }
                }
                self.waiting += 1;
            }
        }
        Ok(())
    }

    /// Put `fd` in the epoll set (or, if something left it there, take
    /// it over); the errno when epoll refuses it.
    fn register(&mut self, fd: RawFd) -> Result<(), i32> {
        let mut ev = libc::epoll_event {
            events: INTEREST,
            u64: fd as u64,
        };
        // SAFETY: `ev` is a live local; the kernel copies it.
        let r = unsafe { libc::epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r == 0 {
            return Ok(());
        }
        match errno() {
            libc::EEXIST => {
                let ep = self.ep.as_raw_fd();
                // SAFETY: as above.
                let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut ev) };
                if r == 0 { Ok(()) } else { Err(errno()) }
            }
            e => Err(e),
        }
    }

    /// Every operation waiting on `fd` completes now with `-ECANCELED`
    /// (none of them has moved a byte).
    pub(crate) fn cancel(&mut self, fd: RawFd) {
        let Some(slot) = usize::try_from(fd).ok().and_then(|at| self.fds.get_mut(at)) else {
            return;
        };
        let n = slot.waiting();
        if let Some(p) = slot.connect.take() {
            self.done.push_back((p.tag, -libc::ECANCELED));
        }
        if let Some(p) = slot.send.take() {
            self.done.push_back((p.tag, -libc::ECANCELED));
        }
        if let Some(p) = slot.recv.take() {
            self.done.push_back((p.tag, -libc::ECANCELED));
        }
        self.waiting -= n;
    }

    /// `fd` is about to be closed: out of the epoll set, its state cleared,
    /// so that a new socket given the same number starts afresh.
    pub(crate) fn forget(&mut self, fd: RawFd) {
        let Some(at) = usize::try_from(fd).ok().filter(|&at| at < self.fds.len()) else {
            return;
        };
        if self.fds[at].waiting() != 0 {
            // Against the contract; in a release build its operations end
            // as cancelled rather than being lost.
            if cfg!(debug_assertions) {
                panic!("tcp backend: fd {fd} forgotten with operations outstanding");
            }
            tracing::error!(fd, "tcp backend: socket forgotten with operations outstanding");
            self.cancel(fd);
        }
        if self.fds[at].registered {
            // SAFETY: plain syscall; the event argument may be null for DEL.
            let r = unsafe {
                libc::epoll_ctl(
                    self.ep.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                )
            };
            if r < 0 {
                // ENOENT/EBADF: the socket was already closed (it left the
                // set with its last reference).
                tracing::debug!(fd, errno = errno(), "tcp backend: epoll del failed");
            }
        }
        self.fds[at] = Slot::default();
    }

    /// Try again the operations whose sockets became ready (`wait`: block
    /// up to that long for at least one completion when none is queued).
    /// No syscall when nothing waits and `wait` is `None`.
    pub(crate) fn flush(&mut self, wait: Option<Duration>) {
        let deadline = match wait {
            Some(d) if self.done.is_empty() => Some(Instant::now().checked_add(d)),
            _ => None,
        };
        if self.waiting == 0 && deadline.is_none() {
            return;
        }
        loop {
            let timeout = match deadline {
                None => 0,
                Some(_) if !self.done.is_empty() => 0,
                // Too far to name: as good as forever.
                Some(None) => -1,
                Some(Some(at)) => ms_until(at),
            };
            // SAFETY: `events` is a live buffer of the length announced.
            let n = unsafe {
                libc::epoll_wait(
                    self.ep.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    self.events.len() as libc::c_int,
                    timeout,
                )
            };
            let full = if n < 0 {
                let e = errno();
                if e != libc::EINTR {
                    tracing::error!(errno = e, "tcp backend: epoll_wait failed");
                    return;
                }
                false
            } else {
                let n = n as usize;
                for i in 0..n {
                    let ev = self.events[i];
                    self.ready(ev.u64, ev.events);
                }
                n == self.events.len()
            };
            // A full buffer: more may be ready at once.
            if full {
                continue;
            }
            match deadline {
                None => return,
                Some(_) if !self.done.is_empty() => return,
                Some(Some(at)) if Instant::now() >= at => return,
                Some(_) => {}
            }
        }
    }

    /// Try the operations waiting on the socket `data` names, as far as
    /// its readiness `mask` allows.
    fn ready(&mut self, data: u64, mask: u32) {
        let Some(slot) = usize::try_from(data).ok().and_then(|at| self.fds.get_mut(at)) else {
            return;
        };
        if !slot.registered {
            return;
        }
        let fd = data as RawFd;
        if mask & SEND_READY != 0 {
            if let Some(p) = slot.connect {
                let err_seen = mask & libc::EPOLLERR as u32 != 0;
                // SAFETY: `p` was pushed under the push contract and is not reaped yet.
                if let Some(r) = unsafe { try_connect(fd, p.addr, p.len, true, err_seen) } {
                    slot.connect = None;
                    self.waiting -= 1;
                    self.done.push_back((p.tag, r));
                }
            }
            if let Some(p) = slot.send {
                // SAFETY: as above.
                if let Some(r) = unsafe { try_send(fd, p.msg) } {
                    slot.send = None;
                    self.waiting -= 1;
                    self.done.push_back((p.tag, r));
                }
            }
        }
        if mask & RECV_READY != 0 {
            if let Some(p) = slot.recv {
                // SAFETY: as above.
                if let Some(r) = unsafe { try_recv(fd, p.buf, p.len) } {
                    slot.recv = None;
                    self.waiting -= 1;
                    self.done.push_back((p.tag, r));
                }
            }
        }
    }

    /// Hand each queued completion to `f` as `(tag, result)`, oldest
    /// first; how many.
    pub(crate) fn reap(&mut self, out: &mut [(u64, i32)]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.done.pop_front() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        n
    }
}

/// Milliseconds from now to `at`, rounded up (0 once it has passed).
fn ms_until(at: Instant) -> libc::c_int {
    let left = at.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000);
    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
}

#[cfg(test)]
impl Epoll {
    /// Every completion ready, to `f`.
    fn reap_with(&mut self, mut f: impl FnMut(u64, i32)) -> usize {
        let mut n = 0;
        while let Some((t, r)) = self.done.pop_front() {
            f(t, r);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, SockAddr, Socket, Type};
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};

    /// How long a test waits for what must happen.
    const PATIENCE: Duration = Duration::from_secs(5);

    fn listener() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").unwrap()
    }

    fn nonblocking_socket() -> Socket {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Flush and reap until `tag` completes; its result. Every other
    /// completion reaped on the way is a failure.
    fn wait_for(ep: &mut Epoll, tag: u64) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        let mut got = None;
        loop {
            ep.flush(Some(Duration::from_millis(20)));
            ep.reap_with(|t, r| {
                assert_eq!(t, tag, "unexpected completion ({t}, {r})");
                got = Some(r);
            });
            if let Some(r) = got {
                return r;
            }
            assert!(Instant::now() < deadline, "tag {tag} never completed");
        }
    }

    /// Nothing completes on a flush that waits for nothing.
    fn assert_quiet(ep: &mut Epoll) {
        ep.flush(None);
        let n = ep.reap_with(|t, r| panic!("unexpected completion ({t}, {r})"));
        assert_eq!(n, 0);
    }

    /// Push a connect of `s` to `to`, tagged `tag`; its address must
    /// outlive the operation, so it is returned.
    fn push_connect(ep: &mut Epoll, tag: u64, s: &Socket, to: SocketAddr) -> Box<SockAddr> {
        let addr = Box::new(SockAddr::from(to));
        let op = SockOp::Connect {
            fd: s.as_raw_fd(),
            addr: addr.as_ptr(),
            len: addr.len(),
        };
        // SAFETY: the address is boxed and returned to the caller, who keeps it until the completion is reaped.
        unsafe { ep.push(tag, op) }.unwrap();
        addr
    }

    /// A client socket connected through `ep` and its accepted peer.
    fn connected(ep: &mut Epoll, tag: u64) -> (Socket, TcpStream) {
        let l = listener();
        let s = nonblocking_socket();
        let _addr = push_connect(ep, tag, &s, l.local_addr().unwrap());
        assert_eq!(wait_for(ep, tag), 0);
        let (peer, _) = l.accept().unwrap();
        (s, peer)
    }

    fn push_recv(ep: &mut Epoll, tag: u64, fd: RawFd, buf: &mut [u8]) -> Result<(), Full> {
        let op = SockOp::Recv {
            fd,
            buf: buf.as_mut_ptr(),
            len: buf.len() as u32,
        };
        // SAFETY: every test keeps `buf` alive until the completion is reaped (or the backend is dropped first).
        unsafe { ep.push(tag, op) }
    }

    #[test]
    fn connect_to_a_listening_port_completes_zero() {
        let mut ep = Epoll::new(8).unwrap();
        let l = listener();
        let s = nonblocking_socket();
        let _addr = push_connect(&mut ep, 1, &s, l.local_addr().unwrap());
        assert_eq!(wait_for(&mut ep, 1), 0);
        let (peer, _) = l.accept().unwrap();
        assert_eq!(peer.peer_addr().unwrap(), s.local_addr().unwrap().as_socket().unwrap());
    }

    #[test]
    fn connect_to_a_closed_port_completes_econnrefused() {
        let mut ep = Epoll::new(8).unwrap();
        let closed = listener().local_addr().unwrap();
        let s = nonblocking_socket();
        let _addr = push_connect(&mut ep, 7, &s, closed);
        assert_eq!(wait_for(&mut ep, 7), -libc::ECONNREFUSED);
    }

    #[test]
    fn recv_pushed_before_data_completes_with_the_bytes() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, mut peer) = connected(&mut ep, 1);
        let mut buf = [0u8; 64];
        push_recv(&mut ep, 2, s.as_raw_fd(), &mut buf).unwrap();
        assert_quiet(&mut ep);
        peer.write_all(b"hello, ring").unwrap();
        assert_eq!(wait_for(&mut ep, 2), 11);
        assert_eq!(&buf[..11], b"hello, ring");
    }

    #[test]
    fn recv_of_bytes_already_there_completes_at_push() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, mut peer) = connected(&mut ep, 1);
        peer.write_all(b"ready").unwrap();
        let mut buf = [0u8; 64];
        let deadline = Instant::now() + PATIENCE;
        // Loopback delivers before write returns, in practice; tolerate a
        // late arrival by pushing again.
        loop {
            push_recv(&mut ep, 2, s.as_raw_fd(), &mut buf).unwrap();
            let mut got = None;
            ep.reap_with(|t, r| got = Some((t, r)));
            if let Some(g) = got {
                assert_eq!(g, (2, 5));
                break;
            }
            ep.cancel(s.as_raw_fd());
            ep.reap_with(|_, r| assert_eq!(r, -libc::ECANCELED));
            assert!(Instant::now() < deadline);
        }
        assert_eq!(&buf[..5], b"ready");
    }

    #[test]
    fn large_send_completes_short_and_the_rest_arrives_intact() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, mut peer) = connected(&mut ep, 1);
        // A fixed buffer (no autotuning) far below the 4 MiB sent; not so
        // small that delayed acks pace the transfer.
        s.set_send_buffer_size(128 * 1024).unwrap();
        peer.set_nonblocking(true).unwrap();
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(31) % 251) as u8).collect();
        let mut sent = 0usize;
        // The iovec and the message outlive each send: rebuilt only when
        // none is outstanding.
        let mut iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: a zeroed msghdr is a valid "no name, no control" message.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        let mut push_rest = |ep: &mut Epoll, sent: usize| {
            iov.iov_base = data[sent..].as_ptr() as *mut libc::c_void;
            iov.iov_len = data.len() - sent;
            msg.msg_iov = &raw mut iov;
            msg.msg_iovlen = 1;
            let op = SockOp::Send {
                fd: s.as_raw_fd(),
                msg: &raw const msg,
            };
            // SAFETY: `data`, `iov` and `msg` are untouched until the completion is reaped.
            unsafe { ep.push(3, op) }.unwrap();
        };
        let took = |t: u64, r: i32, sent: &mut usize| {
            assert_eq!(t, 3);
            assert!(r > 0, "send failed: {r}");
            assert!(r as usize <= data.len() - *sent);
            *sent += r as usize;
        };
        // The peer does not read yet: sends complete at once, short, until
        // one finds the socket full and waits.
        let mut shorts = 0;
        loop {
            push_rest(&mut ep, sent);
            let mut done = None;
            ep.reap_with(|t, r| done = Some((t, r)));
            let Some((t, r)) = done else { break };
            took(t, r, &mut sent);
            assert!(sent < data.len(), "4 MiB went into a 16 KiB socket buffer at once");
            shorts += 1;
        }
        assert!(shorts > 0);
        assert_quiet(&mut ep);
        // Now it reads: the waiting send completes, and the rest follows.
        let mut got = Vec::with_capacity(data.len());
        let mut chunk = vec![0u8; 256 * 1024];
        let mut outstanding = true;
        let deadline = Instant::now() + PATIENCE;
        while got.len() < data.len() {
            assert!(Instant::now() < deadline, "sent {sent}, received {}", got.len());
            if !outstanding && sent < data.len() {
                push_rest(&mut ep, sent);
                outstanding = true;
            }
            // Wait for the send only when the peer had nothing to read.
            let wait = match peer.read(&mut chunk) {
                Ok(0) => panic!("the peer saw a close"),
                Ok(n) => {
                    got.extend_from_slice(&chunk[..n]);
                    None
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            };
            ep.flush(wait);
            ep.reap_with(|t, r| {
                took(t, r, &mut sent);
                outstanding = false;
            });
        }
        assert_eq!(sent, data.len());
        assert!(got == data, "the bytes arrived altered");
    }

    #[test]
    fn recv_after_the_peer_closes_completes_zero() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, peer) = connected(&mut ep, 1);
        let mut buf = [0u8; 16];
        push_recv(&mut ep, 2, s.as_raw_fd(), &mut buf).unwrap();
        assert_quiet(&mut ep);
        drop(peer);
        assert_eq!(wait_for(&mut ep, 2), 0);
        // And again, pushed after the close.
        push_recv(&mut ep, 3, s.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(wait_for(&mut ep, 3), 0);
    }

    #[test]
    fn recv_on_a_reset_connection_fails_with_econnreset() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, peer) = connected(&mut ep, 1);
        let mut buf = [0u8; 16];
        push_recv(&mut ep, 2, s.as_raw_fd(), &mut buf).unwrap();
        assert_quiet(&mut ep);
        // Linger 0: the close is a reset.
        Socket::from(peer).set_linger(Some(Duration::ZERO)).unwrap();
        assert_eq!(wait_for(&mut ep, 2), -libc::ECONNRESET);
    }

    #[test]
    fn cancel_completes_a_waiting_recv_at_once() {
        let mut ep = Epoll::new(8).unwrap();
        let (s, mut peer) = connected(&mut ep, 1);
        let mut buf = [0u8; 16];
        push_recv(&mut ep, 2, s.as_raw_fd(), &mut buf).unwrap();
        assert_quiet(&mut ep);
        ep.cancel(s.as_raw_fd());
        let mut got = Vec::new();
        assert_eq!(ep.reap_with(|t, r| got.push((t, r))), 1);
        assert_eq!(got, [(2, -libc::ECANCELED)]);
        // Nothing of it is left behind: bytes sent now go to the next recv.
        peer.write_all(b"after").unwrap();
        assert_quiet(&mut ep);
        push_recv(&mut ep, 3, s.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(wait_for(&mut ep, 3), 5);
        assert_eq!(&buf[..5], b"after");
    }

    #[test]
    fn forget_then_a_new_socket_on_the_same_fd_number_registers_afresh() {
        let mut ep = Epoll::new(8).unwrap();
        let (old, _old_peer) = connected(&mut ep, 1);
        let number = old.as_raw_fd();
        ep.forget(number);
        let (new, mut new_peer) = connected(&mut ep, 2);
        // Put the new socket under the old number: dup2 closes the old
        // socket there atomically (no other thread can take the number in
        // between).
        // SAFETY: both fds are open and owned by this test; `old` keeps owning the number (now the new socket) and closes it on drop.
        assert_eq!(unsafe { libc::dup2(new.as_raw_fd(), number) }, number);
        ep.forget(new.as_raw_fd());
        drop(new);
        let mut buf = [0u8; 16];
        push_recv(&mut ep, 3, number, &mut buf).unwrap();
        assert_quiet(&mut ep);
        new_peer.write_all(b"reused").unwrap();
        assert_eq!(wait_for(&mut ep, 3), 6);
        assert_eq!(&buf[..6], b"reused");
        drop(old);
    }

    #[test]
    fn completions_past_entries_not_reaped_make_it_full_until_reaped() {
        let mut ep = Epoll::new(2).unwrap();
        let (a, _pa) = connected(&mut ep, 1);
        let (b, _pb) = connected(&mut ep, 2);
        let (c, _pc) = connected(&mut ep, 3);
        let (d, _pd) = connected(&mut ep, 4);
        let (mut ba, mut bb, mut bc) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        // Waiting operations take no room.
        push_recv(&mut ep, 10, a.as_raw_fd(), &mut ba).unwrap();
        push_recv(&mut ep, 11, b.as_raw_fd(), &mut bb).unwrap();
        push_recv(&mut ep, 12, c.as_raw_fd(), &mut bc).unwrap();
        // Completions not reaped do.
        ep.cancel(a.as_raw_fd());
        ep.cancel(b.as_raw_fd());
        let mut bd = [0u8; 8];
        assert_eq!(push_recv(&mut ep, 13, d.as_raw_fd(), &mut bd), Err(Full));
        let mut tags = Vec::new();
        assert_eq!(ep.reap_with(|t, _| tags.push(t)), 2);
        assert_eq!(tags, [10, 11]);
        push_recv(&mut ep, 13, d.as_raw_fd(), &mut bd).unwrap();
        ep.cancel(c.as_raw_fd());
        ep.cancel(d.as_raw_fd());
        let mut tags = Vec::new();
        ep.reap_with(|t, _| tags.push(t));
        assert_eq!(tags, [12, 13]);
    }

    #[test]
    fn flush_with_nothing_waiting_returns_at_once() {
        let mut ep = Epoll::new(4).unwrap();
        let t = Instant::now();
        ep.flush(None);
        assert_eq!(ep.reap_with(|_, _| {}), 0);
        assert!(t.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn a_bad_fd_completes_ebadf() {
        let mut ep = Epoll::new(4).unwrap();
        let mut buf = [0u8; 4];
        push_recv(&mut ep, 5, -1, &mut buf).unwrap();
        let mut got = Vec::new();
        ep.reap_with(|t, r| got.push((t, r)));
        assert_eq!(got, [(5, -libc::EBADF)]);
    }
}
