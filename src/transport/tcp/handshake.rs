//! The data connection's opening: hellos with nonces each way (the
//! initiator's also carries its [`Ident`]: session and connection id, what
//! a later fence names), then, when the target holds a shared secret, an
//! HMAC proof each way bound to this connection by both nonces, to the
//! initiator's ident and to the target's address (as the initiator dialed
//! it and as the target accepted it: a relay holding no secret cannot pass
//! an honest initiator's handshake on), under the data door's labels (a
//! control-plane proof does not verify here). The initiator checks the
//! target's proof before it sends anything else. Nothing else is read from
//! a connection before it is done, and the whole exchange has one
//! deadline: a peer that drips a byte at a time does not extend it.
//!
//! The initiator's side is [`Opening`], a state machine that does no I/O
//! (a thread driving many sockets feeds it what arrives); [`open`] drives
//! it on a blocking socket. The target's side is [`serve`].

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use tent_rings::ErrorKind;

use super::frame::{
    AUTH_REQUIRED, BUSY, FrameError, HELLO_HEADER_LEN, HELLO_LEN, Hello, Ident, NONCE_LEN,
    PROOF_LEN, Proof, SESSION_LEN,
};
use super::io;
use crate::control::auth::{self, Door};
use crate::deadline::ByDeadline;

/// Why a target refused a connection, or why the initiator gave up on it.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {why}")]
pub struct Refused {
    /// `SqFull` ([`BUSY`]): come back later. `AccessDenied`: the secrets
    /// differ or one side has none. Else what the socket said.
    pub kind: ErrorKind,
    /// For the log.
    pub why: String,
}

fn refused(kind: ErrorKind, why: impl Into<String>) -> Refused {
    Refused {
        kind,
        why: why.into(),
    }
}

/// A socket failure during the handshake. Reset or closed by a live target
/// before it said anything: it evicted or refused this connection under
/// load (`BUSY`), since a dead process refuses the connect itself.
fn io_refused(e: std::io::Error, during: &str) -> Refused {
    let kind = match io::kind_of(&e) {
        ErrorKind::ProcessFailed => BUSY,
        k => k,
    };
    refused(kind, format!("{during}: {e}"))
}

/// The bytes [`binding`] makes.
type Binding = [u8; 18 + SESSION_LEN + 4];

/// What the proofs are bound to besides the nonces: the target's address
/// (`auth::addr_binding`), then the initiator's ident, so a proven
/// connection's ident is the one its initiator sent.
fn binding(server: SocketAddr, ident: &Ident) -> Binding {
    let mut b = [0u8; 18 + SESSION_LEN + 4];
    b[..18].copy_from_slice(&auth::addr_binding(server));
    b[18..].copy_from_slice(&ident.to_bytes());
    b
}

/// Tell the initiator its hello is refused, and why for the log.
fn refuse_hello(s: &TcpStream, why: String) -> String {
    let _ = io::send_header(s, &Hello::refusal(ErrorKind::InvalidArgument).encode());
    why
}

