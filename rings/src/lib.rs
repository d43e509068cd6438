//! Lock-free building blocks for tent's io_uring-style interface.
//!
//! Applications push 64-byte submission entries into an SPSC ring consumed by
//! a worker thread; the worker answers through a completion ring. Rings can
//! live in `/dev/shm` and be shared between processes.
//!
//! * [`entry`] — the 64-byte submission and completion records and the
//!   small types they carry.
//! * [`op`] — builders for submission entries.
//! * [`status`] — the error codes carried in completions.
//! * [`spsc`] — the single-producer single-consumer ring.
//! * [`region`] — heap or shared-memory regions with a self-describing header.
//! * [`credit`] — a lock-free credit pool for flow control.
//!
//! ```
//! use tent_rings::entry::{Cqe, LocalAddr, RegionId, RemoteAddr, SegmentId, Sqe};
//! use tent_rings::{op, spsc};
//!
//! let (mut sq, mut worker_sq) = spsc::channel::<Sqe>(64)?;
//! let (mut worker_cq, mut cq) = spsc::channel::<Cqe>(64)?;
//!
//! let write = op::Write::new(LocalAddr::new(RegionId(1), 0), RemoteAddr::new(SegmentId(2), 0), 8);
//! sq.push(write.user_data(1).build()).unwrap();
//! sq.sync();
//!
//! while let Some(sqe) = worker_sq.pop() {
//!     worker_cq.push(Cqe::new(sqe.user_data(), Ok(sqe.len()))).unwrap();
//! }
//! worker_sq.sync();
//! worker_cq.sync();
//!
//! assert_eq!(cq.pop().map(|c| c.result()), Some(Ok(8)));
//! # Ok::<(), spsc::RingError>(())
//! ```

#![deny(missing_docs)]
#![deny(missing_debug_implementations)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod credit;
pub mod entry;
pub mod op;
pub mod region;
pub mod spsc;
pub mod status;

pub use entry::{
    CQE_FAILOVER_EXHAUSTED, CQE_FALLBACK, Cqe, FAILOVER_EXHAUSTED, LocalAddr, Opcode, Priority,
    RegionId, RemoteAddr, SQE_NO_FAILOVER, SegmentId, Sqe, TransportKind,
};
pub use status::ErrorKind;
