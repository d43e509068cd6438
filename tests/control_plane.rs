//! The control plane: p2p segment names (`ip:port`), descriptor fetch,
//! HMAC challenge-response, and malformed input that closes one connection
//! and disturbs nothing else.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::{pattern, reap, test_config};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, TransportKind, op};

fn engine_with_secret(secret: &str) -> Engine {
    let mut c = test_config();
    c.rpc_shared_secret = secret.into();
    Engine::new(c).unwrap()
}

#[test]
fn open_by_ip_port_fetches_the_descriptor_and_moves_data_over_shm() {
    let target = common::engine();
    let buf = target.allocate_memory(1 << 16).unwrap();
    buf.write(0, &pattern(3, 1 << 16)).unwrap();
    let name = target.segment_name();
    assert!(name.starts_with("127.0.0.1:"), "{name}");

    let init = common::engine();
    let seg = init.open_segment(&name).unwrap();
    assert_eq!(init.open_segment(&name).unwrap(), seg);
    let regions = init.segment_regions(seg).unwrap();
    assert!(
        regions
            .iter()
            .any(|r| r.addr == buf.addr() && r.len == buf.len())
    );

    // Same host: the descriptor names the shm segment, so data moves over shm.
    let local = init.allocate_memory(1 << 16).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, buf.addr()),
                1 << 16,
            )
            .user_data(1),
        )
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Ok(1 << 16));
    assert_eq!(c[0].transport(), TransportKind::Shm);
    let mut out = vec![0u8; 1 << 16];
    local.read(0, &mut out).unwrap();
    assert!(out == pattern(3, 1 << 16));
    // Its own name opens the local segment.
    assert_eq!(target.open_segment(&name).unwrap(), tent::SegmentId::LOCAL);
}

#[test]
fn nobody_listening_is_unreachable() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let e = common::engine();
    assert_eq!(
        e.open_segment(&addr).unwrap_err().kind(),
        ErrorKind::Unreachable
    );
}

#[test]
fn shared_secret_required_and_checked_both_ways() {
    let secret = "0123456789abcdef-tent";
    let target = engine_with_secret(secret);
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.segment_name();

    let none = common::engine();
    let err = none.open_segment(&name).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");

    let wrong = engine_with_secret("fedcba9876543210-tent");
    let err = wrong.open_segment(&name).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");

    let right = engine_with_secret(secret);
    let seg = right.open_segment(&name).unwrap();
    assert!(!right.segment_regions(seg).unwrap().is_empty());

    // A client holding a secret refuses a server that does not authenticate.
    let plain = common::engine();
    let err = right.open_segment(&plain.segment_name()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
}

#[test]
fn the_secret_never_crosses_the_wire() {
    // A fake server that records what a client sends during the handshake.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let secret = "a-secret-of-the-engine-1234";
    let recorder = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut hello = [0u8; 256];
        let n = s.read(&mut hello).unwrap();
        got.extend_from_slice(&hello[..n]);
        // Challenge { nonce, auth_required: true } from the real codec.
        let challenge = tent::control::wire::encode(&tent::control::wire::Message::Challenge {
            nonce: [7; 32],
            auth_required: true,
        });
        s.write_all(&challenge).unwrap();
        let mut rest = [0u8; 256];
        if let Ok(n) = s.read(&mut rest) {
            got.extend_from_slice(&rest[..n]);
        }
        got
    });
    let e = engine_with_secret(secret);
    let _ = e.open_segment(&addr); // fails: the fake server never proves itself
    let sent = recorder.join().unwrap();
    assert!(sent.len() > 40, "client sent its Hello and Auth");
    assert!(
        !sent.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "secret on the wire"
    );
}

#[test]
fn malformed_oversized_truncated_close_only_that_connection() {
    let target = common::engine();
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.segment_name();
    let hold = |bytes: &[u8]| {
        let mut s = TcpStream::connect(&name).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        s
    };
    // Garbage; a valid header announcing a huge body; a truncated header left hanging.
    let mut garbage = hold(b"GET / HTTP/1.1\r\n\r\n");
    let mut huge = Vec::from(*b"TENT");
    huge.extend_from_slice(&1u16.to_le_bytes());
    huge.extend_from_slice(&1u16.to_le_bytes());
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut oversized = hold(&huge);
    let _truncated = hold(b"TEN");
    // While those are open, a well-behaved peer is served.
    let init = common::engine();
    let seg = init.open_segment(&name).unwrap();
    assert!(!init.segment_regions(seg).unwrap().is_empty());
    // The bad connections were closed by the server (EOF, maybe after an Error message).
    for s in [&mut garbage, &mut oversized] {
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        assert!(sink.len() < 2048, "server answered garbage with data");
    }
    // And it still serves afterwards.
    let again = common::engine();
    assert!(again.open_segment(&name).is_ok());
}

