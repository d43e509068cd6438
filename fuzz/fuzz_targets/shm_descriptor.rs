//! The shm descriptor parser under arbitrary words: whatever a hostile
//! same-host owner writes, an admitted descriptor is bounded, sorted,
//! non-overlapping and non-wrapping, and a region is mapped only from a
//! sealed memfd that holds `DATA_OFFSET + len` bytes. The input's first 12
//! bytes are a handed-out file's size and seals; the rest are the words.
//! The body is `tent::fuzzing::shm_descriptor`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::shm_descriptor(data));
