//! Fixed-size tables of counters that start as all zero bytes, in memory of their own
//! (anonymous pages): a page is backed only once a vCPU records into it, so a profile sized
//! for every device and exit reason costs what is used, not what is possible.

use std::ops::Deref;
use std::ptr::NonNull;

/// A type for which all zero bytes is a valid value (the empty counter).
///
/// # Safety
/// Implement only for types whose every field is valid when zeroed (atomics, integers, arrays
/// of them) and that need no `Drop`.
pub unsafe trait ZeroIsEmpty: Sync {}

/// `len` values of `T`, all zero bytes at first, in an anonymous mapping.
pub struct ZeroedTable<T: ZeroIsEmpty> {
    ptr: NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: the table owns its mapping; T is Sync (ZeroIsEmpty requires it) and has no Drop,
// so moving or sharing the table across threads is moving or sharing `&[T]`.
unsafe impl<T: ZeroIsEmpty> Send for ZeroedTable<T> {}
// SAFETY: as above; only shared references to the values are ever handed out.
unsafe impl<T: ZeroIsEmpty> Sync for ZeroedTable<T> {}

impl<T: ZeroIsEmpty> ZeroedTable<T> {
    /// A table of `len` zeroed values.
    ///
    /// # Panics
    /// When the host cannot map the memory (as a failed allocation would abort).
    pub fn new(len: usize) -> Self {
        assert!(std::mem::align_of::<T>() <= 4096, "alignment above a page");
        let bytes = (len.max(1) * std::mem::size_of::<T>()).max(1);
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected. The result is checked below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            addr != libc::MAP_FAILED,
            "Cannot map {bytes} bytes for counters: {}",
            std::io::Error::last_os_error()
        );
        let ptr = NonNull::new(addr.cast::<T>()).expect("mmap never returns null on success");
        ZeroedTable { ptr, len, bytes }
    }
}

impl<T: ZeroIsEmpty> Deref for ZeroedTable<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` page-aligned (so T-aligned) values, zero-filled by the
        // kernel, which ZeroIsEmpty makes valid; it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: ZeroIsEmpty> Drop for ZeroedTable<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.bytes) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    struct Counter(AtomicU64);
    // SAFETY: one atomic integer, zero is a valid value, no Drop.
    unsafe impl ZeroIsEmpty for Counter {}

    #[test]
    fn values_start_at_zero_and_keep_what_is_stored() {
        let t: ZeroedTable<Counter> = ZeroedTable::new(10_000);
        assert_eq!(t.len(), 10_000);
        assert!(t.iter().all(|c| c.0.load(Relaxed) == 0));
        t[9_999].0.store(7, Relaxed);
        assert_eq!(t[9_999].0.load(Relaxed), 7);
        let empty: ZeroedTable<Counter> = ZeroedTable::new(0);
        assert!(empty.is_empty());
    }
}
