//! The daemon's side: a unix socket (0600, this user's processes only)
//! where clients attach; a thread per client serving its set-up requests;
//! a relay per client ring waking the ring's worker when the client rings
//! its SQ bell; and the clean-up when a client goes, however it goes.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tent_rings::{RegionId, Sqe};

use super::wire::{self, LAYOUT_VERSION, Part, Reply, Request};
use crate::doorbell::SharedWord;
use crate::engine::Engine;
use crate::engine::attached::ClientRing;
use crate::engine::client_scope::ClientScope;
use crate::error::{Error, ErrorKind, Result};
use crate::memfd::{euid, peer_uid, recv_frame};

/// A client has this long to say hello, and the daemon to answer a frame.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often idle threads look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);
/// Per-client quotas.
const MAX_CLIENT_REGIONS: usize = 1024;
const MAX_CLIENT_RINGS: usize = 64;

/// One engine serving the node's processes: see the module doc.
pub struct Daemon {
    inner: Arc<Inner>,
    path: PathBuf,
    accept: Option<JoinHandle<()>>,
}

struct Inner {
    engine: Engine,
    stop: AtomicBool,
    next_client: AtomicU32,
    clients: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Serve `engine` to clients attaching at `socket` (a path a live
    /// daemon does not hold; a stale socket file is replaced). Needs the
    /// shm transport on: clients' memory is memfds it exports.
    pub fn start(engine: Engine, socket: &Path) -> Result<Daemon> {
        if engine.local_segment_name().is_none() {
            return Err(Error::invalid(
                "tentd needs the shm transport (transports/shm/enable): client memory is shared memory",
            ));
        }
        let bad = |what: &'static str| {
            move |e: std::io::Error| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("{what} {}", socket.display()),
                )
                .with_source(e)
            }
        };
        if UnixStream::connect(socket).is_ok() {
            return Err(Error::invalid(format!(
                "a daemon already listens at {}",
                socket.display()
            )));
        }
        let _ = std::fs::remove_file(socket);
        // Bound under a temporary name, made 0600, then renamed: the path
        // never accepts a connection before only this user may connect.
        let dir = socket.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            "{}tentd-{}",
            crate::memfd::TMP_PREFIX,
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(bad("bind"))?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, socket));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(bad("place the socket at")(e));
        }
        listener.set_nonblocking(true).map_err(bad("listen at"))?;
        let inner = Arc::new(Inner {
            engine,
            stop: AtomicBool::new(false),
            next_client: AtomicU32::new(1),
            clients: Mutex::new(Vec::new()),
        });
        let accept = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("tentd-accept".into())
                .spawn(move || accept_loop(&inner, &listener))
                .map_err(|e| Error::new(ErrorKind::OutOfMemory, "tentd thread").with_source(e))?
        };
        tracing::info!(socket = %socket.display(), "tentd: listening for clients");
        Ok(Daemon {
            inner,
            path: socket.to_owned(),
            accept: Some(accept),
        })
    }

    /// The engine it serves.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Where clients attach.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for t in std::mem::take(&mut *self.inner.clients.lock()) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(inner: &Arc<Inner>, listener: &UnixListener) {
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let inner2 = inner.clone();
                let spawned = std::thread::Builder::new()
                    .name("tentd-client".into())
                    .spawn(move || serve_client(&inner2, stream));
                match spawned {
                    Ok(t) => {
                        let mut clients = inner.clients.lock();
                        clients.retain(|t| !t.is_finished());
                        clients.push(t);
                    }
                    Err(e) => tracing::warn!(error = %e, "tentd: no thread for a client"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(STOP_POLL.min(Duration::from_millis(20)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "tentd: accept failed");
                std::thread::sleep(STOP_POLL);
            }
        }
    }
}

/// What a client holds, released when it goes.
struct ClientState {
    scope: Arc<ClientScope>,
    regions: Vec<RegionId>,
    rings: Vec<Relay>,
}

