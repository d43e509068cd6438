//! Thread counts do not grow with TCP peers. An initiator's workers drive
//! every connection through their own rings, and notifications go out on
//! a fixed pool; a target serves every connection on a fixed set of
//! serving threads.
//!
//! 200 target engines in 4 processes on loopback; the initiator opens
//! each one's segment, WRITEs a pattern there and READs it back verified,
//! and sends each a notification. Its threads (`/proc/self/task`, io_uring's
//! own workers included) grow by at most 8 from before the first open.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::notify::Notification;
use tent::transport::tcp::frame::{Ident, RESPONSE_LEN, Request, Response};
use tent::transport::tcp::handshake;
use tent::{Engine, LocalAddr, Opcode, RemoteAddr, op};

const PROCESSES: usize = 4;
const PER_PROCESS: usize = 50;
const LEN: usize = 4096;

/// A small engine: one worker, no shm (the peers are on this host).
fn slim_config() -> tent::Config {
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.rdma.enable = false;
    c.max_tasks_per_worker = 64;
    c.max_inflight_slices = 64;
    c
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// One process's targets: `PER_PROCESS` engines, each with a region, its
/// segment name and region address printed on one line; they live until
/// stdin closes.
#[test]
fn tcp_many_targets_child() {
    if std::env::var_os("TENT_MANY_TARGETS").is_none() {
        return;
    }
    let mut engines = Vec::new();
    let mut line = String::from("SEGMENTS");
    for _ in 0..PER_PROCESS {
        let e = Engine::new(slim_config()).unwrap();
        let buf = e.allocate_memory(LEN as u64).unwrap();
        line.push_str(&format!(" {}={}", e.segment_name(), buf.addr()));
        engines.push((e, buf));
    }
    println!("{line}");
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

#[test]
fn two_hundred_tcp_peers_add_at_most_8_threads() {
    let mut children = Vec::new();
    let mut peers: Vec<(String, u64)> = Vec::new();
    for _ in 0..PROCESSES {
        let (child, out, words) =
            common::target_child("tcp_many_targets_child", "TENT_MANY_TARGETS", "SEGMENTS");
        for w in words {
            let (name, addr) = w.split_once('=').unwrap();
            peers.push((name.to_owned(), addr.parse().unwrap()));
        }
        children.push((child, out));
    }
    assert_eq!(peers.len(), PROCESSES * PER_PROCESS);

    let mut c = slim_config();
    c.workers.count = 2;
    c.max_tasks_per_worker = 256;
    c.max_inflight_slices = 256;
    c.default_timeout_ms = Duration::from_secs(20);
    let init = Engine::new(c).unwrap();
    let local = init.allocate_memory(2 * LEN as u64).unwrap();
    let mut ring = init.ring().unwrap();
    // Let the engine's own threads settle.
    std::thread::sleep(Duration::from_millis(200));
    let before = threads();
    for (i, (name, addr)) in peers.iter().enumerate() {
        let seg = init.open_segment(name).unwrap();
        let data = pattern(i as u8, LEN);
        local.write(0, &data).unwrap();
        ring.submission()
            .push(op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, *addr),
                LEN as u64,
            ))
            .unwrap();
        assert_eq!(
            reap(&mut ring, 1)[0].result(),
            Ok(LEN as u64),
            "WRITE to peer {i}"
        );
        ring.submission()
            .push(op::Read::new(
                LocalAddr::new(local.id(), LEN as u64),
                RemoteAddr::new(seg, *addr),
                LEN as u64,
            ))
            .unwrap();
        assert_eq!(
            reap(&mut ring, 1)[0].result(),
            Ok(LEN as u64),
            "READ from peer {i}"
        );
        let mut back = vec![0u8; LEN];
        local.read(LEN as u64, &mut back).unwrap();
        assert!(
            back == data,
            "peer {i}: the READ did not return what was written"
        );
        init.send_notification(seg, &Notification::new("n", vec![i as u8]).unwrap())
            .unwrap_or_else(|e| panic!("notification to peer {i}: {e}"));
    }
    let after = threads();
    eprintln!(
        "threads: {before} before the first open, {after} with {} peers",
        peers.len()
    );
    assert!(
        after <= before + 8,
        "{} TCP peers grew the initiator from {before} to {after} threads",
        peers.len()
    );
    drop(init);
    for (mut child, mut out) in children {
        drop(child.stdin.take());
        // Read what it still prints, so it never writes to a closed pipe.
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        let _ = child.wait();
    }
}

/// 300 connections to one target, each opened (hello), served a READ and
/// answered with verified bytes, all held open at once: the target's
/// threads are the same number after as before the first (its serving
/// threads are a fixed set started with the engine).
#[test]
fn a_target_serves_300_connections_on_its_fixed_threads() {
    let target = Engine::new(slim_config()).unwrap();
    let buf = target.allocate_memory(LEN as u64).unwrap();
    buf.write(0, &pattern(9, LEN)).unwrap();
    let addr = target.tcp_data_addr().unwrap();
    let before = threads();
    let read = Request {
        opcode: Opcode::Read,
        seq: 1,
        addr: buf.addr(),
        len: LEN as u64,
        key: buf.key(),
    }
    .encode();
    let conns: Vec<TcpStream> = (1..=300u32)
        .map(|conn| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let ident = Ident {
                session: [7; 16],
                conn,
            };
            handshake::open(&s, None, Instant::now() + Duration::from_secs(5), ident).unwrap();
            s.write_all(&read).unwrap();
            s
        })
        .collect();
    for (i, mut s) in conns.iter().enumerate() {
        let mut h = [0u8; RESPONSE_LEN];
        s.read_exact(&mut h).unwrap();
        let r = Response::decode(&h).unwrap();
        assert_eq!((r.status, r.len), (Ok(()), LEN as u64), "connection {i}");
        let mut got = vec![0u8; LEN];
        s.read_exact(&mut got).unwrap();
        assert!(got == pattern(9, LEN), "connection {i}: wrong bytes");
    }
    let during = threads();
    drop(conns);
    assert!(
        during <= before,
        "the target grew from {before} to {during} threads serving 300 connections"
    );
}
