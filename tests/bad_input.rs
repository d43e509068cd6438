//! Bad input gets a typed error, loses nothing, and never disturbs a valid
//! operation running beside it.

mod common;

use std::time::Duration;

use common::{engine, pattern, reap, test_config};
use tent::{
    Buffer, Config, Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, Sqe, TaskState, op,
};

/// Push `bad` and a valid 64 KiB write side by side; return `bad`'s result
/// after checking the valid one landed intact and every credit came back.
fn beside_valid(e: &Engine, bad: Sqe) -> Result<u64, ErrorKind> {
    let src = e.allocate_memory(1 << 16).unwrap();
    let dst = e.allocate_memory(1 << 16).unwrap();
    let data = pattern(42, 1 << 16);
    src.write(0, &data).unwrap();
    let mut ring = e.ring().unwrap();
    {
        let mut sq = ring.submission();
        sq.push(bad.with_user_data(1)).unwrap();
        sq.push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                1 << 16,
            )
            .user_data(2),
        )
        .unwrap();
    }
    let c = reap(&mut ring, 2);
    let valid = c.iter().find(|c| c.user_data() == 2).unwrap();
    assert_eq!(valid.result(), Ok(1 << 16));
    let mut out = vec![0u8; 1 << 16];
    dst.read(0, &mut out).unwrap();
    assert!(out == data, "valid op's data corrupted");
    assert_eq!(e.credits_in_flight(), 0);
    c.iter().find(|c| c.user_data() == 1).unwrap().result()
}

fn buf(e: &Engine, len: u64) -> Buffer {
    e.allocate_memory(len).unwrap()
}

#[test]
fn zero_length() {
    let e = engine();
    let b = buf(&e, 64);
    let bad = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        0,
    )
    .build();
    assert_eq!(beside_valid(&e, bad), Err(ErrorKind::InvalidArgument));
    assert_eq!(
        e.allocate_memory(0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn offset_plus_length_past_the_region() {
    let e = engine();
    let b = buf(&e, 4096);
    let local_oob = op::Write::new(
        LocalAddr::new(b.id(), 4000),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        200,
    )
    .build();
    assert_eq!(beside_valid(&e, local_oob), Err(ErrorKind::OutOfBounds));
    let wrap = op::Write::new(
        LocalAddr::new(b.id(), u64::MAX - 1),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        8,
    )
    .build();
    assert_eq!(beside_valid(&e, wrap), Err(ErrorKind::OutOfBounds));
    let remote_oob = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr() + 4000),
        200,
    )
    .build();
    assert_eq!(beside_valid(&e, remote_oob), Err(ErrorKind::OutOfBounds));
}

