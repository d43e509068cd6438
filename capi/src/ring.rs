//! `tent_ring_t`: the ring API for C (push requests into a submission
//! ring, submit, reap completions), the zero-copy path: an SQE is written
//! in place into the ring the worker reads, a CQE read from the ring it
//! writes.

use std::ffi::c_int;
use std::time::Duration;

use tent::{Cqe, Error, ErrorKind, Ring};

use crate::boundary::{arg_mut, out, put, slice};
use crate::engine::{engine, tent_engine_t};
use crate::error::{call, code_of};
use crate::request::{in_request, tent_request_t, to_sqe};

/// One thread's submission and completion rings into one worker
/// (opaque). Use it from one thread at a time. It may outlive its
/// engine: its calls then fail `TENT_ERR_SHUTDOWN`.
#[derive(Debug)]
pub struct tent_ring_t {
    ring: Ring,
}

/// A completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct tent_cqe_t {
    /// The request's `user_data`.
    pub user_data: u64,
    /// `>= 0`: bytes moved; `< 0`: a `TENT_ERR_*` code.
    pub result: i64,
    /// The transport that served it (`TENT_TRANSPORT_*`).
    pub transport: c_int,
    /// How many times it moved to another transport.
    pub failover_count: u32,
    /// 1 when served by a fallback transport (succeeded, not on the
    /// preferred path).
    pub fallback: c_int,
    /// 1 when it failed with every transport it could use exhausted.
    pub failover_exhausted: c_int,
}

impl From<&Cqe> for tent_cqe_t {
    fn from(c: &Cqe) -> Self {
        tent_cqe_t {
            user_data: c.user_data(),
            result: match c.result() {
                Ok(bytes) => i64::try_from(bytes).unwrap_or(i64::MAX),
                Err(kind) => i64::from(code_of(kind)),
            },
            transport: c_int::from(c.transport() as u8),
            failover_count: u32::from(c.failover_count()),
            fallback: c_int::from(c.fallback()),
            failover_exhausted: c_int::from(c.failover_exhausted()),
        }
    }
}

/// A new ring of `depth` entries (a power of two; 0: the engine's
/// `ring_depth`), attached to the engine's next worker.
///
/// # Safety
/// `engine` is a live engine; `out_ring` valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_create(
    engine: *const tent_engine_t,
    depth: u32,
    out_ring: *mut *mut tent_ring_t,
) -> c_int {
    call("tent_ring_create", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        out(out_ring, "out_ring")?;
        let ring = match depth {
            0 => e.ring()?,
            d => e.ring_with_depth(d)?,
        };
        let handle = Box::into_raw(Box::new(tent_ring_t { ring }));
        // SAFETY: checked non-NULL above.
        unsafe { put(out_ring, handle) };
        Ok(())
    })
}

/// Release a ring. NULL is a no-op. Requests pushed and not completed
/// still run; their completions are dropped.
///
/// # Safety
/// `ring` is NULL or came from `tent_ring_create` and was not destroyed;
/// no other thread uses it during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_destroy(ring: *mut tent_ring_t) {
    if ring.is_null() {
        return;
    }
    call("tent_ring_destroy", || {
        // SAFETY: it came from Box::into_raw in tent_ring_create and is released once (caller).
        drop(unsafe { Box::from_raw(ring) });
        Ok(())
    });
}

/// Push `count` requests into the ring, each written in place into the
/// next free slot, its source looked up in `engine`'s registered memory;
/// they are published to the worker when the call returns (a stopped
/// engine is reported by the next `tent_ring_submit`). `*pushed` (may be
/// NULL) gets how many went in. A full ring stops the call with
/// `TENT_ERR_SQ_FULL`, a request that is not valid with its error; the
/// ones before it are in, the rest untouched: reap completions and push
/// the rest again.
///
/// # Safety
/// `ring` is a live ring; `engine` the live engine it came from;
/// `requests` points to `count` requests; `pushed` NULL or valid for one
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_push(
    ring: *mut tent_ring_t,
    engine: *const tent_engine_t,
    requests: *const tent_request_t,
    count: usize,
    pushed: *mut usize,
) -> c_int {
    call("tent_ring_push", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: `count` requests at `requests` (caller).
        let reqs = unsafe { slice(requests, count, "requests") }?;
        if reqs.is_empty() {
            return Err(Error::invalid("push of an empty request list"));
        }
        let mut n = 0;
        // One submission guard for the call: published once, when it drops.
        let mut sq = ring.submission();
        let result = reqs.iter().enumerate().try_for_each(|(i, r)| {
            let sqe = to_sqe(e, r).map_err(|err| in_request(i, err))?;
            sq.push(sqe).map_err(|_| {
                Error::new(
                    ErrorKind::SqFull,
                    format!(
                        "ring full at request {i} ({i} of {} pushed): reap completions, then push the rest",
                        reqs.len()
                    ),
                )
            })?;
            n += 1;
            Ok(())
        });
        drop(sq);
        if !pushed.is_null() {
            // SAFETY: non-NULL, valid for a write (caller).
            unsafe { put(pushed, n) };
        }
        result
    })
}

