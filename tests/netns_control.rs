//! The control plane across a real link: target and initiator in two
//! network namespaces joined by veth pairs (tools/netns.sh), each a
//! separate process. With CI=true these tests must run; elsewhere they
//! skip, saying why.
//!
//! Children are this test binary re-run inside a namespace with
//! `TENT_NETNS_ROLE` set and the filter of its `_child` test.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/netns.sh");
const SECRET: &str = "netns-shared-secret-0001";

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
        let name = format!("tn{}", std::process::id() % 100_000);
        let status = Command::new(SCRIPT)
            .args(["up", &name, &rails.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "tools/netns.sh up failed");
        Some(Netns(name))
    }

    fn exec(&self, side: &str, child: &str, env: &[(&str, String)]) -> std::process::Child {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}-{side}", self.0)])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", child, "--nocapture", "--test-threads=1"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn().unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["down", &self.0]).status();
    }
}

fn line_with(r: &mut impl BufRead, key: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(
            r.read_line(&mut l).unwrap() > 0,
            "child exited before printing {key}"
        );
        if let Some(i) = l.find(key) {
            return l[i + key.len()..].trim().to_owned();
        }
    }
}

fn config(host: &str, secret: bool) -> tent::Config {
    let mut c = common::test_config();
    c.rpc_server_hostname = host.to_owned();
    if secret {
        c.rpc_shared_secret = SECRET.to_owned();
    }
    c
}

/// Target side: listen on rail 1's address in namespace a.
#[test]
fn netns_target_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("target") {
        return;
    }
    let e = tent::Engine::new(config("10.77.1.1", true)).unwrap();
    let b = e.allocate_memory(1 << 20).unwrap();
    b.write(0, &common::pattern(9, 1 << 20)).unwrap();
    println!("SEGMENT {} {}", e.segment_name(), b.addr());
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// Initiator side, in namespace b: open the target across the veth link.
#[test]
fn netns_initiator_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("initiator") {
        return;
    }
    let target = std::env::var("TENT_NETNS_TARGET").unwrap();
    let addr: u64 = std::env::var("TENT_NETNS_ADDR").unwrap().parse().unwrap();
    // Without the secret: refused.
    let plain = tent::Engine::new(config("10.77.1.2", false)).unwrap();
    let refused = plain.open_segment(&target).unwrap_err().kind();
    // With it: the descriptor lists the target's region.
    let e = tent::Engine::new(config("10.77.1.2", true)).unwrap();
    let seg = e.open_segment(&target).unwrap();
    let listed = e
        .segment_regions(seg)
        .unwrap()
        .iter()
        .any(|r| r.addr == addr && r.len == 1 << 20);
    println!("RESULT refused={refused:?} listed={listed}");
}

#[test]
fn netns_descriptor_fetch_across_a_veth_link_with_auth() {
    let Some(ns) = Netns::up(2) else { return };
    let mut target = ns.exec(
        "a",
        "netns_target_child",
        &[("TENT_NETNS_ROLE", "target".into())],
    );
    let mut out = BufReader::new(target.stdout.take().unwrap());
    let seg = line_with(&mut out, "SEGMENT ");
    let mut parts = seg.split_whitespace();
    let (name, addr) = (
        parts.next().unwrap().to_owned(),
        parts.next().unwrap().to_owned(),
    );
    assert!(name.starts_with("10.77.1.1:"), "{name}");
    let mut init = ns.exec(
        "b",
        "netns_initiator_child",
        &[
            ("TENT_NETNS_ROLE", "initiator".into()),
            ("TENT_NETNS_TARGET", name),
            ("TENT_NETNS_ADDR", addr),
        ],
    );
    let mut iout = BufReader::new(init.stdout.take().unwrap());
    let result = line_with(&mut iout, "RESULT ");
    assert!(init.wait().unwrap().success());
    drop(target.stdin.take());
    assert!(target.wait().unwrap().success());
    assert_eq!(result, "refused=AccessDenied listed=true");
}
