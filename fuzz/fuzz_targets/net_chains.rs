#![no_main]
//! `cargo +nightly fuzz run net_chains`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::net_chains(data));
