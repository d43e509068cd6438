//! A CQE means quiescence: once a `Timeout` or
//! `Canceled` completion is out, or the engine's drop has returned, no
//! byte of the stopped op lands in the application's memory any more.
//!
//! Each test puts a relay between the initiator and a real target's data
//! server that forwards half of a READ's response payload, then holds the
//! rest back until the test says `go` (after the completion): bytes that
//! landed then would overwrite what the application wrote after it.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::clock::deadline_after;
use tent::control::wire::RailEntry;
use tent::transport::tcp::frame::{HELLO_LEN, REQUEST_LEN, RESPONSE_LEN};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, TaskState, op};

/// Bytes of one READ in these tests (one slice: `slice_size` is larger).
const LEN: usize = 256 << 10;

/// A relay of data connections to `real`. The first connection forwards
/// `hold_after` bytes target → initiator, then holds the rest until
/// [`Relay::go`]; with `up_limit`, it also forwards only that many bytes
/// initiator → target until `go` and stops reading meanwhile (so a large
/// WRITE blocks its sender in `sendmsg`). Later connections are forwarded
/// whole.
struct Relay {
    addr: SocketAddr,
    go: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    fn start(real: SocketAddr, hold_after: usize, up_limit: Option<usize>) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay {
            addr: listener.local_addr().unwrap(),
            go: Arc::new(AtomicBool::new(false)),
            stalled: Arc::new(AtomicBool::new(false)),
            accepted: Arc::new(AtomicUsize::new(0)),
        };
        let (go, stalled, accepted) = (
            relay.go.clone(),
            relay.stalled.clone(),
            relay.accepted.clone(),
        );
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { break };
                let Ok(up) = TcpStream::connect(real) else {
                    break;
                };
                let first = accepted.fetch_add(1, Ordering::SeqCst) == 0;
                let (d2, u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
                let (go2, stalled2) = (go.clone(), stalled.clone());
                // Target → initiator.
                std::thread::spawn(move || {
                    let (mut from, mut to) = (u2, d2);
                    if first {
                        if pump(&mut from, &mut to, hold_after).is_err() {
                            return;
                        }
                        stalled2.store(true, Ordering::SeqCst);
                        while !go2.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                    let _ = pump(&mut from, &mut to, usize::MAX);
                    let _ = to.shutdown(Shutdown::Both);
                });
                // Initiator → target.
                let go3 = go.clone();
                std::thread::spawn(move || {
                    let (mut from, mut to) = (down, up);
                    match up_limit {
                        Some(n) if first => {
                            if pump(&mut from, &mut to, n).is_ok() {
                                // Reads no more: the initiator's socket fills.
                                while !go3.load(Ordering::SeqCst) {
                                    std::thread::sleep(Duration::from_millis(2));
                                }
                                // What it had sent by then goes on.
                                let _ = pump(&mut from, &mut to, usize::MAX);
                            }
                        }
                        _ => {
                            let _ = pump(&mut from, &mut to, usize::MAX);
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                });
            }
        });
        relay
    }

