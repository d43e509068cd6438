//! tent: a data-transfer engine for RDMA clusters.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod config;
pub mod topology;
