#![no_main]
//! `cargo +nightly fuzz run pmem_request`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::pmem_request(data));
