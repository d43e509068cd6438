//! Engines finding each other through a real etcd (`metadata_type:
//! "etcd"`): verified data between two engines, etcd down at start, lost
//! and returning, a leaving engine seen at once, and records forged in the
//! store refused typed.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::control::etcd::test_server::EtcdServer;
use tent::control::wire::{self, Message, SegmentDescriptor};
use tent::{Config, Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, op};

const LEN: u64 = 256 << 10;

fn config(etcd: &EtcdServer, name: &str) -> Config {
    let mut c = test_config();
    // Over TCP: through shm the same-host peer would not need the network.
    c.transports.shm.enable = false;
    c.metadata_type = tent::config::MetadataType::Etcd;
    c.metadata_servers = vec![etcd.endpoint()];
    c.metadata_segment_name = name.to_owned();
    c.metadata_lease_ttl_secs = Duration::from_secs(2);
    c
}

/// A WRITE of `data` to `at`, then a READ back: the bytes read.
fn write_read(e: &Engine, seg: SegmentId, at: u64, data: &[u8]) -> Result<Vec<u8>, ErrorKind> {
    let len = data.len() as u64;
    let src = e.allocate_memory(len).unwrap();
    let dst = e.allocate_memory(len).unwrap();
    src.write(0, data).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(LocalAddr::new(src.id(), 0), RemoteAddr::new(seg, at), len).user_data(1),
        )
        .unwrap();
    reap(&mut ring, 1)[0].result()?;
    ring.submission()
        .push(
            op::Read::new(LocalAddr::new(dst.id(), 0), RemoteAddr::new(seg, at), len).user_data(2),
        )
        .unwrap();
    reap(&mut ring, 1)[0].result()?;
    let mut out = vec![0u8; data.len()];
    dst.read(0, &mut out).unwrap();
    Ok(out)
}

#[test]
fn two_engines_through_a_local_etcd_move_verified_data() {
    let etcd = EtcdServer::start();
    let target = Engine::new(config(&etcd, "prefill-0")).unwrap();
    assert_eq!(target.segment_name(), "prefill-0");
    let buf = target.allocate_memory(LEN).unwrap();
    let init = Engine::new(config(&etcd, "decode-0")).unwrap();
    let seg = init.open_segment("prefill-0").unwrap();
    assert_eq!(
        init.open_segment("prefill-0").unwrap(),
        seg,
        "one name, one id"
    );
    let data = pattern(7, LEN as usize);
    assert_eq!(write_read(&init, seg, buf.addr(), &data).unwrap(), data);
    let mut landed = vec![0u8; LEN as usize];
    buf.read(0, &mut landed).unwrap();
    assert_eq!(landed, data);
    // Its own name is itself; a name nobody published is not found.
    assert_eq!(init.open_segment("decode-0").unwrap(), SegmentId::LOCAL);
    let missing = init.open_segment("nobody").unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::SegmentNotFound, "{missing}");
}

#[test]
fn an_engine_named_by_its_address_is_found_through_etcd_and_directly() {
    let etcd = EtcdServer::start();
    let target = Engine::new(config(&etcd, "")).unwrap();
    let name = target.segment_name();
    assert!(name.parse::<std::net::SocketAddr>().is_ok(), "{name}");
    let buf = target.allocate_memory(LEN).unwrap();
    let init = Engine::new(config(&etcd, "")).unwrap();
    let seg = init.open_segment(&name).unwrap();
    let data = pattern(3, 4096);
    assert_eq!(write_read(&init, seg, buf.addr(), &data).unwrap(), data);
}

