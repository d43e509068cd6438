//! Unregister means gone: once `unregister_memory` returns, no thread of
//! the engine touches the region again and a peer holding its key is
//! refused; while ops on it are in flight the call waits for them (bounded
//! by their deadlines), and new requests naming it fail at once.
//! (The RDMA half, a remote WRITE with the old rkey, runs in the Soft-RoCE
//! guest: `rxe_unregister_*` in `tests/rxe_verbs.rs`.)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::held::Held;
use common::{pattern, reap, test_config};
use tent::transport::tcp::frame::{
    HELLO_LEN, Hello, Ident, REQUEST_LEN, RESPONSE_LEN, Request, Response,
};
use tent::{Engine, ErrorKind, LocalAddr, Opcode, RemoteAddr, SegmentId, TransportKind, op};

fn write(local: &tent::Buffer, seg: SegmentId, remote: u64, len: u64) -> tent::Sqe {
    op::Write::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, remote),
        len,
    )
    .build()
}

fn read(local: &tent::Buffer, seg: SegmentId, remote: u64, len: u64) -> tent::Sqe {
    op::Read::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, remote),
        len,
    )
    .build()
}

/// Run one op through `ring` and return its result.
fn one(ring: &mut tent::Ring, sqe: tent::Sqe) -> Result<u64, ErrorKind> {
    ring.submission().push(sqe).unwrap();
    reap(ring, 1)[0].result()
}

fn contents(b: &tent::Buffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len() as usize];
    b.read(0, &mut v).unwrap();
    v
}

#[test]
fn a_tcp_peer_holding_the_key_is_refused_after_unregister_and_moves_no_byte() {
    let target = common::engine();
    let len = 1u64 << 16;
    let region = target.allocate_memory(len).unwrap();
    region.write(0, &pattern(1, len as usize)).unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let local = init.allocate_memory(len).unwrap();
    local.write(0, &pattern(9, len as usize)).unwrap();
    let mut ring = init.ring().unwrap();
    // The key works before.
    assert_eq!(
        one(&mut ring, read(&local, seg, region.addr(), len)),
        Ok(len)
    );
    assert_eq!(contents(&local), pattern(1, len as usize));
    local.write(0, &pattern(9, len as usize)).unwrap();

    target.unregister_memory(region.id()).unwrap();
    // The initiator's descriptor still lists the region with its key; the
    // target refuses it, and the memory (still allocated: `region` is held)
    // is not touched.
    assert_eq!(
        one(&mut ring, write(&local, seg, region.addr(), len)),
        Err(ErrorKind::AccessDenied)
    );
    assert_eq!(
        one(&mut ring, read(&local, seg, region.addr(), len)),
        Err(ErrorKind::AccessDenied)
    );
    assert_eq!(contents(&region), pattern(1, len as usize), "no byte moved");
    assert_eq!(contents(&local), pattern(9, len as usize), "no byte read");
}

#[test]
fn an_shm_peer_holding_the_key_is_refused_after_unregister_and_moves_no_byte() {
    let target = common::engine();
    let len = 1u64 << 16;
    let region = target.allocate_memory(len).unwrap();
    region.write(0, &pattern(2, len as usize)).unwrap();
    let init = common::engine();
    let seg = init
        .open_segment(target.local_segment_name().unwrap())
        .unwrap();
    let peer = init.segment_peer(seg).expect("reached over shm");
    let key = peer.key_of(region.addr()).expect("region listed");
    let local = init.allocate_memory(len).unwrap();
    local.write(0, &pattern(8, len as usize)).unwrap();
    let mut ring = init.ring().unwrap();
    assert_eq!(peer.check_key(region.addr(), len, key), Ok(()));

    target.unregister_memory(region.id()).unwrap();
    // The key the peer holds is revoked (the live key is zeroed) ...
    assert_eq!(
        peer.check_key(region.addr(), len, key),
        Err(ErrorKind::AccessDenied)
    );
    // ... and an op re-reads the descriptor on the refusal, where the
    // region is no more.
    assert_eq!(
        one(&mut ring, write(&local, seg, region.addr(), len)),
        Err(ErrorKind::AddressNotRegistered)
    );
    assert_eq!(
        one(&mut ring, read(&local, seg, region.addr(), len)),
        Err(ErrorKind::AddressNotRegistered)
    );
    assert_eq!(contents(&region), pattern(2, len as usize), "no byte moved");
    assert_eq!(contents(&local), pattern(8, len as usize), "no byte read");
}

