//! Completion queues.

use std::sync::Arc;

use super::{Context, verb_error};
use crate::error::Result;
use crate::transport::rdma::sys::{self, ffi, ops};

/// A completion queue (`ibv_create_cq`), destroyed on drop.
pub struct CompletionQueue {
    pub(crate) raw: *mut ffi::ibv_cq,
    ctx: Arc<Context>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

// SAFETY: verbs objects are thread-safe; one worker polls a CQ.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of at least `depth` entries on `ctx`.
    pub fn new(ctx: &Arc<Context>, depth: i32) -> Result<Arc<CompletionQueue>> {
        let lib = super::lib()?;
        // SAFETY: `ctx.raw` is live; no completion channel, vector 0.
        let raw = unsafe {
            lib.ibv_create_cq(
                ctx.raw,
                depth,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if raw.is_null() {
            return Err(verb_error(ctx.name(), "ibv_create_cq", 0));
        }
        Ok(Arc::new(CompletionQueue {
            raw,
            ctx: ctx.clone(),
        }))
    }

    /// The raw CQ (for the endpoint's hot path).
    pub fn as_raw(&self) -> *mut ffi::ibv_cq {
        self.raw
    }

    /// Reap completions into `out`; how many.
    #[inline]
    pub fn poll(&self, out: &mut [ffi::ibv_wc]) -> Result<usize> {
        // SAFETY: `raw` is live; `out` holds `out.len()` entries.
        let n = unsafe { ops::poll_cq(self.raw, out.len() as i32, out.as_mut_ptr()) };
        if n < 0 {
            return Err(verb_error(self.ctx.name(), "ibv_poll_cq", -n));
        }
        Ok(n as usize)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Ok(lib) = sys::verbs() {
            // SAFETY: created in `new`, destroyed once, after the QPs using it (they hold an Arc of it).
            unsafe { lib.ibv_destroy_cq(self.raw) };
        }
    }
}
