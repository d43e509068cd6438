//! One engine per node: a `Daemon` serves an engine at a unix socket, and
//! clients attach, get memory and rings in shared memory, and move data
//! through the daemon's engine; a client names only its own regions and
//! the segments it opened, and what a departed client held is released.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{pattern, test_config};
use tent::daemon::{Daemon, LAYOUT_VERSION};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, op};

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tentd-test-{tag}-{}.sock", std::process::id()))
}

fn daemon(tag: &str) -> Daemon {
    Daemon::start(Engine::new(test_config()).unwrap(), &socket(tag)).unwrap()
}

/// Submit what was pushed, and reap one CQE from `ring`, waiting up to 10 s.
fn one(ring: &mut tent::Ring) -> tent::Cqe {
    ring.wait_one(Duration::from_secs(10)).expect("a CQE")
}

#[test]
fn a_client_moves_verified_data_through_the_daemon_s_engine() {
    let d = daemon("data");
    let target = Engine::new(test_config()).unwrap();
    let len = 256 << 10;
    let dst = target.allocate_memory(len).unwrap();
    let c = Engine::attach(d.socket_path()).unwrap();
    let mem = c.allocate_memory(len).unwrap();
    let data = pattern(5, len as usize);
    mem.write(0, &data).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    let mut ring = c.ring_with_depth(64).unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(mem.id(), 0),
                RemoteAddr::new(seg, dst.addr()),
                len,
            )
            .user_data(7)
            .build(),
        )
        .unwrap();
    ring.submit().unwrap();
    let cqe = one(&mut ring);
    assert_eq!((cqe.user_data(), cqe.result()), (7, Ok(len)));
    let mut got = vec![0u8; len as usize];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "WRITE landed");
    // And back, into the second half of a new region, after the worker
    // went to sleep (its SQ bell wakes it).
    let back = c.allocate_memory(2 * len).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(back.id(), len),
                RemoteAddr::new(seg, dst.addr()),
                len,
            )
            .user_data(8)
            .build(),
        )
        .unwrap();
    ring.submit().unwrap();
    let cqe = one(&mut ring);
    assert_eq!((cqe.user_data(), cqe.result()), (8, Ok(len)));
    let mut out = vec![0u8; len as usize];
    back.read(len, &mut out).unwrap();
    assert!(out == data, "READ landed");
}

