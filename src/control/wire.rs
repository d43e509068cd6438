//! The control-plane message codec: framing and field encoding, nothing else.
//!
//! # Frame
//!
//! `magic *b"TENT"` | `version: u16 LE` | `msg_type: u16 LE` |
//! `body_len: u32 LE` | body (`body_len` bytes, at most [`MAX_BODY`]).
//!
//! The body is a sequence of fields, `tag: u16 LE` | `len: u32 LE` | `len`
//! value bytes. Integers are little-endian and fixed width, strings UTF-8,
//! bools one byte `0`/`1`, byte arrays exactly their size. A record (a region,
//! a rail) is a field whose value is itself a field sequence, decoded with the
//! same rules.
//!
//! # Compatibility
//!
//! A newer peer extends a message by adding fields with new tags (per-rail RDMA
//! QP bootstrap data, say), so the decoder skips every tag it does not know, at
//! the top level and inside records alike. `version` changes only for a break
//! that field skipping cannot absorb, and then the peers refuse each other.
//! Tags `0x8000..=0xFFFF` are never assigned; tests use them to play the part
//! of a newer peer's fields.
//!
//! `QpConnect`'s `initiator` record came after the first `QpConnect`: a
//! responder files the QP it connects under that identity (a reconnect
//! replaces the QP filed under the same one), so it cannot serve a request
//! without it. Such a request from an older initiator is refused
//! ([`WireError::MissingField`], which the control server answers with an
//! `Error { InvalidArgument }` naming the field) rather than filed under a
//! made-up key. An older responder skips the record and serves the request
//! as it always did.
//!
//! A known tag may appear once (twice is [`WireError::DuplicateField`]),
//! except the list fields marked "repeated", where each occurrence is one
//! element. Encoding is canonical: fields go out in tag order, list elements
//! in list order, an absent optional field is left out.
//!
//! # Tags
//!
//! Each field's tag and the constant the codec names it by. A test holds
//! this table against those constants and the message types.
//!
//! | Message (type)      | Tag      | Field           | Value                                            | Constant                  |
//! |---------------------|----------|-----------------|--------------------------------------------------|---------------------------|
//! | `Hello` (1)         | `0x0001` | `nonce`         | 32 bytes, required                               | `HELLO_NONCE`             |
//! | `Challenge` (2)     | `0x0001` | `nonce`         | 32 bytes, required                               | `CHALLENGE_NONCE`         |
//! |                     | `0x0002` | `auth_required` | bool, required                                   | `CHALLENGE_AUTH_REQUIRED` |
//! | `Auth` (3)          | `0x0001` | `mac`           | 32 bytes, required                               | `AUTH_MAC`                |
//! | `AuthOk` (4)        | `0x0001` | `mac`           | 32 bytes, required                               | `AUTH_OK_MAC`             |
//! | `GetDescriptor` (5) |          | (none)          |                                                  |                           |
//! | `Descriptor` (6)    | `0x0001` | `name`          | string ≤ [`MAX_NAME`], non-empty, required       | `DESC_NAME`               |
//! |                     | `0x0002` | `host_id`       | string ≤ [`MAX_NAME`], required                  | `DESC_HOST_ID`            |
//! |                     | `0x0003` | `pid`           | u32, required                                    | `DESC_PID`                |
//! |                     | `0x0004` | `shm_name`      | string ≤ [`MAX_SHM_NAME`], optional              | `DESC_SHM_NAME`           |
//! |                     | `0x0005` | region          | region record, repeated ≤ [`MAX_REGIONS`]        | `DESC_REGION`             |
//! |                     | `0x0006` | transport       | u8, repeated ≤ [`MAX_TRANSPORTS`]                | `DESC_TRANSPORT`          |
//! |                     | `0x0007` | rail            | rail record, repeated ≤ [`MAX_RAILS`]            | `DESC_RAIL`               |
//! |                     | `0x0008` | nic             | NIC record, repeated ≤ [`MAX_NICS`]              | `DESC_NIC`                |
//! | `Error` (7)         | `0x0001` | `code`          | u16, required                                    | `ERROR_CODE`              |
//! |                     | `0x0002` | `text`          | string ≤ [`MAX_MESSAGE_TEXT`], required          | `ERROR_TEXT`              |
//! | `QpConnect` (8)     | `0x0001` | `initiator_nic` | string ≤ 64 bytes, required                      | `QP_INITIATOR_NIC`        |
//! |                     | `0x0002` | `target_nic`    | string ≤ 64 bytes, required                      | `QP_TARGET_NIC`           |
//! |                     | `0x0003` | `gid`           | 16 bytes, required                               | `QP_GID`                  |
//! |                     | `0x0004` | `lid`           | u16, required                                    | `QP_LID`                  |
//! |                     | `0x0005` | `qpn`           | u32, required                                    | `QP_QPN`                  |
//! |                     | `0x0006` | `psn`           | u32, required                                    | `QP_PSN`                  |
//! |                     | `0x0007` | `mtu`           | u32 (an `ibv_mtu`), required                     | `QP_MTU`                  |
//! |                     | `0x0008` | `initiator`     | initiator record, required                       | `QP_INITIATOR`            |
//! | `QpAccept` (9)      | `0x0003` | `gid`           | 16 bytes, required                               | `QP_GID`                  |
//! |                     | `0x0004` | `lid`           | u16, required                                    | `QP_LID`                  |
//! |                     | `0x0005` | `qpn`           | u32, required                                    | `QP_QPN`                  |
//! |                     | `0x0006` | `psn`           | u32, required                                    | `QP_PSN`                  |
//! |                     | `0x0007` | `mtu`           | u32 (an `ibv_mtu`), required                     | `QP_MTU`                  |
//! | `Notify` (10)       | `0x0001` | `sender`        | u64 engine id, non-zero, required                | `NOTIFY_SENDER`           |
//! |                     | `0x0002` | `from`          | string ≤ [`MAX_NAME`], required                  | `NOTIFY_FROM`             |
//! |                     | `0x0003` | `seq`           | u64, non-zero, required                          | `NOTIFY_SEQ`              |
//! |                     | `0x0004` | `name`          | string ≤ [`MAX_NOTIFY_NAME`], required           | `NOTIFY_NAME`             |
//! |                     | `0x0005` | `msg`           | bytes ≤ [`MAX_NOTIFY_MSG`], required             | `NOTIFY_MSG`              |
//! | `NotifyAck` (11)    | `0x0001` | `seq`           | u64, required                                    | `ACK_SEQ`                 |
//! | region record       | `0x0001` | `id`            | u32, required                                    | `REGION_ID`               |
//! |                     | `0x0002` | `addr`          | u64, required                                    | `REGION_ADDR`             |
//! |                     | `0x0003` | `len`           | u64, required                                    | `REGION_LEN`              |
//! |                     | `0x0004` | `key`           | u64, required                                    | `REGION_KEY`              |
//! |                     | `0x0005` | `rkeys`         | u32 each, ≤ [`MAX_NICS`] (one per NIC), optional | `REGION_RKEYS`            |
//! | rail record         | `0x0001` | `name`          | string ≤ 64 bytes, required                      | `RAIL_NAME`               |
//! |                     | `0x0002` | `addr`          | string ≤ 64 bytes, required                      | `RAIL_ADDR`               |
//! | NIC record          | `0x0001` | `name`          | string ≤ 64 bytes, required                      | `NIC_NAME`                |
//! |                     | `0x0002` | `gid`           | 16 bytes, required                               | `NIC_GID`                 |
//! |                     | `0x0003` | `lid`           | u16, required                                    | `NIC_LID`                 |
//! |                     | `0x0004` | `mtu`           | u32 (an `ibv_mtu`), required                     | `NIC_MTU`                 |
//! | initiator record    | `0x0001` | `engine`        | u64, non-zero, required                          | `QPI_ENGINE`              |
//! |                     | `0x0002` | `worker`        | u16 < [`MAX_QP_WORKERS`], required               | `QPI_WORKER`              |
//! |                     | `0x0003` | `rail`          | u16 < [`MAX_QP_RAILS`], required                 | `QPI_RAIL`                |
//! |                     | `0x0004` | `queue`         | u16 < [`MAX_QP_PER_TRANSFER`], absent = 0        | `QPI_QUEUE`               |
//!
//! # Hostile input
//!
//! Decoding never panics. Every length is checked against the bytes actually
//! present and against its limit before it is used, so a peer cannot make
//! this side allocate more than the limits above by claiming large sizes.

use std::io::{self, Read, Write};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"TENT";
/// The frame format version this side speaks; a peer with another is refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Bytes in a frame header: magic, version, message type, body length.
pub const HEADER_LEN: usize = 12;
/// Largest body accepted (checked from the header, before reading or allocating the body).
pub const MAX_BODY: u32 = 1 << 20;
/// Longest segment name or host id, in bytes.
pub const MAX_NAME: usize = 256;
/// Longest shared-memory object name, in bytes.
pub const MAX_SHM_NAME: usize = 200;
/// Longest name of a notification, in bytes.
pub const MAX_NOTIFY_NAME: usize = 256;
/// Longest message of a notification, in bytes.
pub const MAX_NOTIFY_MSG: usize = 4096;
/// Longest text of an [`Message::Error`], in bytes.
pub const MAX_MESSAGE_TEXT: usize = 1024;
/// Most regions one descriptor may list.
pub const MAX_REGIONS: usize = 16384;
/// Most rails one descriptor may list.
pub const MAX_RAILS: usize = 64;
/// Most transports one descriptor may list.
pub const MAX_TRANSPORTS: usize = 8;
/// Bytes in a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes in a handshake MAC.
pub const MAC_LEN: usize = 32;

/// Most RDMA NICs one descriptor may list (and rkeys per region).
pub const MAX_NICS: usize = 32;
/// Most workers a [`QpInitiator`] may name: `workers/count`'s upper bound.
pub const MAX_QP_WORKERS: usize = 256;
/// Most rails a [`QpInitiator`] may name. Rails to a peer are
/// `max(local, remote)` NICs, and an engine lists at most [`MAX_NICS`] in
/// its descriptor (one with more cannot be opened by any peer).
pub const MAX_QP_RAILS: usize = MAX_NICS;
/// Most QPs one worker keeps per rail to a peer (`qp_per_transfer`'s
/// upper bound; a [`QpInitiator`]'s `queue` is below it).
pub const MAX_QP_PER_TRANSFER: usize = 16;
/// Longest rail name or rail address, in bytes.
const MAX_RAIL_FIELD: usize = 64;
/// Bytes in a field header: tag and value length.
const FIELD_HEADER_LEN: usize = 6;

const TYPE_HELLO: u16 = 1;
const TYPE_CHALLENGE: u16 = 2;
const TYPE_AUTH: u16 = 3;
const TYPE_AUTH_OK: u16 = 4;
const TYPE_GET_DESCRIPTOR: u16 = 5;
const TYPE_DESCRIPTOR: u16 = 6;
const TYPE_ERROR: u16 = 7;
const TYPE_QP_CONNECT: u16 = 8;
const TYPE_QP_ACCEPT: u16 = 9;
const TYPE_NOTIFY: u16 = 10;
const TYPE_NOTIFY_ACK: u16 = 11;
/// The highest type this side knows.
const TYPE_LAST: u16 = TYPE_NOTIFY_ACK;

