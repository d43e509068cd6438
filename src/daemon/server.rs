//! The daemon's side: a unix socket (0600, this user's processes only;
//! 0660 with a client group, its members too)
//! where clients attach; a thread per client serving its set-up requests;
//! a relay thread per worker waking it when a client rings
//! its SQ bell while the worker sleeps; and the clean-up when a client
//! goes, however it goes. What clients may hold is bounded
//! ([`DaemonLimits`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tent_rings::{RegionId, SegmentId};

use super::relay::Relays;
use super::wire::{self, LAYOUT_VERSION, Part, Reply, Request};
use crate::doorbell::SharedWord;
use crate::engine::attached::ClientRing;
use crate::engine::attached::{MAIL_ARRIVED, MAIL_SETTLED};
use crate::engine::client_scope::{ClientId, ClientScope, MAX_CLIENT_SEGMENTS};
use crate::engine::{Embedded, Engine};
use crate::error::{Error, ErrorKind, Result};
use crate::memfd::{euid, peer_uid, recv_frame};
use crate::notify::Notification;
use crate::notify::delivery::Delivery;
use crate::notify::inbox::Inbox;
use crate::notify::mailboxes::{CLIENT_INBOX_MAX, ClientMail};

/// A client has this long to say hello, and each frame to arrive or leave.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often idle threads look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// What clients may hold: past it a request is refused `OutOfMemory`, and
/// a client past `clients` at attach. Every client costs a thread (the
/// relays are one thread per worker, whatever the rings). And how they
/// share the workers within a priority (`weights`).
#[derive(Debug, Clone)]
pub struct DaemonLimits {
    /// Clients attached at once.
    pub clients: usize,
    /// Regions one client holds.
    pub regions_per_client: usize,
    /// Bytes of memory one client holds.
    pub bytes_per_client: u64,
    /// Rings one client holds.
    pub rings_per_client: usize,
    /// Ops of one client the workers hold at once (taken from its rings,
    /// not yet completed): past it its rings wait, so one client cannot
    /// fill a worker's task table (`max_tasks_per_worker`) for the others.
    pub in_flight_per_client: usize,
    /// Who may attach besides the daemon's own user: the processes in this
    /// group (primary or supplementary), the socket file then 0660 and of
    /// this group; `None`: the daemon's user alone, the socket 0600. A
    /// member reaches what the daemon reaches for it: every segment the
    /// daemon may open (never its own, nor another client's memory).
    pub client_group: Option<u32>,
    /// Each client's weight in its share of work within a priority (a
    /// client that floods its rings gets no more than its share while
    /// another has work at that priority): the first rule that names it,
    /// else 1.
    pub weights: Vec<ClientWeight>,
}

/// A weight for the clients a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientWeight {
    /// Whom it names.
    pub who: ClientMatch,
    /// Its weight (at least 1; shares are in proportion to weights).
    pub weight: u32,
}

/// Whom a [`ClientWeight`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMatch {
    /// Processes of this user.
    Uid(u32),
    /// Processes in this group, primary or supplementary.
    Gid(u32),
    /// The client that gave this name at attach (`daemon_client_name`):
    /// a claim, so only a process of the daemon's own user (which could
    /// read the daemon's memory anyway) is taken at its word.
    Name(String),
}

impl std::str::FromStr for ClientWeight {
    type Err = Error;

    /// `uid:N=W`, `gid:N=W` or `name:NAME=W` (as `tentd --weight` takes
    /// it).
    fn from_str(s: &str) -> Result<ClientWeight> {
        let bad = || {
            Error::invalid(format!(
                "weight {s:?}: uid:N=W, gid:N=W or name:NAME=W, W from 1 to 1000"
            ))
        };
        let (who, w) = s.rsplit_once('=').ok_or_else(bad)?;
        let weight: u32 = w.parse().map_err(|_| bad())?;
        if !(1..=1000).contains(&weight) {
            return Err(bad());
        }
        let who = match who.split_once(':').ok_or_else(bad)? {
            ("uid", n) => ClientMatch::Uid(n.parse().map_err(|_| bad())?),
            ("gid", n) => ClientMatch::Gid(n.parse().map_err(|_| bad())?),
            ("name", n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()) => {
                ClientMatch::Name(n.to_owned())
            }
            _ => return Err(bad()),
        };
        Ok(ClientWeight { who, weight })
    }
}

