//! Hostile peers: the TCP data port guarded
//! by the shared secret like the control plane, statuses that map nothing
//! for a client without the key, bounded denial of service on both ports,
//! and a killed target reported `ProcessFailed`.
//!
//! The raw clients here speak the data protocol byte by byte (the version
//! is the library's `DATA_VERSION`), so what they send is what an attacker
//! could send.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tent::transport::tcp::frame::{DATA_VERSION, HELLO_LEN, RESPONSE_LEN, Request, Response};
use tent::{Engine, ErrorKind, LocalAddr, Opcode, RemoteAddr, op};

const SECRET: &str = "0123456789abcdef-tent-data";
/// Hello flag: the server demands a proof of the shared secret.
const AUTH_REQUIRED: u32 = 1;
const DATA_CLIENT_LABEL: &[u8] = b"tent-data-client-v2";
const DATA_SERVER_LABEL: &[u8] = b"tent-data-server-v2";

fn engine_with(secret: &str, shm: bool) -> Engine {
    let mut c = test_config();
    c.rpc_shared_secret = secret.into();
    c.transports.shm.enable = shm;
    Engine::new(c).unwrap()
}

/// The data door's proof, written from the protocol's description:
/// MAC(secret, label, server nonce, client nonce, binding length (u64 LE),
/// binding), the binding being the server's address as dialed (IPv4 as
/// IPv4-mapped IPv6, then the port big-endian), then the initiator's
/// ident from its hello (session, connection id u32 LE: [`IDENT`]).
fn mac(
    secret: &[u8],
    label: &[u8],
    server_nonce: &[u8; 32],
    client_nonce: &[u8; 32],
    server: std::net::SocketAddr,
) -> [u8; 32] {
    let ip = match server.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    let mut binding = ip.octets().to_vec();
    binding.extend_from_slice(&server.port().to_be_bytes());
    binding.extend_from_slice(&IDENT);
    let mut m = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    m.update(label);
    m.update(server_nonce);
    m.update(client_nonce);
    m.update(&(binding.len() as u64).to_le_bytes());
    m.update(&binding);
    m.finalize().into_bytes().into()
}

/// What these clients' hellos name them (from version 3 on): session
/// (16 bytes), connection id (u32 LE, not 0).
const IDENT: [u8; 20] = [
    0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d, 0x1d,
    1, 0, 0, 0,
];

