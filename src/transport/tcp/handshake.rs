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

/// What [`Serving::on_bytes`] asks of the target next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// Read [`Serving::want`] more bytes.
    Read,
    /// The initiator named itself: register `ident` (so the connection can
    /// be fenced from the moment its initiator could use it), then send
    /// `reply`; the handshake is done after it when [`Serving::want`] is 0.
    Hello {
        ident: Ident,
        reply: [u8; HELLO_LEN],
    },
    /// The initiator proved the secret: send `reply`; the handshake is
    /// done after it.
    Proven([u8; PROOF_LEN]),
}

/// Why the target refuses a connection: what to send it first (when it
/// is owed an answer), and the reason to log.
#[derive(Debug)]
pub struct Refusal {
    /// What to send the initiator before closing, when it is owed one.
    pub reply: Option<Reply>,
    /// The reason to log.
    pub why: String,
}

/// A refusal's last words.
#[derive(Debug, Clone, Copy)]
pub enum Reply {
    /// A hello carrying the refusal's status.
    Hello([u8; HELLO_LEN]),
    /// A proof frame carrying the refusal's status.
    Proof([u8; PROOF_LEN]),
}

impl Reply {
    /// The status it carries (what the refusal tells the initiator).
    pub fn status(&self) -> u16 {
        match self {
            Reply::Hello(b) => Hello::decode(b).map_or(0, |h| h.status),
            Reply::Proof(b) => Proof::decode(b).map_or(0, |p| p.status),
        }
    }

    /// Its bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Reply::Hello(b) => b,
            Reply::Proof(b) => b,
        }
    }
}

/// Where a [`Serving`] stands.
#[derive(Clone, Copy)]
enum ServeStage {
    HelloHeader,
    HelloRest { head: [u8; HELLO_HEADER_LEN] },
    Proof {
        ours: [u8; NONCE_LEN],
        theirs: [u8; NONCE_LEN],
        binding: Binding,
    },
    Ended,
}

/// The target's handshake as a state machine: no I/O, no clock ([`serve`]
/// drives it on a blocking socket; a serving thread driving many sockets
/// feeds it what arrives, by the connection's one deadline).
pub struct Serving {
    /// The secret a connection proves when set.
    secret: Option<Arc<[u8]>>,
    /// The address the connection was accepted on (the proofs are bound
    /// to it).
    local: SocketAddr,
    stage: ServeStage,
}

impl std::fmt::Debug for Serving {
    // Never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serving")
            .field("local", &self.local)
            .field("want", &self.want())
            .finish_non_exhaustive()
    }
}

fn bad_hello(why: String) -> Refusal {
    Refusal {
        reply: Some(Reply::Hello(Hello::refusal(ErrorKind::InvalidArgument).encode())),
        why,
    }
}

impl Serving {
    /// A machine for a connection accepted on `local`, requiring `secret`
    /// when set.
    pub fn new(secret: Option<Arc<[u8]>>, local: SocketAddr) -> Serving {
        Serving {
            secret,
            local,
            stage: ServeStage::HelloHeader,
        }
    }

    /// How many bytes [`Serving::on_bytes`] takes next: the initiator's
    /// hello header, the rest of its hello, its proof when a secret is
    /// set; 0 once done or refused.
    pub fn want(&self) -> usize {
        match self.stage {
            ServeStage::HelloHeader => HELLO_HEADER_LEN,
            ServeStage::HelloRest { .. } => HELLO_LEN - HELLO_HEADER_LEN,
            ServeStage::Proof { .. } => PROOF_LEN,
            ServeStage::Ended => 0,
        }
    }

