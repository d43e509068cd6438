//! The C API of tent: `libtent_c.so` / `libtent_c.a` and `include/tent.h`.
//!
//! A thin layer over the Rust API: every decision (address lookup,
//! request validation, which error) is the `tent` crate's. This crate
//! only converts types, checks pointers and lengths at the boundary,
//! catches panics, and turns a `tent::Error` into a code and a message.
//!
//! Conventions every function follows:
//! - It returns `int`: 0 (`TENT_OK`) on success, otherwise a negative
//!   code: `-(ErrorKind code)` (e.g. `TENT_ERR_INVALID_ARGUMENT` = -32),
//!   or `TENT_ERR_PANIC` for a bug caught at the boundary. The message of
//!   the last failure on the calling thread is `tent_last_error_message()`.
//! - Out-parameters are written only on success, except where a function
//!   says otherwise (a too-small array reports the length it needs).
//! - A zero-initialised struct is a valid argument: 0 is every field's
//!   default (`TENT_OPCODE_READ`, `TENT_PRIORITY_HIGH`, any transport, the
//!   engine's default deadline).
//!
//! The map:
//! - `error`: codes, the thread's last error, the panic guard every
//!   function body runs in.
//! - `boundary`: pointer, length and string checks at the boundary.
//! - `engine`: `tent_engine_t`, create / destroy, names.
//! - `segment`: open / close a segment, its regions, peer probe.
//! - `memory`: allocate / register / unregister memory.
//! - `request`: `tent_request_t` and its conversion to an SQE.
//! - `batch`: batches: allocate, submit, status, cancel, wait, free.
//! - `ring`: `tent_ring_t`, the zero-copy ring API.
//! - `notify`: notifications: send, attach to a submission, receive.
//! - `blocks`: block lists (paged KV caches) in one call.
// The C names (`tent_engine_t`) are the header's.
#![allow(non_camel_case_types)]

// In the header's order (cbindgen follows it; rustfmt would sort one group).
mod error;

mod engine;

mod segment;

mod memory;

mod request;

mod batch;

mod ring;

mod notify;

mod blocks;

mod boundary;

/// The version of this C interface. A change that breaks an existing
/// function's signature or meaning, or a struct's layout, bumps it; a new
/// function or error code does not. (3: `tent_buffer_t.peer_addr`.)
pub const TENT_ABI_VERSION: u32 = 3;

/// The version of the C interface this library implements: a program
/// compiled against `tent.h` checks at start that it equals the header's
/// `TENT_ABI_VERSION`, and refuses to run against a library that differs.
#[unsafe(no_mangle)]
pub extern "C" fn tent_abi_version() -> u32 {
    TENT_ABI_VERSION
}

pub use batch::*;
pub use blocks::*;
pub use engine::*;
pub use error::*;
pub use memory::*;
pub use notify::*;
pub use request::*;
pub use ring::*;
pub use segment::*;
