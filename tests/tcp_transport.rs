//! The TCP transport over loopback: one-sided READ/WRITE with data
//! verified, per-op refusals that leave the connection going, and the data
//! server's handling of malformed frames (each a test).
//!
//! The initiator disables shm so a same-host peer is reached over TCP.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::transport::tcp::frame::{
    HELLO_LEN, Hello, Ident, MAX_OP_LEN, REQUEST_LEN, RESPONSE_LEN, Request, Response,
};
use tent::{Engine, ErrorKind, LocalAddr, Opcode, RemoteAddr, TransportKind, op};

fn tcp_initiator() -> Engine {
    let mut c = test_config();
    c.transports.shm.enable = false;
    Engine::new(c).unwrap()
}

#[test]
fn read_and_write_over_tcp_with_data_verified() {
    let target = common::engine();
    let len = 8 << 20;
    let remote = target.allocate_memory(len).unwrap();
    remote.write(0, &pattern(5, len as usize)).unwrap();
    let init = tcp_initiator();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(len).unwrap();
    let mut ring = init.ring().unwrap();

    for (i, size) in [8u64, 4096, 65_537, 1 << 20, 8 << 20]
        .into_iter()
        .enumerate()
    {
        // READ the remote pattern.
        local.write(0, &vec![0u8; size as usize]).unwrap();
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), 0),
                    RemoteAddr::new(seg, remote.addr()),
                    size,
                )
                .user_data(i as u64),
            )
            .unwrap();
        let c = reap(&mut ring, 1);
        assert_eq!(c[0].result(), Ok(size), "READ {size}");
        assert_eq!(c[0].transport(), TransportKind::Tcp);
        let mut got = vec![0u8; size as usize];
        local.read(0, &mut got).unwrap();
        assert!(
            got == pattern(5, len as usize)[..size as usize],
            "READ {size} data"
        );

        // WRITE a new pattern and check it landed.
        let p = pattern(i as u8 + 40, size as usize);
        local.write(0, &p).unwrap();
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(local.id(), 0),
                    RemoteAddr::new(seg, remote.addr()),
                    size,
                )
                .user_data(100 + i as u64),
            )
            .unwrap();
        let c = reap(&mut ring, 1);
        assert_eq!(c[0].result(), Ok(size), "WRITE {size}");
        let mut got = vec![0u8; size as usize];
        remote.read(0, &mut got).unwrap();
        assert!(got == p, "WRITE {size} data");
        remote.write(0, &pattern(5, len as usize)).unwrap();
    }
}

#[test]
fn many_requests_in_flight_complete_exactly_once() {
    let target = common::engine();
    let remote = target.allocate_memory(1 << 20).unwrap();
    remote.write(0, &pattern(9, 1 << 20)).unwrap();
    let init = tcp_initiator();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 20).unwrap();
    let mut ring = init.ring().unwrap();
    let n = 200u64;
    let chunk = (1 << 20) / n / 8 * 8;
    for i in 0..n {
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), i * chunk),
                    RemoteAddr::new(seg, remote.addr() + i * chunk),
                    chunk,
                )
                .user_data(i),
            )
            .unwrap();
    }
    let mut seen = vec![false; n as usize];
    for c in reap(&mut ring, n as usize) {
        assert_eq!(c.result(), Ok(chunk));
        assert!(!std::mem::replace(&mut seen[c.user_data() as usize], true));
    }
    let mut got = vec![0u8; (n * chunk) as usize];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(9, 1 << 20)[..(n * chunk) as usize]);
}

#[test]
fn one_connection_with_one_slice_in_flight_still_moves_everything() {
    let target = common::engine();
    let len = 4 << 20;
    let remote = target.allocate_memory(len).unwrap();
    remote.write(0, &pattern(11, len as usize)).unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.max_inflight_per_connection = 1;
    c.transports.tcp.slice_size = 4096;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(len).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(op::Read::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, remote.addr()),
            len,
        ))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(len));
    let mut got = vec![0u8; len as usize];
    local.read(0, &mut got).unwrap();
    assert!(got == pattern(11, len as usize));
}

