//! Every control message and record, each declared once: its Rust type,
//! then its layout on the wire. From a layout (`messages!` for the message
//! types, `schema!` for a struct) come the tag constants, the encoder, the
//! decoder and the rows of the module docs' tag table; `macros.rs` says what
//! a line may hold, `field.rs` what each kind and presence checks.
//!
//! Adding a field is adding it to the struct (or variant) and one line, with
//! a new tag, to its layout. The compiler refuses a struct field without a
//! line and a line without a struct field; a test refuses lines out of tag
//! order and module docs whose table is not these layouts'.

use super::{
    MAC_LEN, MAX_MESSAGE_TEXT, MAX_NAME, MAX_NICS, MAX_NOTIFY_MSG, MAX_NOTIFY_NAME, MAX_RKEYS,
    MAX_QP_PER_TRANSFER, MAX_QP_RAILS, MAX_QP_WORKERS, MAX_RAIL_FIELD, MAX_RAILS, MAX_REGIONS,
    MAX_SHM_NAME, MAX_TRANSPORTS, NONCE_LEN, Result, WireError,
};

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
    /// Client → server: the next page of regions, those starting at or
    /// after `from` (a descriptor's or a page's `regions_from`).
    GetRegions {
        /// The first address of interest.
        from: u64,
    },
    /// Server → client: a page of regions (see [`RegionsPage`]).
    Regions(RegionsPage),
    /// Either way: a refusal, after which the sender closes.
    Error {
        /// A tent `ErrorKind` code.
        code: u16,
        /// Human-readable detail, at most [`MAX_MESSAGE_TEXT`] bytes.
        text: String,
    },
}

messages! {
    1 TYPE_HELLO Hello {
        0x0001 HELLO_NONCE nonce: array(NONCE_LEN), required;
    }
    2 TYPE_CHALLENGE Challenge {
        0x0001 CHALLENGE_NONCE         nonce:         array(NONCE_LEN), required;
        0x0002 CHALLENGE_AUTH_REQUIRED auth_required: bool,             required;
    }
    3 TYPE_AUTH Auth {
        0x0001 AUTH_MAC mac: array(MAC_LEN), required;
    }
    4 TYPE_AUTH_OK AuthOk {
        0x0001 AUTH_OK_MAC mac: array(MAC_LEN), required;
    }
    // No fields yet, but a newer peer may add some, and a malformed body is
    // still refused.
    5 TYPE_GET_DESCRIPTOR GetDescriptor {}
    6 TYPE_DESCRIPTOR Descriptor(SegmentDescriptor)
    7 TYPE_ERROR Error {
        0x0001 ERROR_CODE code: u16,                                 required;
        0x0002 ERROR_TEXT text: str(MAX_MESSAGE_TEXT, "error text"), required;
    }
    8 TYPE_QP_CONNECT QpConnect(QpRequest)
    9 TYPE_QP_ACCEPT QpAccept {
        qp: flatten(QpBootstrap);
    }
    10 TYPE_NOTIFY Notify(NotifyFrame)
    11 TYPE_NOTIFY_ACK NotifyAck {
        0x0001 ACK_SEQ seq: u64, required;
    }
    12 TYPE_GET_REGIONS GetRegions {
        0x0001 GET_REGIONS_FROM from: u64, required;
    }
    13 TYPE_REGIONS Regions(RegionsPage)
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
    /// Registered regions in address order, at most [`MAX_REGIONS`]: all
    /// of them, or the first page when `regions_from` is set.
    pub regions: Vec<RegionEntry>,
    /// Transports the owner serves (`TransportKind` codes), at most [`MAX_TRANSPORTS`].
    pub transports: Vec<u8>,
    /// Network rails, at most [`MAX_RAILS`].
    pub rails: Vec<RailEntry>,
    /// RDMA NICs, at most [`MAX_NICS`]; regions' `rkeys` follow this order.
    pub nics: Vec<NicEntry>,
    /// The owner's region table version: it changes with every region
    /// registered or unregistered (0 from an owner that does not say).
    pub regions_version: u64,
    /// Set when `regions` is cut: the rest start at or after this address
    /// ([`Message::GetRegions`]).
    pub regions_from: Option<u64>,
    /// The owner's HTTP endpoint (`http://ip:port`, serving `/metrics`,
    /// `/health` and `/topology`), when it serves one; at most
    /// [`MAX_NAME`] bytes.
    pub metrics_url: Option<String>,
    /// The owner's incarnation: 64 random bits drawn when its engine
    /// started, so a peer that meets another under a known name knows the
    /// owner restarted (0 from an owner that does not say).
    pub incarnation: u64,
    /// The name the owner publishes its segment under in a metadata store
    /// (etcd), at most [`MAX_NAME`] bytes: an opener that found the owner
    /// under a name checks the owner says that name itself, so a record
    /// copied to another key does not redirect it.
    pub published_as: Option<String>,
}

