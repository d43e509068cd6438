//! End-to-end over real processes: a target process exports a segment in
//! /dev/shm; this process opens it and moves data with the shm transport.
//!
//! The target is this same test binary re-run with `TENT_TEST_TARGET=1`
//! and the filter `two_process_target_child`; it talks over stdin/stdout.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::{engine, pattern, reap};
use tent::{ErrorKind, LocalAddr, RemoteAddr, TransportKind, op};

const REGION: u64 = 4 << 20;

/// The target side: export a patterned region, then answer commands.
#[test]
fn two_process_target_child() {
    if std::env::var_os("TENT_TEST_TARGET").is_none() {
        return;
    }
    let e = engine();
    let buf = e.allocate_memory(REGION).unwrap();
    let spare = e.allocate_memory(4096).unwrap();
    buf.write(0, &pattern(1, REGION as usize)).unwrap();
    println!(
        "SEGMENT {} {} {}",
        e.local_segment_name().unwrap(),
        buf.addr(),
        spare.addr()
    );
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["CHECK", off, len, seed] => {
                let (off, len, seed): (u64, usize, u8) = (
                    off.parse().unwrap(),
                    len.parse().unwrap(),
                    seed.parse().unwrap(),
                );
                let mut out = vec![0u8; len];
                buf.read(off, &mut out).unwrap();
                println!(
                    "{}",
                    if out == pattern(seed, len) {
                        "CHECK OK"
                    } else {
                        "CHECK BAD"
                    }
                );
            }
            ["REVOKE"] => {
                e.unregister_memory(spare.id()).unwrap();
                println!("REVOKED");
            }
            _ => break,
        }
        std::io::stdout().flush().unwrap();
    }
}

struct Target {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    name: String,
    base: u64,
    spare: u64,
}

impl Target {
    fn start() -> Target {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "two_process_target_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TENT_TEST_TARGET", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (name, base, spare) = loop {
            let l = lines.next().expect("target exited early").unwrap();
            // The harness may print "test ... " on the same line first.
            if let Some(rest) = l.find("SEGMENT ").map(|i| &l[i + 8..]) {
                let p: Vec<&str> = rest.split_whitespace().collect();
                break (
                    p[0].to_owned(),
                    p[1].parse().unwrap(),
                    p[2].parse().unwrap(),
                );
            }
        };
        Target {
            child,
            stdin,
            lines,
            name,
            base,
            spare,
        }
    }

    fn ask(&mut self, cmd: &str, expect_prefix: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let l = self.lines.next().expect("target exited").unwrap();
            if let Some(i) = l.find(expect_prefix) {
                return l[i..].to_owned();
            }
        }
    }

    fn finish(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "target failed: {status}");
    }
}

#[test]
fn two_process_read_write_verified() {
    let mut t = Target::start();
    let e = engine();
    let seg = e.open_segment(&t.name).unwrap();
    assert_eq!(e.open_segment(&t.name).unwrap(), seg, "same name, same id");
    let regions = e.segment_regions(seg).unwrap();
    assert!(regions.iter().any(|r| r.addr == t.base && r.len == REGION));
    let local = e.allocate_memory(REGION).unwrap();
    let mut ring = e.ring().unwrap();

    // READ the target's pattern across many slices.
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, t.base),
                REGION,
            )
            .user_data(1),
        )
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Ok(REGION));
    assert_eq!(c[0].transport(), TransportKind::Shm);
    let mut out = vec![0u8; REGION as usize];
    local.read(0, &mut out).unwrap();
    assert!(
        out == pattern(1, REGION as usize),
        "READ returned wrong bytes"
    );

    // WRITE a new pattern at an odd offset; the target checks its own memory.
    let (off, len) = (12_345u64, 1_000_000usize);
    local.write(0, &pattern(77, len)).unwrap();
    ring.submission()
        .push(
            op::Write::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, t.base + off),
                len as u64,
            )
            .user_data(2),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(len as u64));
    assert_eq!(t.ask(&format!("CHECK {off} {len} 77"), "CHECK"), "CHECK OK");
    assert_eq!(e.credits_in_flight(), 0);
    t.finish();
}