const HELLO_NONCE: u16 = 0x0001;
const CHALLENGE_NONCE: u16 = 0x0001;
const CHALLENGE_AUTH_REQUIRED: u16 = 0x0002;
const AUTH_MAC: u16 = 0x0001;
const AUTH_OK_MAC: u16 = 0x0001;
const DESC_NAME: u16 = 0x0001;
const DESC_HOST_ID: u16 = 0x0002;
const DESC_PID: u16 = 0x0003;
const DESC_SHM_NAME: u16 = 0x0004;
const DESC_REGION: u16 = 0x0005;
const DESC_TRANSPORT: u16 = 0x0006;
const DESC_RAIL: u16 = 0x0007;
const DESC_NIC: u16 = 0x0008;
const REGION_ID: u16 = 0x0001;
const REGION_ADDR: u16 = 0x0002;
const REGION_LEN: u16 = 0x0003;
const REGION_KEY: u16 = 0x0004;
const REGION_RKEYS: u16 = 0x0005;
const NIC_NAME: u16 = 0x0001;
const NIC_GID: u16 = 0x0002;
const NIC_LID: u16 = 0x0003;
const NIC_MTU: u16 = 0x0004;
const QP_INITIATOR_NIC: u16 = 0x0001;
const QP_TARGET_NIC: u16 = 0x0002;
const QP_GID: u16 = 0x0003;
const QP_LID: u16 = 0x0004;
const QP_QPN: u16 = 0x0005;
const QP_PSN: u16 = 0x0006;
const QP_MTU: u16 = 0x0007;
const QP_INITIATOR: u16 = 0x0008;
const QPI_ENGINE: u16 = 0x0001;
const QPI_WORKER: u16 = 0x0002;
const QPI_RAIL: u16 = 0x0003;
const QPI_QUEUE: u16 = 0x0004;
const RAIL_NAME: u16 = 0x0001;
const RAIL_ADDR: u16 = 0x0002;
const NOTIFY_SENDER: u16 = 0x0001;
const NOTIFY_FROM: u16 = 0x0002;
const NOTIFY_SEQ: u16 = 0x0003;
const NOTIFY_NAME: u16 = 0x0004;
const NOTIFY_MSG: u16 = 0x0005;
const ACK_SEQ: u16 = 0x0001;
const ERROR_CODE: u16 = 0x0001;
const ERROR_TEXT: u16 = 0x0002;

/// One notification on the wire. `sender` (the sending engine's random id)
/// and `seq` (1, 2, ... per sender and receiver) let the receiver take a
/// resend after a lost answer as what it is: exactly once, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyFrame {
    /// The sending engine's id (non-zero).
    pub sender: u64,
    /// The sending engine's segment name.
    pub from: String,
    /// Its number in the sender's stream to this receiver (from 1).
    pub seq: u64,
    /// The notification's name, at most [`MAX_NOTIFY_NAME`] bytes.
    pub name: String,
    /// The message, at most [`MAX_NOTIFY_MSG`] bytes.
    pub msg: Vec<u8>,
}

/// One registered memory region a peer may access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionEntry {
    /// The region's id within its segment.
    pub id: u32,
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote access key (an RDMA rkey, or a transport-specific token).
    pub key: u64,
    /// The region's RDMA rkey on each NIC of [`SegmentDescriptor::nics`],
    /// same order; empty when the owner serves no RDMA. At most [`MAX_NICS`].
    pub rkeys: Vec<u32>,
}

impl RegionEntry {
    /// The region of `sorted` (by `addr`) that holds `[addr, addr+len)`:
    /// how an initiator checks a remote range against a descriptor before
    /// sending anything (`AddressNotRegistered`, `OutOfBounds` otherwise).
    #[inline]
    pub fn find(
        sorted: &[RegionEntry],
        addr: u64,
        len: u64,
    ) -> std::result::Result<&RegionEntry, tent_rings::ErrorKind> {
        use tent_rings::ErrorKind;
        let end = addr.checked_add(len).ok_or(ErrorKind::OutOfBounds)?;
        let idx = sorted.partition_point(|r| r.addr <= addr);
        let r = idx
            .checked_sub(1)
            .map(|i| &sorted[i])
            .filter(|r| addr - r.addr < r.len)
            .ok_or(ErrorKind::AddressNotRegistered)?;
        if end - r.addr > r.len {
            return Err(ErrorKind::OutOfBounds);
        }
        Ok(r)
    }
}

/// One RDMA NIC of the owning engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicEntry {
    /// Device name (`mlx5_0`, `rxe1`), at most 64 bytes.
    pub name: String,
    /// Port GID.
    pub gid: [u8; 16],
    /// Port LID (0 on RoCE).
    pub lid: u16,
    /// Active MTU (an `ibv_mtu` value).
    pub mtu: u32,
}

/// What one side of an RC connection tells the other (QP bootstrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpBootstrap {
    /// Port GID.
    pub gid: [u8; 16],
    /// Port LID.
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number.
    pub psn: u32,
    /// Path MTU (an `ibv_mtu` value).
    pub mtu: u32,
}

/// Who asks for a passive QP: one endpoint (worker, rail) of one initiator
/// engine. A responder files the QP it connects under this key, so a
/// reconnect of the same endpoint replaces its old QP.
///
/// Only [`QpInitiator::new`] makes one, so every key is within bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpInitiator {
    engine: u64,
    worker: u16,
    rail: u16,
    /// Which of the rail's `qp_per_transfer` QPs (0 for the first).
    queue: u16,
}

impl QpInitiator {
    /// The key of rail `rail` of worker `worker` of the initiator engine
    /// `engine` (random, non-zero, one per engine).
    ///
    /// # Errors
    /// [`WireError::BadField`] naming the record's field: `engine` zero,
    /// `worker` not below [`MAX_QP_WORKERS`], `rail` not below [`MAX_QP_RAILS`].
    pub fn new(engine: u64, worker: usize, rail: usize) -> Result<QpInitiator> {
        if engine == 0 {
            return Err(WireError::BadField {
                tag: QPI_ENGINE,
                reason: "engine id 0 is reserved (an initiator draws a random non-zero one)".into(),
            });
        }
        let index = |tag, what, v: usize, max: usize| {
            u16::try_from(v)
                .ok()
                .filter(|&i| usize::from(i) < max)
                .ok_or_else(|| WireError::BadField {
                    tag,
                    reason: format!("{what} {v} out of range (below {max})"),
                })
        };
        Ok(QpInitiator {
            engine,
            worker: index(QPI_WORKER, "worker", worker, MAX_QP_WORKERS)?,
            rail: index(QPI_RAIL, "rail", rail, MAX_QP_RAILS)?,
            queue: 0,
        })
    }

    /// The same key for QP `queue` of the rail (`qp_per_transfer` > 1).
    ///
    /// # Errors
    /// [`WireError::BadField`]: `queue` not below [`MAX_QP_PER_TRANSFER`].
    pub fn with_queue(self, queue: usize) -> Result<QpInitiator> {
        let queue = u16::try_from(queue)
            .ok()
            .filter(|&q| usize::from(q) < MAX_QP_PER_TRANSFER)
            .ok_or_else(|| WireError::BadField {
                tag: QPI_QUEUE,
                reason: format!("queue {queue} out of range (below {MAX_QP_PER_TRANSFER})"),
            })?;
        Ok(QpInitiator { queue, ..self })
    }

    /// The initiator engine's id.
    pub fn engine(&self) -> u64 {
        self.engine
    }

    /// The worker's index in its engine.
    pub fn worker(&self) -> usize {
        usize::from(self.worker)
    }

    /// The rail's index among the initiator's rails to this peer.
    pub fn rail(&self) -> usize {
        usize::from(self.rail)
    }

    /// Which of the rail's QPs (`qp_per_transfer`) this is.
    pub fn queue(&self) -> usize {
        usize::from(self.queue)
    }
}

/// An initiator's request for an RC QP: connect one from its
/// `initiator_nic` to the target's `target_nic`; `qp` is the initiator's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpRequest {
    /// Which endpoint of which engine asks (the responder's key).
    pub initiator: QpInitiator,
    /// The initiator's NIC, at most 64 bytes.
    pub initiator_nic: String,
    /// The target's NIC (one of its descriptor's), at most 64 bytes.
    pub target_nic: String,
    /// The initiator's QP.
    pub qp: QpBootstrap,
}

/// One network rail (NIC) of the owning engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailEntry {
    /// Device name, at most 64 bytes.
    pub name: String,
    /// Address on that rail, at most 64 bytes.
    pub addr: String,
}

/// What a peer needs to reach a segment: its regions, transports and rails.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentDescriptor {
    /// The segment's name (`ip:port`); non-empty, at most [`MAX_NAME`] bytes.
    pub name: String,
    /// The owner's host identity, at most [`MAX_NAME`] bytes; a peer compares
    /// it with its own to know whether it shares the host.
    pub host_id: String,
    /// The owning process.
    pub pid: u32,
    /// Shared-memory object backing the segment, at most [`MAX_SHM_NAME`] bytes.
    pub shm_name: Option<String>,
    /// Registered regions, at most [`MAX_REGIONS`].
    pub regions: Vec<RegionEntry>,
    /// Transports the owner serves (`TransportKind` codes), at most [`MAX_TRANSPORTS`].
    pub transports: Vec<u8>,
    /// Network rails, at most [`MAX_RAILS`].
    pub rails: Vec<RailEntry>,
    /// RDMA NICs, at most [`MAX_NICS`]; regions' `rkeys` follow this order.
    pub nics: Vec<NicEntry>,
}

/// A control-plane message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Client → server, first message: the client's nonce.
    Hello {
        /// Fresh random bytes from the client.
        nonce: [u8; NONCE_LEN],
    },
    /// Server → client: the server's nonce and whether it wants proof.
    Challenge {
        /// Fresh random bytes from the server.
        nonce: [u8; NONCE_LEN],
        /// Whether the client must send [`Message::Auth`] next.
        auth_required: bool,
    },
    /// Client → server: proof that the client holds the shared secret.
    Auth {
        /// The client's MAC over both nonces.
        mac: [u8; MAC_LEN],
    },
    /// Server → client: proof that the server holds the shared secret too.
    AuthOk {
        /// The server's MAC over both nonces.
        mac: [u8; MAC_LEN],
    },
    /// Client → server: ask for the segment descriptor.
    GetDescriptor,
    /// Server → client: the segment descriptor.
    Descriptor(SegmentDescriptor),
    /// Initiator → target: connect an RC QP (see [`QpRequest`]).
    QpConnect(QpRequest),
    /// Target → initiator: the target's end, already connected to it.
    QpAccept {
        /// The target's QP.
        qp: QpBootstrap,
    },
    /// Sender → receiver: one notification (see [`NotifyFrame`]).
    Notify(NotifyFrame),
    /// Receiver → sender: notification `seq` is in the receiver's inbox
    /// (or was already: a resend after a lost answer).
    NotifyAck {
        /// The acknowledged sequence number.
        seq: u64,
    },
    /// Either way: a refusal, after which the sender closes.
    Error {
        /// A tent `ErrorKind` code.
        code: u16,
        /// Human-readable detail, at most [`MAX_MESSAGE_TEXT`] bytes.
        text: String,
    },
}

impl Message {
    /// The `msg_type` this message has on the wire.
    pub fn type_code(&self) -> u16 {
        match self {
            Message::Hello { .. } => TYPE_HELLO,
            Message::Challenge { .. } => TYPE_CHALLENGE,
            Message::Auth { .. } => TYPE_AUTH,
            Message::AuthOk { .. } => TYPE_AUTH_OK,
            Message::GetDescriptor => TYPE_GET_DESCRIPTOR,
            Message::Descriptor(_) => TYPE_DESCRIPTOR,
            Message::QpConnect(_) => TYPE_QP_CONNECT,
            Message::QpAccept { .. } => TYPE_QP_ACCEPT,
            Message::Notify(_) => TYPE_NOTIFY,
            Message::NotifyAck { .. } => TYPE_NOTIFY_ACK,
            Message::Error { .. } => TYPE_ERROR,
        }
    }

    /// The variant's name, for logs and protocol errors.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Challenge { .. } => "Challenge",
            Message::Auth { .. } => "Auth",
            Message::AuthOk { .. } => "AuthOk",
            Message::GetDescriptor => "GetDescriptor",
            Message::Descriptor(_) => "Descriptor",
            Message::QpConnect(_) => "QpConnect",
            Message::QpAccept { .. } => "QpAccept",
            Message::Notify(_) => "Notify",
            Message::NotifyAck { .. } => "NotifyAck",
            Message::Error { .. } => "Error",
        }
    }
}