    /// Wait until the first connection holds bytes back.
    fn wait_stalled(&self) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.stalled.load(Ordering::SeqCst) {
            assert!(Instant::now() < until, "the READ never reached the relay");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Release what the first connection held back.
    fn go(&self) {
        self.go.store(true, Ordering::SeqCst);
    }
}

/// Copy up to `n` bytes (`usize::MAX`: until EOF); `Err` if it stopped
/// short of a finite `n`.
fn pump(from: &mut TcpStream, to: &mut TcpStream, n: usize) -> std::io::Result<()> {
    let mut b = vec![0u8; 64 << 10];
    let mut left = n;
    while left > 0 {
        let want = left.min(b.len());
        let got = from.read(&mut b[..want])?;
        if got == 0 {
            break;
        }
        to.write_all(&b[..got])?;
        if left != usize::MAX {
            left -= got;
        }
    }
    if left == 0 || n == usize::MAX {
        Ok(())
    } else {
        Err(std::io::ErrorKind::UnexpectedEof.into())
    }
}

fn target() -> Engine {
    let mut c = test_config();
    c.transports.shm.enable = false;
    Engine::new(c).unwrap()
}

/// One connection per peer, one slice per READ.
fn initiator() -> Engine {
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.slice_size = 64 << 20;
    Engine::new(c).unwrap()
}

/// Open `target` from `init` with its data rail pointing at the relay.
fn open_through(init: &Engine, target: &Engine, relay: &Relay) -> SegmentId {
    let data = relay.addr;
    init.open_segment_edited(&target.segment_name(), |d| {
        d.host_id = "a-host-elsewhere".into();
        d.shm_name = None;
        d.rails = vec![RailEntry {
            name: "lo".into(),
            addr: data.to_string(),
        }];
    })
    .unwrap()
}

/// Bytes of the first READ's response that the relay forwards.
const HOLD_AFTER: usize = HELLO_LEN + RESPONSE_LEN + LEN / 2;

fn differing(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

#[test]
fn a_read_timed_out_mid_stream_lands_nothing_after_its_cqe() {
    let target = target();
    let src = target.allocate_memory(LEN as u64).unwrap();
    src.write(0, &pattern(1, LEN)).unwrap();
    let relay = Relay::start(target.tcp_data_addr().unwrap(), HOLD_AFTER, None);
    let init = initiator();
    let seg = open_through(&init, &target, &relay);
    let local = init.allocate_memory(LEN as u64).unwrap();
    let mut ring = init.ring().unwrap();
    let start = Instant::now();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, src.addr()),
                LEN as u64,
            )
            .deadline_ns(deadline_after(Duration::from_millis(300)))
            .user_data(1),
        )
        .unwrap();
    let c = reap(&mut ring, 1);
    println!(
        "Timeout CQE {:?} after the submit (deadline 300 ms)",
        start.elapsed()
    );
    relay.wait_stalled();
    assert_eq!(c[0].result(), Err(ErrorKind::Timeout));
    // The application owns the buffer again: it writes its own bytes.
    let mine = pattern(9, LEN);
    local.write(0, &mine).unwrap();
    relay.go();
    std::thread::sleep(Duration::from_millis(100));
    let mut now = vec![0u8; LEN];
    local.read(0, &mut now).unwrap();
    assert_eq!(
        differing(&now, &mine),
        0,
        "bytes of the timed-out READ landed in the buffer after its Timeout CQE"
    );
}

#[test]
fn a_write_timed_out_mid_stream_lands_nothing_after_its_cqe() {
    let target = target();
    let dst = target.allocate_memory(LEN as u64).unwrap();
    // The WRITE's request and half its payload reach the target, whose
    // connection thread then waits inside the payload for the rest.
    let relay = Relay::start(
        target.tcp_data_addr().unwrap(),
        usize::MAX,
        Some(HELLO_LEN + REQUEST_LEN + LEN / 2),
    );
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 2;
    c.transports.tcp.slice_size = 64 << 20;
    let init = Engine::new(c).unwrap();
    let seg = open_through(&init, &target, &relay);
    let local = init.allocate_memory(2 * LEN as u64).unwrap();
    local.write(0, &pattern(1, LEN)).unwrap();
    let mine = pattern(2, LEN);
    local.write(LEN as u64, &mine).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, dst.addr()),
                LEN as u64,
            )
            .deadline_ns(deadline_after(Duration::from_millis(300)))
            .user_data(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Err(ErrorKind::Timeout));
    // The application writes the same range again: it lands (on the other
    // connection).
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(local.id(), LEN as u64),
                RemoteAddr::new(seg, dst.addr()),
                LEN as u64,
            )
            .user_data(2),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(LEN as u64));
    // The rest of the timed-out WRITE reaches the target now.
    relay.go();
    std::thread::sleep(Duration::from_millis(100));
    let mut now = vec![0u8; LEN];
    dst.read(0, &mut now).unwrap();
    assert_eq!(
        differing(&now, &mine),
        0,
        "bytes of the timed-out WRITE landed over the one written after its Timeout CQE"
    );
}

