//! Guest memory to and from the snapshot's memory file, sparse: only pages the guest touched
//! and that are not all zeros are written; the rest of the file is holes, which read back as
//! zeros. How touched pages are found (measured in docs/snapshot.md, "Writing memory"):
//!
//! - `/proc/self/pagemap`: a page present in the mapping or swapped out (bit 63 or 62). The
//!   default: unlike mincore(2) it sees anonymous pages in swap, which are still the guest's.
//! - for file-backed regions (a shared memfd, a file mapped private), also the file's data
//!   extents (SEEK_DATA/SEEK_HOLE): a memfd page in swap has no page table entry, and a
//!   private mapping's untouched pages are the file's bytes.
//! - [`Scan::Mincore`] and [`Scan::Every`] (every page read) exist to measure against.
//!
//! Every candidate page is compared with zero before it is written.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// Bytes per page.
pub const PAGE: u64 = 4096;
/// Pages asked of pagemap or mincore at once.
const SCAN_CHUNK: u64 = 1 << 15;
/// Longest single write.
const MAX_RUN: u64 = 1 << 20;

/// How touched pages are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// `/proc/self/pagemap`: present or swapped.
    Pagemap,
    /// mincore(2): resident (misses pages in swap; for measuring only).
    Mincore,
    /// Every page (for measuring only).
    Every,
}

/// One region of guest memory to save.
pub struct SaveRegion<'a> {
    /// Its mapping in this process (guest memory; the vCPUs are parked).
    pub host: *const u8,
    pub len: u64,
    /// Where its bytes go in the memory file.
    pub file_offset: u64,
    /// The file the mapping is of, and the offset of the region in it, for its data extents.
    pub backing: Option<(&'a File, u64)>,
}

/// What writing the memory file did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    /// Bytes of guest memory looked at.
    pub scanned: u64,
    /// Pages found touched (candidates compared with zero).
    pub candidates: u64,
    /// Bytes written (non-zero pages).
    pub written: u64,
}

/// Writes `regions` into `file` (sized to `file_len` first, so the rest are holes), reporting
/// progress to `progress` every 64 MiB scanned.
pub fn save(
    file: &File,
    file_len: u64,
    regions: &[SaveRegion<'_>],
    scan: Scan,
    progress: &mut dyn FnMut(&Written),
) -> io::Result<Written> {
    file.set_len(file_len)?;
    let mut done = Written::default();
    let mut pagemap = match scan {
        Scan::Pagemap => Some(File::open("/proc/self/pagemap")?),
        _ => None,
    };
    let mut last_report = 0;
    for r in regions {
        let pages = r.len / PAGE;
        let extents = match r.backing {
            Some((f, offset)) => data_extents(f, offset, r.len)?,
            None => Vec::new(),
        };
        let mut start = 0;
        while start < pages {
            let n = SCAN_CHUNK.min(pages - start);
            let mut touched = find_touched(scan, pagemap.as_mut(), r.host, start, n)?;
            mark_extents(&mut touched, &extents, start);
            write_touched(file, r, start, &touched, &mut done)?;
            start += n;
            done.scanned += n * PAGE;
            if done.scanned - last_report >= 64 << 20 {
                last_report = done.scanned;
                progress(&done);
            }
        }
    }
    Ok(done)
}

/// Which of pages `[start, start + n)` of the mapping at `host` were touched.
fn find_touched(
    scan: Scan,
    pagemap: Option<&mut File>,
    host: *const u8,
    start: u64,
    n: u64,
) -> io::Result<Vec<bool>> {
    let addr = host as u64 + start * PAGE;
    match (scan, pagemap) {
        (Scan::Pagemap, Some(pm)) => {
            let mut raw = vec![0u8; n as usize * 8];
            pm.read_exact_at(&mut raw, addr / PAGE * 8)?;
            Ok(raw
                .chunks_exact(8)
                .map(|e| {
                    let entry =
                        u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
                    entry & (3 << 62) != 0
                })
                .collect())
        }
        (Scan::Mincore, _) => {
            let mut vec = vec![0u8; n as usize];
            // SAFETY: the range is inside a live mapping of guest memory (page-aligned) and
            // `vec` has one byte per page of it.
            let rc =
                unsafe { libc::mincore(addr as *mut _, (n * PAGE) as usize, vec.as_mut_ptr()) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(vec.iter().map(|b| b & 1 != 0).collect())
        }
        _ => Ok(vec![true; n as usize]),
    }
}

/// The data extents (offset, length) of `file` within `[offset, offset + len)`, relative to
/// `offset`, from SEEK_DATA/SEEK_HOLE; where the file system cannot say, all of it.
pub fn data_extents(file: &File, offset: u64, len: u64) -> io::Result<Vec<(u64, u64)>> {
    let fd = file.as_raw_fd();
    let end = offset + len;
    let mut extents = Vec::new();
    let mut at = offset;
    while at < end {
        // SAFETY: lseek on a file descriptor this function borrows; no memory is touched.
        let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            return match io::Error::last_os_error().raw_os_error() {
                Some(libc::ENXIO) => Ok(extents),
                Some(libc::EINVAL) => Ok(vec![(0, len)]),
                _ => Err(io::Error::last_os_error()),
            };
        }
        let data = data as u64;
        if data >= end {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data as libc::off_t, libc::SEEK_HOLE) };
        let hole = if hole < 0 {
            end
        } else {
            (hole as u64).min(end)
        };
        extents.push((data - offset, hole - data));
        at = hole;
    }
    Ok(extents)
}

