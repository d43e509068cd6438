//! The control plane across a real link: target and initiator in two
//! network namespaces joined by veth pairs (tools/netns.sh), each a
//! separate process. With CI=true these tests must run; elsewhere they
//! skip, saying why.
//!
//! Children are this test binary re-run inside a namespace with
//! `TENT_NETNS_ROLE` set and the filter of its `_child` test.

mod common;

use std::io::{BufReader, Write};

use common::netns::{Netns, line_with};

const SECRET: &str = "netns-shared-secret-0001";

fn config(host: &str, secret: bool) -> tent::Config {
    let mut c = common::test_config();
    c.rpc_server_hostname = host.to_owned();
    if secret {
        c.rpc_shared_secret = SECRET.into();
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
    let Some(ns) = Netns::up("tn", 2, None) else {
        return;
    };
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
