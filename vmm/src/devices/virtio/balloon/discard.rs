//! Giving guest pages back to the host. A range the guest names is checked first (page-aligned,
//! not empty, no overflow; the part outside guest RAM clipped off), then each piece is
//! discarded from the host memory behind it:
//!
//! - private memory (anonymous, or a private file mapping): `madvise(MADV_DONTNEED)`: the host
//!   frees the pages; the guest's next access finds zeros (or the file's bytes);
//! - a shared file mapping (guest RAM in a memfd, `MAP_SHARED`, so that a vhost-user back end
//!   can map it too): `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` on the file at
//!   the region's offset, which frees the pages for every process that maps it (`madvise`
//!   would only drop this process's view and keep them in the file).
//!
//! Both go through `syscall(2)`: the shipped binary is static musl with fat LTO, where a libc
//! wrapper that std also declares weak can link as NULL.

use std::os::fd::AsRawFd;

use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

/// The balloon's page: PFNs and reported ranges are in these units.
pub const PAGE_SIZE: u64 = 4096;

/// What became of one range the guest named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeOutcome {
    /// Every page of the range was discarded.
    Discarded { pages: u64 },
    /// Part of the range lay outside guest RAM; the pages inside it were discarded.
    Clipped { pages: u64 },
    /// Unaligned, empty, past the end of the address space or wholly outside guest RAM:
    /// nothing was discarded.
    Refused,
}

/// The host refused to discard a piece of guest memory.
#[derive(Debug, Error)]
pub enum DiscardError {
    #[error("madvise(MADV_DONTNEED) of guest range {addr:#x}+{len:#x} failed: {error}")]
    Madvise {
        addr: u64,
        len: u64,
        error: std::io::Error,
    },
    #[error("Punching a hole for guest range {addr:#x}+{len:#x} (file offset {offset:#x}) failed: {error}")]
    PunchHole {
        addr: u64,
        len: u64,
        offset: u64,
        error: std::io::Error,
    },
}

/// Discards the guest pages of `[addr, addr + len)` that are guest RAM.
pub fn discard_range(
    mem: &GuestMemoryMmap,
    addr: u64,
    len: u64,
) -> Result<RangeOutcome, DiscardError> {
    let aligned = addr % PAGE_SIZE == 0 && len % PAGE_SIZE == 0 && len > 0;
    let Some(end) = addr.checked_add(len).filter(|_| aligned) else {
        return Ok(RangeOutcome::Refused);
    };
    let mut inside = 0;
    for region in mem.iter() {
        let start = region.start_addr().0;
        let region_end = start + region.len();
        let (lo, hi) = (addr.max(start), end.min(region_end));
        if lo < hi {
            discard_piece(region, lo - start, hi - lo)?;
            inside += hi - lo;
        }
    }
    let pages = inside / PAGE_SIZE;
    Ok(match inside {
        0 => RangeOutcome::Refused,
        n if n == len => RangeOutcome::Discarded { pages },
        _ => RangeOutcome::Clipped { pages },
    })
}

/// Discards `len` bytes at `offset` into `region` (checked to lie inside it).
fn discard_piece(region: &GuestRegionMmap, offset: u64, len: u64) -> Result<(), DiscardError> {
    let addr = region.start_addr().0 + offset;
    let shared = region.flags() & libc::MAP_SHARED != 0;
    match region.file_offset() {
        Some(file) if shared => {
            let at = file.start() + offset;
            punch_hole(file.file(), at, len).map_err(|error| DiscardError::PunchHole {
                addr,
                len,
                offset: at,
                error,
            })
        }
        _ => {
            // SAFETY: `offset + len` lies inside the region (the caller clipped it), so the
            // pointer stays inside the region's mapping.
            let host = unsafe { region.as_ptr().add(offset as usize) };
            madvise_dontneed(host, len).map_err(|error| DiscardError::Madvise { addr, len, error })
        }
    }
}

