//! Sealed memfds, their mappings, and how a descriptor travels between
//! processes over a unix-domain socket: what the shm transport's handout
//! and the QoS slot file share.
//!
//! A memfd sealed against shrinking and growing cannot be truncated under
//! a mapping, so a process that maps one handed to it by another cannot be
//! killed with `SIGBUS`; [`size_and_seals`] is what the receiver checks
//! before it maps. A socket file is opened `O_PATH|O_NOFOLLOW`, checked,
//! and connected to through that descriptor ([`connect_file`]), so what
//! was checked is what is reached; [`peer_uid`] reads who is at the other
//! end.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use memmap2::{MmapOptions, MmapRaw};
use rustix::event::PollFlags;
use rustix::fs::{self as rfs, FileType, MemfdFlags, Mode, OFlags, SealFlags};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::deadline::{ByDeadline, timed_out, wait_for};

/// `statfs.f_type` of shmem (tmpfs) files: what memfds are.
/// Prefix of a socket bound under a temporary name before it is renamed
/// to the name it serves at (a leftover of a crash is collected by it).
pub(crate) const TMP_PREFIX: &str = ".tent-tmp-";

pub(crate) const TMPFS_MAGIC: i64 = 0x0102_1994;

pub(crate) fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

// ---- memfds and mappings ------------------------------------------------

/// A `memfd_create` file of `size` bytes, zeroed, that may still be sealed.
pub(crate) fn memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    if i64::try_from(size).is_err() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let fd = rfs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rfs::ftruncate(&fd, size)?;
    Ok(fd)
}

/// A `memfd_create` file of `size` bytes, zeroed, sealed against shrinking,
/// growing and further sealing (a region: peers map it writable).
pub(crate) fn sealed_memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    let fd = memfd(name, size)?;
    rfs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// Size and seals of a handed-out file (seals 0 when it cannot carry any);
/// an error for anything but a regular shmem (tmpfs) file: a hugetlbfs
/// memfd, say, could SIGBUS on a hole.
///
/// The seals are read first: the sender keeps its own descriptor, and a
/// size read before a seal could be one it cut the file from just after.
/// Once `F_SEAL_SHRINK` and `F_SEAL_GROW` are seen, the size read next is
/// the file's for good.
pub(crate) fn size_and_seals(fd: BorrowedFd<'_>) -> io::Result<(u64, i32)> {
    // EINVAL for files without seals: none.
    let seals = rfs::fcntl_get_seals(fd).map_or(0, |s| s.bits() as i32);
    let st = rfs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file (a pipe, a socket?)",
        ));
    }
    let sf = rfs::fstatfs(fd)?;
    #[allow(clippy::unnecessary_cast)]
    let fs = sf.f_type as i64;
    if fs != TMPFS_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a shmem memfd (file system type {fs:#x})"),
        ));
    }
    Ok((u64::try_from(st.st_size).unwrap_or(0), seals))
}

/// A shared mapping of a memfd; unmapped on drop. Every access goes through
/// raw pointers whose users synchronise (atomics or checked copies).
#[derive(Debug)]
pub(crate) struct Mapping(MmapRaw);

impl Mapping {
    /// Map `len` bytes of `fd` shared (read-only unless `writable`); the
    /// caller checked that the (sealed) file holds `len` (> 0) bytes.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
        let mut opts = MmapOptions::new();
        opts.len(len);
        let map = if writable {
            opts.map_raw(&fd)?
        } else {
            opts.map_raw_read_only(&fd)?
        };
        Ok(Mapping(map))
    }

    /// Start of the mapping (page aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// Its length.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

// ---- SCM_RIGHTS ---------------------------------------------------------

