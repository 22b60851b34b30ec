//! `direct=on`: the image opened O_DIRECT (no host page cache), and host bounce buffers for the
//! requests whose guest buffers the kernel cannot move directly (an address or a length that is
//! not a multiple of the alignment the file system asks).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::request::{Segment, SECTOR};
use super::BlockError;

/// Where bounce buffers start (any O_DIRECT alignment a file system asks is at most a page).
const PAGE: usize = 4096;

/// What direct I/O on the image needs of a request's guest buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alignment {
    /// Each buffer's guest-physical address (= host address modulo this, guest memory being
    /// mapped page-aligned) must be a multiple of this.
    pub mem: u64,
}

impl Alignment {
    /// Whether the kernel can move `segs` directly: every address a multiple of `mem`, every
    /// length a whole number of sectors (offsets are sectors already).
    pub fn fits(&self, segs: &[Segment]) -> bool {
        segs.iter()
            .all(|&(addr, len)| addr.0 % self.mem == 0 && u64::from(len) % SECTOR == 0)
    }
}

/// Opens `path` O_DIRECT and finds the buffer alignment it needs.
pub fn open(path: &Path, readonly: bool) -> Result<(File, Alignment), BlockError> {
    let name = path.display().to_string();
    let file = OpenOptions::new()
        .read(true)
        .write(!readonly)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|error| match error.raw_os_error() {
            Some(libc::EINVAL) => BlockError::DirectRefused(name.clone()),
            _ => BlockError::Open {
                path: name.clone(),
                error,
            },
        })?;
    // Probe with one sector: at a page-aligned buffer, then at a sector-aligned one.
    let mut buf = Bounce::new(2 * PAGE);
    let probe = |at: usize, buf: &mut Bounce| {
        // SAFETY: `at + SECTOR` is within the buffer, which lives across the call.
        let r = unsafe { libc::pread(file.as_raw_fd(), buf.ptr().add(at).cast(), 512, 0) };
        r >= 0
    };
    if !probe(0, &mut buf) {
        return Err(BlockError::DirectRefused(name));
    }
    let mem = if probe(SECTOR as usize, &mut buf) {
        SECTOR
    } else {
        PAGE as u64
    };
    Ok((file, Alignment { mem }))
}

/// A page-aligned host buffer standing in for a request's guest buffers.
pub struct Bounce {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: the buffer is owned memory, used by one thread at a time (the device's, or the
// I/O's while the operation runs).
unsafe impl Send for Bounce {}

impl Bounce {
    /// A zeroed buffer of `len` bytes (at least one).
    pub fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1), PAGE).unwrap_or(Layout::new::<u8>());
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Bounce { ptr, layout }
    }

    pub fn ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised (zeroed, then written) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}