/// A TLV frame header: magic, version, type, body length.
fn header(version: u16, kind: u16, len: u32) -> Vec<u8> {
    let mut h = Vec::from(*b"TENT");
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&kind.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

#[test]
fn wrong_version_unknown_type_and_a_silent_peer_are_closed() {
    let target = common::engine();
    let name = target.segment_name();
    let closed = |s: &mut TcpStream| {
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        sink.len() < 2048
    };
    let open = || {
        let s = TcpStream::connect(&name).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s
    };
    let mut v = open();
    v.write_all(&header(99, 1, 0)).unwrap();
    let mut t = open();
    t.write_all(&header(1, 0x7777, 0)).unwrap();
    let mut silent = open();
    let started = std::time::Instant::now();
    assert!(closed(&mut v), "wrong version");
    assert!(closed(&mut t), "unknown type");
    // Meanwhile others are served.
    assert!(common::engine().open_segment(&name).is_ok());
    assert!(closed(&mut silent), "silent peer");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(12),
        "silent peer dropped after {waited:?}"
    );
}

#[test]
fn qp_connect_to_an_engine_without_rdma_is_unreachable_and_says_why() {
    let target = common::engine();
    let e = tent::control::connect_qp(
        &target.segment_name(),
        None,
        Duration::from_secs(5),
        tent::control::wire::QpRequest {
            initiator: tent::control::wire::QpInitiator::new(1, 0, 0).unwrap(),
            initiator_nic: "rxe0".into(),
            target_nic: "rxe0".into(),
            qp: tent::control::wire::QpBootstrap::default(),
            gid_type: None,
        },
    )
    .unwrap_err();
    if tent::transport::rdma::sys::devices().is_err() {
        assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
        assert!(e.to_string().contains("serves no RDMA"), "{e}");
    }
}

