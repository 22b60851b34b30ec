#![no_main]
//! `cargo +nightly fuzz run i8042`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::i8042(data));
