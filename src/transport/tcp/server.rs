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

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tent_rings::{ErrorKind, Opcode};

use super::frame::{HELLO_LEN, Hello, REQUEST_LEN, Request, Response};
use super::io;
use crate::error::{Error, Result};
use crate::memory::RegionTable;

/// Connections served at once; more are refused at accept.
const MAX_CONNECTIONS: usize = 512;
/// A connection must say hello within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Socket read timeout of a connection: how often an idle one wakes (to
/// notice a peer that stalled mid-frame). Stopping does not wait for it:
/// the server shuts its connections down.
const IDLE_POLL: Duration = Duration::from_secs(5);
/// Read timeout while waiting for the hello.
const HELLO_POLL: Duration = Duration::from_millis(250);

/// A running data server; stops when dropped.
pub struct DataServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    live: Arc<Live>,
}

/// The connections being served, so stopping can shut them down at once.
#[derive(Default)]
struct Live {
    next: AtomicUsize,
    conns: std::sync::Mutex<Vec<(usize, TcpStream)>>,
}

impl Live {
    fn add(&self, s: &TcpStream) -> Option<usize> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let dup = s.try_clone().ok()?;
        self.conns
            .lock()
            .expect("live conns poisoned")
            .push((id, dup));
        Some(id)
    }

    fn remove(&self, id: usize) {
        self.conns
            .lock()
            .expect("live conns poisoned")
            .retain(|(i, _)| *i != id);
    }

    fn len(&self) -> usize {
        self.conns.lock().expect("live conns poisoned").len()
    }
}

impl std::fmt::Debug for DataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl DataServer {
    /// Listen on `bind` (port 0 = ephemeral) and serve `regions`.
    pub fn start(
        bind: SocketAddr,
        regions: Arc<ArcSwap<RegionTable>>,
        user_timeout_ms: u32,
    ) -> Result<DataServer> {
        let listener = TcpListener::bind(bind).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("tcp data server cannot listen on {bind}"),
            )
            .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            Error::new(ErrorKind::Unreachable, "tcp data server address").with_source(e)
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(Live::default());
        let (stop2, live2) = (stop.clone(), live.clone());
        let thread = std::thread::Builder::new()
            .name(format!("tent-tcp-data-{}", addr.port()))
            .spawn(move || accept_loop(listener, stop2, live2, regions, user_timeout_ms))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "spawn tcp data server").with_source(e)
            })?;
        tracing::info!(%addr, "tcp data server listening");
        Ok(DataServer {
            addr,
            stop,
            thread: Some(thread),
            live,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DataServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock accept() with a connection of our own (to a wildcard
        // bind, through loopback).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for (_, s) in self.live.conns.lock().expect("live conns poisoned").iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    live: Arc<Live>,
    regions: Arc<ArcSwap<RegionTable>>,
    user_timeout_ms: u32,
) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                crate::warn_limited!(e.kind(), error = %e, "tcp data server: accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if live.len() >= MAX_CONNECTIONS {
            crate::warn_limited!(peer.ip(), %peer, limit = MAX_CONNECTIONS, "tcp data server: connection limit reached; closing");
            continue;
        }
        let Some(id) = live.add(&stream) else {
            crate::warn_limited!(peer.ip(), %peer, "tcp data server: cannot track the connection; closing");
            continue;
        };
        let (live2, stop2, regions2) = (live.clone(), stop.clone(), regions.clone());
        let spawned = std::thread::Builder::new()
            .name("tent-tcp-serve".into())
            .spawn(move || {
                match serve(&stream, &stop2, &regions2, user_timeout_ms) {
                    Ok(()) => tracing::debug!(%peer, "tcp data connection closed"),
                    Err(reason) => {
                        crate::warn_limited!(peer.ip(), %peer, %reason, "tcp data connection closed")
                    }
                }
                live2.remove(id);
            });
        if let Err(e) = spawned {
            live.remove(id);
            crate::warn_limited!(e.kind(), %peer, error = %e, "tcp data server: cannot spawn a connection thread");
        }
    }
}

