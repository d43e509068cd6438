//! Batches (TENT's batch API): allocate, submit requests, task status
//! (one, the list, overall), cancel, wait, free.

use std::ffi::c_int;
use std::time::Duration;

use tent::{BatchId, TaskStatus};

use crate::boundary::{copy_array, out, put, slice};
use crate::engine::{engine, tent_engine_t};
use crate::error::{call, code_of};
use crate::request::{tent_request_t, to_sqes};

/// A batch handle (`tent_allocate_batch`).
pub type tent_batch_id_t = u64;

/// Allocated, not submitted (TENT's `STATUS_WAITING`).
pub const TENT_STATUS_INITIAL: c_int = 0;
/// Submitted, not finished.
pub const TENT_STATUS_PENDING: c_int = 1;
/// Rejected before any byte moved: the request itself was wrong.
pub const TENT_STATUS_INVALID: c_int = 2;
/// Canceled (or the engine stopped first).
pub const TENT_STATUS_CANCELED: c_int = 3;
/// All bytes moved.
pub const TENT_STATUS_COMPLETED: c_int = 4;
/// Its deadline passed.
pub const TENT_STATUS_TIMEOUT: c_int = 5;
/// The transfer failed.
pub const TENT_STATUS_FAILED: c_int = 6;

/// A task's (or, aggregated, a batch's) status.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tent_status_t {
    /// `TENT_STATUS_*`.
    pub state: c_int,
    /// Why it did not complete: 0, or a negative `TENT_ERR_*` code.
    pub error: c_int,
    /// Bytes moved so far (all of them once completed; a batch's sum).
    pub transferred_bytes: u64,
    /// The transport that served it last (`TENT_TRANSPORT_ANY`: none).
    pub transport: c_int,
    /// How many times it moved to another transport.
    pub failover_count: u32,
    /// 1 when it failed with every transport it could use exhausted.
    pub failover_exhausted: c_int,
}

impl From<&TaskStatus> for tent_status_t {
    fn from(s: &TaskStatus) -> Self {
        tent_status_t {
            state: c_int::from(s.state as u8),
            error: s.error.map_or(0, code_of),
            transferred_bytes: s.transferred_bytes,
            transport: c_int::from(s.transport as u8),
            failover_count: u32::from(s.failover_count),
            failover_exhausted: c_int::from(s.failover_exhausted),
        }
    }
}

/// Allocate a batch able to hold `capacity` tasks.
///
/// # Safety
/// `engine` is a live engine; `out_batch` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_allocate_batch(
    engine: *const tent_engine_t,
    capacity: usize,
    out_batch: *mut tent_batch_id_t,
) -> c_int {
    call("tent_allocate_batch", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_batch, "out_batch")?;
        let id = e.allocate_batch(capacity)?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_batch, id.0) };
        Ok(())
    })
}

/// Free a batch; refused while any task is pending, and for a batch that
/// is not allocated (freed already).
///
/// # Safety
/// `engine` is a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_free_batch(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
) -> c_int {
    call("tent_free_batch", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        e.free_batch(BatchId(batch))
    })
}

/// Submit `count` requests into `batch` (after those submitted before:
/// task indexes continue). All or nothing: on an error none of them was
/// queued. A request the engine accepts here but cannot serve (an
/// unknown segment, a remote range out of bounds) ends its task
/// `TENT_STATUS_INVALID` or `_FAILED` with the reason in `error`.
///
/// # Safety
/// `engine` is a live engine; `requests` points to `count` requests
/// (or is NULL with count 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_submit(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    requests: *const tent_request_t,
    count: usize,
) -> c_int {
    call("tent_submit", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: `count` requests at `requests` (caller).
        let reqs = unsafe { slice(requests, count, "requests") }?;
        e.submit(BatchId(batch), &to_sqes(e, reqs)?)
    })
}

/// The status of task `task` (its index in submission order).
///
/// # Safety
/// `engine` is a live engine; `out_status` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_task_status(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    task: usize,
    out_status: *mut tent_status_t,
) -> c_int {
    call("tent_task_status", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_status, "out_status")?;
        let s = e.status(BatchId(batch), task)?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_status, (&s).into()) };
        Ok(())
    })
}

/// The status of every submitted task, in order, into `statuses` (room
/// for `capacity`); `*count` gets how many. Too small an array:
/// `TENT_ERR_INVALID_ARGUMENT`, nothing written, `*count` says how many
/// are needed.
///
/// # Safety
/// `engine` is a live engine; `statuses` valid for `capacity` writes (or
/// NULL with capacity 0); `count` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_task_status_list(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    statuses: *mut tent_status_t,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    call("tent_task_status_list", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(count, "count")?;
        let list = e.status_list(BatchId(batch))?;
        // SAFETY: `capacity` writable elements at `statuses`, one at `count` (caller).
        unsafe { copy_array(&list, statuses, capacity, count, "statuses") }
    })
}

/// One status for the whole batch: pending while any task is; else
/// completed if all did, else the most severe failure's; bytes summed.
///
/// # Safety
/// `engine` is a live engine; `out_status` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_overall_status(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    out_status: *mut tent_status_t,
) -> c_int {
    call("tent_overall_status", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_status, "out_status")?;
        let s = e.batch_status(BatchId(batch))?;
        // SAFETY: checked non-NULL above.
        unsafe { put(out_status, (&s).into()) };
        Ok(())
    })
}

/// Wait until nothing of `batch` is in flight, up to `timeout_ms`
/// (`TENT_ERR_TIMEOUT` after); `*out_status` (may be NULL) gets the
/// overall status. A batch with nothing submitted answers at once with
/// `TENT_STATUS_INITIAL`.
///
/// # Safety
/// `engine` is a live engine; `out_status` NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_wait_batch(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    timeout_ms: u64,
    out_status: *mut tent_status_t,
) -> c_int {
    call("tent_wait_batch", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        let s = e.wait_batch(BatchId(batch), Duration::from_millis(timeout_ms))?;
        if !out_status.is_null() {
            // SAFETY: non-NULL, valid for a write (caller).
            unsafe { put(out_status, (&s).into()) };
        }
        Ok(())
    })
}

/// Ask every task of `batch` to stop; each ends `TENT_STATUS_CANCELED`
/// (or as it finished, if first).
///
/// # Safety
/// `engine` is a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_cancel(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
) -> c_int {
    call("tent_cancel", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        e.cancel(BatchId(batch))
    })
}

/// Ask task `task` of `batch` to stop.
///
/// # Safety
/// `engine` is a live engine.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_cancel_task(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    task: usize,
) -> c_int {
    call("tent_cancel_task", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        e.cancel_task(BatchId(batch), task)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tent::TaskState;

    #[test]
    fn status_constants_are_tents_task_states() {
        for (c, s) in [
            (TENT_STATUS_INITIAL, TaskState::Initial),
            (TENT_STATUS_PENDING, TaskState::Pending),
            (TENT_STATUS_INVALID, TaskState::Invalid),
            (TENT_STATUS_CANCELED, TaskState::Canceled),
            (TENT_STATUS_COMPLETED, TaskState::Completed),
            (TENT_STATUS_TIMEOUT, TaskState::Timeout),
            (TENT_STATUS_FAILED, TaskState::Failed),
        ] {
            assert_eq!(c, s as u8 as c_int, "{s:?}");
        }
    }
}