/// The target's side: `Ok` once the initiator may send requests; `Err`
/// carries the reason to log (the initiator was told what it needs).
/// `register` learns the initiator's ident before anything is sent back,
/// so the connection can be fenced from the moment its initiator could
/// use it.
pub(crate) fn serve(
    s: &TcpStream,
    secret: Option<&[u8]>,
    deadline: Instant,
    register: impl FnOnce(Ident),
) -> std::result::Result<(), String> {
    let mut rx = ByDeadline::new(s, deadline);
    let mut b = [0u8; HELLO_LEN];
    rx.read_exact(&mut b[..HELLO_HEADER_LEN])
        .map_err(|e| format!("hello: {e}"))?;
    let mut head = [0u8; HELLO_HEADER_LEN];
    head.copy_from_slice(&b[..HELLO_HEADER_LEN]);
    if let Err(e) = Hello::decode_header(&head) {
        return Err(refuse_hello(s, format!("bad hello: {e}")));
    }
    rx.read_exact(&mut b[HELLO_HEADER_LEN..])
        .map_err(|e| format!("hello: {e}"))?;
    let theirs = Hello::decode(&b).map_err(|e| refuse_hello(s, format!("bad hello: {e}")))?;
    if theirs.ident.conn == 0 {
        return Err(refuse_hello(s, "bad hello: no connection id".into()));
    }
    register(theirs.ident);
    let ours = auth::nonce();
    let hello = Hello {
        status: 0,
        flags: if secret.is_some() { AUTH_REQUIRED } else { 0 },
        nonce: ours,
        ident: Ident::NONE,
    };
    io::send_header(s, &hello.encode()).map_err(|e| format!("hello reply: {e}"))?;
    let Some(secret) = secret else {
        return Ok(());
    };
    let binding = binding(
        s.local_addr().map_err(|e| format!("local address: {e}"))?,
        &theirs.ident,
    );
    let theirs = theirs.nonce;
    let mut b = [0u8; PROOF_LEN];
    rx.read_exact(&mut b).map_err(|e| format!("proof: {e}"))?;
    let valid = Proof::decode(&b)
        .is_ok_and(|p| auth::verify_client(Door::Data, secret, &ours, &theirs, &binding, &p.mac));
    if !valid {
        let deny = Proof {
            status: ErrorKind::AccessDenied.code(),
            mac: [0; NONCE_LEN],
        };
        let _ = io::send_header(s, &deny.encode());
        return Err(
            "authentication failed (the shared secrets differ, or the initiator did not dial this address)"
                .into(),
        );
    }
    let proof = Proof {
        status: 0,
        mac: auth::server_proof(Door::Data, secret, &ours, &theirs, &binding),
    };
    io::send_header(s, &proof.encode()).map_err(|e| format!("proof reply: {e}"))
}

/// Why a target refused our proof.
pub(crate) const PROOF_REFUSED: &str = "target refused our proof: the shared secrets differ, or this \
     initiator did not dial the target's own address (address translation, port forwarding or \
     a relay between the engines; engines with a secret must reach each other directly)";

/// What [`Opening::on_bytes`] asks of its caller next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Read [`Opening::want`] more bytes.
    Read,
    /// The target wants our proof: send [`Opening::proof`] for the address
    /// dialed, then read [`Opening::want`] bytes.
    Prove,
    /// Handshake complete: the connection may carry requests.
    Done,
}

/// Where an [`Opening`] stands.
#[derive(Clone, Copy)]
enum Stage {
    /// Our hello is out: the target's hello header is due.
    HelloHeader,
    /// The header checked out: the rest of the target's hello is due.
    HelloRest {
        head: [u8; HELLO_HEADER_LEN],
        status: u16,
        flags: u32,
    },
    /// The target wants our proof; [`Opening::proof`] makes it.
    Proving { theirs: [u8; NONCE_LEN] },
    /// Our proof is out: the target's is due.
    ProofReply {
        theirs: [u8; NONCE_LEN],
        binding: Binding,
    },
    /// Done or refused: nothing more is read.
    Ended,
}

/// The initiator's handshake as a state machine: no I/O, no clock, so
/// one thread can drive many connections through a poller or a ring
/// ([`open`] drives it on a blocking socket). The caller sends the hello
/// [`Opening::new`] gives, then feeds it exactly [`Opening::want`] bytes
/// at a time and does what each [`Step`] says, each by the connection's
/// one deadline; a socket failure becomes the same [`Refused`] as on the
/// blocking path through [`Opening::send_failed`] and
/// [`Opening::recv_failed`].
pub(crate) struct Opening {
    /// Proven to the target when set.
    secret: Option<Arc<[u8]>>,
    /// This connection, in our hello and in both proofs.
    ident: Ident,
    /// Our hello's nonce.
    ours: [u8; NONCE_LEN],
    stage: Stage,
}

impl std::fmt::Debug for Opening {
    // Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opening")
            .field("ident", &self.ident)
            .field("want", &self.want())
            .finish_non_exhaustive()
    }
}

impl Opening {
    /// The most bytes [`Opening::want`] ever asks for: a buffer this long
    /// holds any of them.
    pub(crate) const MAX_WANT: usize = HELLO_LEN;

    /// A machine for connection `ident`, proving `secret` when the target
    /// asks, and the hello to send first.
    pub(crate) fn new(secret: Option<Arc<[u8]>>, ident: Ident) -> (Opening, [u8; HELLO_LEN]) {
        let ours = auth::nonce();
        let hello = Hello {
            status: 0,
            flags: 0,
            nonce: ours,
            ident,
        };
        let opening = Opening {
            secret,
            ident,
            ours,
            stage: Stage::HelloHeader,
        };
        (opening, hello.encode())
    }

