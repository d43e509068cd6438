//! The control-plane message codec: framing and field encoding, nothing else.
//!
//! Each message and record is declared once, in `message.rs`: its Rust type
//! and its layout, from which the tag constants, the encoder, the decoder
//! and the table below come. `field.rs` holds the checks every field gets.
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
//! The GID types (`QpConnect`'s `gid_type`, the NIC record's) came later
//! too: absent, the type is unknown and taken as compatible; present on
//! both ends and different, the responder refuses the QP. So did the NIC
//! record's subnet `prefix` (absent: unknown, the NIC pairs as on a routed
//! fabric) and the region's `mr_step` (absent: one rkey per NIC). A region
//! with a step is one longer than a NIC's `max_mr_size`, which an older
//! owner could not register at all; its per-NIC `rkeys` are zeros (an
//! older initiator is refused `AccessDenied` for it, as for a region on no
//! NIC) and its keys travel in `chunk_rkeys`, which an older decoder
//! skips.
//!
//! A known tag may appear once (twice is [`WireError::DuplicateField`]),
//! except the list fields marked "repeated", where each occurrence is one
//! element. Encoding is canonical: fields go out in tag order, list elements
//! in list order, an absent optional field is left out.
//!
//! # Tags
//!
//! Each field's tag and the constant the codec names it by. The table is
//! rendered from the declarations in `message.rs`, which the codec is
//! generated from, and a test fails when this copy differs.
//!
//! | Message (type)       | Tag      | Field             | Value                                                                     | Constant                  |
//! |----------------------|----------|-------------------|---------------------------------------------------------------------------|---------------------------|
//! | `Hello` (1)          | `0x0001` | `nonce`           | 32 bytes, required                                                        | `HELLO_NONCE`             |
//! | `Challenge` (2)      | `0x0001` | `nonce`           | 32 bytes, required                                                        | `CHALLENGE_NONCE`         |
//! |                      | `0x0002` | `auth_required`   | bool, required                                                            | `CHALLENGE_AUTH_REQUIRED` |
//! | `Auth` (3)           | `0x0001` | `mac`             | 32 bytes, required                                                        | `AUTH_MAC`                |
//! | `AuthOk` (4)         | `0x0001` | `mac`             | 32 bytes, required                                                        | `AUTH_OK_MAC`             |
//! | `GetDescriptor` (5)  |          | (none)            |                                                                           |                           |
//! | `Descriptor` (6)     | `0x0001` | `name`            | string ≤ [`MAX_NAME`], non-empty, required                                | `DESC_NAME`               |
//! |                      | `0x0002` | `host_id`         | string ≤ [`MAX_NAME`], required                                           | `DESC_HOST_ID`            |
//! |                      | `0x0003` | `pid`             | u32, required                                                             | `DESC_PID`                |
//! |                      | `0x0004` | `shm_name`        | string ≤ [`MAX_SHM_NAME`], optional                                       | `DESC_SHM_NAME`           |
//! |                      | `0x0005` | `regions`         | `RegionEntry` record, repeated ≤ [`MAX_REGIONS`]                          | `DESC_REGION`             |
//! |                      | `0x0006` | `transports`      | u8, repeated ≤ [`MAX_TRANSPORTS`]                                         | `DESC_TRANSPORT`          |
//! |                      | `0x0007` | `rails`           | `RailEntry` record, repeated ≤ [`MAX_RAILS`]                              | `DESC_RAIL`               |
//! |                      | `0x0008` | `nics`            | `NicEntry` record, repeated ≤ [`MAX_NICS`]                                | `DESC_NIC`                |
//! |                      | `0x0009` | `regions_version` | u64, absent = 0                                                           | `DESC_REGIONS_VERSION`    |
//! |                      | `0x000a` | `regions_from`    | u64, optional                                                             | `DESC_REGIONS_FROM`       |
//! |                      | `0x000b` | `metrics_url`     | string ≤ [`MAX_NAME`], optional                                           | `DESC_METRICS_URL`        |
//! |                      | `0x000c` | `incarnation`     | u64, absent = 0                                                           | `DESC_INCARNATION`        |
//! |                      | `0x000d` | `published_as`    | string ≤ [`MAX_NAME`], optional                                           | `DESC_PUBLISHED_AS`       |
//! | `Error` (7)          | `0x0001` | `code`            | u16, required                                                             | `ERROR_CODE`              |
//! |                      | `0x0002` | `text`            | string ≤ [`MAX_MESSAGE_TEXT`], required                                   | `ERROR_TEXT`              |
//! | `QpConnect` (8)      | `0x0001` | `initiator_nic`   | string ≤ [`MAX_RAIL_FIELD`], required                                     | `QP_INITIATOR_NIC`        |
//! |                      | `0x0002` | `target_nic`      | string ≤ [`MAX_RAIL_FIELD`], required                                     | `QP_TARGET_NIC`           |
//! |                      | `0x0003` | `gid`             | 16 bytes, required                                                        | `QP_GID`                  |
//! |                      | `0x0004` | `lid`             | u16, required                                                             | `QP_LID`                  |
//! |                      | `0x0005` | `qpn`             | u32, required                                                             | `QP_QPN`                  |
//! |                      | `0x0006` | `psn`             | u32, required                                                             | `QP_PSN`                  |
//! |                      | `0x0007` | `mtu`             | u32, an `ibv_mtu`, required                                               | `QP_MTU`                  |
//! |                      | `0x0008` | `initiator`       | `QpInitiator` record, required                                            | `QP_INITIATOR`            |
//! |                      | `0x0009` | `gid_type`        | u8, an `ibv_gid_type`, optional                                           | `QP_GID_TYPE`             |
//! | `QpAccept` (9)       | `0x0003` | `gid`             | 16 bytes, required                                                        | `QP_GID`                  |
//! |                      | `0x0004` | `lid`             | u16, required                                                             | `QP_LID`                  |
//! |                      | `0x0005` | `qpn`             | u32, required                                                             | `QP_QPN`                  |
//! |                      | `0x0006` | `psn`             | u32, required                                                             | `QP_PSN`                  |
//! |                      | `0x0007` | `mtu`             | u32, an `ibv_mtu`, required                                               | `QP_MTU`                  |
//! | `Notify` (10)        | `0x0001` | `sender`          | u64, non-zero, required                                                   | `NOTIFY_SENDER`           |
//! |                      | `0x0002` | `from`            | string ≤ [`MAX_NAME`], required                                           | `NOTIFY_FROM`             |
//! |                      | `0x0003` | `seq`             | u64, non-zero, required                                                   | `NOTIFY_SEQ`              |
//! |                      | `0x0004` | `name`            | string ≤ [`MAX_NOTIFY_NAME`], required                                    | `NOTIFY_NAME`             |
//! |                      | `0x0005` | `msg`             | bytes ≤ [`MAX_NOTIFY_MSG`], required                                      | `NOTIFY_MSG`              |
//! |                      | `0x0006` | `resend_ms`       | u64, absent = 0                                                           | `NOTIFY_RESEND_MS`        |
//! |                      | `0x0007` | `to`              | u64, absent = 0                                                           | `NOTIFY_TO`               |
//! | `NotifyAck` (11)     | `0x0001` | `seq`             | u64, required                                                             | `ACK_SEQ`                 |
//! | `GetRegions` (12)    | `0x0001` | `from`            | u64, required                                                             | `GET_REGIONS_FROM`        |
//! | `Regions` (13)       | `0x0001` | `version`         | u64, required                                                             | `PAGE_VERSION`            |
//! |                      | `0x0002` | `regions`         | `RegionEntry` record, repeated ≤ [`MAX_REGIONS`]                          | `PAGE_REGION`             |
//! |                      | `0x0003` | `from`            | u64, optional                                                             | `PAGE_FROM`               |
//! | `RegionEntry` record | `0x0001` | `id`              | u32, required                                                             | `REGION_ID`               |
//! |                      | `0x0002` | `addr`            | u64, required                                                             | `REGION_ADDR`             |
//! |                      | `0x0003` | `len`             | u64, required                                                             | `REGION_LEN`              |
//! |                      | `0x0004` | `key`             | u64, required                                                             | `REGION_KEY`              |
//! |                      | `0x0005` | `rkeys`           | u32 each, ≤ [`MAX_NICS`], one per NIC, absent = []                        | `REGION_RKEYS`            |
//! |                      | `0x0006` | `mr_step`         | u64, a chunk step (`transport::rdma::layout`), optional                   | `REGION_MR_STEP`          |
//! |                      | `0x0007` | `chunk_rkeys`     | u32 each, ≤ [`MAX_RKEYS`], per NIC and chunk, with `mr_step`, absent = [] | `REGION_CHUNK_RKEYS`      |
//! | `RailEntry` record   | `0x0001` | `name`            | string ≤ [`MAX_RAIL_FIELD`], required                                     | `RAIL_NAME`               |
//! |                      | `0x0002` | `addr`            | string ≤ [`MAX_RAIL_FIELD`], required                                     | `RAIL_ADDR`               |
//! | `NicEntry` record    | `0x0001` | `name`            | string ≤ [`MAX_RAIL_FIELD`], required                                     | `NIC_NAME`                |
//! |                      | `0x0002` | `gid`             | 16 bytes, required                                                        | `NIC_GID`                 |
//! |                      | `0x0003` | `lid`             | u16, required                                                             | `NIC_LID`                 |
//! |                      | `0x0004` | `mtu`             | u32, an `ibv_mtu`, required                                               | `NIC_MTU`                 |
//! |                      | `0x0005` | `gid_type`        | u8, an `ibv_gid_type`, optional                                           | `NIC_GID_TYPE`            |
//! |                      | `0x0006` | `prefix`          | u8, at most 128, optional                                                 | `NIC_PREFIX`              |
//! | `QpInitiator` record | `0x0001` | `engine`          | u64, non-zero, required                                                   | `QPI_ENGINE`              |
//! |                      | `0x0002` | `worker`          | u16, below [`MAX_QP_WORKERS`], required                                   | `QPI_WORKER`              |
//! |                      | `0x0003` | `rail`            | u16, below [`MAX_QP_RAILS`], required                                     | `QPI_RAIL`                |
//! |                      | `0x0004` | `queue`           | u16, below [`MAX_QP_PER_TRANSFER`], absent = 0                            | `QPI_QUEUE`               |
//!
//! # Hostile input
//!
//! Decoding never panics. Every length is checked against the bytes actually
//! present and against its limit before it is used, so a peer cannot make
//! this side allocate more than the limits above by claiming large sizes.