/// A 16-byte hello header: magic, version, status, flags.
fn hello_header(version: u16) -> Vec<u8> {
    let mut b = Vec::from(*b"TENTDATA");
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

/// What the server said in its hello.
#[derive(Debug)]
#[allow(dead_code)] // `version` is read by Debug in failure messages
struct ServerHello {
    version: u16,
    status: u16,
    flags: u32,
    nonce: [u8; 32],
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s
}

/// The rest of a hello after its header in `version`: the nonce from
/// version 2 on, the ident and 4 reserved bytes from version 3 on.
fn hello_rest(version: u16, nonce: &[u8; 32], ident: &[u8; 20]) -> Vec<u8> {
    let mut h = Vec::new();
    if version >= 2 {
        h.extend_from_slice(nonce);
    }
    if version >= 3 {
        h.extend_from_slice(ident);
        h.extend_from_slice(&[0; 4]);
    }
    h
}

/// Say hello in the library's data protocol version; the server's hello,
/// if it sent one.
fn hello(s: &mut TcpStream, nonce: &[u8; 32]) -> Option<ServerHello> {
    let mut h = hello_header(DATA_VERSION);
    h.extend_from_slice(&hello_rest(DATA_VERSION, nonce, &IDENT));
    let _ = s.write_all(&h);
    let mut b = [0u8; 16];
    s.read_exact(&mut b).ok()?;
    let version = u16::from_le_bytes([b[8], b[9]]);
    let mut reply = ServerHello {
        version,
        status: u16::from_le_bytes([b[10], b[11]]),
        flags: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        nonce: [0; 32],
    };
    if version >= 2 {
        s.read_exact(&mut reply.nonce).ok()?;
    }
    if version >= 3 {
        let mut ident = [0u8; 24];
        s.read_exact(&mut ident).ok()?;
    }
    Some(reply)
}

/// A 48-byte proof frame: "TENTAUTH", version, status, 0, MAC.
fn proof_frame(m: &[u8; 32]) -> Vec<u8> {
    let mut b = Vec::from(*b"TENTAUTH");
    b.extend_from_slice(&DATA_VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(m);
    b
}

/// Hello, then prove `secret` when the server asks: the server's proof
/// status and whether its MAC verified (`None` when it closed instead).
fn handshake(s: &mut TcpStream, secret: &[u8]) -> Option<(u16, bool)> {
    let cn = [0x5a; 32];
    let h = hello(s, &cn)?;
    assert_eq!(h.status, 0, "server refused the hello: {h:?}");
    assert_ne!(
        h.flags & AUTH_REQUIRED,
        0,
        "server does not ask for a proof"
    );
    let server = s.peer_addr().unwrap();
    s.write_all(&proof_frame(&mac(
        secret,
        DATA_CLIENT_LABEL,
        &h.nonce,
        &cn,
        server,
    )))
    .ok()?;
    let mut b = [0u8; 48];
    s.read_exact(&mut b).ok()?;
    assert_eq!(&b[..8], b"TENTAUTH");
    let status = u16::from_le_bytes([b[10], b[11]]);
    let ok = b[16..48] == mac(secret, DATA_SERVER_LABEL, &h.nonce, &cn, server);
    Some((status, ok))
}

fn req(opcode: Opcode, addr: u64, len: u64, key: u64) -> Vec<u8> {
    Request {
        opcode,
        seq: 1,
        addr,
        len,
        key,
    }
    .encode()
    .to_vec()
}

/// One request and its response header (no payload read).
fn ask(s: &mut TcpStream, r: Vec<u8>) -> Response {
    s.write_all(&r).unwrap();
    let mut h = [0u8; RESPONSE_LEN];
    s.read_exact(&mut h).unwrap();
    Response::decode(&h).unwrap()
}

/// Everything the server sends until it closes or goes quiet.
fn drain(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut all = Vec::new();
    let mut b = [0u8; 8192];
    while let Ok(n) = s.read(&mut b) {
        if n == 0 {
            break;
        }
        all.extend_from_slice(&b[..n]);
    }
    all
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn unauthenticated_client_with_a_valid_key_gets_no_memory_and_cannot_write() {
    let target = engine_with(SECRET, true);
    let buf = target.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(1, 1 << 16)).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    let (a, key) = (buf.addr(), buf.key());
    let attack = |s: &mut TcpStream| {
        let mut w = req(Opcode::Write, a, 64, key);
        w.extend_from_slice(&[0xee; 64]);
        let _ = s.write_all(&req(Opcode::Read, a, 4096, key));
        let _ = s.write_all(&w);
        let _ = s.write_all(&req(Opcode::Read, a + 8192, 4096, key));
        drain(s)
    };
    let mut seen = Vec::new();
    // 1. The old protocol's hello, then requests.
    let mut s = connect(addr);
    let _ = s.write_all(&hello_header(1));
    seen.push(("v1 hello", attack(&mut s)));
    // 2. The current hello, no proof at all.
    let mut s = connect(addr);
    let _ = hello(&mut s, &[1; 32]);
    seen.push(("no proof", attack(&mut s)));
    // 3. The current hello, a forged proof.
    let mut s = connect(addr);
    let _ = hello(&mut s, &[2; 32]);
    let _ = s.write_all(&proof_frame(&[0; 32]));
    seen.push(("forged proof", attack(&mut s)));
    let p = pattern(1, 1 << 16);
    for (how, got) in &seen {
        assert!(
            !contains(got, &p[..32]) && !contains(got, &p[8192..8224]),
            "{how}: target memory leaked to an unauthenticated client ({} bytes back)",
            got.len()
        );
    }
    let mut now = vec![0u8; 1 << 16];
    buf.read(0, &mut now).unwrap();
    assert!(now == p, "an unauthenticated client wrote target memory");
}

#[test]
fn data_port_proof_wrong_secret_refused_right_secret_served_engines_move_data() {
    let target = engine_with(SECRET, true);
    let buf = target.allocate_memory(1 << 20).unwrap();
    buf.write(0, &pattern(4, 1 << 20)).unwrap();
    let addr = target.tcp_data_addr().unwrap();

    // Wrong secret: told AccessDenied, then closed, nothing served.
    let mut s = connect(addr);
    let (status, _) = handshake(&mut s, b"not-the-secret-at-all").expect("a verdict");
    assert_eq!(status, ErrorKind::AccessDenied.code());
    let _ = s.write_all(&req(Opcode::Read, buf.addr(), 64, buf.key()));
    assert!(!contains(&drain(&mut s), &pattern(4, 64)));

    // Right secret: the server proves itself too, and serves.
    let mut s = connect(addr);
    assert_eq!(handshake(&mut s, SECRET.as_bytes()), Some((0, true)));
    let r = ask(&mut s, req(Opcode::Read, buf.addr(), 64, buf.key()));
    assert_eq!((r.status, r.len), (Ok(()), 64));
    let mut p = [0u8; 64];
    s.read_exact(&mut p).unwrap();
    assert_eq!(&p[..], &pattern(4, 64)[..]);

    // Engine to engine with the secret: TCP, data verified both ways.
    let init = engine_with(SECRET, false);
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 20).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(op::Read::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, buf.addr()),
            1 << 20,
        ))
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Ok(1 << 20));
    assert_eq!(c[0].transport(), tent::TransportKind::Tcp);
    let mut got = vec![0u8; 1 << 20];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(4, 1 << 20));
    local.write(0, &pattern(9, 1 << 20)).unwrap();
    ring.submission()
        .push(op::Write::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, buf.addr()),
            1 << 20,
        ))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 20));
    buf.read(0, &mut got).unwrap();
    assert!(got == pattern(9, 1 << 20));
}