impl DaemonLimits {
    /// The weight of a client of `uid`, in `groups`, named `name` (a name
    /// counts only from the daemon's own user, `own`).
    fn weight_of(&self, uid: u32, own: bool, groups: impl Fn() -> Vec<u32>, name: &str) -> u32 {
        let mut gs: Option<Vec<u32>> = None;
        for w in &self.weights {
            let hit = match &w.who {
                ClientMatch::Uid(u) => *u == uid,
                ClientMatch::Gid(g) => gs.get_or_insert_with(&groups).contains(g),
                ClientMatch::Name(n) => own && !name.is_empty() && n == name,
            };
            if hit {
                return w.weight.max(1);
            }
        }
        1
    }
}

impl Default for DaemonLimits {
    fn default() -> Self {
        DaemonLimits {
            clients: 64,
            regions_per_client: 1024,
            bytes_per_client: 16 << 30,
            rings_per_client: 16,
            in_flight_per_client: 1024,
            client_group: None,
            weights: Vec::new(),
        }
    }
}

/// One engine serving the node's processes: see the module doc.
pub struct Daemon {
    inner: Arc<Inner>,
    path: PathBuf,
    accept: Option<JoinHandle<()>>,
    /// `<socket>.lock`, `flock`ed: one daemon per socket path.
    _lock: OwnedFd,
}

struct Inner {
    /// Embedded (`start_with` refuses an attached one).
    engine: Engine,
    limits: DaemonLimits,
    stop: AtomicBool,
    /// Readable once the daemon stops: what its threads sleep beside.
    stop_fd: OwnedFd,
    next_client: AtomicU32,
    /// Clients attached now.
    attached: AtomicU32,
    clients: Mutex<Vec<JoinHandle<()>>>,
    /// Segments opened for clients, and how many clients hold each: the
    /// last to go closes it.
    segments: Mutex<HashMap<SegmentId, usize>>,
    /// What wakes a worker when a client rings a ring's SQ bell: a thread
    /// per worker.
    relays: Relays,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The engine in this process that clients are served from.
    fn core(&self) -> &Embedded {
        self.engine
            .embedded()
            .expect("Daemon::start_with refuses an attached engine")
    }
}

impl Daemon {
    /// Serve `engine` to clients attaching at `socket`, with the default
    /// [`DaemonLimits`].
    pub fn start(engine: Engine, socket: &Path) -> Result<Daemon> {
        Self::start_with(engine, socket, DaemonLimits::default())
    }

