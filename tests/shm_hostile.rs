//! Hostile same-host peers: forged shm segments,
//! an owner that truncates memory a peer mapped, and owner liveness that a
//! pid cannot fake (pid reuse, pid namespaces sharing `/dev/shm`).
//!
//! Forged segments here are written in the on-disk shape the engine once
//! trusted (a region-header descriptor file listing region files): a
//! process of our uid can write those, and they must be refused. The
//! two-process halves are this test binary re-run with a `_child` filter.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use common::{engine, pattern, reap};
use tent::control::wire::{self, Message};
use tent::{Engine, ErrorKind, LocalAddr, RemoteAddr, SegmentId, op};

const DESC_CAPACITY: usize = 1024;
const HEADER_WORDS: usize = 8;
const ENTRY_WORDS: usize = 16;
const DATA_OFFSET: u64 = 4096;

/// One region-header file: magic, version, type, header length, payload
/// length, four layout words, owner pid; the payload follows at 128.
fn region_file(path: &str, ty: u32, layout: [u64; 4], payload: &[u8], declared_len: u64) {
    let mut h = Vec::with_capacity(128);
    h.extend_from_slice(b"TENTRGN1");
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&ty.to_le_bytes());
    h.extend_from_slice(&128u32.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&declared_len.to_le_bytes());
    for w in layout {
        h.extend_from_slice(&w.to_le_bytes());
    }
    h.extend_from_slice(&std::process::id().to_le_bytes());
    h.resize(128, 0);
    h.extend_from_slice(payload);
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    f.write_all(&h).unwrap();
}

/// A forged entry: id, base, len, key, region file name.
struct Forged<'a> {
    id: u64,
    base: u64,
    len: u64,
    key: u64,
    file: &'a str,
}

/// Forged files, removed when dropped.
struct Forgery {
    name: String,
    files: Vec<String>,
}