#[test]
fn two_process_bad_access_fails_typed_and_valid_ops_go_on() {
    let mut t = Target::start();
    let e = engine();
    let seg = e.open_segment(&t.name).unwrap();
    let local = e.allocate_memory(1 << 16).unwrap();
    local.write(0, &pattern(5, 1 << 16)).unwrap();
    let mut ring = e.ring().unwrap();
    let w = |addr: u64, len: u64, ud: u64| {
        op::Write::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, addr),
            len,
        )
        .user_data(ud)
    };
    assert_eq!(t.ask("REVOKE", "REVOKED"), "REVOKED");
    {
        let mut sq = ring.submission();
        // Withdrawn by the target after we opened the segment: the stale
        // entry is noticed, the descriptor re-read, and the address names
        // nothing any more.
        sq.push(w(t.spare, 64, 3)).unwrap();
        sq.push(w(t.base + REGION - 8, 64, 1)).unwrap(); // past the end
        sq.push(w(t.base - (1 << 30), 64, 2)).unwrap(); // nothing registered there
        sq.push(w(t.base, 1 << 16, 4)).unwrap(); // valid
    }
    let mut c = reap(&mut ring, 4);
    c.sort_by_key(|c| c.user_data());
    assert_eq!(c[0].result(), Err(ErrorKind::OutOfBounds));
    assert_eq!(c[1].result(), Err(ErrorKind::AddressNotRegistered));
    assert_eq!(c[2].result(), Err(ErrorKind::AddressNotRegistered));
    assert_eq!(c[3].result(), Ok(1 << 16));
    assert_eq!(
        t.ask(&format!("CHECK 0 {} 5", 1 << 16), "CHECK"),
        "CHECK OK"
    );
    assert_eq!(e.credits_in_flight(), 0);
    t.finish();
}

#[test]
fn two_process_target_exit_then_new_target_opens() {
    let t = Target::start();
    let name = t.name.clone();
    t.finish();
    std::thread::sleep(Duration::from_millis(50));
    let e = engine();
    // The target removed its files on exit: the name is gone.
    assert_eq!(
        e.open_segment(&name).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
    let t2 = Target::start();
    let seg = e.open_segment(&t2.name).unwrap();
    assert!(!e.segment_regions(seg).unwrap().is_empty());
    t2.finish();
}

#[test]
fn two_process_target_killed_ops_fail_process_failed() {
    let mut t = Target::start();
    let e = engine();
    let seg = e.open_segment(&t.name).unwrap();
    let local = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    let w = |ud| {
        op::Write::new(
            LocalAddr::new(local.id(), 0),
            RemoteAddr::new(seg, t.base),
            4096,
        )
        .user_data(ud)
    };
    ring.submission().push(w(1)).unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    t.child.kill().unwrap(); // SIGKILL: no cleanup in the target
    t.child.wait().unwrap();
    // Within the liveness check period (100 ms) ops start failing typed.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut ud = 2;
    loop {
        ring.submission().push(w(ud)).unwrap();
        let r = reap(&mut ring, 1)[0].result();
        if r == Err(ErrorKind::ProcessFailed) {
            break;
        }
        assert_eq!(r, Ok(4096), "only success or ProcessFailed");
        assert!(
            std::time::Instant::now() < until,
            "ProcessFailed never reported"
        );
        ud += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    // A new engine removes the dead process's files when it starts, so the
    // name is gone for it.
    assert!(e.open_segment(&t.name).is_ok(), "already open: same id");
    let other = engine();
    assert_eq!(
        other.open_segment(&t.name).unwrap_err().kind(),
        ErrorKind::SegmentNotFound
    );
    assert!(!std::path::Path::new(&format!("/dev/shm/{}", t.name)).exists());
    assert_eq!(e.credits_in_flight(), 0);
}