#[test]
fn a_read_canceled_mid_stream_lands_nothing_after_its_state() {
    let target = target();
    let src = target.allocate_memory(LEN as u64).unwrap();
    src.write(0, &pattern(2, LEN)).unwrap();
    let relay = Relay::start(target.tcp_data_addr().unwrap(), HOLD_AFTER, None);
    let init = initiator();
    let seg = open_through(&init, &target, &relay);
    let local = init.allocate_memory(LEN as u64).unwrap();
    let b = init.allocate_batch(1).unwrap();
    let read = op::Read::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, src.addr()),
        LEN as u64,
    )
    .build();
    init.submit(b, &[read]).unwrap();
    relay.wait_stalled();
    init.cancel(b).unwrap();
    init.wait_batch(b, Duration::from_secs(10)).unwrap();
    let s = init.status(b, 0).unwrap();
    assert_eq!(
        (s.state, s.error),
        (TaskState::Canceled, Some(ErrorKind::Canceled))
    );
    let mine = pattern(8, LEN);
    local.write(0, &mine).unwrap();
    relay.go();
    std::thread::sleep(Duration::from_millis(100));
    let mut now = vec![0u8; LEN];
    local.read(0, &mut now).unwrap();
    assert_eq!(
        differing(&now, &mine),
        0,
        "bytes of the canceled READ landed in the buffer after its Canceled state"
    );
    init.free_batch(b).unwrap();
}

#[test]
fn other_ops_on_a_connection_aborted_for_a_timeout_still_complete() {
    let target = target();
    let src = target.allocate_memory(2 * LEN as u64).unwrap();
    src.write(0, &pattern(3, 2 * LEN)).unwrap();
    let relay = Relay::start(target.tcp_data_addr().unwrap(), HOLD_AFTER, None);
    let init = initiator();
    let seg = open_through(&init, &target, &relay);
    let local = init.allocate_memory(2 * LEN as u64).unwrap();
    let mut ring = init.ring().unwrap();
    // One connection, two in flight on it: the second READ's response
    // queues behind the first's stalled payload.
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, src.addr()),
                LEN as u64,
            )
            .deadline_ns(deadline_after(Duration::from_millis(300)))
            .user_data(1),
        )
        .unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), LEN as u64),
                RemoteAddr::new(seg, src.addr() + LEN as u64),
                4096,
            )
            .deadline_ns(deadline_after(Duration::from_secs(5)))
            .user_data(2),
        )
        .unwrap();
    let mut c = reap(&mut ring, 2);
    c.sort_by_key(|c| c.user_data());
    assert_eq!(c[0].result(), Err(ErrorKind::Timeout));
    assert_eq!(
        c[1].result(),
        Ok(4096),
        "a READ caught on the connection aborted for another's timeout failed"
    );
    let mut got = vec![0u8; 4096];
    local.read(LEN as u64, &mut got).unwrap();
    assert_eq!(got, pattern(3, 2 * LEN)[LEN..LEN + 4096]);
    let rails = init.rails(seg);
    assert_eq!(
        (rails[0].failures, rails[0].trips),
        (0, 0),
        "an abort counted as a rail fault: {rails:?}"
    );
    relay.go();
}

