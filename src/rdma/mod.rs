//! The RDMA transport's building blocks (the transport itself, with its
//! endpoint cache and QP bootstrap over the control plane, comes next).
//!
//! - [`endpoint`]: one QP to a peer's NIC: SQ credits, linked WR lists with
//!   selective signalling, completions, QP replacement with re-post.
//! - [`nic`]: the NICs in use (context, PD, port, GID) and memory
//!   registered on all of them (one rkey per NIC).
//! - [`responder`]: the target side of QP bootstrap (`QpConnect`).
//! - [`wc`]: completion status → error kind (flush is a cascade).

pub mod endpoint;
pub mod nic;
pub mod responder;
pub mod wc;

pub use endpoint::{Endpoint, Queue, QueueSource, RdmaCompletion, RdmaSlice};
pub use nic::{Nic, NicSet, Registration};
pub use responder::Responder;
