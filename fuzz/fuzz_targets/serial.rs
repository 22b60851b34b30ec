#![no_main]
//! `cargo +nightly fuzz run serial`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::serial(data));
