//! Security review of the sealed-memfd shm handout (hostile same-host peer).
//! Each test demonstrates one defect; they speak the handout protocol raw
//! (`TENTSHM1` hello, challenge, optional HMAC, `MEMFD` frame + SCM_RIGHTS).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use tent::segment::{ShmExport, ShmPeer};
use tent::{ErrorKind, RegionId};

const HELLO_LEN: usize = 8 + 32;
const CHALLENGE_LEN: usize = 8 + 32 + 8;

fn tmpdir(tag: &str) -> String {
    let d = format!("/tmp/tent-review-{tag}-{}", std::process::id());
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
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
    let mut fd = None;
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

fn send_fd(s: &UnixStream, bytes: &[u8], fd: RawFd) {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 8];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    assert_eq!(n as usize, bytes.len());
}

/// A raw client of an owner without a secret: returns the stream and the
/// descriptor memfd exactly as the owner handed it out.
fn raw_client(dir: &str, name: &str) -> (UnixStream, OwnedFd) {
    let s = UnixStream::connect(format!("{dir}/{name}")).unwrap();
    let mut hello = [7u8; HELLO_LEN];
    hello[..8].copy_from_slice(b"TENTSHM1");
    (&s).write_all(&hello).unwrap();
    let mut ch = [0u8; CHALLENGE_LEN];
    (&s).read_exact(&mut ch).unwrap();
    assert_eq!(ch[8 + 32], 0, "owner wants a secret");
    let mut frame = [0u8; 8];
    let fd = recv_fd(&s, &mut frame).expect("descriptor memfd");
    assert_eq!(&frame, b"MEMFD\0\0\0");
    (s, fd)
}

fn pwrite_u64(fd: &OwnedFd, off: i64, v: u64) {
    let b = v.to_le_bytes();
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), 8, off) };
    assert_eq!(n, 8, "pwrite: {}", std::io::Error::last_os_error());
}

// ---- 1. the descriptor memfd is handed out writable ---------------------