    /// `b`, exactly [`Serving::want`] bytes, arrived: what to do next, or
    /// why the connection is refused (the machine is then ended).
    ///
    /// # Panics
    /// If `b` is not [`Serving::want`] bytes long, or once ended.
    pub fn on_bytes(&mut self, b: &[u8]) -> std::result::Result<Serve, Refusal> {
        assert_eq!(b.len(), self.want(), "Serving::on_bytes takes want() bytes");
        match std::mem::replace(&mut self.stage, ServeStage::Ended) {
            ServeStage::HelloHeader => {
                let mut head = [0u8; HELLO_HEADER_LEN];
                head.copy_from_slice(b);
                Hello::decode_header(&head).map_err(|e| bad_hello(format!("bad hello: {e}")))?;
                self.stage = ServeStage::HelloRest { head };
                Ok(Serve::Read)
            }
            ServeStage::HelloRest { head } => {
                let mut whole = [0u8; HELLO_LEN];
                whole[..HELLO_HEADER_LEN].copy_from_slice(&head);
                whole[HELLO_HEADER_LEN..].copy_from_slice(b);
                let theirs = Hello::decode(&whole).map_err(|e| bad_hello(format!("bad hello: {e}")))?;
                if theirs.ident.conn == 0 {
                    return Err(bad_hello("bad hello: no connection id".into()));
                }
                let ours = auth::nonce();
                let reply = Hello {
                    status: 0,
                    flags: if self.secret.is_some() { AUTH_REQUIRED } else { 0 },
                    nonce: ours,
                    ident: Ident::NONE,
                };
                if self.secret.is_some() {
                    self.stage = ServeStage::Proof {
                        ours,
                        theirs: theirs.nonce,
                        binding: binding(self.local, &theirs.ident),
                    };
                }
                Ok(Serve::Hello {
                    ident: theirs.ident,
                    reply: reply.encode(),
                })
            }
            ServeStage::Proof {
                ours,
                theirs,
                binding,
            } => {
                let secret = self.secret.as_deref().expect("a proof is asked only with a secret");
                let mut p = [0u8; PROOF_LEN];
                p.copy_from_slice(b);
                let valid = Proof::decode(&p)
                    .is_ok_and(|p| auth::verify_client(Door::Data, secret, &ours, &theirs, &binding, &p.mac));
                if !valid {
                    let deny = Proof {
                        status: ErrorKind::AccessDenied.code(),
                        mac: [0; NONCE_LEN],
                    };
                    return Err(Refusal {
                        reply: Some(Reply::Proof(deny.encode())),
                        why: "authentication failed (the shared secrets differ, or the initiator did not dial this address)".into(),
                    });
                }
                let proof = Proof {
                    status: 0,
                    mac: auth::server_proof(Door::Data, secret, &ours, &theirs, &binding),
                };
                Ok(Serve::Proven(proof.encode()))
            }
            ServeStage::Ended => panic!("Serving::on_bytes after the handshake ended"),
        }
    }
}

