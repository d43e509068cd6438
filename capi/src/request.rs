//! `tent_request_t` (TENT's request, plus tent's optional fields) and its
//! conversion to an SQE. The source is a raw address: the engine says
//! which registered region holds it (`Engine::local_addr`).

use std::ffi::{c_int, c_void};

use tent::{
    Engine, Error, Opcode, Priority, RemoteAddr, Result, SegmentId, Sqe, TransportKind, op,
};

use crate::segment::tent_segment_id_t;

/// Copy remote memory into local memory (TENT's `OPCODE_READ`).
pub const TENT_OPCODE_READ: c_int = 0;
/// Copy local memory into remote memory (TENT's `OPCODE_WRITE`).
pub const TENT_OPCODE_WRITE: c_int = 1;

/// Latency-sensitive traffic (the default).
pub const TENT_PRIORITY_HIGH: c_int = 0;
/// Ordinary traffic.
pub const TENT_PRIORITY_MEDIUM: c_int = 1;
/// Bulk traffic.
pub const TENT_PRIORITY_LOW: c_int = 2;

/// No preference: the engine chooses (the default). tent's numbering,
/// not TENT's `TRANSPORT_*` (where 0 is RDMA): 0 must mean "any".
pub const TENT_TRANSPORT_ANY: c_int = 0;
/// Same-process memory copy.
pub const TENT_TRANSPORT_LOCAL: c_int = 1;
/// Shared memory between processes on one host.
pub const TENT_TRANSPORT_SHM: c_int = 2;
/// TCP.
pub const TENT_TRANSPORT_TCP: c_int = 3;
/// RDMA.
pub const TENT_TRANSPORT_RDMA: c_int = 4;

/// `tent_request_t::flags`: fail rather than retry on another transport.
pub const TENT_FLAG_NO_FAILOVER: u32 = 1;

/// One transfer. Zero-initialised fields take their defaults: a READ, at
/// HIGH priority, on any transport, with the engine's default deadline,
/// into the local segment (0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tent_request_t {
    /// `TENT_OPCODE_READ` or `TENT_OPCODE_WRITE`.
    pub opcode: c_int,
    /// The local end: an address inside registered memory.
    pub source: *mut c_void,
    /// The remote end's segment (`tent_open_segment`).
    pub target_id: tent_segment_id_t,
    /// The remote end: an address in the segment's owner (a region's
    /// `addr` from `tent_segment_info`, plus an offset).
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
    /// `TENT_PRIORITY_*` (0 = HIGH).
    pub priority: c_int,
    /// `TENT_TRANSPORT_*` (0 = any).
    pub transport_hint: c_int,
    /// Absolute `CLOCK_MONOTONIC` deadline in ns; 0 = the engine's
    /// `default_timeout_ms`.
    pub deadline_ns: u64,
    /// `TENT_FLAG_*` bits (0 = none).
    pub flags: u32,
    /// Echoed in the ring API's completion; the batch API ignores it.
    pub user_data: u64,
}

/// A C enum value that is not one of its constants.
fn unknown(field: &str, value: c_int) -> Error {
    Error::invalid(format!(
        "{field} {value} is not one of its TENT_* constants"
    ))
}

/// A `TENT_OPCODE_*` as tent's.
pub(crate) fn opcode(v: c_int) -> Result<Opcode> {
    u8::try_from(v)
        .ok()
        .and_then(Opcode::from_u8)
        .ok_or_else(|| unknown("opcode", v))
}

/// A `TENT_PRIORITY_*` as tent's.
pub(crate) fn priority(v: c_int) -> Result<Priority> {
    u8::try_from(v)
        .ok()
        .and_then(Priority::from_u8)
        .ok_or_else(|| unknown("priority", v))
}

/// `r` as an SQE, its source looked up in `engine`'s registered memory.
pub(crate) fn to_sqe(engine: &Engine, r: &tent_request_t) -> Result<Sqe> {
    let opcode = opcode(r.opcode)?;
    let priority = priority(r.priority)?;
    let transport = u8::try_from(r.transport_hint)
        .ok()
        .and_then(TransportKind::from_u8)
        .ok_or_else(|| unknown("transport_hint", r.transport_hint))?;
    if r.flags & !TENT_FLAG_NO_FAILOVER != 0 {
        return Err(Error::invalid(format!(
            "flags {:#x} has bits no TENT_FLAG_* names",
            r.flags
        )));
    }
    let local = engine.local_addr(r.source as u64, r.length)?;
    let remote = RemoteAddr::new(SegmentId(r.target_id), r.target_offset);
    Ok(op::Transfer::new(opcode, local, remote, r.length)
        .priority(priority)
        .transport_hint(transport)
        .deadline_ns(r.deadline_ns)
        .no_failover(r.flags & TENT_FLAG_NO_FAILOVER != 0)
        .user_data(r.user_data)
        .build())
}

/// Every request of `reqs` as an SQE; the first that cannot be one fails
/// the lot, its index in the message.
pub(crate) fn to_sqes(engine: &Engine, reqs: &[tent_request_t]) -> Result<Vec<Sqe>> {
    reqs.iter()
        .enumerate()
        .map(|(i, r)| to_sqe(engine, r).map_err(|e| in_request(i, e)))
        .collect()
}

/// `e`, saying which request it is about (its kind said once).
pub(crate) fn in_request(i: usize, e: Error) -> Error {
    let mut msg = format!("request {i}: {}", e.context());
    if let Some(cause) = std::error::Error::source(&e) {
        msg.push_str(&format!(": {cause}"));
    }
    Error::new(e.kind(), msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_tents_values() {
        assert_eq!(TENT_OPCODE_READ, Opcode::Read as c_int);
        assert_eq!(TENT_OPCODE_WRITE, Opcode::Write as c_int);
        for (c, p) in [
            (TENT_PRIORITY_HIGH, Priority::High),
            (TENT_PRIORITY_MEDIUM, Priority::Medium),
            (TENT_PRIORITY_LOW, Priority::Low),
        ] {
            assert_eq!(c, p as c_int);
        }
        for (c, t) in [
            (TENT_TRANSPORT_ANY, TransportKind::Any),
            (TENT_TRANSPORT_LOCAL, TransportKind::Local),
            (TENT_TRANSPORT_SHM, TransportKind::Shm),
            (TENT_TRANSPORT_TCP, TransportKind::Tcp),
            (TENT_TRANSPORT_RDMA, TransportKind::Rdma),
        ] {
            assert_eq!(c, t as c_int);
        }
        assert_eq!(
            u8::try_from(TENT_FLAG_NO_FAILOVER).unwrap(),
            tent::op::Read::new(
                tent::LocalAddr::new(tent::RegionId(0), 0),
                RemoteAddr::new(SegmentId(0), 0),
                1,
            )
            .no_failover(true)
            .build()
            .flags()
        );
    }
}
