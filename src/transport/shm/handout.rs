//! How shm segment memory travels between processes: sealed memfds handed
//! out over a unix-domain socket.
//!
//! The owner listens on a pathname socket `<dir>/<segment name>` (it works
//! across network namespaces that share the directory; an abstract socket
//! would not). A peer opens the socket file `O_PATH|O_NOFOLLOW`, checks it
//! is a socket of our uid, and connects *through that descriptor*
//! (`/proc/self/fd/N`), so what it checked is what it reaches; both sides
//! check the other's uid with `SO_PEERCRED`. With a shared secret the owner
//! proves it first and the peer second, both MACs binding the two nonces and
//! the socket file's (device, inode) (the owner recorded its own at bind):
//! a process relaying the exchange from a socket of its own under the
//! segment's name cannot make either proof verify. No memfd leaves the
//! owner before the peer is authenticated. The owner then sends the
//! descriptor memfd (`SCM_RIGHTS`, a read-only file description of a memfd
//! sealed with `F_SEAL_FUTURE_WRITE` after the owner mapped it) and later
//! region memfds by handle; every request carries an id the reply echoes,
//! so a reply that arrives after its request timed out is recognised and
//! dropped. Every memfd is sealed against shrinking and growing before it
//! leaves the owner, and the peer checks the seals, the size and that it is
//! a shmem file before it maps, so the owner cannot SIGBUS a peer.
//!
//! The owner bounds what a peer that has not authenticated can hold: the
//! whole handshake has one deadline, at most [`MAX_PENDING`] connections
//! may be in their handshake (the oldest is closed to admit a new one), and
//! the [`MAX_CONNECTIONS`] serving slots are counted only once a peer has
//! authenticated.
//!
//! The connection is also the owner's liveness: the owner keeps its end
//! open for as long as it serves the segment, so a peer sees `POLLHUP` the
//! moment the owner dies or withdraws (one non-blocking `poll`), and a
//! probing `connect` is refused once nobody listens. No pid is involved.

use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{self, PollFd, PollFlags, Timespec};
use rustix::fs::{self as rfs, FileType, Mode, OFlags, RenameFlags, SealFlags};
use rustix::io::Errno;
use rustix::net::{self, SocketAddrUnix, SocketFlags};

use tent_rings::ErrorKind;

use super::desc::{self, DescError};
use crate::control::auth::{self, Door, random_u64};
use crate::control::wire::{MAC_LEN, NONCE_LEN};
use crate::deadline::ByDeadline;
use crate::error::{Error, Result};
pub(crate) use crate::memfd::sealed_memfd;
use crate::memfd::{
    Mapping, TMP_PREFIX, connect_file, euid, memfd, open_socket_file, peer_uid, recv_frame,
    send_with_fd, size_and_seals, unix_socket,
};

const MAGIC: [u8; 8] = *b"TENTSHM2";
const HELLO_LEN: usize = 8 + NONCE_LEN;
/// Magic, server nonce, flags (byte 0: a secret is required), the owner's
/// proof (zeros without a secret).
const CHALLENGE_LEN: usize = 8 + NONCE_LEN + 8 + MAC_LEN;
const FD_FRAME: [u8; 8] = *b"MEMFD\0\0\0";
const GONE_FRAME: [u8; 8] = *b"GONE\0\0\0\0";
/// The owner could not pass the memfd this time (descriptor limits): ask
/// again later. The connection stays up.
const AGAIN_FRAME: [u8; 8] = *b"AGAIN\0\0\0";
const REQUEST_TAG: [u8; 8] = *b"GETREGN\0";
/// Request: tag, handle, request id.
const REQUEST_LEN: usize = 24;
/// Reply: frame tag, the request id it answers (0: the descriptor).
const REPLY_LEN: usize = 16;
/// Authenticated peers served at once; more are closed after their
/// handshake.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Connections in their handshake at once; a new one closes the oldest.
pub(crate) const MAX_PENDING: usize = 32;
/// The whole handshake, on either side, or one region request from an API
/// thread, that takes longer fails.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// A temporary socket older than this, refusing connections, is a leftover.
const TMP_GRACE: Duration = Duration::from_secs(60);

/// What the proofs bind: the socket file's device and inode.
fn binding(dev: u64, ino: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&dev.to_le_bytes());
    b[8..].copy_from_slice(&ino.to_le_bytes());
    b
}

