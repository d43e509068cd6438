//! Why a request failed: the error codes carried in completion entries.
//!
//! Codes are stable wire values (they travel through shared memory as
//! `-(code)` in [`Cqe`](crate::entry::Cqe) results), grouped by range so a
//! failover layer can decide what to do from the number alone:
//!
//! * `1..32` — transient: another path or a retry may succeed.
//! * `32..64` — permanent: the request itself is wrong; retrying is pointless.
//! * `64..` — terminal but not a fault: the request was withdrawn.

use std::fmt;

/// The reason a request did not complete successfully.
///
/// ```
/// use tent_rings::status::ErrorKind;
///
/// let e = ErrorKind::Timeout;
/// assert!(e.is_transient());
/// assert_eq!(ErrorKind::from_code(e.code()), Some(e));
/// assert_eq!(e.to_string(), "Timeout");
/// ```
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The peer could not be reached on this transport.
    Unreachable = 1,
    /// The local NIC failed.
    LocalNicFailed = 2,
    /// The local NIC is rebooting.
    LocalNicReboot = 3,
    /// The remote NIC failed.
    RemoteNicFailed = 4,
    /// The remote NIC is rebooting.
    RemoteNicReboot = 5,
    /// The network route to the peer was lost.
    RouteLost = 6,
    /// The peer process failed.
    ProcessFailed = 7,
    /// The request did not complete before its deadline.
    Timeout = 8,
    /// The submission queue was full.
    SqFull = 9,

    /// The request was malformed.
    InvalidArgument = 32,
    /// Memory could not be allocated.
    OutOfMemory = 33,
    /// The remote segment does not exist.
    SegmentNotFound = 34,
    /// The local address is not inside a registered region.
    AddressNotRegistered = 35,
    /// The access falls outside the region or segment.
    OutOfBounds = 36,
    /// The access is not permitted.
    AccessDenied = 37,

    /// The request was canceled before it completed.
    Canceled = 64,
    /// The engine shut down before the request completed.
    Shutdown = 65,
}

impl ErrorKind {
    /// Every kind, in code order.
    pub const ALL: [ErrorKind; 17] = [
        ErrorKind::Unreachable,
        ErrorKind::LocalNicFailed,
        ErrorKind::LocalNicReboot,
        ErrorKind::RemoteNicFailed,
        ErrorKind::RemoteNicReboot,
        ErrorKind::RouteLost,
        ErrorKind::ProcessFailed,
        ErrorKind::Timeout,
        ErrorKind::SqFull,
        ErrorKind::InvalidArgument,
        ErrorKind::OutOfMemory,
        ErrorKind::SegmentNotFound,
        ErrorKind::AddressNotRegistered,
        ErrorKind::OutOfBounds,
        ErrorKind::AccessDenied,
        ErrorKind::Canceled,
        ErrorKind::Shutdown,
    ];

    /// The stable numeric code.
    pub const fn code(self) -> u16 {
        self as u16
    }

    /// The kind with this code, if any.
    ///
    /// ```
    /// use tent_rings::status::ErrorKind;
    ///
    /// assert_eq!(ErrorKind::from_code(36), Some(ErrorKind::OutOfBounds));
    /// assert_eq!(ErrorKind::from_code(0), None);
    /// ```
    pub const fn from_code(code: u16) -> Option<ErrorKind> {
        // A linear scan keeps this `const` and cannot drift from `ALL`.
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u16 == code {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }

    /// A fault that another path, or a later retry, may get around.
    pub const fn is_transient(self) -> bool {
        (self as u16) < 32
    }

    /// A fault in the request itself; retrying cannot help.
    pub const fn is_permanent(self) -> bool {
        let c = self as u16;
        c >= 32 && c < 64
    }

    /// The variant name, e.g. `"OutOfBounds"`.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorKind::Unreachable => "Unreachable",
            ErrorKind::LocalNicFailed => "LocalNicFailed",
            ErrorKind::LocalNicReboot => "LocalNicReboot",
            ErrorKind::RemoteNicFailed => "RemoteNicFailed",
            ErrorKind::RemoteNicReboot => "RemoteNicReboot",
            ErrorKind::RouteLost => "RouteLost",
            ErrorKind::ProcessFailed => "ProcessFailed",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::SqFull => "SqFull",
            ErrorKind::InvalidArgument => "InvalidArgument",
            ErrorKind::OutOfMemory => "OutOfMemory",
            ErrorKind::SegmentNotFound => "SegmentNotFound",
            ErrorKind::AddressNotRegistered => "AddressNotRegistered",
            ErrorKind::OutOfBounds => "OutOfBounds",
            ErrorKind::AccessDenied => "AccessDenied",
            ErrorKind::Canceled => "Canceled",
            ErrorKind::Shutdown => "Shutdown",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for ErrorKind {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_code_round_trips_every_kind() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), Some(k));
            assert_eq!(k.to_string(), format!("{k:?}"));
        }
    }

    #[test]
    fn unknown_codes_are_none() {
        let known: Vec<u16> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        // Under Miri (thousands of times slower) the low codes and the top one.
        let codes = if cfg!(miri) { 0..=1024 } else { 0..=u16::MAX };
        for c in codes.chain([u16::MAX]) {
            if !known.contains(&c) {
                assert_eq!(ErrorKind::from_code(c), None, "code {c}");
            }
        }
    }

    #[test]
    fn groups_are_disjoint_and_cover_faults() {
        let transient = ErrorKind::ALL.iter().filter(|k| k.is_transient()).count();
        let permanent = ErrorKind::ALL.iter().filter(|k| k.is_permanent()).count();
        assert_eq!(transient, 9);
        assert_eq!(permanent, 6);
        for k in [ErrorKind::Canceled, ErrorKind::Shutdown] {
            assert!(!k.is_transient() && !k.is_permanent());
        }
        for k in ErrorKind::ALL {
            assert!(!(k.is_transient() && k.is_permanent()));
        }
    }

    #[test]
    fn all_is_sorted_and_unique() {
        assert!(ErrorKind::ALL.windows(2).all(|w| w[0].code() < w[1].code()));
    }
}