/// Marks the pages of `extents` (byte ranges of the region) among `touched`, which covers
/// the region's pages from `start`.
fn mark_extents(touched: &mut [bool], extents: &[(u64, u64)], start: u64) {
    let first = start * PAGE;
    let last = first + touched.len() as u64 * PAGE;
    for &(off, len) in extents {
        let (from, to) = (off.max(first), (off + len).min(last));
        if from >= to {
            continue;
        }
        let to_page = to.div_ceil(PAGE);
        for page in from / PAGE..to_page {
            touched[(page - start) as usize] = true;
        }
    }
}

/// The page at `host + page * PAGE` as words.
///
/// # Safety
/// The page is inside a live mapping that nothing writes meanwhile.
unsafe fn page_words<'m>(host: *const u8, page: u64) -> &'m [u64] {
    std::slice::from_raw_parts(host.add((page * PAGE) as usize).cast::<u64>(), 512)
}

/// Writes the touched pages of chunk `start` that are not all zeros, in runs.
fn write_touched(
    file: &File,
    r: &SaveRegion<'_>,
    start: u64,
    touched: &[bool],
    done: &mut Written,
) -> io::Result<()> {
    let mut run: Option<(u64, u64)> = None;
    for (i, &t) in touched.iter().enumerate() {
        let page = start + i as u64;
        // SAFETY: `page` is inside the region's mapping; the vCPUs are parked and no device
        // writes guest memory while a snapshot is taken (see LaunchedVm::snapshot).
        let zero = !t || unsafe { page_words(r.host, page) }.iter().all(|&w| w == 0);
        done.candidates += u64::from(t);
        run = match (run, zero) {
            (Some((from, n)), false) if n * PAGE < MAX_RUN => Some((from, n + 1)),
            (Some(ended), false) => {
                write_run(file, r, ended, done)?;
                Some((page, 1))
            }
            (None, false) => Some((page, 1)),
            (Some(ended), true) => {
                write_run(file, r, ended, done)?;
                None
            }
            (None, true) => None,
        };
    }
    if let Some(ended) = run {
        write_run(file, r, ended, done)?;
    }
    Ok(())
}

fn write_run(
    file: &File,
    r: &SaveRegion<'_>,
    (from, n): (u64, u64),
    done: &mut Written,
) -> io::Result<()> {
    // SAFETY: pages `[from, from + n)` are inside the region's mapping, which nothing writes
    // meanwhile (see `write_touched`).
    let bytes = unsafe {
        std::slice::from_raw_parts(r.host.add((from * PAGE) as usize), (n * PAGE) as usize)
    };
    file.write_all_at(bytes, r.file_offset + from * PAGE)?;
    done.written += n * PAGE;
    Ok(())
}

/// Copies the data extents of `[offset, offset + len)` of `file` into the mapping at `host`
/// (a restore onto new shared or huge-page memory, which cannot map the file privately).
/// Returns the bytes copied.
///
/// # Safety
/// `host` is a live mapping of at least `len` bytes that nothing else accesses meanwhile.
pub unsafe fn load(file: &File, offset: u64, len: u64, host: *mut u8) -> io::Result<u64> {
    let mut copied = 0;
    for (at, n) in data_extents(file, offset, len)? {
        let dst = std::slice::from_raw_parts_mut(host.add(at as usize), n as usize);
        file.read_exact_at(dst, offset + at)?;
        copied += n;
    }
    Ok(copied)
}

/// Time since `start` in ms, for progress lines.
pub fn ms_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests;