/// A slice cut off the wire (its task timed out, its connection reset)
/// gives its credit in the connection's wire window back exactly once:
/// with a window of one, a credit lost in the teardown would leave the
/// connection unable to send again, and one given back twice would let
/// two slices on the wire (the window's count would wrap).
#[test]
fn a_connection_reset_mid_transfer_gives_its_wire_window_back() {
    let target = common::engine();
    let len: u64 = 64 << 20;
    let remote = target.allocate_memory(len).unwrap();
    remote.write(0, &pattern(13, 1 << 20)).unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.max_inflight_per_connection = 1;
    c.transports.tcp.slice_size = 1 << 20;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(len).unwrap();
    let mut ring = init.ring().unwrap();
    for round in 0..4u64 {
        // 63 slices of 1 MiB one at a time: longer than the deadline (10
        // ms: beating it would take 6.3 GB/s through one connection with
        // one slice in flight; 30 ms was beaten on loopback), so it
        // strikes with a slice on the wire. A READ's slice leaves the
        // window when its response header arrives (its payload lands
        // after); a WRITE's is on the wire until the target answers, so
        // the reset finds it there.
        let (l, r) = (
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, remote.addr() + (1 << 20)),
        );
        let (n, at) = (
            len - (1 << 20),
            tent::clock::deadline_after(Duration::from_millis(10)),
        );
        let sqe = if round % 2 == 0 {
            op::Read::new(l, r, n)
                .deadline_ns(at)
                .user_data(round)
                .build()
        } else {
            op::Write::new(l, r, n)
                .deadline_ns(at)
                .user_data(round)
                .build()
        };
        ring.submission().push(sqe).unwrap();
        assert_eq!(
            reap(&mut ring, 1)[0].result(),
            Err(ErrorKind::Timeout),
            "round {round}"
        );
        let until = Instant::now() + Duration::from_secs(5);
        while init.credits_in_flight() != 0 {
            assert!(
                Instant::now() < until,
                "round {round}: {} credits never came back",
                init.credits_in_flight()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The same connection (the only one) moves data again.
        ring.submission()
            .push(op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, remote.addr()),
                1 << 20,
            ))
            .unwrap();
        assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 20), "round {round}");
        let mut got = vec![0u8; 1 << 20];
        local.read(0, &mut got).unwrap();
        assert!(got == pattern(13, 1 << 20), "round {round} data");
        assert_eq!(init.credits_in_flight(), 0);
    }
}

#[test]
fn refused_ops_fail_alone_and_the_connection_goes_on() {
    let target = common::engine();
    let remote = target.allocate_memory(1 << 16).unwrap();
    let init = tcp_initiator();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(1 << 16).unwrap();
    let mut ring = init.ring().unwrap();
    let cases = [
        (remote.addr() + (1 << 16) - 8, 64, ErrorKind::OutOfBounds),
        (
            remote.addr() + (1 << 20),
            64,
            ErrorKind::AddressNotRegistered,
        ),
        (u64::MAX - 8, 64, ErrorKind::OutOfBounds),
    ];
    for (i, (addr, len, want)) in cases.into_iter().enumerate() {
        for write in [false, true] {
            let l = LocalAddr::new(local.id(), 0);
            let r = RemoteAddr::new(seg, addr);
            let sqe = if write {
                op::Write::new(l, r, len).user_data(i as u64).build()
            } else {
                op::Read::new(l, r, len).user_data(i as u64).build()
            };
            ring.submission().push(sqe).unwrap();
            assert_eq!(
                reap(&mut ring, 1)[0].result(),
                Err(want),
                "case {i} write={write}"
            );
        }
        // A good op right after each refusal.
        ring.submission()
            .push(op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, remote.addr()),
                4096,
            ))
            .unwrap();
        assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    }
}

// ---- the data server, spoken to directly -----------------------------

struct Raw(TcpStream);

/// A client hello (no secret on these engines: no proof follows).
fn hello() -> Hello {
    Hello {
        status: 0,
        flags: 0,
        nonce: [7; 32],
        ident: Ident {
            session: [7; 16],
            conn: 1,
        },
    }
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut r = Raw(s);
        r.0.write_all(&hello().encode()).unwrap();
        let mut h = [0u8; HELLO_LEN];
        r.0.read_exact(&mut h).unwrap();
        assert_eq!(Hello::decode(&h).unwrap().status, 0);
        r
    }

    fn request(&mut self, req: Request, payload: &[u8]) -> Response {
        self.0.write_all(&req.encode()).unwrap();
        self.0.write_all(payload).unwrap();
        let mut h = [0u8; RESPONSE_LEN];
        self.0.read_exact(&mut h).unwrap();
        Response::decode(&h).unwrap()
    }

    /// Does the server still answer on this connection? (None = closed)
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }
}

