//! Where virtio-pmem regions go in guest physical memory: one after the other from the first
//! 1 GiB boundary past RAM and the memory hotplug area, each 128 MiB aligned (Linux maps
//! persistent memory in whole memory sections), each its own KVM memory slot. A region stays
//! mapped until the VM ends, also after its device was removed (the guest may still hold
//! mappings of it; a later device takes a new range).

use std::sync::Arc;

use kvm_ioctls::VmFd;

use super::LaunchError;
use crate::config::{PmemConfig, VmConfig};
use crate::devices::virtio::pmem::{Pmem, PmemMapping};
use crate::kvm;
use crate::memory::{ram_ranges, MMIO_GAP_END};

/// KVM slots from here on are pmem regions' (RAM's, hot-added included, are below).
const FIRST_SLOT: u32 = 256;
/// A region's alignment in guest physical memory.
const ALIGN: u64 = 128 << 20;
const GIB: u64 = 1 << 30;

/// The pmem regions of one VM and where the next goes.
#[derive(Debug, Default)]
pub(crate) struct PmemArea {
    next: u64,
    slot: u32,
    mappings: Vec<Arc<PmemMapping>>,
}

fn align_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl PmemArea {
    /// The area of a VM of `config`'s RAM and memory hotplug size.
    pub(crate) fn new(config: &VmConfig) -> Self {
        let ram_end = ram_ranges(config.memory.bytes())
            .last()
            .map_or(0, |(start, len)| start.0 + len);
        let hotplug = config.hotplug_memory.map_or(0, |m| m.bytes());
        let above = align_up(ram_end.max(MMIO_GAP_END), GIB) + hotplug;
        PmemArea {
            next: align_up(above, GIB),
            slot: FIRST_SLOT,
            mappings: Vec::new(),
        }
    }

    /// Maps the file `config` names at the next place, registers it with KVM and returns
    /// the device that tells the guest where it is.
    pub(crate) fn attach(&mut self, vm: &VmFd, config: &PmemConfig) -> Result<Pmem, LaunchError> {
        if self.next == 0 {
            // A restored VM's: no area was laid out for it.
            return Err(LaunchError::PmemUnplaced);
        }
        let mapping = Arc::new(PmemMapping::open(config)?);
        let gpa = self.next;
        kvm::register_mapping(vm, self.slot, gpa, mapping.len(), mapping.host_address())?;
        self.slot += 1;
        self.next = align_up(gpa + mapping.len(), ALIGN);
        self.mappings.push(mapping.clone());
        Ok(Pmem::new(mapping, gpa))
    }
}