#[test]
fn a_client_names_only_its_own_regions_and_segments() {
    let d = daemon("scope");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(4096).unwrap();
    let a = Engine::attach(d.socket_path()).unwrap();
    let b = Engine::attach(d.socket_path()).unwrap();
    let a_mem = a.allocate_memory(4096).unwrap();
    let b_mem = b.allocate_memory(4096).unwrap();
    let seg = a.open_segment(&target.segment_name()).unwrap();
    let mut rb = b.ring_with_depth(8).unwrap();
    let write = |local, seg| {
        op::Write::new(
            LocalAddr::new(local, 0),
            RemoteAddr::new(seg, dst.addr()),
            64,
        )
        .build()
    };
    // B names A's region, then a segment only A opened, then the local
    // segment (every client's memory).
    rb.submission().push(write(a_mem.id(), seg)).unwrap();
    rb.submit().unwrap();
    assert_eq!(one(&mut rb).result(), Err(ErrorKind::AddressNotRegistered));
    rb.submission().push(write(b_mem.id(), seg)).unwrap();
    rb.submit().unwrap();
    assert_eq!(one(&mut rb).result(), Err(ErrorKind::SegmentNotFound));
    rb.submission()
        .push(write(b_mem.id(), SegmentId::LOCAL))
        .unwrap();
    rb.submit().unwrap();
    assert_eq!(one(&mut rb).result(), Err(ErrorKind::SegmentNotFound));
    // The daemon's own segment cannot be opened by name either.
    let own = d.engine().segment_name();
    assert_eq!(
        b.open_segment(&own).unwrap_err().kind(),
        ErrorKind::AccessDenied
    );
    let shm = d.engine().local_segment_name().unwrap().to_owned();
    assert_eq!(
        b.open_segment(&shm).unwrap_err().kind(),
        ErrorKind::AccessDenied
    );
    // Nor by another name of the same engine: its identity decides.
    let alias = own.replace("127.0.0.1", "[::ffff:127.0.0.1]");
    assert_ne!(alias, own);
    let err = b.open_segment(&alias).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    // Once B opens the segment itself, its own region goes.
    let seg_b = b.open_segment(&target.segment_name()).unwrap();
    rb.submission().push(write(b_mem.id(), seg_b)).unwrap();
    rb.submit().unwrap();
    assert_eq!(one(&mut rb).result(), Ok(64));
    // Bad requests at set-up are typed refusals.
    assert_eq!(
        a.allocate_memory(0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        a.ring_with_depth(3).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn a_client_of_another_layout_version_is_refused_naming_both() {
    use std::io::{Read, Write};
    let d = daemon("version");
    let mut s = std::os::unix::net::UnixStream::connect(d.socket_path()).unwrap();
    // Hello { version: LAYOUT_VERSION + 1 }: tag 1, then the version.
    let mut frame = 5u32.to_le_bytes().to_vec();
    frame.push(1);
    frame.extend_from_slice(&(LAYOUT_VERSION + 1).to_le_bytes());
    s.write_all(&frame).unwrap();
    let mut reply = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.contains(&format!("client {}", LAYOUT_VERSION + 1))
            && text.contains(&format!("tentd {LAYOUT_VERSION}")),
        "{text}"
    );
}

#[test]
fn what_a_departed_client_held_is_released() {
    let d = daemon("release");
    let before = d.engine().segment_regions(SegmentId::LOCAL).unwrap().len();
    let c = Engine::attach(d.socket_path()).unwrap();
    let _m1 = c.allocate_memory(4096).unwrap();
    let _m2 = c.allocate_memory(8192).unwrap();
    let _ring = c.ring_with_depth(8).unwrap();
    assert_eq!(
        d.engine().segment_regions(SegmentId::LOCAL).unwrap().len(),
        before + 2
    );
    drop(c);
    let start = Instant::now();
    while d.engine().segment_regions(SegmentId::LOCAL).unwrap().len() != before {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the departed client's regions are still registered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run as a child process (`TENT_DAEMON_CHILD` = socket, target segment):
/// attach, and WRITE in a loop until killed.
#[test]
fn daemon_child_client() {
    let Ok(spec) = std::env::var("TENT_DAEMON_CHILD") else {
        return;
    };
    let (sock, target) = spec.split_once('|').expect("socket|segment");
    let c = Engine::attach(sock).unwrap();
    let mem = c.allocate_memory(1 << 20).unwrap();
    let seg = c.open_segment(target).unwrap();
    let remote: u64 = std::env::var("TENT_DAEMON_CHILD_DST")
        .unwrap()
        .parse()
        .unwrap();
    let mut ring = c.ring_with_depth(64).unwrap();
    let mut said = false;
    loop {
        for _ in 0..16 {
            let _ = ring.submission().push(
                op::Write::new(
                    LocalAddr::new(mem.id(), 0),
                    RemoteAddr::new(seg, remote),
                    1 << 20,
                )
                .build(),
            );
        }
        ring.submit().unwrap();
        let mut n = 0;
        while n < 16 {
            if ring.completion().next().is_some() {
                n += 1;
            } else {
                let _ = ring.wait_ready(Duration::from_millis(100));
            }
        }
        if !said {
            println!("CHILD-READY");
            said = true;
        }
    }
}

/// A client killed with SIGKILL while its WRITEs are in flight: its
/// regions are unregistered within a bound, and another client keeps
/// moving data meanwhile, with no error.
#[test]
fn a_client_killed_under_load_is_cleaned_up_and_others_see_no_error() {
    use std::io::BufRead;
    let d = daemon("kill");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(2 << 20).unwrap();
    let before = d.engine().segment_regions(SegmentId::LOCAL).unwrap().len();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "daemon_child_client",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "TENT_DAEMON_CHILD",
            format!("{}|{}", d.socket_path().display(), target.segment_name()),
        )
        .env("TENT_DAEMON_CHILD_DST", dst.addr().to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("CHILD-READY"))),
        "the child never moved data"
    );
    // Another client, working while the first dies.
    let c = Engine::attach(d.socket_path()).unwrap();
    let mem = c.allocate_memory(4096).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    let mut ring = c.ring_with_depth(8).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    let mut moved = 0;
    loop {
        ring.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(mem.id(), 0),
                    RemoteAddr::new(seg, dst.addr() + (1 << 20)),
                    4096,
                )
                .build(),
            )
            .unwrap();
        ring.submit().unwrap();
        assert_eq!(one(&mut ring).result(), Ok(4096), "the survivor's op");
        moved += 1;
        // The survivor's region is the only one left.
        if d.engine().segment_regions(SegmentId::LOCAL).unwrap().len() == before + 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the killed client's regions are still registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(moved > 0);
}

