#![no_main]
//! `cargo +nightly fuzz run migration_receiver`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::migration_receiver(data));