/// Apply the data-path socket options.
pub(crate) fn tune(s: &TcpStream, user_timeout_ms: u32) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    if user_timeout_ms > 0 {
        let _ = sock.set_tcp_user_timeout(Some(Duration::from_millis(user_timeout_ms as u64)));
    }
    let _ = sock.set_keepalive(true);
}

/// Serve one connection until the peer closes, the server stops, or the
/// stream's framing is lost (the `Err` carries the reason to log).
fn serve(
    s: &TcpStream,
    stop: &AtomicBool,
    regions: &ArcSwap<RegionTable>,
    user_timeout_ms: u32,
) -> std::result::Result<(), String> {
    tune(s, user_timeout_ms);
    s.set_read_timeout(Some(HELLO_POLL))
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let hello = loop {
        match io::recv_header::<HELLO_LEN>(s) {
            Ok(Some(h)) => break h,
            Ok(None) if started.elapsed() < HANDSHAKE_TIMEOUT && !stop.load(Ordering::Acquire) => {}
            Ok(None) => return Err("no hello within the handshake timeout".into()),
            Err(e) => return Err(format!("handshake: {e}")),
        }
    };
    if let Err(e) = Hello::decode(&hello) {
        let refuse = Hello {
            status: ErrorKind::InvalidArgument.code(),
        };
        let _ = io::send_header(s, &refuse.encode());
        return Err(format!("bad hello: {e}"));
    }
    io::send_header(s, &Hello { status: 0 }.encode()).map_err(|e| format!("hello reply: {e}"))?;
    s.set_read_timeout(Some(IDLE_POLL))
        .map_err(|e| e.to_string())?;

    loop {
        let header = match io::recv_header::<REQUEST_LEN>(s) {
            Ok(Some(h)) => h,
            Ok(None) if stop.load(Ordering::Acquire) => return Ok(()),
            Ok(None) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading a request: {e}")),
        };
        let req = Request::decode(&header).map_err(|e| format!("malformed request: {e}"))?;
        let table = regions.load();
        let target = check(&table, &req);
        let mut resp = Response {
            status: target.map(|_| ()),
            seq: req.seq,
            len: 0,
        };
        match (req.opcode, target) {
            (Opcode::Write, Ok(ptr)) => {
                // SAFETY: `ptr..ptr+len` lies inside a registered region, kept alive by `table` for this whole op.
                unsafe { io::recv_exact(s, ptr, req.len as usize) }
                    .map_err(|e| format!("WRITE payload: {e}"))?;
                resp.len = req.len;
                io::send_header(s, &resp.encode()).map_err(|e| format!("WRITE response: {e}"))?;
            }
            (Opcode::Write, Err(why)) => {
                io::discard(s, req.len).map_err(|e| format!("refused WRITE payload: {e}"))?;
                tracing::debug!(addr = req.addr, len = req.len, %why, "tcp WRITE refused");
                io::send_header(s, &resp.encode()).map_err(|e| format!("WRITE response: {e}"))?;
            }
            (Opcode::Read, Ok(ptr)) => {
                resp.len = req.len;
                // SAFETY: `ptr..ptr+len` lies inside a registered region, kept alive by `table` for this whole op.
                unsafe { io::send_all(s, &resp.encode(), ptr, req.len as usize) }
                    .map_err(|e| format!("READ response: {e}"))?;
            }
            (Opcode::Read, Err(why)) => {
                tracing::debug!(addr = req.addr, len = req.len, %why, "tcp READ refused");
                io::send_header(s, &resp.encode()).map_err(|e| format!("READ response: {e}"))?;
            }
        }
    }
}

/// Where a request may touch memory, or why it may not.
fn check(table: &RegionTable, req: &Request) -> std::result::Result<*mut u8, ErrorKind> {
    if req.len == 0 {
        return Err(ErrorKind::InvalidArgument);
    }
    if req.addr.checked_add(req.len).is_none() {
        return Err(ErrorKind::OutOfBounds);
    }
    let (region, ptr) = table.find_addr(req.addr, req.len)?;
    if req.key == 0 || region.key() != req.key {
        return Err(ErrorKind::AccessDenied);
    }
    Ok(ptr)
}