/// What a client may hold is bounded, each refusal typed and naming the
/// limit; a client past the count is refused at attach.
#[test]
fn quotas_refuse_typed_and_a_client_past_the_count_is_turned_away() {
    let limits = tent::daemon::DaemonLimits {
        clients: 1,
        regions_per_client: 2,
        bytes_per_client: 1 << 20,
        rings_per_client: 1,
        in_flight_per_client: 2,
        ..Default::default()
    };
    let d = Daemon::start_with(
        Engine::new(test_config()).unwrap(),
        &socket("quota"),
        limits,
    )
    .unwrap();
    let c = Engine::attach(d.socket_path()).unwrap();
    let _a = c.allocate_memory(512 << 10).unwrap();
    let e = c.allocate_memory(768 << 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("1048576 bytes"), "{e}");
    let _b = c.allocate_memory(4096).unwrap();
    assert_eq!(
        c.allocate_memory(4096).unwrap_err().kind(),
        ErrorKind::OutOfMemory,
        "a third region"
    );
    let mut r = c.ring_with_depth(16).unwrap();
    assert_eq!(
        c.ring_with_depth(8).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    // Past its share of ops in flight (2) a client's ring waits, and
    // every op still completes.
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(4096).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    for i in 0..16 {
        r.submission()
            .push(
                op::Write::new(
                    LocalAddr::new(_b.id(), 0),
                    RemoteAddr::new(seg, dst.addr()),
                    64,
                )
                .user_data(i)
                .build(),
            )
            .unwrap();
    }
    r.submit().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 16 {
        let c = one(&mut r);
        assert_eq!(c.result(), Ok(64));
        seen.push(c.user_data());
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..16).collect::<Vec<u64>>());
    let second = Engine::attach(d.socket_path()).unwrap_err();
    assert_eq!(second.kind(), ErrorKind::OutOfMemory, "{second}");
    // Once the first goes, there is room again.
    drop(c);
    let start = Instant::now();
    loop {
        match Engine::attach(d.socket_path()) {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::OutOfMemory);
                assert!(start.elapsed() < Duration::from_secs(10), "still full");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// One daemon per socket path; a path that holds something other than a
/// socket is left alone.
#[test]
fn a_second_daemon_on_the_same_path_and_a_path_that_is_not_a_socket_are_refused() {
    let d = daemon("twice");
    let again = Daemon::start(Engine::new(test_config()).unwrap(), d.socket_path()).unwrap_err();
    assert_eq!(again.kind(), ErrorKind::InvalidArgument);
    assert!(again.to_string().contains("another daemon"), "{again}");
    let file = socket("file");
    std::fs::write(&file, b"not a socket").unwrap();
    let e = Daemon::start(Engine::new(test_config()).unwrap(), &file).unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a socket");
    std::fs::remove_file(&file).unwrap();
}

/// A client that sends requests and never reads the answers holds the
/// daemon no longer than its write timeout: the daemon still stops.
#[test]
fn a_client_that_never_reads_does_not_hold_the_daemon() {
    use std::io::Write;
    let d = daemon("stuck");
    let mut s = std::os::unix::net::UnixStream::connect(d.socket_path()).unwrap();
    let mut hello = 5u32.to_le_bytes().to_vec();
    hello.push(1);
    hello.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    s.write_all(&hello).unwrap();
    // OpenSegment requests whose refusals (~100 B each) fill the socket.
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let name = "x".repeat(400);
    let mut frame = (1 + name.len() as u32).to_le_bytes().to_vec();
    frame.push(3);
    frame.extend_from_slice(name.as_bytes());
    for _ in 0..20_000 {
        if s.write_all(&frame).is_err() {
            break;
        }
    }
    let start = Instant::now();
    drop(d);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the daemon's stop waited on a client that never reads"
    );
}

/// A client gives memory and rings back without leaving: each no longer
/// counts against its quota, a freed region is no longer named, and it
/// cannot free what is not its own.
#[test]
fn freed_memory_and_closed_rings_come_off_the_quota() {
    let limits = tent::daemon::DaemonLimits {
        bytes_per_client: 64 << 10,
        rings_per_client: 1,
        ..Default::default()
    };
    let d =
        Daemon::start_with(Engine::new(test_config()).unwrap(), &socket("free"), limits).unwrap();
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(4096).unwrap();
    let c = Engine::attach(d.socket_path()).unwrap();
    let other = Engine::attach(d.socket_path()).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    let m = c.allocate_memory(64 << 10).unwrap();
    let freed = m.id();
    assert_eq!(
        c.allocate_memory(4096).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    // Another client cannot free it.
    let theirs = other.allocate_memory(4096).unwrap();
    assert_eq!(
        c.unregister_memory(theirs.id()).unwrap_err().kind(),
        ErrorKind::AddressNotRegistered
    );
    c.unregister_memory(m.id()).unwrap();
    let m2 = c.allocate_memory(64 << 10).unwrap();
    let r = c.ring_with_depth(8).unwrap();
    assert_eq!(
        c.ring_with_depth(8).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    drop(r);
    let mut r = c.ring_with_depth(8).unwrap();
    // The freed region is named no more; the new one is.
    let write = |region| {
        op::Write::new(
            LocalAddr::new(region, 0),
            RemoteAddr::new(seg, dst.addr()),
            64,
        )
        .build()
    };
    r.submission().push(write(freed)).unwrap();
    r.submit().unwrap();
    assert_eq!(one(&mut r).result(), Err(ErrorKind::AddressNotRegistered));
    r.submission().push(write(m2.id())).unwrap();
    r.submit().unwrap();
    assert_eq!(one(&mut r).result(), Ok(64));
}

/// The configuration alone chooses: `daemon_socket` attaches, a key that
/// is the daemon's is refused naming it, no daemon is `Unreachable`, or an
/// embedded engine with `daemon_embed_fallback`; what an attached engine
/// does not serve is refused naming the call.
#[test]
fn the_configuration_alone_chooses_attach_or_embed() {
    let d = daemon("config");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(4096).unwrap();
    let mut cfg = tent::Config::default();
    cfg.daemon_socket = d.socket_path().display().to_string();
    let e = Engine::new(cfg.clone()).unwrap();
    assert!(e.is_attached());
    let src = e.allocate_memory(4096).unwrap();
    src.write(0, b"attached").unwrap();
    let seg = e.open_segment(&target.segment_name()).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Write::new(
                e.local_addr(src.addr(), 8).unwrap(),
                RemoteAddr::new(seg, dst.addr()),
                8,
            )
            .build(),
        )
        .unwrap();
    assert_eq!(one(&mut ring).result(), Ok(8));
    let mut got = [0u8; 8];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"attached");

    // Heap memory, cancel: refused, named.
    let mut heap = vec![0u8; 4096];
    // SAFETY: `heap` outlives the call, which is refused anyway.
    let err = unsafe { e.register_memory(heap.as_mut_ptr(), 4096) }.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("allocate_memory"), "{err}");
    let batch = e.allocate_batch(4).unwrap();
    let err = e.cancel(batch).unwrap_err();
    assert!(err.to_string().contains("cancel"), "{err}");

    // A key that is the daemon's.
    let mut theirs = cfg.clone();
    theirs.block_size = 4096;
    let err = Engine::new(theirs).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("block_size"), "{err}");

    // No daemon there: Unreachable, or embedded with the fallback.
    let mut nowhere = tent::Config::default();
    nowhere.daemon_socket = socket("nowhere").display().to_string();
    assert_eq!(
        Engine::new(nowhere.clone()).unwrap_err().kind(),
        ErrorKind::Unreachable
    );
    nowhere.daemon_embed_fallback = true;
    let embedded = Engine::new(nowhere).unwrap();
    assert!(!embedded.is_attached());
}

