//! KVM's dirty page log (the bitmap: `KVM_MEM_LOG_DIRTY_PAGES` on a slot, read and cleared
//! with `KVM_GET_DIRTY_LOG`), for a migration's dirty passes. Off unless migrating: a slot
//! with the flag makes the guest's first write to each page after a read of the log a fault
//! KVM handles, so nothing is added to the exit path otherwise.

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryRegion, GuestRegionMmap};

use super::KvmError;

/// Bytes per page the log counts.
pub const PAGE: u64 = 4096;

/// Sets slot `slot` (which holds `region`) to log dirty pages, or not.
pub fn set_logging(
    vm: &VmFd,
    slot: u32,
    region: &GuestRegionMmap,
    on: bool,
) -> Result<(), KvmError> {
    let desc = kvm_userspace_memory_region {
        slot,
        flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
        guest_phys_addr: region.start_addr().0,
        memory_size: region.len(),
        userspace_addr: region.as_ptr() as u64,
    };
    // SAFETY: the slot is registered already with this very region (same address, size and
    // mapping, which the VM's memory holds for as long as the VM lives); only its flags
    // change.
    unsafe { vm.set_user_memory_region(desc) }.map_err(KvmError::Memory)
}

/// The pages of slot `slot` (`len` bytes) written since the log was last read, as a bitmap
/// of 64 pages a word; reading clears it.
pub fn take(vm: &VmFd, slot: u32, len: u64) -> Result<Vec<u64>, KvmError> {
    vm.get_dirty_log(slot, len as usize)
        .map_err(|e| KvmError::Ioctl("KVM_GET_DIRTY_LOG", e))
}

/// The runs of set bits of `bitmap` as `(first page, pages)`.
pub fn runs(bitmap: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (w, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let page = w as u64 * 64 + u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            match out.last_mut() {
                Some((first, n)) if *first + *n == page => *n += 1,
                _ => out.push((page, 1)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_adjacent_pages_across_words() {
        assert!(runs(&[0, 0]).is_empty());
        assert_eq!(runs(&[0b1011]), [(0, 2), (3, 1)]);
        assert_eq!(runs(&[1 << 63, 1]), [(63, 2)]);
        assert_eq!(runs(&[u64::MAX, u64::MAX]), [(0, 128)]);
    }
}