/// Is `[start, end)` one mapping of this process (`/proc/self/maps`)?
fn mapped(start: u64, end: u64) -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.split_once('-'))
        .filter_map(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .any(|(a, b)| a == start && b == end)
}

#[test]
fn a_parked_workers_cached_table_does_not_keep_an_unregistered_region() {
    // Heap memory (no shm export): the region's mapping is its own, so
    // whether it is still held shows in /proc/self/maps.
    let mut c = test_config();
    c.transports.shm.enable = false;
    let e = Engine::new(c).unwrap();
    // An odd size: no other mapping of this test binary starts and ends
    // exactly where this one does.
    let len = (64u64 << 20) + 3 * 4096;
    let region = e.allocate_memory(len).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let (start, end) = (region.addr(), region.addr() + len);
    assert!(mapped(start, end));
    // One op from the region by the worker (not inline): its cached region
    // table now holds it.
    let mut ring = e.ring().unwrap();
    ring.set_inline(false);
    assert_eq!(
        one(
            &mut ring,
            write(&region, SegmentId::LOCAL, dst.addr(), 4096)
        ),
        Ok(4096)
    );
    // The worker goes idle and parks with that table cached.
    std::thread::sleep(Duration::from_millis(200));
    e.unregister_memory(region.id()).unwrap();
    drop(region);
    assert!(
        !mapped(start, end),
        "the region's memory is still mapped after unregister_memory returned and its last handle dropped"
    );
}

/// An engine whose local transport holds every slice until released; a
/// 1 s TCP stall limit, so the drain bound is short.
fn held_engine() -> (Engine, Arc<Held>) {
    let mut c = test_config();
    c.block_size = 4096;
    c.transports.tcp.user_timeout_ms = Duration::from_millis(1000);
    let e = Engine::new(c).unwrap();
    let held = Arc::new(Held::default());
    e.swap_transport(TransportKind::Local, Some(held.clone()));
    (e, held)
}

