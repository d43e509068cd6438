//! Lifetimes at the TCP transport's edges: once `Engine` drop returns, no
//! data-server thread writes into the memory the application registered;
//! once a WRITE's CQE is out, the sender no longer reads its buffer, however
//! early a hostile target answers.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{reap, test_config};
use tent::control::wire::RailEntry;
use tent::transport::tcp::frame::{HELLO_LEN, Hello, Ident, REQUEST_LEN, Request, Response};
use tent::{Engine, ErrorKind, LocalAddr, Opcode, RemoteAddr, SegmentId, op};

fn engine() -> Engine {
    let mut c = test_config();
    c.transports.shm.enable = false;
    Engine::new(c).unwrap()
}

/// Threads of this process whose name is one of `names`.
fn threads_named(names: &[&str]) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| names.contains(&comm.trim_end()))
        .count()
}

/// A raw v3 client of `addr` (no secret) as connection `conn`.
fn raw_client(addr: SocketAddr, conn: u32) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Hello {
        status: 0,
        flags: 0,
        nonce: [9; 32],
        ident: Ident {
            session: [9; 16],
            conn,
        },
    };
    s.write_all(&hello.encode()).unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).unwrap();
    assert_eq!(Hello::decode(&h).unwrap().status, 0);
    s
}

/// An anonymous private mapping of `len` bytes (at `at` exactly, when set).
fn map(at: *mut u8, len: usize) -> *mut u8 {
    let fixed = if at.is_null() {
        0
    } else {
        libc::MAP_FIXED_NOREPLACE
    };
    // SAFETY: an anonymous mapping; with `at`, only where nothing is mapped (NOREPLACE).
    let m = unsafe {
        libc::mmap(
            at.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED, "mmap failed");
    m.cast()
}

/// Peers streaming WRITEs into application memory when the engine is
/// dropped: once the drop has returned, the memory is unmapped and mapped
/// afresh (zeros) by "someone else"; no byte may land there any more, and
/// no data-server thread is left.
#[test]
fn no_served_write_lands_after_engine_drop_returns() {
    const PEERS: usize = 4;
    const EACH: usize = 256 << 20;
    let total = PEERS * EACH;
    let target = engine();
    let mem = map(std::ptr::null_mut(), total);
    // SAFETY: the mapping stays until after the engine is dropped.
    let buf = unsafe { target.register_memory(mem, total as u64) }.unwrap();
    let addr = target.tcp_data_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicUsize::new(0));
    let mut peers = Vec::new();
    for p in 0..PEERS {
        let mut s = raw_client(addr, p as u32 + 1);
        let req = Request {
            opcode: Opcode::Write,
            seq: 1,
            addr: mem as u64 + (p * EACH) as u64,
            len: EACH as u64,
            key: buf.key(),
        };
        let (stop, started) = (stop.clone(), started.clone());
        peers.push(std::thread::spawn(move || {
            s.write_all(&req.encode()).unwrap();
            let chunk = vec![0xA5u8; 1 << 20];
            let mut sent = 0;
            // Flat out until the test says stop: the server's thread is
            // always inside a payload `recv` with more bytes queued.
            while sent < EACH && !stop.load(Ordering::SeqCst) {
                let n = chunk.len().min(EACH - sent);
                if s.write_all(&chunk[..n]).is_err() {
                    break;
                }
                sent += n;
                if sent == n {
                    started.fetch_add(1, Ordering::SeqCst);
                }
            }
            sent
        }));
    }
    let until = Instant::now() + Duration::from_secs(10);
    while started.load(Ordering::SeqCst) < PEERS {
        assert!(Instant::now() < until, "the peers never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    drop(buf);
    drop(target);
    let left = threads_named(&["tent-tcp-serve"]);
    // SAFETY: the engine is gone: nothing of it may touch the mapping.
    assert_eq!(unsafe { libc::munmap(mem.cast(), total) }, 0);
    let again = map(mem, total);
    assert_eq!(again, mem, "could not map the range again");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    for p in peers {
        let _ = p.join();
    }
    // SAFETY: `again` maps `total` readable bytes, written by nobody here.
    let now = unsafe { std::slice::from_raw_parts(again, total) };
    let landed = now.iter().filter(|&&b| b != 0).count();
    // SAFETY: our own mapping.
    unsafe { libc::munmap(again.cast(), total) };
    println!("after drop: {landed} bytes landed, {left} serve threads left");
    assert_eq!(
        landed, 0,
        "a data-server thread wrote into application memory after the engine's drop returned"
    );
    assert_eq!(
        left, 0,
        "tcp data-server threads outlived the engine's drop"
    );
}

/// A hostile target answers a WRITE's header at once and stops reading:
/// the CQE must not come while the sender still reads the buffer. The
/// application overwrites the buffer right at the CQE; the target, reading
/// the rest afterwards, must see only the original bytes, and the WRITE
/// must not be reported done.
#[test]
fn an_early_write_response_does_not_complete_while_the_payload_is_sent() {
    const LEN: usize = 64 << 20;
    let real = engine();
    let remote = real.allocate_memory(LEN as u64).unwrap();
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let go2 = go.clone();
    let target = std::thread::spawn(move || -> (usize, usize) {
        fake.set_nonblocking(true).unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        let mut s = loop {
            match fake.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => panic!("the initiator never connected: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        let mut h = [0u8; HELLO_LEN];
        s.read_exact(&mut h).unwrap();
        let ours = Hello {
            status: 0,
            flags: 0,
            nonce: [1; 32],
            ident: Ident::NONE,
        };
        s.write_all(&ours.encode()).unwrap();
        let mut r = [0u8; REQUEST_LEN];
        s.read_exact(&mut r).unwrap();
        let req = Request::decode(&r).unwrap();
        let resp = Response {
            status: Ok(()),
            seq: req.seq,
            len: req.len,
        };
        s.write_all(&resp.encode()).unwrap();
        while !go2.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        // Read what comes: (bytes, bytes that are not the original).
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (mut got, mut bad) = (0usize, 0usize);
        let mut b = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    bad += b[..n].iter().filter(|&&x| x != 0x11).count();
                    got += n;
                    if got >= LEN {
                        break;
                    }
                }
            }
        }
        (got, bad)
    });
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.slice_size = 64 << 20;
    let init = Engine::new(c).unwrap();
    let seg: SegmentId = init
        .open_segment_edited(&real.segment_name(), |d| {
            d.host_id = "a-host-elsewhere".into();
            d.shm_name = None;
            d.rails = vec![RailEntry {
                name: "lo".into(),
                addr: fake_addr.to_string(),
            }];
        })
        .unwrap();
    let local = init.allocate_memory(LEN as u64).unwrap();
    local.write(0, &vec![0x11u8; LEN]).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, remote.addr()),
                LEN as u64,
            )
            .user_data(1),
        )
        .unwrap();
    let cqe = reap(&mut ring, 1)[0];
    // The application reuses its buffer at once.
    local.write(0, &vec![0x22u8; LEN]).unwrap();
    go.store(true, Ordering::SeqCst);
    let (got, bad) = target.join().unwrap();
    println!(
        "CQE {:?}; the target then read {got} bytes, {bad} not the original",
        cqe.result()
    );
    assert_eq!(
        bad, 0,
        "the sender still read the WRITE's buffer after its CQE was delivered"
    );
    assert_eq!(
        cqe.result(),
        Err(ErrorKind::Unreachable),
        "a WRITE answered before its payload was sent must fail"
    );
}
