//! The coalesced MMIO/PIO ring of a vCPU, mapped by exitless itself so it can be drained while
//! the current exit's data (which borrows the `VcpuFd`) is still alive: entries the guest wrote
//! before an exit must reach their devices before that exit is handled.

use std::os::fd::AsRawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, Ordering};
use std::sync::{Mutex, MutexGuard};

use kvm_bindings::{kvm_coalesced_mmio, kvm_coalesced_mmio_ring, KVM_COALESCED_MMIO_PAGE_OFFSET};
use kvm_ioctls::VcpuFd;

use super::KvmError;

/// One write the guest made into a coalesced zone, as the ring recorded it.
///
/// One of the lab's entry points (the coalesced ring's fuzz target).
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

    /// Decodes one ring entry (any length or flag a guest can make KVM record).
    pub fn from_entry(entry: &kvm_coalesced_mmio) -> Self {
        // SAFETY: the union holds `pio` (u32) or `padding` (u32) at the same place; any bit
        // pattern is a valid u32, and KVM zeroes it for MMIO entries.
        let pio = unsafe { entry.__bindgen_anon_1.pio != 0 };
        let len = (entry.len as usize).min(entry.data.len());
        CoalescedWrite::new(pio, entry.phys_addr, &entry.data[..len])
    }
}

/// KVM's coalesced ring of a VM (one per VM, shared by its vCPUs), mapped once.
///
/// Any vCPU may find it non-empty on a userspace exit; one drains at a time. A vCPU whose ring
/// looks empty takes no lock and writes nothing shared; one that finds entries takes the drain
/// lock, so it waits only while another vCPU is delivering. An entry's slot is handed back to
/// KVM only after the entry reached its device, so a vCPU that sees the ring empty knows every
/// write queued before its exit has been delivered.
#[derive(Debug)]
pub struct CoalescedRing {
    page: NonNull<kvm_coalesced_mmio_ring>,
    page_size: usize,
    entries: u32,
    drainer: Mutex<()>,
    /// Whether `page` is exitless's own mapping (unmapped on drop).
    mapped: bool,
}

// SAFETY: the ring page is shared with KVM by design; every access is volatile, and `first`
// (the reader's index) is written only by the thread holding `drainer`.
unsafe impl Send for CoalescedRing {}
// SAFETY: as above.
unsafe impl Sync for CoalescedRing {}

impl CoalescedRing {
    /// Maps the ring page of `fd` (KVM_CAP_COALESCED_MMIO must be present): any vCPU of the VM
    /// gives the same ring.
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
        Ok(Self::over(page, page_size, true))
    }

    fn over(page: NonNull<kvm_coalesced_mmio_ring>, page_size: usize, mapped: bool) -> Self {
        let header = std::mem::size_of::<kvm_coalesced_mmio_ring>();
        let entries = ((page_size - header) / std::mem::size_of::<kvm_coalesced_mmio>()) as u32;
        CoalescedRing {
            page,
            page_size,
            entries,
            drainer: Mutex::new(()),
            mapped,
        }
    }

    /// The reader's and KVM's indexes.
    fn indexes(&self) -> (u32, u32) {
        let ring = self.page.as_ptr();
        // SAFETY: `ring` points at the live ring page; `first` and `last` are plain u32 fields
        // that KVM and the reader update concurrently, hence volatile accesses.
        unsafe {
            (
                ptr::read_volatile(ptr::addr_of!((*ring).first)),
                ptr::read_volatile(ptr::addr_of!((*ring).last)),
            )
        }
    }

    /// Whether no write is queued or being delivered (reads only).
    pub fn is_empty(&self) -> bool {
        let (first, last) = self.indexes();
        first == last
    }

    /// Takes every queued write, oldest first, as the only drainer; None (and no lock taken)
    /// when the ring is empty. Each write's slot goes back to KVM when the next is taken or
    /// the drain is dropped, i.e. after the caller delivered it.
    pub fn drain(&self) -> Option<RingDrain<'_>> {
        if self.is_empty() {
            return None;
        }
        let guard = self.drainer.lock().unwrap_or_else(|p| p.into_inner());
        Some(RingDrain {
            ring: self,
            _guard: guard,
            taken: None,
        })
    }

    /// The entry at `first`, if KVM filled it.
    fn peek(&self) -> Option<(u32, CoalescedWrite)> {
        let (first, last) = self.indexes();
        if first == last || first >= self.entries {
            return None;
        }
        // Pairs with KVM's write barrier between filling an entry and advancing `last`.
        fence(Ordering::Acquire);
        // SAFETY: `first < entries`, so the entry lies inside the mapped page, right after the
        // 8-byte header; it is plain data that KVM finished writing before advancing `last`.
        let entry = unsafe {
            let base = self
                .page
                .as_ptr()
                .cast::<u8>()
                .add(std::mem::size_of::<kvm_coalesced_mmio_ring>());
            ptr::read_volatile(base.cast::<kvm_coalesced_mmio>().add(first as usize))
        };
        Some((first, CoalescedWrite::from_entry(&entry)))
    }

    /// Hands slot `first` back to KVM (the drain lock is held).
    fn release(&self, first: u32) {
        // The entry was copied out and delivered before its slot is reused.
        fence(Ordering::Release);
        // SAFETY: as in `indexes`; only the drain lock's holder writes `first`.
        unsafe {
            ptr::write_volatile(
                ptr::addr_of_mut!((*self.page.as_ptr()).first),
                (first + 1) % self.entries,
            )
        };
    }
}

