//! Where memory hot-added while the VM runs (`vm.resize {"desired_ram": N}`) goes, as Cloud
//! Hypervisor's ACPI memory hotplug places it: an area of `memory.hotplug_size` bytes that
//! starts above 4 GiB, after boot RAM, aligned to the hotplug block; each resize that grows
//! the VM takes the next [`HotplugRegion`] of the area (one ACPI memory slot, a multiple of
//! the block). Pure bookkeeping: the caller maps the region, gives it to KVM and tells the
//! guest ([`HotplugRam::commit`] once it has).
//!
//! As Cloud Hypervisor: a size the VM has already or below it changes nothing (memory is
//! never taken back in ACPI mode); growth that is not a whole number of blocks is refused.

use std::sync::Arc;

use thiserror::Error;
use vm_memory::{GuestAddress, GuestRegionMmap};

use super::{ram_ranges, MMIO_GAP_END};

/// Told of every region of RAM added to a running VM, before the guest is: what a device
/// whose memory is mapped outside the VMM needs (a vhost-user front end sends the region to
/// its back end, whose mapping must exist before the guest can put a buffer there; its fd and
/// offset come from [`crate::memory::shared_file`]). The regions the VM booted with are in
/// the VM's guest memory ([`crate::devices::virtio::SharedGuestMemory`]) when the device
/// starts. Called on the thread that owns the VM (never a vCPU thread).
pub trait MemoryListener: Send {
    /// Whose listener this is, for errors.
    fn name(&self) -> &str;
    /// `region` is guest memory now (its KVM slot is registered, the devices' map has it).
    /// An error stops the hot-add before the guest is told.
    fn region_added(&mut self, region: &Arc<GuestRegionMmap>) -> Result<(), String>;
    /// Whether whatever it listens for is gone (a removed device's): it is then dropped.
    fn is_gone(&self) -> bool {
        false
    }
}

/// The hotplug block: Linux on x86 adds and onlines memory in blocks of 128 MiB (its
/// `memory_block_size` for guests below 64 GiB), so a region must be whole blocks.
pub const MEMORY_BLOCK: u64 = 128 << 20;
/// Most ACPI memory slots (Cloud Hypervisor has 8): each hot-add takes one, and Linux
/// evaluates every slot's `_STA` at boot (two controller accesses, exits, each).
pub const MAX_MEMORY_SLOTS: usize = 32;

/// Why a size cannot be reached.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MemoryHotplugError {
    #[error("Guest memory hotplug not supported: the VM was created without memory.hotplug_size (at least {MEMORY_BLOCK} bytes)")]
    NotEnabled,
    #[error("desired_ram {desired} adds {added} bytes: hot-added memory is whole blocks of {block} bytes")]
    Unaligned {
        desired: u64,
        added: u64,
        block: u64,
    },
    #[error("desired_ram {desired} is above the VM's limit of {limit} bytes (memory.size at boot {boot} + memory.hotplug_size {hotplug})")]
    OverLimit {
        desired: u64,
        limit: u64,
        boot: u64,
        hotplug: u64,
    },
    #[error("All {0} memory hotplug slots are used (each vm.resize that adds memory takes one)")]
    NoSlot(usize),
}

/// One hot-add: ACPI slot `slot`, `len` bytes of RAM at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotplugRegion {
    pub slot: usize,
    pub start: GuestAddress,
    pub len: u64,
}

/// A VM's hotplug area and what of it is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotplugRam {
    boot: u64,
    hotplug: u64,
    base: u64,
    block: u64,
    slots: usize,
    added: u64,
    used: usize,
}

