use super::*;
use std::os::unix::fs::MetadataExt;

/// An anonymous private mapping of `len` bytes (as guest RAM is by default).
struct Anon {
    ptr: *mut u8,
    len: usize,
}

impl Anon {
    fn new(len: usize) -> Self {
        // SAFETY: a new private anonymous mapping; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Anon {
            ptr: ptr.cast(),
            len,
        }
    }

    fn write(&self, page: u64, value: u64) {
        assert!(((page + 1) * PAGE) as usize <= self.len);
        // SAFETY: inside the mapping.
        unsafe {
            std::ptr::write_volatile(
                self.ptr.add((page * PAGE) as usize + 8).cast::<u64>(),
                value,
            )
        };
    }

    fn read(&self, page: u64) -> u64 {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::read_volatile(self.ptr.add((page * PAGE) as usize + 8).cast::<u64>()) }
    }

    fn region(&self, file_offset: u64) -> SaveRegion<'static> {
        SaveRegion {
            host: self.ptr,
            len: self.len as u64,
            file_offset,
            backing: None,
        }
    }
}

impl Drop for Anon {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn temp(name: &str) -> (std::path::PathBuf, File) {
    let path = std::env::temp_dir().join(format!("exitless-memfile-{name}-{}", std::process::id()));
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    (path, file)
}

fn word_at(file: &File, offset: u64) -> u64 {
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, offset + 8).unwrap();
    u64::from_le_bytes(b)
}

#[test]
fn only_touched_nonzero_pages_are_written_and_the_rest_are_holes() {
    let mem = Anon::new(64 << 20);
    for page in [3u64, 4, 5, 1000, 16383] {
        mem.write(page, 0xdead_0000 + page);
    }
    mem.write(700, 0); // touched, but zeros: a hole too
    let _ = mem.read(900); // read only: the zero page
    for scan in [Scan::Pagemap, Scan::Mincore, Scan::Every] {
        let (path, file) = temp("sparse");
        let done = save(&file, 64 << 20, &[mem.region(0)], scan, &mut |_| {}).unwrap();
        assert_eq!(done.written, 5 * PAGE, "{scan:?}");
        assert_eq!(done.scanned, 64 << 20);
        if scan == Scan::Pagemap {
            assert!((6..64).contains(&done.candidates), "{done:?}");
        }
        for page in [3u64, 4, 5, 1000, 16383] {
            assert_eq!(word_at(&file, page * PAGE), 0xdead_0000 + page);
        }
        assert_eq!(word_at(&file, 700 * PAGE), 0);
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(
            meta.blocks() * 512 <= 64 * PAGE,
            "{} blocks allocated",
            meta.blocks()
        );
        let extents = data_extents(&file, 0, 64 << 20).unwrap();
        let data: u64 = extents.iter().map(|e| e.1).sum();
        assert!((5 * PAGE..64 * PAGE).contains(&data), "{extents:?}");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_private_file_mapping_saves_the_file_bytes_and_its_own_writes() {
    // A restored VM's memory: the file (a previous snapshot) with its own writes on top.
    let (path, base) = temp("base");
    base.set_len(16 << 20).unwrap();
    base.write_all_at(&7u64.to_le_bytes(), 10 * PAGE + 8)
        .unwrap();
    base.write_all_at(&9u64.to_le_bytes(), 11 * PAGE + 8)
        .unwrap();
    // SAFETY: a new private mapping of the file; checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            16 << 20,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            base.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED);
    let host = ptr.cast::<u8>();
    // SAFETY: inside the mapping.
    unsafe {
        std::ptr::write_volatile(host.add((11 * PAGE + 8) as usize).cast::<u64>(), 10);
        std::ptr::write_volatile(host.add((2000 * PAGE + 8) as usize).cast::<u64>(), 11);
    }
    let (out_path, out) = temp("overlay");
    let region = SaveRegion {
        host,
        len: 16 << 20,
        file_offset: 0,
        backing: Some((&base, 0)),
    };
    let done = save(&out, 16 << 20, &[region], Scan::Pagemap, &mut |_| {}).unwrap();
    assert_eq!(done.written, 3 * PAGE);
    assert_eq!(word_at(&out, 10 * PAGE), 7, "untouched: the file's bytes");
    assert_eq!(word_at(&out, 11 * PAGE), 10, "written over");
    assert_eq!(word_at(&out, 2000 * PAGE), 11);
    assert_eq!(word_at(&base, 11 * PAGE), 9, "the file itself unchanged");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(ptr, 16 << 20) };
    // Loading it back onto fresh memory copies only the data.
    let fresh = Anon::new(16 << 20);
    // SAFETY: `fresh` is a live mapping of that size that nothing else uses.
    let copied = unsafe { load(&out, 0, 16 << 20, fresh.ptr) }.unwrap();
    assert!((3 * PAGE..64 * PAGE).contains(&copied), "{copied}");
    assert_eq!(
        (fresh.read(10), fresh.read(11), fresh.read(2000)),
        (7, 10, 11)
    );
    std::fs::remove_file(path).unwrap();
    std::fs::remove_file(out_path).unwrap();
}

/// How long each way of finding touched pages takes on 512 MiB of which 10 MiB were written
/// (scattered 4 KiB pages), alone and with the writing: `cargo test --profile ci -p vmm
/// measure_scans -- --ignored --nocapture`. Figures in docs/snapshot.md.
#[test]
#[ignore]
fn measure_scans() {
    let len = 512u64 << 20;
    let touched = (10u64 << 20) / PAGE;
    let stride = len / PAGE / touched;
    let pages = len / PAGE;
    for round in 0..5 {
        for scan in [Scan::Pagemap, Scan::Mincore, Scan::Every] {
            // A fresh mapping each time: reading every page maps them all.
            let mem = Anon::new(len as usize);
            for i in 0..touched {
                mem.write(i * stride, i + 1);
            }
            let mut pm = File::open("/proc/self/pagemap").unwrap();
            let start = Instant::now();
            let mut found = 0;
            let mut at = 0;
            while at < pages {
                let n = SCAN_CHUNK.min(pages - at);
                let t = find_touched(scan, Some(&mut pm), mem.ptr, at, n).unwrap();
                found += t.iter().filter(|&&x| x).count();
                at += n;
            }
            let scan_ms = ms_since(start);
            let (path, file) = temp("measure");
            let start = Instant::now();
            let done = save(&file, len, &[mem.region(0)], scan, &mut |_| {}).unwrap();
            println!(
                "round {round} {scan:?}: find {scan_ms:.2} ms ({found} pages), save {:.1} ms ({} MiB written)",
                ms_since(start),
                done.written >> 20
            );
            std::fs::remove_file(path).unwrap();
        }
        // A shared memfd (shared guest memory): its data extents, then the save.
        // SAFETY: a plain system call creating a new file descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_memfd_create, c"m".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: the kernel just returned this descriptor, which nothing else owns.
        let memfd = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
        memfd.set_len(len).unwrap();
        for i in 0..touched {
            memfd
                .write_all_at(&(i + 1).to_le_bytes(), i * stride * PAGE + 8)
                .unwrap();
        }
        let start = Instant::now();
        let extents = data_extents(&memfd, 0, len).unwrap();
        println!(
            "round {round} memfd SEEK_DATA: {:.2} ms ({} extents)",
            ms_since(start),
            extents.len()
        );
    }
}
