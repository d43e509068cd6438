//! etcd's JSON gateway answers under arbitrary bytes: every decoder of
//! `control::etcd::wire` on the whole input, then the input as a watch
//! stream read a few bytes at a time between timeouts (the first byte sets
//! how many): no panic, bounds kept, lines exactly as a split gives them.
//! The body is `tent::fuzzing::etcd_gateway`, which `cargo test` also runs
//! over the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::etcd_gateway(data));