/// Run as a child process (`TENT_DAEMON_SERVE` = socket): serve a daemon
/// until killed.
#[test]
fn daemon_child_server() {
    let Ok(sock) = std::env::var("TENT_DAEMON_SERVE") else {
        return;
    };
    let mut cfg = test_config();
    if let Ok(ms) = std::env::var("TENT_DAEMON_PARK_MS") {
        cfg.workers.park_timeout_ms = Duration::from_millis(ms.parse().unwrap());
    }
    let limits = tent::daemon::DaemonLimits {
        rings_per_client: 64,
        ..Default::default()
    };
    let _d = Daemon::start_with(Engine::new(cfg).unwrap(), sock.as_ref(), limits).unwrap();
    println!("DAEMON-READY");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A daemon in a child process, serving at `sock` once this returns.
fn spawn_daemon(sock: &std::path::Path) -> std::process::Child {
    spawn_daemon_parked(sock, None)
}

/// [`spawn_daemon`], its workers parking up to `park` (default: the test
/// configuration's).
fn spawn_daemon_parked(sock: &std::path::Path, park: Option<Duration>) -> std::process::Child {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    if let Some(p) = park {
        cmd.env("TENT_DAEMON_PARK_MS", p.as_millis().to_string());
    }
    let mut child = cmd
        .args([
            "--exact",
            "daemon_child_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENT_DAEMON_SERVE", sock)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("DAEMON-READY"))),
        "the daemon never started"
    );
    child
}