impl Drop for Forgery {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn forged_name(tag: &str) -> String {
    format!("tent-forged-{tag}-{}", std::process::id())
}

/// Write a descriptor `name` listing `entries`, and for each `(file,
/// payload bytes, layout len)` in `regions` a data file whose first word is
/// `key` (so the live-key check passes).
fn forge(name: &str, entries: &[Forged<'_>], regions: &[(&str, usize, u64, u64)]) -> Forgery {
    let mut files = Vec::new();
    for &(file, payload_len, layout_len, key) in regions {
        let path = format!("/dev/shm/{file}");
        let mut payload = vec![0u8; payload_len];
        payload[..8].copy_from_slice(&key.to_le_bytes());
        region_file(
            &path,
            4,
            [layout_len, DATA_OFFSET, 0, 0],
            &payload,
            payload_len as u64,
        );
        files.push(path);
    }
    let desc_len = (HEADER_WORDS + DESC_CAPACITY * ENTRY_WORDS) * 8;
    let mut desc = vec![0u8; desc_len];
    desc[0..8].copy_from_slice(&2u64.to_le_bytes()); // seqlock: even
    desc[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = (HEADER_WORDS + i * ENTRY_WORDS) * 8;
        for (j, w) in [e.id, e.base, e.len, e.key].into_iter().enumerate() {
            desc[at + j * 8..at + j * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        desc[at + 32..at + 32 + e.file.len()].copy_from_slice(e.file.as_bytes());
    }
    let path = format!("/dev/shm/{name}");
    region_file(
        &path,
        2,
        [DESC_CAPACITY as u64, (ENTRY_WORDS * 8) as u64, 1, 0],
        &desc,
        desc_len as u64,
    );
    files.push(path);
    Forgery {
        name: name.to_owned(),
        files,
    }
}

/// Kinds a refused segment may report (typed, never a crash or success).
fn assert_refused(r: tent::Result<SegmentId>, what: &str) {
    match r {
        Ok(seg) => panic!("{what}: forged segment accepted as segment {}", seg.0),
        Err(e) => assert!(
            matches!(
                e.kind(),
                ErrorKind::InvalidArgument
                    | ErrorKind::AccessDenied
                    | ErrorKind::SegmentNotFound
                    | ErrorKind::ProcessFailed
            ),
            "{what}: refused with an unexpected kind: {e}"
        ),
    }
}

#[test]
fn forged_region_len_near_2_pow_64_is_refused() {
    let name = forged_name("huge");
    let file = format!("{name}-r1");
    // DATA_OFFSET + len wraps to 0, so "file holds 8 KiB < 0" is false.
    let len = u64::MAX - (DATA_OFFSET - 1);
    let f = forge(
        &name,
        &[Forged {
            id: 1,
            base: 0x7000_0000_0000,
            len,
            key: 77,
            file: &file,
        }],
        &[(&file, 8192, len, 77)],
    );
    let e = engine();
    assert_refused(e.open_segment(&f.name), "len near 2^64");
}

#[test]
fn forged_wrapping_base_plus_len_is_refused() {
    let name = forged_name("wrap");
    let file = format!("{name}-r1");
    let f = forge(
        &name,
        &[Forged {
            id: 1,
            base: u64::MAX - 100,
            len: 4096,
            key: 77,
            file: &file,
        }],
        &[(&file, 8192, 4096, 77)],
    );
    let e = engine();
    assert_refused(e.open_segment(&f.name), "base + len wraps");
}

#[test]
fn forged_overlapping_regions_are_refused() {
    let name = forged_name("overlap");
    let (a, b) = (format!("{name}-r1"), format!("{name}-r2"));
    let f = forge(
        &name,
        &[
            Forged {
                id: 1,
                base: 0x1000_0000,
                len: 8192,
                key: 77,
                file: &a,
            },
            Forged {
                id: 2,
                base: 0x1000_1000,
                len: 8192,
                key: 78,
                file: &b,
            },
        ],
        &[(&a, 12288, 8192, 77), (&b, 12288, 8192, 78)],
    );
    let e = engine();
    assert_refused(e.open_segment(&f.name), "overlapping regions");
}

#[test]
fn forged_path_in_region_file_name_is_refused() {
    // ".." has no '/', yet joined to the shm dir it names the parent.
    let name = forged_name("dotdot");
    let f = forge(
        &name,
        &[Forged {
            id: 1,
            base: 0x1000_0000,
            len: 4096,
            key: 77,
            file: "..",
        }],
        &[],
    );
    let e = engine();
    assert_refused(e.open_segment(&f.name), "\"..\" as region file");
}

#[test]
fn symlinked_segment_is_refused() {
    let target = engine();
    let _buf = target.allocate_memory(4096).unwrap();
    let real = target.local_segment_name().unwrap().to_owned();
    let link = forged_name("symlink");
    let link_path = format!("/dev/shm/{link}");
    let _ = std::fs::remove_file(&link_path);
    std::os::unix::fs::symlink(format!("/dev/shm/{real}"), &link_path).unwrap();
    let _cleanup = Forgery {
        name: link.clone(),
        files: vec![link_path],
    };
    let e = engine();
    assert_refused(e.open_segment(&link), "symlink to a segment");
    // The real name still opens.
    assert!(e.open_segment(&real).is_ok());
}

#[test]
fn segment_of_another_uid_is_refused() {
    let target = engine();
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.local_segment_name().unwrap().to_owned();
    let path = format!("/dev/shm/{name}");
    let c = std::ffi::CString::new(path.clone()).unwrap();
    // SAFETY: lchown on a NUL-terminated path we own; 65534 is `nobody`.
    let rc = unsafe { libc::lchown(c.as_ptr(), 65534, 65534) };
    assert_eq!(
        rc,
        0,
        "chown needs root: {}",
        std::io::Error::last_os_error()
    );
    let e = engine();
    assert_refused(e.open_segment(&name), "segment file of another uid");
}

/// A control server on this host that answers every `GetDescriptor` with
/// our boot id and `shm_name`, as a hostile local process could.
fn fake_control_server(shm_name: String) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let name = addr.clone();
    let h = std::thread::spawn(move || {
        l.set_nonblocking(false).unwrap();
        for _ in 0..4 {
            let Ok((mut s, _)) = l.accept() else { return };
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let Ok(Message::Hello { .. }) = wire::read_message(&mut s) else {
                continue;
            };
            wire::write_message(
                &mut s,
                &Message::Challenge {
                    nonce: [9; 32],
                    auth_required: false,
                },
            )
            .unwrap();
            let Ok(Message::GetDescriptor) = wire::read_message(&mut s) else {
                continue;
            };
            let d = tent::control::SegmentDescriptor {
                name: name.clone(),
                host_id: tent::control::host_id(),
                pid: std::process::id(),
                shm_name: Some(shm_name.clone()),
                ..Default::default()
            };
            let _ = wire::write_message(&mut s, &Message::Descriptor(d));
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
    });
    (addr, h)
}

#[test]
fn fake_control_server_routing_to_a_forged_shm_segment_is_refused() {
    let name = forged_name("p2p");
    let file = format!("{name}-r1");
    let len = u64::MAX - (DATA_OFFSET - 1);
    let base = 0x7000_0000_0000u64;
    let _f = forge(
        &name,
        &[Forged {
            id: 1,
            base,
            len,
            key: 77,
            file: &file,
        }],
        &[(&file, 8192, len, 77)],
    );
    let (addr, _server) = fake_control_server(name.clone());
    let e = engine();
    let seg = match e.open_segment(&addr) {
        Err(err) => {
            assert_ne!(err.kind(), ErrorKind::Timeout, "{err}");
            return;
        }
        Ok(seg) => seg,
    };
    assert!(
        e.segment_peer(seg).is_none(),
        "the forged shm segment was mapped"
    );
    // Nothing reaches it: ops fail typed and touch no memory.
    let local = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, base + (1 << 40)),
                4096,
            )
            .user_data(1),
        )
        .unwrap();
    assert!(reap(&mut ring, 1)[0].result().is_err());
}

// ---- two processes: an owner that truncates what the peer mapped --------

/// A target half: export a patterned region, print `SEGMENT name base pid`,
/// then answer `TRUNCATE` (try to shrink every file mapped under the
/// segment's name to 0, reporting how many shrank) and `CHECK`.
#[test]
fn two_process_hostile_target_child() {
    if std::env::var_os("TENT_HOSTILE_TARGET").is_none() {
        return;
    }
    let e = engine();
    let buf = e.allocate_memory(1 << 20).unwrap();
    buf.write(0, &pattern(1, 1 << 20)).unwrap();
    let name = e.local_segment_name().unwrap().to_owned();
    println!("SEGMENT {name} {} {}", buf.addr(), std::process::id());
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        match line.trim() {
            "TRUNCATE" => {
                let (mut shrunk, mut refused) = (0, 0);
                let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
                for l in maps.lines().filter(|l| l.contains(&name)) {
                    let range = l.split_whitespace().next().unwrap();
                    let Ok(f) = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(format!("/proc/self/map_files/{range}"))
                    else {
                        refused += 1;
                        continue;
                    };
                    match f.set_len(0) {
                        Ok(()) => shrunk += 1,
                        Err(_) => refused += 1,
                    }
                }
                println!("TRUNCATED {shrunk} {refused}");
            }
            "CHECK" => {
                let mut out = vec![0u8; 4096];
                buf.read(0, &mut out).unwrap();
                println!("CHECK {}", out[..8] == [5u8; 8]);
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
    pid: u32,
}

impl Target {
    /// Start the target half; with `pidns`, inside a new pid namespace where
    /// it gets pid `pidns` (`/dev/shm` stays shared).
    fn start(pidns: Option<u32>) -> Target {
        let exe = std::env::current_exe().unwrap();
        let args = [
            "--exact",
            "two_process_hostile_target_child",
            "--nocapture",
            "--test-threads=1",
        ];
        let mut cmd = match pidns {
            None => {
                let mut c = Command::new(&exe);
                c.args(args);
                c
            }
            Some(pid) => {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--kill-child", "sh", "-c"]);
                c.arg(
                    "echo $1 > /proc/sys/kernel/ns_last_pid || exit 9; shift; \"$@\"; st=$?; exit $st",
                );
                c.arg("sh").arg((pid - 1).to_string()).arg(&exe).args(args);
                c
            }
        };
        let mut child = cmd
            .env("TENT_HOSTILE_TARGET", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (name, base, pid) = loop {
            let l = lines.next().expect("target exited early").unwrap();
            if let Some(rest) = l.find("SEGMENT ").map(|i| &l[i + 8..]) {
                let p: Vec<&str> = rest.split_whitespace().collect();
                break (
                    p[0].to_owned(),
                    p[1].parse().unwrap(),
                    p[2].parse().unwrap(),
                );
            }
        };
        if let Some(want) = pidns {
            assert_eq!(pid, want, "the target did not get the pid asked for");
        }
        Target {
            child,
            stdin,
            lines,
            name,
            base,
            pid,
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

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

fn write_op(local: &tent::Buffer, seg: SegmentId, addr: u64, len: u64, ud: u64) -> op::Write {
    op::Write::new(
        LocalAddr::new(local.id(), 0),
        RemoteAddr::new(seg, addr),
        len,
    )
    .user_data(ud)
}

/// The initiator half (a child, so a SIGBUS shows up as a signal in the
/// parent's assertion instead of killing the whole test binary).
#[test]
fn two_process_truncate_initiator_child() {
    if std::env::var_os("TENT_TRUNCATE_INITIATOR").is_none() {
        return;
    }
    let mut t = Target::start(None);
    let e = engine();
    let seg = e.open_segment(&t.name).unwrap();
    let local = e.allocate_memory(1 << 20).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(
            op::Read::new(
                LocalAddr::new(local.id(), 0),
                RemoteAddr::new(seg, t.base),
                1 << 20,
            )
            .user_data(1),
        )
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 20));
    let said = t.ask("TRUNCATE", "TRUNCATED");
    eprintln!("target: {said}");
    // Whatever the owner managed, READ and WRITE either work or fail typed.
    local.write(0, &[5u8; 4096]).unwrap();
    for round in 0..3u64 {
        ring.submission()
            .push(
                op::Read::new(
                    LocalAddr::new(local.id(), 4096),
                    RemoteAddr::new(seg, t.base + 8192),
                    1 << 19,
                )
                .user_data(10 + round),
            )
            .unwrap();
        ring.submission()
            .push(write_op(&local, seg, t.base, 4096, 20 + round))
            .unwrap();
        for c in reap(&mut ring, 2) {
            let r = c.result();
            assert!(
                r.is_ok() || r.is_err_and(|k| k != ErrorKind::InvalidArgument),
                "op {} gave {r:?}",
                c.user_data()
            );
        }
    }
    if said == "TRUNCATED 0 0" {
        panic!("the target found nothing of its segment mapped");
    }
    if said.starts_with("TRUNCATED 0 ") {
        // The owner could not shrink anything: data still flows both ways.
        assert_eq!(t.ask("CHECK", "CHECK"), "CHECK true");
    }
    println!("INITIATOR SURVIVED");
    t.kill();
}

#[test]
fn two_process_owner_truncating_mapped_region_does_not_kill_initiator() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "two_process_truncate_initiator_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENT_TRUNCATE_INITIATOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("INITIATOR SURVIVED"),
        "initiator died or failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
}

// ---- liveness: never by a bare pid ---------------------------------------

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// A pid no process in this namespace has (for a target to take in its own
/// pid namespace).
fn free_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (max - 400..max - 1)
        .rev()
        .find(|&p| !pid_alive(p))
        .expect("a free pid near pid_max")
}

/// Push WRITEs until one fails `ProcessFailed` (only success before it).
fn until_process_failed(e: &Engine, seg: SegmentId, base: u64) {
    let local = e.allocate_memory(4096).unwrap();
    let mut ring = e.ring().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    let mut ud = 1;
    loop {
        ring.submission()
            .push(write_op(&local, seg, base, 4096, ud))
            .unwrap();
        let r = reap(&mut ring, 1)[0].result();
        if r == Err(ErrorKind::ProcessFailed) {
            return;
        }
        assert_eq!(r, Ok(4096), "only success or ProcessFailed");
        assert!(Instant::now() < until, "ProcessFailed never reported");
        ud += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_process_dead_owner_whose_pid_is_reused_is_seen_dead() {
    // The owner's pid (in its namespace) is ours here: alive, unrelated.
    let me = std::process::id();
    let t = Target::start(Some(me));
    let e = engine();
    let seg = e.open_segment(&t.name).unwrap();
    let base = t.base;
    t.kill();
    assert!(pid_alive(me));
    until_process_failed(&e, seg, base);
}

#[test]
fn two_process_dead_owner_files_are_collected_even_if_its_pid_lives() {
    let me = std::process::id();
    let t = Target::start(Some(me));
    let name = t.name.clone();
    assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    t.kill();
    std::thread::sleep(Duration::from_millis(50));
    let other = engine(); // its start collects what dead owners left
    assert!(
        !std::path::Path::new(&format!("/dev/shm/{name}")).exists(),
        "a dead owner's segment survived another engine's start"
    );
    let err = other.open_segment(&name).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::SegmentNotFound | ErrorKind::ProcessFailed
        ),
        "{err}"
    );
}

#[test]
fn two_process_live_owner_in_another_pid_namespace_is_not_collected() {
    // Its pid is unused here, so `kill(pid, 0)` says "gone".
    let pid = free_pid();
    let mut t = Target::start(Some(pid));
    assert!(!pid_alive(t.pid));
    let e = engine(); // starting an engine must not delete a live segment
    assert!(
        std::path::Path::new(&format!("/dev/shm/{}", t.name)).exists(),
        "another engine's start deleted a live owner's segment"
    );
    let seg = e.open_segment(&t.name).unwrap();
    let local = e.allocate_memory(4096).unwrap();
    local.write(0, &[5u8; 4096]).unwrap();
    let mut ring = e.ring().unwrap();
    ring.submission()
        .push(write_op(&local, seg, t.base, 4096, 1))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    assert_eq!(t.ask("CHECK", "CHECK"), "CHECK true");
    // The peer's refresher, watching the connection, keeps it alive.
    std::thread::sleep(Duration::from_millis(300));
    ring.submission()
        .push(write_op(&local, seg, t.base, 4096, 2))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(4096));
    t.kill();
}

// ---- a hostile owner speaking the real handout protocol --------------------

fn engine_with_secret(secret: &str) -> Engine {
    let mut c = common::test_config();
    c.rpc_shared_secret = secret.into();
    Engine::new(c).unwrap()
}

#[test]
fn hostile_owner_descriptors_are_refused_by_the_parser() {
    use tent::transport::shm::ShmEntry;
    let target = engine();
    let buf = target.allocate_memory(4096).unwrap();
    let export = target.shm_export().unwrap();
    let name = export.name().to_owned();
    let handle = export.handle_of(buf.id()).unwrap();
    let e = |id, base, len| ShmEntry {
        id,
        base,
        len,
        key: 77,
        handle,
        slot: export.slot_of(buf.id()).unwrap(),
    };
    let cases: Vec<(&str, Vec<ShmEntry>)> = vec![
        (
            "len near 2^64",
            vec![e(1, 0x7000_0000_0000, u64::MAX - 4095)],
        ),
        ("base + len wraps", vec![e(1, u64::MAX - 100, 4096)]),
        (
            "overlapping",
            vec![e(1, 0x1000_0000, 8192), e(2, 0x1000_1000, 4096)],
        ),
        ("longer than its memfd", vec![e(1, 0x1000_0000, 1 << 20)]),
        ("zero length", vec![e(1, 0x1000_0000, 0)]),
        (
            "zero key",
            vec![ShmEntry {
                key: 0,
                ..e(1, 0x1000_0000, 4096)
            }],
        ),
    ];
    for (what, entries) in cases {
        export.forge_descriptor(&entries);
        let init = engine();
        let err = init.open_segment(&name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{what}: {err}");
    }
}

#[test]
fn hostile_owner_forging_after_open_fails_ops_typed_and_keeps_the_old_view() {
    use tent::transport::shm::ShmEntry;
    let target = engine();
    let buf = target.allocate_memory(1 << 16).unwrap();
    let export = target.shm_export().unwrap();
    let handle = export.handle_of(buf.id()).unwrap();
    let init = engine();
    let seg = init.open_segment(export.name()).unwrap();
    let key = init.segment_peer(seg).unwrap().key_of(buf.addr()).unwrap();
    let huge = 0x7000_0000_0000u64;
    export.forge_descriptor(&[
        ShmEntry {
            id: buf.id().index(),
            base: buf.addr(),
            len: 1 << 16,
            key,
            handle,
            slot: export.slot_of(buf.id()).unwrap(),
        },
        ShmEntry {
            id: 99,
            base: huge,
            len: u64::MAX - huge,
            key,
            handle,
            slot: 1023,
        },
    ]);
    let local = init.allocate_memory(1 << 16).unwrap();
    local.write(0, &pattern(9, 1 << 16)).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(write_op(&local, seg, huge + (1 << 30), 4096, 1))
        .unwrap();
    ring.submission()
        .push(write_op(&local, seg, buf.addr(), 1 << 16, 2))
        .unwrap();
    let mut c = reap(&mut ring, 2);
    c.sort_by_key(|c| c.user_data());
    assert_eq!(c[0].result(), Err(ErrorKind::AddressNotRegistered));
    assert_eq!(c[1].result(), Ok(1 << 16));
    let mut out = vec![0u8; 1 << 16];
    buf.read(0, &mut out).unwrap();
    assert!(out == pattern(9, 1 << 16));
}

#[test]
fn shm_handout_requires_the_shared_secret_when_set() {
    let secret = "0123456789abcdef-shm";
    let target = engine_with_secret(secret);
    let _buf = target.allocate_memory(4096).unwrap();
    let name = target.local_segment_name().unwrap().to_owned();
    let err = engine().open_segment(&name).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    let err = engine_with_secret("fedcba9876543210-shm")
        .open_segment(&name)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
    let right = engine_with_secret(secret);
    let seg = right.open_segment(&name).unwrap();
    assert!(!right.segment_regions(seg).unwrap().is_empty());
    // Holding a secret, we refuse an owner that does not authenticate.
    let plain = engine();
    let _b = plain.allocate_memory(4096).unwrap();
    let err = right
        .open_segment(plain.local_segment_name().unwrap())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AccessDenied, "{err}");
}

// ---- an owner announcing more than a peer may map --------------------------

/// Mappings in this process of segment `name`'s region memfds (the owner's
/// own, and each peer's: owner and peers share this test process).
fn region_mappings(name: &str) -> usize {
    let needle = format!("/memfd:{name}-r");
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&needle))
        .count()
}

