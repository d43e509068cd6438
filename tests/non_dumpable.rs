//! `non_dumpable`: a process of the engine's own user cannot open the
//! engine's registered memory through `/proc/<pid>/fd` (the memfds it
//! exports to shm peers), which needs no secret; without the key it can.
//!
//! Both the engine and the prying process run as `nobody` (root passes the
//! `/proc` check whatever the flag): the engine is this test binary re-run
//! with `TENT_DUMPABLE_OWNER` set, the prying one a shell that tries to
//! open the descriptor. Skipped (with a line saying so) when the test does
//! not run as root, which it needs to drop to `nobody`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::test_config;
use tent::Engine;

/// `nobody`'s uid and gid on Debian.
const NOBODY: u32 = 65534;

/// Run `cmd` as `nobody`.
fn as_nobody(cmd: &mut Command) -> &mut Command {
    // SAFETY: setgid and setuid are async-signal-safe and touch only the child, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// The engine's half: memory exported over shm, then the pid and one of
/// its memfd descriptors printed; it lives until stdin closes.
#[test]
fn non_dumpable_owner_child() {
    let Some(flag) = std::env::var_os("TENT_DUMPABLE_OWNER") else {
        return;
    };
    let mut c = test_config();
    c.transports.shm.enable = true;
    c.non_dumpable = flag == "1";
    let e = Engine::new(c).unwrap();
    let _buf = e.allocate_memory(1 << 16).unwrap();
    let fd = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|d| d.ok())
        .find(|d| {
            std::fs::read_link(d.path()).is_ok_and(|t| t.to_string_lossy().contains("memfd:"))
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .expect("an exported region's memfd");
    println!("OWNER {} {fd}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
}

/// Whether `nobody` opens the memfd of an engine (also `nobody`) started
/// with `non_dumpable` = `flag`.
fn pried_open(flag: bool) -> bool {
    let mut owner = as_nobody(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "non_dumpable_owner_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TENT_DUMPABLE_OWNER", if flag { "1" } else { "0" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    )
    .spawn()
    .unwrap();
    let mut out = BufReader::new(owner.stdout.take().unwrap());
    let mut line = String::new();
    let (pid, fd) = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the engine exited: {:?}",
            owner.wait()
        );
        if let Some(at) = line.find("OWNER ") {
            let w: Vec<&str> = line[at + 6..].split_whitespace().collect();
            break (w[0].to_owned(), w[1].to_owned());
        }
    };
    let status =
        as_nobody(Command::new("/bin/sh").args(["-c", &format!("exec 3< /proc/{pid}/fd/{fd}")]))
            .stderr(Stdio::null())
            .status()
            .unwrap();
    drop(owner.stdin.take());
    assert!(owner.wait().unwrap().success());
    status.success()
}

#[test]
fn a_non_dumpable_engine_s_memory_cannot_be_opened_through_proc_by_its_own_user() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: needs root to run both processes as nobody"
        );
        return;
    }
    assert!(
        pried_open(false),
        "a dumpable engine's memfd could not be opened: the check proves nothing"
    );
    assert!(
        !pried_open(true),
        "a same-user process opened a non_dumpable engine's memory through /proc"
    );
}
