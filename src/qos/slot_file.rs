//! Where a slot clock's shared memory comes from, and who is still there.
//!
//! Processes that name the same `shared_quota_shm_path` (`/name`) meet at
//! `/dev/shm/name`, a **lock file**: nothing is ever read from it or
//! mapped of it, so what another process writes into it or how it
//! truncates it harms nobody. Liveness is open-file-description (OFD) byte
//! locks on it, which the kernel drops the moment a participant's open
//! file description closes (its process dies; a child forked without exec
//! closes its copy, see `LockFd`), whatever pid it had or another process
//! gets:
//!
//! ```text
//!  byte 0        the creator: held (exclusive) while a first participant
//!                decides that nobody is there and makes the memory
//!  byte 1        members: held shared by each participant from before it
//!                asks for the memory until it leaves
//!  byte 2 + i    seat i: held (exclusive) by the participant in it
//! ```
//!
//! The memory itself is a memfd sealed against shrinking, growing and
//! further seals, so no process can truncate it under a mapping (which
//! would kill every participant with `SIGBUS`). It travels only over unix
//! sockets: each participant listens at `/dev/shm/name.s<seat>` and hands
//! the memfd (`SCM_RIGHTS`) to any process of its own uid that connects.
//! Nobody reads anything from a joiner, so a connection can never stall
//! the participant's keeper thread. A joiner takes the member lock, then
//! asks the participants of the held seats, one after another (a stopped
//! one only costs it [`ATTEMPT`]); it checks the sender's uid
//! (`SO_PEERCRED`), that the memfd is a shmem file of exactly
//! [`MEM_LEN`] bytes sealed against resizing, and the memory's format
//! before it maps and trusts it.
//!
//! When nobody is a member (no other process holds byte 1), the one that
//! holds the creator lock makes a fresh memfd. The memory lives exactly
//! as long as some participant holds it, so a file left by an earlier run
//! holds no stale state, and an interval found in the memory is always a
//! live participant's.
//!
//! Trust: every process of the same uid may join and write the memory (it
//! holds only QoS state; such a process could equally stop or signal this
//! one): it can stall the rotation, hold the creator lock so that nobody
//! new can start a clock (they fail with `Timeout`), or unlink the file so
//! that later joiners form a group of their own; it cannot make a
//! participant fault.
//! Nobody of another uid can connect (the socket is mode 0600 and the uid
//! is checked on both ends) or lock the file (0600).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::fs::{self as rfs, FileType, Mode, OFlags, SealFlags};
use tent_rings::ErrorKind;

use crate::error::{Error, Result};
use crate::memfd::{
    Mapping, connect_file, euid, open_socket_file, peer_uid, recv_frame, send_with_fd,
    size_and_seals,
};

/// Bytes of the slot memory (the payload rounded up to a page).
pub(crate) const MEM_LEN: usize = 8192;
/// What a participant sends with the memfd: a tag and the format.
const FRAME_TAG: [u8; 8] = *b"TENTSLOT";
const FRAME_LEN: usize = 16;
/// How long a joiner waits for one participant to hand the memory over.
pub(crate) const ATTEMPT: Duration = Duration::from_millis(250);
/// How long a joiner tries in all before it gives up.
pub(crate) const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the keeper checks that its socket is still at its name.
const SOCKET_CHECK: Duration = Duration::from_secs(1);
/// Connections one call of [`SlotFile::serve`] answers (the rest wait for
/// the next call, a few ms later).
const SERVE_BURST: usize = 16;
/// Name bytes a socket suffix (`.s63`) may add under `NAME_MAX`.
pub(crate) const MAX_NAME: usize = 250;

const CREATOR_BYTE: u64 = 0;
const MEMBER_BYTE: u64 = 1;
const SEAT_BASE: u64 = 2;

/// Lock kinds.
#[derive(Clone, Copy)]
enum Lock {
    Shared,
    Exclusive,
}