#[test]
fn probing_without_the_key_gets_one_status_for_every_address() {
    let target = common::engine();
    let buf = target.allocate_memory(1 << 16).unwrap();
    let other = target.allocate_memory(1 << 16).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    let mut s = connect(addr);
    let h = hello(&mut s, &[3; 32]).expect("hello");
    assert_eq!(h.status, 0);
    let (a, len) = (buf.addr(), buf.len());
    let probes = [
        ("registered", a, 16),
        ("registered, other region", other.addr(), 16),
        ("unregistered low", 4096, 16),
        ("unregistered high", a + (1 << 40), 16),
        ("straddling the end", a + len - 4, 16),
        ("past the end", a + len + 4096, 16),
        ("u64 wrap", u64::MAX - 4, 16),
    ];
    let mut statuses = Vec::new();
    for key in [0, 0x1234_5678_9abc_def0, buf.key() ^ 1] {
        for (what, at, n) in probes {
            for opcode in [Opcode::Read, Opcode::Write] {
                let mut r = req(opcode, at, n, key);
                if opcode == Opcode::Write {
                    r.extend_from_slice(&vec![0u8; n as usize]);
                }
                let resp = ask(&mut s, r);
                statuses.push((what, key, opcode, resp.status));
            }
        }
    }
    for (what, key, opcode, st) in &statuses {
        assert_eq!(
            *st,
            Err(ErrorKind::AccessDenied),
            "{what} with key {key:#x} ({opcode:?}) answered {st:?}: all {statuses:?}"
        );
    }
}

