//! The data-plane frames of `tcp`: fixed-size binary headers, little-endian.
//!
//! The control plane's TLV codec is for rare, extensible messages; data
//! frames go out once per slice, so they are fixed and cheap to check. A
//! connection opens with a [`Hello`] each way (each carrying a fresh
//! nonce; the initiator's also names it: its session and this connection,
//! an [`Ident`]); when the target's hello sets [`AUTH_REQUIRED`], a
//! [`Proof`] goes each way (HMAC of both nonces and the initiator's
//! ident under the shared secret, data-plane labels: see `control::auth`).
//! Then the connection carries requests and fences (initiator → target)
//! and responses (target → initiator) in order: the target serves one
//! connection's requests one after another, so a response always answers
//! the oldest outstanding request (`seq` confirms it). A fence gets no
//! response; the connection it fences gets a [`Fenced`] notice at a frame
//! boundary of its responses, then the target closes it.
//!
//! ```text
//! hello    : "TENTDATA" | version u16 | status u16 | flags u32 | nonce [32]
//!            | session [16] | conn u32 | 0 u32                           (72 B)
//! proof    : "TENTAUTH" | version u16 | status u16 | 0 u32     | mac [32]    (48 B)
//! request  : "TQ" | opcode u8 | 0 u8 | seq u32 | addr u64 | len u64 | key u64   (32 B)
//!            WRITE: `len` payload bytes follow
//! fence    : "TF" | 0 u16 | conn u32 | 0 [24]                                 (32 B)
//! response : "TR" | status u16 | seq u32 | len u64                             (16 B)
//!            READ that succeeded: `len` payload bytes follow
//! fenced   : "TX" | 0 u16 | conn u32 | 0 u64                                   (16 B)
//! ```
//! `status` is 0 for success or an [`ErrorKind`] code; a hello with status
//! [`BUSY`] says "no room now, come back later" (back-pressure, not a
//! fault). The first [`HELLO_HEADER_LEN`] bytes of a hello name the
//! version, so a peer of another version is answered before the rest.
//! Bytes shown as 0 are reserved: a frame with any of them set is refused.
//!
//! A [`Fence`] goes ahead of a slice moved off a connection that failed
//! (`conn`, of the same session): the target then lets that connection
//! write no more byte into memory before it serves the slice, so bytes of
//! the superseded connection still on their way cannot land over it, or
//! over anything written after it.
//!
//! The connection a fence supersedes is told so ([`Fenced`], naming
//! itself) after the responses already queued on it, and then closed. An
//! initiator reads it in place of a response: the target process is
//! alive, and something that holds this session (a copy of the process,
//! or a peer that read the session off the wire) fenced the connection,
//! which is not the "peer process gone" an EOF means. An initiator that
//! fenced its own connection closed that socket first and never reads it.
//! A peer that predates the notice reads it as a malformed response: the
//! connection ends either way.

use tent_rings::{ErrorKind, Opcode};

/// Data protocol version (2: nonces in the hello, proofs of the secret;
/// 3: the initiator's [`Ident`] in the hello, fences).
pub const DATA_VERSION: u16 = 3;
/// Hello length.
pub const HELLO_LEN: usize = 72;
/// The part of a hello read first: magic, version, status, flags.
pub const HELLO_HEADER_LEN: usize = 16;
/// Proof length.
pub const PROOF_LEN: usize = 48;
/// Nonce and MAC length.
pub(crate) const NONCE_LEN: usize = 32;
/// Session id length.
pub const SESSION_LEN: usize = 16;
/// Hello flag (target → initiator): prove the shared secret before any request.
pub(crate) const AUTH_REQUIRED: u32 = 1;
/// Hello status of a target with no room for another connection now.
pub(crate) const BUSY: ErrorKind = ErrorKind::SqFull;
/// Request header length (a fence has the same length, so the target
/// reads one header size: see [`Inbound`]).
pub const REQUEST_LEN: usize = 32;
/// Response header length.
pub const RESPONSE_LEN: usize = 16;
/// The largest single op the target serves (slices are `block_size`, far
/// below): a larger WRITE cannot be drained safely, so it closes the link.
pub const MAX_OP_LEN: u64 = 1 << 30;

