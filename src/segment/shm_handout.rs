//! How shm segment memory travels between processes: sealed memfds handed
//! out over a unix-domain socket.
//!
//! The owner listens on a pathname socket `<dir>/<segment name>` (it works
//! across network namespaces that share the directory; an abstract socket
//! would not). A peer connects, both sides check the other's uid with
//! `SO_PEERCRED`, they run the control plane's HMAC challenge-response under
//! the shm labels when a shared secret is set, and the owner sends the
//! descriptor memfd with `SCM_RIGHTS`; later the peer asks for region memfds
//! by handle. Every memfd is sealed against shrinking and growing before
//! it leaves the owner, and the peer checks the seals and the size before
//! it maps, so the owner cannot SIGBUS a peer by truncating.
//!
//! The connection is also the owner's liveness: the owner keeps its end
//! open for as long as it serves the segment, so a peer sees `POLLHUP` the
//! moment the owner dies or withdraws (one non-blocking `poll`), and a
//! probing `connect` is refused once nobody listens. No pid is involved.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tent_rings::ErrorKind;

use super::shm_desc::{self, DescError};
use crate::control::auth;
use crate::control::wire::{MAC_LEN, NONCE_LEN};
use crate::error::{Error, Result};

const MAGIC: [u8; 8] = *b"TENTSHM1";
const HELLO_LEN: usize = 8 + NONCE_LEN;
const CHALLENGE_LEN: usize = 8 + NONCE_LEN + 8;
const FD_FRAME: [u8; 8] = *b"MEMFD\0\0\0";
const GONE_FRAME: [u8; 8] = *b"GONE\0\0\0\0";
const REQUEST_TAG: [u8; 8] = *b"GETREGN\0";
/// Peers served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 256;
/// A step of the handshake, or a region request, that takes longer fails.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// A temporary socket older than this, refusing connections, is a leftover.
const TMP_GRACE: Duration = Duration::from_secs(60);
/// Prefix of a socket not yet renamed to its segment name.
const TMP_PREFIX: &str = ".tent-tmp-";

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A random 64-bit value from the kernel (names, handles' salt).
pub(crate) fn random_u64() -> u64 {
    let n = auth::nonce();
    u64::from_le_bytes(n[..8].try_into().expect("8 bytes"))
}

// ---- memfds and mappings ------------------------------------------------

/// A `memfd_create` file of `size` bytes, zeroed, sealed against shrinking,
/// growing and further sealing.
pub(crate) fn sealed_memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string; the flags are memfd_create's.
    let raw =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(last_err());
    }
    // SAFETY: memfd_create returned a fresh descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len =
        libc::off_t::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(last_err());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl F_ADD_SEALS on our own memfd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(last_err());
    }
    Ok(fd)
}

/// Size and seals of a handed-out file (seals 0 when it cannot carry any).
fn size_and_seals(fd: BorrowedFd<'_>) -> io::Result<(u64, i32)> {
    // SAFETY: an all-zero stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on a live descriptor into a stat buffer we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_err());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok((0, 0));
    }
    // SAFETY: F_GET_SEALS reads the seals; EINVAL for files without them.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    Ok((u64::try_from(st.st_size).unwrap_or(0), seals.max(0)))
}

/// A shared mapping of a memfd; unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; every
// access goes through raw pointers whose users synchronise (atomics or
// checked copies), so moving or sharing the handle across threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` shared (read-only unless `writable`).
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        // SAFETY: a fresh mapping at an address of the kernel's choice; the
        // caller checked that the (sealed) file holds `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_err());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Mapping { ptr, len })
    }

    /// Start of the mapping (page aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; nothing borrows it any
        // more (holders keep an Arc of the mapping while they copy).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Map a handed-out memfd for `want` bytes after the shared parser admits it.
fn map_admitted(
    fd: &OwnedFd,
    writable: bool,
    admit: impl FnOnce(u64, i32) -> std::result::Result<usize, DescError>,
) -> Result<Mapping> {
    let (size, seals) = size_and_seals(fd.as_fd()).map_err(|e| {
        Error::new(ErrorKind::InvalidArgument, "fstat of a handed-out memfd").with_source(e)
    })?;
    let len = admit(size, seals).map_err(|e| Error::invalid(e.to_string()))?;
    Mapping::map(fd.as_fd(), len, writable)
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, "mapping a peer's memfd").with_source(e))
}

