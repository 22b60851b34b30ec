#![no_main]
//! `cargo +nightly fuzz run balloon_chains`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::balloon_chains(data));
