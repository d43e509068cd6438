//! Memory regions.

use std::sync::Arc;

use super::{ProtectionDomain, verb_error};
use crate::error::{Error, Result};
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

/// The access tent registers memory with: local write, remote read and
/// write, and, where the library can pass optional flags
/// (`ibv_reg_mr_iova2`), relaxed ordering, which lets the NIC reorder its
/// PCIe writes (it matters at 200–400 Gb/s on AMD EPYC, Grace and behind
/// PCIe switches). An optional flag the device lacks is dropped by the
/// kernel rather than failing the registration; the exported `ibv_reg_mr`
/// takes no optional flags, which is why the C macro routes them to
/// `ibv_reg_mr_iova2`.
pub(crate) fn access_flags(optional_flags_pass: bool) -> ffi::ibv_access_flags {
    let required = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
    if optional_flags_pass {
        required | ffi::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING
    } else {
        required
    }
}

impl MemoryRegion {
    /// Register `[addr, addr+len)` for local write and remote read/write
    /// ([`access_flags`]). A length past the device's `max_mr_size` is
    /// refused with `InvalidArgument` naming both.
    ///
    /// # Safety
    /// The memory must stay mapped until the region is dropped.
    pub unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
    ) -> Result<MemoryRegion> {
        let lib = super::lib()?;
        let ctx = pd.context();
        let max = ctx.max_mr_size();
        if len as u64 > max {
            return Err(Error::invalid(format!(
                "{}: cannot register {len} bytes in one memory region (max_mr_size {max})",
                ctx.name()
            )));
        }
        let iova2 = lib.ibv_reg_mr_iova2.is_ok();
        let reg = |access: ffi::ibv_access_flags| {
            if iova2 {
                // SAFETY: `pd.raw` is live; the caller keeps the memory mapped; the iova is the address itself, as ibv_reg_mr's.
                unsafe { lib.ibv_reg_mr_iova2(pd.raw, addr.cast(), len, addr as u64, access.0) }
            } else {
                // SAFETY: as above; the exported ibv_reg_mr is what the C macro calls for constant, non-optional flags.
                unsafe { lib.ibv_reg_mr(pd.raw, addr.cast(), len, access.0 as i32) }
            }
        };
        let mut raw = reg(access_flags(iova2));
        if raw.is_null() && iova2 {
            // A provider that refuses the optional flag instead of
            // ignoring it (EINVAL, EOPNOTSUPP): without it.
            let errno = std::io::Error::last_os_error().raw_os_error();
            if matches!(errno, Some(libc::EINVAL | libc::EOPNOTSUPP)) {
                raw = reg(access_flags(false));
                if !raw.is_null() {
                    crate::lograte::warn_limited!(
                        ("relaxed-ordering", ctx.name().to_owned()),
                        nic = ctx.name(),
                        "rdma: the device refuses relaxed ordering; memory registered without it"
                    );
                }
            }
        }
        if raw.is_null() {
            return Err(verb_error(ctx.name(), "ibv_reg_mr", 0));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_ask_for_relaxed_ordering_only_through_the_optional_path() {
        use ffi::ibv_access_flags as A;
        let with = access_flags(true);
        assert_eq!(
            with.0,
            (A::IBV_ACCESS_LOCAL_WRITE
                | A::IBV_ACCESS_REMOTE_WRITE
                | A::IBV_ACCESS_REMOTE_READ
                | A::IBV_ACCESS_RELAXED_ORDERING)
                .0
        );
        // Relaxed ordering is in the optional range the kernel may drop.
        const { assert!(A::IBV_ACCESS_RELAXED_ORDERING.0 >= ffi::IBV_ACCESS_OPTIONAL_FIRST) };
        let without = access_flags(false);
        assert_eq!(without.0 & A::IBV_ACCESS_RELAXED_ORDERING.0, 0);
    }
}
