#![no_main]
//! `cargo +nightly fuzz run pci_config`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| vmm::fuzzing::pci_config(data));
