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

use common::netns::{Netns, config, line_with, say};
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
    queue_reads(&mut ring, &local, seg, remote, size, parts);
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

/// What a rail child starts from: an initiator engine in namespace a with
/// the target's segment open (`TENT_NETNS_TARGET`) and the size of its
/// pattern (`TENT_NETNS_SIZE`), and the rail interface it will set down
/// (`TENT_NETNS_IFACE`) with its index.
struct RailChild {
    e: std::sync::Arc<tent::Engine>,
    seg: tent::SegmentId,
    remote: u64,
    size: u64,
    dead_if: String,
    index: u32,
}

impl RailChild {
    fn from_env() -> RailChild {
        let target = std::env::var("TENT_NETNS_TARGET").unwrap();
        let size: u64 = std::env::var("TENT_NETNS_SIZE").unwrap().parse().unwrap();
        let dead_if = std::env::var("TENT_NETNS_IFACE").unwrap();
        let e = std::sync::Arc::new(tent::Engine::new(config("10.77.1.1")).unwrap());
        let seg = e.open_segment(&target).unwrap();
        let remote = e.segment_regions(seg).unwrap()[0].addr;
        let index = tent::netlink::interfaces()
            .unwrap()
            .into_iter()
            .find(|i| i.name == dead_if)
            .expect("rail interface")
            .index;
        RailChild {
            e,
            seg,
            remote,
            size,
            dead_if,
            index,
        }
    }
}

/// `seg`'s rail on local interface `name`, as the engine reports it now.
fn rail_on(e: &tent::Engine, seg: tent::SegmentId, name: &str) -> tent::transport::RailStat {
    e.rails(seg)
        .into_iter()
        .find(|r| r.local == name)
        .unwrap_or_else(|| panic!("no rail on {name}"))
}

/// Queue READs of the segment's first `size` bytes at `remote` into
/// `local`, in `parts` equal parts (user_data: the part's index).
fn queue_reads(
    ring: &mut tent::Ring,
    local: &tent::Buffer,
    seg: tent::SegmentId,
    remote: u64,
    size: u64,
    parts: u64,
) {
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
}