#[test]
fn dripping_control_connections_do_not_lock_out_a_legitimate_open() {
    let target = common::engine();
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.segment_name();
    let hello =
        tent::control::wire::encode(&tent::control::wire::Message::Hello { nonce: [7; 32] });
    // 64 peers that each drip one byte of a valid Hello every 3 s.
    let mut drips: Vec<TcpStream> = (0..64)
        .map(|_| {
            let mut s = TcpStream::connect(&name).unwrap();
            s.write_all(&hello[..1]).unwrap();
            s
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dripper = {
        let stop = stop.clone();
        let mut drips: Vec<TcpStream> = drips.iter_mut().map(|s| s.try_clone().unwrap()).collect();
        std::thread::spawn(move || {
            let mut at = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && at < hello.len() {
                std::thread::sleep(Duration::from_secs(3));
                for s in &mut drips {
                    let _ = s.write_all(&hello[at..at + 1]);
                }
                at += 1;
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // While they are held, legitimate opens succeed.
    for _ in 0..3 {
        let init = common::engine();
        let seg = init
            .open_segment(&name)
            .expect("open while 64 drippers are held");
        assert!(!init.segment_regions(seg).unwrap().is_empty());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    dripper.join().unwrap();
}

/// Without a secret a control connection past its Hello and Challenge has
/// proven nothing: 64 of them that then send no request are evicted for
/// legitimate opens, which are served at once rather than after the
/// holders' 5 s exchange deadline frees their slots.
#[test]
fn control_connections_silent_after_the_challenge_do_not_lock_out_a_legitimate_open() {
    use tent::control::wire::{self, Message};
    let target = common::engine();
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.segment_name();
    let inits: Vec<Engine> = (0..3).map(|_| common::engine()).collect();
    // What an attacker's client does: the handshake as a real one makes
    // it, then nothing.
    let mut held: Vec<TcpStream> = (0..tent::control::server::MAX_CONNECTIONS)
        .map(|i| {
            let mut s = TcpStream::connect(&name).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let nonce = [u8::try_from(i).unwrap(); 32];
            wire::write_message(&mut s, &Message::Hello { nonce }).unwrap();
            match wire::read_message(&mut s) {
                Ok(Message::Challenge {
                    auth_required: false,
                    ..
                }) => s,
                m => panic!("holder {i}: no challenge: {m:?}"),
            }
        })
        .collect();
    // Past the age that protects a connection mid-handshake.
    std::thread::sleep(Duration::from_millis(1200));
    for (i, init) in inits.iter().enumerate() {
        let t = Instant::now();
        let seg = init
            .open_segment(&name)
            .expect("open while 64 connections hold after their challenge");
        assert!(!init.segment_regions(seg).unwrap().is_empty());
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "open {i} took {:?} with 64 connections holding after their challenge",
            t.elapsed()
        );
    }
    // The holders that made room were told busy (a retry), not reset.
    let mut evicted = 0;
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        if matches!(wire::read_message(s), Ok(Message::Error { code, .. }) if code == ErrorKind::SqFull.code())
        {
            evicted += 1;
        }
    }
    assert!(evicted >= 1, "no holder was evicted");
}

#[test]
fn a_control_exchange_has_one_deadline_however_slowly_it_drips() {
    let target = common::engine();
    let name = target.segment_name();
    let mut bytes =
        tent::control::wire::encode(&tent::control::wire::Message::Hello { nonce: [9; 32] });
    bytes.extend_from_slice(&tent::control::wire::encode(
        &tent::control::wire::Message::GetDescriptor,
    ));
    let mut s = TcpStream::connect(&name).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let start = Instant::now();
    let mut closed = None;
    // One byte every 300 ms: every single read is quick, the whole is not.
    'drip: for b in bytes.iter().cycle() {
        if s.write_all(std::slice::from_ref(b)).is_err() {
            closed = Some(start.elapsed());
            break;
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(300) {
            let mut sink = [0u8; 4096];
            match s.read(&mut sink) {
                Ok(0) => {
                    closed = Some(start.elapsed());
                    break 'drip;
                }
                Err(e)
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut =>
                {
                    closed = Some(start.elapsed());
                    break 'drip;
                }
                _ => {}
            }
        }
        if start.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let closed = closed.expect("a dripping control peer was never closed (10 s)");
    assert!(
        closed >= Duration::from_secs(3) && closed < Duration::from_secs(8),
        "closed after {closed:?}"
    );
}

#[test]
fn idle_data_connections_after_hello_do_not_starve_a_legitimate_initiator() {
    let target = common::engine();
    let buf = target.allocate_memory(1 << 20).unwrap();
    buf.write(0, &pattern(6, 1 << 20)).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    // 512 peers that say hello and then nothing.
    let idle: Vec<TcpStream> = (0..512)
        .map(|i| {
            let mut s = connect(addr);
            let _ = hello(&mut s, &[i as u8; 32]);
            s
        })
        .collect();
    let init = engine_with("", false);
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 20).unwrap();
    let mut ring = init.ring().unwrap();
    for i in 0..8u64 {
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), i << 17),
                    RemoteAddr::new(seg, buf.addr() + (i << 17)),
                    1 << 17,
                )
                .user_data(i),
            )
            .unwrap();
    }
    for c in reap(&mut ring, 8) {
        assert_eq!(c.result(), Ok(1 << 17), "op {}", c.user_data());
    }
    let mut got = vec![0u8; 1 << 20];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(6, 1 << 20));
    drop(idle);
}