/// Any peer that passed the handshake receives the owner's descriptor memfd
/// O_RDWR and not write-sealed; writing the sequence word to u64::MAX makes
/// the OWNER's next publish overflow `seq + 1` (panic in debug /
/// overflow-checks builds) while holding the export state lock.
#[test]
fn peer_can_write_owner_descriptor_and_panic_owner_publish() {
    let dir = tmpdir("descw");
    let export = ShmExport::create(&dir, None).unwrap();
    let mem = export.allocate(4096).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    let (_s, desc) = raw_client(&dir, export.name());
    let fl = unsafe { libc::fcntl(desc.as_raw_fd(), libc::F_GETFL) };
    let seals = unsafe { libc::fcntl(desc.as_raw_fd(), libc::F_GET_SEALS) };
    eprintln!(
        "descriptor fd handed to peer: accmode O_RDWR={} seals={seals:#x} (F_SEAL_WRITE={:#x} F_SEAL_FUTURE_WRITE={:#x})",
        fl & libc::O_ACCMODE == libc::O_RDWR,
        libc::F_SEAL_WRITE,
        libc::F_SEAL_FUTURE_WRITE
    );
    assert_eq!(fl & libc::O_ACCMODE, libc::O_RDWR);
    pwrite_u64(&desc, 0, u64::MAX);
    let mem2 = export.allocate(4096).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        export.publish(&mem2, RegionId(2), 4096, 43)
    }));
    eprintln!("owner publish after the peer wrote seq=u64::MAX: panicked={}", r.is_err());
    assert!(r.is_err(), "owner publish should overflow (debug build)");
    // The export's state mutex is now poisoned: the owner can never publish again.
    let r = catch_unwind(AssertUnwindSafe(|| export.revoke(RegionId(1))));
    assert!(r.is_err(), "export state poisoned");
    eprintln!("owner revoke afterwards: panicked (poisoned) = {}", r.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Same door, no overflow needed (release builds too): the peer makes the
/// sequence odd; the owner's writer keeps it odd (+1, +2), so every other
/// peer's seqlock reader gives up and no new peer can attach.
#[test]
fn peer_writing_odd_seq_denies_every_other_peer() {
    let dir = tmpdir("descodd");
    let export = ShmExport::create(&dir, None).unwrap();
    let mem = export.allocate(4096).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    assert!(ShmPeer::attach(&dir, export.name(), None).is_ok());
    let (_s, desc) = raw_client(&dir, export.name());
    pwrite_u64(&desc, 0, 1); // odd: "writer active"
    let mem2 = export.allocate(4096).unwrap();
    export.publish(&mem2, RegionId(2), 4096, 43).unwrap(); // 1 -> 2 -> 3: stays odd
    let err = ShmPeer::attach(&dir, export.name(), None).unwrap_err();
    eprintln!("legit attach after hostile seq write: {:?}: {err}", err.kind());
    assert_eq!(err.kind(), ErrorKind::Unreachable);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 2. relay of the HMAC handshake --------------------------------------

/// A same-uid process WITHOUT the secret moves the owner's socket aside,
/// listens under its name, and relays a legitimate peer's handshake to the
/// real owner byte for byte. The proofs bind only the two nonces (no
/// channel binding), so both verify; the relay keeps a copy of every memfd.
#[test]
fn secretless_relay_obtains_region_memfds() {
    let dir = tmpdir("relay");
    let secret = b"0123456789abcdef-shm".to_vec();
    let export = ShmExport::create(&dir, Some(secret.clone())).unwrap();
    let mem = export.allocate(4096).unwrap();
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
        let pipe = |from: &UnixStream, to: &UnixStream, n: usize| {
            let mut b = vec![0u8; n];
            (&*from).read_exact(&mut b).unwrap();
            (&*to).write_all(&b).unwrap();
        };
        pipe(&v, &o, HELLO_LEN); // client nonce
        pipe(&o, &v, CHALLENGE_LEN); // server nonce, "secret required"
        pipe(&v, &o, 32); // client proof
        pipe(&o, &v, 32); // server proof
        let mut frame = [0u8; 8];
        let desc = recv_fd(&o, &mut frame).unwrap();
        send_fd(&v, &frame, desc.as_raw_fd());
        pipe(&v, &o, 16); // the victim's GETREGN
        let region = recv_fd(&o, &mut frame).unwrap();
        send_fd(&v, &frame, region.as_raw_fd());
        // Keep the relay open so the victim's view stays alive.
        (v, o, desc, region)
    });
    let victim = ShmPeer::attach(&dir, &name, Some(&secret)).expect("victim attaches through relay");
    let (_v, _o, _desc, region) = attacker.join().unwrap();
    let mut got = [0u8; 10];
    let n = unsafe { libc::pread(region.as_raw_fd(), got.as_mut_ptr().cast(), 10, 4096) };
    assert_eq!(n, 10);
    eprintln!(
        "victim attached: {} regions; attacker (no secret) read region bytes: {:?}",
        victim.regions().len(),
        String::from_utf8_lossy(&got)
    );
    assert_eq!(&got, b"TOP-SECRET");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 3. connect() without a timeout ---------------------------------------

/// A same-uid squatter listening with a full backlog (never accepting)
/// blocks `ShmPeer::attach` (engine `open_segment`/`open_p2p`) in a
/// blocking `connect` forever: IO_TIMEOUT is set only after connect.
#[test]
fn attach_hangs_in_connect_on_a_full_backlog() {
    let dir = tmpdir("backlog");
    let name = "tent-s-hangs";
    let path = format!("{dir}/{name}");
    let l = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as _;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as _;
    }
    let alen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    assert_eq!(unsafe { libc::bind(l, (&addr as *const libc::sockaddr_un).cast(), alen) }, 0);
    assert_eq!(unsafe { libc::listen(l, 0) }, 0);
    // Fill the backlog with non-blocking connects.
    let mut fillers = Vec::new();
    loop {
        let c = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
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
    std::thread::sleep(Duration::from_secs(6));
    let still_blocked = !h.is_finished();
    eprintln!("attach still blocked in connect after 6 s: {still_blocked}");
    // Release it: closing the listener wakes the blocked connect.
    unsafe { libc::close(l) };
    let (took, r) = h.join().unwrap();
    eprintln!("attach returned after {took:?}: {r:?}");
    for c in fillers {
        unsafe { libc::close(c) };
    }
    assert!(still_blocked, "attach should not block past IO_TIMEOUT (2 s)");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 4. unauthenticated peers hold all 256 serving slots -----------------

/// With a shared secret set, a same-uid process that does not know it opens
/// 256 connections and dribbles one byte per second: the 2 s IO_TIMEOUT is
/// per read, not per handshake, so each slot is held for ~(40+32)*2 s, and
/// every legitimate peer is closed at accept meanwhile.
#[test]
fn unauthenticated_slowloris_denies_legit_peers() {
    let dir = tmpdir("slots");
    let secret = b"0123456789abcdef-shm".to_vec();
    let export = ShmExport::create(&dir, Some(secret.clone())).unwrap();
    let mem = export.allocate(4096).unwrap();
    export.publish(&mem, RegionId(1), 4096, 42).unwrap();
    let path = format!("{dir}/{}", export.name());
    assert!(ShmPeer::attach(&dir, export.name(), Some(&secret)).is_ok());
    let idle: Vec<UnixStream> = (0..256).map(|_| UnixStream::connect(&path).unwrap()).collect();
    let start = Instant::now();
    let mut denied = 0;
    let mut tries = 0;
    while start.elapsed() < Duration::from_secs(7) {
        for s in &idle {
            let _ = (&*s).write_all(b"T"); // one byte of hello: resets the 2 s read timeout
        }
        std::thread::sleep(Duration::from_millis(500));
        tries += 1;
        match ShmPeer::attach(&dir, export.name(), Some(&secret)) {
            Ok(_) => {}
            Err(e) => {
                denied += 1;
                if tries == 1 {
                    eprintln!("legit attach while slots are held: {:?}: {e}", e.kind());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("legit attaches denied: {denied}/{tries} over {:?} (IO_TIMEOUT is 2 s)", start.elapsed());
    assert_eq!(denied, tries);
    drop(idle);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 5. prefault of an owner-declared length ------------------------------

fn rss_shmem_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("RssShmem:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

/// The owner declares (and hands out) a sparse region it never touched;
/// `attach` populates every page of it writable in the PEER (memory charged
/// to the peer), whatever its length up to MAX_REGION_LEN (64 TiB).
#[test]
fn attach_commits_whatever_length_the_owner_declares() {
    let dir = tmpdir("prefault");
    let export = ShmExport::create(&dir, None).unwrap();
    let len = 256u64 << 20;
    let mem = export.allocate(len).unwrap();
    export.publish(&mem, RegionId(1), len, 42).unwrap();
    let before = rss_shmem_kib();
    let t0 = Instant::now();
    let peer = ShmPeer::attach(&dir, export.name(), None).unwrap();
    let after = rss_shmem_kib();
    eprintln!(
        "owner never touched its {} MiB region; peer attach took {:?} and its RssShmem grew by {} MiB",
        len >> 20,
        t0.elapsed(),
        (after - before) >> 10
    );
    assert!((after - before) << 10 >= len * 9 / 10);
    drop(peer);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- 6. region requests are not matched to their replies ------------------

fn sealed_memfd(size: u64, key: u64) -> OwnedFd {
    let raw = unsafe { libc::memfd_create(c"review".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }, 0);
    if key != 0 {
        pwrite_u64(&fd, 0, key);
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }, 0);
    fd
}

/// Write descriptor entries (id, base, len, key, handle) then the sequence.
fn write_desc(desc: &OwnedFd, seq: u64, entries: &[(u64, u64, u64, u64, u64)]) {
    pwrite_u64(desc, 0, seq - 1); // odd while writing
    pwrite_u64(desc, 8, entries.len() as u64);
    pwrite_u64(desc, 16, u64::from_le_bytes(*b"TENTSHD2"));
    for (i, e) in entries.iter().enumerate() {
        let at = ((8 + i * 8) * 8) as i64;
        for (j, w) in [e.0, e.1, e.2, e.3, e.4].into_iter().enumerate() {
            pwrite_u64(desc, at + 8 * j as i64, w);
        }
    }
    pwrite_u64(desc, 0, seq);
}

/// A (non-hostile) owner that is slow once — one region reply takes 2.5 s —
/// leaves the peer's handout stream one reply behind forever: the next
/// request for region C gets region B's memfd, C's live key never matches,
/// and C (a healthy region of a live owner) answers AccessDenied for good.
#[test]
fn one_slow_region_reply_desyncs_the_handout_stream_for_good() {
    let dir = tmpdir("desync");
    let name = "tent-s-desync";
    let listener = UnixListener::bind(format!("{dir}/{name}")).unwrap();
    let desc = sealed_memfd(65600, 0);
    let (ka, kb, kc) = (0xa1u64, 0xb2u64, 0xc3u64);
    let regions = [sealed_memfd(8192, ka), sealed_memfd(8192, kb), sealed_memfd(8192, kc)];
    let (a, b, c) = (0x10000u64, 0x20000u64, 0x30000u64);
    write_desc(&desc, 2, &[(1, a, 4096, ka, 1)]);
    let desc_raw = desc.as_raw_fd();
    let region_raw: Vec<RawFd> = regions.iter().map(|r| r.as_raw_fd()).collect();
    let owner = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut hello = [0u8; HELLO_LEN];
        (&s).read_exact(&mut hello).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        ch[..8].copy_from_slice(b"TENTSHM1");
        (&s).write_all(&ch).unwrap();
        send_fd(&s, b"MEMFD\0\0\0", desc_raw);
        let mut slow_once = true;
        let mut req = [0u8; 16];
        while (&s).read_exact(&mut req).is_ok() {
            let h = u64::from_le_bytes(req[8..].try_into().unwrap());
            if h == 2 && slow_once {
                slow_once = false;
                std::thread::sleep(Duration::from_millis(2500));
            }
            send_fd(&s, b"MEMFD\0\0\0", region_raw[h as usize - 1]);
        }
    });
    let peer = ShmPeer::attach(&dir, name, None).unwrap();
    assert_eq!(peer.with_remote(a, 8, |_| ()), Ok(()));
    write_desc(&desc, 4, &[(1, a, 4096, ka, 1), (2, b, 4096, kb, 2)]);
    let t0 = Instant::now();
    let r = peer.with_remote(b, 8, |_| ());
    eprintln!("access to B while the owner is slow: {r:?} after {:?}", t0.elapsed());
    std::thread::sleep(Duration::from_millis(1000)); // the late reply arrives
    write_desc(&desc, 6, &[(1, a, 4096, ka, 1), (2, b, 4096, kb, 2), (3, c, 4096, kc, 3)]);
    let rb = peer.with_remote(b, 8, |_| ());
    let rc = peer.with_remote(c, 8, |_| ());
    let rc2 = peer.with_remote(c, 8, |_| ());
    eprintln!("owner healthy again: B -> {rb:?}, C -> {rc:?}, C again -> {rc2:?} (owner alive: {})", peer.owner_alive());
    assert_eq!(rc2, Err(ErrorKind::AccessDenied));
    drop(peer);
    let _ = owner.join();
    let _ = std::fs::remove_dir_all(&dir);
}
