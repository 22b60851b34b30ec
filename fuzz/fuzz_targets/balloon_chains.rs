#![no_main]
//! `cargo +nightly fuzz run balloon_chains`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::balloon_chains(data));
