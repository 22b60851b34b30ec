//! The coalesced MMIO/PIO ring of a vCPU, mapped by exitless itself so it can be drained while
//! the current exit's data (which borrows the `VcpuFd`) is still alive: entries the guest wrote
//! before an exit must reach their devices before that exit is handled.

use std::os::fd::AsRawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, Ordering};

use kvm_bindings::{kvm_coalesced_mmio, kvm_coalesced_mmio_ring, KVM_COALESCED_MMIO_PAGE_OFFSET};
use kvm_ioctls::VcpuFd;

use super::KvmError;

/// One write the guest made into a coalesced zone, as the ring recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalescedWrite {
    /// A port write (KVM_CAP_COALESCED_PIO) rather than MMIO.
    pub pio: bool,
    /// Guest physical address or port.
    pub addr: u64,
    len: u8,
    data: [u8; 8],
}

impl CoalescedWrite {
    /// A write of `data` (at most 8 bytes are kept, as in KVM's ring).
    pub fn new(pio: bool, addr: u64, data: &[u8]) -> Self {
        let len = data.len().min(8);
        let mut bytes = [0; 8];
        bytes[..len].copy_from_slice(&data[..len]);
        CoalescedWrite {
            pio,
            addr,
            len: len as u8,
            data: bytes,
        }
    }

    /// The bytes written.
    pub fn data(&self) -> &[u8] {
        &self.data[..usize::from(self.len)]
    }

    fn from_entry(entry: &kvm_coalesced_mmio) -> Self {
        // SAFETY: the union holds `pio` (u32) or `padding` (u32) at the same place; any bit
        // pattern is a valid u32, and KVM zeroes it for MMIO entries.
        let pio = unsafe { entry.__bindgen_anon_1.pio != 0 };
        let len = (entry.len as usize).min(entry.data.len());
        CoalescedWrite::new(pio, entry.phys_addr, &entry.data[..len])
    }
}

/// One vCPU's mapping of KVM's coalesced ring (shared by all vCPUs of the VM).
#[derive(Debug)]
pub struct CoalescedRing {
    page: NonNull<kvm_coalesced_mmio_ring>,
    page_size: usize,
    entries: u32,
}

// SAFETY: the mapping belongs to this value alone; the ring protocol (KVM produces at `last`,
// the reader consumes at `first`) holds whichever thread the reader runs on.
unsafe impl Send for CoalescedRing {}

impl CoalescedRing {
    /// Maps the ring page of `fd` (KVM_CAP_COALESCED_MMIO must be present).
    pub fn map(fd: &VcpuFd) -> Result<Self, KvmError> {
        // SAFETY: sysconf has no memory effects.
        let page_size = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            n if n > 0 => n as usize,
            _ => return Err(KvmError::Ring(std::io::Error::last_os_error())),
        };
        let offset = libc::off_t::from(KVM_COALESCED_MMIO_PAGE_OFFSET) * page_size as libc::off_t;
        // SAFETY: a fresh shared mapping of one page of the vCPU fd at the offset KVM documents
        // for the coalesced ring; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                page_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(KvmError::Ring(std::io::Error::last_os_error()));
        }
        let page = NonNull::new(addr.cast())
            .ok_or(KvmError::Ring(std::io::Error::other("null mapping")))?;
        let header = std::mem::size_of::<kvm_coalesced_mmio_ring>();
        let entries = ((page_size - header) / std::mem::size_of::<kvm_coalesced_mmio>()) as u32;
        Ok(CoalescedRing {
            page,
            page_size,
            entries,
        })
    }

    /// Takes every queued write, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = CoalescedWrite> + '_ {
        std::iter::from_fn(move || self.pop())
    }

    /// Takes the oldest write, if any.
    pub fn pop(&mut self) -> Option<CoalescedWrite> {
        let ring = self.page.as_ptr();
        // SAFETY: `ring` points at the live ring page; `first` and `last` are plain u32 fields
        // that KVM and this reader update concurrently, hence volatile accesses.
        let (first, last) = unsafe {
            (
                ptr::read_volatile(ptr::addr_of!((*ring).first)),
                ptr::read_volatile(ptr::addr_of!((*ring).last)),
            )
        };
        if first == last || first >= self.entries {
            return None;
        }
        // Pairs with KVM's write barrier between filling an entry and advancing `last`.
        fence(Ordering::Acquire);
        // SAFETY: `first < entries`, so the entry lies inside the mapped page, right after the
        // 8-byte header; it is plain data that KVM finished writing before advancing `last`.
        let entry = unsafe {
            let base = ring
                .cast::<u8>()
                .add(std::mem::size_of::<kvm_coalesced_mmio_ring>());
            ptr::read_volatile(base.cast::<kvm_coalesced_mmio>().add(first as usize))
        };
        // The entry is copied out before the slot is handed back to KVM.
        fence(Ordering::Release);
        // SAFETY: as above; only the reader writes `first`.
        unsafe {
            ptr::write_volatile(ptr::addr_of_mut!((*ring).first), (first + 1) % self.entries)
        };
        Some(CoalescedWrite::from_entry(&entry))
    }
}

impl Drop for CoalescedRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page `map` mapped; nothing refers to it afterwards.
        unsafe { libc::munmap(self.page.as_ptr().cast(), self.page_size) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_to_writes_of_their_own_length() {
        let mut entry = kvm_coalesced_mmio {
            phys_addr: 0xd000_0004,
            len: 2,
            data: [1, 2, 3, 4, 5, 6, 7, 8],
            ..Default::default()
        };
        let mmio = CoalescedWrite::from_entry(&entry);
        assert_eq!(
            (mmio.pio, mmio.addr, mmio.data()),
            (false, 0xd000_0004, &[1, 2][..])
        );
        entry.__bindgen_anon_1.pio = 1;
        entry.len = 99;
        let pio = CoalescedWrite::from_entry(&entry);
        assert!(pio.pio);
        assert_eq!(pio.data().len(), 8);
    }
}