/// `F_OFD_SETLK`/`F_OFD_GETLK` on `len` bytes at `start` of `fd`.
fn ofd(
    fd: BorrowedFd<'_>,
    cmd: libc::c_int,
    ty: libc::c_int,
    start: u64,
    len: u64,
) -> io::Result<libc::flock> {
    // SAFETY: `flock` is a plain C struct; all zeroes is a valid value (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = i64::try_from(start).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    fl.l_len = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: F_OFD_SETLK and F_OFD_GETLK read and write only the `flock` passed, which lives across the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// Take a lock on one byte without waiting: `false` when another open
/// file description holds a conflicting one.
fn try_lock(fd: BorrowedFd<'_>, byte: u64, kind: Lock) -> io::Result<bool> {
    let ty = match kind {
        Lock::Shared => libc::F_RDLCK,
        Lock::Exclusive => libc::F_WRLCK,
    };
    match ofd(fd, libc::F_OFD_SETLK, ty, byte, 1) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

fn unlock(fd: BorrowedFd<'_>, byte: u64) {
    let _ = ofd(fd, libc::F_OFD_SETLK, libc::F_UNLCK, byte, 1);
}

/// Does another open file description hold any lock on `byte`?
fn held_elsewhere(fd: BorrowedFd<'_>, byte: u64) -> io::Result<bool> {
    let fl = ofd(fd, libc::F_OFD_GETLK, libc::F_WRLCK, byte, 1)?;
    Ok(i32::from(fl.l_type) != libc::F_UNLCK)
}

/// Lock-file descriptors of this process's participants, closed in a child
/// forked without exec: a fork shares the open file description, and OFD
/// locks last until its last descriptor closes, so a child that lives on
/// would hold a departed participant's member and seat locks.
static CLOSE_IN_CHILD: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
static AT_FORK: Once = Once::new();

extern "C" fn close_lock_files_in_child() {
    for slot in &CLOSE_IN_CHILD {
        let fd = slot.load(Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: close is async-signal-safe; `fd` is the child's copy of a lock file a live participant of the parent registered (it unregisters before it closes).
            unsafe { libc::close(fd) };
        }
    }
}

/// The lock file's descriptor, registered to be closed in forked children.
#[derive(Debug)]
struct LockFd {
    fd: OwnedFd,
    slot: Option<usize>,
}

impl LockFd {
    fn new(fd: OwnedFd) -> LockFd {
        AT_FORK.call_once(|| {
            // SAFETY: registers a child handler that only calls close(2); no prepare or parent handler.
            let rc = unsafe { libc::pthread_atfork(None, None, Some(close_lock_files_in_child)) };
            if rc != 0 {
                tracing::warn!(rc, "slot file: pthread_atfork failed; a forked child would keep this process's slot locks");
            }
        });
        let raw = fd.as_raw_fd();
        let slot = CLOSE_IN_CHILD.iter().position(|s| {
            s.compare_exchange(-1, raw, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        if slot.is_none() {
            crate::lograte::warn_limited!(
                "slot fork table",
                "slot file: more than 64 slot clocks in one process; a child forked without exec would keep the newest one's locks"
            );
        }
        LockFd { fd, slot }
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for LockFd {
    fn drop(&mut self) {
        // Unregistered before the descriptor closes, so a child never
        // closes a number this process has reused.
        if let Some(i) = self.slot {
            CLOSE_IN_CHILD[i].store(-1, Ordering::Release);
        }
    }
}

/// Open (or create) the lock file: a regular file of this uid that no
/// other user may write.
fn open_lock_file(path: &Path, name: &str) -> Result<OwnedFd> {
    let fd = rfs::open(
        path,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| {
        Error::invalid(format!(
            "shared_quota_shm_path {name:?}: cannot open {} (a symlink, or not ours): remove it, \
             or set another shared_quota_shm_path",
            path.display()
        ))
        .with_source(io::Error::from(e))
    })?;
    let st = rfs::fstat(&fd)
        .map_err(|e| Error::invalid("stat the slot file").with_source(io::Error::from(e)))?;
    let why = if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        Some("not a regular file".to_owned())
    } else if st.st_uid != euid() {
        Some(format!("owned by uid {}, not ours", st.st_uid))
    } else if st.st_mode & 0o022 != 0 {
        Some("other users may write it".to_owned())
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::invalid(format!(
            "shared_quota_shm_path {name:?}: {} is {why}: remove it, or set another \
             shared_quota_shm_path",
            path.display()
        ))),
        None => Ok(fd),
    }
}

/// One participant's place in a slot file: its locks, its seat, the
/// mapped memory and the socket it hands the memory out on. Dropping it
/// unlinks the socket, then gives every lock back.
#[derive(Debug)]
pub(crate) struct SlotFile {
    path: PathBuf,
    /// The seat's socket; only the keeper thread takes it.
    listening: Mutex<Listening>,
    memfd: OwnedFd,
    map: Mapping,
    seat: usize,
    /// Did this participant make the memory?
    created: bool,
    /// The memory's format, sent with it.
    format: u64,
    /// The pid that handed the memory over (`SO_PEERCRED`; 0: in a pid
    /// namespace this process cannot see into); ours when created.
    handed_by: i32,
    /// Last: closing it drops every lock this participant holds.
    lock: LockFd,
}

/// Why one attempt to get the memory failed.
enum Fetch {
    /// Nobody answered this time (gone, stopped, not listening yet): why,
    /// when anyone was asked.
    Again(Option<&'static str>),
    /// Someone answered with something this participant refuses.
    Refused(Error),
}

impl SlotFile {
    /// Join the slot file `/dev/shm/<name>` (`name` without its `/`) with
    /// `seats` seats, getting the memory from a participant, or making it
    /// (`init` writes it before anyone can see it) when there is none;
    /// `check` accepts or refuses memory another participant made.
    pub(crate) fn join(
        name: &str,
        seats: usize,
        format: u64,
        init: &dyn Fn(&Mapping),
        check: &dyn Fn(&Mapping) -> Result<()>,
    ) -> Result<SlotFile> {
        let shown = format!("/{name}");
        if name.len() > MAX_NAME {
            return Err(Error::invalid(format!(
                "shared_quota_shm_path {shown:?}: longer than {MAX_NAME} bytes"
            )));
        }
        let path = tent_rings::region::shm_path(name);
        let lock = LockFd::new(open_lock_file(&path, &shown)?);
        if let Some(pid) = older_release_alive(lock.as_fd()) {
            return Err(Error::invalid(format!(
                "slot file {}: in use by an older tent release (slot format 2; its pid {pid} is \
                 alive): every process sharing a slot file must run the same release (stop them, \
                 or set another shared_quota_shm_path)",
                path.display()
            )));
        }
        let lock_err = |e: io::Error| {
            Error::invalid(format!("slot file {}: locking", path.display())).with_source(e)
        };
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut nap = Duration::from_millis(1);
        let mut last = "no participant held a seat";
        let (memfd, map, created, handed_by) = loop {
            if try_lock(lock.as_fd(), CREATOR_BYTE, Lock::Exclusive).map_err(lock_err)? {
                if !held_elsewhere(lock.as_fd(), MEMBER_BYTE).map_err(lock_err)?
                    && try_lock(lock.as_fd(), MEMBER_BYTE, Lock::Shared).map_err(lock_err)?
                {
                    // Still holding the creator lock: nobody else creates
                    // until this participant is seated and listening.
                    match make_memory(init) {
                        Ok((memfd, map)) => break (memfd, map, true, std::process::id() as i32),
                        Err(e) => {
                            unlock(lock.as_fd(), MEMBER_BYTE);
                            unlock(lock.as_fd(), CREATOR_BYTE);
                            return Err(e);
                        }
                    }
                }
                unlock(lock.as_fd(), CREATOR_BYTE);
            }
            // Members are there (or another is creating): ask them. Shared
            // locks never conflict with each other, only with a creator's
            // check, which then leaves the memory to this one's group.
            if try_lock(lock.as_fd(), MEMBER_BYTE, Lock::Shared).map_err(lock_err)? {
                match fetch_from_members(&lock, &path, seats, format, check, deadline) {
                    Ok((memfd, map, pid)) => break (memfd, map, false, pid),
                    Err(Fetch::Refused(e)) => {
                        unlock(lock.as_fd(), MEMBER_BYTE);
                        return Err(e);
                    }
                    Err(Fetch::Again(why)) => {
                        last = why.unwrap_or(last);
                        unlock(lock.as_fd(), MEMBER_BYTE)
                    }
                }
            } else {
                last = "the member lock is held exclusively (not by a tent participant)";
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "slot file {}: its participants did not hand the slot memory over within \
                         {JOIN_TIMEOUT:?} (last: {last})",
                        path.display()
                    ),
                ));
            }
            // Two joiners that each see the other's lock back off by
            // different amounts.
            let jitter = Duration::from_micros(crate::control::auth::random_u64() % 1000);
            std::thread::sleep(nap + jitter);
            nap = (nap * 2).min(Duration::from_millis(50));
        };
        let seated = seat_and_listen(lock.as_fd(), &path, seats).map_err(|e| match e {
            Seating::Full => Error::invalid(format!(
                "slot file {}: all {seats} seats are held by live processes",
                path.display()
            )),
            Seating::Io(e) => lock_err(e),
            Seating::Listen(sock, e) => {
                Error::invalid(format!("slot file {}: cannot listen", sock.display()))
                    .with_source(e)
            }
        });
        if created {
            unlock(lock.as_fd(), CREATOR_BYTE);
        }
        let (seat, sock, listener, ino) = seated?;
        Ok(SlotFile {
            path,
            listening: Mutex::new(Listening {
                sock,
                ino,
                listener,
                next_check: Instant::now() + SOCKET_CHECK,
            }),
            memfd,
            map,
            seat,
            created,
            format,
            handed_by,
            lock,
        })
    }

    /// The mapped memory ([`MEM_LEN`] bytes, page aligned).
    pub(crate) fn memory(&self) -> &Mapping {
        &self.map
    }

    /// This participant's seat.
    pub(crate) fn seat(&self) -> usize {
        self.seat
    }

    /// Did this participant make the memory (nobody was there)?
    pub(crate) fn created(&self) -> bool {
        self.created
    }

    /// Who handed the memory over (for messages).
    pub(crate) fn handed_by(&self) -> i32 {
        self.handed_by
    }

    /// The lock file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Is seat `i`, another's, vacant now? Then it is held for the caller
    /// until the guard drops, so no joiner takes it meanwhile.
    pub(crate) fn hold_vacant(&self, i: usize) -> Option<SeatHold<'_>> {
        if i == self.seat {
            return None;
        }
        let byte = SEAT_BASE + i as u64;
        match try_lock(self.lock.as_fd(), byte, Lock::Exclusive) {
            Ok(true) => Some(SeatHold {
                fd: self.lock.as_fd(),
                byte,
            }),
            _ => None,
        }
    }

    /// Hand the memory to whoever is waiting on this participant's socket
    /// (at most [`SERVE_BURST`]); never waits. Returns how many got it.
    pub(crate) fn serve(&self) -> usize {
        let Some(mut l) = self.listening.try_lock() else {
            return 0;
        };
        let now = Instant::now();
        if now >= l.next_check {
            l.next_check = now + SOCKET_CHECK;
            self.listen_again_if_gone(&mut l);
        }
        let mut served = 0;
        for _ in 0..SERVE_BURST {
            let stream = match l.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    crate::lograte::warn_limited!(("slot accept", self.path.as_path()), error = %e,
                        path = %self.path.display(), "slot file: accept failed");
                    break;
                }
            };
            match peer_uid(&stream) {
                Ok((uid, _)) if uid == euid() => {}
                Ok((uid, pid)) => {
                    crate::lograte::warn_limited!(("slot uid", self.path.as_path()), uid, pid,
                        path = %self.path.display(), "slot file: refused a process of another uid");
                    continue;
                }
                Err(_) => continue,
            }
            // 16 bytes into a fresh socket's empty buffer: never blocks,
            // and a peer that went away costs nothing.
            let _ = stream.set_nonblocking(true);
            let mut frame = [0u8; FRAME_LEN];
            frame[..8].copy_from_slice(&FRAME_TAG);
            frame[8..].copy_from_slice(&self.format.to_le_bytes());
            if send_with_fd(&stream, &frame, self.memfd.as_fd()).is_ok() {
                served += 1;
            }
        }
        served
    }

    /// A socket removed by someone else (a cleanup script) would leave
    /// this participant a member nobody can ask: listen again under the
    /// seat's name. The seat's lock is ours, so the name is too.
    fn listen_again_if_gone(&self, l: &mut Listening) {
        if std::fs::symlink_metadata(&l.sock).is_ok_and(|m| m.ino() == l.ino) {
            return;
        }
        match listen(&l.sock) {
            Ok((listener, ino)) => {
                tracing::info!(path = %l.sock.display(), "slot file: the seat's socket was removed; listening again");
                l.listener = listener;
                l.ino = ino;
            }
            Err(e) => {
                crate::lograte::warn_limited!(("slot relisten", self.path.as_path()), error = %e,
                    path = %l.sock.display(), "slot file: the seat's socket was removed and cannot be made again");
            }
        }
    }
}