/// The child of the next test: READs and a WRITE in flight through a
/// stalled relay into memory the test maps itself; the engine is dropped,
/// the memory unmapped and mapped afresh with other bytes, then the relay
/// sends the rest of the READ. Exits non-zero (or dies) if a byte lands.
#[test]
fn shutdown_with_ops_in_flight_child() {
    if std::env::var_os("TENT_TEST_QUIESCE_CHILD").is_none() {
        return;
    }
    const WRITE: usize = 64 << 20;
    let total = LEN + WRITE;
    let target = target();
    let remote = target.allocate_memory(total as u64).unwrap();
    remote.write(0, &pattern(4, LEN)).unwrap();
    // Upstream: the hello and the READ's request only, then nothing: the
    // WRITE behind it blocks its sender in `sendmsg`.
    let relay = Relay::start(
        target.tcp_data_addr().unwrap(),
        HOLD_AFTER,
        Some(HELLO_LEN + REQUEST_LEN),
    );
    let init = initiator();
    let seg = open_through(&init, &target, &relay);
    // SAFETY: a fresh anonymous private mapping; checked below.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(mem, libc::MAP_FAILED);
    let mem = mem as *mut u8;
    // SAFETY: the mapping stays until after the engine is dropped.
    let buf = unsafe { init.register_memory(mem, total as u64) }.unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(buf.id(), 0),
                RemoteAddr::new(seg, remote.addr()),
                LEN as u64,
            )
            .user_data(1),
        )
        .unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(buf.id(), LEN as u64),
                RemoteAddr::new(seg, remote.addr() + LEN as u64),
                WRITE as u64,
            )
            .user_data(2),
        )
        .unwrap();
    ring.submit().unwrap();
    relay.wait_stalled();
    // Let the WRITE fill the socket.
    std::thread::sleep(Duration::from_millis(200));
    drop(ring);
    drop(buf);
    let dropped = Instant::now();
    drop(init);
    println!("engine dropped in {:?}", dropped.elapsed());
    // Its connection threads are gone too (the target has none: it only
    // serves).
    let left = threads_named(&["tent-tcp-send", "tent-tcp-recv"]);
    // SAFETY: the engine is gone: nothing of it may touch the mapping.
    assert_eq!(unsafe { libc::munmap(mem.cast(), total) }, 0);
    // Someone else gets the same addresses.
    // SAFETY: maps exactly the range just unmapped, refusing to replace anything.
    let again = unsafe {
        libc::mmap(
            mem.cast(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(again, mem.cast(), "could not map the range again");
    let theirs = pattern(5, LEN);
    // SAFETY: `again` maps `total >= LEN` writable bytes.
    let now = unsafe { std::slice::from_raw_parts_mut(mem, LEN) };
    now.copy_from_slice(&theirs);
    relay.go();
    std::thread::sleep(Duration::from_millis(100));
    let bad = differing(now, &theirs);
    println!("RESULT differing={bad} threads_left={left}");
    assert_eq!(
        bad, 0,
        "bytes of a READ in flight at shutdown landed after the engine's drop returned"
    );
    assert_eq!(left, 0, "tcp connection threads outlived the engine's drop");
}

/// Threads of this process whose name is one of `names`.
fn threads_named(names: &[&str]) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| names.contains(&comm.trim_end()))
        .count()
}

#[test]
fn shutdown_with_ops_in_flight_into_memory_freed_right_after() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "shutdown_with_ops_in_flight_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENT_TEST_QUIESCE_CHILD", "1")
        .output()
        .unwrap();
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("RESULT"), "the child did not get there: {all}");
    assert!(
        out.status.success(),
        "child failed ({:?}): {all}",
        out.status
    );
}

#[test]
fn relay_sanity_a_read_through_it_completes() {
    let target = target();
    let src = target.allocate_memory(LEN as u64).unwrap();
    src.write(0, &pattern(6, LEN)).unwrap();
    let relay = Relay::start(target.tcp_data_addr().unwrap(), usize::MAX, None);
    let init = initiator();
    let seg = open_through(&init, &target, &relay);
    let local = init.allocate_memory(LEN as u64).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, src.addr()),
                LEN as u64,
            )
            .user_data(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(LEN as u64));
    let mut got = vec![0u8; LEN];
    local.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(6, LEN));
}