use std::io::{self, Read, Write};

#[macro_use]
mod macros;
mod field;
mod message;
#[cfg(test)]
mod table;
#[cfg(test)]
mod tests;

use field::Body;
use message::known_type;
// The tag and type constants, for the tests.
#[cfg(test)]
use message::*;
pub use message::{
    Message, NicEntry, NotifyFrame, QpBootstrap, QpInitiator, QpRequest, RailEntry, RegionEntry,
    RegionsPage, SegmentDescriptor,
};

/// The first four bytes of every frame.
pub(crate) const MAGIC: [u8; 4] = *b"TENT";
/// The frame format version this side speaks; a peer with another is refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Bytes in a frame header: magic, version, message type, body length.
pub(crate) const HEADER_LEN: usize = 12;
/// Largest body accepted (checked from the header, before reading or allocating the body).
pub(crate) const MAX_BODY: u32 = 1 << 20;
/// Longest segment name or host id, in bytes.
pub(crate) const MAX_NAME: usize = 256;
/// Longest shared-memory object name, in bytes.
pub(crate) const MAX_SHM_NAME: usize = 200;
/// Longest name of a notification, in bytes.
pub const MAX_NOTIFY_NAME: usize = 256;
/// Longest message of a notification, in bytes.
pub const MAX_NOTIFY_MSG: usize = 4096;
/// Longest text of an [`Message::Error`], in bytes.
pub(crate) const MAX_MESSAGE_TEXT: usize = 1024;
/// Most regions one descriptor may list.
pub(crate) const MAX_REGIONS: usize = 16384;
/// Most rails one descriptor may list.
pub(crate) const MAX_RAILS: usize = 64;
/// Most transports one descriptor may list.
pub(crate) const MAX_TRANSPORTS: usize = 8;
/// Bytes in a handshake nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Bytes in a handshake MAC.
pub(crate) const MAC_LEN: usize = 32;

