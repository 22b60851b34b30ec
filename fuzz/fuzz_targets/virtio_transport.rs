#![no_main]
//! `cargo +nightly fuzz run virtio_transport`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::virtio_transport(data));
