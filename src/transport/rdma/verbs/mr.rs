//! Memory regions.

use std::sync::Arc;

use super::{ProtectionDomain, verb_error};
use crate::error::Result;
use crate::transport::rdma::sys::{self, ffi};

/// Registered memory (`ibv_reg_mr`), deregistered on drop.
pub struct MemoryRegion {
    raw: *mut ffi::ibv_mr,
    _pd: Arc<ProtectionDomain>,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

// SAFETY: an MR is immutable after registration; the pointer is owned.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Register `[addr, addr+len)` for local write and remote read/write.
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
    ) -> Result<MemoryRegion> {
        let lib = super::lib()?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        // SAFETY: `pd.raw` is live; the caller keeps the memory mapped. The exported ibv_reg_mr is what the C macro calls for constant access flags.
        let raw = unsafe { lib.ibv_reg_mr(pd.raw, addr.cast(), len, access.0 as i32) };
        if raw.is_null() {
            return Err(verb_error(pd.context().name(), "ibv_reg_mr", 0));
        }
        Ok(MemoryRegion {
            raw,
            _pd: pd.clone(),
        })
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` is live for self's lifetime.
        unsafe { (*self.raw).lkey }
    }

    /// Remote key (goes into the segment descriptor).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Ok(lib) = sys::verbs() {
            // SAFETY: registered in `new`, deregistered once.
            unsafe { lib.ibv_dereg_mr(self.raw) };
        }
    }
}