/// `madvise(host, len, MADV_DONTNEED)`.
fn madvise_dontneed(host: *mut u8, len: u64) -> std::io::Result<()> {
    // SAFETY: `host..host + len` is guest memory mapped by this process for the VM's life;
    // dropping its pages changes only their contents (which the guest gave up), never the
    // mapping, so no Rust reference into it is invalidated.
    let r = unsafe { libc::syscall(libc::SYS_madvise, host, len as usize, libc::MADV_DONTNEED) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `fallocate(file, PUNCH_HOLE | KEEP_SIZE, offset, len)`.
fn punch_hole(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate takes an open fd and integers; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fallocate,
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::MetadataExt;
    use vm_memory::mmap::MmapRegion;
    use vm_memory::{Bytes, FileOffset, GuestAddress};

    const MIB: u64 = 1 << 20;

    /// Whether each page of `[addr, addr + len)` of `mem` is resident (mincore(2)).
    fn resident_pages(mem: &GuestMemoryMmap, addr: u64, len: u64) -> usize {
        let host = mem.get_host_address(GuestAddress(addr)).unwrap();
        let mut vec = vec![0u8; (len / PAGE_SIZE) as usize];
        // SAFETY: the range is mapped guest memory; `vec` has one byte per page.
        let r = unsafe { libc::mincore(host.cast(), len as usize, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    fn fill(mem: &GuestMemoryMmap, addr: u64, len: u64, byte: u8) {
        mem.write_slice(&vec![byte; len as usize], GuestAddress(addr))
            .unwrap();
    }

    fn read(mem: &GuestMemoryMmap, addr: u64, len: u64) -> Vec<u8> {
        let mut v = vec![0u8; len as usize];
        mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    #[test]
    fn private_pages_are_dropped_and_read_back_as_zeros() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 * MIB as usize)]).unwrap();
        fill(&mem, 0, 8 * MIB, 0xa5);
        assert_eq!(resident_pages(&mem, MIB, 2 * MIB), 512);
        let got = discard_range(&mem, MIB, 2 * MIB).unwrap();
        assert_eq!(got, RangeOutcome::Discarded { pages: 512 });
        assert_eq!(resident_pages(&mem, MIB, 2 * MIB), 0, "pages given back");
        assert!(read(&mem, MIB, 2 * MIB).iter().all(|&b| b == 0));
        // The pages around the range keep their bytes.
        assert!(read(&mem, MIB - PAGE_SIZE, PAGE_SIZE)
            .iter()
            .all(|&b| b == 0xa5));
        assert!(read(&mem, 3 * MIB, PAGE_SIZE).iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn hostile_ranges_are_refused_or_clipped_to_guest_ram() {
        // Two regions with a hole between them, as RAM around the MMIO gap.
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 2 * MIB as usize),
            (GuestAddress(4 * MIB), 2 * MIB as usize),
        ])
        .unwrap();
        fill(&mem, 0, 2 * MIB, 1);
        fill(&mem, 4 * MIB, 2 * MIB, 2);
        let refused = [
            (0x800, PAGE_SIZE),      // unaligned start
            (0, 100),                // unaligned length
            (0, 0),                  // empty
            (2 * MIB, 2 * MIB),      // the hole only
            (64 * MIB, MIB),         // past RAM
            (!0xfff, PAGE_SIZE * 2), // wraps around
        ];
        for (addr, len) in refused {
            let got = discard_range(&mem, addr, len).unwrap();
            assert_eq!(got, RangeOutcome::Refused, "{addr:#x}+{len:#x}");
        }
        assert!(read(&mem, 0, 2 * MIB).iter().all(|&b| b == 1), "untouched");
        // From the last page of region 0 over the hole to the first of region 1.
        let got = discard_range(&mem, 2 * MIB - PAGE_SIZE, 2 * MIB + 2 * PAGE_SIZE).unwrap();
        assert_eq!(got, RangeOutcome::Clipped { pages: 2 });
        assert!(read(&mem, 2 * MIB - PAGE_SIZE, PAGE_SIZE)
            .iter()
            .all(|&b| b == 0));
        assert!(read(&mem, 4 * MIB, PAGE_SIZE).iter().all(|&b| b == 0));
        assert!(read(&mem, 4 * MIB + PAGE_SIZE, PAGE_SIZE)
            .iter()
            .all(|&b| b == 2));
        // Running past the end of RAM.
        let got = discard_range(&mem, 6 * MIB - PAGE_SIZE, 1 << 30).unwrap();
        assert_eq!(got, RangeOutcome::Clipped { pages: 1 });
    }

    /// A memfd of `len` bytes.
    fn memfd(len: u64) -> std::fs::File {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the fd it returns is
        // owned by the File.
        let fd = unsafe { libc::memfd_create(c"exitless-balloon-test".as_ptr(), 0) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a new fd nothing else owns.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(len).unwrap();
        file
    }

    #[test]
    fn shared_file_memory_gets_a_hole_punched_in_the_file() {
        let file = memfd(8 * MIB);
        let other = file.try_clone().unwrap();
        // Guest RAM at 1 MiB, backed by the memfd from offset 1 MiB.
        let region = MmapRegion::from_file(FileOffset::new(file, MIB), 4 * MIB as usize).unwrap();
        assert!(region.flags() & libc::MAP_SHARED != 0);
        let region = GuestRegionMmap::new(region, GuestAddress(MIB)).unwrap();
        let mem = GuestMemoryMmap::from_regions(vec![region]).unwrap();
        fill(&mem, MIB, 4 * MIB, 0x5a);
        let blocks_before = other.metadata().unwrap().blocks();
        assert!(blocks_before * 512 >= 4 * MIB, "{blocks_before} blocks");
        let got = discard_range(&mem, 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(got, RangeOutcome::Discarded { pages: 512 });
        let blocks_after = other.metadata().unwrap().blocks();
        assert_eq!(
            (blocks_before - blocks_after) * 512,
            2 * MIB,
            "the file gave its pages back"
        );
        assert_eq!(other.metadata().unwrap().len(), 8 * MIB, "size kept");
        assert!(read(&mem, 2 * MIB, 2 * MIB).iter().all(|&b| b == 0));
        assert!(read(&mem, MIB, MIB).iter().all(|&b| b == 0x5a));
        assert!(read(&mem, 4 * MIB, MIB).iter().all(|&b| b == 0x5a));
        // What another process mapping the file sees: the hole is at file offset 3 MiB
        // (guest 2 MiB, region at guest 1 MiB = file 1 MiB).
        let mut at = [0u8; 1];
        use std::os::unix::fs::FileExt;
        other.read_exact_at(&mut at, 3 * MIB).unwrap();
        assert_eq!(at[0], 0);
        other.read_exact_at(&mut at, 5 * MIB - 1).unwrap();
        assert_eq!(at[0], 0x5a);
    }
}