#[test]
fn unregister_waits_for_an_op_in_flight_and_new_requests_fail_at_once() {
    let (e, held) = held_engine();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(write(&src, SegmentId::LOCAL, dst.addr(), 4096).with_user_data(1))
        .unwrap();
    ring.submit().unwrap();
    held.wait_posted();
    std::thread::scope(|s| {
        let unreg = s.spawn(|| {
            let r = e.unregister_memory(src.id());
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !unreg.is_finished(),
            "unregister_memory returned with an op on the region in flight"
        );
        // Meanwhile a new request naming the region fails at once.
        let asked = Instant::now();
        ring.submission()
            .push(write(&src, SegmentId::LOCAL, dst.addr(), 8).with_user_data(2))
            .unwrap();
        let c = reap(&mut ring, 1);
        assert_eq!(c[0].user_data(), 2);
        assert_eq!(c[0].result(), Err(ErrorKind::AddressNotRegistered));
        assert!(asked.elapsed() < Duration::from_secs(1), "not at once");
        assert!(!unreg.is_finished());
        // The op completes: the call returns.
        assert_eq!(held.release_all(), 1);
        let released = Instant::now();
        let (r, at) = unreg.join().unwrap();
        r.unwrap();
        assert!(
            at.duration_since(released) < Duration::from_secs(1),
            "returned {:?} after the op completed",
            at.duration_since(released)
        );
    });
    let c = reap(&mut ring, 1);
    assert_eq!((c[0].user_data(), c[0].result()), (1, Ok(4096)));
    assert_eq!(
        e.unregister_memory(src.id()).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
}

#[test]
fn unregister_past_the_drain_bound_fails_timeout_and_the_region_stays_withdrawn() {
    let (e, held) = held_engine();
    let src = e.allocate_memory(4096).unwrap();
    let dst = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    // Its deadline passes at 100 ms: its slice is aborted, but the
    // transport holds it (and so the region) until released.
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(src.id(), 0),
                RemoteAddr::new(SegmentId::LOCAL, dst.addr()),
                4096,
            )
            .deadline_ns(tent::clock::deadline_after(Duration::from_millis(100)))
            .user_data(1),
        )
        .unwrap();
    ring.submit().unwrap();
    held.wait_posted();
    let start = Instant::now();
    let err = e.unregister_memory(src.id()).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // Bound: the op's deadline plus twice the 1 s stall limit.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // No completion while the transport holds the slice.
    assert_eq!(ring.completion().count(), 0);
    // Still withdrawn: new requests are refused.
    assert_eq!(
        one(
            &mut ring,
            write(&src, SegmentId::LOCAL, dst.addr(), 8).with_user_data(2)
        ),
        Err(ErrorKind::AddressNotRegistered)
    );
    // Once the slice comes back, the Timeout is delivered and a second
    // call finishes the job.
    assert_eq!(held.release_all(), 1);
    let c = reap(&mut ring, 1);
    assert_eq!(
        (c[0].user_data(), c[0].result()),
        (1, Err(ErrorKind::Timeout))
    );
    let until = Instant::now() + Duration::from_secs(5);
    while e.credits_in_flight() != 0 {
        assert!(Instant::now() < until, "the slice never came back");
        std::thread::yield_now();
    }
    let again = Instant::now();
    e.unregister_memory(src.id()).unwrap();
    assert!(again.elapsed() < Duration::from_secs(1));
    assert_eq!(
        e.unregister_memory(src.id()).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
}

/// A raw client of a target's TCP data server (no secret).
fn raw_client(target: &Engine) -> TcpStream {
    let mut s = TcpStream::connect(target.tcp_data_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Hello {
        status: 0,
        flags: 0,
        nonce: [3; 32],
        ident: Ident {
            session: [3; 16],
            conn: 1,
        },
    };
    s.write_all(&hello.encode()).unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).unwrap();
    assert_eq!(Hello::decode(&h).unwrap().status, 0);
    s
}

fn response(s: &mut TcpStream) -> Response {
    let mut h = [0u8; RESPONSE_LEN];
    s.read_exact(&mut h).unwrap();
    Response::decode(&h).unwrap()
}

#[test]
fn unregister_waits_for_a_tcp_write_being_served_into_the_region() {
    let target = common::engine();
    let len = 1u64 << 16;
    let region = target.allocate_memory(len).unwrap();
    let mut s = raw_client(&target);
    let req = |seq| {
        Request {
            opcode: Opcode::Write,
            seq,
            addr: region.addr(),
            len,
            key: region.key(),
        }
        .encode()
    };
    let payload = pattern(4, len as usize);
    let half = len as usize / 2;
    // Header and half the payload: once that half shows in the region, the
    // server is inside the op, receiving straight into it.
    let h: [u8; REQUEST_LEN] = req(1);
    s.write_all(&h).unwrap();
    s.write_all(&payload[..half]).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while contents(&region)[..half] != payload[..half] {
        assert!(Instant::now() < until, "the first half never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::scope(|sc| {
        let unreg = sc.spawn(|| target.unregister_memory(region.id()));
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !unreg.is_finished(),
            "unregister_memory returned while the data server was writing into the region"
        );
        s.write_all(&payload[half..]).unwrap();
        let r = response(&mut s);
        assert_eq!((r.seq, r.status), (1, Ok(())));
        unreg.join().unwrap().unwrap();
    });
    assert_eq!(
        contents(&region),
        payload,
        "the op served before the call returned"
    );
    // After: the same key is refused and nothing lands.
    s.write_all(&req(2)).unwrap();
    s.write_all(&pattern(5, len as usize)).unwrap();
    let r = response(&mut s);
    assert_eq!((r.seq, r.status), (2, Err(ErrorKind::AccessDenied)));
    assert_eq!(contents(&region), payload, "no byte moved");
}

