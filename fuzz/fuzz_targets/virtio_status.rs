#![no_main]
//! `cargo +nightly fuzz run virtio_status`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::virtio_status(data));
