//! A throwaway single-member etcd for tests (the client's own, and the
//! integration tests' through the `testing` feature): started on free
//! loopback ports with a fresh data directory, killed and its data removed
//! at drop. The `etcd` binary comes from Debian's `etcd-server`
//! (tools/setup.sh); without it a test fails, saying so, rather than skip.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{EtcdClient, Tls};

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
    /// Serving https with these, asking clients for a certificate.
    tls: Option<TlsFiles>,
}

/// A test CA, a server certificate for 127.0.0.1 and a client
/// certificate it signed (PEM files made with `openssl`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The server's certificate and key.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate the CA signed.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Made in `dir` by the `openssl` command.
    ///
    /// # Panics
    /// When `openssl` is missing or fails.
    pub fn make(dir: &std::path::Path) -> TlsFiles {
        std::fs::create_dir_all(dir).expect("tls dir");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null())
                .output()
                .expect("openssl (Debian's openssl package)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let mut ca = vec!["req", "-x509"];
        ca.extend(ec);
        ca.extend(["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=tent-test-ca"]);
        run(&ca);
        // etcd's JSON gateway dials its own gRPC port with the server
        // certificate: under --client-cert-auth that one must allow
        // clientAuth too.
        for (who, usage) in [("server", "serverAuth,clientAuth"), ("client", "clientAuth")] {
            let (key, csr, pem, ext) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.ext"),
            );
            std::fs::write(
                dir.join(&ext),
                format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
            )
            .expect("ext file");
            let mut req = vec!["req"];
            req.extend(ec);
            req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=127.0.0.1"]);
            run(&req);
            run(&[
                "x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", &pem, "-days", "2", "-extfile", &ext,
            ]);
        }
        TlsFiles {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }

    /// What a client shows and trusts.
    pub fn client(&self) -> Tls {
        Tls::from_files(Some(&self.ca), Some((&self.client_cert, &self.client_key)))
            .expect("test TLS files")
    }
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
        EtcdServer::start_full(extra, None)
    }

    /// A member serving https with `tls`, which wants a client certificate
    /// signed by its CA.
    pub fn start_tls(tls: &TlsFiles) -> EtcdServer {
        EtcdServer::start_full(&[], Some(tls.clone()))
    }

    fn start_full(extra: &[&str], tls: Option<TlsFiles>) -> EtcdServer {
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
            tls: tls.clone(),
        };
        match server.spawn() {
            Ok(()) => server,
            // Its port went to another test's process meanwhile: again.
            Err(()) => {
                drop(server);
                EtcdServer::start_full(extra, tls)
            }
        }
    }

    /// Start the process (again: same ports, same data) and wait until it
    /// is healthy; `Err` when its port was taken.
    fn spawn(&mut self) -> Result<(), ()> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let mut extra = self.extra.clone();
        if let Some(t) = &self.tls {
            for (flag, path) in [
                ("--cert-file", &t.server_cert),
                ("--key-file", &t.server_key),
                ("--trusted-ca-file", &t.ca),
            ] {
                extra.push(flag.to_owned());
                extra.push(path.display().to_string());
            }
            extra.push("--client-cert-auth".to_owned());
        }
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
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = self.connect(Duration::from_millis(500));
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

    /// Its client endpoint: `127.0.0.1:port`, or `https://127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        match self.tls {
            Some(_) => format!("https://127.0.0.1:{}", self.client_port),
            None => format!("127.0.0.1:{}", self.client_port),
        }
    }

    fn connect(&self, timeout: Duration) -> Result<EtcdClient, super::EtcdError> {
        let tls = self.tls.as_ref().map(TlsFiles::client);
        EtcdClient::connect_secure(&[self.endpoint()], timeout, None, tls)
    }

    /// A client of it.
    pub fn client(&self) -> EtcdClient {
        self.connect(TIMEOUT).expect("connect")
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