/// The descriptor memfd of `size` bytes: mapped writable here first, then
/// sealed with `F_SEAL_FUTURE_WRITE` (on top of shrink, grow and seal), so
/// this mapping is the only way anyone can ever write it (Linux >= 5.1).
/// Returns the mapping and what peers get: a read-only file description of
/// it (the sealed descriptor itself where `/proc` cannot reopen it).
pub(crate) fn descriptor_memfd(name: &str, size: usize) -> io::Result<(Mapping, OwnedFd)> {
    let fd = memfd(name, size as u64)?;
    let map = Mapping::map(fd.as_fd(), size, true)?;
    rfs::fcntl_add_seals(
        &fd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
    )?;
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match rfs::open(proc_path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(ro) => Ok((map, ro)),
        Err(_) => Ok((map, fd)),
    }
}

/// Map a handed-out memfd for `want` bytes after the shared parser admits it.
fn map_admitted(
    fd: &OwnedFd,
    writable: bool,
    admit: impl FnOnce(u64, i32) -> std::result::Result<usize, DescError>,
) -> Result<Mapping> {
    let (size, seals) = size_and_seals(fd.as_fd()).map_err(|e| {
        Error::new(ErrorKind::InvalidArgument, "refusing a handed-out memfd").with_source(e)
    })?;
    let len = admit(size, seals).map_err(|e| Error::invalid(e.to_string()))?;
    Mapping::map(fd.as_fd(), len, writable)
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, "mapping a peer's memfd").with_source(e))
}

/// Did a send of a descriptor fail for a reason that leaves the connection
/// sound (too many descriptors in flight or open, memory)? The owner then
/// answers [`AGAIN_FRAME`] instead of hanging up, which the peer would read
/// as the owner's death.
fn recoverable_send(e: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(e),
        Some(Errno::TOOMANYREFS | Errno::MFILE | Errno::NFILE | Errno::NOMEM | Errno::NOBUFS)
    )
}

/// A reply frame (tag, request id) with one descriptor, or [`AGAIN_FRAME`]
/// when the descriptor cannot travel now.
fn send_reply(s: &UnixStream, tag: [u8; 8], id: u64, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut frame = [0u8; REPLY_LEN];
    frame[..8].copy_from_slice(&tag);
    frame[8..].copy_from_slice(&id.to_le_bytes());
    let Some(fd) = fd else {
        return (&*s).write_all(&frame);
    };
    match send_with_fd(s, &frame, fd) {
        Err(e) if recoverable_send(&e) => {
            crate::lograte::warn_limited!(
                e.raw_os_error().unwrap_or(0),
                error = %e,
                "shm handout: cannot pass a memfd now; the peer is told to ask again"
            );
            frame[..8].copy_from_slice(&AGAIN_FRAME);
            (&*s).write_all(&frame)
        }
        r => r,
    }
}

// ---- the owner's side -----------------------------------------------------

/// What the owner hands out: the descriptor and the published regions.
pub(crate) struct HandoutTable {
    /// What peers get for the descriptor: read-only, write-sealed.
    desc: OwnedFd,
    regions: Mutex<Vec<(u64, Arc<OwnedFd>)>>,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for HandoutTable {
    /// Never the secret: whether there is one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandoutTable")
            .field("desc", &self.desc)
            .field("authenticated", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

impl HandoutTable {
    pub(crate) fn new(desc: OwnedFd, secret: Option<Vec<u8>>) -> HandoutTable {
        HandoutTable {
            desc,
            regions: Mutex::new(Vec::new()),
            secret,
        }
    }

    pub(crate) fn desc_fd(&self) -> BorrowedFd<'_> {
        self.desc.as_fd()
    }

    /// Make region `handle` available to peers.
    pub(crate) fn insert(&self, handle: u64, fd: Arc<OwnedFd>) {
        self.regions.lock().push((handle, fd));
    }

    /// Stop handing out region `handle`.
    pub(crate) fn remove(&self, handle: u64) {
        self.regions.lock().retain(|(h, _)| *h != handle);
    }

    fn get(&self, handle: u64) -> Option<Arc<OwnedFd>> {
        let r = self.regions.lock();
        r.iter().find(|(h, _)| *h == handle).map(|(_, f)| f.clone())
    }
}

/// One accepted connection as the owner tracks it.
#[derive(Debug)]
struct Conn {
    stream: Arc<UnixStream>,
    accepted: Instant,
    authed: bool,
    /// Closed to make room; its thread is on its way out.
    evicted: bool,
}

/// Every connection the owner holds, and how many have authenticated.
#[derive(Debug, Default)]
struct Conns {
    all: Vec<Conn>,
    authed: usize,
}

impl Conns {
    /// Admit a new connection in its handshake: when [`MAX_PENDING`] are
    /// already in theirs, the oldest of them is shut down (its thread then
    /// fails its next read and leaves). Returns whether one was evicted.
    fn admit(&mut self, stream: Arc<UnixStream>) -> bool {
        let pending = self.all.iter().filter(|c| !c.authed && !c.evicted);
        let mut evicted = false;
        if pending.clone().count() >= MAX_PENDING {
            if let Some(oldest) = self
                .all
                .iter_mut()
                .filter(|c| !c.authed && !c.evicted)
                .min_by_key(|c| c.accepted)
            {
                oldest.evicted = true;
                let _ = oldest.stream.shutdown(std::net::Shutdown::Both);
                evicted = true;
            }
        }
        self.all.push(Conn {
            stream,
            accepted: Instant::now(),
            authed: false,
            evicted: false,
        });
        evicted
    }

    /// Move `s` from the handshake to a serving slot, if one is free.
    fn authenticate(&mut self, s: &Arc<UnixStream>) -> bool {
        if self.authed >= MAX_CONNECTIONS {
            return false;
        }
        match self.all.iter_mut().find(|c| Arc::ptr_eq(&c.stream, s)) {
            Some(c) if !c.evicted => {
                c.authed = true;
                self.authed += 1;
                true
            }
            _ => false,
        }
    }

    fn remove(&mut self, s: &Arc<UnixStream>) {
        if let Some(pos) = self.all.iter().position(|c| Arc::ptr_eq(&c.stream, s)) {
            if self.all.swap_remove(pos).authed {
                self.authed -= 1;
            }
        }
    }
}

/// A connection's place in [`Conns`]; dropping it (when its thread ends,
/// or with the thread's closure when the thread could not be spawned)
/// gives the place back.
struct Slot {
    conns: Arc<Mutex<Conns>>,
    stream: Arc<UnixStream>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.stream);
    }
}