const HELLO_MAGIC: [u8; 8] = *b"TENTDATA";
const PROOF_MAGIC: [u8; 8] = *b"TENTAUTH";
const REQUEST_MAGIC: [u8; 2] = *b"TQ";
const FENCE_MAGIC: [u8; 2] = *b"TF";
const RESPONSE_MAGIC: [u8; 2] = *b"TR";
const FENCED_MAGIC: [u8; 2] = *b"TX";
const OP_WRITE: u8 = 1;
const OP_READ: u8 = 2;

/// Why a frame could not be read; the connection cannot continue after any
/// of these (the byte stream has lost its framing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first bytes are not this protocol's magic.
    #[error("bad magic")]
    BadMagic,
    /// The peer speaks another version of the data protocol.
    #[error("unsupported data protocol version {0}")]
    Version(u16),
    /// Unknown opcode: its payload length cannot be known.
    #[error("unknown opcode {0}")]
    Opcode(u8),
    /// Length above [`MAX_OP_LEN`].
    #[error("op length {0} above the limit")]
    TooLong(u64),
    /// A reserved byte is not zero.
    #[error("reserved bytes set")]
    Reserved,
}

/// Who an initiator's connection is: its session (random, one per
/// initiator process) and this connection's id in it (never 0, never
/// reused by the session). A target's hello carries [`Ident::NONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ident {
    /// The initiator's session.
    pub session: [u8; SESSION_LEN],
    /// The connection.
    pub conn: u32,
}

impl Ident {
    /// No ident (a target's hello, a refusal).
    pub const NONE: Ident = Ident {
        session: [0; SESSION_LEN],
        conn: 0,
    };

    /// The bytes the proofs of the secret cover: session, then `conn`
    /// (little-endian).
    pub(crate) fn to_bytes(self) -> [u8; SESSION_LEN + 4] {
        let mut b = [0u8; SESSION_LEN + 4];
        b[..SESSION_LEN].copy_from_slice(&self.session);
        b[SESSION_LEN..].copy_from_slice(&self.conn.to_le_bytes());
        b
    }
}

/// The connection opener, sent by both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// 0, or the code of the reason the target refuses the connection
    /// ([`BUSY`]: later).
    pub status: u16,
    /// [`AUTH_REQUIRED`] or 0.
    pub flags: u32,
    /// Fresh random bytes of the sender (zero in a refusal).
    pub nonce: [u8; NONCE_LEN],
    /// The initiator's connection ([`Ident::NONE`] from a target).
    pub ident: Ident,
}

/// Where a hello's fields lie.
const HELLO_NONCE: usize = HELLO_HEADER_LEN;
const HELLO_SESSION: usize = HELLO_NONCE + NONCE_LEN;
const HELLO_CONN: usize = HELLO_SESSION + SESSION_LEN;
const HELLO_RESERVED: usize = HELLO_CONN + 4;
const _: () = assert!(HELLO_RESERVED + 4 == HELLO_LEN);

impl Hello {
    /// A refusal with `status` (no nonce, no flags).
    pub(crate) fn refusal(status: ErrorKind) -> Hello {
        Hello {
            status: status.code(),
            flags: 0,
            nonce: [0; NONCE_LEN],
            ident: Ident::NONE,
        }
    }

    /// Encode.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..10].copy_from_slice(&DATA_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[HELLO_NONCE..HELLO_SESSION].copy_from_slice(&self.nonce);
        b[HELLO_SESSION..HELLO_CONN].copy_from_slice(&self.ident.session);
        b[HELLO_CONN..HELLO_RESERVED].copy_from_slice(&self.ident.conn.to_le_bytes());
        b
    }

    /// Check the first [`HELLO_HEADER_LEN`] bytes (magic, version); the
    /// status and flags they carry.
    pub fn decode_header(b: &[u8; HELLO_HEADER_LEN]) -> Result<(u16, u32), FrameError> {
        if b[..8] != HELLO_MAGIC {
            return Err(FrameError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != DATA_VERSION {
            return Err(FrameError::Version(version));
        }
        Ok((
            u16::from_le_bytes([b[10], b[11]]),
            u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        ))
    }

    /// Decode and check magic, version and reserved bytes.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, FrameError> {
        let mut h = [0u8; HELLO_HEADER_LEN];
        h.copy_from_slice(&b[..HELLO_HEADER_LEN]);
        let (status, flags) = Hello::decode_header(&h)?;
        if b[HELLO_RESERVED..] != [0; 4] {
            return Err(FrameError::Reserved);
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[HELLO_NONCE..HELLO_SESSION]);
        let mut session = [0u8; SESSION_LEN];
        session.copy_from_slice(&b[HELLO_SESSION..HELLO_CONN]);
        Ok(Hello {
            status,
            flags,
            nonce,
            ident: Ident {
                session,
                conn: u32_at(b, HELLO_CONN),
            },
        })
    }
}

