#![no_main]
//! `cargo +nightly fuzz run virtio_transport`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::virtio_transport(data));