/// Why a frame could not be decoded, read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The input ended before the frame did. `have: 0` from [`read_message`]
    /// means the peer closed cleanly between messages.
    #[error("truncated message: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the frame (or its header) needs.
        need: usize,
        /// Bytes that were there.
        have: usize,
    },
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:02x?} (not a tent control message)")]
    BadMagic([u8; 4]),
    /// The peer speaks another [`PROTOCOL_VERSION`].
    #[error("unsupported protocol version {0} (this side speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion(u16),
    /// The `msg_type` is not one this side knows.
    #[error("unknown message type {0}")]
    UnknownMessage(u16),
    /// A body, string or list is over its limit.
    #[error("{what} of {len} exceeds the limit {max}")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size (bytes or elements).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A required field is absent.
    #[error("{msg}: missing required field {tag:#06x}")]
    MissingField {
        /// The message or record that lacks it.
        msg: &'static str,
        /// The field's tag.
        tag: u16,
    },
    /// A non-list field appears more than once.
    #[error("field {tag:#06x} appears twice")]
    DuplicateField {
        /// The field's tag.
        tag: u16,
    },
    /// A field's value is malformed.
    #[error("field {tag:#06x}: {reason}")]
    BadField {
        /// The field's tag.
        tag: u16,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing the stream failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

type Result<T> = std::result::Result<T, WireError>;

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// Saturating because encoding is infallible by signature: a value past
/// 4 GiB cannot be framed, and a saturated length makes the peer reject the
/// frame instead of misreading it.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// A field sequence under construction.
struct Body(Vec<u8>);

impl Body {
    fn field(&mut self, tag: u16, value: &[u8]) {
        self.0.extend_from_slice(&tag.to_le_bytes());
        self.0
            .extend_from_slice(&len_u32(value.len()).to_le_bytes());
        self.0.extend_from_slice(value);
    }

    fn u8(&mut self, tag: u16, v: u8) {
        self.field(tag, &[v]);
    }

    fn u16(&mut self, tag: u16, v: u16) {
        self.field(tag, &v.to_le_bytes());
    }

    fn u32(&mut self, tag: u16, v: u32) {
        self.field(tag, &v.to_le_bytes());
    }

    fn u64(&mut self, tag: u16, v: u64) {
        self.field(tag, &v.to_le_bytes());
    }

    fn bool(&mut self, tag: u16, v: bool) {
        self.field(tag, &[u8::from(v)]);
    }

    fn str(&mut self, tag: u16, v: &str) {
        self.field(tag, v.as_bytes());
    }

    /// Writes the record in place and patches its length afterwards, so
    /// nested records cost no intermediate buffer.
    fn record(&mut self, tag: u16, fill: impl FnOnce(&mut Body)) {
        self.0.extend_from_slice(&tag.to_le_bytes());
        let len_at = self.0.len();
        self.0.extend_from_slice(&[0; 4]);
        fill(self);
        self.patch_len(len_at);
    }

    /// Sets the u32 at `at` to the number of bytes that follow it.
    fn patch_len(&mut self, at: usize) {
        let len = len_u32(self.0.len().saturating_sub(at + 4));
        if let Some(slot) = self.0.get_mut(at..at + 4) {
            slot.copy_from_slice(&len.to_le_bytes());
        }
    }
}

/// Encodes `msg` as one whole frame.
///
/// Limits are not checked here: a message over them encodes, and the peer
/// refuses it. Encoding is canonical, so equal messages give equal bytes.
pub fn encode(msg: &Message) -> Vec<u8> {
    let mut b = Body(Vec::with_capacity(HEADER_LEN + 128));
    b.0.extend_from_slice(&MAGIC);
    b.0.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    b.0.extend_from_slice(&msg.type_code().to_le_bytes());
    b.0.extend_from_slice(&[0; 4]);
    match msg {
        Message::Hello { nonce } => b.field(HELLO_NONCE, nonce),
        Message::Challenge {
            nonce,
            auth_required,
        } => {
            b.field(CHALLENGE_NONCE, nonce);
            b.bool(CHALLENGE_AUTH_REQUIRED, *auth_required);
        }
        Message::Auth { mac } => b.field(AUTH_MAC, mac),
        Message::AuthOk { mac } => b.field(AUTH_OK_MAC, mac),
        Message::GetDescriptor => {}
        Message::Descriptor(d) => encode_descriptor(&mut b, d),
        Message::QpConnect(r) => {
            b.str(QP_INITIATOR_NIC, &r.initiator_nic);
            b.str(QP_TARGET_NIC, &r.target_nic);
            encode_qp(&mut b, &r.qp);
            let i = &r.initiator;
            b.record(QP_INITIATOR, |b| {
                b.u64(QPI_ENGINE, i.engine);
                b.u16(QPI_WORKER, i.worker);
                b.u16(QPI_RAIL, i.rail);
                // Absent means 0: a single-QP rail's record is unchanged.
                if i.queue != 0 {
                    b.u16(QPI_QUEUE, i.queue);
                }
            });
        }
        Message::QpAccept { qp } => encode_qp(&mut b, qp),
        Message::Notify(n) => {
            b.u64(NOTIFY_SENDER, n.sender);
            b.str(NOTIFY_FROM, &n.from);
            b.u64(NOTIFY_SEQ, n.seq);
            b.str(NOTIFY_NAME, &n.name);
            b.field(NOTIFY_MSG, &n.msg);
        }
        Message::NotifyAck { seq } => b.u64(ACK_SEQ, *seq),
        Message::Error { code, text } => {
            b.u16(ERROR_CODE, *code);
            b.str(ERROR_TEXT, text);
        }
    }
    b.patch_len(HEADER_LEN - 4);
    b.0
}

fn encode_qp(b: &mut Body, qp: &QpBootstrap) {
    b.field(QP_GID, &qp.gid);
    b.u16(QP_LID, qp.lid);
    b.u32(QP_QPN, qp.qpn);
    b.u32(QP_PSN, qp.psn);
    b.u32(QP_MTU, qp.mtu);
}

fn encode_descriptor(b: &mut Body, d: &SegmentDescriptor) {
    b.str(DESC_NAME, &d.name);
    b.str(DESC_HOST_ID, &d.host_id);
    b.u32(DESC_PID, d.pid);
    if let Some(shm) = &d.shm_name {
        b.str(DESC_SHM_NAME, shm);
    }
    for r in &d.regions {
        b.record(DESC_REGION, |b| {
            b.u32(REGION_ID, r.id);
            b.u64(REGION_ADDR, r.addr);
            b.u64(REGION_LEN, r.len);
            b.u64(REGION_KEY, r.key);
            if !r.rkeys.is_empty() {
                let packed: Vec<u8> = r.rkeys.iter().flat_map(|k| k.to_le_bytes()).collect();
                b.field(REGION_RKEYS, &packed);
            }
        });
    }
    for &t in &d.transports {
        b.u8(DESC_TRANSPORT, t);
    }
    for rail in &d.rails {
        b.record(DESC_RAIL, |b| {
            b.str(RAIL_NAME, &rail.name);
            b.str(RAIL_ADDR, &rail.addr);
        });
    }
    for nic in &d.nics {
        b.record(DESC_NIC, |b| {
            b.str(NIC_NAME, &nic.name);
            b.field(NIC_GID, &nic.gid);
            b.u16(NIC_LID, nic.lid);
            b.u32(NIC_MTU, nic.mtu);
        });
    }
}

/// Writes `msg` as one frame and flushes, since the peer waits for it whole
/// before answering and a buffered writer would otherwise stall the handshake.
pub fn write_message(w: &mut impl Write, msg: &Message) -> Result<()> {
    w.write_all(&encode(msg))?;
    w.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Checks a header and returns the message type and body length.
fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(u16, usize)> {
    let [m0, m1, m2, m3, v0, v1, t0, t1, l0, l1, l2, l3] = *h;
    let magic = [m0, m1, m2, m3];
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = u16::from_le_bytes([v0, v1]);
    if version != PROTOCOL_VERSION {
        return Err(WireError::UnsupportedVersion(version));
    }
    let msg_type = u16::from_le_bytes([t0, t1]);
    if !(TYPE_HELLO..=TYPE_LAST).contains(&msg_type) {
        return Err(WireError::UnknownMessage(msg_type));
    }
    let body_len = u32::from_le_bytes([l0, l1, l2, l3]);
    if body_len > MAX_BODY {
        return Err(WireError::TooLarge {
            what: "message body",
            len: usize::try_from(body_len).unwrap_or(usize::MAX),
            max: MAX_BODY as usize,
        });
    }
    // MAX_BODY fits every supported usize, so this cannot truncate.
    Ok((msg_type, body_len as usize))
}

/// Decodes one frame from the start of `buf` and returns the message and the
/// bytes it took; bytes after it are left alone. A strict prefix of a frame
/// is [`WireError::Truncated`].
pub fn decode(buf: &[u8]) -> Result<(Message, usize)> {
    let Some((header, rest)) = buf.split_first_chunk::<HEADER_LEN>() else {
        return Err(WireError::Truncated {
            need: HEADER_LEN,
            have: buf.len(),
        });
    };
    let (msg_type, body_len) = parse_header(header)?;
    let Some(body) = rest.get(..body_len) else {
        return Err(WireError::Truncated {
            need: HEADER_LEN + body_len,
            have: buf.len(),
        });
    };
    Ok((decode_body(msg_type, body)?, HEADER_LEN + body_len))
}

/// Reads exactly one frame: the header first, checked in full (magic,
/// version, type, [`MAX_BODY`]) before any body byte is read, then the body.
///
/// End of stream inside the frame is [`WireError::Truncated`]; at the very
/// start it is `Truncated { have: 0, .. }`, a clean close.
pub fn read_message(r: &mut impl Read) -> Result<Message> {
    let mut header = [0u8; HEADER_LEN];
    let got = read_full(r, &mut header)?;
    if got < HEADER_LEN {
        return Err(WireError::Truncated {
            need: HEADER_LEN,
            have: got,
        });
    }
    let (msg_type, body_len) = parse_header(&header)?;
    // Grown as bytes arrive rather than sized from the header, so a peer
    // that claims a large body and sends nothing costs next to no memory.
    let mut body = Vec::new();
    Read::take(&mut *r, body_len as u64).read_to_end(&mut body)?;
    if body.len() < body_len {
        return Err(WireError::Truncated {
            need: HEADER_LEN + body_len,
            have: HEADER_LEN + body.len(),
        });
    }
    decode_body(msg_type, &body)
}

/// Fills `buf` unless the stream ends first; returns how much was filled.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..) {
        if rest.is_empty() {
            break;
        }
        match r.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n.min(rest.len()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn decode_body(msg_type: u16, body: &[u8]) -> Result<Message> {
    match msg_type {
        TYPE_HELLO => {
            let mut nonce = None;
            for field in Fields(body) {
                let (tag, v) = field?;
                match tag {
                    HELLO_NONCE => set_once(&mut nonce, tag, || fixed(tag, v))?,
                    _ => skip(tag),
                }
            }
            Ok(Message::Hello {
                nonce: required(nonce, "Hello", HELLO_NONCE)?,
            })
        }
        TYPE_CHALLENGE => {
            let (mut nonce, mut auth) = (None, None);
            for field in Fields(body) {
                let (tag, v) = field?;
                match tag {
                    CHALLENGE_NONCE => set_once(&mut nonce, tag, || fixed(tag, v))?,
                    CHALLENGE_AUTH_REQUIRED => set_once(&mut auth, tag, || boolean(tag, v))?,
                    _ => skip(tag),
                }
            }
            Ok(Message::Challenge {
                nonce: required(nonce, "Challenge", CHALLENGE_NONCE)?,
                auth_required: required(auth, "Challenge", CHALLENGE_AUTH_REQUIRED)?,
            })
        }
        TYPE_AUTH => Ok(Message::Auth {
            mac: decode_mac(body, "Auth", AUTH_MAC)?,
        }),
        TYPE_AUTH_OK => Ok(Message::AuthOk {
            mac: decode_mac(body, "AuthOk", AUTH_OK_MAC)?,
        }),
        TYPE_GET_DESCRIPTOR => {
            // No fields yet, but a newer peer may add some, and a malformed
            // body is still refused.
            for field in Fields(body) {
                let (tag, _) = field?;
                skip(tag);
            }
            Ok(Message::GetDescriptor)
        }
        TYPE_DESCRIPTOR => Ok(Message::Descriptor(decode_descriptor(body)?)),
        TYPE_QP_CONNECT => {
            let (mut initiator, mut initiator_nic, mut target_nic) = (None, None, None);
            let mut qp = QpFields::default();
            for field in Fields(body) {
                let (tag, v) = field?;
                match tag {
                    QP_INITIATOR_NIC => set_once(&mut initiator_nic, tag, || {
                        string(tag, v, "NIC name", MAX_RAIL_FIELD)
                    })?,
                    QP_TARGET_NIC => set_once(&mut target_nic, tag, || {
                        string(tag, v, "NIC name", MAX_RAIL_FIELD)
                    })?,
                    QP_INITIATOR => set_once(&mut initiator, tag, || decode_initiator(v))?,
                    _ => qp.take(tag, v)?,
                }
            }
            Ok(Message::QpConnect(QpRequest {
                initiator: required(initiator, "QpConnect", QP_INITIATOR)?,
                initiator_nic: required(initiator_nic, "QpConnect", QP_INITIATOR_NIC)?,
                target_nic: required(target_nic, "QpConnect", QP_TARGET_NIC)?,
                qp: qp.finish("QpConnect")?,
            }))
        }
        TYPE_QP_ACCEPT => {
            let mut qp = QpFields::default();
            for field in Fields(body) {
                let (tag, v) = field?;
                qp.take(tag, v)?;
            }
            Ok(Message::QpAccept {
                qp: qp.finish("QpAccept")?,
            })
        }
        TYPE_NOTIFY => decode_notify(body).map(Message::Notify),
        TYPE_NOTIFY_ACK => {
            let mut seq = None;
            for field in Fields(body) {
                let (tag, v) = field?;
                match tag {
                    ACK_SEQ => set_once(&mut seq, tag, || Ok(u64::from_le_bytes(fixed(tag, v)?)))?,
                    _ => skip(tag),
                }
            }
            Ok(Message::NotifyAck {
                seq: required(seq, "NotifyAck", ACK_SEQ)?,
            })
        }
        TYPE_ERROR => {
            let (mut code, mut text) = (None, None);
            for field in Fields(body) {
                let (tag, v) = field?;
                match tag {
                    ERROR_CODE => {
                        set_once(&mut code, tag, || Ok(u16::from_le_bytes(fixed(tag, v)?)))?
                    }
                    ERROR_TEXT => set_once(&mut text, tag, || {
                        string(tag, v, "error text", MAX_MESSAGE_TEXT)
                    })?,
                    _ => skip(tag),
                }
            }
            Ok(Message::Error {
                code: required(code, "Error", ERROR_CODE)?,
                text: required(text, "Error", ERROR_TEXT)?,
            })
        }
        other => Err(WireError::UnknownMessage(other)),
    }
}

fn decode_notify(body: &[u8]) -> Result<NotifyFrame> {
    let (mut sender, mut from, mut seq, mut name, mut msg) = (None, None, None, None, None);
    let nonzero = |tag: u16, v: &[u8], what: &str| -> Result<u64> {
        match u64::from_le_bytes(fixed(tag, v)?) {
            0 => Err(WireError::BadField {
                tag,
                reason: format!("{what} 0"),
            }),
            n => Ok(n),
        }
    };
    for field in Fields(body) {
        let (tag, v) = field?;
        match tag {
            NOTIFY_SENDER => set_once(&mut sender, tag, || nonzero(tag, v, "sender"))?,
            NOTIFY_FROM => set_once(&mut from, tag, || string(tag, v, "sender name", MAX_NAME))?,
            NOTIFY_SEQ => set_once(&mut seq, tag, || nonzero(tag, v, "sequence number"))?,
            NOTIFY_NAME => set_once(&mut name, tag, || {
                string(tag, v, "notification name", MAX_NOTIFY_NAME)
            })?,
            NOTIFY_MSG => set_once(&mut msg, tag, || {
                if v.len() > MAX_NOTIFY_MSG {
                    return Err(WireError::TooLarge {
                        what: "notification message",
                        len: v.len(),
                        max: MAX_NOTIFY_MSG,
                    });
                }
                Ok(v.to_vec())
            })?,
            _ => skip(tag),
        }
    }
    Ok(NotifyFrame {
        sender: required(sender, "Notify", NOTIFY_SENDER)?,
        from: required(from, "Notify", NOTIFY_FROM)?,
        seq: required(seq, "Notify", NOTIFY_SEQ)?,
        name: required(name, "Notify", NOTIFY_NAME)?,
        msg: required(msg, "Notify", NOTIFY_MSG)?,
    })
}

fn decode_mac(body: &[u8], msg: &'static str, mac_tag: u16) -> Result<[u8; MAC_LEN]> {
    let mut mac = None;
    for field in Fields(body) {
        let (tag, v) = field?;
        if tag == mac_tag {
            set_once(&mut mac, tag, || fixed(tag, v))?;
        } else {
            skip(tag);
        }
    }
    required(mac, msg, mac_tag)
}

/// The QP bootstrap fields of a message, as they arrive.
#[derive(Default)]
struct QpFields {
    gid: Option<[u8; 16]>,
    lid: Option<u16>,
    qpn: Option<u32>,
    psn: Option<u32>,
    mtu: Option<u32>,
}

impl QpFields {
    /// Take `tag` if it is a QP field; skip it otherwise.
    fn take(&mut self, tag: u16, v: &[u8]) -> Result<()> {
        match tag {
            QP_GID => set_once(&mut self.gid, tag, || fixed(tag, v)),
            QP_LID => set_once(&mut self.lid, tag, || {
                Ok(u16::from_le_bytes(fixed(tag, v)?))
            }),
            QP_QPN => set_once(&mut self.qpn, tag, || {
                Ok(u32::from_le_bytes(fixed(tag, v)?))
            }),
            QP_PSN => set_once(&mut self.psn, tag, || {
                Ok(u32::from_le_bytes(fixed(tag, v)?))
            }),
            QP_MTU => set_once(&mut self.mtu, tag, || {
                Ok(u32::from_le_bytes(fixed(tag, v)?))
            }),
            _ => {
                skip(tag);
                Ok(())
            }
        }
    }

    fn finish(self, msg: &'static str) -> Result<QpBootstrap> {
        Ok(QpBootstrap {
            gid: required(self.gid, msg, QP_GID)?,
            lid: required(self.lid, msg, QP_LID)?,
            qpn: required(self.qpn, msg, QP_QPN)?,
            psn: required(self.psn, msg, QP_PSN)?,
            mtu: required(self.mtu, msg, QP_MTU)?,
        })
    }
}

/// An initiator record; its bounds are [`QpInitiator::new`]'s.
fn decode_initiator(record: &[u8]) -> Result<QpInitiator> {
    let (mut engine, mut worker, mut rail, mut queue) = (None, None, None, None);
    for field in Fields(record) {
        let (tag, v) = field?;
        match tag {
            QPI_ENGINE => set_once(&mut engine, tag, || Ok(u64::from_le_bytes(fixed(tag, v)?)))?,
            QPI_WORKER => set_once(&mut worker, tag, || Ok(u16::from_le_bytes(fixed(tag, v)?)))?,
            QPI_RAIL => set_once(&mut rail, tag, || Ok(u16::from_le_bytes(fixed(tag, v)?)))?,
            QPI_QUEUE => set_once(&mut queue, tag, || Ok(u16::from_le_bytes(fixed(tag, v)?)))?,
            _ => skip(tag),
        }
    }
    QpInitiator::new(
        required(engine, "QpInitiator", QPI_ENGINE)?,
        usize::from(required(worker, "QpInitiator", QPI_WORKER)?),
        usize::from(required(rail, "QpInitiator", QPI_RAIL)?),
    )?
    .with_queue(usize::from(queue.unwrap_or(0)))
}

fn decode_descriptor(body: &[u8]) -> Result<SegmentDescriptor> {
    let (mut name, mut host_id, mut pid, mut shm_name) = (None, None, None, None);
    let (mut regions, mut transports, mut rails) = (Vec::new(), Vec::new(), Vec::new());
    let mut nics = Vec::new();
    for field in Fields(body) {
        let (tag, v) = field?;
        match tag {
            DESC_NAME => set_once(&mut name, tag, || string(tag, v, "segment name", MAX_NAME))?,
            DESC_HOST_ID => set_once(&mut host_id, tag, || string(tag, v, "host id", MAX_NAME))?,
            DESC_PID => set_once(&mut pid, tag, || Ok(u32::from_le_bytes(fixed(tag, v)?)))?,
            DESC_SHM_NAME => set_once(&mut shm_name, tag, || {
                string(tag, v, "shm name", MAX_SHM_NAME)
            })?,
            DESC_REGION => push_bounded(&mut regions, "region list", MAX_REGIONS, || {
                decode_region(v)
            })?,
            DESC_TRANSPORT => {
                push_bounded(&mut transports, "transport list", MAX_TRANSPORTS, || {
                    Ok(u8::from_le_bytes(fixed(tag, v)?))
                })?
            }
            DESC_RAIL => push_bounded(&mut rails, "rail list", MAX_RAILS, || decode_rail(v))?,
            DESC_NIC => push_bounded(&mut nics, "NIC list", MAX_NICS, || decode_nic(v))?,
            _ => skip(tag),
        }
    }
    let name = required(name, "Descriptor", DESC_NAME)?;
    if name.is_empty() {
        return Err(WireError::BadField {
            tag: DESC_NAME,
            reason: "empty segment name".into(),
        });
    }
    Ok(SegmentDescriptor {
        name,
        host_id: required(host_id, "Descriptor", DESC_HOST_ID)?,
        pid: required(pid, "Descriptor", DESC_PID)?,
        shm_name,
        regions,
        transports,
        rails,
        nics,
    })
}

fn decode_nic(record: &[u8]) -> Result<NicEntry> {
    let (mut name, mut gid, mut lid, mut mtu) = (None, None, None, None);
    for field in Fields(record) {
        let (tag, v) = field?;
        match tag {
            NIC_NAME => set_once(&mut name, tag, || {
                string(tag, v, "NIC name", MAX_RAIL_FIELD)
            })?,
            NIC_GID => set_once(&mut gid, tag, || fixed(tag, v))?,
            NIC_LID => set_once(&mut lid, tag, || Ok(u16::from_le_bytes(fixed(tag, v)?)))?,
            NIC_MTU => set_once(&mut mtu, tag, || Ok(u32::from_le_bytes(fixed(tag, v)?)))?,
            _ => skip(tag),
        }
    }
    Ok(NicEntry {
        name: required(name, "NicEntry", NIC_NAME)?,
        gid: required(gid, "NicEntry", NIC_GID)?,
        lid: required(lid, "NicEntry", NIC_LID)?,
        mtu: required(mtu, "NicEntry", NIC_MTU)?,
    })
}

fn decode_region(record: &[u8]) -> Result<RegionEntry> {
    let (mut id, mut addr, mut len, mut key) = (None, None, None, None);
    let mut rkeys = None;
    for field in Fields(record) {
        let (tag, v) = field?;
        match tag {
            REGION_ID => set_once(&mut id, tag, || Ok(u32::from_le_bytes(fixed(tag, v)?)))?,
            REGION_ADDR => set_once(&mut addr, tag, || Ok(u64::from_le_bytes(fixed(tag, v)?)))?,
            REGION_LEN => set_once(&mut len, tag, || Ok(u64::from_le_bytes(fixed(tag, v)?)))?,
            REGION_KEY => set_once(&mut key, tag, || Ok(u64::from_le_bytes(fixed(tag, v)?)))?,
            REGION_RKEYS => set_once(&mut rkeys, tag, || {
                if v.len() % 4 != 0 || v.len() / 4 > MAX_NICS {
                    return Err(WireError::BadField {
                        tag,
                        reason: format!(
                            "rkey list of {} bytes (want a multiple of 4, at most {MAX_NICS} keys)",
                            v.len()
                        ),
                    });
                }
                Ok(v.chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect())
            })?,
            _ => skip(tag),
        }
    }
    Ok(RegionEntry {
        id: required(id, "RegionEntry", REGION_ID)?,
        addr: required(addr, "RegionEntry", REGION_ADDR)?,
        len: required(len, "RegionEntry", REGION_LEN)?,
        key: required(key, "RegionEntry", REGION_KEY)?,
        rkeys: rkeys.unwrap_or_default(),
    })
}

fn decode_rail(record: &[u8]) -> Result<RailEntry> {
    let (mut name, mut addr) = (None, None);
    for field in Fields(record) {
        let (tag, v) = field?;
        match tag {
            RAIL_NAME => set_once(&mut name, tag, || {
                string(tag, v, "rail name", MAX_RAIL_FIELD)
            })?,
            RAIL_ADDR => set_once(&mut addr, tag, || {
                string(tag, v, "rail address", MAX_RAIL_FIELD)
            })?,
            _ => skip(tag),
        }
    }
    Ok(RailEntry {
        name: required(name, "RailEntry", RAIL_NAME)?,
        addr: required(addr, "RailEntry", RAIL_ADDR)?,
    })
}

/// The fields of a body or record, in order. The enclosing frame is already
/// complete here, so a field running past its record is malformed, not
/// truncated: reporting it as `Truncated` could read as a clean close.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u16, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let Some((head, after)) = self.0.split_first_chunk::<FIELD_HEADER_LEN>() else {
            let tag = match *self.0 {
                [a, b, ..] => u16::from_le_bytes([a, b]),
                _ => 0,
            };
            let reason = format!(
                "record ends inside a field header ({} of {FIELD_HEADER_LEN} bytes)",
                self.0.len()
            );
            self.0 = &[];
            return Some(Err(WireError::BadField { tag, reason }));
        };
        let [t0, t1, l0, l1, l2, l3] = *head;
        let tag = u16::from_le_bytes([t0, t1]);
        let len = u32::from_le_bytes([l0, l1, l2, l3]);
        let Some((value, rest)) = usize::try_from(len)
            .ok()
            .and_then(|n| after.split_at_checked(n))
        else {
            let reason = format!(
                "value of {len} bytes runs past the end of its record ({} left)",
                after.len()
            );
            self.0 = &[];
            return Some(Err(WireError::BadField { tag, reason }));
        };
        self.0 = rest;
        Some(Ok((tag, value)))
    }
}

