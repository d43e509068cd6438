//! Segments: open one by name, close it, list its regions, probe its peer.

use std::ffi::{c_char, c_int};
use std::time::Duration;

use tent::RemoteRegion;
use tent::SegmentId;

use crate::boundary::{c_str, copy_array, out, put};
use crate::engine::{engine, tent_engine_t};
use crate::error::call;

/// A segment handle (`tent_request_t::target_id`). 0 names this
/// engine's own memory.
pub type tent_segment_id_t = u64;

/// The segment that names this engine's own memory.
pub const TENT_LOCAL_SEGMENT_ID: tent_segment_id_t = 0;

/// One region a segment offers.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tent_region_info_t {
    /// Its start in the owner's address space: what `target_offset` names.
    pub addr: u64,
    /// Its length in bytes.
    pub length: u64,
    /// Its region id in the owner's engine.
    pub region_id: u64,
}

impl From<&RemoteRegion> for tent_region_info_t {
    fn from(r: &RemoteRegion) -> Self {
        tent_region_info_t {
            addr: r.addr,
            length: r.len,
            region_id: r.id.0,
        }
    }
}

/// Open a segment by name: a peer's `tent_segment_name` (`ip:port`), an
/// shm segment's name, or `"local"`. Opening the same name twice gives
/// the same id.
///
/// # Safety
/// `engine` is a live engine; `name` a NUL-terminated string;
/// `out_segment` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_open_segment(
    engine: *const tent_engine_t,
    name: *const c_char,
    out_segment: *mut tent_segment_id_t,
) -> c_int {
    call("tent_open_segment", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_segment, "out_segment")?;
        // SAFETY: NUL-terminated or NULL (caller).
        let name = unsafe { c_str(name, "name") }?;
        let id = e.open_segment(name)?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_segment, id.0) };
        Ok(())
    })
}

/// Close a segment and return once the engine is done with it (tasks on
/// it finish first); its requests then fail `TENT_ERR_SEGMENT_NOT_FOUND`.
///
/// # Safety
/// `engine` is a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_close_segment(
    engine: *const tent_engine_t,
    segment: tent_segment_id_t,
) -> c_int {
    call("tent_close_segment", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        e.close_segment(SegmentId(segment))
    })
}

/// The regions an open segment offers, into `regions` (room for
/// `capacity`); `*count` gets how many. Too small an array:
/// `TENT_ERR_INVALID_ARGUMENT`, nothing written, `*count` says how many
/// are needed.
///
/// # Safety
/// `engine` is a live engine; `regions` valid for `capacity` writes (or
/// NULL with capacity 0); `count` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_segment_info(
    engine: *const tent_engine_t,
    segment: tent_segment_id_t,
    regions: *mut tent_region_info_t,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    call("tent_segment_info", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(count, "count")?;
        let list = e.segment_regions(SegmentId(segment))?;
        // SAFETY: `capacity` writable elements at `regions`, one at `count` (caller).
        unsafe { copy_array(&list, regions, capacity, count, "regions") }
    })
}

/// Is the process behind an open segment still the one opened (TENT's
/// `probePeerAliveByID`)? `*alive` gets 1 or 0; the network exchange
/// takes at most `timeout_ms` in all.
///
/// # Safety
/// `engine` is a live engine; `alive` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_probe_peer_alive(
    engine: *const tent_engine_t,
    segment: tent_segment_id_t,
    timeout_ms: u64,
    alive: *mut c_int,
) -> c_int {
    call("tent_probe_peer_alive", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(alive, "alive")?;
        let yes = e.probe_peer_alive(SegmentId(segment), Duration::from_millis(timeout_ms))?;
        // SAFETY: checked non-NULL above.
        unsafe { put(alive, c_int::from(yes)) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_local_segment_id_is_tents() {
        assert_eq!(super::TENT_LOCAL_SEGMENT_ID, tent::SegmentId::LOCAL.0);
    }
}