/// Fixed: a `Buffer` of application memory (`register_memory`) kept
/// copying after `unregister_memory` returned `Ok`, or after the engine was
/// dropped: both are when the application may free that memory, so a
/// later `write` wrote freed heap. It is now `AddressNotRegistered`, and a
/// copy in progress makes the unregister (or the drop) wait. Memory the
/// engine allocated stays usable through its `Buffer`.
#[test]
fn a_buffer_of_application_memory_copies_nothing_once_unregistered_or_dropped() {
    let e = Engine::new(test_config()).unwrap();
    let mut mem = vec![0u8; 4096];
    // SAFETY: `mem` outlives its registration (unregistered below).
    let b = unsafe { e.register_memory(mem.as_mut_ptr(), 4096) }.unwrap();
    b.write(0, &[7; 16]).unwrap();
    e.unregister_memory(b.id()).unwrap();
    assert_eq!(
        b.write(0, &[1; 16]).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    let mut out = [0u8; 16];
    assert_eq!(
        b.read(0, &mut out).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    assert_eq!(&mem[..16], &[7; 16], "nothing written after the unregister");

    let mut mem2 = vec![0u8; 4096];
    // SAFETY: `mem2` outlives the engine.
    let b2 = unsafe { e.register_memory(mem2.as_mut_ptr(), 4096) }.unwrap();
    let own = e.allocate_memory(4096).unwrap();
    own.write(0, &[3; 8]).unwrap();
    drop(e);
    assert_eq!(
        b2.write(0, &[1; 16]).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    assert!(
        mem2.iter().all(|&x| x == 0),
        "nothing written after the drop"
    );
    // The engine's own memory lives with its handle.
    let mut o = [0u8; 8];
    own.read(0, &mut o).unwrap();
    assert_eq!(o, [3; 8]);
}

/// Fixed: a range that wraps the address space was registered (release)
/// or panicked in the overlap check (debug); it is `InvalidArgument`.
#[test]
fn registering_a_range_that_wraps_the_address_space_is_refused() {
    let e = Engine::new(test_config()).unwrap();
    let p = (usize::MAX - 100) as *mut u8;
    // SAFETY: refused before the engine touches the range.
    let r = unsafe { e.register_memory(p, 4096) };
    assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidArgument);
}

/// A batch registers all its ranges or none: one that overlaps another of
/// the batch (or a registered region) refuses the call, and the table is
/// as before (the first range can be registered alone afterwards). A batch
/// unregister withdraws every region it names; one id that names nothing
/// refuses it before anything is withdrawn.
#[test]
fn batches_of_registrations_and_unregistrations_are_all_or_nothing() {
    let e = Engine::new(test_config()).unwrap();
    let mut mem = vec![0u8; 64 << 10];
    let base = mem.as_mut_ptr();
    let at = |i: usize| base.wrapping_add(i * 4096);
    let ranges = [(at(0), 4096), (at(1), 4096), (at(1), 8192)];
    // SAFETY: every range lies in `mem`, unregistered (or never registered) before `mem` is dropped.
    let overlapping = unsafe { e.register_memory_batch(&ranges) };
    assert_eq!(overlapping.unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        e.local_addr(at(0) as u64, 1).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered,
        "a refused batch registered part of itself"
    );
    let ranges: Vec<_> = (0..8).map(|i| (at(i), 4096)).collect();
    // SAFETY: as above.
    let bufs = unsafe { e.register_memory_batch(&ranges) }.unwrap();
    assert_eq!(bufs.len(), 8);
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(e.local_addr(at(i) as u64, 4096).unwrap().region, b.id());
    }
    let ids: Vec<_> = bufs.iter().map(|b| b.id()).collect();
    let mut with_a_stranger = ids.clone();
    with_a_stranger.push(tent::RegionId(9999));
    assert_eq!(
        e.unregister_memory_batch(&with_a_stranger)
            .unwrap_err()
            .kind(),
        ErrorKind::AddressNotRegistered
    );
    assert!(
        e.local_addr(at(0) as u64, 1).is_ok(),
        "a refused batch withdrew part of itself"
    );
    e.unregister_memory_batch(&ids).unwrap();
    for i in 0..8 {
        assert_eq!(
            e.local_addr(at(i) as u64, 1).unwrap_err().kind(),
            ErrorKind::AddressNotRegistered
        );
    }
    assert_eq!(
        e.unregister_memory(ids[0]).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    drop(e);
    drop(mem);
}
