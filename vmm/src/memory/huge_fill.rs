//! Transparent huge pages for guest memory about to be filled whole: a migration's
//! destination receives the pages the source's guest touched into fresh memory, and faulting
//! each 4 KiB page in as it is written bounds how fast the first pass goes (a fault per page,
//! several microseconds each under nested virtualisation). [`HugeFill::cover`] asks for huge
//! pages (`madvise(MADV_HUGEPAGE)`) on the 2 MiB-aligned chunks of a range that the range
//! covers entirely, just before the range is written, so one fault fills 2 MiB; a chunk only
//! partly written (a hole in the source's memory) is left to 4 KiB pages, so a sparse guest's
//! memory does not grow. [`HugeFill::end`] takes the advice back (`MADV_NOHUGEPAGE`) once the
//! memory is in: the huge pages made stay, and the kernel's background collapsing
//! (khugepaged) never fills a page the guest later gives back (the balloon) with a huge one.
//!
//! Whether a huge page is made follows the host's settings
//! (`/sys/kernel/mm/transparent_hugepage/enabled` for private memory, `shmem_enabled` for
//! shared memory; `defrag` says whether a fault may compact memory to find one); hugetlbfs
//! memory is huge already and left alone. The advice is only an optimisation: a refusal is
//! ignored.

/// The size of a transparent huge page on x86_64.
const CHUNK: usize = 2 << 20;

/// Most separate runs of chunks advised in one fill: each splits a mapping (a VMA) in the
/// host's kernel, which allows a bounded number per process (`vm.max_map_count`); a guest
/// sparser than this fills the rest with 4 KiB pages.
pub const MAX_RUNS: usize = 512;

/// The runs of huge-page chunks advised so far (host address, length), in order advised.
#[derive(Debug, Default)]
pub struct HugeFill {
    runs: Vec<(usize, usize)>,
}

impl HugeFill {
    /// Advises huge pages for the whole 2 MiB chunks of `[host, host + len)`, which the
    /// caller is about to write entirely (private or shared memory, not hugetlbfs).
    pub fn cover(&mut self, host: usize, len: usize) {
        let Some((start, end)) = whole_chunks(host, len) else {
            return;
        };
        // Inside a run (a dirty pass over memory already in): nothing to do.
        if self.runs.iter().any(|r| r.0 <= start && end <= r.0 + r.1) {
            return;
        }
        let full = self.runs.len() >= MAX_RUNS;
        match self.runs.last_mut() {
            // Right after the last run (the next range of a pass): the run grows.
            Some(r) if r.0 + r.1 == start => r.1 += end - start,
            _ if full => return,
            _ => self.runs.push((start, end - start)),
        }
        advise(start, end - start, libc::MADV_HUGEPAGE);
    }

    /// Takes the advice back from every run (the memory is in); the huge pages made stay.
    pub fn end(&mut self) {
        for (start, len) in self.runs.drain(..) {
            advise(start, len, libc::MADV_NOHUGEPAGE);
        }
    }

    /// The runs advised and not yet taken back.
    pub fn runs(&self) -> &[(usize, usize)] {
        &self.runs
    }
}

/// The 2 MiB-aligned chunks that `[host, host + len)` covers entirely, as a range.
fn whole_chunks(host: usize, len: usize) -> Option<(usize, usize)> {
    let start = host.checked_next_multiple_of(CHUNK)?;
    let end = host.checked_add(len)? / CHUNK * CHUNK;
    (start < end).then_some((start, end))
}

fn advise(start: usize, len: usize, advice: libc::c_int) {
    // SAFETY: madvise with MADV_HUGEPAGE / MADV_NOHUGEPAGE changes only how the kernel backs
    // the range (it never frees or moves data); the range is guest memory this process
    // mapped and keeps mapped. A failure (not supported) leaves the range as it was.
    unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_aligned_chunks_are_covered() {
        let m = CHUNK;
        assert_eq!(whole_chunks(0, 4 * m), Some((0, 4 * m)));
        // A range one page short of a chunk at either end loses that chunk.
        assert_eq!(whole_chunks(4096, 4 * m), Some((m, 4 * m)));
        assert_eq!(whole_chunks(0, 4 * m - 4096), Some((0, 3 * m)));
        assert_eq!(whole_chunks(4096, m), None);
        assert_eq!(whole_chunks(m, m - 4096), None);
    }

    /// Anonymous memory the test maps, 2 MiB-aligned, unmapped on drop.
    struct Anon(usize, usize);

    impl Anon {
        fn new(len: usize) -> Self {
            // SAFETY: a fresh private anonymous mapping, no address asked for.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len + CHUNK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Anon(p as usize, len + CHUNK)
        }
        fn aligned(&self) -> usize {
            self.0.next_multiple_of(CHUNK)
        }
    }

    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the mapping `new` made.
            unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
        }
    }

    #[test]
    fn runs_grow_when_ranges_follow_and_are_bounded() {
        let mem = Anon::new(8 * CHUNK);
        let base = mem.aligned();
        let mut h = HugeFill::default();
        h.cover(base, 2 * CHUNK);
        h.cover(base + 2 * CHUNK, CHUNK + 4096);
        assert_eq!(h.runs(), [(base, 3 * CHUNK)]);
        // A dirty pass inside: nothing new.
        h.cover(base + CHUNK, CHUNK);
        assert_eq!(h.runs().len(), 1);
        // A hole, then another run; a part chunk adds none.
        h.cover(base + 5 * CHUNK, CHUNK);
        h.cover(base + 7 * CHUNK + 4096, 4096);
        assert_eq!(h.runs(), [(base, 3 * CHUNK), (base + 5 * CHUNK, CHUNK)]);
        h.end();
        assert!(h.runs().is_empty());
        let mut many = HugeFill::default();
        for i in 0..4 {
            many.cover(base + i * 2 * CHUNK, CHUNK);
        }
        many.runs.resize(MAX_RUNS, (0, 0));
        many.cover(base + 7 * CHUNK, CHUNK);
        assert_eq!(many.runs().len(), MAX_RUNS, "no run past the bound");
        many.runs.truncate(4);
        many.end();
    }

    /// Pages of `[at, at + len)` resident (mincore).
    fn resident(at: usize, len: usize) -> usize {
        let mut v = vec![0u8; len / 4096];
        // SAFETY: `at` is page-aligned, inside a live mapping, and `v` has a byte per page.
        let r = unsafe { libc::mincore(at as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0);
        v.iter().filter(|b| **b & 1 != 0).count()
    }

    #[test]
    fn a_chunk_written_in_part_keeps_its_holes() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if thp.is_ok_and(|t| t.contains("[always]")) {
            eprintln!("skipped: transparent huge pages are always on here");
            return;
        }
        let mem = Anon::new(2 * CHUNK);
        let base = mem.aligned();
        let mut h = HugeFill::default();
        // The source sent the first chunk whole and one page of the second.
        h.cover(base, CHUNK);
        h.cover(base + CHUNK, 4096);
        for at in (base..base + CHUNK + 4096).step_by(4096) {
            // SAFETY: inside the mapping, written as the receiver writes it.
            unsafe { std::ptr::write_volatile(at as *mut u8, 1) };
        }
        h.end();
        assert_eq!(resident(base, CHUNK), 512);
        assert_eq!(
            resident(base + CHUNK, CHUNK),
            1,
            "the second chunk's holes stay"
        );
    }
}