/// The listening socket of an exported segment and its threads; dropping
/// it unlinks the socket and hangs up on every peer.
#[derive(Debug)]
pub(crate) struct HandoutServer {
    path: PathBuf,
    ino: u64,
    stop: Arc<AtomicBool>,
    wake: OwnedFd,
    conns: Arc<Mutex<Conns>>,
    thread: Option<JoinHandle<()>>,
}

impl HandoutServer {
    /// A fresh segment name, `tent-s-<64 random bits>` (no pid in it: a pid
    /// says nothing across pid namespaces).
    pub(crate) fn fresh_name() -> String {
        format!("tent-s-{:016x}", random_u64())
    }

    /// Listen in `dir` under `name` (or, should it be taken, another fresh
    /// one; the name used is returned): bound and
    /// listening under a temporary name first, then renamed without
    /// replacing anything, so no collectable name ever refuses connections
    /// while its owner lives. The socket file's (device, inode) is recorded
    /// and proven to reach this listener (a connection through it arrives
    /// here) before anything is served: the handshake's proofs bind it.
    pub(crate) fn start(
        dir: &str,
        name: String,
        table: Arc<HandoutTable>,
    ) -> Result<(HandoutServer, String)> {
        let dir_path = Path::new(dir);
        let io_err = |what: &'static str| {
            move |e: io::Error| Error::new(ErrorKind::InvalidArgument, what).with_source(e)
        };
        let tmp = dir_path.join(format!("{TMP_PREFIX}{:016x}", random_u64()));
        let listener = UnixListener::bind(&tmp).map_err(io_err("bind the shm segment socket"))?;
        let cleanup = |e: Error| {
            let _ = std::fs::remove_file(&tmp);
            e
        };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("chmod the shm segment socket"))
            .map_err(cleanup)?;
        let (file, st) = open_socket_file(&tmp)
            .map_err(io_err("stat the shm segment socket"))
            .map_err(cleanup)?;
        let (dev, ino) = (st.st_dev, st.st_ino);
        // The file we stat'ed is ours: a connection through it reaches us.
        let probe = connect_file(file.as_fd(), Instant::now() + IO_TIMEOUT)
            .map_err(io_err("probe the shm segment socket"))
            .map_err(cleanup)?;
        listener
            .set_nonblocking(true)
            .map_err(io_err("probe the shm segment socket"))
            .map_err(cleanup)?;
        let ours = listener.accept().is_ok();
        drop(probe);
        drop(file);
        listener
            .set_nonblocking(false)
            .map_err(io_err("probe the shm segment socket"))
            .map_err(cleanup)?;
        if !ours {
            return Err(cleanup(Error::new(
                ErrorKind::AccessDenied,
                "the shm segment socket was replaced while being created",
            )));
        }
        let mut first = Some(name);
        let mut name = String::new();
        for _ in 0..8 {
            let candidate = first.take().unwrap_or_else(Self::fresh_name);
            // RENAME_NOREPLACE never clobbers.
            match rfs::renameat_with(
                rfs::CWD,
                &tmp,
                rfs::CWD,
                dir_path.join(&candidate),
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => {
                    name = candidate;
                    break;
                }
                Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(cleanup(io_err("publish the shm segment socket")(e.into())));
                }
            }
        }
        if name.is_empty() {
            return Err(cleanup(Error::new(
                ErrorKind::InvalidArgument,
                "no free shm segment name",
            )));
        }
        let (wake_r, wake_w) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
            Ok(pipe) => pipe,
            Err(e) => {
                let _ = std::fs::remove_file(dir_path.join(&name));
                return Err(io_err("pipe")(e.into()));
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Conns::default()));
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let bind = binding(dev, ino);
        let thread = std::thread::Builder::new()
            .name("tent-shm-handout".into())
            .spawn(move || accept_loop(listener, wake_r, stop2, conns2, table, bind))
            .map_err(|e| Error::new(ErrorKind::OutOfMemory, "spawn shm handout").with_source(e))?;
        Ok((
            HandoutServer {
                path: dir_path.join(&name),
                ino,
                stop,
                wake: wake_w,
                conns,
                thread: Some(thread),
            },
            name,
        ))
    }
}