/// A participant's listening socket at its seat's name.
#[derive(Debug)]
struct Listening {
    sock: PathBuf,
    /// The socket file's inode: only ours is ever unlinked.
    ino: u64,
    listener: UnixListener,
    /// When the keeper next checks that the name is still this socket.
    next_check: Instant,
}

impl Drop for SlotFile {
    fn drop(&mut self) {
        // Unlink only our own socket (a successor in this seat renames its
        // own over the name), then `lock` closes last: every lock goes.
        let l = self.listening.get_mut();
        if std::fs::symlink_metadata(&l.sock).is_ok_and(|m| m.ino() == l.ino) {
            let _ = std::fs::remove_file(&l.sock);
        }
    }
}

/// A vacant seat held by the sweeping participant.
#[derive(Debug)]
pub(crate) struct SeatHold<'a> {
    fd: BorrowedFd<'a>,
    byte: u64,
}

impl Drop for SeatHold<'_> {
    fn drop(&mut self) {
        unlock(self.fd, self.byte);
    }
}

/// The socket of seat `i`: `<lock file>.s<i>`.
fn sock_path(path: &Path, i: usize) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".s{i}"));
    PathBuf::from(p)
}

/// Why no seat could be taken.
enum Seating {
    Full,
    Io(io::Error),
    /// The last seat tried could not listen at its name.
    Listen(PathBuf, io::Error),
}