fn align_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl HotplugRam {
    /// The area for a VM of `boot` bytes of RAM that may grow by `hotplug` bytes, in blocks of
    /// [`MEMORY_BLOCK`] (or of the huge page, if larger); None if not even one block fits.
    pub fn new(boot: u64, hotplug: u64, hugepage: Option<u64>) -> Option<Self> {
        let block = hugepage.map_or(MEMORY_BLOCK, |p| p.max(MEMORY_BLOCK));
        let slots = usize::try_from(hotplug / block)
            .unwrap_or(usize::MAX)
            .min(MAX_MEMORY_SLOTS);
        if slots == 0 {
            return None;
        }
        let ram_end = ram_ranges(boot)
            .last()
            .map_or(0, |(start, len)| start.0 + len);
        Some(HotplugRam {
            boot,
            hotplug,
            base: align_up(ram_end.max(MMIO_GAP_END), block),
            block,
            slots,
            added: 0,
            used: 0,
        })
    }

    /// ACPI memory slots (the DSDT's memory devices).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// First address of the area.
    pub fn base(&self) -> GuestAddress {
        GuestAddress(self.base)
    }

    /// RAM the VM has now: at boot and hot-added.
    pub fn current(&self) -> u64 {
        self.boot + self.added
    }

    /// RAM hot-added so far.
    pub fn added(&self) -> u64 {
        self.added
    }

    /// The most RAM the VM may have.
    pub fn limit(&self) -> u64 {
        self.boot.saturating_add(self.hotplug)
    }

    /// The region that brings the VM to `desired` bytes of RAM, or None if it has that
    /// much already (a smaller size is ignored: memory is never taken back).
    pub fn plan(&self, desired: u64) -> Result<Option<HotplugRegion>, MemoryHotplugError> {
        if desired <= self.current() {
            return Ok(None);
        }
        let added = desired - self.current();
        if desired > self.limit() {
            return Err(MemoryHotplugError::OverLimit {
                desired,
                limit: self.limit(),
                boot: self.boot,
                hotplug: self.hotplug,
            });
        }
        if added % self.block != 0 {
            return Err(MemoryHotplugError::Unaligned {
                desired,
                added,
                block: self.block,
            });
        }
        if self.used >= self.slots {
            return Err(MemoryHotplugError::NoSlot(self.slots));
        }
        Ok(Some(HotplugRegion {
            slot: self.used,
            start: GuestAddress(self.base + self.added),
            len: added,
        }))
    }

    /// `region` (from [`HotplugRam::plan`]) is now guest memory.
    pub fn commit(&mut self, region: &HotplugRegion) {
        self.added += region.len;
        self.used = region.slot + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn regions_follow_each_other_above_4g_up_to_the_limit() {
        let mut ram = HotplugRam::new(256 * MIB, GIB, None).unwrap();
        assert_eq!((ram.slots(), ram.base().0), (8, 4 * GIB));
        assert_eq!(ram.plan(256 * MIB), Ok(None));
        assert_eq!(ram.plan(128 * MIB), Ok(None), "shrinking is ignored");
        let first = ram.plan(512 * MIB).unwrap().unwrap();
        assert_eq!(
            first,
            HotplugRegion {
                slot: 0,
                start: GuestAddress(4 * GIB),
                len: 256 * MIB
            }
        );
        ram.commit(&first);
        assert_eq!(ram.current(), 512 * MIB);
        let second = ram.plan(640 * MIB).unwrap().unwrap();
        assert_eq!((second.slot, second.start.0), (1, 4 * GIB + 256 * MIB));
        assert_eq!(
            ram.plan(600 * MIB),
            Err(MemoryHotplugError::Unaligned {
                desired: 600 * MIB,
                added: 88 * MIB,
                block: MEMORY_BLOCK
            })
        );
        let over = ram.plan(1280 * MIB + 128 * MIB).unwrap_err();
        assert!(over.to_string().contains("limit of 1342177280"), "{over}");
        assert!(ram.plan(1280 * MIB).unwrap().is_some(), "the limit itself");
    }

    #[test]
    fn the_area_starts_after_ram_above_the_gap_and_slots_run_out() {
        // 3.5 GiB: 3 GiB below the gap, 512 MiB from 4 GiB; the area starts at 4.5 GiB.
        let ram = HotplugRam::new(3 * GIB + 512 * MIB, GIB, None).unwrap();
        assert_eq!(ram.base().0, 4 * GIB + 512 * MIB);
        // 1 GiB pages: 1 GiB blocks, the area on a 1 GiB boundary.
        let huge = HotplugRam::new(3 * GIB + 512 * MIB, 4 * GIB, Some(GIB)).unwrap();
        assert_eq!((huge.base().0, huge.slots()), (5 * GIB, 4));
        assert!(HotplugRam::new(256 * MIB, 64 * MIB, None).is_none());
        // A client's absurd hotplug_size saturates: the limit, not an overflow.
        let huge = HotplugRam::new(256 * MIB, u64::MAX, None).unwrap();
        assert_eq!(huge.limit(), u64::MAX);
        assert!(huge.plan(u64::MAX).is_err(), "not whole blocks");
        let mut ram = HotplugRam::new(256 * MIB, 64 * GIB, None).unwrap();
        assert_eq!(ram.slots(), MAX_MEMORY_SLOTS);
        for _ in 0..MAX_MEMORY_SLOTS {
            let r = ram.plan(ram.current() + MEMORY_BLOCK).unwrap().unwrap();
            ram.commit(&r);
        }
        let full = ram.plan(ram.current() + MEMORY_BLOCK).unwrap_err();
        assert_eq!(full, MemoryHotplugError::NoSlot(MAX_MEMORY_SLOTS));
    }
}