// ---- SCM_RIGHTS ---------------------------------------------------------

fn send_frame(s: &UnixStream, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let Some(fd) = fd else {
        return (&*s).write_all(bytes);
    };
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `space` writable, aligned bytes, so the
    // first header exists and its data holds one descriptor.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(last_err());
    }
    (&*s).write_all(&bytes[n as usize..])
}

/// Read exactly `buf.len()` bytes; the first read may carry descriptors:
/// the first is returned, any others are closed.
fn recv_frame(s: &UnixStream, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: msg points at live, writable buffers of the sizes given.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = last_err();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut first = None;
    // SAFETY: walking the control messages the kernel wrote into cbuf, with
    // the CMSG macros bounded by msg_controllen; each SCM_RIGHTS payload is
    // an array of descriptors now installed in this process, which we own.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    let fd = OwnedFd::from_raw_fd(raw);
                    if first.is_none() {
                        first = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 && !buf.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    (&*s).read_exact(&mut buf[n..])?;
    Ok(first)
}

fn peer_uid(s: &UnixStream) -> io::Result<(u32, i32)> {
    // SAFETY: an all-zero ucred is a valid out-buffer.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a ucred of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(last_err());
    }
    Ok((cred.uid, cred.pid))
}

// ---- the owner's side -----------------------------------------------------

/// What the owner hands out: the descriptor and the published regions.
#[derive(Debug)]
pub(crate) struct HandoutTable {
    desc: OwnedFd,
    regions: Mutex<Vec<(u64, Arc<OwnedFd>)>>,
    secret: Option<Vec<u8>>,
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
        self.regions
            .lock()
            .expect("handout poisoned")
            .push((handle, fd));
    }

    /// Stop handing out region `handle`.
    pub(crate) fn remove(&self, handle: u64) {
        self.regions
            .lock()
            .expect("handout poisoned")
            .retain(|(h, _)| *h != handle);
    }

    fn get(&self, handle: u64) -> Option<Arc<OwnedFd>> {
        let r = self.regions.lock().expect("handout poisoned");
        r.iter().find(|(h, _)| *h == handle).map(|(_, f)| f.clone())
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
    conns: Arc<Mutex<Vec<Arc<UnixStream>>>>,
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
    /// while its owner lives.
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
        let ino = std::fs::symlink_metadata(&tmp)
            .map_err(io_err("stat the shm segment socket"))
            .map_err(cleanup)?
            .ino();
        let mut first = Some(name);
        let mut name = String::new();
        for _ in 0..8 {
            let candidate = first.take().unwrap_or_else(Self::fresh_name);
            let from = CString::new(tmp.as_os_str().as_bytes()).expect("no NUL in path");
            let to = CString::new(dir_path.join(&candidate).as_os_str().as_bytes())
                .expect("no NUL in path");
            // SAFETY: two valid C paths; RENAME_NOREPLACE never clobbers.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if rc == 0 {
                name = candidate;
                break;
            }
            if last_err().raw_os_error() != Some(libc::EEXIST) {
                return Err(cleanup(
                    io_err("publish the shm segment socket")(last_err()),
                ));
            }
        }
        if name.is_empty() {
            return Err(cleanup(Error::new(
                ErrorKind::InvalidArgument,
                "no free shm segment name",
            )));
        }
        let mut pipe = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            let _ = std::fs::remove_file(dir_path.join(&name));
            return Err(io_err("pipe")(last_err()));
        }
        // SAFETY: pipe2 returned two fresh descriptors we now own.
        let (wake_r, wake_w) =
            unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let thread = std::thread::Builder::new()
            .name("tent-shm-handout".into())
            .spawn(move || accept_loop(listener, wake_r, stop2, conns2, table))
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
        // SAFETY: a one-byte write into our own pipe.
        unsafe { libc::write(self.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Unlink only our own socket (not whatever else took the name).
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
        for c in self.conns.lock().expect("conns poisoned").drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    wake: OwnedFd,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<Arc<UnixStream>>>>,
    table: Arc<HandoutTable>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over two live descriptors in a local array.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if stop.load(Ordering::Acquire) {
            return;
        }
        if rc <= 0 || fds[0].revents == 0 {
            continue;
        }
        let Ok((s, _)) = listener.accept() else {
            continue;
        };
        match peer_uid(&s) {
            Ok((uid, _)) if uid == euid() => {}
            other => {
                tracing::warn!(?other, "shm handout: refusing a peer of another uid");
                continue;
            }
        }
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("shm handout: too many peers; closing this one");
            continue;
        }
        let s = Arc::new(s);
        conns.lock().expect("conns poisoned").push(s.clone());
        let (table, conns, active) = (table.clone(), conns.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("tent-shm-peer".into())
            .spawn(move || {
                if let Err(why) = serve(&s, &table) {
                    tracing::debug!(reason = %why, "shm handout: closing a peer connection");
                }
                conns
                    .lock()
                    .expect("conns poisoned")
                    .retain(|c| !Arc::ptr_eq(c, &s));
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "shm handout: cannot spawn a peer thread");
        }
    }
}

