//! Error codes, the calling thread's last error, and the guard every
//! exported function body runs in (no panic crosses into C).
//!
//! A code is `-(ErrorKind::code())`: the same number a completion's
//! result carries, so a C caller branches on one set of constants for
//! function returns, task errors and CQE results alike.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use tent::{Error, ErrorKind};

/// Success.
pub const TENT_OK: c_int = 0;
/// The peer could not be reached on this transport.
pub const TENT_ERR_UNREACHABLE: c_int = -1;
/// The local NIC failed.
pub const TENT_ERR_LOCAL_NIC_FAILED: c_int = -2;
/// The local NIC is rebooting.
pub const TENT_ERR_LOCAL_NIC_REBOOT: c_int = -3;
/// The remote NIC failed.
pub const TENT_ERR_REMOTE_NIC_FAILED: c_int = -4;
/// The remote NIC is rebooting.
pub const TENT_ERR_REMOTE_NIC_REBOOT: c_int = -5;
/// The network route to the peer was lost.
pub const TENT_ERR_ROUTE_LOST: c_int = -6;
/// The peer process failed.
pub const TENT_ERR_PROCESS_FAILED: c_int = -7;
/// Not done before its deadline or the wait's timeout.
pub const TENT_ERR_TIMEOUT: c_int = -8;
/// A submission queue (or ring) was full.
pub const TENT_ERR_SQ_FULL: c_int = -9;
/// A malformed argument or request: a NULL pointer, a zero length, a
/// buffer too small, a freed batch, an index out of range.
pub const TENT_ERR_INVALID_ARGUMENT: c_int = -32;
/// Memory (or a table slot) could not be allocated.
pub const TENT_ERR_OUT_OF_MEMORY: c_int = -33;
/// The segment is not open, or does not exist.
pub const TENT_ERR_SEGMENT_NOT_FOUND: c_int = -34;
/// The address is not inside registered memory.
pub const TENT_ERR_ADDRESS_NOT_REGISTERED: c_int = -35;
/// The range runs past its region or segment.
pub const TENT_ERR_OUT_OF_BOUNDS: c_int = -36;
/// The access is not permitted.
pub const TENT_ERR_ACCESS_DENIED: c_int = -37;
/// Canceled before it completed.
pub const TENT_ERR_CANCELED: c_int = -64;
/// The engine shut down (a ring used after its engine was destroyed).
pub const TENT_ERR_SHUTDOWN: c_int = -65;
/// A bug in tent: a panic caught at the boundary (the message says where).
/// Not an `ErrorKind`; far from their range so it never collides.
pub const TENT_ERR_PANIC: c_int = -1000;

/// The code a C caller sees for `kind`.
pub(crate) fn code_of(kind: ErrorKind) -> c_int {
    -c_int::from(kind.code())
}

thread_local! {
    /// The message of this thread's last failure (NUL-terminated, so its
    /// pointer can be handed out as it is).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last failure.
fn set_last_error(msg: String) {
    // An interior NUL would cut the message short in C: replace it.
    let msg = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // During thread teardown the slot may be gone: the code still returns.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = msg);
}

/// Run the body of exported function `name`: `Ok` gives `TENT_OK`; an
/// error is recorded as the thread's last error (prefixed by `name`) and
/// its code returned; a panic is caught, recorded, and gives
/// `TENT_ERR_PANIC`.
pub(crate) fn call(name: &str, body: impl FnOnce() -> tent::Result<()>) -> c_int {
    // AssertUnwindSafe: after a panic the body's state is not looked at
    // again here; what it shared with the engine is the engine's to guard.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => TENT_OK,
        Ok(Err(e)) => fail(name, &e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_owned());
            set_last_error(format!("{name}: Panic (a bug in tent): {what}"));
            TENT_ERR_PANIC
        }
    }
}

/// Record `e` as the thread's last error; its code.
fn fail(name: &str, e: &Error) -> c_int {
    set_last_error(format!("{name}: {e}"));
    code_of(e.kind())
}

/// The message of the last failed call on this thread (`""` if none
/// failed yet), NUL-terminated. The pointer stays valid until the next
/// failing call on this thread; a successful call leaves it as it is
/// (like `errno`). Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn tent_last_error_message() -> *const c_char {
    static EMPTY: &std::ffi::CStr = c"";
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|m| m.borrow().as_ptr())
            .unwrap_or(EMPTY.as_ptr())
    })
    .unwrap_or(EMPTY.as_ptr())
}