/// A connection whose thread panics (here in the descriptor function)
/// gives its slot back and is closed at once: after more such connections
/// than there are slots, every one authenticated (so none would ever be
/// evicted), an honest client is still served.
#[test]
fn control_connections_whose_service_panics_give_their_slots_back() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tent::control::server::{DescriptorFn, MAX_CONNECTIONS};
    use tent::control::{ControlServer, SegmentDescriptor, fetch_descriptor};
    const SECRET: &[u8] = b"0123456789abcdef-tent-panics";
    let panicking = Arc::new(AtomicBool::new(true));
    let server = {
        let panicking = panicking.clone();
        ControlServer::start("127.0.0.1", 0, Some(SECRET.to_vec()), move |addr| {
            let desc = SegmentDescriptor {
                name: addr.to_string(),
                ..Default::default()
            };
            Arc::new(move || {
                if panicking.load(Ordering::Acquire) {
                    panic!("a descriptor function that panics");
                }
                desc.clone()
            }) as Arc<DescriptorFn>
        })
        .unwrap()
    };
    let name = server.local_addr().to_string();
    let panicked: Vec<_> = (0..MAX_CONNECTIONS + 8)
        .map(|_| {
            let name = name.clone();
            std::thread::spawn(move || {
                fetch_descriptor(&name, Some(SECRET), Duration::from_secs(2)).map(|d| d.name)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    panicking.store(false, Ordering::Release);
    let honest = fetch_descriptor(&name, Some(SECRET), Duration::from_secs(3));
    assert_eq!(
        honest.map(|d| d.name).map_err(|e| e.to_string()),
        Ok(name),
        "an honest client after {} connections that panicked",
        panicked.len()
    );
    for (i, r) in panicked.iter().enumerate() {
        let e = r.as_ref().expect_err("answered by a panicking service");
        assert_eq!(
            e.kind(),
            ErrorKind::Unreachable,
            "connection {i}: closed at the panic, not held to the client's timeout: {e}"
        );
    }
}

/// A raw control connection to `name` past its Hello and Challenge (no
/// secret on either side).
fn raw_session(name: &str) -> TcpStream {
    use tent::control::wire::{self, Message};
    let mut s = TcpStream::connect(name).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wire::write_message(&mut s, &Message::Hello { nonce: [1; 32] }).unwrap();
    assert!(matches!(
        wire::read_message(&mut s).unwrap(),
        Message::Challenge {
            auth_required: false,
            ..
        }
    ));
    s
}

#[test]
fn qp_connect_without_the_initiator_record_is_refused_naming_it() {
    use tent::control::wire::{self, Message};
    let target = common::engine();
    let mut s = raw_session(&target.segment_name());
    // What an initiator from before the record sends: NICs and its QP's
    // bootstrap (tags 0x0001..=0x0007), no initiator record (0x0008).
    let mut body = Vec::new();
    let mut field = |tag: u16, v: &[u8]| {
        body.extend_from_slice(&tag.to_le_bytes());
        body.extend_from_slice(&(v.len() as u32).to_le_bytes());
        body.extend_from_slice(v);
    };
    field(1, b"rxe0");
    field(2, b"rxe0");
    field(3, &[0; 16]);
    field(4, &0u16.to_le_bytes());
    for tag in 5..=7 {
        field(tag, &1u32.to_le_bytes());
    }
    let mut old = b"TENT".to_vec();
    old.extend_from_slice(&wire::PROTOCOL_VERSION.to_le_bytes());
    old.extend_from_slice(&8u16.to_le_bytes());
    old.extend_from_slice(&(body.len() as u32).to_le_bytes());
    old.extend_from_slice(&body);
    s.write_all(&old).unwrap();
    // Refused with a typed answer naming the field, not served unkeyed.
    match wire::read_message(&mut s).unwrap() {
        Message::Error { code, text } => {
            assert_eq!(
                ErrorKind::from_code(code),
                Some(ErrorKind::InvalidArgument),
                "{text}"
            );
            assert!(text.contains("0x0008"), "{text}");
        }
        m => panic!("got {m:?}"),
    }
}

#[test]
fn probe_peer_alive_answers_for_the_process_opened_and_not_after_it_is_gone() {
    // Over TCP (no shm) and over shm: the control server answers as the
    // same process while it lives; once the target engine is dropped the
    // probe says no, within its timeout.
    for shm in [false, true] {
        let mut c = test_config();
        c.transports.shm.enable = shm;
        let target = Engine::new(c.clone()).unwrap();
        let init = Engine::new(c).unwrap();
        let seg = init.open_segment(&target.segment_name()).unwrap();
        let t = Duration::from_secs(2);
        assert!(init.probe_peer_alive(seg, t).unwrap(), "shm {shm}");
        assert!(init.probe_peer_alive(tent::SegmentId::LOCAL, t).unwrap());
        let e = init.probe_peer_alive(tent::SegmentId(999), t).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::SegmentNotFound);
        drop(target);
        let start = std::time::Instant::now();
        assert!(!init.probe_peer_alive(seg, t).unwrap(), "shm {shm}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}

#[test]
fn probe_peer_alive_says_no_when_another_process_answers_at_the_address() {
    let target = common::engine();
    let init = common::engine();
    let name = target.segment_name();
    let seg = init.open_segment(&name).unwrap();
    // A different "process" now answers there: a descriptor with another
    // pid (the same engine, its descriptor edited when opened; over TCP,
    // so the segment keeps the descriptor it was opened with).
    let mut c = test_config();
    c.transports.shm.enable = false;
    let other = Engine::new(c).unwrap();
    let forged = other
        .open_segment_edited(&name, |d| d.pid = d.pid.wrapping_add(1))
        .unwrap();
    assert!(init.probe_peer_alive(seg, Duration::from_secs(2)).unwrap());
    assert!(
        !other
            .probe_peer_alive(forged, Duration::from_secs(2))
            .unwrap(),
        "the process answering is not the one opened"
    );
}

/// A peer that finished its handshake and then waits holds a connection
/// thread that can still answer for the engine's memory (descriptors with
/// every region and key; on RDMA, new QPs on its protection domain). Once
/// `Engine` is dropped, nothing of it may answer: the control server cuts
/// and joins every connection thread, not only its accept thread.
#[test]
fn a_connection_held_open_answers_nothing_once_the_engine_is_dropped() {
    use tent::control::wire::{self, Message};
    let target = common::engine();
    let _buf = target.allocate_memory(1 << 16).unwrap();
    let mut s = raw_session(&target.segment_name());
    let started = std::time::Instant::now();
    drop(target);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "drop waited {:?} on an idle connection",
        started.elapsed()
    );
    // The request may or may not be written (the socket is shut); what
    // matters is that no descriptor comes back.
    let _ = wire::write_message(&mut s, &Message::GetDescriptor);
    match wire::read_message(&mut s) {
        Ok(Message::Descriptor(d)) => panic!(
            "a dropped engine answered with its descriptor ({} regions)",
            d.regions.len()
        ),
        Ok(m) => panic!("a dropped engine answered {m:?}"),
        Err(_) => {}
    }
}

/// A server that answers with a valid Challenge dripped a byte at a time
/// (each read succeeds, so a per-read timeout never fires) must not hold
/// the client past its timeout: `open_segment` holds the registry lock,
/// a peer's RDMA connects wait on one connector thread in turn.
#[test]
fn a_server_dripping_its_answer_cannot_stretch_the_client_s_timeout() {
    use tent::control::wire::{self, Message};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = wire::read_message(&mut s);
        let mut frame = Vec::new();
        wire::write_message(
            &mut frame,
            &Message::Challenge {
                nonce: [3; 32],
                auth_required: false,
            },
        )
        .unwrap();
        for b in frame {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        // Then nothing: the client must already have given up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let started = std::time::Instant::now();
    let e = tent::control::fetch_descriptor(&addr.to_string(), None, Duration::from_secs(1))
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(took < Duration::from_secs(2), "gave up after {took:?}");
    server.join().unwrap();
}

/// An owner with 30,000 registered blocks (a KV-cache pool registered block
/// by block) is opened over TCP with every region listed, and a WRITE into
/// the last block lands: the descriptor's regions come in pages. Before,
/// the one descriptor message (1.74 MB at 30,000) passed the 1 MiB limit
/// and every peer refused the segment.
#[test]
fn a_segment_of_thirty_thousand_regions_opens_with_every_region() {
    let target = common::engine();
    let n = 30_000usize;
    let mut mem = vec![0u8; n * 4096];
    let base = mem.as_mut_ptr();
    let ranges: Vec<_> = (0..n)
        .map(|i| (base.wrapping_add(i * 4096), 4096u64))
        .collect();
    // SAFETY: every range lies in `mem`, unregistered below before it drops.
    let bufs = unsafe { target.register_memory_batch(&ranges) }.unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let listed = init.segment_regions(seg).unwrap();
    assert_eq!(listed.len(), n);
    assert!(listed.windows(2).all(|w| w[0].addr < w[1].addr));
    let src = init.allocate_memory(4096).unwrap();
    let data = pattern(9, 4096);
    src.write(0, &data).unwrap();
    let last = base as u64 + (n as u64 - 1) * 4096;
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(seg, last),
                4096,
            )
            .user_data(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    drop(init);
    let ids: Vec<_> = bufs.iter().map(|b| b.id()).collect();
    target.unregister_memory_batch(&ids).unwrap();
    assert_eq!(&mem[(n - 1) * 4096..], &data[..]);
}

/// A hostile owner's pages are checked as they come: one that goes back
/// before the address asked for, or says more follow while listing none,
/// is a protocol violation and the descriptor is refused (InvalidArgument)
/// rather than paged forever.
#[test]
fn region_pages_that_go_back_or_stand_still_are_refused() {
    use std::sync::Arc;
    use tent::control::server::{DescriptorFn, Services};
    use tent::control::wire::{RegionEntry, RegionsPage};
    use tent::control::{ControlServer, SegmentDescriptor, fetch_descriptor};
    type Page = fn(u64) -> RegionsPage;
    let cases: [(&str, Page); 3] = [
        ("goes back", |_| RegionsPage {
            version: 1,
            regions: vec![entry_at(0x10)],
            from: None,
        }),
        ("stands still", |from| RegionsPage {
            version: 1,
            regions: Vec::new(),
            from: Some(from + 1),
        }),
        ("honest", |from| RegionsPage {
            version: 1,
            regions: vec![entry_at(from)],
            from: (from < 0x5000).then_some(from + 0x1000),
        }),
    ];
    fn entry_at(addr: u64) -> RegionEntry {
        RegionEntry {
            id: 1,
            addr,
            len: 16,
            key: 7,
            rkeys: Vec::new(),
            mr_step: None,
            chunk_rkeys: Vec::new(),
        }
    }
    for (what, page) in cases {
        let first = entry_at(0x1000);
        let server = ControlServer::start_with(
            "127.0.0.1",
            0,
            None,
            move |addr| {
                let desc = SegmentDescriptor {
                    name: addr.to_string(),
                    regions: vec![first.clone()],
                    regions_from: Some(0x2000),
                    ..Default::default()
                };
                Arc::new(move || desc.clone()) as Arc<DescriptorFn>
            },
            Services {
                regions: Some(Arc::new(page)),
                ..Default::default()
            },
        )
        .unwrap();
        let got = fetch_descriptor(
            &server.local_addr().to_string(),
            None,
            Duration::from_secs(5),
        );
        if what == "honest" {
            let d = got.unwrap();
            let addrs: Vec<_> = d.regions.iter().map(|r| r.addr).collect();
            assert_eq!(addrs, [0x1000, 0x2000, 0x3000, 0x4000, 0x5000]);
            assert_eq!(d.regions_from, None);
        } else {
            let e = got.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{what}: {e}");
            assert!(e.to_string().contains("protocol violation"), "{what}: {e}");
        }
    }
}
