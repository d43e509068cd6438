//! Data-plane frame headers under arbitrary bytes: every `decode` that
//! succeeds must round-trip through `encode`, and no decoded length may
//! exceed `MAX_OP_LEN`. Each decoder reads the input's first bytes (padded
//! with zeros when short), so one input exercises all of them: request,
//! fence and what the target reads after the handshake (`Inbound`: one or
//! the other, by magic), response, the v3 hello (header alone and whole,
//! with the initiator's ident) and the proof frame of the authenticated
//! handshake.
//! The body is `tent::fuzzing::data_frames`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::data_frames(data));
