//! Typed ring entries: the 64-byte submission ([`Sqe`]) and 32-byte
//! completion ([`Cqe`]) records.
//!
//! Entries may be read straight out of memory shared with another process, so
//! every field is a plain integer: any bit pattern is a valid `Sqe`/`Cqe`, and
//! the typed accessors validate (returning `None` or a fallback) instead of
//! trusting the bytes.

use std::fmt;

use crate::status::ErrorKind;

/// The operation a submission asks for.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Copy remote memory into local memory.
    Read = 0,
    /// Copy local memory into remote memory.
    Write = 1,
}

impl Opcode {
    /// The opcode with this raw value, if any.
    pub const fn from_u8(v: u8) -> Option<Opcode> {
        match v {
            0 => Some(Opcode::Read),
            1 => Some(Opcode::Write),
            _ => None,
        }
    }
}

/// Scheduling class of a submission; lower values are served first.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Priority {
    /// Latency-sensitive traffic.
    #[default]
    High = 0,
    /// Ordinary traffic.
    Medium = 1,
    /// Bulk traffic.
    Low = 2,
}

impl Priority {
    /// Every priority, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Medium, Priority::Low];

    /// The priority with this raw value, if any.
    pub const fn from_u8(v: u8) -> Option<Priority> {
        match v {
            0 => Some(Priority::High),
            1 => Some(Priority::Medium),
            2 => Some(Priority::Low),
            _ => None,
        }
    }

    /// Index into per-priority arrays (`0..3`).
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A transport that can carry a transfer.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum TransportKind {
    /// No preference; the engine chooses.
    #[default]
    Any = 0,
    /// Same-process memory copy.
    Local = 1,
    /// Shared memory between processes on one host.
    Shm = 2,
    /// TCP.
    Tcp = 3,
    /// RDMA.
    Rdma = 4,
}

impl TransportKind {
    /// The transport with this raw value, if any.
    pub const fn from_u8(v: u8) -> Option<TransportKind> {
        match v {
            0 => Some(TransportKind::Any),
            1 => Some(TransportKind::Local),
            2 => Some(TransportKind::Shm),
            3 => Some(TransportKind::Tcp),
            4 => Some(TransportKind::Rdma),
            _ => None,
        }
    }