/// Unknown fields are how newer peers extend messages; a trace helps when
/// two versions disagree about what matters.
fn skip(tag: u16) {
    tracing::trace!(tag, "skipping unknown control field");
}

fn set_once<T>(slot: &mut Option<T>, tag: u16, parse: impl FnOnce() -> Result<T>) -> Result<()> {
    if slot.is_some() {
        return Err(WireError::DuplicateField { tag });
    }
    *slot = Some(parse()?);
    Ok(())
}

/// Checks the count before decoding the element, so an over-long list is
/// refused at its first excess element.
fn push_bounded<T>(
    list: &mut Vec<T>,
    what: &'static str,
    max: usize,
    parse: impl FnOnce() -> Result<T>,
) -> Result<()> {
    if list.len() >= max {
        return Err(WireError::TooLarge {
            what,
            len: list.len() + 1,
            max,
        });
    }
    list.push(parse()?);
    Ok(())
}

fn required<T>(slot: Option<T>, msg: &'static str, tag: u16) -> Result<T> {
    slot.ok_or(WireError::MissingField { msg, tag })
}

fn fixed<const N: usize>(tag: u16, v: &[u8]) -> Result<[u8; N]> {
    <[u8; N]>::try_from(v).map_err(|_| WireError::BadField {
        tag,
        reason: format!("expected {N} bytes, got {}", v.len()),
    })
}