impl Drop for HandoutServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.wake, &[1u8]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Unlink only our own socket (not whatever else took the name).
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
        for c in &self.conns.lock().all {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    wake: OwnedFd,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Conns>>,
    table: Arc<HandoutTable>,
    bind: [u8; 16],
) {
    loop {
        let mut fds = [
            PollFd::new(&listener, PollFlags::IN),
            PollFd::new(&wake, PollFlags::IN),
        ];
        let rc = event::poll(&mut fds, None);
        if stop.load(Ordering::Acquire) {
            return;
        }
        if !matches!(rc, Ok(n) if n > 0) || fds[0].revents().is_empty() {
            continue;
        }
        let Ok((s, _)) = listener.accept() else {
            continue;
        };
        match peer_uid(&s) {
            Ok((uid, _)) if uid == euid() => {}
            other => {
                crate::lograte::warn_limited!(
                    "shm-handout-uid",
                    ?other,
                    "shm handout: refusing a peer of another uid"
                );
                continue;
            }
        }
        let s = Arc::new(s);
        if conns.lock().admit(s.clone()) {
            crate::lograte::warn_limited!(
                "shm-handout-evict",
                "shm handout: too many handshakes at once; closed the oldest"
            );
        }
        let slot = Slot {
            conns: conns.clone(),
            stream: s,
        };
        let table = table.clone();
        let spawned = std::thread::Builder::new()
            .name("tent-shm-peer".into())
            .spawn(move || {
                if let Err(why) = serve(&slot, &table, &bind) {
                    tracing::debug!(reason = %why, "shm handout: closing a peer connection");
                }
                drop(slot);
            });
        // On failure the closure, and the slot in it, is dropped: the
        // connection leaves `conns` and is closed.
        if let Err(e) = spawned {
            crate::lograte::warn_limited!(
                "shm-handout-spawn",
                error = %e,
                "shm handout: cannot spawn a peer thread"
            );
        }
    }
}

/// The owner's half of the handshake, all of it by one deadline: hello,
/// challenge carrying the owner's proof (bound to its socket file), and
/// with a secret the peer's proof, checked before anything is handed out.
fn handshake(s: &UnixStream, table: &HandoutTable, bind: &[u8; 16]) -> io::Result<()> {
    let mut by = ByDeadline::new(s, Instant::now() + IO_TIMEOUT);
    let mut hello = [0u8; HELLO_LEN];
    by.read_exact(&mut hello)?;
    if hello[..8] != MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad hello"));
    }
    let client_nonce: [u8; NONCE_LEN] = hello[8..].try_into().expect("nonce");
    let server_nonce = auth::nonce();
    let mut ch = [0u8; CHALLENGE_LEN];
    ch[..8].copy_from_slice(&MAGIC);
    ch[8..8 + NONCE_LEN].copy_from_slice(&server_nonce);
    ch[8 + NONCE_LEN] = u8::from(table.secret.is_some());
    if let Some(secret) = &table.secret {
        ch[8 + NONCE_LEN + 8..].copy_from_slice(&auth::server_proof(
            Door::Shm,
            secret,
            &server_nonce,
            &client_nonce,
            bind,
        ));
    }
    by.write_all(&ch)?;
    if let Some(secret) = &table.secret {
        let mut proof = [0u8; MAC_LEN];
        by.read_exact(&mut proof)?;
        if !auth::verify_client(
            Door::Shm,
            secret,
            &server_nonce,
            &client_nonce,
            bind,
            &proof,
        ) {
            crate::lograte::warn_limited!(
                "shm-handout-proof",
                "shm handout: a peer failed the shared-secret proof"
            );
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "bad proof"));
        }
    }
    Ok(())
}

