//! ACPI hotplug, as a guest OS's ACPI code sees it: the Generic Event Device ([`ged`]) raises
//! an interrupt and says what changed; the PCI hotplug controller ([`pci_hotplug`]) says
//! which slots came up or are to go and takes the guest's eject; the CPU hotplug controller
//! ([`cpu_hotplug`]) does the same for vCPUs, and the memory hotplug controller
//! ([`memory_hotplug`]) says where memory added while the VM runs is. The GED also carries the
//! power button's press, and [`sleep`] takes the guest's ACPI power-off. Their AML (the DSDT
//! methods that read them) is in [`aml`] and [`memory_aml`]. A guest's eject is left in
//! [`PendingEjects`] for the VM's owner, which does the removal (never on the vCPU thread that
//! made the write). See docs/hotplug.md.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub mod aml;
mod aml_encoding;
pub mod cpu_hotplug;
pub mod ged;
mod hotplug_aml;
pub mod layout;
pub mod memory_aml;
pub mod memory_hotplug;
pub mod pci_hotplug;
// Run by build.rs; here only for the test that compares its bytes with those built in.
#[cfg(test)]
mod pci_slots_aml;
pub mod sleep;

pub use layout::{
    CPU_HOTPLUG_ADDR, CPU_HOTPLUG_LEN, GED_ADDR, GED_GSI, GED_LEN, MEMORY_HOTPLUG_ADDR,
    PCI_HOTPLUG_ADDR, PCI_HOTPLUG_LEN,
};

/// What the guest ejected: the VM's owner completes the removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ejected {
    /// PCI slot on bus 0.
    PciSlot(u8),
    /// A CPU by its id.
    Cpu(u8),
}

/// What the guest ejected and the VM's owner has not yet completed: a bit per PCI slot and
/// per CPU id. An eject sets its bit, so a guest writing an eject register in a loop costs no
/// memory, and wakes the main thread only when the bit was not already set (one wake-up for
/// a batch). The owner takes them all at once.
#[derive(Debug, Default)]
pub struct PendingEjects {
    pci: AtomicU32,
    cpus: [AtomicU64; 4],
}

impl PendingEjects {
    /// The guest ejected the slots whose bits are set in `slots`.
    pub fn eject_slots(&self, slots: u32) {
        let before = self.pci.fetch_or(slots, Ordering::AcqRel);
        if before | slots != before {
            crate::wake::wake(); // the main loop completes the eject
        }
    }

    /// The guest ejected CPU `id`.
    pub fn eject_cpu(&self, id: u8) {
        let bit = 1u64 << (id % 64);
        let before = self.cpus[usize::from(id / 64)].fetch_or(bit, Ordering::AcqRel);
        if before & bit == 0 {
            crate::wake::wake();
        }
    }

    /// Whether the guest ejected something not taken yet.
    pub fn any(&self) -> bool {
        self.pci.load(Ordering::Acquire) != 0
            || self.cpus.iter().any(|c| c.load(Ordering::Acquire) != 0)
    }

    /// Takes every pending eject: CPUs first, then slots, each in ascending order.
    pub fn take(&self) -> Vec<Ejected> {
        let mut all = Vec::new();
        for (word, cpus) in self.cpus.iter().enumerate() {
            let bits = cpus.swap(0, Ordering::AcqRel);
            let ids = (0..64u8).filter(|i| bits & (1 << i) != 0);
            all.extend(ids.map(|i| Ejected::Cpu(word as u8 * 64 + i)));
        }
        let slots = self.pci.swap(0, Ordering::AcqRel);
        all.extend(
            (0..32u8)
                .filter(|s| slots & (1 << s) != 0)
                .map(Ejected::PciSlot),
        );
        all
    }
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