/// Chaos: READs stream over two rails while rail 2's link goes down and
/// up again, `TENT_NETNS_RUNS` times. The link is set down from this
/// process (one rtnetlink request: no process spawn in the timing), and
/// each run records how long until the first slice is moved off the dead
/// rail and until the surviving rail next completes verified bytes, then
/// how long after the link is back until rail 2 carries bytes again.
#[test]
fn netns_tcp_chaos_initiator_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("tcp-chaos") {
        return;
    }
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    tracing_init();
    let runs: usize = std::env::var("TENT_NETNS_RUNS").unwrap().parse().unwrap();
    let RailChild {
        e,
        seg,
        remote,
        size,
        dead_if,
        index,
    } = RailChild::from_env();
    let rail = |name: &str| rail_on(&e, seg, name);
    let survivor_if = e
        .rails(seg)
        .into_iter()
        .map(|r| r.local)
        .find(|l| *l != dead_if)
        .expect("a surviving rail");

    // The reader: 4 READs of 4 MiB in flight, each verified.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, bad) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (e, stop, ok, bad) = (e.clone(), stop.clone(), ok.clone(), bad.clone());
        std::thread::spawn(move || {
            let chunk = 4u64 << 20;
            let slots = 4u64;
            let local = e.allocate_memory(chunk * slots).unwrap();
            let expect = common::pattern(7, size as usize);
            let mut ring = e.ring().unwrap();
            let mut next = 0u64;
            let post = |ring: &mut tent::Ring, slot: u64, n: u64| {
                let off = (n * chunk) % size;
                ring.submission()
                    .push(
                        op::Read::new(
                            LocalAddr::new(local.id(), slot * chunk),
                            RemoteAddr::new(seg, remote + off),
                            chunk,
                        )
                        .user_data(slot << 32 | n),
                    )
                    .unwrap();
            };
            for slot in 0..slots {
                post(&mut ring, slot, next);
                next += 1;
            }
            ring.submit().unwrap();
            let mut inflight = slots;
            let mut buf = vec![0u8; chunk as usize];
            while inflight > 0 {
                let Ok(cqe) = ring.wait_one(Duration::from_secs(30)) else {
                    bad.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                inflight -= 1;
                let (slot, n) = (cqe.user_data() >> 32, cqe.user_data() & 0xffff_ffff);
                let off = ((n * chunk) % size) as usize;
                let good = cqe.result() == Ok(chunk) && {
                    local.read(slot * chunk, &mut buf).unwrap();
                    buf == expect[off..off + chunk as usize]
                };
                if good {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                if !stop.load(Ordering::Relaxed) {
                    post(&mut ring, slot, next);
                    next += 1;
                    inflight += 1;
                    ring.submit().unwrap();
                }
            }
        })
    };
    // Traffic first (the reader builds its 64 MiB reference pattern).
    let start = Instant::now();
    while ok.load(Ordering::Relaxed) < 8 {
        assert!(start.elapsed() < Duration::from_secs(60), "no traffic");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (mut moved_us, mut survivor_us, mut back_ms) = (Vec::new(), Vec::new(), Vec::new());
    let poll_until = |mut f: Box<dyn FnMut() -> bool + '_>, limit: Duration| -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if f() {
                return Some(t.elapsed());
            }
            std::thread::yield_now();
        }
        None
    };
    // A run counts when the dead rail held slices as its link went down
    // (else nothing moves and there is nothing to time): an attempt where
    // it held none is brought back up and run again, as the rxe twin does.
    let mut attempts = 0;
    while survivor_us.len() < runs {
        attempts += 1;
        assert!(
            attempts <= 3 * runs,
            "{attempts} attempts for {runs} runs: the rail kept holding no slice"
        );
        std::thread::sleep(Duration::from_millis(300));
        // Down while the rail carries slices: that is the case to time.
        let _ = poll_until(
            Box::new(|| rail(&dead_if).inflight > 0),
            Duration::from_secs(3),
        );
        let moved_before = rail(&dead_if).moved;
        let t0 = Instant::now();
        tent::netlink::set_link(index, false).unwrap();
        let mut survivor_at_move = None;
        let first = poll_until(
            Box::new(|| {
                if survivor_at_move.is_none() {
                    if rail(&dead_if).moved > moved_before {
                        moved_us.push(t0.elapsed().as_micros() as u64);
                        survivor_at_move = Some(rail(&survivor_if).bytes);
                    }
                    return false;
                }
                rail(&survivor_if).bytes > survivor_at_move.unwrap()
            }),
            Duration::from_secs(5),
        );
        let held = survivor_at_move.is_some();
        let survivor = first.map_or(u64::MAX, |_| t0.elapsed().as_micros() as u64);
        std::thread::sleep(Duration::from_millis(300));
        let before_up = rail(&dead_if).bytes;
        tent::netlink::set_link(index, true).unwrap();
        let back = poll_until(
            Box::new(|| rail(&dead_if).bytes > before_up),
            Duration::from_secs(10),
        );
        if !held {
            say(&format!(
                "attempt {attempts}: rail {dead_if} held no slice when its link went down; run again"
            ));
            continue;
        }
        survivor_us.push(survivor);
        back_ms.push(back.map_or(u64::MAX, |d| d.as_millis() as u64));
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let dead = rail(&dead_if);
    say(&format!(
        "RESULT ok={} bad={} moved_us={} survivor_us={} back_ms={} dead_rail_moved={} failovers={}",
        ok.load(Ordering::Relaxed),
        bad.load(Ordering::Relaxed),
        join(&moved_us),
        join(&survivor_us),
        join(&back_ms),
        dead.moved,
        e.metrics().failovers_total(),
    ));
    eprint!("{}", e.metrics_text());
}

