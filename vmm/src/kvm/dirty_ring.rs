//! KVM's dirty ring (`KVM_CAP_DIRTY_LOG_RING_ACQ_REL`, or the plain one): one ring of
//! `{flags, slot, offset}` entries per vCPU, where KVM pushes each page the vCPU dirties in
//! a slot that logs (`KVM_MEM_LOG_DIRTY_PAGES`), instead of the per-slot bitmap. Enabled on
//! the VM before its vCPUs are made; it costs [`RING_ENTRIES`] x 16 bytes of kernel memory
//! per vCPU and logs nothing until a slot logs, so nothing changes on the exit path when not
//! migrating. Each vCPU's ring is mapped ([`VcpuRing`]) only when a migration first starts
//! tracking.
//!
//! Harvest ([`VcpuRing::harvest`]): from the reader's fetch index, an entry whose flags say
//! DIRTY (acquire load) is claimed by advancing the fetch index with a compare-and-swap, its
//! page marked ([`Marks`]), its flags set to RESET (release store); then `KVM_RESET_DIRTY_RINGS`
//! ([`reset`]) hands the reset entries back to KVM and write-protects their pages again. The
//! claim lets two harvesters share a ring without a lock: the migration thread (each dirty
//! pass) and the vCPU itself, on `KVM_EXIT_DIRTY_RING_FULL`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use kvm_bindings::{
    kvm_dirty_gfn, kvm_enable_cap, KVM_CAP_DIRTY_LOG_RING, KVM_CAP_DIRTY_LOG_RING_ACQ_REL,
    KVM_DIRTY_LOG_PAGE_OFFSET,
};
use kvm_ioctls::{Kvm, VmFd};
use vmm_sys_util::ioctl_io_nr;

use super::KvmError;

/// Entries per vCPU ring: 4096 x 16 bytes = 64 KiB of kernel memory per vCPU.
pub const RING_ENTRIES: u32 = 4096;

/// The entry holds a page KVM dirtied (KVM sets it).
const F_DIRTY: u32 = 1;
/// The reader harvested the entry (the reader sets it; `KVM_RESET_DIRTY_RINGS` clears it).
const F_RESET: u32 = 2;

ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, kvm_bindings::KVMIO, 0xc7);

/// Which dirty ring capability KVM offers, if any: the acquire/release one first.
pub fn offered(kvm: &Kvm) -> Option<u32> {
    [KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_CAP_DIRTY_LOG_RING]
        .into_iter()
        .find(|&cap| kvm.check_extension_raw(u64::from(cap)) > 0)
}

/// Turns the dirty ring (capability `cap`, from [`offered`]) on for `vm`, which has no vCPU
/// yet: [`RING_ENTRIES`] entries per vCPU, or fewer if KVM allows less.
pub fn enable(kvm: &Kvm, vm: &VmFd, cap: u32) -> Result<u32, KvmError> {
    let most = kvm.check_extension_raw(u64::from(cap)).max(0) as u64;
    let entry = std::mem::size_of::<kvm_dirty_gfn>() as u64;
    let entries = u64::from(RING_ENTRIES).min(most / entry) as u32;
    let mut enable = kvm_enable_cap {
        cap,
        ..Default::default()
    };
    enable.args[0] = u64::from(entries) * entry;
    vm.enable_cap(&enable)
        .map_err(|e| KvmError::Ioctl("KVM_ENABLE_CAP(DIRTY_LOG_RING)", e))?;
    Ok(entries)
}

/// `KVM_RESET_DIRTY_RINGS`: hands every harvested (RESET) entry of every vCPU's ring back to
/// KVM, which write-protects their pages again. Returns how many it reset.
pub fn reset(vm: &VmFd) -> Result<u32, KvmError> {
    // SAFETY: an ioctl without argument on the VM fd; it touches no memory of this process
    // other than the rings KVM itself mapped.
    let n = unsafe { vmm_sys_util::ioctl::ioctl(vm, KVM_RESET_DIRTY_RINGS()) };
    if n < 0 {
        return Err(KvmError::Ioctl(
            "KVM_RESET_DIRTY_RINGS",
            kvm_ioctls::Error::last(),
        ));
    }
    Ok(n as u32)
}