/// A page of an owner's regions, in address order, the answer to
/// [`Message::GetRegions`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionsPage {
    /// The region table version the page was taken from.
    pub version: u64,
    /// Regions starting at or after the asked address, at most
    /// [`MAX_REGIONS`].
    pub regions: Vec<RegionEntry>,
    /// Set when more follow: ask again from this address.
    pub from: Option<u64>,
}

schema! {
    RegionsPage {
        0x0001 PAGE_VERSION version: u64,                                     required;
        0x0002 PAGE_REGION  regions: record(RegionEntry), repeated(MAX_REGIONS, "region list");
        0x0003 PAGE_FROM    from:    u64,                                     optional;
    }
}

schema! {
    SegmentDescriptor {
        0x0001 DESC_NAME      name:       str(MAX_NAME, "segment name", non_empty), required;
        0x0002 DESC_HOST_ID   host_id:    str(MAX_NAME, "host id"),                 required;
        0x0003 DESC_PID       pid:        u32,                                      required;
        0x0004 DESC_SHM_NAME  shm_name:   str(MAX_SHM_NAME, "shm name"),            optional;
        0x0005 DESC_REGION    regions:    record(RegionEntry), repeated(MAX_REGIONS, "region list");
        0x0006 DESC_TRANSPORT transports: u8,                  repeated(MAX_TRANSPORTS, "transport list");
        0x0007 DESC_RAIL      rails:      record(RailEntry),   repeated(MAX_RAILS, "rail list");
        0x0008 DESC_NIC       nics:       record(NicEntry),    repeated(MAX_NICS, "NIC list");
        0x0009 DESC_REGIONS_VERSION regions_version: u64,      or_default;
        0x000a DESC_REGIONS_FROM    regions_from:    u64,      optional;
        0x000b DESC_METRICS_URL     metrics_url:     str(MAX_NAME, "metrics URL"), optional;
        0x000c DESC_INCARNATION     incarnation:     u64,      or_default;
        0x000d DESC_PUBLISHED_AS    published_as:    str(MAX_NAME, "published name"), optional;
    }
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
    /// same order; empty when the owner serves no RDMA. At most
    /// [`MAX_NICS`]. Zeros (no access) for a region with `mr_step`, whose
    /// keys are `chunk_rkeys`: a peer that knows no chunks gets refused
    /// cleanly.
    pub rkeys: Vec<u32>,
    /// Where the region is longer than a NIC's `max_mr_size`: it is
    /// registered as memory regions of twice this many bytes starting
    /// every this many bytes (`transport::rdma::layout`); `None`: one per
    /// NIC.
    pub mr_step: Option<u64>,
    /// With `mr_step`: the rkey of each chunk, NIC by NIC (chunks per NIC
    /// as the layout says), at most [`MAX_RKEYS`]; empty otherwise.
    pub chunk_rkeys: Vec<u32>,
}

