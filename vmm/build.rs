//! Builds the DSDT's common parts when exitless is compiled, as the seccomp programs are: the
//! PCI host bridge (`src/devices/pci/host_bridge_aml.rs`) and slots
//! (`src/devices/acpi/pci_slots_aml.rs`), the same bytes for every VM, and the hotplug
//! controllers' AML (`src/devices/acpi/hotplug_aml.rs`) of a VM without memory hotplug, its
//! CPU part for each count up to `PREBUILT_VCPUS`: no such VM builds them at run time.

use std::path::PathBuf;

#[path = "src/devices/acpi/aml_encoding.rs"]
#[allow(dead_code)]
mod aml_encoding;
#[path = "src/devices/pci/host_bridge_aml.rs"]
mod host_bridge_aml;
#[path = "src/devices/acpi/hotplug_aml.rs"]
#[allow(dead_code)]
mod hotplug_aml;
#[path = "src/devices/acpi/layout.rs"]
#[allow(dead_code)]
mod layout;
#[path = "src/devices/acpi/pci_slots_aml.rs"]
mod pci_slots_aml;

/// `devices::pci::root::SLOTS` (a unit test checks the bytes against it).
const SLOTS: usize = 32;
/// `devices::acpi::aml::PREBUILT_VCPUS` (a unit test checks every count's bytes).
const PREBUILT_VCPUS: u8 = 8;
/// `devices::pci::acpi::WINDOWS`, the crate's `memory::PCI_*` (a unit test checks the bytes).
const PCI_WINDOWS: host_bridge_aml::PciWindows = host_bridge_aml::PciWindows {
    mmio_start: 0xC000_0000,
    mmio_size: 0x1000_0000,
    ecam_start: 0xE000_0000,
    ecam_size: 0x10_0000,
    config_port: 0xCF8,
    config_port_len: 8,
};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/aml_encoding.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/pci_slots_aml.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/hotplug_aml.rs");
    println!("cargo:rerun-if-changed=src/devices/acpi/layout.rs");
    println!("cargo:rerun-if-changed=src/devices/pci/host_bridge_aml.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let write = |name: &str, bytes: Vec<u8>| {
        std::fs::write(out.join(name), bytes).expect("cannot write the AML in OUT_DIR")
    };
    write("pci_host_bridge.aml", host_bridge_aml::build(&PCI_WINDOWS));
    write("pci_slots.aml", pci_slots_aml::build(SLOTS));
    let mut controllers = hotplug_aml::ged(false);
    controllers.extend(hotplug_aml::power());
    controllers.extend(hotplug_aml::pci_controller());
    write("hotplug_controllers.aml", controllers);
    for vcpus in 1..=PREBUILT_VCPUS {
        write(&format!("cpus_{vcpus}.aml"), hotplug_aml::cpus(vcpus));
    }
}