    /// Lower-case name: `"any"`, `"local"`, `"shm"`, `"tcp"` or `"rdma"`.
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::Any => "any",
            TransportKind::Local => "local",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
            TransportKind::Rdma => "rdma",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An id an engine hands out: the engine's tag in the high 32 bits (drawn
/// from its incarnation at start) and the object's number there in the low
/// 32. An engine refuses an id whose tag is not its own, so an id never
/// names another engine's object.
macro_rules! tagged_id {
    ($(#[$meta:meta])* $name:ident, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(pub u64);

        impl $name {
            #[doc = concat!("The id of ", $what, " `index` of the engine tagged `tag`.")]
            pub const fn from_parts(tag: u32, index: u32) -> $name {
                $name(((tag as u64) << 32) | index as u64)
            }

            /// The issuing engine's tag.
            pub const fn tag(self) -> u32 {
                (self.0 >> 32) as u32
            }

            #[doc = concat!("The ", $what, "'s number in its engine.")]
            pub const fn index(self) -> u32 {
                self.0 as u32
            }
        }
    };
}

tagged_id!(
    /// Identifies a registered local memory region (see `tagged_id!`: the
    /// issuing engine's tag, then the region's number there).
    RegionId,
    "region"
);

tagged_id!(
    /// Identifies an open remote segment: the opening engine's tag, then the
    /// segment's number there. [`SegmentId::LOCAL`] (0) names the engine's
    /// own memory in every engine.
    SegmentId,
    "segment"
);

impl SegmentId {
    /// The segment that names this process's own memory.
    pub const LOCAL: SegmentId = SegmentId(0);
}

/// A position inside a registered local region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalAddr {
    /// The region.
    pub region: RegionId,
    /// Byte offset from the start of the region.
    pub offset: u64,
}

impl LocalAddr {
    /// An address `offset` bytes into `region`.
    pub const fn new(region: RegionId, offset: u64) -> Self {
        LocalAddr { region, offset }
    }
}

/// A position inside a remote segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// The segment.
    pub segment: SegmentId,
    /// Byte offset from the start of the segment.
    pub offset: u64,
}

impl RemoteAddr {
    /// An address `offset` bytes into `segment`.
    pub const fn new(segment: SegmentId, offset: u64) -> Self {
        RemoteAddr { segment, offset }
    }
}

/// [`Sqe`] flag: fail instead of retrying on another transport.
pub const SQE_NO_FAILOVER: u8 = 1;

/// Every [`Sqe`] flag this version knows; an entry with any other bit set
/// (or a non-zero reserved byte) was written by a newer client and is
/// refused rather than misread (see [`Sqe::has_unknown_fields`]).
pub const SQE_KNOWN_FLAGS: u8 = SQE_NO_FAILOVER;

/// Submission queue entry. 64 bytes, one cache line.
///
/// All fields are plain integers so that any bit pattern is a valid value (it
/// may come from shared memory); the typed accessors validate. Build one with
/// [`op::Read`](crate::op::Read) or [`op::Write`](crate::op::Write).
///
/// ```
/// use tent_rings::entry::{LocalAddr, Opcode, RegionId, RemoteAddr, SegmentId};
/// use tent_rings::op;
///
/// let sqe = op::Read::new(LocalAddr::new(RegionId(1), 64), RemoteAddr::new(SegmentId(3), 0), 4096)
///     .user_data(9)
///     .build();
/// assert_eq!(sqe.opcode(), Some(Opcode::Read));
/// assert_eq!(sqe.len(), 4096);
/// assert_eq!(sqe.user_data(), 9);
/// ```
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Sqe {
    pub(crate) user_data: u64,
    pub(crate) local_offset: u64,
    pub(crate) remote_offset: u64,
    pub(crate) len: u64,
    /// Absolute `CLOCK_MONOTONIC` nanoseconds; 0 selects the engine default.
    pub(crate) deadline_ns: u64,
    pub(crate) local_region: u64,
    pub(crate) remote_segment: u64,
    pub(crate) opcode: u8,
    pub(crate) priority: u8,
    pub(crate) flags: u8,
    pub(crate) transport_hint: u8,
    pub(crate) _reserved: [u8; 4],
}

const _: () = assert!(size_of::<Sqe>() == 64 && align_of::<Sqe>() == 64);

impl Sqe {
    /// An all-zero entry (a zero-length read with default settings).
    pub const fn zeroed() -> Sqe {
        Sqe {
            user_data: 0,
            local_offset: 0,
            remote_offset: 0,
            len: 0,
            deadline_ns: 0,
            local_region: 0,
            remote_segment: 0,
            opcode: 0,
            priority: 0,
            flags: 0,
            transport_hint: 0,
            _reserved: [0; 4],
        }
    }

    /// The caller's token, echoed in the matching [`Cqe`].
    pub fn user_data(&self) -> u64 {
        self.user_data
    }

    /// Replace the caller's token.
    pub fn set_user_data(&mut self, v: u64) {
        self.user_data = v;
    }

    /// This entry with a different caller token.
    pub fn with_user_data(mut self, v: u64) -> Sqe {
        self.user_data = v;
        self
    }

    /// The operation, or `None` if the raw byte is not a known opcode.
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }

    /// The raw opcode byte.
    pub fn raw_opcode(&self) -> u8 {
        self.opcode
    }

    /// The scheduling class, or `None` if the raw byte is invalid.
    pub fn priority(&self) -> Option<Priority> {
        Priority::from_u8(self.priority)
    }

    /// The preferred transport, or `None` if the raw byte is invalid.
    pub fn transport_hint(&self) -> Option<TransportKind> {
        TransportKind::from_u8(self.transport_hint)
    }

