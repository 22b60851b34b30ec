//! KVM's dirty page log (the bitmap: `KVM_MEM_LOG_DIRTY_PAGES` on a slot, read with
//! `KVM_GET_DIRTY_LOG`), for a migration's dirty passes where there is no dirty ring
//! (`kvm/dirty_ring.rs`) or the bitmap is asked for. Off unless migrating: a slot with the
//! flag makes the guest's first write to each page after a read of the log a fault KVM
//! handles, so nothing is added to the exit path otherwise.
//!
//! With `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` ([`enable_manual_protect`]) a read no longer
//! clears the log nor write-protects every page of the slot: [`take`] then clears
//! (`KVM_CLEAR_DIRTY_LOG`) only the pages it read, chunk by chunk, which write-protects just
//! those. With `KVM_DIRTY_LOG_INITIALLY_SET` too, turning the log on write-protects nothing
//! (every bit starts set): the first read reports every page and its clears protect them.

use std::sync::atomic::{AtomicU8, Ordering};

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, kvm_userspace_memory_region,
    KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, KVM_DIRTY_LOG_INITIALLY_SET,
    KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE, KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::{Kvm, VmFd};
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

/// Pages a `KVM_CLEAR_DIRTY_LOG` covers at most (64 MiB): the pages are write-protected
/// again one chunk at a time, each under KVM's MMU lock briefly, not the whole slot at once.
const CLEAR_CHUNK: usize = 16384;

vmm_sys_util::ioctl_iowr_nr!(
    KVM_CLEAR_DIRTY_LOG,
    kvm_bindings::KVMIO,
    0xc0,
    kvm_clear_dirty_log
);

/// How a VM's log is read: plain (a read clears and write-protects the whole slot) or with
/// manual protect (`flags`: KVM's, enabled).
#[derive(Debug, Default)]
pub struct Protect {
    /// 0: not asked yet; 1: plain; 2 + flags: manual with those flags.
    state: AtomicU8,
}

impl Protect {
    /// Manual protect's flags, once enabled ([`enable_manual_protect`]).
    pub fn manual(&self) -> Option<u32> {
        match self.state.load(Ordering::Acquire) {
            0 | 1 => None,
            s => Some(u32::from(s - 2)),
        }
    }
}

/// Turns manual protect on for `vm` if KVM offers it (with `KVM_DIRTY_LOG_INITIALLY_SET` when
/// offered), once: before the first slot logs. Returns the flags enabled, if any.
pub fn enable_manual_protect(kvm: &Kvm, vm: &VmFd, protect: &Protect) -> Option<u32> {
    if protect.state.load(Ordering::Acquire) == 0 {
        let offered = kvm.check_extension_raw(u64::from(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2));
        let wanted = KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET;
        let flags = offered.max(0) as u32 & wanted;
        let mut cap = kvm_enable_cap {
            cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            ..Default::default()
        };
        cap.args[0] = u64::from(flags);
        let on = flags & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE != 0 && vm.enable_cap(&cap).is_ok();
        let state = if on { 2 + flags as u8 } else { 1 };
        protect.state.store(state, Ordering::Release);
    }
    protect.manual()
}

/// The pages of slot `slot` (`len` bytes) written since the log was last taken, as a bitmap
/// of 64 pages a word; taking clears them (with manual protect, only the pages read, per
/// chunk).
pub fn take(vm: &VmFd, slot: u32, len: u64, protect: &Protect) -> Result<Vec<u64>, KvmError> {
    let bitmap = vm
        .get_dirty_log(slot, len as usize)
        .map_err(|e| KvmError::Ioctl("KVM_GET_DIRTY_LOG", e))?;
    if protect.manual().is_some() {
        let pages = len.div_ceil(PAGE);
        for (first, words) in chunks(&bitmap, CLEAR_CHUNK / 64) {
            clear(vm, slot, first, words, pages)?;
        }
    }
    Ok(bitmap)
}

/// The chunks of `bitmap` (`words` words each) with a set bit, as (first page, words).
fn chunks(bitmap: &[u64], words: usize) -> impl Iterator<Item = (u64, &[u64])> {
    bitmap
        .chunks(words)
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&w| w != 0))
        .map(move |(i, c)| ((i * words * 64) as u64, c))
}

/// `KVM_CLEAR_DIRTY_LOG` of the set bits of `words`, from page `first` (a multiple of 64) of
/// slot `slot` (`pages` long): write-protects those pages again.
fn clear(vm: &VmFd, slot: u32, first: u64, words: &[u64], pages: u64) -> Result<(), KvmError> {
    let mut words = words.to_vec();
    let req = kvm_clear_dirty_log {
        slot,
        num_pages: (words.len() as u64 * 64).min(pages - first) as u32,
        first_page: first,
        __bindgen_anon_1: kvm_bindings::kvm_clear_dirty_log__bindgen_ty_1 {
            dirty_bitmap: words.as_mut_ptr().cast(),
        },
    };
    // SAFETY: the request names a bitmap of `num_pages` bits that lives across the call;
    // KVM only reads it.
    let r = unsafe { vmm_sys_util::ioctl::ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &req) };
    if r < 0 {
        return Err(KvmError::Ioctl(
            "KVM_CLEAR_DIRTY_LOG",
            kvm_ioctls::Error::last(),
        ));
    }
    Ok(())
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

    #[test]
    fn only_chunks_with_pages_read_are_cleared() {
        let bitmap = [0, 1, 0, 0, 1 << 63];
        let got: Vec<(u64, usize)> = chunks(&bitmap, 2).map(|(f, w)| (f, w.len())).collect();
        assert_eq!(got, [(0, 2), (256, 1)]);
    }
}
