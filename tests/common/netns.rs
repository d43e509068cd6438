//! Two network namespaces joined by veth rails (tools/netns.sh), torn down
//! when dropped, even by a panic. With CI=true they must be creatable;
//! elsewhere `up` returns `None` after printing why.

use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// The harness script.
pub(crate) const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tools/netns.sh");

/// A pair of namespaces `NAME-a` / `NAME-b`.
pub(crate) struct Netns(pub String);

impl Netns {
    /// `rails` veth pairs (optionally shaped to `rate` each), named from
    /// `tag` and this process id; `None` (after printing why) when this
    /// machine cannot.
    pub(crate) fn up(tag: &str, rails: u32, rate: Option<&str>) -> Option<Netns> {
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
        let name = format!("{tag}{}", std::process::id() % 100_000);
        let mut cmd = Command::new(SCRIPT);
        cmd.args(["up", &name, &rails.to_string()]);
        if let Some(r) = rate {
            cmd.arg(r);
        }
        assert!(cmd.status().unwrap().success(), "tools/netns.sh up failed");
        Some(Netns(name))
    }

    /// Re-run this test binary's `child` test inside namespace `side`
    /// ("a" or "b") with `env`, stdin and stdout piped.
    pub(crate) fn exec(&self, side: &str, child: &str, env: &[(&str, String)]) -> Child {
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

    /// Make the target side of rail `i` send nothing, its link still up.
    pub(crate) fn mute(&self, i: u32) {
        let s = Command::new(SCRIPT)
            .args(["mute", &self.0, &i.to_string()])
            .status()
            .unwrap();
        assert!(s.success(), "tools/netns.sh mute failed");
    }

    /// Set rail `i`'s link down at both ends; when it was done.
    pub(crate) fn rail_down(&self, i: u32) -> Instant {
        let t = Instant::now();
        let s = Command::new(SCRIPT)
            .args(["rail-down", &self.0, &i.to_string()])
            .status()
            .unwrap();
        assert!(s.success(), "tools/netns.sh rail-down failed");
        t
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(SCRIPT).args(["down", &self.0]).status();
    }
}

/// The rest of the first line of `r` that contains `key`.
pub(crate) fn line_with(r: &mut impl BufRead, key: &str) -> String {
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

/// A line to the parent reading this child's stdout, flushed at once.
pub(crate) fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    o.write_all(line.as_bytes()).unwrap();
    o.write_all(b"\n").unwrap();
    o.flush().unwrap();
}

/// An engine config for one side of the namespaces, its control plane on
/// `host`.
pub(crate) fn config(host: &str) -> tent::Config {
    let mut c = super::test_config();
    c.rpc_server_hostname = host.to_owned();
    // The namespaces share /dev/shm: without this the peers would meet there.
    c.transports.shm.enable = false;
    c.default_timeout_ms = std::time::Duration::from_millis(30_000);
    c
}
