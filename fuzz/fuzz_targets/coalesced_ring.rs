#![no_main]
//! `cargo +nightly fuzz run coalesced_ring`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::coalesced_ring(data));
