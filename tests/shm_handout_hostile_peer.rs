//! The sealed-memfd shm handout against a hostile same-host peer: a peer
//! cannot write the owner's descriptor, deny other peers, relay without
//! the secret, stall the handout or desync it. The tests speak the handout
//! protocol raw (`TENTSHM2` hello,
//! challenge carrying the owner's proof, optional client proof, `MEMFD`
//! frames with the request id + SCM_RIGHTS).

#[path = "support/shm_owner.rs"]
mod shm_owner;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use shm_owner::*;
use tent::transport::shm::Access;
use tent::transport::shm::{ShmExport, ShmPeer};
use tent::{ErrorKind, RegionId};

fn tmpdir(tag: &str) -> String {
    let d = format!("/tmp/tent-handout-{tag}-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Receive `buf.len()` bytes, the first read possibly carrying one fd.
fn recv_fd(s: &UnixStream, buf: &mut [u8]) -> Option<OwnedFd> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: plain C data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: `msg` points at buffers that outlive the call.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
    let mut fd = None;
    // SAFETY: the control buffer is sized for one header and one fd, and the kernel filled it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_type == libc::SCM_RIGHTS {
            let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
            fd = Some(OwnedFd::from_raw_fd(raw));
        }
    }
    (&*s).read_exact(&mut buf[n as usize..]).unwrap();
    fd
}

/// A raw client of an owner without a secret: returns the stream and the
/// descriptor memfd exactly as the owner handed it out.
fn raw_client(dir: &str, name: &str) -> (UnixStream, OwnedFd) {
    let s = UnixStream::connect(format!("{dir}/{name}")).unwrap();
    let mut hello = [7u8; HELLO_LEN];
    hello[..8].copy_from_slice(MAGIC);
    (&s).write_all(&hello).unwrap();
    let mut ch = [0u8; CHALLENGE_LEN];
    (&s).read_exact(&mut ch).unwrap();
    assert_eq!(ch[8 + 32], 0, "owner wants a secret");
    let mut frame = [0u8; REPLY_LEN];
    let fd = recv_fd(&s, &mut frame).expect("descriptor memfd");
    assert_eq!(&frame[..8], b"MEMFD\0\0\0");
    (s, fd)
}