    /// How many bytes [`Opening::on_bytes`] takes next: the target's hello
    /// header, then the rest of its hello, then its proof when it asked
    /// for ours; 0 once done or refused.
    pub(crate) fn want(&self) -> usize {
        match self.stage {
            Stage::HelloHeader => HELLO_HEADER_LEN,
            Stage::HelloRest { .. } => HELLO_LEN - HELLO_HEADER_LEN,
            Stage::Proving { .. } | Stage::ProofReply { .. } => PROOF_LEN,
            Stage::Ended => 0,
        }
    }

    /// `b`, exactly [`Opening::want`] bytes, arrived: what to do next, or
    /// why the connection is refused (the machine is then ended).
    ///
    /// # Panics
    /// If `b` is not [`Opening::want`] bytes long, before [`Opening::proof`]
    /// after [`Step::Prove`], or once done or refused.
    pub(crate) fn on_bytes(&mut self, b: &[u8]) -> std::result::Result<Step, Refused> {
        assert_eq!(b.len(), self.want(), "Opening::on_bytes takes want() bytes");
        let stage = std::mem::replace(&mut self.stage, Stage::Ended);
        match stage {
            Stage::HelloHeader => {
                let mut head = [0u8; HELLO_HEADER_LEN];
                head.copy_from_slice(b);
                let (status, flags) = Hello::decode_header(&head).map_err(|e| match e {
                    FrameError::Version(v) => refused(
                        ErrorKind::Unreachable,
                        format!("target speaks data protocol version {v}"),
                    ),
                    e => refused(ErrorKind::Unreachable, format!("bad hello: {e}")),
                })?;
                self.stage = Stage::HelloRest {
                    head,
                    status,
                    flags,
                };
                Ok(Step::Read)
            }
            Stage::HelloRest {
                head,
                status,
                flags,
            } => {
                if status != 0 {
                    let kind = ErrorKind::from_code(status).unwrap_or(ErrorKind::Unreachable);
                    return Err(refused(kind, "target refused the connection"));
                }
                let mut whole = [0u8; HELLO_LEN];
                whole[..HELLO_HEADER_LEN].copy_from_slice(&head);
                whole[HELLO_HEADER_LEN..].copy_from_slice(b);
                let theirs = Hello::decode(&whole)
                    .map_err(|e| refused(ErrorKind::Unreachable, e.to_string()))?;
                match (flags & AUTH_REQUIRED != 0, &self.secret) {
                    (false, None) => Ok(Step::Done),
                    (true, None) => Err(refused(
                        ErrorKind::AccessDenied,
                        "target requires authentication: set rpc_shared_secret",
                    )),
                    // We hold a secret: a target that does not prove it
                    // holds it too is not the engine we were configured to
                    // trust.
                    (false, Some(_)) => Err(refused(
                        ErrorKind::AccessDenied,
                        "target does not authenticate, but rpc_shared_secret is set here",
                    )),
                    (true, Some(_)) => {
                        self.stage = Stage::Proving {
                            theirs: theirs.nonce,
                        };
                        Ok(Step::Prove)
                    }
                }
            }
            Stage::ProofReply { theirs, binding } => {
                let secret = self.secret.as_deref().expect("a proof is due only with a secret");
                let mut reply = [0u8; PROOF_LEN];
                reply.copy_from_slice(b);
                let p = Proof::decode(&reply)
                    .map_err(|e| refused(ErrorKind::Unreachable, e.to_string()))?;
                if p.status != 0 {
                    return Err(refused(ErrorKind::AccessDenied, PROOF_REFUSED));
                }
                if !auth::verify_server(Door::Data, secret, &theirs, &self.ours, &binding, &p.mac) {
                    return Err(refused(
                        ErrorKind::AccessDenied,
                        "target failed to prove the shared secret for the address we dialed \
                         (engines with a secret must reach each other without address \
                         translation, port forwarding or a relay in between)",
                    ));
                }
                Ok(Step::Done)
            }
            Stage::Proving { .. } => panic!("Opening::on_bytes before the proof was made"),
            Stage::Ended => panic!("Opening::on_bytes once the handshake ended"),
        }
    }

