//! Builds the DSDT's PCI slots, the same bytes for every VM, when exitless is compiled
//! (`src/devices/acpi/pci_slots_aml.rs`), as the seccomp programs are: no VM builds them at
//! run time.

use std::path::PathBuf;

#[path = "src/devices/acpi/aml_encoding.rs"]
#[allow(dead_code)]
mod aml_encoding;
#[path = "src/devices/acpi/pci_slots_aml.rs"]
mod pci_slots_aml;

/// `devices::pci::root::SLOTS` (a unit test checks the bytes against it).
const SLOTS: usize = 32;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/aml_encoding.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/pci_slots_aml.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("pci_slots.aml"), pci_slots_aml::build(SLOTS))
        .expect("cannot write pci_slots.aml in OUT_DIR");
}