/// The name of a code: `"Ok"` for 0, the `ErrorKind` name for
/// `-(kind code)` (e.g. `"InvalidArgument"` for -32), `"Panic"` for
/// `TENT_ERR_PANIC`, `"Unknown"` otherwise. A static string; never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn tent_error_name(code: c_int) -> *const c_char {
    static NAMES: OnceLock<Vec<(c_int, CString)>> = OnceLock::new();
    static UNKNOWN: &std::ffi::CStr = c"Unknown";
    catch_unwind(|| {
        let names = NAMES.get_or_init(|| {
            let kinds = ErrorKind::ALL
                .iter()
                .map(|&k| (code_of(k), k.name().to_owned()));
            [
                (TENT_OK, "Ok".to_owned()),
                (TENT_ERR_PANIC, "Panic".to_owned()),
            ]
            .into_iter()
            .chain(kinds)
            .filter_map(|(c, n)| Some((c, CString::new(n).ok()?)))
            .collect()
        });
        names
            .iter()
            .find(|(c, _)| *c == code)
            .map_or(UNKNOWN.as_ptr(), |(_, n)| n.as_ptr())
    })
    .unwrap_or(UNKNOWN.as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: tent_last_error_message never returns NULL and the string lives until this thread's next failure.
        unsafe { CStr::from_ptr(tent_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn constants_are_the_negated_error_kind_codes() {
        let constants = [
            TENT_ERR_UNREACHABLE,
            TENT_ERR_LOCAL_NIC_FAILED,
            TENT_ERR_LOCAL_NIC_REBOOT,
            TENT_ERR_REMOTE_NIC_FAILED,
            TENT_ERR_REMOTE_NIC_REBOOT,
            TENT_ERR_ROUTE_LOST,
            TENT_ERR_PROCESS_FAILED,
            TENT_ERR_TIMEOUT,
            TENT_ERR_SQ_FULL,
            TENT_ERR_INVALID_ARGUMENT,
            TENT_ERR_OUT_OF_MEMORY,
            TENT_ERR_SEGMENT_NOT_FOUND,
            TENT_ERR_ADDRESS_NOT_REGISTERED,
            TENT_ERR_OUT_OF_BOUNDS,
            TENT_ERR_ACCESS_DENIED,
            TENT_ERR_CANCELED,
            TENT_ERR_SHUTDOWN,
        ];
        assert_eq!(
            constants.len(),
            ErrorKind::ALL.len(),
            "a kind has no constant"
        );
        for (c, k) in constants.into_iter().zip(ErrorKind::ALL) {
            assert_eq!(c, code_of(k), "{k}");
            // SAFETY: tent_error_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(tent_error_name(c)) };
            assert_eq!(name.to_str().unwrap(), k.name());
        }
        assert!(!constants.contains(&TENT_ERR_PANIC));
    }

    #[test]
    fn names_of_ok_panic_and_unknown_codes() {
        for (code, want) in [
            (0, "Ok"),
            (TENT_ERR_PANIC, "Panic"),
            (-31, "Unknown"),
            (7, "Unknown"),
        ] {
            // SAFETY: as above.
            let name = unsafe { CStr::from_ptr(tent_error_name(code)) };
            assert_eq!(name.to_str().unwrap(), want, "code {code}");
        }
    }

    #[test]
    fn an_error_becomes_its_code_and_a_prefixed_message() {
        let rc = call("tent_test", || {
            Err(Error::new(ErrorKind::OutOfBounds, "past the end"))
        });
        assert_eq!(rc, TENT_ERR_OUT_OF_BOUNDS);
        assert_eq!(last(), "tent_test: OutOfBounds: past the end");
        assert_eq!(call("tent_test", || Ok(())), TENT_OK);
        assert_eq!(
            last(),
            "tent_test: OutOfBounds: past the end",
            "success keeps it"
        );
    }

    #[test]
    fn a_panic_is_caught_and_reported() {
        let rc = call("tent_test", || panic!("boom {}", 7));
        assert_eq!(rc, TENT_ERR_PANIC);
        assert_eq!(last(), "tent_test: Panic (a bug in tent): boom 7");
        let rc = call("tent_test", || std::panic::panic_any(5u8));
        assert_eq!(rc, TENT_ERR_PANIC);
        assert!(last().contains("a panic with no message"), "{}", last());
    }

    #[test]
    fn messages_are_per_thread_and_nul_safe() {
        call("tent_test", || Err(Error::invalid("main\0thread")));
        assert_eq!(last(), "tent_test: InvalidArgument: main\\0thread");
        std::thread::spawn(|| assert_eq!(last(), "", "a fresh thread has no error"))
            .join()
            .unwrap();
    }
}