/// One peer: handshake, a serving slot, the descriptor, then region
/// requests until the peer hangs up. Keeping this connection open is what
/// tells the peer the owner lives.
fn serve(slot: &Slot, table: &HandoutTable, bind: &[u8; 16]) -> io::Result<()> {
    let s = &*slot.stream;
    handshake(s, table, bind)?;
    if !slot.conns.lock().authenticate(&slot.stream) {
        crate::lograte::warn_limited!(
            "shm-handout-full",
            "shm handout: every serving slot is taken; closing an authenticated peer"
        );
        return Err(io::Error::other("no serving slot"));
    }
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    send_reply(s, FD_FRAME, 0, Some(table.desc_fd()))?;
    // From here the peer holds the connection for as long as it maps us.
    let mut req = [0u8; REQUEST_LEN];
    loop {
        match (&*s).read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        if req[..8] != REQUEST_TAG {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad request"));
        }
        let handle = u64::from_le_bytes(req[8..16].try_into().expect("8 bytes"));
        let id = u64::from_le_bytes(req[16..].try_into().expect("8 bytes"));
        match table.get(handle) {
            Some(fd) => send_reply(s, FD_FRAME, id, Some(fd.as_fd()))?,
            None => send_reply(s, GONE_FRAME, id, None)?,
        }
    }
}

// ---- the peer's side --------------------------------------------------------

/// A peer's connection to a segment's owner.
#[derive(Debug)]
pub(crate) struct HandoutClient {
    stream: UnixStream,
    owner_pid: i32,
    /// Id of the last region request sent (the descriptor was 0).
    last_id: AtomicU64,
    /// A reply was cut mid-frame (only a misbehaving owner does that): the
    /// stream is out of step and no more region requests are made on it.
    broken: AtomicBool,
}

fn refused(kind: ErrorKind, name: &str, why: &str) -> Error {
    Error::new(kind, format!("shm segment {name:?}: {why}"))
}

/// A region the owner handed out: its mapping and its memfd (to see which
/// pages the owner populated).
#[derive(Debug)]
pub(crate) struct HandedRegion {
    pub(crate) map: Mapping,
    pub(crate) fd: OwnedFd,
}

