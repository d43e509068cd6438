//! Link state across a real link: a veth rail (tools/netns.sh) is set down
//! while a [`tent::netlink::LinkWatch`] runs inside its namespace. With
//! CI=true this test must run; elsewhere it skips, saying why.
//!
//! The watcher is this test binary re-run inside the namespace with
//! `TENT_NETNS_LINK_IF` set and the filter of its `_child` test, since a
//! netlink socket only sees the links of the namespace it was opened in.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tent::netlink::{LinkWatch, interface_of, link_up};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/netns.sh");
const ENV_IF: &str = "TENT_NETNS_LINK_IF";

/// Namespaces that are torn down when the test ends, even by a panic.
struct Netns(String);

impl Netns {
    /// Set up, or `None` (after printing why) when this machine cannot.
    fn up(rails: u32) -> Option<Netns> {
        let ok = Command::new(SCRIPT)
            .arg("check")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let why = "cannot create network namespaces here (needs root and iproute2)";
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: netns tests must run: {why}"
            );
            // Straight to stderr (print! would be captured by the harness).
            let _ = std::io::stderr().write_all(format!("SKIP: {why}\n").as_bytes());
            return None;
        }
        let name = format!("tl{}", std::process::id() % 100_000);
        let status = Command::new(SCRIPT)
            .args(["up", &name, &rails.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "tools/netns.sh up failed");
        Some(Netns(name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["down", &self.0]).status();
    }
}

/// Inside namespace a: watch rail 1 and report when it is seen going down.
#[test]
fn netns_link_watch_child() {
    let Ok(want) = std::env::var(ENV_IF) else {
        return;
    };
    let ip = IpAddr::V4(Ipv4Addr::new(10, 77, 1, 1));
    let rail = interface_of(ip).unwrap().expect("10.77.1.1 is local");
    assert_eq!(rail.name, want);
    assert!(rail.up, "{rail:?} should start up");
    assert!(link_up(rail.index).unwrap());

    let (tx, rx) = mpsc::channel();
    let _watch = LinkWatch::start(move |ev| {
        let _ = tx.send((Instant::now(), ev));
    })
    .unwrap();
    let mut out = std::io::stdout();
    out.write_all(b"READY\n").unwrap();
    out.flush().unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (at, ev) = rx.recv_timeout(left).expect("no down event within 5 s");
        println!("EVENT index={} up={}", ev.index, ev.up);
        if ev.index == rail.index && !ev.up {
            assert!(!link_up(rail.index).unwrap());
            println!("DOWN-SEEN {}", at.duration_since(start).as_millis());
            return;
        }
    }
}

#[test]
fn netns_link_down_is_reported_by_link_watch() {
    let Some(ns) = Netns::up(1) else { return };
    let mut child = Command::new("ip")
        .args(["netns", "exec", &format!("{}-a", ns.0)])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "netns_link_watch_child", "--nocapture"])
        .arg("--test-threads=1")
        .env(ENV_IF, format!("{}a1", ns.0))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("READY") {
        assert!(
            out.read_line(&mut seen).unwrap() > 0,
            "child exited before READY: {seen}"
        );
    }
    let status = Command::new(SCRIPT)
        .args(["rail-down", &ns.0, "1"])
        .status()
        .unwrap();
    assert!(status.success(), "tools/netns.sh rail-down failed");
    out.read_to_string(&mut seen).unwrap();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "child failed: {exit}\n{seen}");
    assert!(seen.contains("DOWN-SEEN "), "{seen}");
}