/// A drain in progress: the only one, until dropped.
pub struct RingDrain<'a> {
    ring: &'a CoalescedRing,
    _guard: MutexGuard<'a, ()>,
    /// The slot of the write handed out last, released when the next is taken.
    taken: Option<u32>,
}

impl Iterator for RingDrain<'_> {
    type Item = CoalescedWrite;

    fn next(&mut self) -> Option<CoalescedWrite> {
        if let Some(slot) = self.taken.take() {
            self.ring.release(slot);
        }
        let (slot, write) = self.ring.peek()?;
        self.taken = Some(slot);
        Some(write)
    }
}

impl Drop for RingDrain<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.taken.take() {
            self.ring.release(slot);
        }
    }
}

impl Drop for CoalescedRing {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: unmaps exactly the page `map` mapped; nothing refers to it afterwards.
            unsafe { libc::munmap(self.page.as_ptr().cast(), self.page_size) };
        }
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

    /// A ring page on the heap, filled by a thread that plays KVM.
    struct FakeRing {
        ring: CoalescedRing,
        layout: std::alloc::Layout,
    }

    impl FakeRing {
        fn new() -> Self {
            let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
            // SAFETY: a non-zero-sized layout; the page is freed in `drop`, after the ring.
            let page = unsafe { std::alloc::alloc_zeroed(layout) };
            let ring = CoalescedRing::over(NonNull::new(page.cast()).unwrap(), 4096, false);
            FakeRing { ring, layout }
        }

        /// KVM's side: appends a write of `value` at `addr` unless the ring is full.
        fn push(&self, addr: u64, value: u32) -> bool {
            let (first, last) = self.ring.indexes();
            let next = (last + 1) % self.ring.entries;
            if next == first {
                return false;
            }
            let entry = kvm_coalesced_mmio {
                phys_addr: addr,
                len: 4,
                data: u64::from(value).to_le_bytes(),
                ..Default::default()
            };
            let page = self.ring.page.as_ptr();
            // SAFETY: `last < entries`: the slot is inside the page, and KVM's side alone
            // writes slots between `last` and `first` and the `last` index.
            unsafe {
                let base = page
                    .cast::<u8>()
                    .add(std::mem::size_of::<kvm_coalesced_mmio_ring>());
                ptr::write_volatile(base.cast::<kvm_coalesced_mmio>().add(last as usize), entry);
                fence(Ordering::Release);
                ptr::write_volatile(ptr::addr_of_mut!((*page).last), next);
            }
            true
        }
    }

    impl Drop for FakeRing {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; the ring does not unmap it.
            unsafe { std::alloc::dealloc(self.ring.page.as_ptr().cast(), self.layout) };
        }
    }

    /// Two drainers race one producer: every write is delivered once, in the ring's order, and
    /// a drainer that sees the ring empty finds every write published before delivered.
    #[test]
    fn concurrent_drainers_deliver_each_write_once_in_order() {
        use std::sync::atomic::AtomicU64;
        const WRITES: u64 = 100_000;
        let fake = FakeRing::new();
        let published = AtomicU64::new(0);
        let delivered = Mutex::new(Vec::with_capacity(WRITES as usize));
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in 0..WRITES {
                    while !fake.push(0xd000_0000, n as u32) {
                        std::hint::spin_loop();
                    }
                    published.store(n + 1, Ordering::Release);
                }
            });
            for _ in 0..2 {
                s.spawn(|| loop {
                    let before = published.load(Ordering::Acquire);
                    match fake.ring.drain() {
                        Some(drain) => drain.for_each(|w| {
                            // A device that takes a while: the window in which a slot
                            // handed back too early would show as an empty ring.
                            (0..100).for_each(|_| std::hint::spin_loop());
                            let value = u32::from_le_bytes(w.data().try_into().unwrap());
                            delivered.lock().unwrap().push(u64::from(value));
                        }),
                        None => {
                            let got = delivered.lock().unwrap().len() as u64;
                            assert!(got >= before, "ring empty with {got} of {before} delivered");
                            if got >= WRITES {
                                break;
                            }
                        }
                    }
                });
            }
        });
        let delivered = delivered.into_inner().unwrap();
        assert_eq!(delivered.len() as u64, WRITES);
        assert!(
            delivered.iter().copied().eq(0..WRITES),
            "out of order or duplicated"
        );
    }
}
