//! Protection domains.

use std::sync::Arc;

use super::{Context, verb_error};
use crate::error::Result;
use crate::transport::rdma::sys::{self, ffi};

/// A protection domain (`ibv_alloc_pd`), freed on drop.
pub struct ProtectionDomain {
    pub(crate) raw: *mut ffi::ibv_pd,
    pub(crate) ctx: Arc<Context>,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

// SAFETY: verbs objects are thread-safe; the pointer is owned.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocate a PD on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        let lib = super::lib()?;
        // SAFETY: `ctx.raw` is a live context.
        let raw = unsafe { lib.ibv_alloc_pd(ctx.raw) };
        if raw.is_null() {
            return Err(verb_error(ctx.name(), "ibv_alloc_pd", 0));
        }
        Ok(Arc::new(ProtectionDomain {
            raw,
            ctx: ctx.clone(),
        }))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if let Ok(lib) = sys::verbs() {
            // SAFETY: allocated in `new`, freed once, after every MR and QP made from it (they hold an Arc of it).
            unsafe { lib.ibv_dealloc_pd(self.raw) };
        }
    }
}