/// Without a secret, 512 peers that keep sending READs with a key they do
/// not hold (each refused) do not hold the server full against a new
/// initiator: a refused request is no activity, so once a second has
/// passed since their handshake they are "unused" and evicted first, and
/// the initiator's ops are served at once (not told BUSY until they have
/// been idle 30 s).
#[test]
fn connections_refused_every_request_do_not_starve_a_legitimate_initiator() {
    let target = common::engine();
    let buf = target.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(9, 1 << 16)).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    let bogus = || req(Opcode::Read, buf.addr(), 8, buf.key() ^ 1);
    let mut squatters: Vec<TcpStream> = (0..512)
        .map(|i| {
            let mut s = connect(addr);
            let h = hello(&mut s, &[i as u8; 32]).expect("hello");
            assert_eq!(h.status, 0);
            assert_eq!(ask(&mut s, bogus()).status, Err(ErrorKind::AccessDenied));
            s
        })
        .collect();
    // A second later, each is refused once more: still no use.
    std::thread::sleep(Duration::from_millis(1200));
    for s in &mut squatters {
        assert_eq!(ask(s, bogus()).status, Err(ErrorKind::AccessDenied));
    }
    let init = engine_with("", false);
    let seg = init.open_segment(&target.segment_name()).unwrap();
    read_64k_verified(&init, seg, buf.addr(), 9);
    drop(squatters);
}

/// One 64 KiB READ of `remote` in `seg`, served with the bytes
/// `pattern(seed, ..)` wrote there.
fn read_64k_verified(init: &Engine, seg: tent::SegmentId, remote: u64, seed: u8) {
    let local = init.allocate_memory(1 << 16).unwrap();
    let mut ring = init.ring().unwrap();
    let start = Instant::now();
    ring.submission()
        .push(op::Read::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, remote),
            1 << 16,
        ))
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Ok(1 << 16), "after {:?}", start.elapsed());
    let mut got = vec![0u8; 1 << 16];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(seed, 1 << 16));
}

#[test]
fn a_full_data_server_says_busy_and_the_initiator_waits_its_turn() {
    let mut c = test_config();
    c.transports.tcp.max_served_connections = 512;
    let target = Engine::new(c).unwrap();
    let buf = target.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(8, 1 << 16)).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    // 512 peers that each moved data just now: not idle, not evictable.
    let mut busy: Vec<TcpStream> = (0..512)
        .map(|i| {
            let mut s = connect(addr);
            let h = hello(&mut s, &[i as u8; 32]).expect("hello");
            assert_eq!(h.status, 0);
            let r = ask(&mut s, req(Opcode::Read, buf.addr(), 8, buf.key()));
            assert_eq!(r.status, Ok(()));
            let mut p = [0u8; 8];
            s.read_exact(&mut p).unwrap();
            s
        })
        .collect();
    // One more is told why it is refused.
    let mut s = connect(addr);
    let h = hello(&mut s, &[0xff; 32]).expect("a busy server still says hello");
    assert_eq!(h.status, ErrorKind::SqFull.code(), "busy: {h:?}");
    drop(s);
    // An initiator posts now; room appears 500 ms later.
    let init = engine_with("", false);
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 16).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(op::Read::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, buf.addr()),
            1 << 16,
        ))
        .unwrap();
    ring.submit().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    busy.truncate(480);
    let c = reap(&mut ring, 1);
    assert_eq!(
        c[0].result(),
        Ok(1 << 16),
        "busy is back-pressure, not a fault"
    );
    let mut got = vec![0u8; 1 << 16];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(8, 1 << 16));
}

