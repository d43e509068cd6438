//! The TCP transport across real links between network namespaces
//! (tools/netns.sh), target and initiator in separate processes: rails
//! sprayed and failed over, a single rail lost, a target killed and
//! restarted. With CI=true these tests must run; elsewhere they skip,
//! saying why.
//!
//! Children are this test binary re-run inside a namespace with
//! `TENT_NETNS_ROLE` set and the filter of its `_child` test. Rail i is
//! 10.77.i.1 in NAME-a (initiator) and 10.77.i.2 in NAME-b (target).

mod common;

use std::io::{BufReader, Write};
use std::process::{Child, ChildStdout, Command};

use common::netns::{Netns, line_with};
use std::time::{Duration, Instant};

use tent::{LocalAddr, RemoteAddr, op};

/// The roles of these tests, on top of the shared namespace harness.
trait Roles {
    fn target(&self, size: u64) -> (Target, String);
    fn initiator(&self, target: &str, mode: &str, size: u64) -> (Child, BufReader<ChildStdout>);
}

impl Roles for Netns {
    /// Start a target in namespace b holding `size` bytes of pattern; its
    /// segment name.
    fn target(&self, size: u64) -> (Target, String) {
        let mut t = self.exec(
            "b",
            "netns_tcp_target_child",
            &[
                ("TENT_NETNS_ROLE", "tcp-target".into()),
                ("TENT_NETNS_SIZE", size.to_string()),
            ],
        );
        let mut out = BufReader::new(t.stdout.take().unwrap());
        let name = line_with(&mut out, "SEGMENT ");
        (Target(t, out), name)
    }

    fn initiator(
        &self,
        target: &str,
        mode: &str,
        size: u64,
    ) -> (Child, BufReader<std::process::ChildStdout>) {
        let mut c = self.exec(
            "a",
            "netns_tcp_initiator_child",
            &[
                ("TENT_NETNS_ROLE", "tcp-initiator".into()),
                ("TENT_NETNS_TARGET", target.into()),
                ("TENT_NETNS_MODE", mode.into()),
                ("TENT_NETNS_SIZE", size.to_string()),
            ],
        );
        let out = BufReader::new(c.stdout.take().unwrap());
        (c, out)
    }
}

/// A target process and its stdout (kept open so the child's test harness
/// can still write its last lines).
struct Target(
    Child,
    #[allow(dead_code)] BufReader<std::process::ChildStdout>,
);

impl Target {
    fn stop(mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    o.write_all(line.as_bytes()).unwrap();
    o.write_all(b"\n").unwrap();
    o.flush().unwrap();
}

fn config(host: &str) -> tent::Config {
    let mut c = common::test_config();
    c.rpc_server_hostname = host.to_owned();
    // The namespaces share /dev/shm: without this the peers would meet there.
    c.transports.shm.enable = false;
    c.default_timeout_ms = 30_000;
    c
}

#[test]
fn netns_tcp_target_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("tcp-target") {
        return;
    }
    let size: u64 = std::env::var("TENT_NETNS_SIZE").unwrap().parse().unwrap();
    let e = tent::Engine::new(config("10.77.1.2")).unwrap();
    let b = e.allocate_memory(size).unwrap();
    b.write(0, &common::pattern(7, size as usize)).unwrap();
    say(&format!("SEGMENT {}", e.segment_name()));
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// Modes: `one` = one READ of the whole region, verified; `many` = 8
/// READs in flight (for the kill test).
#[test]
fn netns_tcp_initiator_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("tcp-initiator") {
        return;
    }
    let target = std::env::var("TENT_NETNS_TARGET").unwrap();
    let mode = std::env::var("TENT_NETNS_MODE").unwrap();
    let size: u64 = std::env::var("TENT_NETNS_SIZE").unwrap().parse().unwrap();
    let e = tent::Engine::new(config("10.77.1.1")).unwrap();
    let seg = e.open_segment(&target).unwrap();
    let remote = e.segment_regions(seg).unwrap()[0].addr;
    let local = e.allocate_memory(size).unwrap();
    let mut ring = e.ring().unwrap();
    let parts = if mode == "many" { 8 } else { 1 };
    let part = size / parts;
    for i in 0..parts {
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), i * part),
                    RemoteAddr::new(seg, remote + i * part),
                    part,
                )
                .user_data(i),
            )
            .unwrap();
    }
    let start = Instant::now();
    ring.submit().unwrap();
    say("STARTED");
    let cqes = common::reap(&mut ring, parts as usize);
    let ms = start.elapsed().as_millis();
    let mut results: Vec<String> = cqes
        .iter()
        .map(|c| match c.result() {
            Ok(_) => "Ok".to_owned(),
            Err(k) => format!("{k:?}"),
        })
        .collect();
    results.sort();
    let verified = cqes.iter().all(|c| c.result().is_ok()) && {
        let mut got = vec![0u8; size as usize];
        local.read(0, &mut got).unwrap();
        got == common::pattern(7, size as usize)
    };
    say(&format!(
        "RESULT ms={ms} verified={verified} results={}",
        results.join(",")
    ));
}