#[test]
fn unregistered_source_and_target() {
    let e = engine();
    let b = buf(&e, 4096);
    let no_region = op::Write::new(
        LocalAddr::new(tent::RegionId(77), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        8,
    )
    .build();
    assert_eq!(
        beside_valid(&e, no_region),
        Err(ErrorKind::AddressNotRegistered)
    );
    let mut heap = vec![0u8; 64];
    let no_target = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, heap.as_mut_ptr() as u64),
        8,
    )
    .build();
    assert_eq!(
        beside_valid(&e, no_target),
        Err(ErrorKind::AddressNotRegistered)
    );
    let gone = buf(&e, 64);
    e.unregister_memory(gone.id()).unwrap();
    let after_unregister = op::Write::new(
        LocalAddr::new(gone.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        8,
    )
    .build();
    assert_eq!(
        beside_valid(&e, after_unregister),
        Err(ErrorKind::AddressNotRegistered)
    );
    assert_eq!(
        e.unregister_memory(gone.id()).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
}

#[test]
fn wrong_key_over_shm() {
    // Target and initiator engines; the initiator reaches the target only
    // through the exported segment (the shm transport), as another process would.
    let target = engine();
    let exported = buf(&target, 1 << 16);
    let revoked = buf(&target, 1 << 16);
    let init = engine();
    let seg = init
        .open_segment(target.local_segment_name().unwrap())
        .unwrap();
    let peer = init.segment_peer(seg).unwrap();
    let key = peer.key_of(exported.addr()).expect("region listed");
    assert_eq!(peer.check_key(exported.addr(), 64, key), Ok(()));
    assert_eq!(
        peer.check_key(exported.addr(), 64, key ^ 0x5a5a),
        Err(ErrorKind::AccessDenied)
    );
    assert_eq!(
        peer.check_key(exported.addr(), 64, 0),
        Err(ErrorKind::AccessDenied)
    );

    let src = buf(&init, 4096);
    let w =
        |addr| op::Write::new(LocalAddr::new(src.id(), 0), RemoteAddr::new(seg, addr), 64).build();
    assert_eq!(beside_valid(&init, w(exported.addr())), Ok(64));
    assert_eq!(
        beside_valid(&init, w(exported.addr() + (1 << 16) - 8)),
        Err(ErrorKind::OutOfBounds)
    );

    // The key the initiator holds no longer matches the region's live key,
    // while the descriptor still lists it: AccessDenied. The live key is a
    // word of the owner's write-sealed descriptor, which only the owner
    // writes (the test plays it).
    target
        .shm_export()
        .unwrap()
        .forge_live_key(exported.id(), key ^ 0xdead_beef);
    assert_eq!(
        beside_valid(&init, w(exported.addr())),
        Err(ErrorKind::AccessDenied)
    );

    // Withdrawn by the target: the initiator re-reads the descriptor and the
    // address names nothing any more.
    assert!(peer.key_of(revoked.addr()).is_some());
    target.unregister_memory(revoked.id()).unwrap();
    assert_eq!(
        beside_valid(&init, w(revoked.addr())),
        Err(ErrorKind::AddressNotRegistered)
    );
}

#[test]
fn unknown_segment() {
    let e = engine();
    let b = buf(&e, 64);
    let bad = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId(99), 0),
        8,
    )
    .build();
    assert_eq!(beside_valid(&e, bad), Err(ErrorKind::SegmentNotFound));
    assert_eq!(
        e.open_segment("tent-no-such-segment").unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
    assert_eq!(
        e.open_segment("../etc/passwd").unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        e.close_segment(SegmentId(99)).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
}

#[test]
fn batch_overflow_queues_nothing() {
    let e = engine();
    let src = buf(&e, 4096);
    let dst = buf(&e, 4096);
    src.write(0, &pattern(9, 4096)).unwrap();
    let b = e.allocate_batch(2).unwrap();
    let w = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
        4096,
    )
    .build();
    let err = e.submit(b, &[w, w, w]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("overflow"), "{err}");
    assert!(
        e.status_list(b).unwrap().is_empty(),
        "nothing of the refused submit was queued"
    );
    e.submit(b, &[w]).unwrap();
    assert_eq!(
        e.wait_batch(b, Duration::from_secs(10)).unwrap().state,
        TaskState::Completed
    );
    let mut out = vec![0u8; 4096];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out, pattern(9, 4096));
    assert_eq!(
        e.allocate_batch(0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    e.free_batch(b).unwrap();
    assert_eq!(e.credits_in_flight(), 0);
}

#[test]
fn batch_invalid_request_is_invalid_state() {
    let e = engine();
    let b = buf(&e, 64);
    let id = e.allocate_batch(2).unwrap();
    let bad = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr()),
        0,
    )
    .build();
    let good = op::Write::new(
        LocalAddr::new(b.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, b.addr() + 32),
        8,
    )
    .build();
    e.submit(id, &[bad, good]).unwrap();
    e.wait_batch(id, Duration::from_secs(10)).unwrap();
    let s = e.status_list(id).unwrap();
    assert_eq!(
        (s[0].state, s[0].error),
        (TaskState::Invalid, Some(ErrorKind::InvalidArgument))
    );
    assert_eq!(s[1].state, TaskState::Completed);
    e.free_batch(id).unwrap();
}