#[test]
fn etcd_down_at_start_is_an_error_naming_the_endpoints() {
    let mut etcd = EtcdServer::start();
    let c = config(&etcd, "lonely");
    etcd.kill();
    let t0 = Instant::now();
    let err = Engine::new(c).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unreachable, "{err}");
    let text = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(text.contains(&etcd.endpoint()), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn etcd_lost_keeps_open_segments_serving_and_everything_recovers_when_it_returns() {
    let mut etcd = EtcdServer::start();
    let a = Engine::new(config(&etcd, "a")).unwrap();
    let a_buf = a.allocate_memory(LEN).unwrap();
    let c = Engine::new(config(&etcd, "c")).unwrap();
    let c_buf = c.allocate_memory(LEN).unwrap();
    let b = Engine::new(config(&etcd, "b")).unwrap();
    let seg_a = b.open_segment("a").unwrap();

    etcd.kill();
    // Past the lease TTL: nothing on the data path needs etcd.
    std::thread::sleep(Duration::from_secs(3));
    let data = pattern(5, 8192);
    assert_eq!(write_read(&b, seg_a, a_buf.addr(), &data).unwrap(), data);
    let lost = b.open_segment("c").unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::Unreachable, "{lost}");
    assert!(lost.to_string().contains(&etcd.endpoint()), "{lost}");

    etcd.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    let seg_c = loop {
        match b.open_segment("c") {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "c never opened again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(write_read(&b, seg_c, c_buf.addr(), &data).unwrap(), data);
    // Every engine's record is back (republished if its lease lapsed).
    let client = etcd.client();
    let deadline = Instant::now() + Duration::from_secs(15);
    for name in ["a", "b", "c"] {
        let key = format!("/tent/segments/{name}");
        while client.get(key.as_bytes()).unwrap().is_none() {
            assert!(Instant::now() < deadline, "{name}'s record never came back");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // And the segment opened before the outage still serves.
    assert_eq!(write_read(&b, seg_a, a_buf.addr(), &data).unwrap(), data);
}

#[test]
fn an_engine_that_leaves_is_seen_gone_at_once_not_a_ttl_later() {
    let etcd = EtcdServer::start();
    let mut ca = config(&etcd, "leaving");
    ca.metadata_lease_ttl_secs = Duration::from_secs(30);
    let a = Engine::new(ca).unwrap();
    let a_buf = a.allocate_memory(LEN).unwrap();
    let b = Engine::new(config(&etcd, "staying")).unwrap();
    let seg = b.open_segment("leaving").unwrap();
    let at = a_buf.addr();
    assert!(write_read(&b, seg, at, &[1; 64]).is_ok());
    drop(a_buf);
    let t0 = Instant::now();
    drop(a);
    // Its lease was revoked: its record is gone at once.
    let client = etcd.client();
    assert_eq!(client.get(b"/tent/segments/leaving").unwrap(), None);
    let deadline = t0 + Duration::from_secs(5);
    loop {
        match write_read(&b, seg, at, &[2; 64]) {
            Err(ErrorKind::ProcessFailed) => break,
            other => assert!(
                Instant::now() < deadline,
                "requests to a departed peer still end {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The record `name` published, as the store holds it.
fn record_of(etcd: &EtcdServer, name: &str) -> SegmentDescriptor {
    let (value, _) = etcd
        .client()
        .get(format!("/tent/segments/{name}").as_bytes())
        .unwrap()
        .expect("a record");
    match wire::decode(&value).unwrap().0 {
        Message::Descriptor(d) => d,
        other => panic!("{other:?}"),
    }
}

#[test]
fn records_forged_in_the_store_are_refused_typed() {
    let etcd = EtcdServer::start();
    let honest = Engine::new(config(&etcd, "honest")).unwrap();
    let _buf = honest.allocate_memory(LEN).unwrap();
    let init = Engine::new(config(&etcd, "init")).unwrap();
    let client = etcd.client();

    // Not a record at all.
    client
        .put(b"/tent/segments/junk", b"{\"name\":\"10.0.0.1:1\"}", None)
        .unwrap();
    let e = init.open_segment("junk").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");

    // The honest engine's record copied under another name.
    let copied = wire::encode(&Message::Descriptor(record_of(&etcd, "honest")));
    client.put(b"/tent/segments/copied", &copied, None).unwrap();
    let e = init.open_segment("copied").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");

    // Well formed, naming itself, but pointing at the honest engine: the
    // engine reached calls itself otherwise.
    let mut forged = record_of(&etcd, "honest");
    forged.published_as = Some("forged".into());
    client
        .put(
            b"/tent/segments/forged",
            &wire::encode(&Message::Descriptor(forged)),
            None,
        )
        .unwrap();
    let e = init.open_segment("forged").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AccessDenied, "{e}");

    // None of it opened anything, and the honest name still works.
    let seg = init.open_segment("honest").unwrap();
    assert!(init.segment_regions(seg).unwrap().len() == 1);
}

#[test]
fn engines_reach_an_etcd_that_wants_tls_and_a_client_certificate() {
    let dir = std::env::temp_dir().join(format!("tent-etcd-tls-{}", std::process::id()));
    let tls = tent::control::etcd::test_server::TlsFiles::make(&dir);
    let etcd = EtcdServer::start_tls(&tls);
    assert!(etcd.endpoint().starts_with("https://"));
    let secure = |name: &str| {
        let mut c = config(&etcd, name);
        c.metadata_tls_ca_file = tls.ca.display().to_string();
        c.metadata_tls_cert_file = tls.client_cert.display().to_string();
        c.metadata_tls_key_file = tls.client_key.display().to_string();
        c
    };
    let target = Engine::new(secure("tls-target")).unwrap();
    let buf = target.allocate_memory(LEN).unwrap();
    let init = Engine::new(secure("tls-init")).unwrap();
    let seg = init.open_segment("tls-target").unwrap();
    let data = pattern(11, 8192);
    assert_eq!(write_read(&init, seg, buf.addr(), &data).unwrap(), data);

    // No client certificate: etcd refuses the handshake.
    let mut anonymous = secure("anonymous");
    anonymous.metadata_tls_cert_file.clear();
    anonymous.metadata_tls_key_file.clear();
    let e = Engine::new(anonymous).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    // Not the CA that signed etcd's certificate: etcd is not trusted.
    let mut untrusting = secure("untrusting");
    untrusting.metadata_tls_ca_file.clear();
    let e = Engine::new(untrusting).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    // A key without its certificate is a configuration error.
    let mut half = secure("half");
    half.metadata_tls_cert_file.clear();
    let e = Engine::new(half).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_name_held_by_a_live_engine_is_refused_to_a_second() {
    let etcd = EtcdServer::start();
    let _first = Engine::new(config(&etcd, "unique")).unwrap();
    let e = Engine::new(config(&etcd, "unique")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("held by a live engine"), "{e}");
}

#[test]
fn a_record_deleted_or_overwritten_by_someone_else_is_put_back_and_its_peers_keep_serving() {
    let etcd = EtcdServer::start();
    let owner = Engine::new(config(&etcd, "owner")).unwrap();
    let buf = owner.allocate_memory(LEN).unwrap();
    let init = Engine::new(config(&etcd, "user")).unwrap();
    let seg = init.open_segment("owner").unwrap();
    let honest = wire::encode(&Message::Descriptor(record_of(&etcd, "owner")));
    let client = etcd.client();

    // Overwritten with another incarnation at an address where nothing
    // answers: nothing proves to be that process, so the open segment is
    // left as it is, and the owner puts its record back.
    let mut rogue = record_of(&etcd, "owner");
    rogue.incarnation ^= 1;
    rogue.name = "127.0.0.1:1".into();
    client
        .put(
            b"/tent/segments/owner",
            &wire::encode(&Message::Descriptor(rogue)),
            None,
        )
        .unwrap();
    let data = pattern(4, 4096);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        assert_eq!(write_read(&init, seg, buf.addr(), &data).unwrap(), data);
        let (now, _) = client.get(b"/tent/segments/owner").unwrap().unwrap();
        if now == honest {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the owner never put its record back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Deleted: it comes back too.
    assert!(client.delete(b"/tent/segments/owner").unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.get(b"/tent/segments/owner").unwrap().map(|(v, _)| v) != Some(honest.clone()) {
        assert!(
            Instant::now() < deadline,
            "the owner never put its deleted record back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The peer saw it gone meanwhile (the store speaks for liveness) and
    // reaches it again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while write_read(&init, seg, buf.addr(), &data) != Ok(data.clone()) {
        assert!(Instant::now() < deadline, "the owner was not reached again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_live_engines_given_one_name_do_not_fight_over_it() {
    let etcd = EtcdServer::start();
    let mut ca = config(&etcd, "dup");
    ca.metadata_lease_ttl_secs = Duration::from_secs(6);
    let _a = Engine::new(ca.clone()).unwrap();
    let client = etcd.client();
    // The name comes free for a moment (say A's lease lapsed while etcd
    // was away) and B takes it; A is alive and renews every 2 s.
    assert!(client.delete(b"/tent/segments/dup").unwrap());
    let _b = Engine::new(ca).unwrap();
    let b = record_of(&etcd, "dup");
    let until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < until {
        assert_eq!(
            record_of(&etcd, "dup"),
            b,
            "A took the name back from a live B"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