/// A daemon killed with SIGKILL under load: its client's ops end typed
/// (`Shutdown`) within a bound instead of hanging, so do its set-up calls,
/// and the client attaches again to a restarted daemon and moves data.
#[test]
fn a_daemon_killed_ends_its_clients_ops_typed_and_a_restarted_one_serves_again() {
    let sock = socket("restart");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(1 << 20).unwrap();
    let mut d = spawn_daemon(&sock);
    let c = Engine::attach(&sock).unwrap();
    let mem = c.allocate_memory(1 << 20).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    let mut ring = c.ring_with_depth(64).unwrap();
    let write = |mem: &tent::Buffer, seg| {
        op::Write::new(
            LocalAddr::new(mem.id(), 0),
            RemoteAddr::new(seg, dst.addr()),
            1 << 20,
        )
        .build()
    };
    ring.submission().push(write(&mem, seg)).unwrap();
    assert_eq!(one(&mut ring).result(), Ok(1 << 20));
    for _ in 0..32 {
        ring.submission().push(write(&mem, seg)).unwrap();
    }
    ring.submit().unwrap();
    d.kill().unwrap();
    d.wait().unwrap();
    let start = Instant::now();
    let mut completed = 0;
    let err = loop {
        match ring.wait_one(Duration::from_secs(10)) {
            Ok(cqe) => {
                assert_eq!(cqe.result(), Ok(1 << 20));
                completed += 1;
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(completed <= 32);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the client waited {:?} on a dead daemon",
        start.elapsed()
    );
    ring.submission().push(write(&mem, seg)).unwrap();
    assert_eq!(ring.submit().unwrap_err().kind(), ErrorKind::Shutdown);
    assert_eq!(
        c.allocate_memory(4096).unwrap_err().kind(),
        ErrorKind::Shutdown
    );
    drop(ring);
    drop(c);

    let mut d = spawn_daemon(&sock);
    let c = Engine::attach(&sock).unwrap();
    let mem = c.allocate_memory(1 << 20).unwrap();
    let data = pattern(11, 1 << 20);
    mem.write(0, &data).unwrap();
    let seg = c.open_segment(&target.segment_name()).unwrap();
    let mut ring = c.ring_with_depth(8).unwrap();
    ring.submission().push(write(&mem, seg)).unwrap();
    assert_eq!(one(&mut ring).result(), Ok(1 << 20));
    let mut got = vec![0u8; 1 << 20];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "the restarted daemon moved the data");
    d.kill().unwrap();
    d.wait().unwrap();
}

/// An attached engine's batch API: tasks settle from the CQEs of its own
/// ring, a bad request ends its task typed, a submit that finds the ring
/// full waits for room (the ring holds `max_batch_size`), a freed or
/// foreign id is refused, and block lists go through it as one request
/// per run.
#[test]
fn an_attached_engine_s_batches_settle_each_task() {
    let d = daemon("batch");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(1 << 20).unwrap();
    let mut cfg = tent::Config::default();
    cfg.daemon_socket = d.socket_path().display().to_string();
    cfg.max_batch_size = 64;
    let e = Engine::new(cfg).unwrap();
    let src = e.allocate_memory(1 << 20).unwrap();
    let data = pattern(3, 1 << 20);
    src.write(0, &data).unwrap();
    let seg = e.open_segment(&target.segment_name()).unwrap();
    let write = |off: u64, len: u64| {
        op::Write::new(
            LocalAddr::new(src.id(), off),
            RemoteAddr::new(seg, dst.addr() + off),
            len,
        )
        .build()
    };
    // 100 tasks of 10 KiB in two batches, back to back, through a ring of
    // 64: the second submit waits for room.
    let first = e.allocate_batch(64).unwrap();
    let second = e.allocate_batch(64).unwrap();
    let reqs: Vec<_> = (0..100).map(|i| write(i * 10240, 10240)).collect();
    e.submit(first, &reqs[..64]).unwrap();
    e.submit(second, &reqs[64..]).unwrap();
    for (batch, n) in [(first, 64), (second, 36)] {
        let all = e.wait_batch(batch, Duration::from_secs(10)).unwrap();
        assert_eq!(
            (all.state, all.transferred_bytes),
            (tent::TaskState::Completed, n * 10240)
        );
    }
    let mut got = vec![0u8; 100 * 10240];
    dst.read(0, &mut got).unwrap();
    assert!(got == data[..100 * 10240], "the batches' data landed");
    assert_eq!(e.status_list(second).unwrap().len(), 36);
    e.free_batch(first).unwrap();
    let batch = second;
    // Past the room the batch has: refused whole.
    assert_eq!(
        e.submit(batch, &reqs[..29]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(e.status_list(batch).unwrap().len(), 36, "nothing queued");
    e.free_batch(batch).unwrap();
    assert_eq!(
        e.status(batch, 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument,
        "a freed batch"
    );
    // One good task, one past the local region.
    let batch = e.allocate_batch(2).unwrap();
    e.submit(batch, &[write(0, 4096), write((1 << 20) - 8, 64)])
        .unwrap();
    let all = e.wait_batch(batch, Duration::from_secs(10)).unwrap();
    let list = e.status_list(batch).unwrap();
    assert_eq!(list[0].state, tent::TaskState::Completed);
    assert_eq!(list[1].error, Some(ErrorKind::OutOfBounds), "{list:?}");
    assert_eq!(all.state, list[1].state);
    e.free_batch(batch).unwrap();
    // A block list: blocks 0, 1, 5 and 3 of 4 KiB to places 2, 3, 0 and
    // 7: three requests (0 and 1 are one run on both sides).
    let blk = 4096;
    let order = [0u64, 1, 5, 3];
    let place = [2u64, 3, 0, 7];
    let local: Vec<u64> = order.iter().map(|b| src.addr() + b * blk).collect();
    let remote: Vec<u64> = place
        .iter()
        .map(|p| dst.addr() + (1 << 19) + p * blk)
        .collect();
    let batch = e.allocate_batch(8).unwrap();
    let list = tent::BlockList {
        opcode: tent::Opcode::Write,
        segment: seg,
        block_len: blk,
        local_addrs: &local,
        remote_addrs: &remote,
        priority: tent::Priority::High,
    };
    assert_eq!(e.submit_blocks(batch, &list).unwrap(), 3);
    let all = e.wait_batch(batch, Duration::from_secs(10)).unwrap();
    assert_eq!(all.state, tent::TaskState::Completed);
    for (b, p) in order.into_iter().zip(place) {
        let mut got = vec![0u8; blk as usize];
        dst.read((1 << 19) + p * blk, &mut got).unwrap();
        let at = (b * blk) as usize;
        assert!(got == data[at..at + blk as usize], "block {b}");
    }
}

/// An attached engine lists the regions of a segment it opened and closes
/// it: its ring may name it no more; a segment it did not open is
/// `SegmentNotFound` either way.
#[test]
fn an_attached_engine_lists_and_closes_the_segments_it_opened() {
    let d = daemon("segments");
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(64 << 10).unwrap();
    let e = Engine::attach(d.socket_path()).unwrap();
    let src = e.allocate_memory(4096).unwrap();
    let seg = e.open_segment(&target.segment_name()).unwrap();
    let regions = e.segment_regions(seg).unwrap();
    assert!(
        regions
            .iter()
            .any(|r| r.addr == dst.addr() && r.len == dst.len()),
        "{regions:?}"
    );
    let mut ring = e.ring_with_depth(8).unwrap();
    assert!(ring.worker() < d.engine().worker_cores().len());
    assert!(!ring.prepare_wait(), "no fd to sleep on yet");
    ring.completion_fd().unwrap();
    assert!(ring.prepare_wait(), "nothing to reap");
    ring.finish_wait();
    let write = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(seg, dst.addr()),
        64,
    )
    .build();
    ring.submission().push(write).unwrap();
    assert_eq!(one(&mut ring).result(), Ok(64));
    e.close_segment(seg).unwrap();
    ring.submission().push(write).unwrap();
    assert_eq!(one(&mut ring).result(), Err(ErrorKind::SegmentNotFound));
    for err in [
        e.close_segment(seg).unwrap_err(),
        e.segment_regions(seg).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::SegmentNotFound, "{err}");
    }
}

/// Run as a child process (`TENT_DAEMON_AS` =
/// `uid|gid|supplementary|socket|segment|addr`, `-` for no supplementary
/// group): become that user, that group, attach, and WRITE 64 KiB of
/// pattern 13 to `addr` in `segment`; print `ATTACH-OK`, or `ATTACH-ERR`
/// and the error's kind.
#[test]
fn daemon_child_as_another_user() {
    let Ok(spec) = std::env::var("TENT_DAEMON_AS") else {
        return;
    };
    let f: Vec<&str> = spec.split('|').collect();
    let (uid, gid): (u32, u32) = (f[0].parse().unwrap(), f[1].parse().unwrap());
    let groups = [f[2].parse::<u32>().unwrap_or(gid)];
    let f = [f[0], f[1], f[3], f[4], f[5]];
    // SAFETY: plain system calls on values we own; glibc applies them to every thread.
    let dropped = unsafe {
        libc::setgroups(1, groups.as_ptr()) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0
    };
    assert!(dropped, "became uid {uid} gid {gid}");
    let moved = (|| -> tent::Result<()> {
        let e = Engine::attach(f[2])?;
        let mem = e.allocate_memory(64 << 10)?;
        mem.write(0, &pattern(13, 64 << 10))?;
        let seg = e.open_segment(f[3])?;
        let mut ring = e.ring_with_depth(8)?;
        let addr: u64 = f[4].parse().unwrap();
        let w = op::Write::new(
            LocalAddr::new(mem.id(), 0),
            RemoteAddr::new(seg, addr),
            64 << 10,
        );
        ring.submission().push(w).expect("room");
        ring.wait_one(Duration::from_secs(10))?
            .result()
            .map_err(|k| tent::Error::new(k, "the WRITE"))?;
        Ok(())
    })();
    match moved {
        Ok(()) => println!("ATTACH-OK"),
        Err(e) => println!("ATTACH-ERR {:?} {e}", e.kind()),
    }
}

/// What a child of `uid` in group `gid` says of attaching at `d`'s
/// socket and writing to `dst` of `target`.
fn as_user(uid: u32, gid: u32, d: &Daemon, target: &Engine, dst: &tent::Buffer) -> String {
    as_user_in(uid, gid, None, d, target, dst)
}

/// [`as_user`] with `sup` as its one supplementary group.
fn as_user_in(
    uid: u32,
    gid: u32,
    sup: Option<u32>,
    d: &Daemon,
    target: &Engine,
    dst: &tent::Buffer,
) -> String {
    let sup = sup.map_or("-".to_owned(), |g| g.to_string());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "daemon_child_as_another_user",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "TENT_DAEMON_AS",
            format!(
                "{uid}|{gid}|{sup}|{}|{}|{}",
                d.socket_path().display(),
                target.segment_name(),
                dst.addr()
            ),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The harness prints the test's name on the same line first.
    text.lines()
        .find_map(|l| l.find("ATTACH-").map(|at| l[at..].to_owned()))
        .unwrap_or_else(|| panic!("the child said nothing: {text}"))
}

/// Another user's process is refused (by the socket's mode, and by the
/// daemon itself where the mode would let it in); one in the daemon's
/// client group is served, the socket 0660 and of that group. Needs root
/// to run a child as another user (CI runs as root).
#[test]
fn another_user_is_refused_and_a_member_of_the_client_group_is_served() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !rustix::process::geteuid().is_root() {
        eprintln!("needs root to run a client as another user: not run");
        return;
    }
    let (nobody, group) = (65534, 4242);
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(64 << 10).unwrap();
    let d = daemon("uid");
    let said = as_user(nobody, nobody, &d, &target, &dst);
    assert!(said.starts_with("ATTACH-ERR AccessDenied"), "0600: {said}");
    std::fs::set_permissions(d.socket_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let said = as_user(nobody, nobody, &d, &target, &dst);
    assert!(said.starts_with("ATTACH-ERR AccessDenied"), "0666: {said}");
    assert!(
        said.contains("tentd serves uid 0"),
        "refused by the daemon: {said}"
    );

    let limits = tent::daemon::DaemonLimits {
        client_group: Some(group),
        ..Default::default()
    };
    let g = Daemon::start_with(
        Engine::new(test_config()).unwrap(),
        &socket("group"),
        limits,
    )
    .unwrap();
    let meta = std::fs::metadata(g.socket_path()).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, group));
    let said = as_user(nobody, nobody, &g, &target, &dst);
    assert!(
        said.starts_with("ATTACH-ERR AccessDenied"),
        "not in the group: {said}"
    );
    let said = as_user(nobody, group, &g, &target, &dst);
    assert_eq!(said, "ATTACH-OK", "primary group");
    let mut got = vec![0u8; 64 << 10];
    dst.read(0, &mut got).unwrap();
    assert!(got == pattern(13, 64 << 10), "the member's WRITE landed");
    // A member by a supplementary group (SO_PEERGROUPS) is served too.
    let said = as_user_in(nobody, nobody, Some(group), &g, &target, &dst);
    assert_eq!(said, "ATTACH-OK", "supplementary group");
    // Past a socket mode that lets anyone in, the daemon still refuses a
    // process in neither its user nor its group.
    std::fs::set_permissions(g.socket_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let said = as_user(nobody, nobody, &g, &target, &dst);
    assert!(
        said.contains("tentd serves uid 0 and group 4242"),
        "refused by the daemon: {said}"
    );
}

/// The relays are a thread per worker, not per ring: 150 rings of three
/// clients on a one-worker daemon (in a process of its own, its threads
/// counted there) cost one relay thread, and a parked worker (its park
/// ten seconds) wakes at once for an op on a ring its relay waits on
/// (`futex_waitv` takes 127 bells) and on one past those (looked at every
/// millisecond). Without the relay each would wait out the park.
#[test]
fn one_relay_per_worker_wakes_it_for_any_of_many_rings() {
    let sock = socket("relays");
    let mut d = spawn_daemon_parked(&sock, Some(Duration::from_secs(10)));
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(4096).unwrap();
    let clients: Vec<Engine> = (0..3).map(|_| Engine::attach(&sock).unwrap()).collect();
    let mut rings = Vec::new();
    let mut ops = Vec::new();
    for c in &clients {
        let mem = c.allocate_memory(4096).unwrap();
        let seg = c.open_segment(&target.segment_name()).unwrap();
        for _ in 0..50 {
            rings.push(c.ring_with_depth(2).unwrap());
            ops.push(
                op::Write::new(
                    LocalAddr::new(mem.id(), 0),
                    RemoteAddr::new(seg, dst.addr()),
                    64,
                )
                .build(),
            );
        }
    }
    let relays = std::fs::read_dir(format!("/proc/{}/task", d.id()))
        .unwrap()
        .filter(|t| {
            let comm = t.as_ref().unwrap().path().join("comm");
            std::fs::read_to_string(comm).is_ok_and(|c| c.starts_with("tentd-relay"))
        })
        .count();
    assert_eq!(relays, 1, "one relay thread for one worker");
    for i in [0, rings.len() - 1] {
        // The worker parks within microseconds of going idle.
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        rings[i].submission().push(ops[i]).unwrap();
        assert_eq!(one(&mut rings[i]).result(), Ok(64), "ring {i}");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "ring {i} waited {:?}: its bell woke nobody",
            start.elapsed()
        );
    }
    drop(rings);
    drop(clients);
    d.kill().unwrap();
    d.wait().unwrap();
}