/// The target's side: `Ok` once the initiator may send requests; `Err`
/// carries the reason to log (the initiator was told what it needs).
/// `register` learns the initiator's ident before anything is sent back,
/// so the connection can be fenced from the moment its initiator could
/// use it.
#[cfg(test)]
pub(crate) fn serve(
    s: &TcpStream,
    secret: Option<&[u8]>,
    deadline: Instant,
    register: impl FnOnce(Ident),
) -> std::result::Result<(), String> {
    // The proofs are bound to the address the connection was accepted on
    // (read only when there is a secret to prove).
    let local = match secret {
        Some(_) => s.local_addr().map_err(|e| format!("local address: {e}"))?,
        None => SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let mut m = Serving::new(secret.map(Arc::from), local);
    let mut rx = ByDeadline::new(s, deadline);
    let mut register = Some(register);
    let mut b = [0u8; HELLO_LEN];
    loop {
        let want = m.want();
        let during = if want == PROOF_LEN { "proof" } else { "hello" };
        rx.read_exact(&mut b[..want])
            .map_err(|e| format!("{during}: {e}"))?;
        match m.on_bytes(&b[..want]) {
            Ok(Serve::Read) => {}
            Ok(Serve::Hello { ident, reply }) => {
                if let Some(r) = register.take() {
                    r(ident);
                }
                io::send_header(s, &reply).map_err(|e| format!("hello reply: {e}"))?;
                if m.want() == 0 {
                    return Ok(());
                }
            }
            Ok(Serve::Proven(reply)) => {
                return io::send_header(s, &reply).map_err(|e| format!("proof reply: {e}"));
            }
            Err(r) => {
                if let Some(reply) = r.reply {
                    let _ = io::send_header(s, reply.bytes());
                }
                return Err(r.why);
            }
        }
    }
}

/// Why a target refused our proof.
pub(crate) const PROOF_REFUSED: &str = "target refused our proof: the shared secrets differ, or this \
     initiator did not dial the target's own address (address translation, port forwarding or \
     a relay between the engines; engines with a secret must reach each other directly)";

/// What [`Opening::on_bytes`] asks of its caller next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
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
pub struct Opening {
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
    pub fn new(secret: Option<Arc<[u8]>>, ident: Ident) -> (Opening, [u8; HELLO_LEN]) {
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
    pub fn want(&self) -> usize {
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
    pub fn on_bytes(&mut self, b: &[u8]) -> std::result::Result<Step, Refused> {
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
    pub fn proof(&mut self, dialed: SocketAddr) -> [u8; PROOF_LEN] {
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

    /// The tcp_handshake fuzz target's seeds are real handshakes, the
    /// first byte naming the machine (bit 1: the initiator's, else the
    /// target's) and the secret (bit 0), then what its peer sent
    /// (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds` writes
    /// them; nonces are random, so each seed is checked by what it does:
    /// its machine takes the hello and asks for the next step).
    #[test]
    fn fuzz_seeds_are_real_handshakes() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/tcp_handshake");
        let key: Arc<[u8]> = Arc::from(&b"sixteen byte key"[..]);
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let feed = |m: &mut dyn FnMut(&[u8]) -> bool, want: &dyn Fn() -> usize, mut b: &[u8]| {
            let mut out = Vec::new();
            while want() > 0 && b.len() >= want() {
                let (x, rest) = b.split_at(want());
                out.push(m(x));
                b = rest;
            }
            out
        };
        if std::env::var_os("TENT_WRITE_SEEDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            for secret in [None, Some(key.clone())] {
                let bit = u8::from(secret.is_some());
                let (mut op, hello) = Opening::new(secret.clone(), IDENT);
                let mut sv = Serving::new(secret.clone(), local);
                sv.on_bytes(&hello[..HELLO_HEADER_LEN]).unwrap();
                let Serve::Hello { reply, .. } = sv.on_bytes(&hello[HELLO_HEADER_LEN..]).unwrap() else {
                    panic!("no hello reply")
                };
                op.on_bytes(&reply[..HELLO_HEADER_LEN]).unwrap();
                let mut to_target = hello.to_vec();
                let mut to_initiator = reply.to_vec();
                if secret.is_some() {
                    let step = op.on_bytes(&reply[HELLO_HEADER_LEN..]).unwrap();
                    assert!(matches!(step, Step::Prove), "{step:?}");
                    let proof = op.proof(local);
                    let Serve::Proven(theirs) = sv.on_bytes(&proof).unwrap() else {
                        panic!("not proven")
                    };
                    to_target.extend_from_slice(&proof);
                    to_initiator.extend_from_slice(&theirs);
                }
                let name = if bit == 1 { "secret" } else { "open" };
                let target_seed = [&[bit][..], &to_target].concat();
                let initiator_seed = [&[2 | bit][..], &to_initiator].concat();
                std::fs::write(dir.join(format!("target_{name}")), target_seed).unwrap();
                std::fs::write(dir.join(format!("initiator_{name}")), initiator_seed).unwrap();
            }
        }
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            let (mode, rest) = bytes.split_first().unwrap();
            let secret = (mode & 1 != 0).then(|| key.clone());
            let steps = if mode & 2 == 0 {
                let sv = std::cell::RefCell::new(Serving::new(secret, local));
                feed(&mut |b| sv.borrow_mut().on_bytes(b).is_ok(), &|| sv.borrow().want(), rest)
            } else {
                let op = std::cell::RefCell::new(Opening::new(secret, IDENT).0);
                let mut step = |b: &[u8]| {
                    let mut o = op.borrow_mut();
                    match o.on_bytes(b) {
                        Ok(Step::Prove) => {
                            o.proof(local);
                            true
                        }
                        r => r.is_ok(),
                    }
                };
                feed(&mut step, &|| op.borrow().want(), rest)
            };
            assert!(steps.len() >= 2 && steps[..2] == [true, true], "{mode}: {steps:?}");
            seen |= 1 << mode;
        }
        assert_eq!(seen, 0b1111, "a seed of each machine, with and without a secret");
    }

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

    /// The two machines talking with no socket: the initiator's bytes fed
    /// to the target's machine and back. The target's verdict, the ident it
    /// registered, and the initiator's.
    fn machines(
        ours: Option<&[u8]>,
        theirs: Option<&[u8]>,
        ident: Ident,
    ) -> (std::result::Result<(), String>, Option<Ident>, std::result::Result<(), Refused>) {
        let dialed: SocketAddr = "10.0.0.7:4000".parse().unwrap();
        let (mut o, hello) = Opening::new(ours.map(Arc::from), ident);
        let mut t = Serving::new(theirs.map(Arc::from), dialed);
        let mut to_target: Vec<u8> = hello.to_vec();
        let mut to_init: Vec<u8> = Vec::new();
        let mut seen = None;
        let mut served: Option<std::result::Result<(), String>> = None;
        let mut opened: Option<std::result::Result<(), Refused>> = None;
        for _ in 0..16 {
            while served.is_none() && to_target.len() >= t.want() && t.want() > 0 {
                let b: Vec<u8> = to_target.drain(..t.want()).collect();
                match t.on_bytes(&b) {
                    Ok(Serve::Read) => {}
                    Ok(Serve::Hello { ident, reply }) => {
                        seen = Some(ident);
                        to_init.extend_from_slice(&reply);
                        if t.want() == 0 {
                            served = Some(Ok(()));
                        }
                    }
                    Ok(Serve::Proven(reply)) => {
                        to_init.extend_from_slice(&reply);
                        served = Some(Ok(()));
                    }
                    Err(r) => {
                        if let Some(reply) = r.reply {
                            to_init.extend_from_slice(reply.bytes());
                        }
                        served = Some(Err(r.why));
                    }
                }
            }
            while opened.is_none() && to_init.len() >= o.want() && o.want() > 0 {
                let b: Vec<u8> = to_init.drain(..o.want()).collect();
                match o.on_bytes(&b) {
                    Ok(Step::Read) => {}
                    Ok(Step::Prove) => to_target.extend_from_slice(&o.proof(dialed)),
                    Ok(Step::Done) => opened = Some(Ok(())),
                    Err(r) => opened = Some(Err(r)),
                }
            }
        }
        (
            served.expect("the target's machine decided"),
            seen,
            opened.unwrap_or_else(|| {
                Err(Refused {
                    kind: ErrorKind::ProcessFailed,
                    why: "the target closed".into(),
                })
            }),
        )
    }

    #[test]
    fn the_two_machines_open_a_connection_with_and_without_a_secret() {
        for secret in [None, Some(SECRET)] {
            let (served, seen, opened) = machines(secret, secret, IDENT);
            assert_eq!(served, Ok(()), "{secret:?}");
            assert_eq!(seen, Some(IDENT));
            assert!(opened.is_ok(), "{opened:?}");
        }
    }

    #[test]
    fn the_target_machine_refuses_a_wrong_proof_and_a_hello_without_a_connection_id() {
        let (served, seen, opened) = machines(Some(OTHER), Some(SECRET), IDENT);
        assert!(served.unwrap_err().contains("authentication failed"));
        assert_eq!(seen, Some(IDENT), "registered before the proof");
        assert_eq!(opened.unwrap_err().kind, ErrorKind::AccessDenied);
        let nobody = Ident {
            session: [7; SESSION_LEN],
            conn: 0,
        };
        let (served, seen, opened) = machines(None, None, nobody);
        assert!(served.unwrap_err().contains("no connection id"));
        assert_eq!(seen, None);
        assert_eq!(opened.unwrap_err().kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn the_target_machine_refuses_another_protocol_version_at_the_header() {
        let mut t = Serving::new(None, "127.0.0.1:1".parse().unwrap());
        let (_, hello) = Opening::new(None, IDENT);
        let mut head = [0u8; HELLO_HEADER_LEN];
        head.copy_from_slice(&hello[..HELLO_HEADER_LEN]);
        // The version sits right after the magic.
        head[8..10].copy_from_slice(&(DATA_VERSION + 1).to_le_bytes());
        let r = t.on_bytes(&head).unwrap_err();
        assert!(r.why.starts_with("bad hello"), "{}", r.why);
        assert!(matches!(r.reply, Some(Reply::Hello(_))));
        assert_eq!(t.want(), 0);
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
