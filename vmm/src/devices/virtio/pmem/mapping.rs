//! The file behind a virtio-pmem device, mapped into this process (and from here into guest
//! physical memory through a KVM memory slot).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use thiserror::Error;

use crate::config::pmem::PMEM_ALIGN;
use crate::config::PmemConfig;

/// Errors opening and mapping a pmem file.
#[derive(Debug, Error)]
pub enum PmemError {
    #[error("Cannot open the pmem file {}: {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    #[error("The pmem file {} is {size} bytes: a size must be a non-zero multiple of 2 MiB (give size=)", path.display())]
    Size { path: PathBuf, size: u64 },
    #[error("Cannot map the pmem file {}: {error}", path.display())]
    Map { path: PathBuf, error: io::Error },
}

/// A file mapped shared (the guest's writes reach it) or private (`discard_writes`: they
/// stay in this process).
#[derive(Debug)]
pub struct PmemMapping {
    file: File,
    ptr: *mut u8,
    len: u64,
    private: bool,
}

// SAFETY: the mapping is plain memory owned by this value until it is dropped; exitless never
// reads or writes through the pointer (the guest does, through KVM), it only hands it to KVM
// and syncs the file, which any thread may do.
unsafe impl Send for PmemMapping {}
// SAFETY: as above: no method reads or writes through the pointer.
unsafe impl Sync for PmemMapping {}

impl PmemMapping {
    /// Opens (creating it with `size` if missing, growing it to `size` if shorter) and maps
    /// the file `config` names.
    pub fn open(config: &PmemConfig) -> Result<Self, PmemError> {
        let path = config.file.clone();
        let opened = OpenOptions::new()
            .read(true)
            .write(!config.discard_writes)
            .create(!config.discard_writes && config.size.is_some())
            .truncate(false)
            .open(&path);
        let file = opened.map_err(|error| PmemError::Open {
            path: path.clone(),
            error,
        })?;
        let have = file
            .metadata()
            .map_err(|error| PmemError::Open {
                path: path.clone(),
                error,
            })?
            .len();
        let len = config.size.unwrap_or(have);
        if len == 0 || len % PMEM_ALIGN != 0 {
            return Err(PmemError::Size { path, size: len });
        }
        if have < len && !config.discard_writes {
            file.set_len(len).map_err(|error| PmemError::Open {
                path: path.clone(),
                error,
            })?;
        }
        let flags = if config.discard_writes {
            libc::MAP_PRIVATE | libc::MAP_NORESERVE
        } else {
            libc::MAP_SHARED
        };
        // SAFETY: a new mapping of `len` bytes of an open file at an address the kernel
        // chooses; nothing else refers to that range.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let error = io::Error::last_os_error();
            return Err(PmemError::Map { path, error });
        }
        Ok(PmemMapping {
            file,
            ptr: ptr.cast(),
            len,
            private: config.discard_writes,
        })
    }

    /// The mapping's address in this process.
    pub fn host_address(&self) -> *mut u8 {
        self.ptr
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the mapping is empty (never: a size is checked non-zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes what the guest wrote durable: the file's dirty pages written and synced
    /// (fdatasync: pages written through the mapping are dirty in the page cache). Nothing
    /// with `discard_writes`.
    pub fn sync(&self) -> io::Result<()> {
        if self.private {
            return Ok(());
        }
        self.file.sync_data()
    }
}

impl Drop for PmemMapping {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `open` and is unmapped once, here.
        unsafe { libc::munmap(self.ptr.cast(), self.len as usize) };
    }
}