    /// Our proof, after [`Step::Prove`], bound to `dialed`: the target's
    /// address as we dialed it (see the module doc). Asked for here, not by
    /// [`Opening::new`], so that [`open`] reads its socket's peer address
    /// only once a proof is due: a target that resets the connection on
    /// arrival is `BUSY` there, not a failed address lookup.
    ///
    /// # Panics
    /// Unless the last step was [`Step::Prove`].
    pub(crate) fn proof(&mut self, dialed: SocketAddr) -> [u8; PROOF_LEN] {
        let Stage::Proving { theirs } = self.stage else {
            panic!("Opening::proof without Step::Prove");
        };
        let secret = self.secret.as_deref().expect("a proof is due only with a secret");
        let binding = binding(dialed, &self.ident);
        let proof = Proof {
            status: 0,
            mac: auth::client_proof(Door::Data, secret, &theirs, &self.ours, &binding),
        };
        self.stage = Stage::ProofReply { theirs, binding };
        proof.encode()
    }

    /// Sending what the machine gave (the hello, the proof) failed with `e`.
    pub(crate) fn send_failed(&self, e: std::io::Error) -> Refused {
        match self.stage {
            Stage::HelloHeader | Stage::HelloRest { .. } => io_refused(e, "hello"),
            Stage::Proving { .. } | Stage::ProofReply { .. } => io_refused(e, "proof"),
            Stage::Ended => io_refused(e, "handshake"),
        }
    }

    /// Reading the [`Opening::want`] bytes due failed with `e` (end of
    /// stream included).
    pub(crate) fn recv_failed(&self, e: std::io::Error) -> Refused {
        match self.stage {
            Stage::HelloHeader | Stage::HelloRest { .. } => io_refused(e, "hello"),
            Stage::Proving { .. } | Stage::ProofReply { .. } => {
                // A target that closes after our proof rejected it.
                let mut r = io_refused(e, "proof reply");
                if r.kind == BUSY {
                    r.kind = ErrorKind::AccessDenied;
                }
                r
            }
            Stage::Ended => io_refused(e, "handshake"),
        }
    }
}

const _: () = assert!(PROOF_LEN <= Opening::MAX_WANT);

