//! A blocking etcd v3 client over etcd's JSON gateway (`POST /v3/...` on
//! the client port), plain or TLS (`https://` endpoints, a CA file and an
//! optional client certificate: [`Tls`]); the etcd metadata store
//! (`control::directory::etcd`) is built on it.
//!
//! Why the gateway and not gRPC: `ureq` (blocking HTTP/1.1, rustls) builds
//! in about ten seconds with no async runtime (measured: `ureq` with
//! `rustls` from scratch, 10 s on this 2-core VM), where the gRPC client
//! `etcd-client` needs tokio, tonic and `protoc` (about 50 s and 104
//! crates). What the gateway lacks (several watches on one stream,
//! progress requests, a keepalive stream) tent does not need: one prefix
//! watch per engine, one keepalive POST every TTL/3 from the metadata
//! thread.
//!
//! [`EtcdClient`] makes unary calls (lease grant, keepalive, revoke; put,
//! get, prefix range, delete) with one timeout each; [`Watch`] owns one
//! streaming connection and reads it line by line. Every answer is hostile
//! input, decoded with bounds in [`wire`]. Errors are [`EtcdError`], typed
//! for what a caller does next (a lease gone: grant again and republish; a
//! watch canceled: range again and watch from there) and mapped onto the
//! taxonomy by [`EtcdError::kind`] ([`EtcdError::into_error`]).

pub mod client;
pub mod wire;

#[cfg(any(test, feature = "testing"))]
pub mod test_server;
#[cfg(test)]
mod tests;

pub use client::{Credentials, EtcdClient, Tls, Watch};
pub use wire::{Kv, Range, WatchEvent};

use crate::error::{Error, ErrorKind};

/// An etcd lease id (non-zero; 0 means "no lease" on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// What went wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint could be reached (connection refused, reset, no such
    /// host); names every endpoint tried and why it failed.
    #[error("etcd unreachable: {0}")]
    Unreachable(String),
    /// The endpoint took longer than the timeout.
    #[error("etcd at {0} did not answer in time")]
    Timeout(String),
    /// The answer does not decode, or breaks a bound or an invariant.
    #[error("malformed answer from etcd: {0}")]
    Malformed(String),
    /// etcd refused the request (`code` is the gRPC status code).
    #[error("etcd refused (HTTP {status}, gRPC code {code}): {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The gRPC code etcd gave (0 when none).
        code: i64,
        /// etcd's message, printable and at most 512 bytes.
        message: String,
    },
    /// Authentication with the user and password given failed.
    #[error("etcd authentication failed: {0}")]
    AuthFailed(String),
    /// The lease expired or was revoked: grant a new one and put its keys
    /// again.
    #[error("etcd lease {0:?} is gone (expired or revoked)")]
    LeaseGone(LeaseId),
    /// etcd canceled the watch (its start revision was compacted, or auth
    /// failed): range again and watch from the range's revision.
    #[error("etcd canceled the watch (compact revision {compact_revision}): {reason}")]
    WatchCanceled {
        /// The oldest revision still kept, when compaction was the cause.
        compact_revision: i64,
        /// etcd's reason, when it gave one.
        reason: String,
    },
    /// The watch stream ended (etcd went away or closed it).
    #[error("etcd watch stream ended: {0}")]
    WatchClosed(String),
    /// A request tent will not send (no endpoint, an unsupported scheme).
    #[error("invalid etcd request: {0}")]
    Invalid(String),
}

impl EtcdError {
    /// The taxonomy kind: `Unreachable` for a connection that failed,
    /// `Timeout`, `AccessDenied` for authentication and permission,
    /// `InvalidArgument` for malformed answers and refused requests,
    /// `Canceled` for a lease gone or a watch canceled.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EtcdError::Unreachable(_) | EtcdError::WatchClosed(_) => ErrorKind::Unreachable,
            EtcdError::Timeout(_) => ErrorKind::Timeout,
            EtcdError::Malformed(_) | EtcdError::Invalid(_) => ErrorKind::InvalidArgument,
            // gRPC 7 PermissionDenied, 16 Unauthenticated; 14 Unavailable
            // (no leader), 4 DeadlineExceeded.
            EtcdError::AuthFailed(_) | EtcdError::Server { code: 7 | 16, .. }
            | EtcdError::Server {
                status: 401 | 403, ..
            } => ErrorKind::AccessDenied,
            EtcdError::Server { code: 14, .. } => ErrorKind::Unreachable,
            EtcdError::Server { code: 4, .. } => ErrorKind::Timeout,
            EtcdError::Server { .. } => ErrorKind::InvalidArgument,
            EtcdError::LeaseGone(_) | EtcdError::WatchCanceled { .. } => ErrorKind::Canceled,
        }
    }

    /// As tent's [`Error`], of [`EtcdError::kind`], with this as its
    /// source. (A method, not a `From`: an impl on the public `Error` would
    /// make this crate-private type reachable from outside.)
    pub fn into_error(self) -> Error {
        Error::new(self.kind(), "etcd metadata store").with_source(self)
    }
}

/// The end of the range holding every key that starts with `prefix`
/// (etcd's `range_end`): the prefix with its last byte below 0xff
/// incremented and what follows dropped; `\0` (every key from `prefix`
/// on) when there is no such byte.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
