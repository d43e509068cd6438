//! One engine per node (`tentd`), shared by every process on it.
//!
//! A [`Daemon`] serves an [`Engine`](crate::Engine) at a unix socket; a
//! process attaches there ([`Engine::attach`](crate::Engine::attach), or
//! the `daemon_socket` key), gets memory (a memfd both map: zero copy)
//! and rings (a submission ring, a completion ring and their bells, each
//! a sealed memfd) from it, opens segments through it, and then posts
//! SQEs in place: the daemon's workers poll client rings like their own,
//! and neither side makes a system call on the busy path (the SQ bell, a
//! futex word in the ring's memory, is rung only while the worker sleeps,
//! the CQ bell only while the client does). The client's side is
//! `client.rs` (`Attached`, what the engine handle forwards to) and
//! `batches.rs` (its batch API, over a ring of its own).
//!
//! A client is untrusted: the daemon copies each SQE before checking it
//! (the rings' `pop` reads a copy), bounds every ring index read from
//! shared memory, and lets a client's ring name only that client's
//! regions and the segments it opened (`ClientScope`), never the daemon's
//! own segment, where every client's memory is. A client that goes, by
//! closing its socket or by dying, has its rings closed (the workers drain
//! and retire them) and its regions unregistered (each waits for the ops
//! on it). A daemon that goes is seen by every client (its socket hangs
//! up): their waits end `Shutdown`, and they may attach again.
//!
//! The set-up protocol is in `wire.rs`; both sides check
//! [`LAYOUT_VERSION`] at attach.

mod batches;
mod client;
mod link;
mod mail;
mod relay;
mod server;
pub(crate) mod wire;

pub(crate) use client::{Attached, ClientMemory, DaemonRing};
pub use server::{ClientMatch, ClientWeight, Daemon, DaemonLimits};
pub use wire::LAYOUT_VERSION;

/// Where `tentd` listens unless told otherwise: `$XDG_RUNTIME_DIR/tentd.sock`,
/// else `/run/tent/tentd.sock`.
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => std::path::Path::new(&d).join("tentd.sock"),
        _ => std::path::PathBuf::from("/run/tent/tentd.sock"),
    }
}