    /// Whether [`SQE_NO_FAILOVER`] is set.
    pub fn no_failover(&self) -> bool {
        self.flags & SQE_NO_FAILOVER != 0
    }

    /// The raw flag bits.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the entry uses anything this version does not know: a flag
    /// bit outside [`SQE_KNOWN_FLAGS`] or a non-zero reserved byte. The
    /// engine refuses such an entry (`InvalidArgument`) so that a newer
    /// client's request is never silently run with part of it ignored.
    #[inline]
    pub fn has_unknown_fields(&self) -> bool {
        let reserved = u32::from_ne_bytes(self._reserved);
        (self.flags & !SQE_KNOWN_FLAGS) | ((reserved != 0) as u8) != 0
    }

    /// The local end of the transfer.
    pub fn local(&self) -> LocalAddr {
        LocalAddr::new(RegionId(self.local_region), self.local_offset)
    }

    /// The remote end of the transfer.
    pub fn remote(&self) -> RemoteAddr {
        RemoteAddr::new(SegmentId(self.remote_segment), self.remote_offset)
    }

    /// Bytes to transfer.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the transfer moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Absolute `CLOCK_MONOTONIC` deadline in nanoseconds; 0 = engine default.
    pub fn deadline_ns(&self) -> u64 {
        self.deadline_ns
    }
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe::zeroed()
    }
}

impl fmt::Debug for Sqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Show raw bytes next to failed decodes so corrupt entries are diagnosable.
        let mut d = f.debug_struct("Sqe");
        d.field("user_data", &self.user_data);
        match self.opcode() {
            Some(op) => d.field("opcode", &op),
            None => d.field("opcode", &format_args!("invalid({})", self.opcode)),
        };
        d.field("local", &self.local())
            .field("remote", &self.remote())
            .field("len", &self.len);
        match self.priority() {
            Some(p) => d.field("priority", &p),
            None => d.field("priority", &format_args!("invalid({})", self.priority)),
        };
        match self.transport_hint() {
            Some(t) => d.field("transport_hint", &t),
            None => d.field(
                "transport_hint",
                &format_args!("invalid({})", self.transport_hint),
            ),
        };
        d.field("deadline_ns", &self.deadline_ns)
            .field("flags", &format_args!("{:#04x}", self.flags))
            .finish()
    }
}

/// [`Cqe`] flag: the request was served by a fallback transport (a
/// "performance error": it succeeded, but not on the preferred path).
pub const CQE_FALLBACK: u8 = 1;

/// [`Cqe`] flag: the request failed after its failover budget ran out
/// (every transport it was allowed to try failed); see
/// [`FAILOVER_EXHAUSTED`].
pub const CQE_FAILOVER_EXHAUSTED: u8 = 2;

/// What a request whose failover budget ran out reports (TENT's words).
pub const FAILOVER_EXHAUSTED: &str = "Failover limit exceeded, all transports exhausted";

/// Completion queue entry. 32 bytes, two to a cache line: the worker writes
/// one per op into lines the application last read, and every line it
/// takes back costs a cross-core ownership transfer (the store that stalled
/// the most in an 8 B WRITE's profile while CQEs were 64 bytes). io_uring's
/// CQE is 16 bytes; this one keeps a 64-bit result (byte counts past 2 GiB)
/// and the failover fields.
///
/// ```
/// use tent_rings::entry::{Cqe, TransportKind};
/// use tent_rings::status::ErrorKind;
///
/// let ok = Cqe::new(7, Ok(4096)).with_transport(TransportKind::Rdma);
/// assert_eq!(ok.result(), Ok(4096));
/// let err = Cqe::new(8, Err(ErrorKind::Timeout));
/// assert_eq!(err.raw_result(), -8);
/// assert_eq!(err.result(), Err(ErrorKind::Timeout));
/// ```
#[repr(C, align(32))]
#[derive(Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Cqe {
    user_data: u64,
    /// `>= 0`: bytes transferred; `< 0`: `-(ErrorKind::code)`.
    result: i64,
    /// Bytes 16..24 of the entry, in memory order: transport, flags,
    /// failover count, then five zero bytes. One word, so that a CQE is
    /// four word stores into the ring rather than a store per byte field
    /// (the worker's store queue fills while a CQ line it writes is still
    /// on its way back from the application).
    meta: u64,
    _reserved: u64,
}

