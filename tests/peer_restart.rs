//! A peer that restarts (a new process: another incarnation under the same
//! name) is reached again without touching the initiator, in p2p mode
//! (the same `ip:port`) and through etcd (the same segment name, a new
//! address); work to a peer whose etcd lease expired fails `ProcessFailed`
//! within the lease TTL.
//!
//! The target is this test binary re-run with `TENT_TEST_PEER` set and the
//! filter `peer_restart_target_child`: it serves one region filled with a
//! pattern seeded by `TENT_TEST_PEER_SEED`, prints `READY <name> <addr>`,
//! and lives until its stdin closes (or it is killed).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{pattern, reap, test_config};
use tent::control::etcd::test_server::{EtcdServer, free_ports};
use tent::{Config, Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, op};

const REGION: u64 = 1 << 20;
const READ: u64 = 64 << 10;

/// How the target finds its peers, from the environment the parent set.
fn target_config() -> Config {
    let mut c = test_config();
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(port) = var("TENT_TEST_PEER_PORT") {
        c.rpc_server_port = port.parse().unwrap();
    }
    c.transports.shm.enable = var("TENT_TEST_PEER_SHM").is_some();
    if let Some(etcd) = var("TENT_TEST_PEER_ETCD") {
        c.metadata_type = tent::config::MetadataType::Etcd;
        c.metadata_servers = vec![etcd];
        c.metadata_segment_name = var("TENT_TEST_PEER_NAME").unwrap();
        c.metadata_lease_ttl_secs = Duration::from_secs(2);
    }
    c
}

#[test]
fn peer_restart_target_child() {
    if std::env::var_os("TENT_TEST_PEER").is_none() {
        return;
    }
    let seed: u8 = std::env::var("TENT_TEST_PEER_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let e = Engine::new(target_config()).unwrap();
    let buf = e.allocate_memory(REGION).unwrap();
    buf.write(0, &pattern(seed, REGION as usize)).unwrap();
    println!("READY {} {}", e.segment_name(), buf.addr());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
}

/// A target process.
struct Target {
    child: Child,
    name: String,
    /// Where its region starts (what it tells its peers out of band).
    addr: u64,
}

impl Target {
    /// Start one with `seed`'s pattern and `env`, and wait until it serves.
    // The child is kept in the `Target`, whose drop kills and waits for it.
    #[allow(clippy::zombie_processes)]
    fn start(seed: u8, env: &[(&str, String)]) -> Target {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "peer_restart_target_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENT_TEST_PEER", "1")
        .env("TENT_TEST_PEER_SEED", seed.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("target exited early: {:?}", child.wait());
            }
            if let Some(at) = line.find("READY ") {
                let w: Vec<&str> = line[at + 6..].split_whitespace().collect();
                // Keep reading its output so that it never blocks on a pipe.
                std::thread::spawn(move || for _ in out.lines() {});
                return Target {
                    child,
                    name: w[0].to_owned(),
                    addr: w[1].parse().unwrap(),
                };
            }
        }
    }

    /// SIGKILL: no goodbye, its lease (if any) left to expire.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Stop it with SIGSTOP and return once every one of its threads is
    /// stopped: `kill` returns when the signal is queued, and a thread
    /// already running (a TCP serving thread mid-request) keeps going
    /// until it is next scheduled, so a request sent right after could
    /// still be answered.
    fn stop(&self) {
        self.signal("-STOP");
        let tasks = format!("/proc/{}/task", self.child.id());
        let stopped = || {
            std::fs::read_dir(&tasks).unwrap().all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the command name, which is in
                // parentheses and may hold spaces.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .is_some_and(|s| s == "T" || s == "t")
            })
        };
        let start = Instant::now();
        while !stopped() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the target never stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.signal_quietly();
        self.kill();
    }
}

impl Target {
    fn signal_quietly(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

/// Push a READ of `READ` bytes at `at` of the segment into `local`.
fn push_read(ring: &mut tent::Ring, seg: SegmentId, at: u64, local: &tent::Buffer) {
    let read = op::Read::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, at),
        READ,
    );
    ring.submission().push(read.user_data(1)).unwrap();
}

/// One READ at `at` of the segment into `local`: its result, and which
/// seed's pattern the bytes are.
fn read_once(
    ring: &mut tent::Ring,
    seg: SegmentId,
    at: u64,
    local: &tent::Buffer,
) -> Result<Option<u8>, ErrorKind> {
    push_read(ring, seg, at, local);
    reap(ring, 1)[0].result()?;
    let mut got = vec![0u8; READ as usize];
    local.read(0, &mut got).unwrap();
    Ok((1..=8u8).find(|&s| got == pattern(s, READ as usize)))
}

