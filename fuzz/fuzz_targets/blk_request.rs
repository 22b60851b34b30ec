#![no_main]
//! `cargo +nightly fuzz run blk_request`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::blk_request(data));