/// Take the first seat no live process holds whose name this participant
/// can listen at (a name squatted by a file of another user, or a
/// directory, leaves its seat to nobody and moves on): the seat, its
/// socket path, the listener and the socket's inode.
fn seat_and_listen(
    fd: BorrowedFd<'_>,
    path: &Path,
    seats: usize,
) -> std::result::Result<(usize, PathBuf, UnixListener, u64), Seating> {
    let mut failed = None;
    for i in 0..seats {
        let byte = SEAT_BASE + i as u64;
        if !try_lock(fd, byte, Lock::Exclusive).map_err(Seating::Io)? {
            continue;
        }
        let sock = sock_path(path, i);
        match listen(&sock) {
            Ok((listener, ino)) => return Ok((i, sock, listener, ino)),
            Err(e) => {
                unlock(fd, byte);
                failed = Some((sock, e));
            }
        }
    }
    Err(failed.map_or(Seating::Full, |(s, e)| Seating::Listen(s, e)))
}

/// Does a slot file of an older release (format 2: a mapped region whose
/// seats name pids) have a live participant? Read with `pread`, never
/// mapped. A pid is only a hint here (it may have been reused): it is what
/// that release judged liveness by, and a false positive only asks the
/// user to remove a stale file.
fn older_release_alive(fd: BorrowedFd<'_>) -> Option<u32> {
    const PAYLOAD: usize = tent_rings::region::HEADER_LEN;
    let mut buf = vec![0u8; PAYLOAD + 64 * 65];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
    };
    if n < PAYLOAD + 64 || word(0)? != tent_rings::region::REGION_MAGIC || word(32)? != 2 {
        return None;
    }
    let pid_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?))
    };
    let used = (pid_at(PAYLOAD + 20)? as usize).min(64);
    let seat_pids = (0..used).filter_map(|i| word(PAYLOAD + 64 + 64 * i).map(|w| (w >> 32) as u32));
    // The creator's pid in the header, the owner's, then the seats'.
    [pid_at(64)?, pid_at(PAYLOAD + 16)?]
        .into_iter()
        .chain(seat_pids)
        .find(|&pid| pid_alive(pid))
}