impl HandoutClient {
    /// Connect to segment `name` in `dir`, check who serves it, check the
    /// owner's proof then prove the secret when one is set, and map its
    /// descriptor; all of it by one deadline.
    pub(crate) fn connect(
        dir: &str,
        name: &str,
        secret: Option<&[u8]>,
    ) -> Result<(HandoutClient, Mapping)> {
        desc::check_segment_name(name).map_err(|e| Error::invalid(e.to_string()))?;
        let deadline = Instant::now() + IO_TIMEOUT;
        let path = Path::new(dir).join(name);
        let (file, st) = match open_socket_file(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(refused(ErrorKind::SegmentNotFound, name, "no such segment"));
            }
            Err(e) => {
                return Err(refused(ErrorKind::AccessDenied, name, "cannot open").with_source(e));
            }
        };
        let fmt = FileType::from_raw_mode(st.st_mode);
        if fmt == FileType::Symlink {
            return Err(refused(ErrorKind::AccessDenied, name, "is a symlink"));
        }
        if st.st_uid != euid() {
            return Err(refused(
                ErrorKind::AccessDenied,
                name,
                &format!("owned by uid {}, not ours", st.st_uid),
            ));
        }
        if fmt != FileType::Socket {
            return Err(refused(
                ErrorKind::InvalidArgument,
                name,
                "not a tent segment socket",
            ));
        }
        let bind = binding(st.st_dev, st.st_ino);
        let stream =
            connect_file(file.as_fd(), deadline).map_err(|e| match Errno::from_io_error(&e) {
                Some(Errno::CONNREFUSED) => {
                    refused(ErrorKind::ProcessFailed, name, "its owner is gone").with_source(e)
                }
                _ if e.kind() == io::ErrorKind::TimedOut => refused(
                    ErrorKind::Timeout,
                    name,
                    "its socket accepted no connection in time",
                ),
                _ => refused(ErrorKind::Unreachable, name, "connect failed").with_source(e),
            })?;
        drop(file);
        let io = |e: io::Error| {
            let kind = match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorKind::Timeout,
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => {
                    ErrorKind::AccessDenied
                }
                _ => ErrorKind::Unreachable,
            };
            refused(kind, name, "handshake with its owner failed").with_source(e)
        };
        let (uid, owner_pid) = peer_uid(&stream).map_err(io)?;
        if uid != euid() {
            return Err(refused(
                ErrorKind::AccessDenied,
                name,
                &format!("served by uid {uid}, not ours"),
            ));
        }
        let client_nonce = auth::nonce();
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC);
        hello[8..].copy_from_slice(&client_nonce);
        let mut by = ByDeadline::new(&stream, deadline);
        by.write_all(&hello).map_err(io)?;
        let mut ch = [0u8; CHALLENGE_LEN];
        by.read_exact(&mut ch).map_err(io)?;
        if ch[..8] != MAGIC {
            return Err(refused(
                ErrorKind::InvalidArgument,
                name,
                "not a tent owner",
            ));
        }
        let server_nonce: [u8; NONCE_LEN] = ch[8..8 + NONCE_LEN].try_into().expect("nonce");
        let server_proof: [u8; MAC_LEN] = ch[8 + NONCE_LEN + 8..].try_into().expect("mac");
        match (ch[8 + NONCE_LEN] != 0, secret) {
            (true, None) => {
                return Err(refused(
                    ErrorKind::AccessDenied,
                    name,
                    "its owner requires the shared secret: set rpc_shared_secret",
                ));
            }
            (false, Some(_)) => {
                return Err(refused(
                    ErrorKind::AccessDenied,
                    name,
                    "its owner does not authenticate, but rpc_shared_secret is set here",
                ));
            }
            (true, Some(secret)) => {
                // The owner proves itself first, bound to the socket file
                // we connected through; nothing of ours is sent before.
                if !auth::verify_server(
                    Door::Shm,
                    secret,
                    &server_nonce,
                    &client_nonce,
                    &bind,
                    &server_proof,
                ) {
                    return Err(refused(
                        ErrorKind::AccessDenied,
                        name,
                        "its owner failed to prove the shared secret for this socket",
                    ));
                }
                let proof =
                    auth::client_proof(Door::Shm, secret, &server_nonce, &client_nonce, &bind);
                by.write_all(&proof).map_err(io)?;
            }
            (false, None) => {}
        }
        let mut frame = [0u8; REPLY_LEN];
        let got = recv_frame(&stream, &mut frame, deadline).map_err(|e| io(e.err))?;
        let fd = match got.fd {
            Some(fd) if frame[..8] == FD_FRAME && frame[8..] == [0; 8] => fd,
            _ if got.truncated || frame[..8] == AGAIN_FRAME => {
                return Err(refused(
                    ErrorKind::Unreachable,
                    name,
                    "its descriptor memfd could not be passed (descriptor limits?)",
                ));
            }
            _ => {
                return Err(refused(
                    ErrorKind::InvalidArgument,
                    name,
                    "no descriptor memfd",
                ));
            }
        };
        // Read-only, and only if the owner sealed it against every other
        // writer: peers never write the words other peers read.
        let desc = map_admitted(&fd, false, desc::admit_descriptor)?;
        Ok((
            HandoutClient {
                stream,
                owner_pid,
                last_id: AtomicU64::new(0),
                broken: AtomicBool::new(false),
            },
            desc,
        ))
    }

    /// The owner's pid as this process's namespace sees it (0 when it is in
    /// a namespace we cannot see into); for logs only.
    pub(crate) fn owner_pid(&self) -> i32 {
        self.owner_pid
    }

    /// Ask for region `handle` and map it if the parser admits it for
    /// `admit`; `Ok(None)` when the owner no longer hands it out. Gives up
    /// at `deadline` (`Timeout`); a reply to an earlier request that timed
    /// out is recognised by its id and dropped (its memfd closed). Failures
    /// that may pass (`Timeout`, `Unreachable`) are not the owner's fault;
    /// `InvalidArgument` is. Callers serialise requests.
    pub(crate) fn region(
        &self,
        handle: u64,
        admit: impl FnOnce(u64, i32) -> std::result::Result<usize, DescError>,
        deadline: Instant,
    ) -> Result<Option<HandedRegion>> {
        let io = |e: io::Error| {
            let kind = match e.kind() {
                io::ErrorKind::TimedOut => ErrorKind::Timeout,
                _ => ErrorKind::Unreachable,
            };
            Error::new(kind, "asking the shm owner for a region").with_source(e)
        };
        if self.broken.load(Ordering::Relaxed) {
            return Err(Error::invalid(
                "the connection to the shm owner is out of step (a reply was cut short)",
            ));
        }
        let id = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut req = [0u8; REQUEST_LEN];
        req[..8].copy_from_slice(&REQUEST_TAG);
        req[8..16].copy_from_slice(&handle.to_le_bytes());
        req[16..].copy_from_slice(&id.to_le_bytes());
        // 24 bytes into an empty-ish socket buffer go in one send or none.
        ByDeadline::new(&self.stream, deadline)
            .write_all(&req)
            .map_err(io)?;
        loop {
            let mut frame = [0u8; REPLY_LEN];
            let got = recv_frame(&self.stream, &mut frame, deadline).map_err(|e| {
                if e.partial {
                    self.broken.store(true, Ordering::Relaxed);
                }
                io(e.err)
            })?;
            let rid = u64::from_le_bytes(frame[8..].try_into().expect("8 bytes"));
            if rid < id {
                // The late answer to a request that timed out: drop it.
                continue;
            }
            if rid > id {
                self.broken.store(true, Ordering::Relaxed);
                return Err(Error::invalid(
                    "the shm owner answered a request not yet made",
                ));
            }
            let tag: [u8; 8] = frame[..8].try_into().expect("8 bytes");
            return match got.fd {
                _ if got.truncated || tag == AGAIN_FRAME => Err(Error::new(
                    ErrorKind::Unreachable,
                    "the shm owner's region memfd could not be passed (descriptor limits?)",
                )),
                Some(fd) if tag == FD_FRAME => {
                    let map = map_admitted(&fd, true, admit)?;
                    Ok(Some(HandedRegion { map, fd }))
                }
                None if tag == GONE_FRAME => Ok(None),
                _ => Err(Error::invalid(
                    "the shm owner answered a region request oddly",
                )),
            };
        }
    }

    /// Has the owner hung up (died, or withdrawn the segment)? One
    /// non-blocking `poll`.
    pub(crate) fn owner_gone(&self) -> bool {
        let mut p = [self.liveness_pollfd()];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(event::poll(&mut p, Some(&now)), Ok(n) if n > 0) && Self::hung_up(p[0].revents())
    }

    /// What to `poll` for to learn that the owner hung up: readable data
    /// (a late reply) does not wake it, only the end of the connection.
    pub(crate) fn liveness_pollfd(&self) -> PollFd<'_> {
        PollFd::new(&self.stream, PollFlags::RDHUP)
    }

    /// Do the `revents` of a [`HandoutClient::liveness_pollfd`] say the
    /// owner hung up?
    pub(crate) fn hung_up(revents: PollFlags) -> bool {
        revents.intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR)
    }

    /// End the connection from our side (the peer is closing): a request
    /// waiting for the owner's reply returns at once, and the owner sees
    /// this peer go.
    pub(crate) fn hang_up(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

// ---- leftovers --------------------------------------------------------------

/// Is anybody serving the socket at `path`? `Some(false)` only when a
/// connect is refused (nobody listens: its owner is gone).
fn serving(path: &Path) -> Option<bool> {
    let fd = unix_socket(SocketFlags::NONBLOCK).ok()?;
    let addr = SocketAddrUnix::new(path).ok()?;
    match net::connect(&fd, &addr) {
        Ok(()) | Err(Errno::AGAIN | Errno::INPROGRESS) => Some(true),
        Err(Errno::CONNREFUSED) => Some(false),
        Err(_) => None,
    }
}

/// Remove segment sockets in `dir` that nobody serves any more (an owner
/// killed with -9 cannot unlink its own). Only sockets of our uid count;
/// the verdict comes from the socket, never from a pid.
pub(crate) fn collect_stale(dir: &str) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let tmp = name.starts_with(TMP_PREFIX);
        if !name.starts_with("tent-") && !tmp {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.file_type().is_socket() || meta.uid() != euid() {
            continue;
        }
        if tmp && meta.modified().ok().and_then(|m| m.elapsed().ok()) < Some(TMP_GRACE) {
            continue;
        }
        if serving(&path) == Some(false) {
            tracing::debug!(file = ?path, "removing a shm segment socket nobody serves");
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::mem::MaybeUninit;

    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

    fn pair() -> (HandoutClient, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        let client = HandoutClient {
            stream: a,
            owner_pid: 0,
            last_id: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        };
        (client, b)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    fn reply(id: u64) -> [u8; REPLY_LEN] {
        let mut f = [0u8; REPLY_LEN];
        f[..8].copy_from_slice(&FD_FRAME);
        f[8..].copy_from_slice(&id.to_le_bytes());
        f
    }

    /// Send `frame` with 60 copies of `fd` in one SCM_RIGHTS message.
    fn send_many(s: &UnixStream, frame: &[u8], fd: BorrowedFd<'_>) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(60))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [fd; 60];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        let sent = net::sendmsg(s, &[IoSlice::new(frame)], &mut control, SendFlags::NOSIGNAL);
        assert_eq!(sent.unwrap(), frame.len());
    }

    fn region_fd() -> OwnedFd {
        sealed_memfd("t", 8192).unwrap()
    }

    /// More descriptors than fit the control buffer (what a descriptor limit
    /// also does): the frame is consumed whole, what arrived is closed, the
    /// failure is transient (`Unreachable`, not `InvalidArgument`), and the
    /// next request on the same connection succeeds.
    #[test]
    fn truncated_control_messages_are_transient() {
        let (client, owner) = pair();
        let fd = region_fd();
        send_many(&owner, &reply(1), fd.as_fd());
        let err = client
            .region(1, |s, seals| desc::admit_memfd(s, seals, 4096), soon())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unreachable, "{err}");
        assert!(!client.broken.load(Ordering::Relaxed));
        send_with_fd(&owner, &reply(2), fd.as_fd()).unwrap();
        let got = client
            .region(1, |s, seals| desc::admit_memfd(s, seals, 4096), soon())
            .unwrap();
        assert!(got.is_some());
    }

    /// A recoverable send failure is answered with AGAIN (the connection
    /// stays up), which the peer reads as transient.
    #[test]
    fn recoverable_send_failures_answer_again() {
        for e in [Errno::TOOMANYREFS, Errno::MFILE, Errno::NFILE] {
            assert!(recoverable_send(&io::Error::from_raw_os_error(
                e.raw_os_error()
            )));
        }
        for e in [Errno::PIPE, Errno::CONNRESET, Errno::AGAIN] {
            assert!(!recoverable_send(&io::Error::from_raw_os_error(
                e.raw_os_error()
            )));
        }
        let (client, owner) = pair();
        let mut again = [0u8; REPLY_LEN];
        again[..8].copy_from_slice(&AGAIN_FRAME);
        again[8..].copy_from_slice(&1u64.to_le_bytes());
        (&owner).write_all(&again).unwrap();
        let err = client
            .region(1, |s, seals| desc::admit_memfd(s, seals, 4096), soon())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unreachable);
        assert!(!client.broken.load(Ordering::Relaxed));
    }

    /// A stale reply (to a request that timed out) is dropped; a reply to a
    /// request not yet made breaks the connection (typed).
    #[test]
    fn replies_are_matched_to_requests() {
        let (client, owner) = pair();
        let fd = region_fd();
        let err = client
            .region(
                1,
                |s, seals| desc::admit_memfd(s, seals, 4096),
                Instant::now(),
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout);
        send_with_fd(&owner, &reply(1), fd.as_fd()).unwrap(); // late
        let mut gone = [0u8; REPLY_LEN];
        gone[..8].copy_from_slice(&GONE_FRAME);
        gone[8..].copy_from_slice(&2u64.to_le_bytes());
        (&owner).write_all(&gone).unwrap();
        let got = client
            .region(2, |s, seals| desc::admit_memfd(s, seals, 4096), soon())
            .unwrap();
        assert!(got.is_none(), "the answer to request 2, not the stale one");
        send_with_fd(&owner, &reply(9), fd.as_fd()).unwrap();
        let err = client
            .region(3, |s, seals| desc::admit_memfd(s, seals, 4096), soon())
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(client.broken.load(Ordering::Relaxed));
    }

    /// A slot whose thread never ran (spawn failed: the closure is dropped)
    /// leaves `conns`; an authenticated one gives its serving slot back.
    #[test]
    fn slots_are_given_back_even_without_a_thread() {
        let conns = Arc::new(Mutex::new(Conns::default()));
        let (a, _b) = UnixStream::pair().unwrap();
        let a = Arc::new(a);
        conns.lock().admit(a.clone());
        let slot = Slot {
            conns: conns.clone(),
            stream: a.clone(),
        };
        let never_run = move || drop(slot);
        drop(never_run);
        assert!(conns.lock().all.is_empty());
        conns.lock().admit(a.clone());
        let slot = Slot {
            conns: conns.clone(),
            stream: a.clone(),
        };
        assert!(conns.lock().authenticate(&a));
        assert_eq!(conns.lock().authed, 1);
        drop(slot);
        let c = conns.lock();
        assert_eq!((c.all.len(), c.authed), (0, 0));
    }

    /// At most MAX_PENDING handshakes: the oldest is shut down for a new
    /// one; serving slots are bounded separately.
    #[test]
    fn handshakes_are_bounded_and_slots_counted_after_auth() {
        let mut c = Conns::default();
        let mut peers = Vec::new();
        for _ in 0..MAX_PENDING + 5 {
            let (a, b) = UnixStream::pair().unwrap();
            let a = Arc::new(a);
            c.admit(a.clone());
            peers.push((a, b));
        }
        let live = c.all.iter().filter(|x| !x.evicted).count();
        assert_eq!(live, MAX_PENDING);
        // The five oldest were shut down: their peers read EOF.
        let mut byte = [0u8; 1];
        assert_eq!((&peers[0].1).read(&mut byte).unwrap(), 0);
        assert!(
            !c.authenticate(&peers[0].0),
            "an evicted handshake gets no slot"
        );
        assert!(c.authenticate(&peers[MAX_PENDING + 4].0));
        c.authed = MAX_CONNECTIONS;
        assert!(!c.authenticate(&peers[MAX_PENDING + 3].0));
    }
}
