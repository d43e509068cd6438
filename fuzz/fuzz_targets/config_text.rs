//! Configuration text under arbitrary bytes, through the function that
//! `TENT_CONF`, a config file and the bindings' JSON reach
//! (`Config::from_json_str`): whatever it accepts validates, and its JSON
//! (`Config::to_json`, every key) reads back as an equal configuration.
//! A refusal's message never holds the secret the text gave.
//! The body is `tent::fuzzing::config_text`, which `cargo test` also runs over
//! the seeds and kept inputs (`tests/fuzz_inputs.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tent::fuzzing::config_text(data));