impl RegionEntry {
    /// The most bytes this entry takes in a message, as a record: its
    /// header and each field's (tag and length, 6 bytes) with its value.
    pub(crate) fn wire_len_bound(&self) -> usize {
        const FIELD: usize = super::field::FIELD_HEADER_LEN;
        FIELD
            + (FIELD + 4)
            + 3 * (FIELD + 8)
            + (FIELD + 4 * self.rkeys.len())
            + (FIELD + 8)
            + (FIELD + 4 * self.chunk_rkeys.len())
    }

    /// The region of `sorted` (by `addr`) that holds `[addr, addr+len)`:
    /// how an initiator checks a remote range against a descriptor before
    /// sending anything (`AddressNotRegistered`, `OutOfBounds` otherwise).
    #[inline]
    pub(crate) fn find(
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

schema! {
    RegionEntry {
        0x0001 REGION_ID    id:    u32, required;
        0x0002 REGION_ADDR  addr:  u64, required;
        0x0003 REGION_LEN   len:   u64, required;
        0x0004 REGION_KEY   key:   u64, required;
        /// one per NIC
        0x0005 REGION_RKEYS rkeys: u32s(MAX_NICS, "rkey list"), or_default;
        /// a chunk step (`transport::rdma::layout`)
        0x0006 REGION_MR_STEP mr_step: u64, optional;
        /// per NIC and chunk, with `mr_step`
        0x0007 REGION_CHUNK_RKEYS chunk_rkeys: u32s(MAX_RKEYS, "chunk rkey list"), or_default;
    }
}

/// One network rail (NIC) of the owning engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailEntry {
    /// Device name, at most 64 bytes.
    pub name: String,
    /// Address on that rail, at most 64 bytes.
    pub addr: String,
}

schema! {
    RailEntry {
        0x0001 RAIL_NAME name: str(MAX_RAIL_FIELD, "rail name"),    required;
        0x0002 RAIL_ADDR addr: str(MAX_RAIL_FIELD, "rail address"), required;
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
    /// The GID's type (an `ibv_gid_type`: 0 IB, 1 RoCE v1, 2 RoCE v2);
    /// `None` from an owner that does not say.
    pub gid_type: Option<u8>,
    /// How many leading bits of `gid` name its subnet (at most 128; 64 on
    /// InfiniBand, 120 for an IPv4 /24 on RoCE); `None` when unknown.
    pub prefix: Option<u8>,
}

impl NicEntry {
    /// A decoded NIC record, its prefix checked.
    fn from_wire(
        name: String,
        gid: [u8; 16],
        lid: u16,
        mtu: u32,
        gid_type: Option<u8>,
        prefix: Option<u8>,
    ) -> Result<NicEntry> {
        if let Some(p) = prefix.filter(|&p| p > 128) {
            return Err(WireError::BadField {
                tag: NIC_PREFIX,
                reason: format!("subnet prefix {p} longer than a GID's 128 bits"),
            });
        }
        Ok(NicEntry {
            name,
            gid,
            lid,
            mtu,
            gid_type,
            prefix,
        })
    }
}

// The prefix is checked once the record is read (`NicEntry::from_wire`).
schema! {
    NicEntry => NicEntry::from_wire {
        0x0001 NIC_NAME     name:     str(MAX_RAIL_FIELD, "NIC name"), required;
        0x0002 NIC_GID      gid:      array(16),                       required;
        0x0003 NIC_LID      lid:      u16,                             required;
        /// an `ibv_mtu`
        0x0004 NIC_MTU      mtu:      u32,                             required;
        /// an `ibv_gid_type`
        0x0005 NIC_GID_TYPE gid_type: u8,                              optional;
        /// at most 128
        0x0006 NIC_PREFIX   prefix:   u8,                              optional;
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
    /// The type of the GID the initiator's QP is addressed by (an
    /// `ibv_gid_type`); `None` from an initiator that does not say.
    pub gid_type: Option<u8>,
}

// A request without its initiator record (an older initiator's) is refused
// for that before any other missing field.
schema! {
    QpRequest check_order(initiator, initiator_nic, target_nic, qp, gid_type) {
        0x0001 QP_INITIATOR_NIC initiator_nic: str(MAX_RAIL_FIELD, "NIC name"), required;
        0x0002 QP_TARGET_NIC    target_nic:    str(MAX_RAIL_FIELD, "NIC name"), required;
        qp: flatten(QpBootstrap);
        0x0008 QP_INITIATOR     initiator:     record(QpInitiator),             required;
        /// an `ibv_gid_type`
        0x0009 QP_GID_TYPE      gid_type:      u8,                              optional;
    }
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

// Inline in `QpConnect` and `QpAccept` (`flatten`), so its tags are theirs.
schema! {
    QpBootstrap {
        0x0003 QP_GID gid: array(16), required;
        0x0004 QP_LID lid: u16,       required;
        0x0005 QP_QPN qpn: u32,       required;
        0x0006 QP_PSN psn: u32,       required;
        /// an `ibv_mtu`
        0x0007 QP_MTU mtu: u32,       required;
    }
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
    pub(crate) fn with_queue(self, queue: usize) -> Result<QpInitiator> {
        let queue = u16::try_from(queue)
            .ok()
            .filter(|&q| usize::from(q) < MAX_QP_PER_TRANSFER)
            .ok_or_else(|| WireError::BadField {
                tag: QPI_QUEUE,
                reason: format!("queue {queue} out of range (below {MAX_QP_PER_TRANSFER})"),
            })?;
        Ok(QpInitiator { queue, ..self })
    }

    /// The key a decoded initiator record names, checked as [`Self::new`]
    /// and [`Self::with_queue`] check it.
    fn from_wire(engine: u64, worker: u16, rail: u16, queue: u16) -> Result<QpInitiator> {
        QpInitiator::new(engine, usize::from(worker), usize::from(rail))?
            .with_queue(usize::from(queue))
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
    pub(crate) fn queue(&self) -> usize {
        usize::from(self.queue)
    }
}

// Its bounds are `QpInitiator::new`'s, checked once all four fields are read.
schema! {
    QpInitiator => QpInitiator::from_wire {
        /// non-zero
        0x0001 QPI_ENGINE engine: u64, required;
        /// below [`MAX_QP_WORKERS`]
        0x0002 QPI_WORKER worker: u16, required;
        /// below [`MAX_QP_RAILS`]
        0x0003 QPI_RAIL   rail:   u16, required;
        /// below [`MAX_QP_PER_TRANSFER`]
        0x0004 QPI_QUEUE  queue:  u16, or_default;
    }
}

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
    /// For how many ms from now the sender may send this `(sender, seq)`
    /// again (its deadline for the message): the receiver remembers the
    /// stream at least that long. 0 (absent) is a sender that says
    /// nothing; the receiver's own slack still holds.
    pub resend_ms: u64,
    /// The receiver's mailbox: 0 (absent) is the engine itself; another
    /// value one of the clients of a daemon (`tentd`), as the segment name
    /// the sender opened said (`ip:port#mailbox`).
    pub to: u64,
}

schema! {
    NotifyFrame {
        0x0001 NOTIFY_SENDER sender: nonzero("sender"),                            required;
        0x0002 NOTIFY_FROM   from:   str(MAX_NAME, "sender name"),                 required;
        0x0003 NOTIFY_SEQ    seq:    nonzero("sequence number"),                   required;
        0x0004 NOTIFY_NAME   name:   str(MAX_NOTIFY_NAME, "notification name"),    required;
        0x0005 NOTIFY_MSG    msg:    bytes(MAX_NOTIFY_MSG, "notification message"), required;
        0x0006 NOTIFY_RESEND_MS resend_ms: u64,                                    or_default;
        0x0007 NOTIFY_TO     to:     u64,                                          or_default;
    }
}
