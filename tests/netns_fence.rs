//! No stale writes after a rail move, across real links
//! between network namespaces (tools/netns.sh). With CI=true this test
//! must run; elsewhere it skips, saying why.
//!
//! WRITE version 1 of a region while its slices stream over two shaped
//! rails, set rail 2's link down mid-stream (its slices move to rail 1 and
//! the WRITE completes), WRITE version 2 to the same address (rail 1
//! only), bring rail 2 back and wait past the retransmit window (the
//! initiator's `TCP_USER_TIMEOUT` and the target's stall limit, both
//! `user_timeout_ms`): the target must hold version 2 everywhere. A
//! connection torn down gracefully keeps its queued version-1 bytes in the
//! kernel, which retransmits them once the link is back, over version 2.
//!
//! Children are this test binary re-run inside a namespace with
//! `TENT_NETNS_ROLE` set and the filter of its `_child` test. Rail i is
//! 10.77.i.1 in NAME-a (initiator) and 10.77.i.2 in NAME-b (target).

mod common;

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use common::netns::{Netns, line_with, say};
use tent::{LocalAddr, RemoteAddr, op};

/// Bytes written each time: at 2 x 200 Mbit about 0.35 s of streaming, so
/// rail 2 goes down with slices on the wire.
const SIZE: u64 = 16 << 20;
/// `user_timeout_ms` of both engines (the default): how long the kernel
/// retransmits unacknowledged bytes, and how long the target waits for a
/// frame that stalled.
const USER_TIMEOUT_MS: u64 = 10_000;

fn config(host: &str) -> tent::Config {
    let mut c = common::netns::config(host);
    c.transports.tcp.user_timeout_ms = Duration::from_millis(USER_TIMEOUT_MS);
    c
}

#[test]
fn netns_fence_target_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("fence-target") {
        return;
    }
    let e = tent::Engine::new(config("10.77.1.2")).unwrap();
    let b = e.allocate_memory(SIZE).unwrap();
    b.write(0, &vec![0u8; SIZE as usize]).unwrap();
    say(&format!("SEGMENT {}", e.segment_name()));
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// One WRITE or READ of the whole region; its result.
fn whole(
    ring: &mut tent::Ring,
    write: bool,
    local: &tent::Buffer,
    seg: tent::SegmentId,
    remote: u64,
) -> Result<u64, tent::ErrorKind> {
    let (l, r) = (LocalAddr::new(local.id(), 0), RemoteAddr::new(seg, remote));
    let pushed = if write {
        ring.submission().push(op::Write::new(l, r, SIZE))
    } else {
        ring.submission().push(op::Read::new(l, r, SIZE))
    };
    pushed.unwrap();
    ring.submit().unwrap();
    ring.wait_one(Duration::from_secs(30)).unwrap().result()
}

