//! A C program, compiled with `cc` against `libtent_c.so`, moves data
//! between two processes: a target exporting a region and an initiator
//! that reads and writes it through tent's C API (batch, ring, block
//! lists) over shared memory, verifying every byte on both sides, and
//! notifies the target: the target, waiting meanwhile, finds the data
//! written before the notification there when it arrives.

mod support;

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Link, compile};

/// The target process, killed if the test fails before it exits.
struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Target {
    fn next_line(&mut self) -> String {
        self.lines
            .next()
            .expect("target exited early")
            .expect("target output")
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("target stdin");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn check(&mut self, off: u64, len: u64, seed: u8) -> String {
        self.send(&format!("CHECK {off} {len} {seed}"));
        self.next_line()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn two_process_c_program_moves_verified_data() {
    let exe = compile("two_process", Link::Shared);
    let mut child = Command::new(&exe)
        .arg("target")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the target");
    let stdin = child.stdin.take();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut target = Target {
        child,
        stdin,
        lines,
    };
    let first = target.next_line();
    let words: Vec<&str> = first.split_whitespace().collect();
    let [_, name, addr, len] = words[..] else {
        panic!("target said {first:?}, not SEGMENT <name> <addr> <len>");
    };
    assert!(first.starts_with("SEGMENT "), "{first}");
    let len: u64 = len.parse().unwrap();
    let (half, quarter) = (len / 2, len / 4);
    // The target waits for the initiator's first notification, then
    // checks the range that notification's submission wrote.
    target.send(&format!("NOTE 0 {quarter} 4"));

    let out = Command::new(&exe)
        .args(["initiator", name, addr, &len.to_string()])
        .output()
        .expect("run the initiator");
    assert!(
        out.status.success(),
        "initiator failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said: Vec<&str> = stdout.lines().collect();
    let [named, "INITIATOR OK"] = said[..] else {
        panic!("initiator said {stdout:?}");
    };
    let initiator = named.strip_prefix("INITIATOR ").expect("its segment name");

    // Each notification names its sender; "kv-ready" ("quarter") found
    // its data in place; "done" carries bytes, a NUL among them.
    assert_eq!(
        target.next_line(),
        format!("NOTE {initiator} kv-ready 71756172746572 CHECK OK")
    );
    target.send("NOTE 0 0 0");
    assert_eq!(
        target.next_line(),
        format!("NOTE {initiator} done 000102ff CHECK OK")
    );

    // The target's own memory holds what the initiator wrote: pattern 4
    // in the first quarter (with the notification), pattern 2 in the rest
    // of the first half (batch WRITE), pattern 3 in the second (ring).
    assert_eq!(target.check(0, quarter, 4), "CHECK OK");
    assert_eq!(target.check(quarter, half - quarter, 2), "CHECK OK");
    assert_eq!(target.check(half, half, 3), "CHECK OK");
    // And the check can fail: the first half does not hold pattern 3.
    assert_eq!(target.check(0, half, 3), "CHECK BAD");

    drop(target.stdin.take());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = target.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "target did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "target failed: {status}");
}