/// A client ring's relay thread and what closes the ring.
struct Relay {
    ring: ClientRing,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Send `reply` (with `fd`, if any).
fn send(
    s: &UnixStream,
    reply: &Reply,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let bytes = reply.encode();
    match fd {
        Some(fd) => crate::memfd::send_with_fd(s, &bytes, fd),
        None => (&*s).write_all(&bytes),
    }
}

fn refuse(s: &UnixStream, e: &Error) -> std::io::Result<()> {
    send(
        s,
        &Reply::Refused {
            kind: e.kind(),
            message: e.to_string(),
        },
        None,
    )
}

/// Read one request by `deadline`: `Ok(None)` at end of stream.
fn read_request(s: &UnixStream, deadline: Instant) -> std::io::Result<Option<Request>> {
    let mut header = [0u8; 4];
    match recv_frame(s, &mut header, deadline) {
        Ok(_) => {}
        Err(e) if e.err.kind() == std::io::ErrorKind::UnexpectedEof && !e.partial => {
            return Ok(None);
        }
        Err(e) => return Err(e.err),
    }
    let n = wire::body_len(header).map_err(|m| std::io::Error::other(m.0))?;
    let mut body = vec![0u8; n];
    recv_frame(s, &mut body, deadline).map_err(|e| e.err)?;
    Request::decode(&body)
        .map(Some)
        .map_err(|m| std::io::Error::other(m.0))
}

/// Wait until `s` is readable, the daemon stops (false), or the client
/// hung up (true: the read finds the end).
fn readable(inner: &Inner, s: &UnixStream) -> bool {
    loop {
        if inner.stop.load(Ordering::SeqCst) {
            return false;
        }
        let mut fds = [rustix::event::PollFd::new(s, rustix::event::PollFlags::IN)];
        let ts = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: STOP_POLL.as_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => {}
            Ok(_) => return true,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

fn serve_client(inner: &Arc<Inner>, s: UnixStream) {
    // Only this user's processes (the socket is 0600 too).
    match peer_uid(&s) {
        Ok((uid, _)) if uid == euid() => {}
        Ok((uid, pid)) => {
            let _ = refuse(
                &s,
                &Error::new(
                    ErrorKind::AccessDenied,
                    format!("tentd serves uid {}, not uid {uid} (pid {pid})", euid()),
                ),
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "tentd: SO_PEERCRED failed");
            return;
        }
    }
    let hello = read_request(&s, Instant::now() + IO_TIMEOUT);
    let version = match hello {
        Ok(Some(Request::Hello { version })) => version,
        Ok(Some(_)) => {
            let _ = refuse(&s, &Error::invalid("the first message must be Hello"));
            return;
        }
        Ok(None) | Err(_) => return,
    };
    if version != LAYOUT_VERSION {
        let _ = refuse(
            &s,
            &Error::invalid(format!(
                "layout version mismatch: client {version}, tentd {LAYOUT_VERSION}"
            )),
        );
        return;
    }
    let id = inner.next_client.fetch_add(1, Ordering::Relaxed);
    let mut st = ClientState {
        scope: Arc::new(ClientScope::new(id)),
        regions: Vec::new(),
        rings: Vec::new(),
    };
    if send(
        &s,
        &Reply::Welcome {
            version: LAYOUT_VERSION,
            client: id,
        },
        None,
    )
    .is_ok()
    {
        tracing::info!(client = id, "tentd: client attached");
        while readable(inner, &s) {
            let req = match read_request(&s, Instant::now() + IO_TIMEOUT) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(client = id, error = %e, "tentd: client sent a bad frame; dropping it");
                    break;
                }
            };
            if handle(inner, &s, &mut st, req).is_err() {
                break;
            }
        }
    }
    release(inner, st);
    tracing::info!(client = id, "tentd: client detached");
}

/// Serve one request; an error only when the socket failed.
fn handle(
    inner: &Inner,
    s: &UnixStream,
    st: &mut ClientState,
    req: Request,
) -> std::io::Result<()> {
    let e = &inner.engine;
    match req {
        Request::Hello { .. } => refuse(s, &Error::invalid("already attached")),
        Request::Allocate { len } => {
            if st.regions.len() >= MAX_CLIENT_REGIONS {
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::OutOfMemory,
                        format!("a client may hold {MAX_CLIENT_REGIONS} regions"),
                    ),
                );
            }
            match e.allocate_memory_for(len, st.scope.id()) {
                Ok((buf, Some(mem))) => {
                    st.regions.push(buf.id());
                    send(
                        s,
                        &Reply::Allocated {
                            region: buf.id().0,
                            len,
                            data_offset: crate::transport::shm::DATA_OFFSET as u64,
                        },
                        Some(mem.fd()),
                    )
                }
                Ok((buf, None)) => {
                    let _ = e.unregister_memory(buf.id());
                    refuse(s, &Error::invalid("tentd's memory is not shared (shm off)"))
                }
                Err(err) => refuse(s, &err),
            }
        }
        Request::OpenSegment { name } => {
            let own = name == e.segment_name() || Some(name.as_str()) == e.local_segment_name();
            if own || name == "local" {
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::AccessDenied,
                        "a client may not open tentd's own segment (every client's memory is there)",
                    ),
                );
            }
            match e
                .open_segment(&name)
                .and_then(|seg| st.scope.add(seg).map(|()| seg))
            {
                Ok(seg) => send(s, &Reply::Opened { segment: seg.0 }, None),
                Err(err) => refuse(s, &err),
            }
        }
        Request::CreateRing { depth } => {
            if st.rings.len() >= MAX_CLIENT_RINGS {
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::OutOfMemory,
                        format!("a client may hold {MAX_CLIENT_RINGS} rings"),
                    ),
                );
            }
            let ring = match e.client_ring(depth, st.scope.clone()) {
                Ok(r) => r,
                Err(err) => return refuse(s, &err),
            };
            for (part, fd) in [Part::Sq, Part::Cq, Part::Bells]
                .into_iter()
                .zip(&ring.files)
            {
                send(s, &Reply::RingPart { part, depth }, Some(fd.as_fd()))?;
            }
            st.rings.push(Relay::start(ring));
            Ok(())
        }
    }
}