const _: () = assert!(size_of::<Cqe>() == 32 && align_of::<Cqe>() == 32);

/// Byte `i` of [`Cqe::meta`] in memory order.
const fn meta_byte(meta: u64, i: usize) -> u8 {
    meta.to_ne_bytes()[i]
}

/// `meta` with its byte `i` (memory order) set to `v`.
const fn with_meta_byte(meta: u64, i: usize, v: u8) -> u64 {
    let mut b = meta.to_ne_bytes();
    b[i] = v;
    u64::from_ne_bytes(b)
}

const META_TRANSPORT: usize = 0;
const META_FLAGS: usize = 1;
const META_FAILOVER: usize = 2;

impl Cqe {
    /// An all-zero entry (a zero-byte success).
    pub const fn zeroed() -> Cqe {
        Cqe {
            user_data: 0,
            result: 0,
            meta: 0,
            _reserved: 0,
        }
    }

    /// A completion for `user_data`. Byte counts above `i64::MAX` (not
    /// representable in the wire format) saturate.
    #[inline]
    pub fn new(user_data: u64, result: Result<u64, ErrorKind>) -> Cqe {
        let result = match result {
            Ok(bytes) => i64::try_from(bytes).unwrap_or(i64::MAX),
            Err(kind) => -i64::from(kind.code()),
        };
        Cqe {
            user_data,
            result,
            ..Cqe::zeroed()
        }
    }

    /// The token of the submission this completes.
    pub fn user_data(&self) -> u64 {
        self.user_data
    }

    /// Bytes transferred, or why the request failed. An unknown negative code
    /// (a corrupt or newer peer) reads as [`ErrorKind::InvalidArgument`].
    pub fn result(&self) -> Result<u64, ErrorKind> {
        if self.result >= 0 {
            return Ok(self.result as u64);
        }
        let kind = u16::try_from(self.result.unsigned_abs())
            .ok()
            .and_then(ErrorKind::from_code);
        Err(kind.unwrap_or(ErrorKind::InvalidArgument))
    }

    /// The raw result word.
    pub fn raw_result(&self) -> i64 {
        self.result
    }

    /// The transport that served the request; an invalid byte reads as
    /// [`TransportKind::Any`].
    pub fn transport(&self) -> TransportKind {
        TransportKind::from_u8(meta_byte(self.meta, META_TRANSPORT)).unwrap_or(TransportKind::Any)
    }

    /// This entry with the serving transport recorded.
    #[inline]
    pub fn with_transport(mut self, t: TransportKind) -> Cqe {
        self.meta = with_meta_byte(self.meta, META_TRANSPORT, t as u8);
        self
    }

    fn flags(&self) -> u8 {
        meta_byte(self.meta, META_FLAGS)
    }

    #[inline]
    fn with_flag(mut self, flag: u8, yes: bool) -> Cqe {
        let f = if yes {
            self.flags() | flag
        } else {
            self.flags() & !flag
        };
        self.meta = with_meta_byte(self.meta, META_FLAGS, f);
        self
    }

    /// Whether [`CQE_FALLBACK`] is set.
    pub fn fallback(&self) -> bool {
        self.flags() & CQE_FALLBACK != 0
    }

    /// This entry with [`CQE_FALLBACK`] set or cleared.
    #[inline]
    pub fn with_fallback(self, yes: bool) -> Cqe {
        self.with_flag(CQE_FALLBACK, yes)
    }