#[test]
fn double_free_of_a_batch() {
    let e = engine();
    let b = e.allocate_batch(1).unwrap();
    e.free_batch(b).unwrap();
    let err = e.free_batch(b).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("double free"), "{err}");
    assert_eq!(
        e.status(b, 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        e.submit(b, &[]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // The engine still works.
    let m = buf(&e, 64);
    let ok = op::Write::new(
        LocalAddr::new(m.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
        8,
    )
    .build();
    assert_eq!(beside_valid(&e, ok), Ok(8));
}

#[test]
fn config_with_an_unknown_key() {
    let err =
        Config::from_json_str(r#"{"workers": {"count": 1, "cuont": 2}}"#, "test.json").unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("workers/cuont") && msg.contains("test.json"),
        "{msg}"
    );
    let e: tent::Error = err.into();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let err = Config::from_json_str(r#"{"block_size": "big"}"#, "test.json").unwrap_err();
    assert!(err.to_string().contains("block_size"), "{err}");
    // An engine from a good config still runs ops.
    let e = Engine::new(test_config()).unwrap();
    let m = buf(&e, 64);
    let ok = op::Write::new(
        LocalAddr::new(m.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
        8,
    )
    .build();
    assert_eq!(beside_valid(&e, ok), Ok(8));
}

#[test]
fn shared_region_with_a_wrong_header() {
    let e = engine();
    let name = format!("tent-badheader-{}", std::process::id());
    let path = format!("/dev/shm/{name}");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    let err = e.open_segment(&name).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let text = format!("{err}");
    assert!(text.contains("not a tent segment socket"), "{text}");
    let m = buf(&e, 64);
    let ok = op::Write::new(
        LocalAddr::new(m.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, m.addr() + 8),
        8,
    )
    .build();
    assert_eq!(beside_valid(&e, ok), Ok(8));
}

#[test]
fn malformed_sqe_bytes() {
    let e = engine();
    let m = buf(&e, 64);
    // An SQE whose opcode byte is garbage (as could arrive through a ring in shared memory).
    let mut raw: [u8; 64] = unsafe_bytes(
        op::Write::new(
            LocalAddr::new(m.id(), 0),
            RemoteAddr::new(SegmentId::LOCAL, m.addr()),
            8,
        )
        .build(),
    );
    raw[56] = 0xee;
    let bad = from_bytes(raw);
    assert_eq!(bad.opcode(), None);
    assert_eq!(beside_valid(&e, bad), Err(ErrorKind::InvalidArgument));
}

fn unsafe_bytes(s: Sqe) -> [u8; 64] {
    // SAFETY: Sqe is 64 bytes of plain integers (size asserted in tent-rings).
    unsafe { std::mem::transmute::<Sqe, [u8; 64]>(s) }
}

fn from_bytes(b: [u8; 64]) -> Sqe {
    // SAFETY: every bit pattern is a valid Sqe (plain integers); accessors validate.
    unsafe { std::mem::transmute::<[u8; 64], Sqe>(b) }
}

/// `sqe` with byte `at` of its 64-byte wire form replaced by `v`.
fn with_byte(sqe: Sqe, at: usize, v: u8) -> Sqe {
    let mut raw = unsafe_bytes(sqe);
    raw[at] = v;
    from_bytes(raw)
}

/// Wire offsets (see `tent_rings::entry`): flags at 58, reserved 60..64.
const FLAGS_AT: usize = 58;
const RESERVED: std::ops::Range<usize> = 60..64;

fn small_write(src: &Buffer, dst: &Buffer) -> Sqe {
    op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
        64,
    )
    .build()
}

#[test]
fn unknown_flags_and_reserved_bytes_are_refused() {
    let e = engine();
    let (src, dst) = (buf(&e, 64), buf(&e, 64));
    let good = small_write(&src, &dst);
    assert_eq!(with_byte(good, FLAGS_AT, good.flags()), good);
    let mut bad = Vec::new();
    for bit in 1..8 {
        bad.push((
            format!("flag bit {bit}"),
            with_byte(good, FLAGS_AT, 1 << bit),
        ));
    }
    for at in RESERVED {
        bad.push((format!("reserved byte {at}"), with_byte(good, at, 0x80)));
    }
    for (what, sqe) in &bad {
        assert_eq!(
            beside_valid(&e, *sqe),
            Err(ErrorKind::InvalidArgument),
            "{what}"
        );
    }
    // The known flag still works, and a normal SQE still completes.
    assert_eq!(
        beside_valid(&e, with_byte(good, FLAGS_AT, tent_rings_no_failover())),
        Ok(64)
    );
    assert_eq!(beside_valid(&e, good), Ok(64));
    // The batch API reports the same requests Invalid.
    let b = e.allocate_batch(bad.len() + 1).unwrap();
    let mut reqs: Vec<Sqe> = bad.iter().map(|(_, s)| *s).collect();
    reqs.push(good);
    e.submit(b, &reqs).unwrap();
    e.wait_batch(b, Duration::from_secs(20)).unwrap();
    for (i, (what, _)) in bad.iter().enumerate() {
        let s = e.status(b, i).unwrap();
        assert_eq!(
            (s.state, s.error),
            (TaskState::Invalid, Some(ErrorKind::InvalidArgument)),
            "{what}"
        );
    }
    assert_eq!(e.status(b, bad.len()).unwrap().state, TaskState::Completed);
    e.free_batch(b).unwrap();
}

fn tent_rings_no_failover() -> u8 {
    op::Write::new(
        LocalAddr::new(Default::default(), 0),
        RemoteAddr::new(SegmentId::LOCAL, 0),
        1,
    )
    .no_failover(true)
    .build()
    .flags()
}

/// `Engine::local_addr` (what the bindings use to turn a raw address into
/// a region and offset) answers only for ranges wholly inside one region.
#[test]
fn local_addr_finds_the_region_holding_a_range_and_refuses_the_rest() {
    let e = engine();
    let a = buf(&e, 4096);
    let b = buf(&e, 8192);
    assert_eq!(
        e.local_addr(b.addr() + 100, 8092).unwrap(),
        LocalAddr::new(b.id(), 100)
    );
    assert_eq!(
        e.local_addr(a.addr(), 1).unwrap(),
        LocalAddr::new(a.id(), 0)
    );
    let kind = |addr: u64, len: u64| e.local_addr(addr, len).unwrap_err().kind();
    assert_eq!(kind(a.addr(), 0), ErrorKind::InvalidArgument);
    assert_eq!(kind(a.addr() + 4000, 97), ErrorKind::OutOfBounds);
    assert_eq!(kind(a.addr() + 1, u64::MAX), ErrorKind::OutOfBounds);
    assert_eq!(kind(8, 8), ErrorKind::AddressNotRegistered);
    e.unregister_memory(a.id()).unwrap();
    assert_eq!(kind(a.addr(), 1), ErrorKind::AddressNotRegistered);
}

/// Fixed: `Config`'s fields are public, and a configuration built in code
/// skipped the checks a file gets: `workers/count` 0 built an engine whose
/// first `ring()` divided by zero, `block_size` 0 a worker that spun on
/// zero-byte slices (and a drop that never returned). `Engine::new` now
/// checks it as a file's is.
#[test]
fn a_config_built_in_code_is_checked_as_a_file_is() {
    let mut c = test_config();
    c.workers.count = 0;
    let e = Engine::new(c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("workers/count"), "{e}");
    let mut c = test_config();
    c.block_size = 0;
    let e = Engine::new(c).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // And one in range builds.
    assert!(Engine::new(test_config()).is_ok());
}

/// Ids carry the issuing engine's incarnation: a region, segment or batch
/// id of engine A given to engine B names nothing there (each engine
/// counts from 1, so before, A's first region was B's first region: a
/// WRITE from it moved B's memory and completed Ok(4096), B unregistered
/// its own region, and A's batch id read B's batch).
#[test]
fn an_id_from_another_engine_names_nothing_here() {
    let target = engine();
    let dst = target.allocate_memory(4096).unwrap();
    let (a, b) = (engine(), engine());
    let ra = a.allocate_memory(4096).unwrap();
    let rb = b.allocate_memory(4096).unwrap();
    let seg_a = a.open_segment(&target.segment_name()).unwrap();
    let seg_b = b.open_segment(&target.segment_name()).unwrap();
    assert_ne!(ra.id(), rb.id());
    assert_ne!(seg_a, seg_b);
    let mut ring = b.ring().unwrap();
    let write = |local: LocalAddr, seg: SegmentId| {
        op::Write::new(local, RemoteAddr::new(seg, dst.addr()), 4096).build()
    };
    // A's region as the source, B's segment: refused, nothing moved.
    ring.submission()
        .push(write(LocalAddr::new(ra.id(), 0), seg_b).with_user_data(1))
        .unwrap();
    assert_eq!(
        reap(&mut ring, 1)[0].result(),
        Err(ErrorKind::AddressNotRegistered)
    );
    // B's region, A's segment.
    ring.submission()
        .push(write(LocalAddr::new(rb.id(), 0), seg_a).with_user_data(2))
        .unwrap();
    assert_eq!(
        reap(&mut ring, 1)[0].result(),
        Err(ErrorKind::SegmentNotFound)
    );
    // The same from the API: nothing of B's is touched.
    assert_eq!(
        b.unregister_memory(ra.id()).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    assert_eq!(
        b.close_segment(seg_a).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
    assert_eq!(
        b.segment_regions(seg_a).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
    let batch_a = a.allocate_batch(1).unwrap();
    let batch_b = b.allocate_batch(1).unwrap();
    assert_ne!(batch_a, batch_b);
    assert_eq!(
        b.batch_status(batch_a).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        b.free_batch(batch_a).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // B's own ids still work.
    ring.submission()
        .push(write(LocalAddr::new(rb.id(), 0), seg_b).with_user_data(3))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    b.free_batch(batch_b).unwrap();
    b.unregister_memory(rb.id()).unwrap();
}