/// An initiator whose shm caps are `per_peer` and `total` bytes (0: derived).
fn engine_mapping_at_most(per_peer: u64, total: u64) -> Engine {
    let mut c = common::test_config();
    c.transports.shm.max_mapped_bytes_per_peer = per_peer;
    c.transports.shm.max_mapped_bytes = total;
    Engine::new(c).unwrap()
}

#[test]
fn owner_announcing_more_than_a_peer_may_map_is_refused_typed_with_nothing_mapped() {
    // Two 1 MiB regions: 2 MiB + two 4 KiB pages of a peer's address
    // space (a hostile owner's sparse 64 TiB memfds, scaled to the caps).
    let target = engine();
    let _a = target.allocate_memory(1 << 20).unwrap();
    let _b = target.allocate_memory(1 << 20).unwrap();
    let name = target.local_segment_name().unwrap().to_owned();
    let owners = region_mappings(&name);
    assert_eq!(owners, 2, "the owner maps its own two regions");
    let half = 3 << 19;
    for (per_peer, total, key) in [
        (half, 0, "max_mapped_bytes_per_peer"),
        (0, half, "max_mapped_bytes "),
    ] {
        let init = engine_mapping_at_most(per_peer, total);
        let err = init.open_segment(&name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfMemory, "{key}: {err}");
        assert!(err.to_string().contains(key), "{err}");
        assert_eq!(
            region_mappings(&name),
            owners,
            "{key}: a region of the refused segment was mapped"
        );
    }
    // Within both caps it opens, and maps both regions.
    let init = engine_mapping_at_most(3 << 20, 3 << 20);
    let seg = init.open_segment(&name).unwrap();
    assert_eq!(init.segment_regions(seg).unwrap().len(), 2);
    assert_eq!(region_mappings(&name), owners + 2);
}