/// A proof of the shared secret, each way once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// 0, or why the target refuses (`AccessDenied`: a wrong proof).
    pub status: u16,
    /// The HMAC.
    pub mac: [u8; NONCE_LEN],
}

impl Proof {
    /// Encode.
    pub fn encode(&self) -> [u8; PROOF_LEN] {
        let mut b = [0u8; PROOF_LEN];
        b[..8].copy_from_slice(&PROOF_MAGIC);
        b[8..10].copy_from_slice(&DATA_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&self.status.to_le_bytes());
        b[16..].copy_from_slice(&self.mac);
        b
    }

    /// Decode and check magic, version and reserved bytes.
    pub fn decode(b: &[u8; PROOF_LEN]) -> Result<Proof, FrameError> {
        if b[..8] != PROOF_MAGIC {
            return Err(FrameError::BadMagic);
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != DATA_VERSION {
            return Err(FrameError::Version(version));
        }
        if b[12..16] != [0; 4] {
            return Err(FrameError::Reserved);
        }
        let mut mac = [0u8; NONCE_LEN];
        mac.copy_from_slice(&b[16..]);
        Ok(Proof {
            status: u16::from_le_bytes([b[10], b[11]]),
            mac,
        })
    }
}

/// One slice's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// READ or WRITE.
    pub opcode: Opcode,
    /// Echoed in the response.
    pub seq: u32,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// The target region's key, from its descriptor.
    pub key: u64,
}

impl Request {
    /// Encode.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..2].copy_from_slice(&REQUEST_MAGIC);
        b[2] = match self.opcode {
            Opcode::Write => OP_WRITE,
            Opcode::Read => OP_READ,
        };
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Decode; the caller still checks `len` against zero and the regions.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, FrameError> {
        if b[..2] != REQUEST_MAGIC {
            return Err(FrameError::BadMagic);
        }
        let opcode = match b[2] {
            OP_WRITE => Opcode::Write,
            OP_READ => Opcode::Read,
            other => return Err(FrameError::Opcode(other)),
        };
        if b[3] != 0 {
            return Err(FrameError::Reserved);
        }
        let len = u64_at(b, 16);
        if len > MAX_OP_LEN {
            return Err(FrameError::TooLong(len));
        }
        Ok(Request {
            opcode,
            seq: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            addr: u64_at(b, 8),
            len,
            key: u64_at(b, 24),
        })
    }
}

/// Let connection `conn` (of the sender's session) write no more: sent
/// ahead of a slice moved off it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The superseded connection's id.
    pub conn: u32,
}

impl Fence {
    /// Encode.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..2].copy_from_slice(&FENCE_MAGIC);
        b[4..8].copy_from_slice(&self.conn.to_le_bytes());
        b
    }

    /// Decode and check magic and reserved bytes.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Fence, FrameError> {
        if b[..2] != FENCE_MAGIC {
            return Err(FrameError::BadMagic);
        }
        if b[2..4] != [0; 2] || b[8..].iter().any(|&x| x != 0) {
            return Err(FrameError::Reserved);
        }
        Ok(Fence { conn: u32_at(b, 4) })
    }
}

/// What an initiator may send once its connection is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// A slice's READ or WRITE.
    Request(Request),
    /// A fence ahead of a moved slice.
    Fence(Fence),
}

impl Inbound {
    /// Decode a request or a fence, by its magic.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Inbound, FrameError> {
        if b[..2] == FENCE_MAGIC {
            Fence::decode(b).map(Inbound::Fence)
        } else {
            Request::decode(b).map(Inbound::Request)
        }
    }
}

/// Target → initiator: this connection (`conn`) was fenced by another
/// connection of its session; nothing more comes on it. Sent in place of
/// a response, once the responses queued before it are out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    /// The fenced connection's id (the receiver's own).
    pub conn: u32,
}

