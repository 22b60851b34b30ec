#![no_main]
//! `cargo +nightly fuzz run bench_line`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::bench_line(data));
