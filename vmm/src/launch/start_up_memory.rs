//! Giving back the memory start-up dirtied and the VM's life never uses again: without it, it
//! stays private dirty memory for as long as the VM runs. Called on the thread that launched
//! the VM, after the guest started and before that thread's own seccomp filter.

use std::sync::OnceLock;

/// What hands back the heap start-up freed, when the binary's global allocator is not libc's
/// (the musl build's dlmalloc: only the binary can reach it).
static HEAP_RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets what [`release_freed_heap`] calls: the binary's global allocator's own trim. Once per
/// process; a second call is ignored.
pub fn set_heap_release(release: fn()) {
    let _ = HEAP_RELEASE.set(release);
}

/// Hands back what start-up freed on the heap (the parsed command line, the kernel file, ACPI
/// tables, CPUID lists): heaps are never trimmed while the VM runs (see `seccomp`).
pub fn release_freed_heap() {
    match HEAP_RELEASE.get() {
        Some(release) => release(),
        // SAFETY: malloc_trim only returns free pages of the allocator's heaps to the kernel.
        #[cfg(target_env = "gnu")]
        None => unsafe {
            libc::malloc_trim(0);
        },
        #[cfg(not(target_env = "gnu"))]
        None => {}
    }
}

/// Room left below the calling frame for what this thread calls from now on: it only waits
/// for the VM (a page fault brings back a page a deeper call touches, zeroed). 16 kB kept 12
/// kB of private dirty memory in every VM that waiting never touches (2026-11-28).
const KEPT_BELOW: usize = 4 * 1024;
const PAGE: usize = 4096;

/// Hands back this thread's stack pages below where it now runs, if it is the process's main
/// thread: argument parsing, ACPI tables and loading reach ~40 kB deeper than waiting for the
/// VM ever does. The pages are dead (below the stack pointer); touched again, they come back
/// zeroed, as a stack expects.
pub fn release_unused_stack() {
    let here = 0u8;
    let sp = std::hint::black_box(&here) as *const u8 as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let Some((low, high)) = main_stack(&maps) else {
        return;
    };
    if !(low..high).contains(&sp) {
        return;
    }
    let end = sp.saturating_sub(KEPT_BELOW) & !(PAGE - 1);
    if end > low {
        // SAFETY: [low, end) lies in this thread's own stack mapping, below its stack pointer
        // by KEPT_BELOW: no live frame is there, and MADV_DONTNEED on private anonymous memory
        // only makes the pages read as zero when touched again.
        unsafe { libc::madvise(low as *mut libc::c_void, end - low, libc::MADV_DONTNEED) };
    }
}

/// The main thread's stack mapping in a /proc/PID/maps text: (start, end).
fn main_stack(maps: &str) -> Option<(usize, usize)> {
    let line = maps.lines().find(|l| l.ends_with("[stack]"))?;
    let (low, high) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        usize::from_str_radix(low, 16).ok()?,
        usize::from_str_radix(high, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_stack_is_found_in_maps() {
        let maps = "\
00400000-00600000 r-xp 00000000 08:01 123 /bin/exitless
7ffc1000-7ffc3000 rw-p 00000000 00:00 0 [heap]
7ffd5a3c2000-7ffd5a3e3000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(main_stack(maps), Some((0x7ffd5a3c2000, 0x7ffd5a3e3000)));
        assert_eq!(main_stack("00400000-00600000 r-xp 0 0 0 /bin/x"), None);
    }
}