fn boolean(tag: u16, v: &[u8]) -> Result<bool> {
    match fixed::<1>(tag, v)? {
        [0] => Ok(false),
        [1] => Ok(true),
        [b] => Err(WireError::BadField {
            tag,
            reason: format!("bool byte {b}, expected 0 or 1"),
        }),
    }
}

/// The limit is checked before the UTF-8 scan and the copy.
fn string(tag: u16, v: &[u8], what: &'static str, max: usize) -> Result<String> {
    if v.len() > max {
        return Err(WireError::TooLarge {
            what,
            len: v.len(),
            max,
        });
    }
    std::str::from_utf8(v)
        .map(str::to_owned)
        .map_err(|e| WireError::BadField {
            tag,
            reason: format!("invalid UTF-8: {e}"),
        })
}

#[cfg(test)]
mod tests {
    /// The module's tag table, held against the code: every row names a
    /// constant of this file with the row's tag, every field constant has
    /// a row, and each message's type number is its `TYPE_` constant's.
    #[test]
    fn the_tag_table_in_the_docs_is_the_code_s() {
        let src = include_str!("wire.rs");
        // `const NAME: u16 = literal;` at the top level of this file.
        let mut consts = std::collections::BTreeMap::new();
        for line in src.lines() {
            let Some(rest) = line.strip_prefix("const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": u16 = ") else {
                continue;
            };
            let value = value.trim_end_matches(';');
            let parsed = match value.strip_prefix("0x") {
                Some(hex) => u16::from_str_radix(hex, 16).ok(),
                None => value.parse().ok(),
            };
            if let Some(v) = parsed {
                consts.insert(name.to_owned(), v);
            }
        }
        let table = src
            .split("//! # Tags")
            .nth(1)
            .and_then(|t| t.split("//! # Hostile input").next())
            .expect("the module docs have a tag table");
        let cell = |c: &str| c.trim().trim_matches('`').to_owned();
        let mut named = std::collections::BTreeSet::new();
        let mut types = 0;
        for row in table.lines().filter_map(|l| l.strip_prefix("//! |")) {
            let cols: Vec<String> = row.split('|').map(cell).collect();
            if cols.len() < 5 || cols[1] == "Tag" || cols[1].starts_with('-') {
                continue;
            }
            // `Name` (n): the message type.
            if let Some((name, n)) = cols[0].split_once("` (") {
                let n: u16 = n.trim_end_matches(')').parse().expect("a type number");
                let mut constant = String::from("TYPE");
                for c in name.chars() {
                    if c.is_ascii_uppercase() {
                        constant.push('_');
                    }
                    constant.push(c.to_ascii_uppercase());
                }
                assert_eq!(consts.get(&constant), Some(&n), "{} is type {n}", cols[0]);
                types += 1;
            }
            if cols[4].is_empty() {
                continue;
            }
            let tag = u16::from_str_radix(cols[1].trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("tag {:?} of {}", cols[1], cols[4]));
            assert_eq!(consts.get(&cols[4]), Some(&tag), "the row of {}", cols[4]);
            named.insert(cols[4].clone());
        }
        assert_eq!(
            types,
            usize::from(TYPE_LAST),
            "every message type has a row"
        );
        let fields: Vec<&String> = consts
            .keys()
            .filter(|k| !k.starts_with("TYPE_") && !named.contains(*k))
            .collect();
        assert!(
            fields.is_empty(),
            "field tags with no row in the table: {fields:?}"
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn region(i: u32) -> RegionEntry {
        RegionEntry {
            id: i,
            addr: 0x7f00_0000_0000 + u64::from(i) * 4096,
            len: 4096,
            key: u64::from(i) ^ 0xdead_beef,
            rkeys: Vec::new(),
        }
    }

    fn small_descriptor() -> SegmentDescriptor {
        SegmentDescriptor {
            name: "10.0.0.1:17777".into(),
            host_id: "host-a".into(),
            pid: 4242,
            shm_name: Some("/tent-4242".into()),
            regions: vec![region(1), region(2)],
            transports: vec![0, 1],
            rails: vec![RailEntry {
                name: "mlx5_0".into(),
                addr: "fe80::1".into(),
            }],
            nics: vec![
                NicEntry {
                    name: "mlx5_0".into(),
                    gid: [0xfe; 16],
                    lid: 0,
                    mtu: 3,
                },
                NicEntry {
                    name: "mlx5_1".into(),
                    gid: [7; 16],
                    lid: 12,
                    mtu: 5,
                },
            ],
        }
        .with_rkeys()
    }

    impl SegmentDescriptor {
        /// Give every region an rkey per NIC.
        fn with_rkeys(mut self) -> Self {
            let n = self.nics.len() as u32;
            for r in &mut self.regions {
                r.rkeys = (0..n).map(|k| r.id * 100 + k).collect();
            }
            self
        }
    }

    fn full_descriptor() -> SegmentDescriptor {
        SegmentDescriptor {
            name: "n".repeat(MAX_NAME),
            host_id: "h".repeat(MAX_NAME),
            pid: u32::MAX,
            shm_name: Some("s".repeat(MAX_SHM_NAME)),
            regions: (0..MAX_REGIONS as u32).map(region).collect(),
            transports: (0..MAX_TRANSPORTS as u8).collect(),
            rails: (0..MAX_RAILS)
                .map(|i| RailEntry {
                    name: format!("{i:0>width$}", width = MAX_RAIL_FIELD),
                    addr: "a".repeat(MAX_RAIL_FIELD),
                })
                .collect(),
            nics: Vec::new(),
        }
    }

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Hello {
                nonce: [1; NONCE_LEN],
            },
            Message::Challenge {
                nonce: [2; NONCE_LEN],
                auth_required: true,
            },
            Message::Challenge {
                nonce: [3; NONCE_LEN],
                auth_required: false,
            },
            Message::Auth { mac: [4; MAC_LEN] },
            Message::AuthOk { mac: [5; MAC_LEN] },
            Message::GetDescriptor,
            Message::Descriptor(SegmentDescriptor {
                name: "x".into(),
                ..Default::default()
            }),
            Message::Descriptor(small_descriptor()),
            Message::QpConnect(qp_request()),
            Message::QpConnect(QpRequest {
                initiator: QpInitiator::new(u64::MAX, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1)
                    .unwrap(),
                ..qp_request()
            }),
            Message::QpAccept {
                qp: QpBootstrap {
                    gid: [4; 16],
                    lid: 9,
                    qpn: 0x22,
                    psn: 1,
                    mtu: 5,
                },
            },
            Message::Notify(notify_frame()),
            Message::Notify(NotifyFrame {
                name: String::new(),
                msg: Vec::new(),
                ..notify_frame()
            }),
            Message::NotifyAck { seq: 3 },
            Message::Error {
                code: 7,
                text: "access denied".into(),
            },
            Message::Error {
                code: 0,
                text: String::new(),
            },
        ]
    }

    /// A frame around a hand-built body, for inputs `encode` never makes.
    fn notify_frame() -> NotifyFrame {
        NotifyFrame {
            sender: 0xfeed,
            from: "127.0.0.1:4000".into(),
            seq: 1,
            name: "kv-ready".into(),
            msg: vec![0xab; MAX_NOTIFY_MSG],
        }
    }

