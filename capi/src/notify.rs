//! Notifications: send one to a segment's owner, attach one to a
//! submission, take what arrived.
//!
//! A received notification is copied into a `tent_notification_t` whose
//! arrays are as large as the wire allows (TENT's record does the same),
//! so no caller buffer can be too small for it: the engine hands over a
//! notification only when taking it out of its inbox, and one taken
//! could not be put back.

use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

use tent::{Error, Notification, Received};

use crate::batch::tent_batch_id_t;
use crate::boundary::{c_str, out, put, slice};
use crate::engine::{engine, tent_engine_t};
use crate::error::call;
use crate::request::{tent_request_t, to_sqes};
use crate::segment::tent_segment_id_t;

/// Longest segment name (bytes, without the NUL): a sender's `from`.
pub const TENT_MAX_SEGMENT_NAME: usize = 256;
/// Longest notification name (bytes, without the NUL).
pub const TENT_MAX_NOTIFY_NAME: usize = 256;
/// Longest notification message (bytes).
pub const TENT_MAX_NOTIFY_MSG: usize = 4096;
/// `tent_notification_t::from`'s size, with the NUL.
pub const TENT_SEGMENT_NAME_SIZE: usize = TENT_MAX_SEGMENT_NAME + 1;
/// `tent_notification_t::name`'s size, with the NUL.
pub const TENT_NOTIFY_NAME_SIZE: usize = TENT_MAX_NOTIFY_NAME + 1;

/// A received notification. NUL-terminated `from` and `name`; `msg` is
/// bytes (`msg_len` of them, not terminated).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tent_notification_t {
    /// The sender's segment name (`ip:port`).
    pub from: [c_char; TENT_SEGMENT_NAME_SIZE],
    /// What it is about.
    pub name: [c_char; TENT_NOTIFY_NAME_SIZE],
    /// Its message.
    pub msg: [u8; TENT_MAX_NOTIFY_MSG],
    /// How many bytes of `msg` it has.
    pub msg_len: usize,
}

/// `s` into a NUL-terminated fixed array, or `None` if it does not fit.
fn fill(dst: &mut [c_char], s: &str) -> Option<()> {
    let room = dst.len().checked_sub(1)?;
    if s.len() > room {
        return None;
    }
    for (d, &b) in dst.iter_mut().zip(s.as_bytes()) {
        *d = b as c_char;
    }
    dst[s.len()] = 0;
    Some(())
}

impl TryFrom<&Received> for tent_notification_t {
    type Error = Error;

    fn try_from(r: &Received) -> tent::Result<Self> {
        let mut n = tent_notification_t {
            from: [0; TENT_SEGMENT_NAME_SIZE],
            name: [0; TENT_NOTIFY_NAME_SIZE],
            msg: [0; TENT_MAX_NOTIFY_MSG],
            msg_len: r.msg.len(),
        };
        // The wire bounds every field (MAX_NAME, MAX_NOTIFY_NAME,
        // MAX_NOTIFY_MSG): a field past them is a bug, said as one.
        let over = |what: &str, len: usize| {
            Error::invalid(format!(
                "received notification's {what} of {len} bytes exceeds the C record \
                 (a bug: the wire bounds it); the notification was taken"
            ))
        };
        fill(&mut n.from, &r.from).ok_or_else(|| over("sender name", r.from.len()))?;
        fill(&mut n.name, &r.name).ok_or_else(|| over("name", r.name.len()))?;
        n.msg
            .get_mut(..r.msg.len())
            .ok_or_else(|| over("message", r.msg.len()))?
            .copy_from_slice(&r.msg);
        Ok(n)
    }
}

/// A notification from C arguments (the engine checks the limits).
///
/// # Safety
/// `name` is NULL or NUL-terminated; `msg` points to `msg_len` bytes (or
/// is NULL with 0).
unsafe fn notification(
    name: *const c_char,
    msg: *const c_void,
    msg_len: usize,
) -> tent::Result<Notification> {
    // SAFETY: forwarded from the caller.
    let name = unsafe { c_str(name, "name") }?;
    // SAFETY: forwarded from the caller.
    let msg = unsafe { slice(msg.cast::<u8>(), msg_len, "msg") }?;
    Notification::new(name, msg)
}

/// Deliver a notification (`name`, and `msg_len` bytes of `msg`) to the
/// engine that owns `segment` (0: this one); returns once it is in that
/// engine's inbox. The segment must have been opened by its owner's
/// `ip:port` name (notifications travel on the control plane).
///
/// # Safety
/// `engine` is a live engine; `name` NUL-terminated; `msg` points to
/// `msg_len` bytes (or is NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_send_notification(
    engine: *const tent_engine_t,
    segment: tent_segment_id_t,
    name: *const c_char,
    msg: *const c_void,
    msg_len: usize,
) -> c_int {
    call("tent_send_notification", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: forwarded from the caller.
        let n = unsafe { notification(name, msg, msg_len) }?;
        e.send_notification(tent::SegmentId(segment), &n)
    })
}

