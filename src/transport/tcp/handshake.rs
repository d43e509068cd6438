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

use std::io::Read;
use std::net::TcpStream;
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

/// What the proofs are bound to besides the nonces: the target's address
/// (`auth::addr_binding`), then the initiator's ident, so a proven
/// connection's ident is the one its initiator sent.
fn binding(server: std::net::SocketAddr, ident: &Ident) -> [u8; 18 + SESSION_LEN + 4] {
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

/// The initiator's side, on a connected socket, for the connection
/// `ident`.
pub fn open(
    s: &TcpStream,
    secret: Option<&[u8]>,
    deadline: Instant,
    ident: Ident,
) -> std::result::Result<(), Refused> {
    let ours = auth::nonce();
    let hello = Hello {
        status: 0,
        flags: 0,
        nonce: ours,
        ident,
    };
    io::send_header(s, &hello.encode()).map_err(|e| io_refused(e, "hello"))?;
    let mut rx = ByDeadline::new(s, deadline);
    let mut b = [0u8; HELLO_LEN];
    rx.read_exact(&mut b[..HELLO_HEADER_LEN])
        .map_err(|e| io_refused(e, "hello"))?;
    let mut head = [0u8; HELLO_HEADER_LEN];
    head.copy_from_slice(&b[..HELLO_HEADER_LEN]);
    let (status, flags) = Hello::decode_header(&head).map_err(|e| match e {
        FrameError::Version(v) => refused(
            ErrorKind::Unreachable,
            format!("target speaks data protocol version {v}"),
        ),
        e => refused(ErrorKind::Unreachable, format!("bad hello: {e}")),
    })?;
    rx.read_exact(&mut b[HELLO_HEADER_LEN..])
        .map_err(|e| io_refused(e, "hello"))?;
    if status != 0 {
        let kind = ErrorKind::from_code(status).unwrap_or(ErrorKind::Unreachable);
        return Err(refused(kind, "target refused the connection"));
    }
    let theirs = Hello::decode(&b).map_err(|e| refused(ErrorKind::Unreachable, e.to_string()))?;
    match (flags & AUTH_REQUIRED != 0, secret) {
        (false, None) => Ok(()),
        (true, None) => Err(refused(
            ErrorKind::AccessDenied,
            "target requires authentication: set rpc_shared_secret",
        )),
        // We hold a secret: a target that does not prove it holds it too
        // is not the engine we were configured to trust.
        (false, Some(_)) => Err(refused(
            ErrorKind::AccessDenied,
            "target does not authenticate, but rpc_shared_secret is set here",
        )),
        (true, Some(secret)) => {
            // Bound to the address we dialed (see the module doc).
            let binding = binding(
                s.peer_addr().map_err(|e| io_refused(e, "peer address"))?,
                &ident,
            );
            let proof = Proof {
                status: 0,
                mac: auth::client_proof(Door::Data, secret, &theirs.nonce, &ours, &binding),
            };
            io::send_header(s, &proof.encode()).map_err(|e| io_refused(e, "proof"))?;
            let mut b = [0u8; PROOF_LEN];
            rx.read_exact(&mut b).map_err(|e| {
                // A target that closes after our proof rejected it.
                let mut r = io_refused(e, "proof reply");
                if r.kind == BUSY {
                    r.kind = ErrorKind::AccessDenied;
                }
                r
            })?;
            let p =
                Proof::decode(&b).map_err(|e| refused(ErrorKind::Unreachable, e.to_string()))?;
            if p.status != 0 {
                return Err(refused(ErrorKind::AccessDenied, PROOF_REFUSED));
            }
            if !auth::verify_server(Door::Data, secret, &theirs.nonce, &ours, &binding, &p.mac) {
                return Err(refused(
                    ErrorKind::AccessDenied,
                    "target failed to prove the shared secret for the address we dialed \
                     (engines with a secret must reach each other without address \
                     translation, port forwarding or a relay in between)",
                ));
            }
            Ok(())
        }
    }
}