/// Notifications between clients of two daemons (each in a process of
/// its own): a client's segment name is its daemon's with its mailbox, so
/// what is sent to it reaches it alone, after the data of a submission it
/// is attached to; a reply goes back to the sender's name; an embedded
/// engine and a client notify each other the same way; a departed client's
/// name, and a daemon's bare name, are refused typed.
#[test]
fn notifications_reach_the_client_they_name_across_two_daemons() {
    let (s1, s2) = (socket("mail-1"), socket("mail-2"));
    let _d1 = Killed(spawn_daemon(&s1));
    let _d2 = Killed(spawn_daemon(&s2));
    let a = Engine::attach(&s1).unwrap();
    let b = Engine::attach(&s2).unwrap();
    let other = Engine::attach(&s2).unwrap();
    let (owner, mailbox) = b
        .segment_name()
        .rsplit_once('#')
        .map(|(o, m)| (o.to_owned(), m.to_owned()))
        .unwrap();
    assert_eq!(mailbox.len(), 16, "{}", b.segment_name());
    assert_ne!(b.segment_name(), other.segment_name(), "one mailbox each");
    let t = Duration::from_secs(10);

    // A to B, and B's reply to the name it came from.
    let to_b = a.open_segment(&b.segment_name()).unwrap();
    let hello = tent::Notification::new("hello", b"from a".to_vec()).unwrap();
    a.send_notification(to_b, &hello).unwrap();
    let got = b.wait_notification(t).unwrap();
    assert_eq!(
        (got.name.as_str(), got.msg.as_slice()),
        ("hello", &b"from a"[..])
    );
    assert_eq!(got.from, a.segment_name(), "the sender's mailbox name");
    assert!(
        other.try_notification().is_none(),
        "another client of B's daemon gets nothing"
    );
    assert!(b.try_notification().is_none(), "once");
    let to_a = b.open_segment(&got.from).unwrap();
    b.send_notification(
        to_a,
        &tent::Notification::new("re", b"ok".to_vec()).unwrap(),
    )
    .unwrap();
    let re = a.wait_notification(t).unwrap();
    assert_eq!(
        (re.name.as_str(), re.from.as_str()),
        ("re", b.segment_name().as_str())
    );

    // Attached to a submission: B sees it only once A's data is in B's
    // memory (the daemon's segment, B's region there).
    let len = 1 << 20;
    let dst = b.allocate_memory(len).unwrap();
    let src = a.allocate_memory(len).unwrap();
    let data = pattern(11, len as usize);
    src.write(0, &data).unwrap();
    let batch = a.allocate_batch(4).unwrap();
    let w = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(to_b, dst.peer_addr()),
        len,
    )
    .build();
    a.submit_with_notification(
        batch,
        &[w],
        &tent::Notification::new("kv-ready", b"1 MiB".to_vec()).unwrap(),
    )
    .unwrap();
    let note = b
        .wait_notification(t)
        .unwrap_or_else(|e| panic!("{e}: batch {:?}", a.status_list(batch)));
    assert_eq!(note.name, "kv-ready");
    let mut got = vec![0u8; len as usize];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "the data landed before its notification");
    let s = a.wait_batch(batch, t).unwrap();
    assert_eq!(s.state, tent::TaskState::Completed, "{s:?}");
    a.free_batch(batch).unwrap();

    // An embedded engine and a client, both ways.
    let e = Engine::new(test_config()).unwrap();
    let e_to_b = e.open_segment(&b.segment_name()).unwrap();
    e.send_notification(
        e_to_b,
        &tent::Notification::new("from-e", Vec::new()).unwrap(),
    )
    .unwrap();
    let got = b.wait_notification(t).unwrap();
    assert_eq!(
        (got.name.as_str(), got.from.as_str()),
        ("from-e", e.segment_name().as_str())
    );
    let b_to_e = b.open_segment(&e.segment_name()).unwrap();
    b.send_notification(
        b_to_e,
        &tent::Notification::new("to-e", Vec::new()).unwrap(),
    )
    .unwrap();
    let got = e.wait_notification(t).unwrap();
    assert_eq!(
        (got.name.as_str(), got.from.as_str()),
        ("to-e", b.segment_name().as_str())
    );

    // Nobody there: a client that detached, the daemon's own name.
    let to_other = a.open_segment(&other.segment_name()).unwrap();
    drop(other);
    let gone = a.send_notification(to_other, &hello).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::SegmentNotFound, "{gone}");
    let bare = a.open_segment(&owner).unwrap();
    let refused = a.send_notification(bare, &hello).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::SegmentNotFound, "{refused}");
    assert!(refused.to_string().contains("owner#mailbox"), "{refused}");
    // A batch whose notification cannot be delivered fails with its kind.
    let batch = a.allocate_batch(4).unwrap();
    let w = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(to_other, dst.peer_addr()),
        64,
    )
    .build();
    a.submit_with_notification(batch, &[w], &hello).unwrap();
    let s = a.wait_batch(batch, t).unwrap();
    assert_eq!(
        (s.state, s.error),
        (tent::TaskState::Failed, Some(ErrorKind::SegmentNotFound)),
        "{s:?}"
    );
    a.free_batch(batch).unwrap();
    // Closing one name of an owner leaves the state its other names share:
    // data still moves through B's name.
    a.close_segment(to_other).unwrap();
    a.close_segment(bare).unwrap();
    let batch = a.allocate_batch(4).unwrap();
    src.write(0, &pattern(12, 4096)).unwrap();
    let w = op::Write::new(
        LocalAddr::new(src.id(), 0),
        RemoteAddr::new(to_b, dst.peer_addr()),
        4096,
    )
    .build();
    a.submit(batch, &[w]).unwrap();
    let s = a.wait_batch(batch, t).unwrap();
    assert_eq!(s.state, tent::TaskState::Completed, "{s:?}");
    let mut got = vec![0u8; 4096];
    dst.read(0, &mut got).unwrap();
    assert!(got == pattern(12, 4096));
}

