#![no_main]
//! `cargo +nightly fuzz run snapshot_state`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::snapshot_state(data));
