#![no_main]
//! `cargo +nightly fuzz run vsock_packets`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::vsock_packets(data));