    /// Whether [`CQE_FAILOVER_EXHAUSTED`] is set: the error is the last
    /// transport's, after every transport allowed was tried.
    pub fn failover_exhausted(&self) -> bool {
        self.flags() & CQE_FAILOVER_EXHAUSTED != 0
    }

    /// This entry with [`CQE_FAILOVER_EXHAUSTED`] set or cleared.
    #[inline]
    pub fn with_failover_exhausted(self, yes: bool) -> Cqe {
        self.with_flag(CQE_FAILOVER_EXHAUSTED, yes)
    }

    /// How many times the request moved to another transport.
    pub fn failover_count(&self) -> u8 {
        meta_byte(self.meta, META_FAILOVER)
    }

    /// This entry with a failover count.
    #[inline]
    pub fn with_failover_count(mut self, n: u8) -> Cqe {
        self.meta = with_meta_byte(self.meta, META_FAILOVER, n);
        self
    }
}

impl Default for Cqe {
    fn default() -> Self {
        Cqe::zeroed()
    }
}

impl fmt::Debug for Cqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cqe")
            .field("user_data", &self.user_data)
            .field("result", &self.result())
            .field("raw_result", &self.result)
            .field("transport", &self.transport())
            .field("fallback", &self.fallback())
            .field("failover_exhausted", &self.failover_exhausted())
            .field("failover_count", &self.failover_count())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn sizes_and_alignment() {
        assert_eq!(size_of::<Sqe>(), 64);
        assert_eq!(align_of::<Sqe>(), 64);
        assert_eq!(size_of::<Cqe>(), 32);
        assert_eq!(align_of::<Cqe>(), 32);
        // The wire layout other processes rely on.
        assert_eq!(offset_of!(Sqe, deadline_ns), 32);
        assert_eq!(offset_of!(Sqe, local_region), 40);
        assert_eq!(offset_of!(Sqe, remote_segment), 48);
        assert_eq!(offset_of!(Sqe, opcode), 56);
        assert_eq!(offset_of!(Sqe, _reserved), 60);
        assert_eq!(offset_of!(Cqe, result), 8);
        // Transport, flags and failover count are bytes 16, 17 and 18,
        // the rest zero.
        let c = Cqe::new(0x0102, Ok(3))
            .with_transport(TransportKind::Tcp)
            .with_fallback(true)
            .with_failover_exhausted(true)
            .with_failover_count(7);
        // SAFETY: Cqe is 32 bytes of plain integers, no padding.
        let bytes: [u8; 32] = unsafe { std::mem::transmute(c) };
        assert_eq!(bytes[..8], 0x0102u64.to_ne_bytes());
        assert_eq!(bytes[8..16], 3i64.to_ne_bytes());
        assert_eq!(
            bytes[16..19],
            [
                TransportKind::Tcp as u8,
                CQE_FALLBACK | CQE_FAILOVER_EXHAUSTED,
                7
            ]
        );
        assert!(bytes[19..].iter().all(|&b| b == 0));
    }

    #[test]
    fn cqe_round_trips_every_error_kind() {
        for k in ErrorKind::ALL {
            let c = Cqe::new(1, Err(k));
            assert_eq!(c.raw_result(), -i64::from(k.code()));
            assert_eq!(c.result(), Err(k));
        }
    }

    #[test]
    fn cqe_round_trips_byte_counts() {
        for n in [0u64, 1, 4096, u32::MAX as u64, i64::MAX as u64] {
            assert_eq!(Cqe::new(2, Ok(n)).result(), Ok(n));
        }
        assert_eq!(Cqe::new(2, Ok(u64::MAX)).result(), Ok(i64::MAX as u64));
    }

    #[test]
    fn cqe_unknown_codes_decode_as_invalid_argument() {
        for raw in [-1000i64, -10, i64::MIN, -(u16::MAX as i64) - 1] {
            let mut c = Cqe::zeroed();
            c.result = raw;
            assert_eq!(c.result(), Err(ErrorKind::InvalidArgument), "{raw}");
        }
    }

    #[test]
    fn cqe_builders() {
        let c = Cqe::new(5, Ok(8))
            .with_transport(TransportKind::Tcp)
            .with_fallback(true)
            .with_failover_count(3);
        assert_eq!(c.user_data(), 5);
        assert_eq!(c.transport(), TransportKind::Tcp);
        assert!(c.fallback());
        assert_eq!(c.failover_count(), 3);
        assert!(!c.with_fallback(false).fallback());
        let x = Cqe::new(2, Err(ErrorKind::Unreachable)).with_failover_exhausted(true);
        assert!(x.failover_exhausted() && !x.fallback());
        assert!(!x.with_failover_exhausted(false).failover_exhausted());
        let mut bad = c;
        bad.meta = with_meta_byte(bad.meta, META_TRANSPORT, 200);
        assert_eq!(bad.transport(), TransportKind::Any);
        assert!(format!("{c:?}").contains("Tcp"));
    }

    #[test]
    fn sqe_invalid_bytes_decode_as_none() {
        let mut s = Sqe::zeroed();
        s.opcode = 9;
        s.priority = 3;
        s.transport_hint = 5;
        assert_eq!(s.opcode(), None);
        assert_eq!(s.raw_opcode(), 9);
        assert_eq!(s.priority(), None);
        assert_eq!(s.transport_hint(), None);
        assert!(format!("{s:?}").contains("invalid(9)"));
    }

    #[test]
    fn enum_raw_values_round_trip() {
        for p in Priority::ALL {
            assert_eq!(Priority::from_u8(p as u8), Some(p));
            assert_eq!(Priority::ALL[p.index()], p);
        }
        for t in 0..=4 {
            let k = TransportKind::from_u8(t).unwrap();
            assert_eq!(k as u8, t);
            assert_eq!(k.to_string(), k.name());
        }
        assert_eq!(TransportKind::from_u8(5), None);
        assert_eq!(Opcode::from_u8(1), Some(Opcode::Write));
        assert_eq!(Opcode::from_u8(2), None);
    }

    #[test]
    fn unknown_flags_and_reserved_bytes_are_flagged() {
        let good = Sqe::zeroed();
        assert!(!good.has_unknown_fields());
        let mut known = good;
        known.flags = SQE_KNOWN_FLAGS;
        assert!(!known.has_unknown_fields());
        for bit in 0..8u8 {
            let mut s = good;
            s.flags = 1 << bit;
            assert_eq!(
                s.has_unknown_fields(),
                SQE_KNOWN_FLAGS & (1 << bit) == 0,
                "bit {bit}"
            );
        }
        for i in 0..4 {
            let mut s = good;
            s._reserved[i] = 1;
            assert!(s.has_unknown_fields(), "reserved byte {i}");
        }
    }

    #[test]
    fn ids_carry_their_engine_s_tag_and_travel_whole_in_an_sqe() {
        let r = RegionId::from_parts(0xdead_beef, 7);
        assert_eq!((r.tag(), r.index()), (0xdead_beef, 7));
        let g = SegmentId::from_parts(0x1234_5678, u32::MAX);
        assert_eq!((g.tag(), g.index()), (0x1234_5678, u32::MAX));
        assert_eq!(SegmentId::LOCAL.tag(), 0);
        let sqe = crate::op::Read::new(LocalAddr::new(r, 1), RemoteAddr::new(g, 2), 3).build();
        assert_eq!(sqe.local().region, r);
        assert_eq!(sqe.remote().segment, g);
        assert!(!sqe.has_unknown_fields());
    }

    #[test]
    fn sqe_user_data_setters() {
        let mut s = Sqe::zeroed().with_user_data(3);
        assert_eq!(s.user_data(), 3);
        s.set_user_data(4);
        assert_eq!(s.user_data(), 4);
        assert!(s.is_empty());
    }
}