/// A child process killed and reaped when dropped (a failed assertion
/// leaves no daemon holding the test's output pipe).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon's `/metrics` by client: each client's ops (completed,
/// failed), bytes, queue waits by priority, what it holds and its weight
/// (from the rule its name matches), labelled by its client id, uid, pid
/// and name; a client that detached has no series left.
#[test]
fn the_daemon_s_metrics_break_down_by_client() {
    let limits = tent::daemon::DaemonLimits {
        weights: vec!["name:prefill=3".parse().unwrap()],
        ..Default::default()
    };
    let d = Daemon::start_with(
        Engine::new(test_config()).unwrap(),
        &socket("metrics"),
        limits,
    )
    .unwrap();
    let target = Engine::new(test_config()).unwrap();
    let dst = target.allocate_memory(1 << 16).unwrap();
    let mut named = tent::Config::default();
    named.daemon_socket = d.socket_path().display().to_string();
    named.daemon_client_name = "prefill".into();
    let a = Engine::new(named).unwrap();
    let b = Engine::attach(d.socket_path()).unwrap();
    let src = a.allocate_memory(1 << 16).unwrap();
    let _b_mem = b.allocate_memory(4096).unwrap();
    let seg = a.open_segment(&target.segment_name()).unwrap();
    let mut ring = a.ring_with_depth(16).unwrap();
    for i in 0..5u64 {
        let w = op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(seg, dst.addr()),
            4096,
        )
        .user_data(i)
        .priority(tent::Priority::High)
        .build();
        ring.submission().push(w).unwrap();
        ring.submit().unwrap();
        assert_eq!(one(&mut ring).result(), Ok(4096));
    }
    // Past the region's end: refused, counted failed.
    let bad = op::Write::new(
        LocalAddr::new(src.id(), 1 << 16),
        RemoteAddr::new(seg, dst.addr()),
        4096,
    )
    .build();
    ring.submission().push(bad).unwrap();
    ring.submit().unwrap();
    assert!(one(&mut ring).result().is_err());
    let text = d.engine().metrics_text();
    let series = |family: &str, extra: &str| -> Vec<u64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(extra))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let me = format!("pid=\"{}\"", std::process::id());
    assert_eq!(
        series("tent_client_ops_total", "result=\"completed\""),
        vec![5, 0],
        "{text}"
    );
    assert_eq!(
        series("tent_client_ops_total", "result=\"failed\""),
        vec![1, 0]
    );
    assert_eq!(series("tent_client_bytes_total", &me), vec![5 * 4096, 0]);
    assert_eq!(
        series("tent_client_queue_waits_total", "priority=\"high\""),
        vec![5, 0]
    );
    assert_eq!(series("tent_client_held", "what=\"regions\""), vec![1, 1]);
    assert_eq!(series("tent_client_held", "what=\"rings\""), vec![1, 0]);
    assert_eq!(series("tent_client_held", "what=\"segments\""), vec![1, 0]);
    assert_eq!(series("tent_client_in_flight", &me), vec![0, 0]);
    assert_eq!(
        series("tent_client_weight", "name=\"prefill\""),
        vec![3],
        "the weight its name was given"
    );
    assert_eq!(series("tent_client_weight", "name=\"\""), vec![1]);
    drop(ring);
    drop(a);
    // The daemon learns of the detach from its socket, on its own thread:
    // the series go once it has released the client.
    let start = Instant::now();
    loop {
        let text = d.engine().metrics_text();
        let left = text
            .lines()
            .filter(|l| l.starts_with("tent_client_held{") && l.contains("what=\"regions\""))
            .count();
        if left == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the detached client's series are still there: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
