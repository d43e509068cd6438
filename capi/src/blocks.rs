//! Block lists (paged KV caches): N (local block, remote block) pairs of
//! one size in one call, one task per local registration.

use std::ffi::c_int;

use tent::{BatchId, BlockList, SegmentId};

use crate::batch::tent_batch_id_t;
use crate::boundary::{arg, put, slice};
use crate::engine::{engine, tent_engine_t};
use crate::error::call;
use crate::request::{opcode, priority};
use crate::segment::tent_segment_id_t;

/// `count` blocks of `block_len` bytes: block i moves between local
/// address `local_addrs[i]` (in registered memory) and `remote_addrs[i]`
/// in segment `target_id`. Zero-initialised fields take their defaults
/// (READ, HIGH priority, the local segment).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tent_block_list_t {
    /// `TENT_OPCODE_READ` (remote → local) or `TENT_OPCODE_WRITE`.
    pub opcode: c_int,
    /// The segment every remote block is in.
    pub target_id: tent_segment_id_t,
    /// Bytes per block.
    pub block_len: u64,
    /// Each block's local address (`count` of them).
    pub local_addrs: *const u64,
    /// Each block's remote address (`count` of them).
    pub remote_addrs: *const u64,
    /// How many blocks.
    pub count: usize,
    /// `TENT_PRIORITY_*` for every request.
    pub priority: c_int,
}

/// Submit a block list into `batch`: one task per local registration the
/// blocks use (one, usually), contiguous neighbours merged. `*out_tasks`
/// (may be NULL) gets how many tasks were appended (their indexes follow
/// the batch's earlier tasks). All or nothing, as `tent_submit`. The
/// arrays are copied in the call.
///
/// # Safety
/// `engine` is a live engine; `blocks` points to a block list whose
/// arrays hold `count` addresses each; `out_tasks` NULL or valid for one
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_submit_blocks(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    blocks: *const tent_block_list_t,
    out_tasks: *mut usize,
) -> c_int {
    call("tent_submit_blocks", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: a block list or NULL (caller).
        let b = unsafe { arg(blocks, "blocks") }?;
        // SAFETY: `count` addresses in each array (caller).
        let local_addrs = unsafe { slice(b.local_addrs, b.count, "local_addrs") }?;
        // SAFETY: as above.
        let remote_addrs = unsafe { slice(b.remote_addrs, b.count, "remote_addrs") }?;
        let list = BlockList {
            opcode: opcode(b.opcode)?,
            segment: SegmentId(b.target_id),
            block_len: b.block_len,
            local_addrs,
            remote_addrs,
            priority: priority(b.priority)?,
        };
        let tasks = e.submit_blocks(BatchId(batch), &list)?;
        if !out_tasks.is_null() {
            // SAFETY: non-NULL, valid for a write (caller).
            unsafe { put(out_tasks, tasks) };
        }
        Ok(())
    })
}
