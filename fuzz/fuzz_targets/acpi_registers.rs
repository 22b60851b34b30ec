#![no_main]
//! `cargo +nightly fuzz run acpi_registers`: see docs/fuzzing.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| exitless_lab::fuzzing::acpi_registers(data));