#[test]
fn owner_growing_past_a_peer_s_cap_after_open_fails_ops_typed_and_keeps_the_old_view() {
    let target = engine();
    let a = target.allocate_memory(1 << 20).unwrap();
    let name = target.local_segment_name().unwrap().to_owned();
    let init = engine_mapping_at_most(3 << 19, 0);
    let seg = init.open_segment(&name).unwrap();
    assert_eq!(region_mappings(&name), 2, "the owner's and the peer's");
    // The owner lists a second 1 MiB region: 2 MiB and more in all.
    let b = target.allocate_memory(1 << 20).unwrap();
    let local = init.allocate_memory(1 << 16).unwrap();
    local.write(0, &pattern(5, 1 << 16)).unwrap();
    let mut ring = init.ring().unwrap();
    ring.submission()
        .push(write_op(&local, seg, b.addr(), 4096, 1))
        .unwrap();
    let c = reap(&mut ring, 1);
    assert_eq!(c[0].result(), Err(ErrorKind::OutOfMemory));
    assert_eq!(
        region_mappings(&name),
        3,
        "the refused region was not mapped by the peer"
    );
    // The regions mapped before still work.
    ring.submission()
        .push(write_op(&local, seg, a.addr(), 1 << 16, 2))
        .unwrap();
    assert_eq!(reap(&mut ring, 1)[0].result(), Ok(1 << 16));
    let mut out = vec![0u8; 1 << 16];
    a.read(0, &mut out).unwrap();
    assert!(out == pattern(5, 1 << 16));
}
