//! The control server: answers descriptor requests on `ip:port`.
//!
//! One accept thread and one short-lived thread per connection (bounded):
//! control traffic is a handful of messages per segment open, nowhere near
//! the data path. Every connection has read/write timeouts; a malformed,
//! oversized or truncated message closes that connection with a logged
//! reason and disturbs nothing else.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tent_rings::ErrorKind;

use super::auth;
use super::wire::{self, Message, QpBootstrap, SegmentDescriptor, WireError};
use crate::error::{Error, Result};

/// Connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 64;
/// A peer that stalls mid-message is dropped after this.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Produces the current descriptor of the local segment.
pub type DescriptorFn = dyn Fn() -> SegmentDescriptor + Send + Sync;

/// Connects an RC QP for a peer: (initiator NIC, target NIC, initiator's
/// end) → this side's end, already connected.
pub type QpConnectFn = dyn Fn(&str, &str, &QpBootstrap) -> Result<QpBootstrap> + Send + Sync;

/// A running control server; stops when dropped.
pub struct ControlServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl ControlServer {
    /// Listen on `host:port` (port 0 = ephemeral); `describe` is built
    /// from the bound address (the segment's name).
    pub fn start(
        host: &str,
        port: u16,
        secret: Option<Vec<u8>>,
        describe: impl FnOnce(SocketAddr) -> Arc<DescriptorFn>,
    ) -> Result<ControlServer> {
        Self::start_with_qp(host, port, secret, describe, None)
    }

    /// [`ControlServer::start`], also answering `QpConnect` with `qp`
    /// (without it, such a request gets an `Unreachable` error).
    pub fn start_with_qp(
        host: &str,
        port: u16,
        secret: Option<Vec<u8>>,
        describe: impl FnOnce(SocketAddr) -> Arc<DescriptorFn>,
        qp: Option<Arc<QpConnectFn>>,
    ) -> Result<ControlServer> {
        let listener = TcpListener::bind((host, port)).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("control server cannot listen on {host}:{port}"),
            )
            .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            Error::new(ErrorKind::Unreachable, "control server address").with_source(e)
        })?;
        let describe = describe(addr);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let secret = secret.map(Arc::new);
        let thread = std::thread::Builder::new()
            .name(format!("tent-control-{}", addr.port()))
            .spawn(move || accept_loop(listener, stop2, secret, describe, qp))
            .map_err(|e| {
                Error::new(ErrorKind::OutOfMemory, "spawn control server").with_source(e)
            })?;
        tracing::info!(%addr, "control server listening (p2p segment name)");
        Ok(ControlServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on: this engine's p2p segment name.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Unblock accept() with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    stop: Arc<AtomicBool>,
    secret: Option<Arc<Vec<u8>>>,
    describe: Arc<DescriptorFn>,
    qp: Option<Arc<QpConnectFn>>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "control: accept failed");
                continue;
            }
        };
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            crate::warn_limited!(peer.rsplit_once(':').map_or(&*peer, |(ip, _)| ip), %peer, "control: too many connections; closing this one");
            continue;
        }
        let (secret, describe, active) = (secret.clone(), describe.clone(), active.clone());
        let qp = qp.clone();
        let spawned = std::thread::Builder::new()
            .name("tent-control-conn".into())
            .spawn(move || {
                let secret = secret.as_deref().map(Vec::as_slice);
                if let Err(why) = serve(stream, secret, &*describe, qp.as_deref()) {
                    crate::warn_limited!(peer.rsplit_once(':').map_or(&*peer, |(ip, _)| ip), %peer, reason = %why, "control: closing connection");
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            crate::warn_limited!(e.kind(), error = %e, "control: cannot spawn a connection thread");
        }
    }
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum Close {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("expected {expected}, got {got}")]
    Unexpected {
        expected: &'static str,
        got: &'static str,
    },
    #[error("authentication failed")]
    AuthFailed,
}

fn serve(
    mut s: TcpStream,
    secret: Option<&[u8]>,
    describe: &DescriptorFn,
    qp: Option<&QpConnectFn>,
) -> std::result::Result<(), Close> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(WireError::Io)?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(WireError::Io)?;
    let _ = s.set_nodelay(true);
    let client_nonce = match wire::read_message(&mut s)? {
        Message::Hello { nonce } => nonce,
        other => return Err(unexpected(&mut s, "Hello", &other)),
    };
    let server_nonce = auth::nonce();
    wire::write_message(
        &mut s,
        &Message::Challenge {
            nonce: server_nonce,
            auth_required: secret.is_some(),
        },
    )?;
    if let Some(secret) = secret {
        let proof = match wire::read_message(&mut s)? {
            Message::Auth { mac } => mac,
            other => return Err(unexpected(&mut s, "Auth", &other)),
        };
        if !auth::verify_client(secret, &server_nonce, &client_nonce, &proof) {
            let _ = wire::write_message(
                &mut s,
                &Message::Error {
                    code: ErrorKind::AccessDenied.code(),
                    text: "authentication failed".into(),
                },
            );
            return Err(Close::AuthFailed);
        }
        wire::write_message(
            &mut s,
            &Message::AuthOk {
                mac: auth::server_proof(secret, &server_nonce, &client_nonce),
            },
        )?;
    }
    loop {
        let msg = match wire::read_message(&mut s) {
            Ok(m) => m,
            // The peer is done: a clean close between messages.
            Err(WireError::Truncated { have: 0, .. }) => return Ok(()),
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        match msg {
            Message::GetDescriptor => {
                wire::write_message(&mut s, &Message::Descriptor(describe()))?
            }
            Message::QpConnect {
                initiator_nic,
                target_nic,
                qp: theirs,
            } => {
                // A refused QP is an answer, not a protocol error: the
                // connection stays open for another request.
                let reply = match qp.map(|f| f(&initiator_nic, &target_nic, &theirs)) {
                    Some(Ok(ours)) => Message::QpAccept { qp: ours },
                    Some(Err(e)) => Message::Error {
                        code: e.kind().code(),
                        text: e.to_string(),
                    },
                    None => Message::Error {
                        code: ErrorKind::Unreachable.code(),
                        text: "this engine serves no RDMA".into(),
                    },
                };
                wire::write_message(&mut s, &reply)?
            }
            other => return Err(unexpected(&mut s, "GetDescriptor or QpConnect", &other)),
        }
    }
}

fn unexpected(s: &mut TcpStream, expected: &'static str, got: &Message) -> Close {
    let _ = wire::write_message(
        s,
        &Message::Error {
            code: ErrorKind::InvalidArgument.code(),
            text: format!("expected {expected}"),
        },
    );
    Close::Unexpected {
        expected,
        got: got.name(),
    }
}