/// The pages the vCPUs dirtied, one atomic bitmap per memory slot (a bit per page), set by
/// whichever thread harvests a ring and taken (swapped to zero) by the migration's passes.
/// A slot's bitmap is made when tracking starts ([`Marks::prepare`]); it stays for the VM's
/// life (a bit per 4 KiB page: 16 KiB for 512 MiB).
#[derive(Default)]
pub struct Marks {
    slots: Vec<OnceLock<Box<[AtomicU64]>>>,
    /// Entries naming a slot or page outside what was prepared (not expected from KVM):
    /// counted and dropped.
    pub stray: AtomicU64,
}

impl Marks {
    /// Room for slots `0..slots`.
    pub fn new(slots: usize) -> Self {
        Marks {
            slots: (0..slots).map(|_| OnceLock::new()).collect(),
            stray: AtomicU64::new(0),
        }
    }

    /// Makes slot `slot`'s bitmap for `pages` pages, if not made yet (its size never changes:
    /// memory regions are never removed). Returns false for a slot beyond room.
    pub fn prepare(&self, slot: u32, pages: u64) -> bool {
        let Some(cell) = self.slots.get(slot as usize) else {
            return false;
        };
        cell.get_or_init(|| (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect());
        true
    }

    /// Marks page `page` of slot `slot` (KVM's `slot` field: address space in the high 16
    /// bits, always 0 here).
    pub fn mark(&self, slot: u32, page: u64) {
        let words = self.slots.get(slot as usize).and_then(OnceLock::get);
        match words.and_then(|w| w.get((page / 64) as usize)) {
            Some(word) => {
                word.fetch_or(1 << (page % 64), Ordering::Relaxed);
            }
            None => {
                self.stray.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Slot `slot`'s marks since the last take, as a bitmap of 64 pages a word, cleared.
    pub fn take(&self, slot: u32) -> Vec<u64> {
        let words = self.slots.get(slot as usize).and_then(OnceLock::get);
        words.map_or_else(Vec::new, |w| {
            w.iter().map(|x| x.swap(0, Ordering::Relaxed)).collect()
        })
    }
}

/// One vCPU's ring as this process sees it: mapped once tracking starts, read from its fetch
/// index. Shared between the migration thread and the vCPU's own thread (see the module).
pub struct VcpuRing {
    /// A duplicate of the vCPU's fd, to map the ring from any thread.
    fd: OwnedFd,
    entries: u32,
    view: OnceLock<RingView>,
}

impl VcpuRing {
    /// The ring of the vCPU whose fd is `fd` (a duplicate), `entries` long; not mapped yet.
    pub fn new(fd: OwnedFd, entries: u32) -> Self {
        VcpuRing {
            fd,
            entries,
            view: OnceLock::new(),
        }
    }

    /// Maps the ring if it is not yet (the first tracking start, or a vCPU whose ring filled
    /// before: never otherwise, so an unused ring costs this process nothing).
    pub fn map(&self) -> Result<&RingView, KvmError> {
        if let Some(v) = self.view.get() {
            return Ok(v);
        }
        let view = RingView::map(&self.fd, self.entries)?;
        // Another thread may have mapped it meanwhile: then this mapping is dropped.
        Ok(self.view.get_or_init(|| view))
    }

    /// Harvests the ring into `marks` (mapping it first if need be); returns the entries taken.
    pub fn harvest(&self, marks: &Marks) -> Result<u32, KvmError> {
        Ok(self.map()?.harvest(|slot, page| marks.mark(slot, page)))
    }
}

/// A ring's entries in memory and the reader's fetch index.
pub struct RingView {
    base: NonNull<kvm_dirty_gfn>,
    entries: u32,
    fetch: AtomicU32,
    /// The mapping's length, unmapped on drop; 0 for memory the caller owns (tests).
    mapped: usize,
}

// SAFETY: the entries are shared with KVM by design: `flags` is only accessed atomically, the
// other fields only read once DIRTY was seen with acquire ordering, and an entry is claimed by
// exactly one harvester (the compare-and-swap of `fetch`) before it writes RESET.
unsafe impl Send for RingView {}
// SAFETY: as above.
unsafe impl Sync for RingView {}

impl RingView {
    fn map(fd: &OwnedFd, entries: u32) -> Result<Self, KvmError> {
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as libc::off_t;
        let len = entries as usize * std::mem::size_of::<kvm_dirty_gfn>();
        // SAFETY: a fresh shared mapping of the vCPU fd at the offset KVM documents for its
        // dirty ring, of the ring's size; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                libc::off_t::from(KVM_DIRTY_LOG_PAGE_OFFSET) * page,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(KvmError::Ring(std::io::Error::last_os_error()));
        }
        let base = NonNull::new(addr.cast())
            .ok_or(KvmError::Ring(std::io::Error::other("null mapping")))?;
        Ok(RingView {
            base,
            entries,
            fetch: AtomicU32::new(0),
            mapped: len,
        })
    }

    /// A ring over `entries` (a power of two of them) the caller keeps alive and in place for
    /// as long as the view is used: the walker's tests.
    ///
    /// # Safety
    /// `entries` must outlive the view and not move.
    #[cfg(test)]
    pub(crate) unsafe fn over(entries: &mut [kvm_dirty_gfn]) -> Self {
        RingView {
            base: NonNull::new(entries.as_mut_ptr()).expect("a slice's pointer"),
            entries: entries.len() as u32,
            fetch: AtomicU32::new(0),
            mapped: 0,
        }
    }

    fn flags(&self, i: u32) -> &AtomicU32 {
        let entry = self.entry(i);
        // SAFETY: `flags` is the entry's first field, a naturally aligned u32 in the live ring,
        // which KVM and the harvesters access only atomically.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*entry).flags)) }
    }

    fn entry(&self, i: u32) -> *mut kvm_dirty_gfn {
        // SAFETY: the index is reduced modulo the ring's (power of two) length.
        unsafe { self.base.as_ptr().add((i & (self.entries - 1)) as usize) }
    }

    /// Walks the ring from the fetch index while entries are DIRTY, calling `mark(slot, page)`
    /// for each one claimed and setting it RESET; returns how many were claimed.
    pub fn harvest(&self, mut mark: impl FnMut(u32, u64)) -> u32 {
        let mut taken = 0;
        // At most one lap: KVM never has more than the ring's length outstanding.
        while taken < self.entries {
            let i = self.fetch.load(Ordering::Acquire);
            let flags = self.flags(i);
            if flags.load(Ordering::Acquire) & F_DIRTY == 0 {
                break;
            }
            let entry = self.entry(i);
            // SAFETY: DIRTY was seen with acquire ordering, so KVM's writes of `slot` and
            // `offset` are visible; KVM does not touch the entry again until it is reset.
            let (slot, page) = unsafe {
                (
                    std::ptr::read_volatile(std::ptr::addr_of!((*entry).slot)),
                    std::ptr::read_volatile(std::ptr::addr_of!((*entry).offset)),
                )
            };
            let next = i.wrapping_add(1);
            if self
                .fetch
                .compare_exchange(i, next, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue; // The other harvester claimed it.
            }
            mark(slot, page);
            flags.store(F_RESET, Ordering::Release);
            taken += 1;
        }
        taken
    }
}

impl Drop for RingView {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: the mapping was made by `map` with this length and nothing refers to it
            // once the view is dropped.
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
        }
    }
}

#[cfg(test)]
mod tests;
