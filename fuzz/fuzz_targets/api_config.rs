#![no_main]
//! `cargo +nightly fuzz run api_config`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::api_config(data));