/// Publish what was pushed and wake the worker if it sleeps; `*submitted`
/// (may be NULL) gets how many were published by this call (0 when
/// `tent_ring_push` already did). `TENT_ERR_SHUTDOWN` once the engine has
/// stopped.
///
/// # Safety
/// `ring` is a live ring; `submitted` NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_submit(ring: *mut tent_ring_t, submitted: *mut usize) -> c_int {
    call("tent_ring_submit", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        let n = ring.submit()?;
        if !submitted.is_null() {
            // SAFETY: non-NULL, valid for a write (caller).
            unsafe { put(submitted, n) };
        }
        Ok(())
    })
}

/// Take up to `capacity` completions into `cqes`, without waiting;
/// `*count` gets how many (0: none ready).
///
/// # Safety
/// `ring` is a live ring; `cqes` valid for `capacity` writes; `count`
/// valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_reap(
    ring: *mut tent_ring_t,
    cqes: *mut tent_cqe_t,
    capacity: usize,
    count: *mut usize,
) -> c_int {
    call("tent_ring_reap", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        out(count, "count")?;
        if capacity > 0 {
            out(cqes, "cqes")?;
        }
        let mut n = 0;
        for cqe in ring.completion().take(capacity) {
            // SAFETY: n < capacity elements at `cqes` (caller).
            unsafe { put(cqes.add(n), (&cqe).into()) };
            n += 1;
        }
        // SAFETY: checked non-NULL above.
        unsafe { put(count, n) };
        Ok(())
    })
}

/// Wait until a completion is ready to reap, up to `timeout_ms`
/// (`TENT_ERR_TIMEOUT` after; `TENT_ERR_SHUTDOWN` if the engine stopped
/// with nothing left). Does not submit.
///
/// # Safety
/// `ring` is a live ring.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_wait(ring: *mut tent_ring_t, timeout_ms: u64) -> c_int {
    call("tent_ring_wait", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        ring.wait_ready(Duration::from_millis(timeout_ms))
    })
}

/// Turn inline issue on (`on` non-zero, the default where the engine's
/// `inline_max_bytes` is not 0) or off for this ring: off, every request
/// goes to the worker, for a thread that must never spend its time
/// copying. On, a small local or shm request is performed by
/// `tent_ring_push`'s own publish, on the calling thread, and its
/// completion is ready when the call returns.
///
/// # Safety
/// `ring` is a live ring.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_set_inline(ring: *mut tent_ring_t, on: c_int) -> c_int {
    call("tent_ring_set_inline", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        ring.set_inline(on != 0);
        Ok(())
    })
}

/// `*fd` gets an eventfd that turns readable when the worker posts
/// completions while this ring is about to sleep (`tent_ring_prepare_wait`):
/// wait on it with `epoll`/`poll`. The ring owns it: do not close it, and
/// take it out of any epoll set before `tent_ring_destroy`. Make it before
/// submitting what you will wait for; `tent_ring_prepare_wait` says 0 (do
/// not sleep) without one, or once the engine has stopped.
///
/// # Safety
/// `ring` is a live ring; `fd` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_completion_fd(ring: *mut tent_ring_t, fd: *mut c_int) -> c_int {
    call("tent_ring_completion_fd", || {
        use std::os::fd::AsRawFd;
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        out(fd, "fd")?;
        let raw = ring.completion_fd()?.as_raw_fd();
        // SAFETY: checked non-NULL above.
        unsafe { put(fd, raw) };
        Ok(())
    })
}

/// Say this thread is about to sleep on the completion fd: `*sleep` gets
/// 1 when it may (the worker will write the fd for the next completions),
/// 0 when a completion is already there (reap it instead). After waking,
/// call `tent_ring_finish_wait`.
///
/// # Safety
/// `ring` is a live ring; `sleep` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_prepare_wait(
    ring: *mut tent_ring_t,
    sleep: *mut c_int,
) -> c_int {
    call("tent_ring_prepare_wait", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        out(sleep, "sleep")?;
        let may = ring.prepare_wait();
        // SAFETY: checked non-NULL above.
        unsafe { put(sleep, c_int::from(may)) };
        Ok(())
    })
}

/// The sleep on the completion fd is over: the worker stops writing it,
/// and its counter is drained.
///
/// # Safety
/// `ring` is a live ring.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_ring_finish_wait(ring: *mut tent_ring_t) -> c_int {
    call("tent_ring_finish_wait", || {
        // SAFETY: a live ring or NULL, used by this thread only (caller).
        let ring = &mut unsafe { arg_mut(ring, "ring") }?.ring;
        ring.finish_wait();
        Ok(())
    })
}
