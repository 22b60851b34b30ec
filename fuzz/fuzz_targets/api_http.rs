#![no_main]
//! `cargo +nightly fuzz run api_http`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::api_http(data));