/// `tent_submit`, and deliver a notification to the owner of the
/// requests' (one) target segment once every one of them has completed:
/// it sees the notification only after all their data landed. The
/// batch's overall status stays pending until it is delivered, and turns
/// failed if it cannot be.
///
/// # Safety
/// As `tent_submit` and `tent_send_notification`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_submit_with_notification(
    engine: *const tent_engine_t,
    batch: tent_batch_id_t,
    requests: *const tent_request_t,
    count: usize,
    name: *const c_char,
    msg: *const c_void,
    msg_len: usize,
) -> c_int {
    call("tent_submit_with_notification", || {
        // SAFETY: a live engine or NULL (caller).
        let e = unsafe { self::engine(engine) }?;
        // SAFETY: `count` requests at `requests` (caller).
        let reqs = unsafe { slice(requests, count, "requests") }?;
        // SAFETY: forwarded from the caller.
        let n = unsafe { notification(name, msg, msg_len) }?;
        e.submit_with_notification(tent::BatchId(batch), &to_sqes(e, reqs)?, &n)
    })
}

/// Take the oldest notification received, waiting up to `timeout_ms`
/// for one (`TENT_ERR_TIMEOUT` when none came; nothing is taken then).
///
/// # Safety
/// `engine` is a live engine; `out_notification` valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_wait_notification(
    engine: *const tent_engine_t,
    timeout_ms: u64,
    out_notification: *mut tent_notification_t,
) -> c_int {
    call("tent_wait_notification", || {
        // SAFETY: forwarded from the caller.
        unsafe { take(engine, Duration::from_millis(timeout_ms), out_notification) }
    })
}

/// Take the oldest notification received, without waiting
/// (`TENT_ERR_TIMEOUT` when there is none): poll with
/// `while (tent_recv_notification(e, &n) == TENT_OK) ...`.
///
/// # Safety
/// As `tent_wait_notification`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tent_recv_notification(
    engine: *const tent_engine_t,
    out_notification: *mut tent_notification_t,
) -> c_int {
    call("tent_recv_notification", || {
        // SAFETY: forwarded from the caller.
        unsafe { take(engine, Duration::ZERO, out_notification) }
    })
}

/// The oldest notification into `out_notification`, waiting up to
/// `timeout`.
///
/// # Safety
/// As `tent_wait_notification`.
unsafe fn take(
    engine: *const tent_engine_t,
    timeout: Duration,
    out_notification: *mut tent_notification_t,
) -> tent::Result<()> {
    // SAFETY: a live engine or NULL (caller).
    let e = unsafe { self::engine(engine) }?;
    // Before taking one: a call that cannot hand it over takes none.
    out(out_notification, "out_notification")?;
    let r = if timeout.is_zero() {
        e.try_notification()
            .ok_or_else(|| tent::Error::new(tent::ErrorKind::Timeout, "no notification waiting"))?
    } else {
        e.wait_notification(timeout)?
    };
    let n = tent_notification_t::try_from(&r)?;
    // SAFETY: checked non-NULL above.
    unsafe { put(out_notification, n) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_the_wires() {
        assert_eq!(TENT_MAX_SEGMENT_NAME, tent::MAX_SEGMENT_NAME);
        assert_eq!(TENT_MAX_NOTIFY_NAME, tent::notify::MAX_NOTIFY_NAME);
        assert_eq!(TENT_MAX_NOTIFY_MSG, tent::notify::MAX_NOTIFY_MSG);
    }

    #[test]
    fn a_received_notification_fills_the_record_to_its_limits() {
        let r = Received {
            from: "f".repeat(TENT_MAX_SEGMENT_NAME),
            name: "n".repeat(TENT_MAX_NOTIFY_NAME),
            msg: vec![7; TENT_MAX_NOTIFY_MSG],
        };
        let n = tent_notification_t::try_from(&r).unwrap();
        assert_eq!(n.from[TENT_MAX_SEGMENT_NAME], 0);
        assert_eq!(n.name[TENT_MAX_NOTIFY_NAME - 1], b'n' as c_char);
        assert_eq!(
            (n.msg_len, n.msg[TENT_MAX_NOTIFY_MSG - 1]),
            (TENT_MAX_NOTIFY_MSG, 7)
        );
        let long = Received {
            name: "n".repeat(TENT_MAX_NOTIFY_NAME + 1),
            ..r
        };
        let e = tent_notification_t::try_from(&long).unwrap_err();
        assert!(e.to_string().contains("exceeds the C record"), "{e}");
    }
}