#[test]
fn netns_fence_initiator_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("fence-initiator") {
        return;
    }
    let target = std::env::var("TENT_NETNS_TARGET").unwrap();
    let dead_if = std::env::var("TENT_NETNS_IFACE").unwrap();
    let e = tent::Engine::new(config("10.77.1.1")).unwrap();
    let seg = e.open_segment(&target).unwrap();
    let remote = e.segment_regions(seg).unwrap()[0].addr;
    let index = tent::netlink::interfaces()
        .unwrap()
        .into_iter()
        .find(|i| i.name == dead_if)
        .expect("rail interface")
        .index;
    let rail = |name: &str| {
        e.rails(seg)
            .into_iter()
            .find(|r| r.local == name)
            .unwrap_or_else(|| panic!("no rail on {name}"))
    };
    assert_eq!(e.rails(seg).len(), 2, "two rails: {:?}", e.rails(seg));
    let (v1, v2) = (
        common::pattern(1, SIZE as usize),
        common::pattern(2, SIZE as usize),
    );
    let b1 = e.allocate_memory(SIZE).unwrap();
    b1.write(0, &v1).unwrap();
    let b2 = e.allocate_memory(SIZE).unwrap();
    b2.write(0, &v2).unwrap();
    let back = e.allocate_memory(SIZE).unwrap();
    let mut ring = e.ring().unwrap();

    // Version 1, with rail 2's link set down once it carries bytes and
    // still has slices on the wire.
    let (l, r) = (LocalAddr::new(b1.id(), 0), RemoteAddr::new(seg, remote));
    ring.submission().push(op::Write::new(l, r, SIZE)).unwrap();
    ring.submit().unwrap();
    let t = Instant::now();
    loop {
        let s = rail(&dead_if);
        if s.bytes > 0 && s.inflight > 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "rail 2 never carried v1: {s:?}"
        );
        std::thread::yield_now();
    }
    tent::netlink::set_link(index, false).unwrap();
    let down = Instant::now();
    let v1_result = ring.wait_one(Duration::from_secs(30)).unwrap().result();
    let v1_ms = down.elapsed().as_millis();
    let moved = rail(&dead_if).moved;

    // Version 2 over the surviving rail.
    let v2_result = whole(&mut ring, true, &b2, seg, remote);
    let down_ms = down.elapsed().as_millis();
    tent::netlink::set_link(index, true).unwrap();

    // Past the window in which the kernel retransmits (user timeout) and
    // the target waits for a stalled frame (stall limit).
    std::thread::sleep(Duration::from_millis(USER_TIMEOUT_MS + 2_000));
    let read_result = whole(&mut ring, false, &back, seg, remote);
    let mut got = vec![0u8; SIZE as usize];
    back.read(0, &mut got).unwrap();
    let stale = (0..got.len()).filter(|&i| got[i] != v2[i]).count();
    let stale_v1 = (0..got.len())
        .filter(|&i| got[i] != v2[i] && got[i] == v1[i])
        .count();
    let first = (0..got.len()).find(|&i| got[i] != v2[i]);
    say(&format!(
        "RESULT v1={v1_result:?} v2={v2_result:?} read={read_result:?} moved={moved} v1_after_down_ms={v1_ms} down_ms={down_ms} stale_bytes={stale} stale_v1_bytes={stale_v1} first_stale={first:?}"
    ));
}

fn field<'a>(result: &'a str, key: &str) -> &'a str {
    result
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {result}"))
}

#[test]
fn netns_fence_no_stale_write_lands_after_a_rail_move() {
    let Some(ns) = Netns::up("tf", 2, Some("200mbit")) else {
        return;
    };
    let mut t = ns.exec(
        "b",
        "netns_fence_target_child",
        &[("TENT_NETNS_ROLE", "fence-target".into())],
    );
    let mut tout = BufReader::new(t.stdout.take().unwrap());
    let name = line_with(&mut tout, "SEGMENT ");
    let mut c = ns.exec(
        "a",
        "netns_fence_initiator_child",
        &[
            ("TENT_NETNS_ROLE", "fence-initiator".into()),
            ("TENT_NETNS_TARGET", name),
            ("TENT_NETNS_IFACE", format!("{}a2", ns.0)),
        ],
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let result = line_with(&mut out, "RESULT ");
    assert!(c.wait().unwrap().success());
    drop(t.stdin.take());
    let _ = t.wait();
    let _ = std::io::stderr().write_all(format!("fence: {result}\n").as_bytes());
    assert_eq!(field(&result, "v1="), "Ok(16777216)", "{result}");
    assert_eq!(field(&result, "v2="), "Ok(16777216)", "{result}");
    assert_eq!(field(&result, "read="), "Ok(16777216)", "{result}");
    assert_ne!(
        field(&result, "moved="),
        "0",
        "rail 2 went down with no slice of v1 on it: the test proved nothing: {result}"
    );
    assert_eq!(
        field(&result, "stale_bytes="),
        "0",
        "bytes of the superseded WRITE landed over version 2 after the rail came back: {result}"
    );
}
