//! Control-plane codec under arbitrary bytes: `decode` and `read_message`
//! must never panic, must agree with each other, whatever decodes must
//! survive an encode/decode round trip unchanged (encoding is canonical),
//! and a decoded `QpConnect` names an initiator within the responder's key
//! bounds (`QpInitiator::new` takes it).
//! The body is `tent::fuzzing::control_decode`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::control_decode(data));