fn try_pwrite_u64(fd: &OwnedFd, off: i64, v: u64) -> std::io::Result<()> {
    let b = v.to_le_bytes();
    // SAFETY: the buffer holds the bytes the call names.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), 8, off) };
    if n == 8 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Every way a peer holding the descriptor could write it fails: write(),
/// a writable shared mapping, upgrading a read-only mapping, and both again
/// on a read-write reopen through /proc.
fn assert_descriptor_unwritable(desc: &OwnedFd) {
    // SAFETY: a syscall on an fd or process we own.
    let fl = unsafe { libc::fcntl(desc.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: a syscall on an fd or process we own.
    let seals = unsafe { libc::fcntl(desc.as_raw_fd(), libc::F_GET_SEALS) };
    eprintln!(
        "descriptor fd handed to peer: O_RDONLY={} seals={seals:#x}",
        fl & libc::O_ACCMODE == libc::O_RDONLY
    );
    assert_eq!(
        fl & libc::O_ACCMODE,
        libc::O_RDONLY,
        "read-only file description"
    );
    assert_ne!(seals & libc::F_SEAL_FUTURE_WRITE, 0, "write-sealed");
    assert!(try_pwrite_u64(desc, 0, u64::MAX).is_err());
    let reopened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/fd/{}", desc.as_raw_fd()));
    let rw = [Some(desc), reopened.as_ref().ok().map(|f| f.as_fd_ref())];
    for fd in rw.into_iter().flatten() {
        assert!(try_pwrite_u64(fd, 0, 1).is_err(), "write() refused");
        // SAFETY: a new mapping of an fd we hold; it aliases nothing of ours.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_eq!(p, libc::MAP_FAILED, "writable shared mapping refused");
        // SAFETY: a new mapping of an fd we hold; it aliases nothing of ours.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: a mapping made here, of the length given, used by nothing else.
        let rc = unsafe { libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_WRITE) };
        assert_ne!(rc, 0, "a read-only mapping cannot be made writable");
        // SAFETY: a mapping made here, of the length given, used by nothing else.
        unsafe { libc::munmap(p, 4096) };
    }
}

trait AsFdRef {
    fn as_fd_ref(&self) -> &OwnedFd;
}
impl AsFdRef for std::fs::File {
    fn as_fd_ref(&self) -> &OwnedFd {
        // SAFETY: File and OwnedFd are both a single owned descriptor
        // (File is a transparent wrapper around OwnedFd on unix).
        unsafe { &*(self as *const std::fs::File).cast::<OwnedFd>() }
    }
}

// ---- 1. the descriptor memfd is handed out writable: fixed -----------------

/// A peer that passed the handshake gets a read-only, write-sealed
/// descriptor: it cannot write the sequence word (which used to overflow
/// the owner's `seq + 1` and poison its locks), and the owner keeps
/// publishing and revoking (its sequence lives in its own memory).
#[test]
fn peer_cannot_write_owner_descriptor_and_owner_keeps_publishing() {
    let dir = tmpdir("descw");
    let export = ShmExport::create(&dir, None).unwrap();
    let mem = export.allocate(4096, true).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    let (_s, desc) = raw_client(&dir, export.name());
    assert_descriptor_unwritable(&desc);
    let mem2 = export.allocate(4096, true).unwrap();
    export.publish(&mem2, RegionId(2), 4096, 43).unwrap();
    export.revoke(RegionId(1));
    let peer = ShmPeer::attach(&dir, export.name(), None).unwrap();
    let ids: Vec<_> = peer.regions().iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![RegionId(2)]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The peer cannot make the sequence odd ("writer active"), so it cannot
/// deny every other peer either.
#[test]
fn peer_cannot_make_seq_odd_and_deny_other_peers() {
    let dir = tmpdir("descodd");
    let export = ShmExport::create(&dir, None).unwrap();
    let mem = export.allocate(4096, true).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    assert!(ShmPeer::attach(&dir, export.name(), None).is_ok());
    let (_s, desc) = raw_client(&dir, export.name());
    assert!(try_pwrite_u64(&desc, 0, 1).is_err());
    let mem2 = export.allocate(4096, true).unwrap();
    export.publish(&mem2, RegionId(2), 4096, 43).unwrap();
    let peer = ShmPeer::attach(&dir, export.name(), None).expect("legit attach");
    assert_eq!(peer.regions().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 2. relay of the HMAC handshake: fixed ---------------------------------

/// Relay everything between `a` and `b`, passing descriptors on and keeping
/// a copy of each, until one side hangs up or `for_` passes.
fn relay(a: &UnixStream, b: &UnixStream, for_: Duration) -> Vec<OwnedFd> {
    let mut kept = Vec::new();
    let end = Instant::now() + for_;
    while Instant::now() < end {
        let mut p = [
            libc::pollfd {
                fd: a.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: b.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `p` is a live array of the length given.
        if unsafe { libc::poll(p.as_mut_ptr(), 2, 50) } <= 0 {
            continue;
        }
        for (i, (from, to)) in [(a, b), (b, a)].into_iter().enumerate() {
            if p[i].revents == 0 {
                continue;
            }
            let mut buf = [0u8; 256];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let mut cbuf = [0u64; 16];
            // SAFETY: plain C data; all zeroes is a valid value.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            // SAFETY: `msg` points at buffers that outlive the call.
            let n = unsafe { libc::recvmsg(from.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n <= 0 {
                return kept;
            }
            // SAFETY: the control buffer is sized for one header and one fd, and the kernel filled it.
            let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
            // SAFETY: the control buffer is sized for one header and one fd, and the kernel filled it.
            if !c.is_null() && unsafe { (*c).cmsg_type } == libc::SCM_RIGHTS {
                // SAFETY: the control buffer is sized for one header and one fd, and the kernel filled it.
                let raw = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>()) };
                send_fd(to, &buf[..n as usize], raw);
                // SAFETY: a fresh fd that nothing else owns.
                kept.push(unsafe { OwnedFd::from_raw_fd(raw) });
            } else if (&*to).write_all(&buf[..n as usize]).is_err() {
                return kept;
            }
        }
    }
    kept
}

/// A same-uid process WITHOUT the secret moves the owner's socket aside,
/// listens under its name, and relays a legitimate peer's handshake to the
/// real owner byte for byte (descriptors too). The proofs bind the socket
/// file the peer connected through, and the owner proves itself first: the
/// victim refuses the relayed proof (AccessDenied) before sending its own,
/// and the relay obtains no memfd.
#[test]
fn secretless_relay_obtains_nothing() {
    let dir = tmpdir("relay");
    let secret = b"0123456789abcdef-shm".to_vec();
    let export = ShmExport::create(&dir, Some(secret.clone())).unwrap();
    let mem = export.allocate(4096, true).unwrap();
    // SAFETY: the range lies inside memory this test owns.
    unsafe { std::ptr::copy_nonoverlapping(b"TOP-SECRET".as_ptr(), mem.data_ptr(), 10) };
    export.publish(&mem, RegionId(1), 4096, 0x5ec2e7).unwrap();
    let name = export.name().to_owned();
    let real = format!("{dir}/{name}");
    let hidden = format!("{dir}/moved-aside");
    std::fs::rename(&real, &hidden).unwrap();
    let listener = UnixListener::bind(&real).unwrap();
    let attacker = std::thread::spawn(move || {
        let (v, _) = listener.accept().unwrap();
        let o = UnixStream::connect(&hidden).unwrap();
        relay(&v, &o, Duration::from_secs(4))
    });
    let r = ShmPeer::attach(&dir, &name, Some(&secret));
    let kept = attacker.join().unwrap();
    let err = r.expect_err("the victim must not attach through the relay");
    eprintln!(
        "victim through the relay: {:?}: {err}; memfds the relay kept: {}",
        err.kind(),
        kept.len()
    );
    assert_eq!(err.kind(), ErrorKind::AccessDenied);
    assert!(kept.is_empty(), "the relay obtained {} memfds", kept.len());
    // The real owner, reached directly, still serves the victim.
    std::fs::remove_file(&real).unwrap();
    std::fs::rename(format!("{dir}/moved-aside"), &real).unwrap();
    let victim = ShmPeer::attach(&dir, &name, Some(&secret)).expect("direct attach");
    assert_eq!(victim.regions().len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 3. connect() without a timeout: fixed ---------------------------------

/// A same-uid squatter listening with a full backlog (never accepting) no
/// longer blocks `ShmPeer::attach` forever: the connect is bounded by the
/// handshake deadline (2 s) and fails `Timeout`.
#[test]
fn attach_on_a_full_backlog_fails_typed_within_the_timeout() {
    let dir = tmpdir("backlog");
    let name = "tent-s-hangs";
    let path = format!("{dir}/{name}");
    // SAFETY: plain C data; all zeroes is a valid value.
    let l = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    // SAFETY: plain C data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as _;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as _;
    }
    let alen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    assert_eq!(
        // SAFETY: plain socket calls; the address outlives the call.
        unsafe { libc::bind(l, (&addr as *const libc::sockaddr_un).cast(), alen) },
        0
    );
    // SAFETY: plain socket calls; the address outlives the call.
    assert_eq!(unsafe { libc::listen(l, 0) }, 0);
    // Fill the backlog with non-blocking connects.
    let mut fillers = Vec::new();
    loop {
        // SAFETY: plain socket calls; the address outlives the call.
        let c = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
        // SAFETY: plain socket calls; the address outlives the call.
        let rc = unsafe { libc::connect(c, (&addr as *const libc::sockaddr_un).cast(), alen) };
        fillers.push(c);
        if rc != 0 {
            break;
        }
    }
    let d2 = dir.clone();
    let t0 = Instant::now();
    let h = std::thread::spawn(move || {
        let r = ShmPeer::attach(&d2, name, None).map(|_| ());
        (t0.elapsed(), r.map_err(|e| e.kind()))
    });
    std::thread::sleep(Duration::from_secs(4));
    let finished = h.is_finished();
    // Release it should it still be blocked: closing the listener wakes it.
    // SAFETY: a syscall on an fd or process we own.
    unsafe { libc::close(l) };
    let (took, r) = h.join().unwrap();
    eprintln!("attach on a full backlog returned after {took:?}: {r:?}");
    for c in fillers {
        // SAFETY: a syscall on an fd or process we own.
        unsafe { libc::close(c) };
    }
    assert!(finished, "attach must not block past its 2 s deadline");
    assert_eq!(r, Err(ErrorKind::Timeout));
    assert!(took < Duration::from_millis(3500), "{took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 4. unauthenticated peers hold all 256 serving slots: fixed ------------

fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

/// With a shared secret set, a same-uid process that does not know it opens
/// 256 connections and dribbles one byte at a time. The owner holds at most
/// 32 connections in their handshake (the oldest closed for a new one),
/// gives each one deadline for the whole handshake, and counts serving
/// slots only after authentication: every legitimate attach succeeds.
#[test]
fn unauthenticated_slowloris_does_not_deny_legit_peers() {
    let dir = tmpdir("slots");
    let secret = b"0123456789abcdef-shm".to_vec();
    let export = ShmExport::create(&dir, Some(secret.clone())).unwrap();
    let mem = export.allocate(4096, true).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    let path = format!("{dir}/{}", export.name());
    assert!(ShmPeer::attach(&dir, export.name(), Some(&secret)).is_ok());
    let idle: Vec<UnixStream> = (0..256)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let handshaking = threads_named("tent-shm-peer");
    eprintln!("owner threads serving handshakes with 256 idle connections: {handshaking}");
    assert!(
        handshaking <= 32 + 8,
        "{handshaking} handshakes held at once"
    );
    let start = Instant::now();
    let mut denied = 0;
    let mut tries = 0;
    while start.elapsed() < Duration::from_secs(5) {
        for s in &idle {
            let _ = (&*s).write_all(b"T"); // one byte of hello
        }
        std::thread::sleep(Duration::from_millis(250));
        tries += 1;
        if let Err(e) = ShmPeer::attach(&dir, export.name(), Some(&secret)) {
            denied += 1;
            eprintln!("legit attach while slots are held: {:?}: {e}", e.kind());
        }
    }
    eprintln!(
        "legit attaches denied: {denied}/{tries} over {:?}",
        start.elapsed()
    );
    assert_eq!(denied, 0);
    drop(idle);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 5. prefault of an owner-declared length: fixed ------------------------

fn rss_shmem_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("RssShmem:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

fn sealed_memfd(size: u64, key: u64) -> OwnedFd {
    let fd = memfd(size);
    if key != 0 {
        try_pwrite_u64(&fd, 0, key).unwrap();
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(
        // SAFETY: a syscall on an fd or process we own.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) },
        0
    );
    fd
}

/// A fake owner without a secret serving one peer on `<dir>/<name>`: the
/// descriptor, then region `h` → `regions[h - 1]`, answering the request
/// for handle `slow` once after `delay`.
fn fake_owner(
    dir: &str,
    name: &str,
    desc: RawFd,
    regions: Vec<RawFd>,
    slow: u64,
    delay: Duration,
) -> std::thread::JoinHandle<()> {
    let listener = UnixListener::bind(format!("{dir}/{name}")).unwrap();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut hello = [0u8; HELLO_LEN];
        (&s).read_exact(&mut hello).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        ch[..8].copy_from_slice(MAGIC);
        (&s).write_all(&ch).unwrap();
        send_fd(&s, b"MEMFD\0\0\0\0\0\0\0\0\0\0\0", desc);
        let mut slow_once = true;
        let mut req = [0u8; REQUEST_LEN];
        while (&s).read_exact(&mut req).is_ok() {
            let h = u64::from_le_bytes(req[8..16].try_into().unwrap());
            if h == slow && slow_once {
                slow_once = false;
                std::thread::sleep(delay);
            }
            let mut reply = [0u8; REPLY_LEN];
            reply[..8].copy_from_slice(b"MEMFD\0\0\0");
            reply[8..].copy_from_slice(&req[16..]);
            send_fd(&s, &reply, regions[h as usize - 1]);
        }
    })
}

/// An owner declares (and hands out) a 256 MiB region it never touched:
/// the peer pre-faults only what the owner populated (SEEK_DATA extents),
/// so its RssShmem barely moves. A real owner populates its regions at
/// allocation, so on the normal path a peer's pages are still pre-faulted.
#[test]
fn attach_prefaults_only_what_the_owner_populated() {
    let dir = tmpdir("prefault");
    let name = "tent-s-sparse";
    let len = 256u64 << 20;
    let desc = FakeDesc::new();
    let key = 0x5a5a;
    let region = sealed_memfd(4096 + len, key);
    desc.write(2, &[(1, 0x10_0000, len, key, 1)]);
    let owner = fake_owner(
        &dir,
        name,
        desc.fd.as_raw_fd(),
        vec![region.as_raw_fd()],
        0,
        Duration::ZERO,
    );
    let before = rss_shmem_kib();
    let t0 = Instant::now();
    let peer = ShmPeer::attach(&dir, name, None).unwrap();
    let grew = rss_shmem_kib().saturating_sub(before);
    eprintln!(
        "sparse {} MiB region: peer attach took {:?}, RssShmem grew by {grew} KiB",
        len >> 20,
        t0.elapsed()
    );
    assert!(
        grew < 16 << 10,
        "peer committed {grew} KiB for an untouched region"
    );
    assert_eq!(peer.regions().len(), 1);
    drop(peer);
    let _ = owner.join();

    // A real owner's region: populated at allocation, pre-faulted on attach.
    let export = ShmExport::create(&dir, None).unwrap();
    let len = 64u64 << 20;
    let mem = export.allocate(len, true).unwrap();
    export.publish(&mem, RegionId(1), len, 42).unwrap();
    let before = rss_shmem_kib();
    let peer = ShmPeer::attach(&dir, export.name(), None).unwrap();
    let grew = rss_shmem_kib().saturating_sub(before);
    eprintln!(
        "owner-populated {} MiB region: peer RssShmem grew by {} MiB",
        len >> 20,
        grew >> 10
    );
    assert!(
        grew << 10 >= len * 9 / 10,
        "populated pages are pre-faulted"
    );
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 6. region requests are not matched to their replies: fixed ------------

/// Ask for `addr` until the answer is not "later" (the peer's refresher
/// has run): the answer and how long it took.
fn settle(peer: &ShmPeer, addr: u64) -> (Result<Access<()>, ErrorKind>, Duration) {
    let t0 = Instant::now();
    loop {
        let r = peer.with_remote(addr, 8, |_| ());
        if r != Ok(Access::Later) || t0.elapsed() > Duration::from_secs(5) {
            return (r, t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A (non-hostile) owner that is slow once — one region reply takes 2.5 s.
/// The access to that region never waits (`Later` at once, the peer's
/// refresher asks); the refresher gives up after its 2 s and the access
/// fails `Timeout`; asked again, the late reply is recognised by its
/// request id and dropped, so B and C are reachable once the owner answers
/// again.
#[test]
fn one_slow_region_reply_does_not_desync_the_handout_stream() {
    let dir = tmpdir("desync");
    let name = "tent-s-desync";
    let desc = FakeDesc::new();
    let (ka, kb, kc) = (0xa1u64, 0xb2u64, 0xc3u64);
    let regions = [
        sealed_memfd(8192, ka),
        sealed_memfd(8192, kb),
        sealed_memfd(8192, kc),
    ];
    let (a, b, c) = (0x10000u64, 0x20000u64, 0x30000u64);
    desc.write(2, &[(1, a, 4096, ka, 1)]);
    let region_raw: Vec<RawFd> = regions.iter().map(|r| r.as_raw_fd()).collect();
    let owner = fake_owner(
        &dir,
        name,
        desc.fd.as_raw_fd(),
        region_raw,
        2,
        Duration::from_millis(2500),
    );
    let peer = ShmPeer::attach(&dir, name, None).unwrap();
    assert_eq!(peer.with_remote(a, 8, |_| ()), Ok(Access::Done(())));
    desc.write(4, &[(1, a, 4096, ka, 1), (2, b, 4096, kb, 2)]);
    let t0 = Instant::now();
    let r = peer.with_remote(b, 8, |_| ());
    let took = t0.elapsed();
    eprintln!("access to B while the owner is slow: {r:?} after {took:?}");
    assert_eq!(r, Ok(Access::Later));
    assert!(
        took < Duration::from_millis(50),
        "an access waited {took:?}"
    );
    let (r, took) = settle(&peer, b);
    eprintln!("B once the refresher gave up: {r:?} after {took:?}");
    assert_eq!(r, Err(ErrorKind::Timeout));
    assert!(took < Duration::from_millis(2400), "{took:?}");
    // The failure answers for 100 ms; after that the same descriptor is
    // asked for again: the late reply (to the first request) is dropped by
    // its id, and the reply to the new request maps B.
    std::thread::sleep(Duration::from_millis(150));
    let (rb, took) = settle(&peer, b);
    eprintln!("B asked again: {rb:?} after {took:?}");
    assert_eq!(rb, Ok(Access::Done(())));
    desc.write(
        6,
        &[
            (1, a, 4096, ka, 1),
            (2, b, 4096, kb, 2),
            (3, c, 4096, kc, 3),
        ],
    );
    let (rb, _) = settle(&peer, b);
    let (rc, _) = settle(&peer, c);
    let rc2 = peer.with_remote(c, 8, |_| ());
    eprintln!("owner healthy again: B -> {rb:?}, C -> {rc:?}, C again -> {rc2:?}");
    assert_eq!(rb, Ok(Access::Done(())));
    assert_eq!(rc, Ok(Access::Done(())));
    assert_eq!(rc2, Ok(Access::Done(())));
    drop(peer);
    let _ = owner.join();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 7. memfds that are not shmem are refused ------------------------------

/// A hugetlbfs memfd (whose holes can SIGBUS) handed out as the descriptor
/// is refused before it is mapped: `InvalidArgument`.
#[test]
fn hugetlbfs_memfd_is_refused() {
    // SAFETY: a NUL-terminated name; no memory is passed.
    let raw = unsafe {
        libc::memfd_create(
            c"review-huge".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        )
    };
    if raw < 0 {
        eprintln!(
            "skipped: no hugetlbfs memfd here: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: a fresh fd that nothing else owns.
    let huge = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a syscall on an fd or process we own.
    if unsafe { libc::ftruncate(huge.as_raw_fd(), 2 << 20) } != 0 {
        eprintln!(
            "skipped: cannot size a hugetlbfs memfd: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE;
    // SAFETY: a syscall on an fd or process we own.
    let sealed = unsafe { libc::fcntl(huge.as_raw_fd(), libc::F_ADD_SEALS, seals) } == 0;
    let dir = tmpdir("huge");
    let name = "tent-s-huge";
    let owner = fake_owner(&dir, name, huge.as_raw_fd(), vec![], 0, Duration::ZERO);
    let err = ShmPeer::attach(&dir, name, None).unwrap_err();
    eprintln!(
        "hugetlbfs descriptor (sealed: {sealed}): {:?}: {err}",
        err.kind()
    );
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let _ = owner.join();
    let _ = std::fs::remove_dir_all(&dir);
}
