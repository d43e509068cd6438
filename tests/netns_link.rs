//! Link state across a real link: a veth rail (tools/netns.sh) is set down
//! while a [`tent::netlink::LinkWatch`] runs inside its namespace. With
//! CI=true this test must run; elsewhere it skips, saying why.
//!
//! The watcher is this test binary re-run inside the namespace with
//! `TENT_NETNS_LINK_IF` set and the filter of its `_child` test, since a
//! netlink socket only sees the links of the namespace it was opened in.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::netns::Netns;
use tent::netlink::{LinkWatch, interface_of, link_up};

const ENV_IF: &str = "TENT_NETNS_LINK_IF";

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
    let Some(ns) = Netns::up("tl", 1, None) else {
        return;
    };
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
    ns.rail_down(1);
    out.read_to_string(&mut seen).unwrap();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "child failed: {exit}\n{seen}");
    assert!(seen.contains("DOWN-SEEN "), "{seen}");
}