/// One peer: handshake (with proof when a secret is set), the descriptor,
/// then region requests until the peer hangs up. Keeping this connection
/// open is what tells the peer the owner lives.
fn serve(s: &UnixStream, table: &HandoutTable) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut hello = [0u8; HELLO_LEN];
    (&*s).read_exact(&mut hello)?;
    if hello[..8] != MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad hello"));
    }
    let client_nonce: [u8; NONCE_LEN] = hello[8..].try_into().expect("nonce");
    let server_nonce = auth::nonce();
    let mut ch = [0u8; CHALLENGE_LEN];
    ch[..8].copy_from_slice(&MAGIC);
    ch[8..8 + NONCE_LEN].copy_from_slice(&server_nonce);
    ch[8 + NONCE_LEN] = u8::from(table.secret.is_some());
    (&*s).write_all(&ch)?;
    if let Some(secret) = &table.secret {
        let mut proof = [0u8; MAC_LEN];
        (&*s).read_exact(&mut proof)?;
        if !auth::verify_shm_client(secret, &server_nonce, &client_nonce, &proof) {
            tracing::warn!("shm handout: a peer failed the shared-secret proof");
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "bad proof"));
        }
        (&*s).write_all(&auth::shm_server_proof(
            secret,
            &server_nonce,
            &client_nonce,
        ))?;
    }
    send_frame(s, &FD_FRAME, Some(table.desc_fd()))?;
    // From here the peer holds the connection for as long as it maps us.
    s.set_read_timeout(None)?;
    let mut req = [0u8; 16];
    loop {
        match (&*s).read_exact(&mut req) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        if req[..8] != REQUEST_TAG {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "bad request"));
        }
        let handle = u64::from_le_bytes(req[8..].try_into().expect("8 bytes"));
        match table.get(handle) {
            Some(fd) => send_frame(s, &FD_FRAME, Some(fd.as_fd()))?,
            None => send_frame(s, &GONE_FRAME, None)?,
        }
    }
}

// ---- the peer's side --------------------------------------------------------

/// A peer's connection to a segment's owner.
#[derive(Debug)]
pub(crate) struct HandoutClient {
    stream: UnixStream,
    owner_pid: i32,
}

fn refused(kind: ErrorKind, name: &str, why: &str) -> Error {
    Error::new(kind, format!("shm segment {name:?}: {why}"))
}

