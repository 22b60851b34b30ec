#![no_main]
//! `cargo +nightly fuzz run pci_config`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::pci_config(data));
