//! A throwaway single-member etcd for tests (the client's own, and the
//! integration tests' through the `testing` feature): started on free
//! loopback ports with a fresh data directory, killed and its data removed
//! at drop. The `etcd` binary comes from Debian's `etcd-server`
//! (tools/setup.sh); without it a test fails, saying so, rather than skip.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::EtcdClient;

/// The client timeout of [`EtcdServer::client`].
const TIMEOUT: Duration = Duration::from_secs(5);

/// One etcd member of a test.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    extra: Vec<String>,
}

/// `N` distinct ports free now (the kernel's picks for port 0, held
/// together so that it picks `N` different ones). etcd binds them a moment
/// later; a test that lost one to another test in between starts again.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: [TcpListener; N] = std::array::from_fn(|_| {
        TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
    });
    held.map(|l| l.local_addr().expect("local addr").port())
}

fn etcd_binary() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file());
    match found {
        Some(p) => p,
        None => panic!(
            "the etcd binary is not on PATH: run tools/setup.sh (it installs Debian's etcd-server)"
        ),
    }
}

impl EtcdServer {
    /// A member on fresh ports and data.
    pub fn start() -> EtcdServer {
        EtcdServer::start_with(&[])
    }

    /// A member started with `extra` flags.
    pub fn start_with(extra: &[&str]) -> EtcdServer {
        // Before anything that would need cleaning up.
        etcd_binary();
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tent-etcd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd data dir");
        let [client_port, peer_port] = free_ports();
        let mut server = EtcdServer {
            child: None,
            dir,
            client_port,
            peer_port,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        match server.spawn() {
            Ok(()) => server,
            // Its port went to another test's process meanwhile: again.
            Err(()) => {
                drop(server);
                EtcdServer::start_with(extra)
            }
        }
    }

    /// Start the process (again: same ports, same data) and wait until it
    /// is healthy; `Err` when its port was taken.
    fn spawn(&mut self) -> Result<(), ()> {
        let client_url = format!("http://127.0.0.1:{}", self.client_port);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log");
        let state = if self.dir.join("data").exists() { "existing" } else { "new" };
        let child = Command::new(etcd_binary())
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--initial-cluster-state", state])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = EtcdClient::connect(&[self.endpoint()], Duration::from_millis(500));
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            // Healthy and still running: an etcd that lost its port to
            // another test's exits, and that test's etcd answers.
            if up.is_ok() && exited.is_none() {
                return Ok(());
            }
            let log = || std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
            if exited.is_some() && log().contains("address already in use") {
                self.child = None;
                return Err(());
            }
            if exited.is_some() || Instant::now() > deadline {
                let log = log();
                panic!("etcd did not become healthy ({exited:?}, {up:?}); its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its client endpoint, `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// A client of it.
    pub fn client(&self) -> EtcdClient {
        EtcdClient::connect(&[self.endpoint()], TIMEOUT).expect("connect")
    }

    /// SIGKILL it, keeping its data ([`EtcdServer::restart`] brings it
    /// back).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same ports with the same data.
    ///
    /// # Panics
    /// When its port was taken meanwhile.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn().expect("etcd's port was taken while it was down");
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // SIGKILL: the data is thrown away, nothing to shut down cleanly.
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