/// The initiator's side, on a connected socket, for the connection
/// `ident`: [`Opening`] driven by blocking sends and reads.
pub fn open(
    s: &TcpStream,
    secret: Option<&[u8]>,
    deadline: Instant,
    ident: Ident,
) -> std::result::Result<(), Refused> {
    let (mut opening, hello) = Opening::new(secret.map(Arc::from), ident);
    io::send_header(s, &hello).map_err(|e| opening.send_failed(e))?;
    let mut rx = ByDeadline::new(s, deadline);
    let mut b = [0u8; Opening::MAX_WANT];
    loop {
        let b = &mut b[..opening.want()];
        rx.read_exact(b).map_err(|e| opening.recv_failed(e))?;
        match opening.on_bytes(b)? {
            Step::Read => {}
            Step::Prove => {
                // Bound to the address we dialed (see the module doc).
                let dialed = s.peer_addr().map_err(|e| io_refused(e, "peer address"))?;
                let proof = opening.proof(dialed);
                io::send_header(s, &proof).map_err(|e| opening.send_failed(e))?;
            }
            Step::Done => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::DATA_VERSION;
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::thread::{self, JoinHandle};
    use std::time::Duration;

    const IDENT: Ident = Ident {
        session: [7; SESSION_LEN],
        conn: 3,
    };
    const SECRET: &[u8] = b"the data door's secret";
    const OTHER: &[u8] = b"another engine's secret";
    const LONG: Duration = Duration::from_secs(10);

    /// What the target thread saw: `serve`'s verdict and the ident it
    /// registered.
    type Served = (std::result::Result<(), String>, Option<Ident>);

    /// A loopback connection to a thread that accepts it and runs `serve`
    /// with `secret`: the initiator's socket, the address it dialed, and
    /// the target thread.
    fn target(secret: Option<&'static [u8]>) -> (TcpStream, SocketAddr, JoinHandle<Served>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut seen = None;
            let r = serve(&s, secret, Instant::now() + LONG, |i| seen = Some(i));
            (r, seen)
        });
        let s = TcpStream::connect(addr).unwrap();
        // A broken test fails instead of hanging.
        s.set_read_timeout(Some(LONG)).unwrap();
        (s, addr, t)
    }

    /// A loopback connection to a thread that reads the hello and answers
    /// `reply` instead of a handshake.
    fn fake_target(reply: [u8; HELLO_LEN]) -> (TcpStream, SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(LONG)).unwrap();
            let mut hello = [0u8; HELLO_LEN];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&reply).unwrap();
        });
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        (s, addr, t)
    }

    /// Drive an [`Opening`] for `ident` on `s` by hand, as a poller would:
    /// bytes arrive in reads of at most `piece`, straddling the frames,
    /// and are collected until `want()` is met; what is left over is fed
    /// next.
    fn drive(
        s: &mut TcpStream,
        dialed: SocketAddr,
        secret: Option<&[u8]>,
        ident: Ident,
        piece: usize,
    ) -> std::result::Result<(), Refused> {
        let (mut opening, hello) = Opening::new(secret.map(Arc::from), ident);
        s.write_all(&hello).map_err(|e| opening.send_failed(e))?;
        let mut got = Vec::new();
        loop {
            while got.len() < opening.want() {
                let mut b = vec![0u8; piece];
                let n = s.read(&mut b).map_err(|e| opening.recv_failed(e))?;
                if n == 0 {
                    return Err(opening.recv_failed(std::io::ErrorKind::UnexpectedEof.into()));
                }
                got.extend_from_slice(&b[..n]);
            }
            let rest = got.split_off(opening.want());
            let step = opening.on_bytes(&got)?;
            got = rest;
            match step {
                Step::Read => {}
                Step::Prove => s
                    .write_all(&opening.proof(dialed))
                    .map_err(|e| opening.send_failed(e))?,
                Step::Done => {
                    assert!(got.is_empty(), "nothing arrives past the handshake");
                    assert_eq!(opening.want(), 0);
                    return Ok(());
                }
            }
        }
    }

    /// The blocking [`open`] on a fresh connection to `serve` with
    /// `theirs`, holding `ours`.
    fn blocking(ours: Option<&[u8]>, theirs: Option<&'static [u8]>) -> Refused {
        let (s, _, t) = target(theirs);
        let r = open(&s, ours, Instant::now() + LONG, IDENT).unwrap_err();
        drop(s);
        let _ = t.join().unwrap();
        r
    }

    #[test]
    fn opening_without_a_secret_completes_against_serve_in_any_pieces() {
        for piece in [1, 5, 7, 16, 100] {
            let (mut s, addr, t) = target(None);
            drive(&mut s, addr, None, IDENT, piece).unwrap();
            let (served, seen) = t.join().unwrap();
            assert_eq!(served, Ok(()), "pieces of {piece}");
            assert_eq!(seen, Some(IDENT), "the target learns our ident");
        }
    }

    #[test]
    fn opening_with_the_shared_secret_proves_it_both_ways_in_any_pieces() {
        for piece in [1, 5, 7, 16, 100] {
            let (mut s, addr, t) = target(Some(SECRET));
            drive(&mut s, addr, Some(SECRET), IDENT, piece).unwrap();
            let (served, seen) = t.join().unwrap();
            assert_eq!(served, Ok(()), "pieces of {piece}");
            assert_eq!(seen, Some(IDENT), "the target learns our ident");
        }
    }

    #[test]
    fn opening_with_a_different_secret_is_denied_by_the_target() {
        let (mut s, addr, t) = target(Some(SECRET));
        let err = drive(&mut s, addr, Some(OTHER), IDENT, 7).unwrap_err();
        assert_eq!(err.kind, ErrorKind::AccessDenied, "{err}");
        assert_eq!(err.why, PROOF_REFUSED);
        let (served, _) = t.join().unwrap();
        assert!(served.unwrap_err().contains("authentication failed"));
        let blocked = blocking(Some(OTHER), Some(SECRET));
        assert_eq!((blocked.kind, blocked.why), (err.kind, err.why), "as open says");
    }

    #[test]
    fn opening_without_a_secret_to_a_target_requiring_one_is_denied() {
        let (mut s, addr, t) = target(Some(SECRET));
        let err = drive(&mut s, addr, None, IDENT, 5).unwrap_err();
        assert_eq!(err.kind, ErrorKind::AccessDenied, "{err}");
        assert_eq!(
            err.why,
            "target requires authentication: set rpc_shared_secret"
        );
        drop(s);
        let (served, _) = t.join().unwrap();
        assert!(served.is_err(), "no proof came");
        let blocked = blocking(None, Some(SECRET));
        assert_eq!((blocked.kind, blocked.why), (err.kind, err.why), "as open says");
    }

    #[test]
    fn opening_with_a_secret_to_a_target_without_one_is_denied() {
        let (mut s, addr, t) = target(None);
        let err = drive(&mut s, addr, Some(SECRET), IDENT, 5).unwrap_err();
        assert_eq!(err.kind, ErrorKind::AccessDenied, "{err}");
        assert_eq!(
            err.why,
            "target does not authenticate, but rpc_shared_secret is set here"
        );
        let _ = t.join().unwrap();
        let blocked = blocking(Some(SECRET), None);
        assert_eq!((blocked.kind, blocked.why), (err.kind, err.why), "as open says");
    }

    #[test]
    fn a_target_refusal_fails_with_the_kind_it_names() {
        // A loaded target's refusal.
        let (mut s, addr, t) = fake_target(Hello::refusal(BUSY).encode());
        let err = drive(&mut s, addr, None, IDENT, 3).unwrap_err();
        t.join().unwrap();
        assert_eq!(err.kind, BUSY, "{err}");
        assert_eq!(err.why, "target refused the connection");
        let (s, _, t) = fake_target(Hello::refusal(BUSY).encode());
        let blocked = open(&s, None, Instant::now() + LONG, IDENT).unwrap_err();
        t.join().unwrap();
        assert_eq!((blocked.kind, blocked.why), (err.kind, err.why), "as open says");
        // `serve`'s own refusal of a hello without a connection id.
        let (mut s, addr, t) = target(None);
        let no_conn = Ident { conn: 0, ..IDENT };
        let err = drive(&mut s, addr, None, no_conn, 7).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{err}");
        let (served, seen) = t.join().unwrap();
        assert!(served.is_err());
        assert_eq!(seen, None, "a refused hello is not registered");
    }

    #[test]
    fn a_target_speaking_another_version_is_unreachable() {
        let (mut opening, _) = Opening::new(None, IDENT);
        let mut hello = Hello::refusal(BUSY).encode();
        hello[8..10].copy_from_slice(&(DATA_VERSION + 1).to_le_bytes());
        let err = opening.on_bytes(&hello[..HELLO_HEADER_LEN]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unreachable, "{err}");
        assert!(err.why.contains("data protocol version"), "{err}");
        assert_eq!(opening.want(), 0, "a refused machine reads nothing more");
    }

    #[test]
    fn a_socket_failure_maps_as_the_blocking_path_does_at_each_stage() {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let (mut opening, _) = Opening::new(Some(Arc::from(SECRET)), IDENT);
        // Closed before the target said anything: it shed us under load.
        assert_eq!(opening.recv_failed(eof()).kind, BUSY);
        assert_eq!(opening.send_failed(eof()).kind, BUSY);
        let hello = Hello {
            status: 0,
            flags: AUTH_REQUIRED,
            nonce: [9; NONCE_LEN],
            ident: Ident::NONE,
        }
        .encode();
        assert_eq!(opening.on_bytes(&hello[..HELLO_HEADER_LEN]).unwrap(), Step::Read);
        assert_eq!(opening.recv_failed(eof()).why, format!("hello: {}", eof()));
        assert_eq!(opening.on_bytes(&hello[HELLO_HEADER_LEN..]).unwrap(), Step::Prove);
        opening.proof("127.0.0.1:1".parse().unwrap());
        assert_eq!(opening.want(), PROOF_LEN);
        // Sending our proof failed: still a shed connection.
        let sent = opening.send_failed(eof());
        assert_eq!((sent.kind, sent.why), (BUSY, format!("proof: {}", eof())));
        // Closed after our proof: the target rejected it.
        let read = opening.recv_failed(eof());
        assert_eq!(
            (read.kind, read.why),
            (ErrorKind::AccessDenied, format!("proof reply: {}", eof()))
        );
        // A timeout stays a timeout.
        let late = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(opening.recv_failed(late).kind, ErrorKind::RouteLost);
    }
}