/// Most RDMA NICs one descriptor may list.
pub(crate) const MAX_NICS: usize = 32;
/// Most rkeys per region: one per NIC and chunk
/// (`transport::rdma::layout::MAX_CHUNKS` chunks at most).
pub(crate) const MAX_RKEYS: usize = MAX_NICS * crate::transport::rdma::layout::MAX_CHUNKS;
/// Most workers a [`QpInitiator`] may name: `workers/count`'s upper bound.
pub(crate) const MAX_QP_WORKERS: usize = 256;
/// Most rails a [`QpInitiator`] may name. Rails to a peer are
/// `max(local, remote)` NICs, and an engine lists at most [`MAX_NICS`] in
/// its descriptor (one with more cannot be opened by any peer).
pub(crate) const MAX_QP_RAILS: usize = MAX_NICS;
/// Most QPs one worker keeps per rail to a peer (`qp_per_transfer`'s
/// upper bound; a [`QpInitiator`]'s `queue` is below it).
pub(crate) const MAX_QP_PER_TRANSFER: usize = 16;
/// Longest rail name, rail address or NIC name, in bytes.
pub(crate) const MAX_RAIL_FIELD: usize = 64;


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
    message::put_body(msg, &mut b);
    b.patch_len(HEADER_LEN - 4);
    b.0
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
    if !known_type(msg_type) {
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
    Ok((message::decode_body(msg_type, body)?, HEADER_LEN + body_len))
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
    message::decode_body(msg_type, &body)
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