fn served() -> (Engine, tent::Buffer, SocketAddr) {
    let target = common::engine();
    let buf = target.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(1, 1 << 16)).unwrap();
    let addr = target.tcp_data_addr().expect("tcp data server");
    (target, buf, addr)
}

fn req(opcode: Opcode, addr: u64, len: u64, key: u64) -> Request {
    Request {
        opcode,
        seq: 1,
        addr,
        len,
        key,
    }
}

#[test]
fn data_server_checks_key_bounds_and_overflow_per_op() {
    let (_t, buf, addr) = served();
    let mut c = Raw::connect(addr);
    let key = buf.key();
    // Wrong key: refused, payload drained, connection goes on.
    let r = c.request(req(Opcode::Write, buf.addr(), 16, key ^ 1), &[7u8; 16]);
    assert_eq!(r.status, Err(ErrorKind::AccessDenied));
    let r = c.request(req(Opcode::Read, buf.addr(), 16, 0), &[]);
    assert_eq!(r.status, Err(ErrorKind::AccessDenied));
    // u64 wrap, where no region is: no key matches there.
    let r = c.request(req(Opcode::Read, u64::MAX - 4, 16, key), &[]);
    assert_eq!(r.status, Err(ErrorKind::AccessDenied));
    let r = c.request(req(Opcode::Read, buf.addr() + (1 << 16) - 4, 16, key), &[]);
    assert_eq!(r.status, Err(ErrorKind::OutOfBounds));
    // Nowhere: no key can match, and the answer says no more than that.
    let r = c.request(req(Opcode::Read, 4096, 16, key), &[]);
    assert_eq!(r.status, Err(ErrorKind::AccessDenied));
    let r = c.request(req(Opcode::Read, buf.addr(), 0, key), &[]);
    assert_eq!(r.status, Err(ErrorKind::InvalidArgument));
    // And a good one, with its payload.
    let r = c.request(req(Opcode::Read, buf.addr(), 16, key), &[]);
    assert_eq!((r.status, r.len), (Ok(()), 16));
    let mut p = [0u8; 16];
    c.0.read_exact(&mut p).unwrap();
    assert_eq!(&p[..], &pattern(1, 16)[..]);
    // Nothing wrote through the refused WRITE.
    let mut got = vec![0u8; 16];
    buf.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(1, 16));
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let (_t, buf, addr) = served();
    let mut good = Raw::connect(addr);

    // Unknown opcode.
    let mut c = Raw::connect(addr);
    let mut h = req(Opcode::Read, buf.addr(), 16, buf.key()).encode();
    h[2] = 9;
    c.0.write_all(&h).unwrap();
    assert!(c.closed());

    // Length above the limit.
    let mut c = Raw::connect(addr);
    let h = req(Opcode::Write, buf.addr(), 16, buf.key()).encode();
    let mut h2 = h;
    h2[16..24].copy_from_slice(&(MAX_OP_LEN + 1).to_le_bytes());
    c.0.write_all(&h2).unwrap();
    assert!(c.closed());

    // Bad magic.
    let mut c = Raw::connect(addr);
    c.0.write_all(&[0x55u8; REQUEST_LEN]).unwrap();
    assert!(c.closed());

    // Wrong version in the hello.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bad = hello().encode();
    bad[8] = 99;
    s.write_all(&bad).unwrap();
    let mut back = [0u8; HELLO_LEN];
    s.read_exact(&mut back).unwrap();
    assert_eq!(
        Hello::decode(&back).unwrap().status,
        ErrorKind::InvalidArgument.code()
    );
    let mut c = Raw(s);
    assert!(c.closed());

    // Truncated header, then the peer goes away.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello().encode()).unwrap();
    s.write_all(&h[..10]).unwrap();
    drop(s);

    // The first connection never noticed.
    let r = good.request(req(Opcode::Read, buf.addr(), 8, buf.key()), &[]);
    assert_eq!(r.status, Ok(()));
}

#[test]
fn silent_peer_is_dropped_after_the_handshake_timeout() {
    let (_t, buf, addr) = served();
    let mut silent = TcpStream::connect(addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let t = Instant::now();
    let mut b = [0u8; 1];
    assert!(matches!(silent.read(&mut b), Ok(0) | Err(_)));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(12),
        "{waited:?}"
    );
    // Others are served meanwhile and after.
    let mut c = Raw::connect(addr);
    let r = c.request(req(Opcode::Read, buf.addr(), 8, buf.key()), &[]);
    assert_eq!(r.status, Ok(()));
}
