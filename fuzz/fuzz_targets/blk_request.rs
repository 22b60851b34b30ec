#![no_main]
//! `cargo +nightly fuzz run blk_request`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::blk_request(data));
