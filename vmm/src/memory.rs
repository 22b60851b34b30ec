//! Guest physical memory: layout constants and the mmap-backed guest memory.

use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Start of the MMIO gap below 4 GiB (3 GiB): no RAM is placed between this and 4 GiB.
pub const MMIO_GAP_START: u64 = 0xC000_0000;
/// End of the MMIO gap (4 GiB).
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// Window in the MMIO gap from which the VMM assigns PCI memory BARs (32-bit addresses).
pub const PCI_MMIO_START: u64 = 0xC000_0000;
/// Size of the PCI BAR window (256 MiB; the bench guest's own MMIO target sits above it).
pub const PCI_MMIO_SIZE: u64 = 0x1000_0000;
/// PCI Express ECAM (MMCONFIG) for bus 0: 32 devices x 8 functions x 4 KiB.
pub const PCI_ECAM_START: u64 = 0xE000_0000;
/// Size of the ECAM range (bus 0 only).
pub const PCI_ECAM_SIZE: u64 = 0x10_0000;
/// First I/O port of PCI configuration mechanism #1 (0xCF8 address, 0xCFC data).
pub const PCI_CONFIG_PORT: u64 = 0xCF8;
/// Number of ports of PCI configuration mechanism #1.
pub const PCI_CONFIG_PORT_LEN: u64 = 8;
const _: () = assert!(PCI_MMIO_START >= MMIO_GAP_START);
const _: () = assert!(PCI_MMIO_START + PCI_MMIO_SIZE <= PCI_ECAM_START);
const _: () = assert!(PCI_ECAM_START + PCI_ECAM_SIZE <= 0xFEC0_0000);
/// Smallest guest memory exitless accepts.
pub const MIN_MEMORY: u64 = 16 << 20;

/// Errors creating guest memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("Memory size {0} bytes is below the minimum of {MIN_MEMORY} bytes")]
    TooSmall(u64),
    #[error("Memory size {0} bytes is not a multiple of 4 KiB")]
    Unaligned(u64),
    #[error("Cannot map guest memory: {0}")]
    Mmap(#[from] vm_memory::mmap::FromRangesError),
}

/// The RAM ranges (start, length) for `size` bytes of guest memory, split around the MMIO gap.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, u64)> {
    if size <= MMIO_GAP_START {
        vec![(GuestAddress(0), size)]
    } else {
        vec![
            (GuestAddress(0), MMIO_GAP_START),
            (GuestAddress(MMIO_GAP_END), size - MMIO_GAP_START),
        ]
    }
}

/// Allocates `size` bytes of anonymous guest memory laid out by [`ram_ranges`].
pub fn create_guest_memory(size: u64) -> Result<GuestMemoryMmap, MemoryError> {
    if size < MIN_MEMORY {
        return Err(MemoryError::TooSmall(size));
    }
    if size % 4096 != 0 {
        return Err(MemoryError::Unaligned(size));
    }
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(size)
        .into_iter()
        .map(|(a, l)| (a, l as usize))
        .collect();
    Ok(GuestMemoryMmap::from_ranges(&ranges)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_memory_is_one_range() {
        assert_eq!(ram_ranges(256 << 20), vec![(GuestAddress(0), 256 << 20)]);
    }

    #[test]
    fn large_memory_skips_the_mmio_gap() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), MMIO_GAP_START));
        assert_eq!(
            r[1],
            (GuestAddress(MMIO_GAP_END), (4 << 30) - MMIO_GAP_START)
        );
    }

    #[test]
    fn too_small_is_an_error() {
        assert!(matches!(
            create_guest_memory(1 << 20),
            Err(MemoryError::TooSmall(_))
        ));
    }
}