    /// A notification as a hostile peer writes it: every limit and
    /// required field is checked before anything is kept.
    #[test]
    fn notify_limits_and_required_fields() {
        let full = |f: &dyn Fn(&mut Body)| {
            frame(TYPE_NOTIFY, |b| {
                b.u64(NOTIFY_SENDER, 1);
                b.str(NOTIFY_FROM, "a");
                b.u64(NOTIFY_SEQ, 1);
                b.str(NOTIFY_NAME, "n");
                f(b);
            })
        };
        assert!(matches!(
            decode_err(&full(&|b| b.field(NOTIFY_MSG, &[0; MAX_NOTIFY_MSG + 1]))),
            WireError::TooLarge {
                max: MAX_NOTIFY_MSG,
                ..
            }
        ));
        assert!(matches!(
            decode_err(&full(&|_| {})),
            WireError::MissingField {
                tag: NOTIFY_MSG,
                ..
            }
        ));
        let long_name = frame(TYPE_NOTIFY, |b| {
            b.u64(NOTIFY_SENDER, 1);
            b.str(NOTIFY_FROM, "a");
            b.u64(NOTIFY_SEQ, 1);
            b.field(NOTIFY_NAME, &[b'x'; MAX_NOTIFY_NAME + 1]);
            b.field(NOTIFY_MSG, &[]);
        });
        assert!(matches!(
            decode_err(&long_name),
            WireError::TooLarge {
                max: MAX_NOTIFY_NAME,
                ..
            }
        ));
        for zero in [NOTIFY_SENDER, NOTIFY_SEQ] {
            let bytes = frame(TYPE_NOTIFY, |b| {
                b.u64(NOTIFY_SENDER, u64::from(zero != NOTIFY_SENDER));
                b.str(NOTIFY_FROM, "a");
                b.u64(NOTIFY_SEQ, u64::from(zero != NOTIFY_SEQ));
                b.str(NOTIFY_NAME, "n");
                b.field(NOTIFY_MSG, &[]);
            });
            assert!(
                matches!(decode_err(&bytes), WireError::BadField { tag, .. } if tag == zero),
                "a zero field {zero:#x} is refused"
            );
        }
        // A newer peer's extra field is skipped.
        let extra = full(&|b| {
            b.field(NOTIFY_MSG, b"m");
            b.u64(0x8000, 5);
        });
        assert!(matches!(decode(&extra), Ok((Message::Notify(n), _)) if n.msg == b"m"));
    }

    fn frame(msg_type: u16, fill: impl FnOnce(&mut Body)) -> Vec<u8> {
        let mut b = Body(Vec::new());
        fill(&mut b);
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out.extend_from_slice(&msg_type.to_le_bytes());
        out.extend_from_slice(&len_u32(b.0.len()).to_le_bytes());
        out.extend_from_slice(&b.0);
        out
    }

    fn decode_err(bytes: &[u8]) -> WireError {
        match decode(bytes) {
            Ok((m, _)) => panic!("decoded {m:?}, expected an error"),
            Err(e) => e,
        }
    }

    fn roundtrip(msg: &Message) {
        let bytes = encode(msg);
        let (back, used) = decode(&bytes).unwrap();
        assert_eq!(&back, msg);
        assert_eq!(used, bytes.len());
        assert_eq!(&read_message(&mut bytes.as_slice()).unwrap(), msg);
        assert_eq!(encode(&back), bytes, "canonical");
    }

    #[test]
    fn every_variant_round_trips() {
        for m in all_messages() {
            roundtrip(&m);
        }
    }

    #[test]
    fn full_descriptor_round_trips_within_max_body() {
        let msg = Message::Descriptor(full_descriptor());
        let bytes = encode(&msg);
        assert!(
            bytes.len() - HEADER_LEN <= MAX_BODY as usize,
            "a full descriptor must fit: {}",
            bytes.len()
        );
        roundtrip(&msg);
    }

