//! `tent._tent`: the native half of the Python module `tent`, a drop-in
//! for TENT's Python module over the tent Rust engine.
//!
//! A thin layer: types are converted, buffer-protocol properties checked
//! (contiguity, writability, size), the GIL released around every call
//! that can wait, and tent's error kinds raised as exception classes.
//! Every decision (address lookup, request validation, block merging,
//! error kinds) is the engine's.
//!
//! - `engine`: `TransferEngine`, TENT's methods (and a few beyond).
//! - `types`: `Request`, `OpCode`, `TransferStatus`, `Notification`, ...
//! - `memory`: addresses and buffer-protocol objects.
//! - `ring`: the ring API.
//! - `live`: what an open engine holds, and the GIL-free wait every
//!   blocking call runs through.
//! - `errors`: tent's errors as `tent._errors` classes.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod engine;
mod errors;
mod live;
mod memory;
mod ring;
mod types;

use pyo3::prelude::*;

#[pymodule]
fn _tent(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::TransferEngine>()?;
    m.add_class::<types::Request>()?;
    m.add_class::<types::OpCode>()?;
    m.add_class::<types::TransferStatusEnum>()?;
    m.add_class::<types::TransferStatus>()?;
    m.add_class::<types::SegmentInfo>()?;
    m.add_class::<types::SegmentInfoBuffer>()?;
    m.add_class::<types::Notification>()?;
    m.add_class::<types::Completion>()?;
    m.add_class::<ring::Ring>()?;
    m.add_function(wrap_pyfunction!(errors::error_kinds, m)?)?;
    m.add("PRIO_HIGH", tent::Priority::High as u8)?;
    m.add("PRIO_MEDIUM", tent::Priority::Medium as u8)?;
    m.add("PRIO_LOW", tent::Priority::Low as u8)?;
    m.add("LOCAL_SEGMENT_ID", tent::SegmentId::LOCAL.0)?;
    m.add("MAX_NOTIFY_NAME", tent::notify::MAX_NOTIFY_NAME)?;
    m.add("MAX_NOTIFY_MSG", tent::notify::MAX_NOTIFY_MSG)?;
    Ok(())
}
