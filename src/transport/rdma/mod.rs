//! The RDMA transport and its building blocks.
//!
//! - [`transport`]: [`RdmaTransport`], rails (local NIC, remote NIC) to each
//!   peer, per-worker endpoints, rkey checks, moves between rails.
//! - [`endpoint`]: one QP to a peer's NIC: SQ credits, linked WR lists with
//!   selective signalling, completions, QP replacement with re-post.
//! - [`ledger`]: [`SubmissionLedger`], every request an endpoint posted
//!   until its end is known; orphans of a dead QP come out exactly once.
//!   Its send queue's flow control is a [`crate::flow::SqController`]
//!   (the engine's one flow-control type; admission, split policies and
//!   the SQ/CQE diagnostics live in [`crate::flow`] too).
//! - [`qp_table`]: [`QpTable`], the live QPs' controllers by (NIC, QP
//!   number), for the async-event thread.
//! - [`connector`]: the helper threads that connect endpoints' QPs (the
//!   `QpConnect` exchange can wait on the peer; a worker never does).
//! - [`events`]: [`NicEvents`], the thread reading the NICs' async events
//!   (a port down marks its rails down at once, with or without a netdev).
//! - [`nic`]: the NICs in use (context, PD, port, GID) and memory
//!   registered on all of them (one rkey per NIC).
//! - [`responder`]: the target side of QP bootstrap (`QpConnect`).
//! - [`wc`]: completion status → error kind (flush is a cascade).
//! - [`verbs`]: safe owners of ibverbs objects (context, PD, CQ, QP, MR);
//!   [`sys`]: the provider ops table they call through (libibverbs loaded
//!   at run time, or a fake one in tests).

pub(crate) mod connector;
pub(crate) mod endpoint;
pub(crate) mod events;
pub mod gid;
pub mod layout;
pub(crate) mod ledger;
pub mod nic;
pub(crate) mod qp_table;
pub mod responder;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
// The verbs bindings and the provider table: the engine's own, public only
// to the integration tests that drive them (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub mod sys;
#[cfg(not(any(test, feature = "testing")))]
pub(crate) mod sys;
pub(crate) mod transport;
pub mod verbs;
pub(crate) mod wc;

pub use connector::{Connector, ConnectorHandle};
pub use connector::{Queue, QueueSource};
pub use endpoint::{Endpoint, EndpointState, RdmaCompletion, RdmaSlice, SqSettings, TerminalCause};
pub use events::{EventCounts, NicEvents};
pub use nic::{Nic, NicOptions, NicSet, Registration};
pub use responder::Responder;
pub(crate) use transport::{RdmaPeer, RdmaTransport};