impl Fenced {
    /// Encode.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[..2].copy_from_slice(&FENCED_MAGIC);
        b[4..8].copy_from_slice(&self.conn.to_le_bytes());
        b
    }

    /// Decode and check magic and reserved bytes.
    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Fenced, FrameError> {
        if b[..2] != FENCED_MAGIC {
            return Err(FrameError::BadMagic);
        }
        if b[2..4] != [0; 2] || b[8..].iter().any(|&x| x != 0) {
            return Err(FrameError::Reserved);
        }
        Ok(Fenced { conn: u32_at(b, 4) })
    }
}

/// What a target may send once a connection is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// The answer to the oldest outstanding request.
    Response(Response),
    /// The connection was fenced; nothing follows.
    Fenced(Fenced),
}

impl Reply {
    /// Decode a response or a fenced notice, by its magic.
    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Reply, FrameError> {
        if b[..2] == FENCED_MAGIC {
            Fenced::decode(b).map(Reply::Fenced)
        } else {
            Response::decode(b).map(Reply::Response)
        }
    }
}

/// One slice's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// Bytes moved, or why not.
    pub status: Result<(), ErrorKind>,
    /// The request's `seq`.
    pub seq: u32,
    /// Payload bytes that follow (READ) or bytes written (WRITE).
    pub len: u64,
}

