//! Seed 001 over TCP: a HIGH request overtakes LOW bytes already on a
//! bulk connection's wire by going on the rail's express connection.
//!
//! Alone in its binary: what it checks is an order of completions, which
//! other tests' threads competing for two cores would blur.

mod common;

use std::time::Duration;

use common::{reap, test_config};
use tent::{Engine, LocalAddr, Priority, RemoteAddr, TransportKind, op};

/// Over TCP: a HIGH WRITE submitted behind 160 MiB of LOW WRITEs (160 of
/// 1 MiB, one bulk connection with 256 slices of 256 KiB on its wire: 64
/// MiB, 64 requests, that its target thread serves in order) overtakes
/// them: it goes on the rail's express connection, whose socket holds no
/// bulk, and finishes while at most half of those do (without the express
/// connection: 56 seen, those of the 64 not done by then; with it, 0 to 8
/// most runs on two busy cores in a debug build, 17 once: its three
/// threads wait for a core while the bulk ones run, and the wire is deep
/// so that a wait of a few scheduler slices stays far from the failure it
/// tells apart); its data lands.
#[test]
fn over_tcp_high_overtakes_the_low_on_the_bulk_connections_wire() {
    let target = common::engine();
    let (low, n) = (1u64 << 20, 160u64);
    let dst = target.allocate_memory(n * low + 4096).unwrap();
    let mut c = test_config();
    c.transports.shm.enable = false;
    c.transports.tcp.connections_per_peer = 1;
    c.transports.tcp.max_inflight_per_connection = 256;
    let init = Engine::new(c).unwrap();
    let seg = init.open_segment(&target.segment_name()).unwrap();
    let src = init.allocate_memory(low).unwrap();
    let pat = common::pattern(9, 4096);
    src.write(0, &pat).unwrap();
    let mut ring = init.ring_with_depth(256).unwrap();
    let write = |off: u64, len: u64, p: Priority| {
        op::Write::new(
            LocalAddr::new(src.id(), 0),
            RemoteAddr::new(seg, dst.addr() + off),
            len,
        )
        .priority(p)
    };
    // Connect both connections first (a connect is not what is measured).
    ring.submission()
        .push(write(0, 4096, Priority::Low).user_data(200))
        .unwrap();
    ring.submission()
        .push(write(0, 4096, Priority::High).user_data(201))
        .unwrap();
    reap(&mut ring, 2);
    {
        let mut sq = ring.submission();
        for i in 0..n {
            sq.push(write(i * low, low, Priority::Low).user_data(i))
                .unwrap();
        }
    }
    // Let the worker fill the bulk connection's wire; what finished
    // meanwhile is not behind the HIGH request.
    std::thread::sleep(Duration::from_millis(2));
    let mut done: Vec<tent::Cqe> = ring.completion().collect();
    let before = done.len();
    ring.submission()
        .push(write(n * low, 4096, Priority::High).user_data(100))
        .unwrap();
    done.extend(reap(&mut ring, n as usize + 1 - before));
    for c in &done {
        assert!(c.result().is_ok(), "{:?}", c.result());
        assert_eq!(c.transport(), TransportKind::Tcp);
    }
    let order: Vec<u64> = done[before..].iter().map(|c| c.user_data()).collect();
    let ahead = order.iter().position(|&u| u == 100).unwrap();
    assert!(
        ahead <= 32,
        "{ahead} LOW requests finished between HIGH's submit and its CQE: {order:?}"
    );
    let mut got = vec![0u8; 4096];
    dst.read(n * low, &mut got).unwrap();
    assert!(got == pat, "HIGH's bytes landed");
}