impl Relay {
    /// Wake the ring's worker each time the client bumps the SQ bell.
    fn start(ring: ClientRing) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let bell = SharedWord::new(ring.sq_bell.region().clone(), ring.sq_bell.offset())
            .expect("the ring's own bell");
        let worker = ring.worker.clone();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tentd-relay".into())
            .spawn(move || {
                // Every bump changes the word from the last value seen, so
                // none is missed whatever the client writes there.
                let mut last = bell.word().load(Ordering::Acquire);
                while !flag.load(Ordering::Acquire) {
                    bell.wait(last, STOP_POLL);
                    let now = bell.word().load(Ordering::Acquire);
                    if now != last {
                        last = now;
                        worker.doorbell().ring();
                    }
                }
            })
            .ok();
        Relay { ring, stop, thread }
    }
}

/// Everything a client held, released: its rings closed (their workers
/// drain and retire them), then its regions unregistered (each waits for
/// the ops on it), its segments out of its scope with it.
fn release(inner: &Inner, st: ClientState) {
    for mut r in st.rings {
        r.stop.store(true, Ordering::Release);
        r.ring.sq_bell.ring();
        if let Some(t) = r.thread.take() {
            let _ = t.join();
        }
        if let Err(e) = tent_rings::spsc::close_producer::<Sqe>(r.ring.sq.clone()) {
            tracing::warn!(error = %e, "tentd: closing a client ring");
        }
        r.ring.worker.doorbell().ring();
    }
    let mut failed = 0usize;
    for id in st.regions {
        if inner.engine.unregister_memory(id).is_err() {
            failed += 1;
        }
    }
    if failed > 0 {
        tracing::warn!(
            client = st.scope.id(),
            failed,
            "tentd: regions of a departed client not unregistered"
        );
    }
}
