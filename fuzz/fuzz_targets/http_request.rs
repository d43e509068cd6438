//! The HTTP endpoint's request decision under arbitrary bytes (the first
//! byte sets a bearer): it never panics, answers only known statuses with a
//! well-formed head, and gives a 200 only to a well-formed GET or HEAD of a
//! known path, with the token when a bearer is set.
//! The body is `tent::fuzzing::http_request`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::http_request(data));
