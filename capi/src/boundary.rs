//! What crosses the boundary, checked: NULL pointers, array lengths,
//! strings, and copies into caller buffers. Each failure is
//! `InvalidArgument` naming the argument; nothing here decides more.

use std::ffi::{CStr, c_char};

use tent::{Error, Result};

/// `p` as a reference, or `InvalidArgument` naming `what` when it is NULL.
///
/// # Safety
/// A non-NULL `p` points to a live, initialised `T` for `'a`.
pub(crate) unsafe fn arg<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: forwarded from the caller; `as_ref` checks NULL.
    unsafe { p.as_ref() }.ok_or_else(|| Error::invalid(format!("{what} is NULL")))
}

/// `p` as a mutable reference (see [`arg`]).
///
/// # Safety
/// A non-NULL `p` points to a live, initialised `T` for `'a`, not aliased.
pub(crate) unsafe fn arg_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: forwarded from the caller; `as_mut` checks NULL.
    unsafe { p.as_mut() }.ok_or_else(|| Error::invalid(format!("{what} is NULL")))
}

/// Refuse a NULL out-pointer before any work is done (so a call that
/// could not report its result does nothing).
pub(crate) fn out<T>(p: *mut T, what: &str) -> Result<()> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} (an out-pointer) is NULL")));
    }
    Ok(())
}

/// Write `v` through an out-pointer checked by [`out`]. Writes without
/// reading what was there (C may pass uninitialised memory).
///
/// # Safety
/// `p` is non-NULL, aligned and valid for a write of `T`.
pub(crate) unsafe fn put<T>(p: *mut T, v: T) {
    // SAFETY: forwarded from the caller.
    unsafe { p.write(v) }
}

/// `n` elements at `p`; an empty slice for `n == 0` whatever `p` is.
///
/// # Safety
/// For `n > 0` and a non-NULL `p`: `p` points to `n` initialised `T`
/// that live, unmodified, for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::invalid(format!(
            "{what} is NULL with a count of {n}"
        )));
    }
    // SAFETY: non-NULL, and the caller vouches for `n` elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A NUL-terminated UTF-8 string.
///
/// # Safety
/// A non-NULL `p` points to a NUL-terminated string live for `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller vouches for the terminator.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|e| Error::invalid(format!("{what} is not UTF-8")).with_source(e))
}

/// Copy `s` and a terminating NUL into `buf` of `len` bytes; a NULL or
/// too-small buffer is `InvalidArgument` (saying the length needed) and
/// `buf` is left as it was.
///
/// # Safety
/// A non-NULL `buf` is valid for writes of `len` bytes.
pub(crate) unsafe fn copy_str(s: &str, buf: *mut c_char, len: usize, what: &str) -> Result<()> {
    if buf.is_null() {
        return Err(Error::invalid(format!("{what} buffer is NULL")));
    }
    let need = s.len() + 1;
    if len < need {
        return Err(Error::invalid(format!(
            "{what} buffer of {len} bytes is too small: {need} needed (with the NUL)"
        )));
    }
    // SAFETY: `buf` holds `len >= need` bytes (caller), `s` is a distinct Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// Copy `items` into the caller's array `out` of `capacity` elements,
/// each converted to its C type; `*count` gets how many were written, or, when the
/// array is too small, how many it needs (then nothing is written and the
/// result is `InvalidArgument`: the caller retries with a larger array,
/// nothing is lost).
///
/// # Safety
/// A non-NULL `out` is valid for writes of `capacity` elements; a
/// non-NULL `count` for one `usize`.
pub(crate) unsafe fn copy_array<S, T>(
    items: &[S],
    out: *mut T,
    capacity: usize,
    count: *mut usize,
    what: &str,
) -> Result<()>
where
    T: for<'x> From<&'x S>,
{
    self::out(count, "count")?;
    if items.len() > capacity {
        // SAFETY: checked non-NULL above; the caller vouches for the rest.
        unsafe { put(count, items.len()) };
        return Err(Error::invalid(format!(
            "{what} array of {capacity} elements is too small: {} needed (*count says so)",
            items.len()
        )));
    }
    if !items.is_empty() && out.is_null() {
        return Err(Error::invalid(format!(
            "{what} array is NULL with {} to copy",
            items.len()
        )));
    }
    for (i, item) in items.iter().enumerate() {
        // SAFETY: i < items.len() <= capacity elements the caller vouches for.
        unsafe { put(out.add(i), T::from(item)) };
    }
    // SAFETY: checked non-NULL above.
    unsafe { put(count, items.len()) };
    Ok(())
}