    #[test]
    fn type_codes_and_names_are_distinct() {
        let msgs = all_messages();
        for m in &msgs {
            let bytes = encode(m);
            assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), m.type_code());
        }
        let mut names: Vec<_> = msgs.iter().map(|m| (m.type_code(), m.name())).collect();
        names.dedup();
        assert_eq!(names.len(), 11);
    }

    #[test]
    fn consecutive_frames_decode_one_at_a_time() {
        let mut stream = encode(&Message::GetDescriptor);
        stream.extend(encode(&Message::Auth { mac: [9; MAC_LEN] }));
        let (first, used) = decode(&stream).unwrap();
        assert_eq!(first, Message::GetDescriptor);
        let (second, _) = decode(&stream[used..]).unwrap();
        assert_eq!(second, Message::Auth { mac: [9; MAC_LEN] });
        let mut r = stream.as_slice();
        assert_eq!(read_message(&mut r).unwrap(), Message::GetDescriptor);
        assert_eq!(
            read_message(&mut r).unwrap(),
            Message::Auth { mac: [9; MAC_LEN] }
        );
        assert!(matches!(
            read_message(&mut r),
            Err(WireError::Truncated {
                need: HEADER_LEN,
                have: 0
            })
        ));
    }

    #[test]
    fn every_strict_prefix_is_truncated() {
        for m in all_messages() {
            let bytes = encode(&m);
            for n in 0..bytes.len() {
                match decode(&bytes[..n]) {
                    Err(WireError::Truncated { have, need }) => {
                        assert_eq!(have, n);
                        assert!(need > n);
                    }
                    other => panic!("{} prefix {n}: {other:?}", m.name()),
                }
                match read_message(&mut &bytes[..n]) {
                    Err(WireError::Truncated { have, .. }) => assert_eq!(have, n),
                    other => panic!("{} prefix {n} (read): {other:?}", m.name()),
                }
            }
        }
    }

    /// Fails the test if anything past the header is read.
    struct HeaderOnly {
        header: [u8; HEADER_LEN],
        pos: usize,
    }

    impl Read for HeaderOnly {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some(rest) = self.header.get(self.pos..).filter(|r| !r.is_empty()) else {
                return Err(io::Error::other("read past the header"));
            };
            let n = rest.len().min(buf.len()).min(5); // short reads on purpose
            buf[..n].copy_from_slice(&rest[..n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn oversized_body_is_refused_from_the_header_alone() {
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&MAGIC);
        header[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        header[6..8].copy_from_slice(&TYPE_DESCRIPTOR.to_le_bytes());
        header[8..].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        let mut r = HeaderOnly { header, pos: 0 };
        match read_message(&mut r) {
            Err(WireError::TooLarge {
                what: "message body",
                len,
                max,
            }) => {
                assert_eq!(len, MAX_BODY as usize + 1);
                assert_eq!(max, MAX_BODY as usize);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.pos, HEADER_LEN);
        assert!(matches!(decode(&header), Err(WireError::TooLarge { .. })));
        // At exactly MAX_BODY the header is fine and the body is awaited.
        header[8..].copy_from_slice(&MAX_BODY.to_le_bytes());
        assert!(matches!(decode(&header), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn interrupted_reads_are_retried() {
        struct Flaky<'a>(&'a [u8], bool);
        impl Read for Flaky<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(io::ErrorKind::Interrupted.into());
                }
                let n = self.0.len().min(buf.len()).min(3);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let msg = Message::Descriptor(small_descriptor());
        let bytes = encode(&msg);
        assert_eq!(read_message(&mut Flaky(&bytes, false)).unwrap(), msg);
    }

    #[test]
    fn write_message_writes_the_encoding() {
        let msg = Message::Challenge {
            nonce: [8; NONCE_LEN],
            auth_required: true,
        };
        let mut out = Vec::new();
        write_message(&mut out, &msg).unwrap();
        assert_eq!(out, encode(&msg));
    }

    #[test]
    fn bad_header_fields() {
        let good = encode(&Message::GetDescriptor);

        let mut b = good.clone();
        b[..4].copy_from_slice(b"HTTP");
        assert!(matches!(decode_err(&b), WireError::BadMagic(m) if &m == b"HTTP"));
        assert!(matches!(
            read_message(&mut b.as_slice()),
            Err(WireError::BadMagic(_))
        ));

        let mut b = good.clone();
        b[4..6].copy_from_slice(&2u16.to_le_bytes());
        assert!(matches!(decode_err(&b), WireError::UnsupportedVersion(2)));
        assert!(matches!(
            read_message(&mut b.as_slice()),
            Err(WireError::UnsupportedVersion(2))
        ));

        for t in [0u16, TYPE_LAST + 1, 0x8000, u16::MAX] {
            let mut b = good.clone();
            b[6..8].copy_from_slice(&t.to_le_bytes());
            assert!(matches!(decode_err(&b), WireError::UnknownMessage(x) if x == t));
            assert!(
                matches!(read_message(&mut b.as_slice()), Err(WireError::UnknownMessage(x)) if x == t)
            );
        }
    }

    #[test]
    fn newer_peer_fields_are_skipped() {
        // A newer peer adds per-rail QP bootstrap data at the top level and
        // inside records, interleaved with the fields this side knows (the
        // NIC list and rkeys are left out here: this frame is hand-built).
        let mut expected = small_descriptor();
        expected.nics.clear();
        for r in &mut expected.regions {
            r.rkeys.clear();
        }
        let bytes = frame(TYPE_DESCRIPTOR, |b| {
            b.field(0x8001, b"future top-level field");
            b.str(DESC_NAME, &expected.name);
            b.str(DESC_HOST_ID, &expected.host_id);
            b.record(0x8002, |b| {
                b.field(0x0001, &[0xfe; 16]); // GID
                b.u32(0x0002, 0x1234); // QPN
                b.u32(0x0003, 0x5678); // PSN
                b.u32(0x0004, 4096); // MTU
            });
            b.u32(DESC_PID, expected.pid);
            b.str(DESC_SHM_NAME, expected.shm_name.as_deref().unwrap());
            for r in &expected.regions {
                b.record(DESC_REGION, |b| {
                    b.record(0x8000, |b| b.u32(0x0002, 99)); // nested QP info
                    b.u32(REGION_ID, r.id);
                    b.u64(REGION_ADDR, r.addr);
                    b.field(0x8003, &[]);
                    b.u64(REGION_LEN, r.len);
                    b.u64(REGION_KEY, r.key);
                    b.field(0x8003, &[1, 2, 3]); // unknown tags may repeat
                });
            }
            for &t in &expected.transports {
                b.u8(DESC_TRANSPORT, t);
            }
            for rail in &expected.rails {
                b.record(DESC_RAIL, |b| {
                    b.str(RAIL_NAME, &rail.name);
                    b.field(0x8004, &0x1234u32.to_le_bytes()); // QPN
                    b.str(RAIL_ADDR, &rail.addr);
                });
            }
            b.field(0xffff, &[0; 100]);
        });
        let (msg, used) = decode(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(msg, Message::Descriptor(expected.clone()));
        assert_eq!(
            read_message(&mut bytes.as_slice()).unwrap(),
            Message::Descriptor(expected)
        );

        // Every message type tolerates extra fields, GetDescriptor included.
        let get = frame(TYPE_GET_DESCRIPTOR, |b| b.u64(0x8000, 1));
        assert_eq!(decode(&get).unwrap().0, Message::GetDescriptor);
        let hello = frame(TYPE_HELLO, |b| {
            b.field(0x9000, b"x");
            b.field(HELLO_NONCE, &[6; NONCE_LEN]);
        });
        assert_eq!(
            decode(&hello).unwrap().0,
            Message::Hello {
                nonce: [6; NONCE_LEN]
            }
        );
    }

    fn descriptor_frame(skip_tag: Option<u16>, extra: impl FnOnce(&mut Body)) -> Vec<u8> {
        frame(TYPE_DESCRIPTOR, |b| {
            if skip_tag != Some(DESC_NAME) {
                b.str(DESC_NAME, "seg");
            }
            if skip_tag != Some(DESC_HOST_ID) {
                b.str(DESC_HOST_ID, "host");
            }
            if skip_tag != Some(DESC_PID) {
                b.u32(DESC_PID, 1);
            }
            extra(b);
        })
    }

    #[test]
    fn missing_required_fields() {
        assert!(decode(&descriptor_frame(None, |_| {})).is_ok());
        for tag in [DESC_NAME, DESC_HOST_ID, DESC_PID] {
            let e = decode_err(&descriptor_frame(Some(tag), |_| {}));
            assert!(
                matches!(e, WireError::MissingField { msg: "Descriptor", tag: t } if t == tag),
                "{e:?}"
            );
        }
        let e = decode_err(&frame(TYPE_CHALLENGE, |b| {
            b.field(CHALLENGE_NONCE, &[0; NONCE_LEN])
        }));
        assert!(matches!(
            e,
            WireError::MissingField {
                msg: "Challenge",
                tag: CHALLENGE_AUTH_REQUIRED
            }
        ));
        let e = decode_err(&frame(TYPE_AUTH, |_| {}));
        assert!(matches!(
            e,
            WireError::MissingField {
                msg: "Auth",
                tag: AUTH_MAC
            }
        ));
        let e = decode_err(&frame(TYPE_ERROR, |b| b.u16(ERROR_CODE, 1)));
        assert!(matches!(
            e,
            WireError::MissingField {
                msg: "Error",
                tag: ERROR_TEXT
            }
        ));
        let e = decode_err(&descriptor_frame(None, |b| {
            b.record(DESC_REGION, |b| {
                b.u32(REGION_ID, 1);
                b.u64(REGION_ADDR, 2);
                b.u64(REGION_LEN, 3);
            })
        }));
        assert!(
            matches!(
                e,
                WireError::MissingField {
                    msg: "RegionEntry",
                    tag: REGION_KEY
                }
            ),
            "{e:?}"
        );
        let e = decode_err(&descriptor_frame(None, |b| {
            b.record(DESC_RAIL, |b| b.str(RAIL_NAME, "mlx5_0"))
        }));
        assert!(
            matches!(
                e,
                WireError::MissingField {
                    msg: "RailEntry",
                    tag: RAIL_ADDR
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn duplicate_fields() {
        let e = decode_err(&descriptor_frame(None, |b| b.str(DESC_NAME, "again")));
        assert!(
            matches!(e, WireError::DuplicateField { tag: DESC_NAME }),
            "{e:?}"
        );
        let e = decode_err(&descriptor_frame(None, |b| {
            b.str(DESC_SHM_NAME, "/a");
            b.str(DESC_SHM_NAME, "/b");
        }));
        assert!(
            matches!(e, WireError::DuplicateField { tag: DESC_SHM_NAME }),
            "{e:?}"
        );
        let e = decode_err(&frame(TYPE_HELLO, |b| {
            b.field(HELLO_NONCE, &[0; NONCE_LEN]);
            b.field(HELLO_NONCE, &[0; NONCE_LEN]);
        }));
        assert!(matches!(e, WireError::DuplicateField { tag: HELLO_NONCE }));
        let e = decode_err(&descriptor_frame(None, |b| {
            b.record(DESC_REGION, |b| {
                b.u32(REGION_ID, 1);
                b.u32(REGION_ID, 1);
            })
        }));
        assert!(
            matches!(e, WireError::DuplicateField { tag: REGION_ID }),
            "{e:?}"
        );
        // List fields repeat by design.
        let (msg, _) = decode(&descriptor_frame(None, |b| {
            b.u8(DESC_TRANSPORT, 1);
            b.u8(DESC_TRANSPORT, 1);
        }))
        .unwrap();
        assert!(matches!(msg, Message::Descriptor(d) if d.transports == [1, 1]));
    }

    #[test]
    fn malformed_values() {
        let bool2 = frame(TYPE_CHALLENGE, |b| {
            b.field(CHALLENGE_NONCE, &[0; NONCE_LEN]);
            b.field(CHALLENGE_AUTH_REQUIRED, &[2]);
        });
        assert!(matches!(
            decode_err(&bool2),
            WireError::BadField {
                tag: CHALLENGE_AUTH_REQUIRED,
                ..
            }
        ));

        let bad_utf8 =
            descriptor_frame(Some(DESC_NAME), |b| b.field(DESC_NAME, &[b'a', 0xff, 0xfe]));
        assert!(matches!(
            decode_err(&bad_utf8),
            WireError::BadField { tag: DESC_NAME, .. }
        ));
        let bad_utf8 = frame(TYPE_ERROR, |b| {
            b.u16(ERROR_CODE, 1);
            b.field(ERROR_TEXT, &[0xc3]);
        });
        assert!(matches!(
            decode_err(&bad_utf8),
            WireError::BadField {
                tag: ERROR_TEXT,
                ..
            }
        ));

        let short_nonce = frame(TYPE_HELLO, |b| b.field(HELLO_NONCE, &[0; NONCE_LEN - 1]));
        assert!(matches!(
            decode_err(&short_nonce),
            WireError::BadField {
                tag: HELLO_NONCE,
                ..
            }
        ));
        let long_mac = frame(TYPE_AUTH_OK, |b| b.field(AUTH_OK_MAC, &[0; MAC_LEN + 1]));
        assert!(matches!(
            decode_err(&long_mac),
            WireError::BadField {
                tag: AUTH_OK_MAC,
                ..
            }
        ));
        let wide_pid = descriptor_frame(Some(DESC_PID), |b| b.u64(DESC_PID, 1));
        assert!(matches!(
            decode_err(&wide_pid),
            WireError::BadField { tag: DESC_PID, .. }
        ));

        let empty_name = descriptor_frame(Some(DESC_NAME), |b| b.str(DESC_NAME, ""));
        assert!(matches!(
            decode_err(&empty_name),
            WireError::BadField { tag: DESC_NAME, .. }
        ));
    }

    #[test]
    fn field_framing_errors() {
        // A field header cut short by the end of the body.
        let cut = frame(TYPE_GET_DESCRIPTOR, |b| {
            b.0.extend_from_slice(&[0x01, 0x80, 0x00])
        });
        assert!(matches!(
            decode_err(&cut),
            WireError::BadField { tag: 0x8001, .. }
        ));
        let cut = frame(TYPE_GET_DESCRIPTOR, |b| b.0.push(7));
        assert!(matches!(
            decode_err(&cut),
            WireError::BadField { tag: 0, .. }
        ));
        // A value claiming more than its record holds, at the top level...
        let over = frame(TYPE_GET_DESCRIPTOR, |b| {
            b.0.extend_from_slice(&0x8000u16.to_le_bytes());
            b.0.extend_from_slice(&u32::MAX.to_le_bytes());
        });
        assert!(matches!(
            decode_err(&over),
            WireError::BadField { tag: 0x8000, .. }
        ));
        // ...and inside a record, even though the frame holds more bytes.
        let over = descriptor_frame(None, |b| {
            b.record(DESC_REGION, |b| {
                b.0.extend_from_slice(&REGION_ID.to_le_bytes());
                b.0.extend_from_slice(&4u32.to_le_bytes());
                b.0.extend_from_slice(&[1, 2]);
            });
            b.field(0x8000, &[0; 64]);
        });
        assert!(matches!(
            decode_err(&over),
            WireError::BadField { tag: REGION_ID, .. }
        ));
    }

    #[test]
    fn limits() {
        let many = descriptor_frame(None, |b| {
            for i in 0..=MAX_REGIONS as u32 {
                b.record(DESC_REGION, |b| {
                    let r = region(i);
                    b.u32(REGION_ID, r.id);
                    b.u64(REGION_ADDR, r.addr);
                    b.u64(REGION_LEN, r.len);
                    b.u64(REGION_KEY, r.key);
                });
            }
        });
        assert!(many.len() - HEADER_LEN <= MAX_BODY as usize);
        let e = decode_err(&many);
        assert!(
            matches!(e, WireError::TooLarge { what: "region list", len, max: MAX_REGIONS } if len == MAX_REGIONS + 1)
        );

        let e = decode_err(&descriptor_frame(None, |b| {
            for t in 0..=MAX_TRANSPORTS as u8 {
                b.u8(DESC_TRANSPORT, t);
            }
        }));
        assert!(
            matches!(
                e,
                WireError::TooLarge {
                    what: "transport list",
                    ..
                }
            ),
            "{e:?}"
        );

        let mut d = small_descriptor();
        d.rails = vec![d.rails[0].clone(); MAX_RAILS + 1];
        let e = decode_err(&encode(&Message::Descriptor(d)));
        assert!(
            matches!(
                e,
                WireError::TooLarge {
                    what: "rail list",
                    ..
                }
            ),
            "{e:?}"
        );

        let cases: Vec<(SegmentDescriptor, &str)> = vec![
            (
                SegmentDescriptor {
                    name: "n".repeat(MAX_NAME + 1),
                    ..small_descriptor()
                },
                "segment name",
            ),
            (
                SegmentDescriptor {
                    host_id: "h".repeat(MAX_NAME + 1),
                    ..small_descriptor()
                },
                "host id",
            ),
            (
                SegmentDescriptor {
                    shm_name: Some("s".repeat(MAX_SHM_NAME + 1)),
                    ..small_descriptor()
                },
                "shm name",
            ),
            (
                SegmentDescriptor {
                    rails: vec![RailEntry {
                        name: "r".repeat(MAX_RAIL_FIELD + 1),
                        addr: String::new(),
                    }],
                    ..small_descriptor()
                },
                "rail name",
            ),
            (
                SegmentDescriptor {
                    rails: vec![RailEntry {
                        name: String::new(),
                        addr: "a".repeat(MAX_RAIL_FIELD + 1),
                    }],
                    ..small_descriptor()
                },
                "rail address",
            ),
        ];
        for (d, expect) in cases {
            let e = decode_err(&encode(&Message::Descriptor(d)));
            assert!(
                matches!(e, WireError::TooLarge { what, .. } if what == expect),
                "{expect}: {e:?}"
            );
        }
        let e = decode_err(&encode(&Message::Error {
            code: 1,
            text: "e".repeat(MAX_MESSAGE_TEXT + 1),
        }));
        assert!(
            matches!(e, WireError::TooLarge { what: "error text", len, .. } if len == MAX_MESSAGE_TEXT + 1)
        );
    }

    #[test]
    fn errors_display() {
        let e = WireError::MissingField {
            msg: "Descriptor",
            tag: 3,
        };
        assert_eq!(e.to_string(), "Descriptor: missing required field 0x0003");
        let e = WireError::BadMagic(*b"HTTP");
        assert!(e.to_string().contains("48"), "{e}");
    }

    fn arb_rail() -> impl Strategy<Value = RailEntry> {
        // \PC is any non-control char, up to 4 bytes: 16 chars stay within 64 bytes.
        ("\\PC{0,16}", "\\PC{0,16}").prop_map(|(name, addr)| RailEntry { name, addr })
    }

    #[test]
    fn rkey_lists_and_qp_bootstrap_are_checked() {
        let region = |rkeys: &[u8]| {
            frame(TYPE_DESCRIPTOR, |b| {
                b.str(DESC_NAME, "n");
                b.str(DESC_HOST_ID, "h");
                b.u32(DESC_PID, 1);
                b.record(DESC_REGION, |b| {
                    b.u32(REGION_ID, 1);
                    b.u64(REGION_ADDR, 4096);
                    b.u64(REGION_LEN, 4096);
                    b.u64(REGION_KEY, 7);
                    b.field(REGION_RKEYS, rkeys);
                });
            })
        };
        assert!(matches!(
            decode_err(&region(&[1, 2, 3])),
            WireError::BadField {
                tag: REGION_RKEYS,
                ..
            }
        ));
        assert!(matches!(
            decode_err(&region(&[0; (MAX_NICS + 1) * 4])),
            WireError::BadField {
                tag: REGION_RKEYS,
                ..
            }
        ));
        let Message::Descriptor(d) = decode(&region(&[1, 0, 0, 0, 2, 0, 0, 0])).unwrap().0 else {
            panic!("not a descriptor");
        };
        assert_eq!(d.regions[0].rkeys, vec![1, 2]);
        // A QP bootstrap without its QPN is refused, naming the field.
        let qp = frame(TYPE_QP_ACCEPT, |b| {
            b.field(QP_GID, &[1; 16]);
            b.u16(QP_LID, 0);
            b.u32(QP_PSN, 5);
            b.u32(QP_MTU, 3);
        });
        let e = decode_err(&qp);
        assert!(e.to_string().contains("QpAccept"), "{e}");
    }

    fn qp_request() -> QpRequest {
        QpRequest {
            initiator: QpInitiator::new(0x1234_5678_9abc_def0, 3, 1).unwrap(),
            initiator_nic: "rxe0".into(),
            target_nic: "rxe1".into(),
            qp: QpBootstrap {
                gid: [3; 16],
                lid: 0,
                qpn: 0x11,
                psn: 0xabcdef,
                mtu: 3,
            },
        }
    }

    /// A hand-built `QpConnect`: NICs and bootstrap, then `extra`.
    fn qp_connect_frame(extra: impl FnOnce(&mut Body)) -> Vec<u8> {
        frame(TYPE_QP_CONNECT, |b| {
            b.str(QP_INITIATOR_NIC, "rxe0");
            b.str(QP_TARGET_NIC, "rxe1");
            encode_qp(b, &qp_request().qp);
            extra(b);
        })
    }

    /// An initiator record of the given raw values (`None`: left out).
    fn initiator_record(
        engine: Option<&[u8]>,
        worker: Option<&[u8]>,
        rail: Option<&[u8]>,
    ) -> impl FnOnce(&mut Body) {
        move |b| {
            b.record(QP_INITIATOR, |b| {
                for (tag, v) in [(QPI_ENGINE, engine), (QPI_WORKER, worker), (QPI_RAIL, rail)] {
                    if let Some(v) = v {
                        b.field(tag, v);
                    }
                }
            })
        }
    }

    fn initiator_of(bytes: &[u8]) -> (u64, usize, usize) {
        match decode(bytes).unwrap().0 {
            Message::QpConnect(r) => (
                r.initiator.engine(),
                r.initiator.worker(),
                r.initiator.rail(),
            ),
            m => panic!("decoded {m:?}"),
        }
    }

    #[test]
    fn qp_initiator_round_trips_and_is_required() {
        for (e, w, r) in [(1, 0, 0), (u64::MAX, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1)] {
            roundtrip(&Message::QpConnect(QpRequest {
                initiator: QpInitiator::new(e, w, r).unwrap(),
                ..qp_request()
            }));
        }
        // As a peer writes it, with a newer peer's field inside the record.
        let bytes = qp_connect_frame(|b| {
            b.record(QP_INITIATOR, |b| {
                b.u64(QPI_ENGINE, 7);
                b.u16(QPI_WORKER, 2);
                b.field(0x8000, b"newer");
                b.u16(QPI_RAIL, 5);
            })
        });
        assert_eq!(initiator_of(&bytes), (7, 2, 5));
        // An older initiator's request, without the record, is refused
        // naming it (never filed under a made-up key).
        let e = decode_err(&qp_connect_frame(|_| {}));
        assert!(
            matches!(
                e,
                WireError::MissingField {
                    msg: "QpConnect",
                    tag: QP_INITIATOR
                }
            ),
            "{e:?}"
        );
        let (e8, w2, r2) = (7u64.to_le_bytes(), 2u16.to_le_bytes(), 5u16.to_le_bytes());
        for (rec, tag) in [
            (initiator_record(None, Some(&w2), Some(&r2)), QPI_ENGINE),
            (initiator_record(Some(&e8), None, Some(&r2)), QPI_WORKER),
            (initiator_record(Some(&e8), Some(&w2), None), QPI_RAIL),
        ] {
            let e = decode_err(&qp_connect_frame(rec));
            assert!(
                matches!(e, WireError::MissingField { msg: "QpInitiator", tag: t } if t == tag),
                "{e:?}"
            );
        }
    }

    #[test]
    fn qp_initiator_is_checked() {
        let (e8, w2, r2) = (7u64.to_le_bytes(), 2u16.to_le_bytes(), 5u16.to_le_bytes());
        let good = || initiator_record(Some(&e8), Some(&w2), Some(&r2));
        assert_eq!(initiator_of(&qp_connect_frame(good())), (7, 2, 5));
        // Twice: the record, and a field inside it.
        let e = decode_err(&qp_connect_frame(|b| {
            good()(b);
            good()(b);
        }));
        assert!(
            matches!(e, WireError::DuplicateField { tag: QP_INITIATOR }),
            "{e:?}"
        );
        let e = decode_err(&qp_connect_frame(|b| {
            b.record(QP_INITIATOR, |b| {
                b.u64(QPI_ENGINE, 7);
                b.u16(QPI_WORKER, 2);
                b.u16(QPI_RAIL, 5);
                b.u64(QPI_ENGINE, 8);
            })
        }));
        assert!(
            matches!(e, WireError::DuplicateField { tag: QPI_ENGINE }),
            "{e:?}"
        );
        // Wrong widths and out-of-bounds values, each naming its field.
        let (e0, e4) = (0u64.to_le_bytes(), 7u32.to_le_bytes());
        let (w_max, w_wide) = ((MAX_QP_WORKERS as u16).to_le_bytes(), 2u32.to_le_bytes());
        let (r_max, r_all, r_short) = (
            (MAX_QP_RAILS as u16).to_le_bytes(),
            u16::MAX.to_le_bytes(),
            [5u8],
        );
        let cases: [(_, u16); 7] = [
            (
                initiator_record(Some(&e4), Some(&w2), Some(&r2)),
                QPI_ENGINE,
            ),
            (
                initiator_record(Some(&e0), Some(&w2), Some(&r2)),
                QPI_ENGINE,
            ),
            (
                initiator_record(Some(&e8), Some(&w_wide), Some(&r2)),
                QPI_WORKER,
            ),
            (
                initiator_record(Some(&e8), Some(&w_max), Some(&r2)),
                QPI_WORKER,
            ),
            (
                initiator_record(Some(&e8), Some(&w2), Some(&r_short)),
                QPI_RAIL,
            ),
            (
                initiator_record(Some(&e8), Some(&w2), Some(&r_max)),
                QPI_RAIL,
            ),
            (
                initiator_record(Some(&e8), Some(&w2), Some(&r_all)),
                QPI_RAIL,
            ),
        ];
        for (rec, tag) in cases {
            let e = decode_err(&qp_connect_frame(rec));
            assert!(
                matches!(e, WireError::BadField { tag: t, .. } if t == tag),
                "want BadField {tag:#x}: {e:?}"
            );
        }
        // A record whose field claims more bytes than the record holds.
        let e = decode_err(&qp_connect_frame(|b| {
            b.record(QP_INITIATOR, |b| {
                b.0.extend_from_slice(&QPI_ENGINE.to_le_bytes());
                b.0.extend_from_slice(&64u32.to_le_bytes());
                b.0.extend_from_slice(&[1; 8]);
            });
            b.field(0x8000, &[0; 64]);
        }));
        assert!(
            matches!(
                e,
                WireError::BadField {
                    tag: QPI_ENGINE,
                    ..
                }
            ),
            "{e:?}"
        );
        // In-process keys obey the same bounds.
        assert!(QpInitiator::new(0, 0, 0).is_err());
        assert!(QpInitiator::new(1, MAX_QP_WORKERS, 0).is_err());
        assert!(QpInitiator::new(1, 0, MAX_QP_RAILS).is_err());
        assert!(QpInitiator::new(1, usize::MAX, 0).is_err());
        assert!(
            QpInitiator::new(1, 1 << 16, 0).is_err(),
            "no wrap to worker 0"
        );
        let k = QpInitiator::new(1, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1).unwrap();
        assert_eq!(
            (k.engine(), k.worker(), k.rail(), k.queue()),
            (1, MAX_QP_WORKERS - 1, MAX_QP_RAILS - 1, 0)
        );
        assert!(k.with_queue(MAX_QP_PER_TRANSFER).is_err());
        assert!(k.with_queue(usize::MAX).is_err());
    }

    #[test]
    fn qp_initiator_queue_round_trips_keys_apart_and_is_checked() {
        let base = QpInitiator::new(9, 3, 2).unwrap();
        let last = base.with_queue(MAX_QP_PER_TRANSFER - 1).unwrap();
        assert_ne!(base, last, "two QPs of one rail are two keys");
        for k in [base, base.with_queue(1).unwrap(), last] {
            roundtrip(&Message::QpConnect(QpRequest {
                initiator: k,
                ..qp_request()
            }));
        }
        // A forged queue index is a bad field, not a wrap to another key;
        // so is a wrong width.
        let (over, wide) = (
            (MAX_QP_PER_TRANSFER as u16).to_le_bytes(),
            1u32.to_le_bytes(),
        );
        for v in [&over[..], &wide[..]] {
            let e = decode_err(&qp_connect_frame(|b| {
                b.record(QP_INITIATOR, |b| {
                    b.u64(QPI_ENGINE, 9);
                    b.u16(QPI_WORKER, 3);
                    b.u16(QPI_RAIL, 2);
                    b.field(QPI_QUEUE, v);
                })
            }));
            assert!(
                matches!(e, WireError::BadField { tag: QPI_QUEUE, .. }),
                "{e:?}"
            );
        }
    }

    #[test]
    fn qp_worker_bound_is_the_configs() {
        let cfg = |n: usize| {
            crate::config::Config::from_json_str(
                &format!(r#"{{"workers": {{"count": {n}}}}}"#),
                "t.json",
            )
        };
        assert!(cfg(MAX_QP_WORKERS).is_ok());
        assert!(cfg(MAX_QP_WORKERS + 1).is_err());
    }

    #[test]
    fn qp_queue_bound_is_the_configs() {
        let cfg = |n: usize| {
            crate::config::Config::from_json_str(
                &format!(r#"{{"transports": {{"rdma": {{"qp_per_transfer": {n}}}}}}}"#),
                "t.json",
            )
        };
        assert!(cfg(MAX_QP_PER_TRANSFER).is_ok());
        assert!(cfg(MAX_QP_PER_TRANSFER + 1).is_err());
        assert!(cfg(0).is_err());
    }

    fn arb_nic() -> impl Strategy<Value = NicEntry> {
        ("\\PC{0,16}", any::<[u8; 16]>(), any::<u16>(), any::<u32>()).prop_map(
            |(name, gid, lid, mtu)| NicEntry {
                name,
                gid,
                lid,
                mtu,
            },
        )
    }

    fn arb_descriptor() -> impl Strategy<Value = SegmentDescriptor> {
        (
            "\\PC{1,64}",
            "\\PC{0,64}",
            any::<u32>(),
            proptest::option::of("\\PC{0,50}"),
            proptest::collection::vec(
                (
                    any::<u32>(),
                    any::<u64>(),
                    any::<u64>(),
                    any::<u64>(),
                    proptest::collection::vec(any::<u32>(), 0..=4),
                )
                    .prop_map(|(id, addr, len, key, rkeys)| RegionEntry {
                        id,
                        addr,
                        len,
                        key,
                        rkeys,
                    }),
                0..40,
            ),
            proptest::collection::vec(any::<u8>(), 0..=MAX_TRANSPORTS),
            proptest::collection::vec(arb_rail(), 0..=8),
            proptest::collection::vec(arb_nic(), 0..=4),
        )
            .prop_map(
                |(name, host_id, pid, shm_name, regions, transports, rails, nics)| {
                    SegmentDescriptor {
                        name,
                        host_id,
                        pid,
                        shm_name,
                        regions,
                        transports,
                        rails,
                        nics,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn descriptors_round_trip(d in arb_descriptor()) {
            let msg = Message::Descriptor(d);
            let bytes = encode(&msg);
            let (back, used) = decode(&bytes).unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&back, &msg);
            prop_assert_eq!(encode(&back), bytes);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes);
            let _ = read_message(&mut bytes.as_slice());
        }

        #[test]
        fn arbitrary_bodies_behind_valid_headers_never_panic(
            msg_type in 0u16..11,
            body in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let bytes = frame(msg_type, |b| b.0.extend_from_slice(&body));
            let _ = decode(&bytes);
            let _ = read_message(&mut bytes.as_slice());
        }

        #[test]
        fn mutated_frames_never_panic(
            d in arb_descriptor(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let mut bytes = encode(&Message::Descriptor(d));
            for (i, v) in flips {
                let at = i.index(bytes.len());
                bytes[at] = v;
            }
            let _ = decode(&bytes);
            let _ = read_message(&mut bytes.as_slice());
        }
    }
}
