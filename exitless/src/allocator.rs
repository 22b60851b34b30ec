//! The global allocator of the musl build: dlmalloc, behind a lock of ours so that the memory
//! start-up freed can be handed back once the VM runs ([`release_freed_heap`]). The `dlmalloc`
//! crate's own `GlobalDlmalloc` keeps its instance private, so nothing could ever trim it: the
//! heap start-up freed (the parsed command line, the kernel file, ACPI tables, CPUID lists)
//! stayed private dirty memory for the VM's whole life (docs/performance.md, "The lead back").
//!
//! musl's own allocator gives freed memory back with munmap at once (22-34 calls between
//! creating the VM and its first run, against 2 with dlmalloc), and in a process that holds a
//! VM each munmap runs KVM's MMU notifier and a TLB shootdown to the other CPUs: it took musl's
//! start-up gain away. dlmalloc keeps freed memory for reuse below its trim threshold. The exit
//! path allocates nothing, so the lock is never taken there.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::{Mutex, MutexGuard};

/// The one heap. std's `Mutex` is a futex word on Linux: it never allocates.
static HEAP: Mutex<dlmalloc::Dlmalloc> = Mutex::new(dlmalloc::Dlmalloc::new());

pub struct Allocator;

fn heap() -> MutexGuard<'static, dlmalloc::Dlmalloc> {
    // Nothing panics while holding it; a poisoned lock still guards a consistent heap.
    HEAP.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: every call goes to the one dlmalloc instance under its lock, with the layout the
// caller gives (GlobalAlloc's contracts are dlmalloc's malloc/free/realloc contracts).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        heap().malloc(layout.size(), layout.align())
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        heap().free(ptr, layout.size(), layout.align())
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        heap().calloc(layout.size(), layout.align())
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        heap().realloc(ptr, layout.size(), layout.align(), new_size)
    }
}

const PAGE: usize = 4096;
/// dlmalloc's own unit of growth and trim (the `dlmalloc` crate's default).
const GRANULARITY: usize = 64 * 1024;
/// Block sizes the scrub takes free memory in, largest first: a free chunk smaller than the
/// last holds at most one whole page.
const SCRUB_SIZES: [usize; 3] = [32 * 1024, 16 * 1024, 8 * 1024];
/// Bytes at a block's start left alone: the list link, and room for the free chunk's own
/// fields dlmalloc writes there when the block is freed.
const BLOCK_HEAD: usize = 64;
/// At most this many blocks taken (0.5-8 MB): a bound that a VMM heap never reaches.
const MAX_BLOCKS: usize = 256;

/// Hands back what start-up freed. First the trim: wholly free segments and the free top of
/// the newest one go back to the kernel. Then what trim cannot reach, the free chunks between
/// live ones: taken as ordinary blocks (so that dlmalloc knows them in use), the whole pages
/// inside each dropped with MADV_DONTNEED (ours while we hold them; they read as zero if
/// touched again), the blocks freed, and the heap trimmed again. A block whose pages were never
/// touched means the free memory of that size is used up (it came from the untouched top or a
/// new segment): the next, smaller size follows. Meanwhile the heap grows and trims by pages
/// instead of dlmalloc's 64 kB, so that the segment such a last block may add, and the newest
/// segment's top, go back whole. Runs once, on the launching thread, before its seccomp filter;
/// other threads wait on the lock for its few hundred microseconds.
pub fn release_freed_heap() {
    let mut heap = heap();
    heap.set_granularity(PAGE);
    // SAFETY: trim only unmaps the free top of the heap and wholly free segments.
    unsafe { heap.trim(0) };
    let mut list: *mut u8 = std::ptr::null_mut();
    let mut taken = 0;
    for size in SCRUB_SIZES {
        while taken < MAX_BLOCKS {
            // SAFETY: a plain allocation of `size` bytes (16-aligned), freed below.
            let block = unsafe { heap.c_malloc(size) };
            if block.is_null() {
                break;
            }
            // SAFETY: the block is ours, `size` bytes long.
            let resident = unsafe { drop_pages(block, size) };
            // SAFETY: the block's first 8 bytes (16-aligned) hold the link to the previous one.
            unsafe { block.cast::<*mut u8>().write(list) };
            list = block;
            taken += 1;
            if !resident {
                break;
            }
        }
    }
    while !list.is_null() {
        let block = list;
        // SAFETY: the link written above, in a block still ours.
        list = unsafe { block.cast::<*mut u8>().read() };
        // SAFETY: a c_malloc block, freed once.
        unsafe { heap.c_free(block) };
    }
    // SAFETY: as above.
    unsafe { heap.trim(0) };
    heap.set_granularity(GRANULARITY);
}

/// Drops the whole pages of the block `[block, block + size)` past its first BLOCK_HEAD bytes;
/// says whether any of them was resident (touched before).
///
/// # Safety
/// The block must be an allocation of at least `size` bytes the caller owns and does not read.
unsafe fn drop_pages(block: *mut u8, size: usize) -> bool {
    let start = (block as usize + BLOCK_HEAD).next_multiple_of(PAGE);
    let end = (block as usize + size) & !(PAGE - 1);
    if end <= start {
        return false;
    }
    let mut vec = [0u8; SCRUB_SIZES[0] / PAGE];
    let len = end - start;
    // SAFETY: [start, end) is page-aligned inside the block, and `vec` has a byte for each of
    // its pages (at most SCRUB_SIZES[0] / PAGE).
    let known = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) } == 0;
    let resident = !known || vec[..len / PAGE].iter().any(|b| b & 1 != 0);
    if resident {
        // SAFETY: the pages lie inside a block the caller owns and does not read; on private
        // anonymous memory MADV_DONTNEED makes them read as zero when touched again.
        unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }
    resident
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_blocks_keep_their_contents_and_the_heap_stays_usable() {
        // Live blocks between freed ones, as start-up leaves them.
        let mut blocks: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 12 * 1024 + i as usize]).collect();
        let live: Vec<Vec<u8>> = blocks.drain(..).step_by(2).collect();
        release_freed_heap();
        for (i, block) in live.iter().enumerate() {
            let want = (2 * i) as u8;
            assert!(block.iter().all(|&b| b == want), "block {i} changed");
        }
        let again: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i ^ 0x5a; 20 * 1024]).collect();
        for (i, block) in again.iter().enumerate() {
            assert!(block.iter().all(|&b| b == i as u8 ^ 0x5a));
        }
    }

    #[test]
    fn only_touched_pages_count_as_resident() {
        const LEN: usize = 8 * PAGE;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let base = map.cast::<u8>();
        // SAFETY: the mapping is ours and not read while its pages are dropped.
        unsafe {
            assert!(!drop_pages(base, LEN), "untouched pages");
            base.add(3 * PAGE).write(7);
            assert!(drop_pages(base, LEN), "a touched page");
            assert!(
                !drop_pages(base, LEN),
                "dropped pages are no longer resident"
            );
            assert_eq!(base.add(3 * PAGE).read(), 0, "dropped pages read as zero");
            libc::munmap(map, LEN);
        }
    }
}
