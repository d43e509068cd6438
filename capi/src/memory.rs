//! Registered memory: allocate it, register the caller's, unregister.

use std::ffi::{c_int, c_void};

use tent::{Buffer, RegionId};

use crate::boundary::{out, put};
use crate::engine::{engine, tent_engine_t};
use crate::error::call;

/// Registered memory: where it is, and the region id that unregisters it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct tent_buffer_t {
    /// Its start in this process (what this process reads and writes,
    /// and names as a request's `source`).
    pub addr: *mut c_void,
    /// Its length in bytes.
    pub length: u64,
    /// Its region id (for `tent_unregister_memory`).
    pub region_id: u64,
    /// What a peer's `target_offset` names: `addr` for an engine in this
    /// process; for one attached to a daemon, where the daemon maps it.
    pub peer_addr: u64,
}

impl From<&Buffer> for tent_buffer_t {
    fn from(b: &Buffer) -> Self {
        tent_buffer_t {
            addr: b.as_ptr().cast(),
            length: b.len(),
            region_id: b.id().0,
            peer_addr: b.peer_addr(),
        }
    }
}

/// Allocate `length` bytes of registered memory, zeroed (exported to
/// peers on this host when shm is on). Freed by `tent_unregister_memory`
/// of its region, or with the engine.
///
/// # Safety
/// `engine` is a live engine; `out_buffer` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_allocate_memory(
    engine: *const tent_engine_t,
    length: u64,
    out_buffer: *mut tent_buffer_t,
) -> c_int {
    call("tent_allocate_memory", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_buffer, "out_buffer")?;
        let b = e.allocate_memory(length)?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_buffer, (&b).into()) };
        Ok(())
    })
}

/// Register memory the caller owns, `[addr, addr + length)`.
///
/// # Safety
/// `engine` is a live engine; `out_buffer` valid for one write; the
/// memory stays allocated until `tent_unregister_memory` of its region
/// returns `TENT_OK` or the engine is destroyed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_register_memory(
    engine: *const tent_engine_t,
    addr: *mut c_void,
    length: u64,
    out_buffer: *mut tent_buffer_t,
) -> c_int {
    call("tent_register_memory", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_buffer, "out_buffer")?;
        // SAFETY: the caller keeps the memory allocated while it is registered.
        let b = unsafe { e.register_memory(addr.cast(), length) }?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_buffer, (&b).into()) };
        Ok(())
    })
}

/// Withdraw a registration and return once the engine is done with it
/// (memory from `tent_allocate_memory` is then freed). On
/// `TENT_ERR_TIMEOUT` transfers on it have not drained: it stays
/// withdrawn but held; do not free it, call again.
///
/// # Safety
/// `engine` is a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_unregister_memory(
    engine: *const tent_engine_t,
    region_id: u64,
) -> c_int {
    call("tent_unregister_memory", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        e.unregister_memory(RegionId(region_id))
    })
}
