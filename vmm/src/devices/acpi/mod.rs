//! ACPI hotplug, as a guest OS's ACPI code sees it: the Generic Event Device ([`ged`]) raises
//! an interrupt and says what changed; the PCI hotplug controller ([`pci_hotplug`]) says
//! which slots came up or are to go and takes the guest's eject; the CPU hotplug controller
//! ([`cpu_hotplug`]) does the same for vCPUs, and the memory hotplug controller
//! ([`memory_hotplug`]) says where memory added while the VM runs is. Their AML (the DSDT
//! methods that read them) is in [`aml`] and [`memory_aml`]. A guest's eject is reported on a channel to the VM's owner, which does the
//! removal (never on the vCPU thread that made the write). See docs/hotplug.md.

pub mod aml;
mod aml_encoding;
pub mod cpu_hotplug;
pub mod ged;
pub mod memory_aml;
pub mod memory_hotplug;
pub mod pci_hotplug;

/// Where the controllers' registers sit (in the MMIO gap, below the I/O APIC).
pub const GED_ADDR: u64 = 0xfeb0_0000;
pub const GED_LEN: u64 = 0x10;
pub const PCI_HOTPLUG_ADDR: u64 = 0xfeb0_1000;
pub const PCI_HOTPLUG_LEN: u64 = 0x10;
pub const CPU_HOTPLUG_ADDR: u64 = 0xfeb0_2000;
pub const CPU_HOTPLUG_LEN: u64 = 0x10;
pub const MEMORY_HOTPLUG_ADDR: u64 = 0xfeb0_3000;
/// The GED's interrupt: ISA IRQ 5 (free on this platform), edge, active high.
pub const GED_GSI: u32 = 5;

/// What the guest ejected: the VM's owner completes the removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ejected {
    /// PCI slot on bus 0.
    PciSlot(u8),
    /// A CPU by its id.
    Cpu(u8),
}

/// Reads a little-endian register value of `data.len()` bytes from `value`.
fn put(value: u32, data: &mut [u8]) {
    let bytes = value.to_le_bytes();
    for (d, b) in data
        .iter_mut()
        .zip(bytes.iter().chain(std::iter::repeat(&0)))
    {
        *d = *b;
    }
}

/// The value a guest wrote (up to 4 bytes, little-endian).
fn value(data: &[u8]) -> u32 {
    let mut bytes = [0u8; 4];
    for (b, d) in bytes.iter_mut().zip(data) {
        *b = *d;
    }
    u32::from_le_bytes(bytes)
}
