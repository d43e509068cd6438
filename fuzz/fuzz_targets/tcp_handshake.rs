//! The TCP data handshake's two state machines under arbitrary peers: the
//! target's (`Serving`, what every accepted connection's first bytes
//! reach) and the initiator's (`Opening`, what a target answers), with and
//! without a secret. The input is cut into the exact chunks each machine
//! asks for. Whatever arrives: no panic, a refused machine asks for
//! nothing more, a named initiator has a connection id, a secret's
//! handshake is never done without a proof that verified (a fuzzer cannot
//! forge an HMAC), and a refusal owed an answer carries a non-zero status.
//! The body is `tent::fuzzing::tcp_handshake`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::tcp_handshake(data));