/// Send `bytes` with one descriptor. Errors are the kernel's: see
/// the shm handout's `recoverable_send`.
pub(crate) fn send_with_fd(s: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for one descriptor"));
    }
    let mut at = net::sendmsg(s, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL)?;
    // The rest without SIGPIPE either: a C or Python host keeps the
    // default handler, which would end it when the peer is gone.
    while at < bytes.len() {
        match net::send(s, &bytes[at..], SendFlags::NOSIGNAL) {
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// One received frame.
#[derive(Debug)]
pub(crate) struct Received {
    /// The first descriptor that came with it (any others are closed).
    pub(crate) fd: Option<OwnedFd>,
    /// The kernel dropped descriptors (`MSG_CTRUNC`: our descriptor limit,
    /// or more than fit): whatever did arrive is closed, the frame is
    /// whole, and the caller treats it as a transient failure.
    pub(crate) truncated: bool,
}

/// Why [`recv_frame`] failed: `partial` when some of the frame's bytes were
/// consumed (the stream is out of step from here).
#[derive(Debug)]
pub(crate) struct RecvError {
    pub(crate) err: io::Error,
    pub(crate) partial: bool,
}

/// Room for the control messages of one received frame: 128 bytes, aligned
/// for `cmsghdr`, so up to 28 descriptors (a frame carries one; the others
/// are closed) before the kernel truncates (`MSG_CTRUNC`).
#[repr(C, align(8))]
struct CmsgSpace([MaybeUninit<u8>; CMSG_BYTES]);
const CMSG_BYTES: usize = 128;

/// Read exactly `buf.len()` bytes by `deadline`; the first read may carry
/// descriptors.
pub(crate) fn recv_frame(
    s: &UnixStream,
    buf: &mut [u8],
    deadline: Instant,
) -> std::result::Result<Received, RecvError> {
    let whole = |err| RecvError {
        err,
        partial: false,
    };
    let mut space = CmsgSpace([MaybeUninit::uninit(); CMSG_BYTES]);
    let mut control = RecvAncillaryBuffer::new(&mut space.0);
    let (n, flags) = loop {
        wait_for(s.as_fd(), PollFlags::IN, deadline).map_err(whole)?;
        match net::recvmsg(
            s,
            &mut [IoSliceMut::new(&mut *buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        ) {
            Ok(got) => break (got.bytes, got.flags),
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(e) => return Err(whole(e.into())),
        }
    };
    // Each SCM_RIGHTS payload is descriptors now installed in this process:
    // the first is kept, every other one is closed as it is dropped.
    let mut first = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for fd in fds {
                if first.is_none() {
                    first = Some(fd);
                }
            }
        }
    }
    let truncated = flags.contains(ReturnFlags::CTRUNC);
    if truncated {
        first = None;
    }
    if n == 0 && !buf.is_empty() {
        return Err(whole(io::ErrorKind::UnexpectedEof.into()));
    }
    ByDeadline::new(s, deadline)
        .read_exact(&mut buf[n..])
        .map_err(|err| RecvError { err, partial: true })?;
    Ok(Received {
        fd: first,
        truncated,
    })
}

/// The peer's uid and pid (`SO_PEERCRED`). By hand, not with rustix's
/// `socket_peercred`: its `UCred::pid` is a non-zero `Pid`, but the kernel
/// reports pid 0 for a peer in a pid namespace this process cannot see
/// into (a peer in another container sharing the socket directory), and
/// reading that 0 into a `NonZeroI32` is undefined behaviour.
pub(crate) fn peer_uid(s: &UnixStream) -> io::Result<(u32, i32)> {
    peer_cred(s).map(|c| (c.uid, c.pid))
}

/// The peer's `SO_PEERCRED` (see [`peer_uid`] on why by hand).
fn peer_cred(s: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into a ucred we own.
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
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// The peer's groups: its primary gid (`SO_PEERCRED`) and its
/// supplementary groups (`SO_PEERGROUPS`, as they were when it connected).
pub(crate) fn peer_groups(s: &UnixStream) -> io::Result<Vec<u32>> {
    let cred = peer_cred(s)?;
    // As many as the kernel says it has (ERANGE tells the length needed).
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    let n = loop {
        let mut len = (groups.len() * size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: SO_PEERGROUPS writes at most `len` bytes into the vector we own, and says in `len` how many it wrote or would need.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let want = len as usize / size_of::<libc::gid_t>();
        if rc == 0 {
            break want.min(groups.len());
        }
        let e = io::Error::last_os_error();
        // NGROUPS_MAX is 65536: a larger answer is not the kernel's.
        if e.raw_os_error() == Some(libc::ERANGE) && want > groups.len() && want <= 1 << 16 {
            groups.resize(want, 0);
            continue;
        }
        return Err(e);
    };
    let mut out = Vec::with_capacity(n + 1);
    out.push(cred.gid);
    out.extend_from_slice(&groups[..n]);
    Ok(out)
}

/// Open the socket file at `path` without following a symlink and say what
/// it is: the `O_PATH` descriptor and its `stat`.
pub(crate) fn open_socket_file(path: &Path) -> io::Result<(OwnedFd, rfs::Stat)> {
    let fd = rfs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rfs::fstat(&fd)?;
    Ok((fd, st))
}

/// A fresh unix stream socket (close-on-exec, plus `flags`).
pub(crate) fn unix_socket(flags: SocketFlags) -> io::Result<OwnedFd> {
    Ok(net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | flags,
        None,
    )?)
}

/// Connect to the socket file `file` refers to (through `/proc/self/fd`,
/// so exactly the file that was checked), giving up at `deadline`: the
/// kernel's wait for room in a full backlog is bounded by `SO_SNDTIMEO`.
pub(crate) fn connect_file(file: BorrowedFd<'_>, deadline: Instant) -> io::Result<UnixStream> {
    let stream = UnixStream::from(unix_socket(SocketFlags::empty())?);
    let addr = SocketAddrUnix::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        stream.set_write_timeout(Some(left))?;
        match net::connect(&stream, &addr) {
            Ok(()) => {
                stream.set_write_timeout(None)?;
                return Ok(stream);
            }
            Err(Errno::INTR) => continue,
            // The backlog stayed full until SO_SNDTIMEO ran out.
            Err(Errno::AGAIN | Errno::INPROGRESS) => return Err(timed_out()),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A sender keeps its own descriptor of the memfd it hands over: if it
    /// cuts the file to 0 bytes and seals it while the receiver looks, the
    /// receiver must never see "8192 bytes, sealed" (mapping them would
    /// SIGBUS). With the size read before the seals, this failed within a
    /// few hundred rounds.
    #[test]
    #[cfg_attr(miri, ignore = "memfd")]
    fn a_sealed_file_is_never_reported_larger_than_it_is() {
        let need = (SealFlags::SHRINK | SealFlags::GROW).bits() as i32;
        for i in 0..3_000u32 {
            let fd = Arc::new(memfd("race", 8192).unwrap());
            let state = Arc::new(AtomicU32::new(0));
            let spin = (i % 97) * 3;
            let t = std::thread::spawn({
                let (fd, state) = (fd.clone(), state.clone());
                move || {
                    state.store(1, Ordering::Release);
                    while state.load(Ordering::Acquire) != 2 {
                        std::hint::spin_loop();
                    }
                    for _ in 0..spin {
                        std::hint::spin_loop();
                    }
                    rfs::ftruncate(&*fd, 0).unwrap();
                    rfs::fcntl_add_seals(
                        &*fd,
                        SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
                    )
                    .unwrap();
                }
            });
            while state.load(Ordering::Acquire) != 1 {
                std::hint::spin_loop();
            }
            state.store(2, Ordering::Release);
            let (size, seals) = size_and_seals(fd.as_fd()).unwrap();
            t.join().unwrap();
            if seals & need == need {
                assert_eq!(
                    size, 0,
                    "round {i}: {size} bytes reported of a file sealed at 0"
                );
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "pipe")]
    fn a_pipe_is_no_memfd() {
        let (r, _w) = rustix::pipe::pipe().unwrap();
        let e = size_and_seals(r.as_fd()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
