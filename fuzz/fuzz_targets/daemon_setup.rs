//! The daemon's set-up frames (`tent::daemon`) under arbitrary bytes, as a
//! client's request and as the daemon's reply: never a panic, and whatever
//! decodes round-trips unchanged.
//! The body is `tent::fuzzing::daemon_setup`, which `cargo test` also runs
//! over the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::daemon_setup(data));