impl Response {
    /// Encode.
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        b[..2].copy_from_slice(&RESPONSE_MAGIC);
        let code = match self.status {
            Ok(()) => 0,
            Err(e) => e.code(),
        };
        b[2..4].copy_from_slice(&code.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decode; an unknown status code reads as `InvalidArgument`.
    pub fn decode(b: &[u8; RESPONSE_LEN]) -> Result<Response, FrameError> {
        if b[..2] != RESPONSE_MAGIC {
            return Err(FrameError::BadMagic);
        }
        let code = u16::from_le_bytes([b[2], b[3]]);
        let status = match code {
            0 => Ok(()),
            c => Err(ErrorKind::from_code(c).unwrap_or(ErrorKind::InvalidArgument)),
        };
        let len = u64_at(b, 8);
        if len > MAX_OP_LEN {
            return Err(FrameError::TooLong(len));
        }
        Ok(Response {
            status,
            seq: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            len,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The data_frames fuzz target's seeds are today's frames, one of each
    /// kind (`TENT_WRITE_SEEDS=1 cargo test -p tent --lib fuzz_seeds`
    /// writes them), and nothing else lies there.
    #[test]
    fn fuzz_seeds_are_today_s_frames() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/data_frames");
        let request = |opcode| Request {
            opcode,
            seq: 7,
            addr: 0x7f00_0000_1000,
            len: 4096,
            key: 0x5eed,
        };
        let seeds: [(&str, Vec<u8>); 8] = [
            ("request_read", request(Opcode::Read).encode().to_vec()),
            ("request_write", request(Opcode::Write).encode().to_vec()),
            ("fence", Fence { conn: 3 }.encode().to_vec()),
            ("fenced", Fenced { conn: 3 }.encode().to_vec()),
            (
                "response_ok",
                Response {
                    status: Ok(()),
                    seq: 7,
                    len: 4096,
                }
                .encode()
                .to_vec(),
            ),
            (
                "response_err",
                Response {
                    status: Err(ErrorKind::AccessDenied),
                    seq: 7,
                    len: 0,
                }
                .encode()
                .to_vec(),
            ),
            (
                "hello",
                Hello {
                    status: 0,
                    flags: AUTH_REQUIRED,
                    nonce: [9; NONCE_LEN],
                    ident: Ident {
                        session: [7; SESSION_LEN],
                        conn: 1,
                    },
                }
                .encode()
                .to_vec(),
            ),
            (
                "proof",
                Proof {
                    status: 0,
                    mac: [4; NONCE_LEN],
                }
                .encode()
                .to_vec(),
            ),
        ];
        let write = std::env::var_os("TENT_WRITE_SEEDS").is_some();
        if write {
            for entry in std::fs::read_dir(&dir).unwrap() {
                std::fs::remove_file(entry.unwrap().path()).unwrap();
            }
        }
        for (name, bytes) in &seeds {
            let path = dir.join(name);
            if write {
                std::fs::write(&path, bytes).unwrap();
            }
            assert_eq!(
                std::fs::read(&path).unwrap_or_default(),
                *bytes,
                "{}: TENT_WRITE_SEEDS=1 writes it",
                path.display()
            );
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            seeds.len(),
            "stale seeds"
        );
    }

    #[test]
    fn round_trips() {
        let h = Hello {
            status: 37,
            flags: AUTH_REQUIRED,
            nonce: [9; NONCE_LEN],
            ident: Ident {
                session: [4; SESSION_LEN],
                conn: 0x0102_0304,
            },
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let f = Fence { conn: u32::MAX };
        assert_eq!(Inbound::decode(&f.encode()), Ok(Inbound::Fence(f)));
        let p = Proof {
            status: 0,
            mac: [3; NONCE_LEN],
        };
        assert_eq!(Proof::decode(&p.encode()), Ok(p));
        assert_eq!(
            Hello::decode(&Hello::refusal(BUSY).encode()).map(|h| h.status),
            Ok(BUSY.code())
        );
        let r = Request {
            opcode: Opcode::Read,
            seq: 7,
            addr: u64::MAX - 3,
            len: 4096,
            key: 0xdead_beef,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert_eq!(Inbound::decode(&r.encode()), Ok(Inbound::Request(r)));
        let p = Response {
            status: Err(ErrorKind::OutOfBounds),
            seq: 9,
            len: 0,
        };
        assert_eq!(Response::decode(&p.encode()), Ok(p));
        assert_eq!(Reply::decode(&p.encode()), Ok(Reply::Response(p)));
        let n = Fenced { conn: 0x0a0b_0c0d };
        assert_eq!(Reply::decode(&n.encode()), Ok(Reply::Fenced(n)));
    }

    #[test]
    fn refuses_bad_frames() {
        let mut h = Hello::refusal(BUSY).encode();
        h[8] = 9;
        assert_eq!(Hello::decode(&h), Err(FrameError::Version(9)));
        h[0] = b'X';
        assert_eq!(Hello::decode(&h), Err(FrameError::BadMagic));
        let mut h = Hello::refusal(BUSY).encode();
        h[HELLO_LEN - 1] = 1;
        assert_eq!(Hello::decode(&h), Err(FrameError::Reserved));
        let good = Fence { conn: 9 }.encode();
        for at in (2..4).chain(8..REQUEST_LEN) {
            let mut f = good;
            f[at] = 1;
            assert_eq!(Inbound::decode(&f), Err(FrameError::Reserved), "byte {at}");
        }
        let good = Fenced { conn: 9 }.encode();
        for at in (2..4).chain(8..RESPONSE_LEN) {
            let mut f = good;
            f[at] = 1;
            assert_eq!(Reply::decode(&f), Err(FrameError::Reserved), "byte {at}");
        }
        let mut r = Request {
            opcode: Opcode::Write,
            seq: 1,
            addr: 0,
            len: 1,
            key: 1,
        }
        .encode();
        r[3] = 1;
        assert_eq!(Request::decode(&r), Err(FrameError::Reserved));
        for at in 12..16 {
            let mut p = Proof {
                status: 0,
                mac: [5; NONCE_LEN],
            }
            .encode();
            p[at] = 1;
            assert_eq!(Proof::decode(&p), Err(FrameError::Reserved), "byte {at}");
        }
        r[3] = 0;
        r[2] = 77;
        assert_eq!(Request::decode(&r), Err(FrameError::Opcode(77)));
        r[2] = OP_WRITE;
        r[16..24].copy_from_slice(&(MAX_OP_LEN + 1).to_le_bytes());
        assert_eq!(
            Request::decode(&r),
            Err(FrameError::TooLong(MAX_OP_LEN + 1))
        );
    }

    proptest! {
        #[test]
        fn random_headers_never_panic(b in proptest::array::uniform32(any::<u8>())) {
            let _ = Request::decode(&b);
            if let Ok(i) = Inbound::decode(&b) {
                let again = match i {
                    Inbound::Request(r) => r.encode(),
                    Inbound::Fence(f) => f.encode(),
                };
                prop_assert_eq!(Inbound::decode(&again), Ok(i));
            }
            let mut r = [0u8; RESPONSE_LEN];
            r.copy_from_slice(&b[..RESPONSE_LEN]);
            let _ = Response::decode(&r);
            if let Ok(reply) = Reply::decode(&r) {
                let again = match reply {
                    Reply::Response(p) => p.encode(),
                    Reply::Fenced(f) => f.encode(),
                };
                prop_assert_eq!(Reply::decode(&again), Ok(reply));
            }
            let mut h = [0u8; HELLO_HEADER_LEN];
            h.copy_from_slice(&b[..HELLO_HEADER_LEN]);
            let _ = Hello::decode_header(&h);
        }
    }
}