/// The initiator reads in a loop while the target is killed and another
/// process takes its place: reads fail for a while (typed), then come
/// back with the new process's bytes, on the same segment id, with no
/// call but reads (at the address the new target says its region is at,
/// as an application learns it from its peer).
fn restart_under_load(init: Config, env: &[(&str, String)]) {
    let mut target = Target::start(1, env);
    let e = Engine::new(init).unwrap();
    let seg = e.open_segment(&target.name).unwrap();
    let local = e.allocate_memory(READ).unwrap();
    let mut ring = e.ring().unwrap();
    assert_eq!(read_once(&mut ring, seg, target.addr, &local), Ok(Some(1)));

    target.kill();
    let second = Target::start(2, env);
    assert_eq!(
        second.name, target.name,
        "the restarted target takes the same name"
    );
    let back = Instant::now();
    let deadline = back + Duration::from_secs(20);
    let mut errors = Vec::new();
    loop {
        match read_once(&mut ring, seg, second.addr, &local) {
            Ok(Some(2)) => break,
            Ok(other) => panic!("a read returned {other:?}'s pattern after the restart"),
            Err(kind) => {
                assert!(
                    matches!(
                        kind,
                        ErrorKind::ProcessFailed
                            | ErrorKind::Unreachable
                            | ErrorKind::AddressNotRegistered
                    ),
                    "{kind:?}"
                );
                errors.push(kind);
            }
        }
        assert!(
            Instant::now() < deadline,
            "reads did not reach the restarted peer ({} errors, the last {:?}; its regions now: {:?})",
            errors.len(),
            errors.last(),
            e.segment_regions(seg)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "reached the restarted peer {:?} after it served ({} reads refused meanwhile)",
        back.elapsed(),
        errors.len()
    );
    // The same id, now the new process's: reads keep working.
    for _ in 0..10 {
        assert_eq!(read_once(&mut ring, seg, second.addr, &local), Ok(Some(2)));
    }
    drop(second);
}

fn tcp_only() -> Config {
    let mut c = test_config();
    c.transports.shm.enable = false;
    c
}

#[test]
fn a_peer_restarted_on_the_same_address_is_reached_again_over_tcp() {
    let [port] = free_ports::<1>();
    restart_under_load(tcp_only(), &[("TENT_TEST_PEER_PORT", port.to_string())]);
}

#[test]
fn a_peer_restarted_on_the_same_address_is_reached_again_over_shm() {
    let [port] = free_ports::<1>();
    restart_under_load(
        test_config(),
        &[
            ("TENT_TEST_PEER_PORT", port.to_string()),
            ("TENT_TEST_PEER_SHM", "1".into()),
        ],
    );
}

fn etcd_config(etcd: &EtcdServer) -> Config {
    let mut c = tcp_only();
    c.metadata_type = tent::config::MetadataType::Etcd;
    c.metadata_servers = vec![etcd.endpoint()];
    c.metadata_lease_ttl_secs = Duration::from_secs(2);
    c
}

fn etcd_target(etcd: &EtcdServer, name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("TENT_TEST_PEER_ETCD", etcd.endpoint()),
        ("TENT_TEST_PEER_NAME", name.to_owned()),
    ]
}

#[test]
fn a_peer_restarted_under_its_etcd_name_is_reached_again_at_its_new_address() {
    let etcd = EtcdServer::start();
    restart_under_load(etcd_config(&etcd), &etcd_target(&etcd, "restarting-target"));
}

#[test]
fn work_to_a_peer_whose_lease_expired_fails_process_failed_within_the_ttl() {
    let etcd = EtcdServer::start();
    let target = Target::start(3, &etcd_target(&etcd, "stopped-target"));
    let mut c = etcd_config(&etcd);
    // A deadline far past the lease's TTL (2 s): only the lease ends it.
    c.default_timeout_ms = Duration::from_secs(30);
    let e = Engine::new(c).unwrap();
    let seg = e.open_segment(&target.name).unwrap();
    let local = e.allocate_memory(READ).unwrap();
    let mut ring = e.ring().unwrap();
    let at = target.addr;
    assert_eq!(read_once(&mut ring, seg, at, &local), Ok(Some(3)));

    // Stopped, not dead: its sockets stay open and answer nothing, and its
    // lease is no longer kept alive.
    target.stop();
    let t0 = Instant::now();
    push_read(&mut ring, seg, at, &local);
    let cqe = reap(&mut ring, 1)[0];
    let took = t0.elapsed();
    assert_eq!(cqe.result(), Err(ErrorKind::ProcessFailed));
    eprintln!("a READ to the stopped peer failed ProcessFailed after {took:?} (lease TTL 2 s)");
    // The TTL, etcd's expiry check (up to 0.5 s), the watch and the sweep.
    assert!(
        took < Duration::from_secs(4),
        "failed after {took:?}, the TTL is 2 s"
    );
    // New requests fail at once while it is gone.
    assert_eq!(
        read_once(&mut ring, seg, at, &local),
        Err(ErrorKind::ProcessFailed)
    );

    // Back: it publishes its record again (same incarnation) and the
    // segment reaches it again.
    target.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(15);
    while read_once(&mut ring, seg, at, &local) != Ok(Some(3)) {
        assert!(
            Instant::now() < deadline,
            "the resumed peer was not reached again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
