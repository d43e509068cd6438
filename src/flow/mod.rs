//! Flow control: one idea, one piece of code (seed 004).
//!
//! Every bounded queue the engine feeds is an [`SqController`]: a depth,
//! the work *posted* into it and not known complete (hard credits: one
//! CAS to take, one to give back), the work *admitted* toward it and not
//! posted yet (soft), the threads waiting for room, and a terminal
//! degrade that refuses everything from then on and wakes every waiter.
//! Its users:
//!
//! | queue | depth | posted means | released by |
//! |---|---|---|---|
//! | a worker's window on a transport | `max_inflight_slices` | a slice handed to the transport | its completion, reaped by the worker |
//! | an RDMA endpoint's send queue | `sq_depth` | a WR given to `ibv_post_send` | its CQE (or the flush of a dead QP) |
//! | a TCP connection's wire window | `max_inflight_per_connection` | a slice's request sent on the socket | its response landed (or the connection torn down) |
//!
//! Around the controller:
//! - [`sq`]: [`SqController`], [`AdmissionToken`] (an admission given back
//!   exactly once) and [`AdmissionSlot`] (one parked in a batch task).
//! - [`admission`]: [`AdmissionGate`], seed 004's executor admission over
//!   one worker's queues to a peer.
//! - [`split`]: the split policies (`static`, `least_loaded`, `capacity`):
//!   which queue of several takes the next charge or slice, one rule for
//!   the gate and the post path.
//! - [`diag`]: [`SqCqeDiagnostics`], a queue's counters and the one-line
//!   hint that tells a poll stall from a slow drain from a burst.

pub(crate) mod admission;
pub(crate) mod diag;
pub mod split;
pub(crate) mod sq;

pub use admission::AdmissionGate;
pub use diag::{SqCqeDiagnostics, SqReport, SqRow};
pub use sq::{AdmissionSlot, AdmissionToken, Reservation, SqController, SqRefusal, SqSnapshot};