impl HandoutClient {
    /// Connect to segment `name` in `dir`, check who serves it, prove the
    /// secret both ways when one is set, and map its descriptor.
    pub(crate) fn connect(
        dir: &str,
        name: &str,
        secret: Option<&[u8]>,
    ) -> Result<(HandoutClient, Mapping)> {
        shm_desc::check_segment_name(name).map_err(|e| Error::invalid(e.to_string()))?;
        let path = Path::new(dir).join(name);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(refused(ErrorKind::SegmentNotFound, name, "no such segment"));
            }
            Err(e) => {
                return Err(refused(ErrorKind::AccessDenied, name, "cannot stat").with_source(e));
            }
        };
        if meta.file_type().is_symlink() {
            return Err(refused(ErrorKind::AccessDenied, name, "is a symlink"));
        }
        if meta.uid() != euid() {
            return Err(refused(
                ErrorKind::AccessDenied,
                name,
                &format!("owned by uid {}, not ours", meta.uid()),
            ));
        }
        if !meta.file_type().is_socket() {
            return Err(refused(
                ErrorKind::InvalidArgument,
                name,
                "not a tent segment socket",
            ));
        }
        let stream = UnixStream::connect(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => {
                refused(ErrorKind::ProcessFailed, name, "its owner is gone").with_source(e)
            }
            Some(libc::ENOENT) => refused(ErrorKind::SegmentNotFound, name, "no such segment"),
            _ => refused(ErrorKind::Unreachable, name, "connect failed").with_source(e),
        })?;
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
        stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
        let client_nonce = auth::nonce();
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC);
        hello[8..].copy_from_slice(&client_nonce);
        (&stream).write_all(&hello).map_err(io)?;
        let mut ch = [0u8; CHALLENGE_LEN];
        (&stream).read_exact(&mut ch).map_err(io)?;
        if ch[..8] != MAGIC {
            return Err(refused(
                ErrorKind::InvalidArgument,
                name,
                "not a tent owner",
            ));
        }
        let server_nonce: [u8; NONCE_LEN] = ch[8..8 + NONCE_LEN].try_into().expect("nonce");
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
                (&stream)
                    .write_all(&auth::shm_client_proof(
                        secret,
                        &server_nonce,
                        &client_nonce,
                    ))
                    .map_err(io)?;
                let mut proof = [0u8; MAC_LEN];
                (&stream).read_exact(&mut proof).map_err(io)?;
                if !auth::verify_shm_server(secret, &server_nonce, &client_nonce, &proof) {
                    return Err(refused(
                        ErrorKind::AccessDenied,
                        name,
                        "its owner failed to prove the shared secret",
                    ));
                }
            }
            (false, None) => {}
        }
        let mut frame = [0u8; 8];
        let fd = recv_frame(&stream, &mut frame).map_err(io)?;
        let fd = match fd {
            Some(fd) if frame == FD_FRAME => fd,
            _ => {
                return Err(refused(
                    ErrorKind::InvalidArgument,
                    name,
                    "no descriptor memfd",
                ));
            }
        };
        let desc = map_admitted(&fd, false, |size, seals| {
            shm_desc::admit_memfd(size, seals, shm_desc::DESC_BYTES as u64)
        })?;
        Ok((HandoutClient { stream, owner_pid }, desc))
    }

    /// The owner's pid as this process's namespace sees it (0 when it is in
    /// a namespace we cannot see into); for logs only.
    pub(crate) fn owner_pid(&self) -> i32 {
        self.owner_pid
    }

    /// Ask for region `handle` and map it if the parser admits it for
    /// `admit`; `Ok(None)` when the owner no longer hands it out.
    pub(crate) fn region(
        &self,
        handle: u64,
        admit: impl FnOnce(u64, i32) -> std::result::Result<usize, DescError>,
    ) -> Result<Option<Mapping>> {
        let io = |e: io::Error| {
            Error::new(ErrorKind::Unreachable, "asking the shm owner for a region").with_source(e)
        };
        let mut req = [0u8; 16];
        req[..8].copy_from_slice(&REQUEST_TAG);
        req[8..].copy_from_slice(&handle.to_le_bytes());
        (&self.stream).write_all(&req).map_err(io)?;
        let mut frame = [0u8; 8];
        let fd = recv_frame(&self.stream, &mut frame).map_err(io)?;
        match fd {
            Some(fd) if frame == FD_FRAME => map_admitted(&fd, true, admit).map(Some),
            None if frame == GONE_FRAME => Ok(None),
            _ => Err(Error::invalid(
                "the shm owner answered a region request oddly",
            )),
        }
    }

    /// Has the owner hung up (died, or withdrawn the segment)? One
    /// non-blocking `poll`.
    pub(crate) fn owner_gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: poll on one live descriptor, zero timeout.
        let rc = unsafe { libc::poll(&mut p, 1, 0) };
        rc > 0 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
    }
}

// ---- leftovers --------------------------------------------------------------

/// Is anybody serving the socket at `path`? `Some(false)` only when a
/// connect is refused (nobody listens: its owner is gone).
fn serving(path: &Path) -> Option<bool> {
    // SAFETY: a fresh non-blocking socket that we own below.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return None;
    }
    // SAFETY: socket returned a descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_un is valid; the path is copied below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return None;
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: connect with a sockaddr_un we filled, of its full size.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Some(true);
    }
    match last_err().raw_os_error() {
        Some(libc::ECONNREFUSED) => Some(false),
        Some(libc::EAGAIN | libc::EINPROGRESS) => Some(true),
        _ => None,
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