/// The target half of the descriptor test: a patterned region over TCP,
/// then a limit on open files a dozen past what it holds now.
#[test]
fn tcp_out_of_descriptors_target_child() {
    if std::env::var_os("TENT_TCP_FD_TARGET").is_none() {
        return;
    }
    let mut c = test_config();
    c.transports.shm.enable = false;
    let e = Engine::new(c).unwrap();
    let buf = e.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(4, 1 << 16)).unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let lim = rustix::process::Rlimit {
        current: Some(open + 12),
        maximum: Some(open + 12),
    };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, lim).unwrap();
    println!(
        "SEGMENT {} {} {}",
        e.segment_name(),
        buf.addr(),
        e.tcp_data_addr().unwrap()
    );
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// A target out of file descriptors (`EMFILE` at accept) still makes room
/// for a new initiator: peers that said hello and sent nothing fill every
/// descriptor the target may open, one more waits in its backlog, and an
/// initiator that opened the segment before posts a READ: the target
/// gives up a reserve descriptor to accept, evicts the unused connections
/// for the ones waiting, and serves the READ (before: accept failed for
/// good, and the READ timed out).
#[test]
fn a_target_out_of_descriptors_evicts_unused_connections_for_an_initiator() {
    let (mut child, _out, w) = common::target_child(
        "tcp_out_of_descriptors_target_child",
        "TENT_TCP_FD_TARGET",
        "SEGMENT",
    );
    let (name, remote, data) = (
        w[0].clone(),
        w[1].parse::<u64>().unwrap(),
        w[2].parse::<SocketAddr>().unwrap(),
    );
    let mut c = test_config();
    c.transports.shm.enable = false;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&name).unwrap();
    // Fill the target's descriptors: hellos until one goes unanswered
    // (its connection waits in the backlog).
    let mut squatters = Vec::new();
    for i in 0..64u8 {
        let mut s = connect(data);
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let answered = hello(&mut s, &[i; 32]).is_some();
        squatters.push(s);
        if !answered {
            break;
        }
    }
    assert!(
        squatters.len() < 64,
        "the target never ran out of descriptors"
    );
    // Old enough to be evicted as unused.
    std::thread::sleep(Duration::from_millis(1200));
    read_64k_verified(&init, seg, remote, 4);
    drop(squatters);
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// The target half of the kill test: a patterned region over TCP.
#[test]
fn tcp_two_process_target_child() {
    if std::env::var_os("TENT_TCP_KILL_TARGET").is_none() {
        return;
    }
    let e = common::engine();
    let buf = e.allocate_memory(16 << 20).unwrap();
    buf.write(0, &pattern(2, 16 << 20)).unwrap();
    println!("SEGMENT {} {}", e.segment_name(), buf.addr());
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

#[test]
fn tcp_two_process_target_killed_mid_transfer_fails_process_failed() {
    let (mut child, _out, w) = common::target_child(
        "tcp_two_process_target_child",
        "TENT_TCP_KILL_TARGET",
        "SEGMENT",
    );
    let (name, remote) = (w[0].clone(), w[1].parse::<u64>().unwrap());
    let init = engine_with("", false);
    let seg = init.open_segment(&name).unwrap();
    let chunk = 1u64 << 20;
    let local = init.allocate_memory(4 * chunk).unwrap();
    let mut ring = init.ring().unwrap();
    let post = |ring: &mut tent::Ring, slot: u64, n: u64| {
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), slot * chunk),
                    RemoteAddr::new(seg, remote + (n % 16) * chunk),
                    chunk,
                )
                .user_data(slot),
            )
            .unwrap();
    };
    for slot in 0..4 {
        post(&mut ring, slot, slot);
    }
    ring.submit().unwrap();
    let (mut ok, mut n, mut failures) = (0u32, 4u64, Vec::new());
    let mut killed: Option<Instant> = None;
    loop {
        let c = ring
            .wait_one(Duration::from_secs(20))
            .expect("a completion");
        match c.result() {
            Ok(_) => ok += 1,
            Err(k) => failures.push(k),
        }
        if killed.is_none() && ok >= 20 {
            child.kill().unwrap(); // SIGKILL
            let _ = child.wait();
            killed = Some(Instant::now());
        }
        if killed.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) || failures.len() >= 40 {
            break;
        }
        post(&mut ring, c.user_data(), n);
        n += 1;
        ring.submit().unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!failures.is_empty(), "no op failed after the kill");
    assert!(
        failures.iter().all(|k| *k == ErrorKind::ProcessFailed),
        "a killed target process is ProcessFailed: {failures:?}"
    );
}