/// A connect hung on a silent peer, cut by its link going down. Rail 2's
/// target end sends nothing (`Netns::mute`), so the slices sprayed there
/// wait on a connect that sits in SYN_SENT; once it is out, this sets rail
/// 2's link down and times how long until a slice moves to rail 1 and
/// until every READ is done.
#[test]
fn netns_tcp_hung_connect_initiator_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("tcp-hung-connect") {
        return;
    }
    tracing_init();
    let RailChild {
        e,
        seg,
        remote,
        size,
        dead_if,
        index,
    } = RailChild::from_env();
    let rail = |name: &str| rail_on(&e, seg, name);
    let local = e.allocate_memory(size).unwrap();
    let mut ring = e.ring().unwrap();
    let parts = 8;
    queue_reads(&mut ring, &local, seg, remote, size, parts);
    ring.submit().unwrap();
    // The muted rail holds slices, and its connect is out: a socket of
    // this namespace in SYN_SENT (state 02) to 10.77.2.2.
    let t = Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let connecting = table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2).is_some_and(|r| r.starts_with("02024D0A:")) && f.get(3) == Some(&"02")
        });
        if connecting && rail(&dead_if).inflight > 0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "rail {dead_if} never held a slice behind a hung connect"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let held = rail(&dead_if).inflight;
    let moved_before = rail(&dead_if).moved;
    let t0 = Instant::now();
    tent::netlink::set_link(index, false).unwrap();
    while rail(&dead_if).moved == moved_before {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no slice moved off rail {dead_if}"
        );
        std::thread::yield_now();
    }
    let moved_us = t0.elapsed().as_micros();
    let cqes = common::reap(&mut ring, parts as usize);
    let done_us = t0.elapsed().as_micros();
    let results: Vec<String> = cqes
        .iter()
        .map(|c| match c.result() {
            Ok(_) => "Ok".to_owned(),
            Err(k) => format!("{k:?}"),
        })
        .collect();
    let verified = cqes.iter().all(|c| c.result().is_ok()) && {
        let mut got = vec![0u8; size as usize];
        local.read(0, &mut got).unwrap();
        got == common::pattern(7, size as usize)
    };
    say(&format!(
        "RESULT held={held} moved_us={moved_us} done_us={done_us} verified={verified} results={}",
        results.join(",")
    ));
}

