#![no_main]
//! `cargo +nightly fuzz run serial`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::serial(data));