fn field<'a>(result: &'a str, key: &str) -> &'a str {
    result
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {result}"))
}

/// One 64 MiB READ across the namespaces with rail 1 set down 300 ms in:
/// the initiator's RESULT line, and how long after the link went down it
/// came.
fn read_with_rail_1_down(ns: &Netns) -> (String, Duration) {
    let size = 64 << 20;
    let (target, name) = ns.target(size);
    let (mut init, mut out) = ns.initiator(&name, "one", size);
    line_with(&mut out, "STARTED");
    std::thread::sleep(Duration::from_millis(300));
    let down = ns.rail_down(1);
    let result = line_with(&mut out, "RESULT ");
    let after = down.elapsed();
    assert!(init.wait().unwrap().success());
    target.stop();
    (result, after)
}

#[test]
fn netns_tcp_two_rails_survive_one_going_down_mid_transfer() {
    // 2 × 300 Mbit: a 64 MiB READ takes about a second, so the rail goes
    // down with most slices still to move.
    let Some(ns) = Netns::up("tt", 2, Some("300mbit")) else {
        return;
    };
    let (result, _) = read_with_rail_1_down(&ns);
    assert_eq!(field(&result, "verified="), "true", "{result}");
    assert_eq!(field(&result, "results="), "Ok", "{result}");
    let _ = std::io::stderr()
        .write_all(format!("two rails, rail 1 down at 300 ms: {result}\n").as_bytes());
}

#[test]
fn netns_tcp_only_rail_down_fails_route_lost_within_the_deadline() {
    let Some(ns) = Netns::up("tr", 1, Some("200mbit")) else {
        return;
    };
    let (result, after) = read_with_rail_1_down(&ns);
    assert_eq!(field(&result, "results="), "RouteLost", "{result}");
    // The deadline is 30 s; the link watch makes it much sooner.
    assert!(after < Duration::from_secs(10), "{after:?}");
    let _ = std::io::stderr().write_all(
        format!("only rail down: RouteLost {after:?} after ip link set down\n").as_bytes(),
    );
}

#[test]
fn netns_tcp_target_kill_fails_outstanding_ops_then_a_restarted_target_opens() {
    let Some(ns) = Netns::up("tk", 1, Some("200mbit")) else {
        return;
    };
    let size = 64 << 20;
    let (target, name) = ns.target(size);
    let (mut init, mut out) = ns.initiator(&name, "many", size);
    line_with(&mut out, "STARTED");
    std::thread::sleep(Duration::from_millis(400));
    // `ip netns exec` runs the test binary as its child (same pid: exec).
    let killed = Instant::now();
    let s = Command::new("kill")
        .args(["-9", &target.0.id().to_string()])
        .status()
        .unwrap();
    assert!(s.success());
    let mut target = target;
    let _ = target.0.wait();
    let result = line_with(&mut out, "RESULT ");
    let after = killed.elapsed();
    assert!(init.wait().unwrap().success());
    let results = field(&result, "results=");
    assert!(
        results
            .split(',')
            .any(|r| r == "ProcessFailed" || r == "Unreachable"),
        "{result}"
    );
    for r in results.split(',') {
        assert!(
            ["Ok", "ProcessFailed", "Unreachable"].contains(&r),
            "{result}"
        );
    }
    assert!(after < Duration::from_secs(10), "{after:?}");
    let _ = std::io::stderr()
        .write_all(format!("target killed: {result} ({after:?} after kill -9)\n").as_bytes());

    // A new target on the same namespace: a new open works.
    let (target, name) = ns.target(1 << 20);
    let (mut init, mut out) = ns.initiator(&name, "one", 1 << 20);
    let result = line_with(&mut out, "RESULT ");
    assert!(init.wait().unwrap().success());
    target.stop();
    assert_eq!(field(&result, "verified="), "true", "{result}");
}