    /// Serve `engine` to clients attaching at `socket`: a path no live
    /// daemon holds (`<socket>.lock` is `flock`ed), where a stale socket
    /// is replaced and anything else refused. Needs the shm transport on:
    /// clients' memory is memfds it exports. From then on the engine's
    /// notifications are its clients' (each has a mailbox, in the segment
    /// name it gives): one sent to the engine's own name is refused.
    pub fn start_with(engine: Engine, socket: &Path, limits: DaemonLimits) -> Result<Daemon> {
        if engine.is_attached() {
            return Err(Error::invalid(
                "tentd serves an engine of its own process, not one attached to another daemon",
            ));
        }
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
        let lock = lock_socket_path(socket)?;
        // Its engine's notifications are its clients': one to the engine
        // itself (its bare segment name) is refused, naming the form that
        // reaches a client, rather than kept where nobody reads.
        if let Some(core) = engine.embedded() {
            core.mailboxes().refuse_own();
        }
        match std::fs::symlink_metadata(socket) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                // Stale: we hold the lock, so no daemon serves it.
                let _ = std::fs::remove_file(socket);
            }
            Ok(_) => {
                return Err(Error::invalid(format!(
                    "{} exists and is not a socket: left as it is",
                    socket.display()
                )));
            }
            Err(_) => {}
        }
        // Bound in a fresh directory only this user may enter, given its
        // mode and group there (nothing can be swapped in under its name),
        // then renamed into place: the path never accepts a connection
        // before only those it serves may connect.
        let dir = socket.parent().unwrap_or(Path::new("."));
        let private = dir.join(format!(
            "{}tentd-{}-{:x}",
            crate::memfd::TMP_PREFIX,
            std::process::id(),
            crate::control::auth::random_u64()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(bad("make a directory beside"))?;
        let tmp = private.join("s");
        let mode = if limits.client_group.is_some() {
            0o660
        } else {
            0o600
        };
        let placed = UnixListener::bind(&tmp).and_then(|listener| {
            std::os::unix::fs::chown(&tmp, None, limits.client_group)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
            std::fs::rename(&tmp, socket)?;
            Ok(listener)
        });
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir(&private);
        let listener = placed.map_err(bad("place the socket at"))?;
        listener.set_nonblocking(true).map_err(bad("listen at"))?;
        let stop_fd = crate::doorbell::eventfd("tentd: the stop")?;
        let inner = Arc::new(Inner {
            engine,
            limits,
            stop: AtomicBool::new(false),
            stop_fd,
            next_client: AtomicU32::new(1),
            attached: AtomicU32::new(0),
            clients: Mutex::new(Vec::new()),
            segments: Mutex::new(HashMap::new()),
            relays: Relays::default(),
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
            _lock: lock,
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
        // Stays readable: every thread asleep beside it wakes, now or later.
        let _ = rustix::io::write(&self.inner.stop_fd, &1u64.to_ne_bytes());
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for t in std::mem::take(&mut *self.inner.clients.lock()) {
            let _ = t.join();
        }
        // Every client's rings are retired: nothing is left to relay.
        self.inner.relays.stop();
        // We hold the lock: the socket there is ours.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `flock` `<socket>.lock` (created 0600), or say another daemon holds it.
fn lock_socket_path(socket: &Path) -> Result<OwnedFd> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let mut name = socket.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let fd = rustix::fs::open(
        &path,
        OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| {
        Error::invalid(format!("lock file {}", path.display())).with_source(std::io::Error::from(e))
    })?;
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).map_err(|_| {
        Error::invalid(format!(
            "another daemon serves {} (it holds {})",
            socket.display(),
            path.display()
        ))
    })?;
    Ok(fd)
}

fn accept_loop(inner: &Arc<Inner>, listener: &UnixListener) {
    while readable(inner, listener) {
        match listener.accept() {
            Ok((stream, _)) => {
                // A client that stops reading holds its thread (and the
                // daemon's stop) no longer than this.
                let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
                if inner.attached.load(Ordering::SeqCst) as usize >= inner.limits.clients {
                    let _ = refuse(
                        &stream,
                        &Error::new(
                            ErrorKind::OutOfMemory,
                            format!("tentd serves {} clients at once", inner.limits.clients),
                        ),
                    );
                    continue;
                }
                inner.attached.fetch_add(1, Ordering::SeqCst);
                let inner2 = inner.clone();
                let spawned = std::thread::Builder::new()
                    .name("tentd-client".into())
                    .spawn(move || {
                        serve_client(&inner2, stream);
                        inner2.attached.fetch_sub(1, Ordering::SeqCst);
                    });
                match spawned {
                    Ok(t) => {
                        let mut clients = inner.clients.lock();
                        clients.retain(|t| !t.is_finished());
                        clients.push(t);
                    }
                    Err(e) => {
                        inner.attached.fetch_sub(1, Ordering::SeqCst);
                        tracing::warn!(error = %e, "tentd: no thread for a client");
                    }
                }
            }
            // Taken by the client's own retry, or gone before it was
            // accepted.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
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
    /// Its regions and their lengths.
    regions: Vec<(RegionId, u64)>,
    bytes: u64,
    rings: Vec<HeldRing>,
    /// The id its next ring gets.
    next_ring: u32,
    segments: Vec<SegmentId>,
    mail: ClientPost,
}

impl ClientState {
    /// Say what it holds now, for the reports by client.
    fn report_held(&self) {
        let h = self.scope.held();
        h.regions
            .store(self.regions.len() as u64, Ordering::Relaxed);
        h.bytes.store(self.bytes, Ordering::Relaxed);
        h.rings.store(self.rings.len() as u64, Ordering::Relaxed);
    }
}

/// A client's notifications: its inbox (filed by the engine's control
/// server through `Mailboxes`), the page whose words tell it of arrivals
/// and settlements, and what it sent and has not asked the fate of.
struct ClientPost {
    mailbox: u64,
    page: OwnedFd,
    settled: SharedWord,
    inbox: Arc<ClientMail>,
    tickets: HashMap<u64, Arc<Delivery>>,
    next_ticket: u64,
}

/// Notifications one client may have on their way at once (sent, their
/// fate not yet asked).
const TICKETS_PER_CLIENT: usize = 1024;

impl ClientPost {
    /// A mailbox no client of this daemon has (random: a name kept past a
    /// restart names nobody, rather than another client).
    fn new(engine: &Embedded) -> Result<ClientPost> {
        let (page, region) = crate::engine::attached::mail_page()?;
        let word = |at| SharedWord::new(region.clone(), at).expect("inside the mail page");
        let inbox = Arc::new(ClientMail {
            inbox: Inbox::holding(
                engine.config().max_timeout_ms + engine.config().default_timeout_ms,
                CLIENT_INBOX_MAX,
            ),
            arrived: word(MAIL_ARRIVED),
        });
        Ok(ClientPost {
            mailbox: crate::control::new_engine_id(),
            page,
            settled: word(MAIL_SETTLED),
            inbox,
            tickets: HashMap::new(),
            next_ticket: 1,
        })
    }
}

/// A client's ring as the daemon holds it: its id at the client, its
/// memory and what retires it, and its key at the relays.
struct HeldRing {
    id: u32,
    ring: ClientRing,
    key: u64,
}

/// Send `reply` (with `fd`, if any): no `SIGPIPE` should the client be
/// gone, and no longer than the socket's write timeout.
fn send(
    s: &UnixStream,
    reply: &Reply,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let bytes = reply.encode();
    if let Some(fd) = fd {
        return crate::memfd::send_with_fd(s, &bytes, fd);
    }
    let mut at = 0;
    while at < bytes.len() {
        match rustix::net::send(s, &bytes[at..], rustix::net::SendFlags::NOSIGNAL) {
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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

fn too_many(what: String) -> Error {
    Error::new(ErrorKind::OutOfMemory, what)
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

/// Wait until `s` is readable (or hung up: the read finds the end), or
/// the daemon stops (false). Asleep in between: the stop is an eventfd
/// polled beside it, so an idle daemon wakes for nothing.
fn readable(inner: &Inner, s: impl std::os::fd::AsFd) -> bool {
    use rustix::event::{PollFd, PollFlags};
    loop {
        if inner.stop.load(Ordering::SeqCst) {
            return false;
        }
        let mut fds = [
            PollFd::new(&s, PollFlags::IN),
            PollFd::new(&inner.stop_fd, PollFlags::IN),
        ];
        match rustix::event::poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => {}
            Ok(_) if !fds[1].revents().is_empty() => return false,
            Ok(_) | Err(_) => return true,
        }
    }
}

fn serve_client(inner: &Arc<Inner>, s: UnixStream) {
    // This user's processes, and those of the client group (the socket
    // file says as much: 0600, or 0660 of the group).
    let in_group = |s: &UnixStream| {
        inner
            .limits
            .client_group
            .is_some_and(|g| crate::memfd::peer_groups(s).is_ok_and(|gs| gs.contains(&g)))
    };
    let mut who = match peer_uid(&s) {
        Ok((uid, pid)) if uid == euid() || in_group(&s) => ClientId {
            uid,
            pid: u32::try_from(pid).unwrap_or(0),
            name: String::new(),
        },
        Ok((uid, pid)) => {
            let group = match inner.limits.client_group {
                Some(g) => format!(" and group {g}"),
                None => String::new(),
            };
            let _ = refuse(
                &s,
                &Error::new(
                    ErrorKind::AccessDenied,
                    format!(
                        "tentd serves uid {}{group}, not uid {uid} (pid {pid})",
                        euid()
                    ),
                ),
            );
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "tentd: SO_PEERCRED failed");
            return;
        }
    };
    let version = match read_request(&s, Instant::now() + IO_TIMEOUT) {
        Ok(Some(Request::Hello { version, name })) => {
            who.name = name;
            version
        }
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
    // Ids are never reused: a region's tag names its client.
    let Ok(id) = inner
        .next_client
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
    else {
        let _ = refuse(
            &s,
            &too_many("tentd has no client id left: restart it".into()),
        );
        return;
    };
    let weight = inner.limits.weight_of(
        who.uid,
        who.uid == euid(),
        || crate::memfd::peer_groups(&s).unwrap_or_default(),
        &who.name,
    );
    let mail = match ClientPost::new(inner.core()) {
        Ok(m) => m,
        Err(e) => {
            let _ = refuse(&s, &e);
            return;
        }
    };
    inner
        .core()
        .mailboxes()
        .add(mail.mailbox, mail.inbox.clone());
    let mut st = ClientState {
        scope: Arc::new(ClientScope::of(
            id,
            u32::try_from(inner.limits.in_flight_per_client).unwrap_or(u32::MAX),
            who,
            weight,
        )),
        regions: Vec::new(),
        bytes: 0,
        rings: Vec::new(),
        next_ring: 1,
        segments: Vec::new(),
        mail,
    };
    inner.core().clients().add(&st.scope);
    let welcome = Reply::Welcome {
        version: LAYOUT_VERSION,
        client: id,
        mailbox: st.mail.mailbox,
        segment: inner.core().segment_name(),
    };
    let mut detached = false;
    if send(&s, &welcome, Some(st.mail.page.as_fd())).is_ok() {
        tracing::info!(client = id, name = %st.scope.name(), weight, "tentd: client attached");
        while readable(inner, &s) {
            let req = match read_request(&s, Instant::now() + IO_TIMEOUT) {
                Ok(Some(Request::Detach)) => {
                    detached = true;
                    break;
                }
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(client = id, error = %e, "tentd: client sent a bad frame; dropping it");
                    break;
                }
            };
            let served = handle(inner, &s, &mut st, req);
            st.report_held();
            if served.is_err() {
                break;
            }
        }
    }
    release(inner, st);
    // A client that said it goes hears when nothing of it is used: its
    // memory is then its own again.
    if detached {
        let _ = send(&s, &Reply::Done, None);
    }
    tracing::info!(client = id, "tentd: client detached");
}

/// Serve one request; an error only when the socket failed.
fn handle(
    inner: &Inner,
    s: &UnixStream,
    st: &mut ClientState,
    req: Request,
) -> std::io::Result<()> {
    let e = inner.core();
    let limits = &inner.limits;
    match req {
        Request::Hello { .. } => refuse(s, &Error::invalid("already attached")),
        // Taken by the serving loop.
        Request::Detach => Ok(()),
        Request::Allocate { len } => {
            if st.regions.len() >= limits.regions_per_client {
                let n = limits.regions_per_client;
                return refuse(s, &too_many(format!("a client may hold {n} regions")));
            }
            if st
                .bytes
                .checked_add(len)
                .is_none_or(|b| b > limits.bytes_per_client)
            {
                return refuse(
                    s,
                    &too_many(format!(
                        "a client may hold {} bytes; it holds {} and asked for {len} more",
                        limits.bytes_per_client, st.bytes
                    )),
                );
            }
            match e.allocate_memory_for(len, st.scope.id()) {
                Ok((buf, Some(mem))) => {
                    st.regions.push((buf.id(), len));
                    st.bytes += len;
                    let reply = Reply::Allocated {
                        region: buf.id().0,
                        len,
                        data_offset: crate::transport::shm::DATA_OFFSET as u64,
                        addr: buf.addr(),
                    };
                    send(s, &reply, Some(mem.fd()))
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
            if st.segments.len() >= MAX_CLIENT_SEGMENTS {
                return refuse(
                    s,
                    &too_many(format!(
                        "a client may have {MAX_CLIENT_SEGMENTS} segments open"
                    )),
                );
            }
            // Held from the open to the count: a close by another client
            // cannot come between (see `close_held`).
            let mut held = inner.segments.lock();
            let seg = match e.open_segment(&name) {
                Ok(seg) => seg,
                Err(err) => return refuse(s, &err),
            };
            // The name is no proof: another address of the daemon's
            // control server, or another name of its shm file, reaches
            // the same memory.
            if e.is_own_segment(seg) {
                if !held.contains_key(&seg)
                    && let Err(err) = e.close_segment(seg)
                {
                    tracing::warn!(error = %err, "tentd: closing its own segment a client opened");
                }
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::AccessDenied,
                        format!("{name} is tentd's own segment (every client's memory is there)"),
                    ),
                );
            }
            if !st.segments.contains(&seg) {
                *held.entry(seg).or_insert(0) += 1;
                st.segments.push(seg);
                if let Err(err) = st.scope.add(seg) {
                    return refuse(s, &err);
                }
            }
            send(s, &Reply::Opened { segment: seg.0 }, None)
        }
        Request::CreateRing { depth } => {
            if st.rings.len() >= limits.rings_per_client {
                let n = limits.rings_per_client;
                return refuse(s, &too_many(format!("a client may hold {n} rings")));
            }
            let ring = match e.client_ring(depth, st.scope.clone()) {
                Ok(r) => r,
                Err(err) => return refuse(s, &err),
            };
            // Held before anything is sent: a client gone mid-answer still
            // has it retired.
            let id = st.next_ring;
            // Ids are never reused within a client: a relay's key is one.
            let Some(next) = id.checked_add(1) else {
                return refuse(
                    s,
                    &too_many("a client's ring ids are spent: attach again".into()),
                );
            };
            st.next_ring = next;
            let key = u64::from(st.scope.id()) << 32 | u64::from(id);
            let watched = inner.relays.add(key, ring.sq_bell.clone(), &ring.worker);
            st.rings.push(HeldRing { id, ring, key });
            if let Err(err) = watched {
                return refuse(s, &err);
            }
            let ring = &st.rings.last().expect("just pushed").ring;
            let worker = u32::try_from(ring.worker.index).unwrap_or(u32::MAX);
            for (part, fd) in [Part::Sq, Part::Cq, Part::Bells]
                .into_iter()
                .zip(&ring.files)
            {
                let reply = Reply::RingPart {
                    part,
                    depth,
                    ring: id,
                    worker,
                };
                send(s, &reply, Some(fd.as_fd()))?;
            }
            Ok(())
        }
        Request::FreeMemory { region } => {
            let Some(at) = st.regions.iter().position(|&(r, _)| r.0 == region) else {
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::AddressNotRegistered,
                        format!("region {region:#x} is not this client's"),
                    ),
                );
            };
            let (id, len) = st.regions[at];
            // Waits for the ops on it, as `unregister_memory` does.
            match e.unregister_memory(id) {
                Ok(()) => {
                    st.regions.swap_remove(at);
                    st.bytes -= len;
                    send(s, &Reply::Done, None)
                }
                Err(err) => refuse(s, &err),
            }
        }
        Request::CloseRing { ring } => {
            let Some(at) = st.rings.iter().position(|r| r.id == ring) else {
                return refuse(
                    s,
                    &Error::invalid(format!("ring {ring} is not this client's")),
                );
            };
            retire(inner, st.rings.swap_remove(at));
            send(s, &Reply::Done, None)
        }
        Request::CloseSegment { segment } => {
            let seg = SegmentId(segment);
            let Some(at) = st.segments.iter().position(|&x| x == seg) else {
                return refuse(s, &not_opened(segment));
            };
            // Its ring names it no more; ops taken before run on (their
            // CQEs come), and the segment closes once no client holds it.
            st.scope.remove(seg);
            match close_held(inner, seg) {
                Ok(()) => {
                    st.segments.swap_remove(at);
                    send(s, &Reply::Done, None)
                }
                // Still held (by count) and out of the scope: asking again
                // finishes the close.
                Err(err) => refuse(s, &err),
            }
        }
        Request::Notify { segment, name, msg } => {
            let seg = SegmentId(segment);
            if !st.segments.contains(&seg) {
                return refuse(s, &not_opened(segment));
            }
            let post = &mut st.mail;
            if post.tickets.len() >= TICKETS_PER_CLIENT {
                return refuse(
                    s,
                    &Error::new(
                        ErrorKind::SqFull,
                        format!(
                            "a client may have {TICKETS_PER_CLIENT} notifications on their way; \
                             ask how the earlier ones fared first"
                        ),
                    ),
                );
            }
            let n = Notification { name, msg };
            let delivery = Arc::new(Delivery::ringing(post.settled.clone()));
            if let Err(err) = e.queue_notification(post.mailbox, seg, &n, delivery.clone()) {
                return refuse(s, &err);
            }
            let ticket = post.next_ticket;
            post.next_ticket += 1;
            post.tickets.insert(ticket, delivery);
            send(s, &Reply::Ticket { ticket }, None)
        }
        Request::NotifyOutcome { ticket } => {
            let post = &mut st.mail;
            let Some(d) = post.tickets.get(&ticket) else {
                return refuse(
                    s,
                    &Error::invalid(format!(
                        "notification ticket {ticket} is not this client's (or its fate was told)"
                    )),
                );
            };
            match d.outcome() {
                None => send(s, &Reply::Pending, None),
                Some(r) => {
                    post.tickets.remove(&ticket);
                    match r {
                        Ok(()) => send(s, &Reply::Done, None),
                        Err(err) => refuse(s, &err),
                    }
                }
            }
        }
        Request::TakeNotification => match st.mail.inbox.inbox.try_take() {
            Some(r) => send(
                s,
                &Reply::Note {
                    from: r.from,
                    name: r.name,
                    msg: r.msg,
                },
                None,
            ),
            None => send(s, &Reply::Pending, None),
        },
        Request::SegmentRegions { segment, skip } => {
            let seg = SegmentId(segment);
            if !st.segments.contains(&seg) {
                return refuse(s, &not_opened(segment));
            }
            match e.segment_regions(seg) {
                Ok(all) => {
                    let regions = all
                        .iter()
                        .skip(skip as usize)
                        .take(wire::MAX_REGIONS)
                        .map(|r| wire::RegionEntry {
                            id: r.id.0,
                            addr: r.addr,
                            len: r.len,
                        })
                        .collect();
                    let total = u32::try_from(all.len()).unwrap_or(u32::MAX);
                    send(s, &Reply::Regions { total, regions }, None)
                }
                Err(err) => refuse(s, &err),
            }
        }
    }
}

fn not_opened(segment: u64) -> Error {
    Error::new(
        ErrorKind::SegmentNotFound,
        format!("segment {segment:#x} is not open for this client"),
    )
}

/// A client let go of `seg`: close it when no other client holds it,
/// under the count's lock (an open by another client waits, rather than
/// take the id being closed). A close that failed (its ops still
/// draining past the bound) leaves the count as it was.
fn close_held(inner: &Inner, seg: SegmentId) -> Result<()> {
    let mut held = inner.segments.lock();
    let Some(n) = held.get_mut(&seg) else {
        return Ok(());
    };
    if *n > 1 {
        *n -= 1;
        return Ok(());
    }
    inner.core().close_segment(seg)?;
    held.remove(&seg);
    Ok(())
}

/// A client ring retired: its bell unwatched, its worker told (it drains
/// what it took from the ring, then drops it).
fn retire(inner: &Inner, r: HeldRing) {
    inner.relays.remove(r.key, r.ring.worker.index);
    r.ring.retire.store(true, Ordering::Release);
    r.ring.worker.doorbell().ring();
}

/// Everything a client held, released: its rings retired (their workers
/// drain them first), its regions unregistered (each waits for the ops on
/// it), and the segments it opened closed where no other client holds
/// them. An unregister that times out leaves its region revoked and held
/// (logged): nothing reaches it again.
fn release(inner: &Inner, st: ClientState) {
    // Notifications for it are refused from now on; what it sent and is
    // not on the wire now is dropped (nobody is left to hear its fate).
    inner.core().mailboxes().remove(st.mail.mailbox);
    inner.core().drop_notifications_from(st.mail.mailbox);
    for r in st.rings {
        retire(inner, r);
    }
    let failed = st
        .regions
        .iter()
        .filter(|&&(id, _)| inner.core().unregister_memory(id).is_err())
        .count();
    if failed > 0 {
        tracing::warn!(
            client = st.scope.id(),
            failed,
            "tentd: regions of a departed client not unregistered"
        );
    }
    for seg in st.segments {
        if let Err(e) = close_held(inner, seg) {
            // Out of the table already (its ops drain on): nobody is left
            // to ask again, so the count goes.
            inner.segments.lock().remove(&seg);
            tracing::warn!(error = %e, "tentd: closing a departed client's segment");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_parse_and_the_first_rule_naming_a_client_counts() {
        let rules: Vec<ClientWeight> = ["name:prefill=3", "gid:50=2", "uid:1000=5"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        assert_eq!(
            rules[0],
            ClientWeight {
                who: ClientMatch::Name("prefill".into()),
                weight: 3
            }
        );
        for bad in [
            "uid:x=1",
            "uid:1=0",
            "uid:1=1001",
            "who:1=2",
            "name:=2",
            "name:a b=2",
            "uid:1",
        ] {
            assert!(bad.parse::<ClientWeight>().is_err(), "{bad}");
        }
        let limits = DaemonLimits {
            weights: rules,
            ..Default::default()
        };
        let groups = |gs: Vec<u32>| move || gs.clone();
        assert_eq!(limits.weight_of(1000, true, groups(vec![50]), "prefill"), 3);
        assert_eq!(limits.weight_of(1000, true, groups(vec![50]), ""), 2);
        assert_eq!(limits.weight_of(1000, true, groups(vec![]), "decode"), 5);
        assert_eq!(limits.weight_of(7, true, groups(vec![]), "decode"), 1);
        assert_eq!(
            limits.weight_of(1000, false, groups(vec![]), "prefill"),
            5,
            "another user's name is a claim: its uid's rule counts"
        );
    }
}