/// Log lines to stderr (the parent passes them through), at info.
fn tracing_init() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .try_init();
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn netns_tcp_chaos_rail_down_and_up_again_during_a_long_transfer() {
    let Some(ns) = Netns::up("tc", 2, Some("300mbit")) else {
        return;
    };
    let size = 64u64 << 20;
    let (target, name) = ns.target(size);
    let mut c = ns.exec(
        "a",
        "netns_tcp_chaos_initiator_child",
        &[
            ("TENT_NETNS_ROLE", "tcp-chaos".into()),
            ("TENT_NETNS_TARGET", name),
            ("TENT_NETNS_SIZE", size.to_string()),
            ("TENT_NETNS_IFACE", format!("{}a2", ns.0)),
            ("TENT_NETNS_RUNS", "5".into()),
        ],
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let result = line_with(&mut out, "RESULT ");
    assert!(c.wait().unwrap().success());
    target.stop();
    let list = |k: &str| -> Vec<u64> {
        field(&result, k)
            .split(',')
            .map(|x| x.parse().unwrap())
            .collect()
    };
    assert_eq!(field(&result, "bad="), "0", "every READ verified: {result}");
    assert!(
        field(&result, "ok=").parse::<u64>().unwrap() > 10,
        "{result}"
    );
    let (mut moved, survivor, mut back) =
        (list("moved_us="), list("survivor_us="), list("back_ms="));
    assert_eq!(survivor.len(), 5, "{result}");
    // Loose bounds (speed is the benchmark's business): each run moved the
    // dead rail's slices, the survivor carried verified bytes, and the
    // rail came back into service after its link did.
    assert!(survivor.iter().all(|&us| us < 2_000_000), "{result}");
    assert!(back.iter().all(|&ms| ms < 10_000), "{result}");
    let _ = std::io::stderr().write_all(
        format!(
            "tcp chaos, 2 rails x 300 Mbit, rail 2 down/up x5: link down -> first slice moved: median {} us; -> first verified bytes on the surviving rail after the move: median {} us (runs {:?} us); link up -> rail 2 carrying again: median {} ms; {result}\n",
            median(&mut moved),
            median(&mut survivor.clone()),
            survivor,
            median(&mut back),
        )
        .as_bytes(),
    );
}

/// A reconnect that hangs (the peer's end of the rail silent: SYNs go
/// unanswered) while the rail's link goes down: its slices move within the
/// chaos test's bound, not when the connect gives up (5 s here).
#[test]
fn netns_tcp_a_connect_hung_on_a_silent_peer_moves_its_slices_when_the_link_goes_down() {
    let Some(ns) = Netns::up("hc", 2, None) else {
        return;
    };
    ns.mute(2);
    let size = 16u64 << 20;
    let (target, name) = ns.target(size);
    let mut c = ns.exec(
        "a",
        "netns_tcp_hung_connect_initiator_child",
        &[
            ("TENT_NETNS_ROLE", "tcp-hung-connect".into()),
            ("TENT_NETNS_TARGET", name),
            ("TENT_NETNS_SIZE", size.to_string()),
            ("TENT_NETNS_IFACE", format!("{}a2", ns.0)),
        ],
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let result = line_with(&mut out, "RESULT ");
    assert!(c.wait().unwrap().success());
    target.stop();
    assert_eq!(field(&result, "verified="), "true", "{result}");
    assert!(
        field(&result, "results=").split(',').all(|r| r == "Ok"),
        "{result}"
    );
    // The chaos test's bound (link down -> verified bytes moved).
    let us = |k: &str| field(&result, k).parse::<u64>().unwrap();
    assert!(us("moved_us=") < 2_000_000, "{result}");
    assert!(us("done_us=") < 2_000_000, "{result}");
    let _ = std::io::stderr()
        .write_all(format!("tcp connect hung on a silent rail, link down: {result}\n").as_bytes());
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
    // The target's host is alive (it reset the connection, then refused
    // the reconnect): its process is gone, and every op says so.
    assert!(results.split(',').any(|r| r == "ProcessFailed"), "{result}");
    for r in results.split(',') {
        assert!(["Ok", "ProcessFailed"].contains(&r), "{result}");
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

/// In namespace b: an engine on 10.77.1.2 (loopback is up there too);
/// which addresses its data port accepts on.
#[test]
fn netns_tcp_bind_child() {
    if std::env::var("TENT_NETNS_ROLE").as_deref() != Ok("tcp-bind") {
        return;
    }
    let e = tent::Engine::new(config("10.77.1.2")).unwrap();
    let port = e.tcp_data_addr().unwrap().port();
    let accepts = |ip: &str| {
        let a: std::net::SocketAddr = format!("{ip}:{port}").parse().unwrap();
        std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok()
    };
    say(&format!(
        "RESULT advertised={} loopback={}",
        accepts("10.77.1.2"),
        accepts("127.0.0.1")
    ));
}

#[test]
fn netns_tcp_data_port_listens_only_on_advertised_addresses() {
    let Some(ns) = Netns::up("tb", 1, None) else {
        return;
    };
    let mut c = ns.exec(
        "b",
        "netns_tcp_bind_child",
        &[("TENT_NETNS_ROLE", "tcp-bind".into())],
    );
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let result = line_with(&mut out, "RESULT ");
    assert!(c.wait().unwrap().success());
    assert_eq!(field(&result, "advertised="), "true", "{result}");
    assert_eq!(
        field(&result, "loopback="),
        "false",
        "the data port accepts on an address the engine never advertised: {result}"
    );
}