/// A fake target (raw protocol, no secret) that serves one READ per
/// connection from `mem` at address `base`, then closes it (as a target
/// closes an idle connection); how many connections it served.
fn one_request_per_connection(
    l: std::net::TcpListener,
    base: u64,
    mem: Vec<u8>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u32> {
    std::thread::spawn(move || {
        l.set_nonblocking(true).unwrap();
        let mut served = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((mut s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut h = [0u8; HELLO_LEN];
            if s.read_exact(&mut h).is_err() {
                continue;
            }
            let mut reply = hello_header(DATA_VERSION);
            reply.extend_from_slice(&hello_rest(DATA_VERSION, &[0x33; 32], &[0; 20]));
            s.write_all(&reply).unwrap();
            let mut r = [0u8; 32];
            if s.read_exact(&mut r).is_err() {
                continue;
            }
            let req = Request::decode(&r).unwrap();
            let off = (req.addr - base) as usize;
            let resp = Response {
                status: Ok(()),
                seq: req.seq,
                len: req.len,
            };
            s.write_all(&resp.encode()).unwrap();
            s.write_all(&mem[off..off + req.len as usize]).unwrap();
            served += 1;
            // Closed while idle: nothing of the initiator's is in flight.
        }
        served
    })
}

#[test]
fn a_connection_the_target_closed_while_idle_reconnects_without_failing_an_op() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let data = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let data_addr = data.local_addr().unwrap();
    let (base, len) = (0x7000_0000u64, 1u64 << 16);
    let stop = Arc::new(AtomicBool::new(false));
    let fake = one_request_per_connection(data, base, pattern(5, len as usize), stop.clone());
    let control = tent::control::ControlServer::start("127.0.0.1", 0, None, move |addr| {
        Arc::new(move || tent::control::SegmentDescriptor {
            name: addr.to_string(),
            host_id: "a-fake-target-elsewhere".into(),
            pid: 1,
            regions: vec![tent::control::RegionEntry {
                id: 1,
                addr: base,
                len,
                key: 42,
                rkeys: vec![],
                mr_step: None,
                chunk_rkeys: vec![],
            }],
            transports: vec![tent::TransportKind::Tcp as u8],
            rails: vec![tent::control::wire::RailEntry {
                name: "lo".into(),
                addr: data_addr.to_string(),
            }],
            ..Default::default()
        })
    })
    .unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    let init = Engine::new(c).unwrap();
    let seg = init
        .open_segment(&control.local_addr().to_string())
        .unwrap();
    let local = init.allocate_memory(len).unwrap();
    let mut ring = init.ring().unwrap();
    for i in 0..5u64 {
        ring.submission()
            .push(op::Read::new(
                LocalAddr::new(local.id(), i * 4096),
                RemoteAddr::new(seg, base + i * 4096),
                4096,
            ))
            .unwrap();
        assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096), "READ {i}");
        // Let the close arrive: the connection is idle and gone.
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut got = vec![0u8; 5 * 4096];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(5, len as usize)[..5 * 4096]);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(fake.join().unwrap(), 5, "one connection per READ");
}
