//! The dirty log a vhost-user back end writes itself (vhost-user's `LOG_SHMFD` and
//! `VHOST_F_LOG_ALL`, QEMU's docs/interop/vhost-user.rst, "Migration"): one bit per 4 KiB
//! guest page from guest address 0, in a memfd exitless makes and hands each back end
//! (SET_LOG_BASE). The back end sets bits as it writes guest memory (virtiofsd through
//! vhost-user-backend's bitmap, byte-wide atomic ORs); exitless takes and clears them a
//! 64-bit word at a time with an atomic swap at each harvest, so a bit set meanwhile is
//! either taken now or left for the next harvest, never lost.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::PAGE;

/// A log region shared with back ends, covering guest addresses `[0, end)`.
#[derive(Debug)]
pub struct SharedLog {
    file: File,
    map: NonNull<AtomicU64>,
    words: usize,
}

// SAFETY: the mapping is only reached through atomics, and lives as long as the log.
unsafe impl Send for SharedLog {}
// SAFETY: as above: every access is an atomic operation on a word of the mapping.
unsafe impl Sync for SharedLog {}

impl SharedLog {
    /// A log, all clear, for guest memory ending at `end` (exclusive).
    pub fn new(end: u64) -> io::Result<SharedLog> {
        let words = end.div_ceil(PAGE).div_ceil(64).max(1);
        let bytes = (words * 8).next_multiple_of(PAGE);
        // SAFETY: memfd_create reads a NUL-terminated name and takes flags; the fd it returns
        // is owned at once below.
        let fd = unsafe { libc::memfd_create(c"exitless-dirty-log".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(bytes)?;
        // SAFETY: a new shared mapping of the whole file, which is `bytes` long; nothing
        // else is mapped there (the kernel chooses the address).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(SharedLog {
            file,
            map,
            words: (bytes / 8) as usize,
        })
    }

    /// The memfd to hand a back end.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The region's size in bytes (SET_LOG_BASE's `mmap_size`).
    pub fn size(&self) -> u64 {
        self.words as u64 * 8
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        // SAFETY: `i < self.words`, the mapping holds `words` 8-byte words, aligned (a
        // mapping starts on a page), and lives as long as `self`.
        unsafe { &*self.map.as_ptr().add(i) }
    }

    /// Appends the pages (guest page numbers) logged since the last call, in order, and
    /// clears them.
    pub fn take(&self, pages: &mut Vec<u64>) {
        for i in 0..self.words {
            let w = self.word(i);
            if w.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = w.swap(0, Ordering::AcqRel);
            while bits != 0 {
                pages.push(i as u64 * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
    }

    /// Sets the bit of guest page `page` (what a back end does; for tests).
    #[cfg(test)]
    pub fn mark(&self, page: u64) {
        self.word((page / 64) as usize)
            .fetch_or(1 << (page % 64), Ordering::AcqRel);
    }
}

impl Drop for SharedLog {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of `size()` bytes, unmapped once.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.size() as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_marked_are_taken_once_in_order() {
        let log = SharedLog::new(256 << 20).unwrap();
        assert!(log.size() >= (256 << 20) / PAGE / 8);
        for p in [65535, 0, 64, 63] {
            log.mark(p);
        }
        let mut pages = Vec::new();
        log.take(&mut pages);
        assert_eq!(pages, [0, 63, 64, 65535]);
        pages.clear();
        log.take(&mut pages);
        assert!(pages.is_empty());
    }
}