/// Is `pid` a live process (`kill(pid, 0)`; `EPERM` is alive too)?
fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    matches!(
        rustix::process::test_kill_process(pid),
        Ok(()) | Err(rustix::io::Errno::PERM)
    )
}

/// A fresh sealed memfd of [`MEM_LEN`] bytes, mapped and written by `init`.
fn make_memory(init: &dyn Fn(&Mapping)) -> Result<(OwnedFd, Mapping)> {
    let fd = crate::memfd::sealed_memfd("tent-slots", MEM_LEN as u64)
        .map_err(|e| Error::new(ErrorKind::OutOfMemory, "slot memory").with_source(e))?;
    let map = Mapping::map(fd.as_fd(), MEM_LEN, true).map_err(|e| {
        Error::new(ErrorKind::OutOfMemory, "mapping the slot memory").with_source(e)
    })?;
    init(&map);
    Ok((fd, map))
}

/// Listen at `sock` (bound under a temporary name, made 0600, then
/// renamed over whatever a dead holder of the seat left there): the
/// listener, non-blocking, and the socket file's inode.
fn listen(sock: &Path) -> io::Result<(UnixListener, u64)> {
    let dir = sock.parent().unwrap_or(Path::new("/dev/shm"));
    let tmp = dir.join(format!(
        "{}{:016x}",
        crate::memfd::TMP_PREFIX,
        crate::control::auth::random_u64()
    ));
    let listener = UnixListener::bind(&tmp)?;
    let placed = (|| {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        let ino = std::fs::symlink_metadata(&tmp)?.ino();
        std::fs::rename(&tmp, sock)?;
        listener.set_nonblocking(true)?;
        Ok(ino)
    })();
    match placed {
        Ok(ino) => Ok((listener, ino)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Ask the participants of the held seats for the memory, one after
/// another, until one hands it over.
fn fetch_from_members(
    lock: &LockFd,
    path: &Path,
    seats: usize,
    format: u64,
    check: &dyn Fn(&Mapping) -> Result<()>,
    deadline: Instant,
) -> std::result::Result<(OwnedFd, Mapping, i32), Fetch> {
    let mut last = None;
    for i in 0..seats {
        if Instant::now() >= deadline {
            break;
        }
        if !held_elsewhere(lock.as_fd(), SEAT_BASE + i as u64).unwrap_or(false) {
            continue;
        }
        match fetch(
            &sock_path(path, i),
            format,
            check,
            deadline.min(Instant::now() + ATTEMPT),
        ) {
            Ok(got) => return Ok(got),
            Err(Fetch::Again(why)) => last = why.or(last),
            Err(refused) => return Err(refused),
        }
    }
    Err(Fetch::Again(last))
}

/// Get the memory from the participant listening at `sock`.
fn fetch(
    sock: &Path,
    want: u64,
    check: &dyn Fn(&Mapping) -> Result<()>,
    deadline: Instant,
) -> std::result::Result<(OwnedFd, Mapping, i32), Fetch> {
    let refused = |why: String| {
        Fetch::Refused(Error::invalid(format!(
            "slot file socket {}: {why}",
            sock.display()
        )))
    };
    let Ok((file, st)) = open_socket_file(sock) else {
        return Err(Fetch::Again(Some("no socket at a held seat")));
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket || st.st_uid != euid() {
        // Not a participant's (yet): a seat just taken, or junk a dead
        // holder's successor will rename over.
        return Err(Fetch::Again(Some(
            "a held seat's socket is not a participant's",
        )));
    }
    let Ok(stream) = connect_file(file.as_fd(), deadline) else {
        return Err(Fetch::Again(Some("connect refused or timed out")));
    };
    let (uid, pid) = peer_uid(&stream).map_err(|_| Fetch::Again(Some("SO_PEERCRED")))?;
    if uid != euid() {
        return Err(refused(format!("served by uid {uid}, not ours")));
    }
    let mut frame = [0u8; FRAME_LEN];
    let got = recv_frame(&stream, &mut frame, deadline)
        .map_err(|_| Fetch::Again(Some("no answer in time")))?;
    let Some(fd) = got.fd else {
        return Err(Fetch::Again(Some("an answer without the memfd")));
    };
    if frame[..8] != FRAME_TAG {
        return Err(refused("not a tent slot file participant".into()));
    }
    let format = u64::from_le_bytes(frame[8..].try_into().expect("8 bytes"));
    if format != want {
        return Err(refused(format!(
            "its participants use slot format {format}, this tent {}: every process sharing a \
             slot file must run the same release",
            want
        )));
    }
    let (size, seals) = size_and_seals(fd.as_fd()).map_err(|e| refused(e.to_string()))?;
    let need = (SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).bits() as i32;
    if seals & need != need {
        return Err(refused("handed a memfd not sealed against resizing".into()));
    }
    if size != MEM_LEN as u64 {
        return Err(refused(format!(
            "handed a memfd of {size} bytes, not {MEM_LEN}"
        )));
    }
    let map = Mapping::map(fd.as_fd(), MEM_LEN, true).map_err(|e| {
        Fetch::Refused(
            match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => Error::invalid(format!(
                    "slot file socket {}: handed a memfd that cannot be mapped writable \
                 (write-sealed or read-only)",
                    sock.display()
                )),
                _ => Error::new(ErrorKind::OutOfMemory, "mapping the slot memory"),
            }
            .with_source(e),
        )
    })?;
    check(&map).map_err(Fetch::Refused)?;
    Ok((fd, map, pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_file(tag: &str) -> (PathBuf, OwnedFd, OwnedFd) {
        let path = std::env::temp_dir().join(format!("tent-ofd-{tag}-{}", std::process::id()));
        let open = || {
            rfs::open(
                &path,
                OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .unwrap()
        };
        let (a, b) = (open(), open());
        (path, a, b)
    }

    #[test]
    #[cfg_attr(miri, ignore = "fcntl")]
    fn locks_are_per_open_file_description_and_shared_ones_coexist() {
        let (path, a, b) = lock_file("kinds");
        assert!(try_lock(a.as_fd(), 5, Lock::Exclusive).unwrap());
        assert!(
            !try_lock(b.as_fd(), 5, Lock::Exclusive).unwrap(),
            "a second description is refused"
        );
        assert!(held_elsewhere(b.as_fd(), 5).unwrap());
        assert!(
            !held_elsewhere(a.as_fd(), 5).unwrap(),
            "its own lock is not another's"
        );
        assert!(
            try_lock(a.as_fd(), 5, Lock::Exclusive).unwrap(),
            "taking it again is fine"
        );
        unlock(a.as_fd(), 5);
        assert!(!held_elsewhere(b.as_fd(), 5).unwrap());
        assert!(try_lock(a.as_fd(), 1, Lock::Shared).unwrap());
        assert!(
            try_lock(b.as_fd(), 1, Lock::Shared).unwrap(),
            "shared locks coexist"
        );
        assert!(
            held_elsewhere(a.as_fd(), 1).unwrap(),
            "and a creator's check sees the other"
        );
        drop(b);
        assert!(
            !held_elsewhere(a.as_fd(), 1).unwrap(),
            "closing drops the locks"
        );
        let _ = std::fs::remove_file(path);
    }

    /// A same-uid process posing as a participant (member and seat 0
    /// locks held, listening at seat 0's socket) hands over `fd` with
    /// `format`; what a joiner makes of it.
    /// The format these tests' joiner wants.
    const FORMAT: u64 = 3;

    fn join_against(tag: &str, fd: OwnedFd, format: u64) -> Result<SlotFile> {
        let name = format!("tent-slot-file-unit-{tag}-{}", std::process::id());
        let path = tent_rings::region::shm_path(&name);
        let lock = open_lock_file(&path, &name).unwrap();
        assert!(try_lock(lock.as_fd(), MEMBER_BYTE, Lock::Shared).unwrap());
        assert!(try_lock(lock.as_fd(), SEAT_BASE, Lock::Exclusive).unwrap());
        let sock = sock_path(&path, 0);
        let (listener, _) = listen(&sock).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        let r = std::thread::scope(|scope| {
            scope.spawn(|| {
                // Answer every attempt the joiner makes until it is done.
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    let Ok((s, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let mut frame = [0u8; FRAME_LEN];
                    frame[..8].copy_from_slice(&FRAME_TAG);
                    frame[8..].copy_from_slice(&format.to_le_bytes());
                    let _ = send_with_fd(&s, &frame, fd.as_fd());
                }
            });
            let r = SlotFile::join(&name, 4, FORMAT, &|_| {}, &|_| Ok(()));
            done.store(true, std::sync::atomic::Ordering::Release);
            r
        });
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(&path);
        drop(lock);
        r
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, sockets")]
    fn memory_a_participant_could_resize_or_of_another_format_is_refused_typed() {
        let unsealed = crate::memfd::memfd("t", MEM_LEN as u64).unwrap();
        let e = join_against("unsealed", unsealed, FORMAT).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("not sealed against resizing"), "{e}");
        let short = crate::memfd::sealed_memfd("t", 4096).unwrap();
        let e = join_against("short", short, FORMAT).unwrap_err();
        assert!(e.to_string().contains("of 4096 bytes"), "{e}");
        let sealed = crate::memfd::sealed_memfd("t", MEM_LEN as u64).unwrap();
        let e = join_against("format", sealed, 2).unwrap_err();
        assert!(e.to_string().contains("slot format 2"), "{e}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "fcntl")]
    fn a_socket_name_is_the_lock_file_and_the_seat() {
        assert_eq!(
            sock_path(Path::new("/dev/shm/x"), 7),
            PathBuf::from("/dev/shm/x.s7")
        );
    }
}
