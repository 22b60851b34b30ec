//! Guest physical memory: layout constants and the mmap-backed guest memory, private
//! (anonymous) by default, or shared (a memfd mapped `MAP_SHARED`, whose file descriptor a
//! vhost-user back end maps) and on huge pages when the configuration asks ([`Backing`]).
//! Memory may also be laid out in zones ([`create_zoned_memory`]), each fresh or a named file
//! mapped shared (writes reach the file: a VM template's memory) or private (copy-on-write:
//! the VMs made from it), and regions may map any file at an offset ([`create_file_region`]:
//! a restored snapshot's memory).
//! Where memory hot-added while the VM runs goes: [`hotplug`]. Huge pages for memory about to
//! be filled whole (a migration's destination): [`huge_fill`].

pub mod hotplug;
pub mod huge_fill;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::PathBuf;

use thiserror::Error;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Start of the MMIO gap below 4 GiB (3 GiB): no RAM is placed between this and 4 GiB.
pub const MMIO_GAP_START: u64 = 0xC000_0000;
/// End of the MMIO gap (4 GiB).
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
/// Window in the MMIO gap from which the VMM assigns PCI memory BARs (32-bit addresses).
pub const PCI_MMIO_START: u64 = 0xC000_0000;
/// Size of the PCI BAR window (256 MiB; the bench guest's own MMIO target sits above it).
pub const PCI_MMIO_SIZE: u64 = 0x1000_0000;
/// PCI Express ECAM (MMCONFIG) for bus 0: 32 devices x 8 functions x 4 KiB.
pub const PCI_ECAM_START: u64 = 0xE000_0000;
/// Size of the ECAM range (bus 0 only).
pub const PCI_ECAM_SIZE: u64 = 0x10_0000;
/// First I/O port of PCI configuration mechanism #1 (0xCF8 address, 0xCFC data).
pub const PCI_CONFIG_PORT: u64 = 0xCF8;
/// Number of ports of PCI configuration mechanism #1.
pub const PCI_CONFIG_PORT_LEN: u64 = 8;
const _: () = assert!(PCI_MMIO_START >= MMIO_GAP_START);
const _: () = assert!(PCI_MMIO_START + PCI_MMIO_SIZE <= PCI_ECAM_START);
const _: () = assert!(PCI_ECAM_START + PCI_ECAM_SIZE <= 0xFEC0_0000);
/// Smallest guest memory exitless accepts.
pub const MIN_MEMORY: u64 = 16 << 20;

/// 2 MiB huge pages.
pub const HUGEPAGE_2M: u64 = 2 << 20;
/// 1 GiB huge pages.
pub const HUGEPAGE_1G: u64 = 1 << 30;

/// Errors creating guest memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("Memory size {0} bytes is below the minimum of {MIN_MEMORY} bytes")]
    TooSmall(u64),
    #[error("Memory size {0} bytes is not a multiple of 4 KiB")]
    Unaligned(u64),
    #[error("Cannot map guest memory: {0}")]
    Mmap(#[from] vm_memory::mmap::FromRangesError),
    #[error("Huge page size {0} bytes is not supported: use 2M or 1G")]
    HugePageSize(u64),
    #[error(
        "Guest memory of {len} bytes at {start:#x} is not a whole number of {page} huge pages"
    )]
    HugePageAlign { start: u64, len: u64, page: String },
    #[error("This host has no {page} huge pages ({} is missing)", path.display())]
    NoHugePages { page: String, path: PathBuf },
    #[error("Not enough free {page} huge pages: the guest needs {needed}, the host has {free} free ({}; raise nr_hugepages beside it)", path.display())]
    TooFewHugePages {
        page: String,
        needed: u64,
        free: u64,
        path: PathBuf,
    },
    #[error("Cannot create the guest memory file (memfd_create): {0}")]
    Memfd(std::io::Error),
    #[error("Cannot size the guest memory file to {len} bytes: {error}")]
    Truncate { len: u64, error: std::io::Error },
    #[error("Cannot map guest memory of {len} bytes at {start:#x}: {error}")]
    Region {
        start: u64,
        len: u64,
        error: vm_memory::mmap::MmapRegionError,
    },
    #[error("Guest memory regions overlap or wrap: {0}")]
    Regions(vm_memory::GuestRegionCollectionError),
    #[error("Cannot open guest memory file {}: {error}", path.display())]
    OpenFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Guest memory file {} is {len} bytes: mapping {need} bytes at offset {offset} needs more", path.display())]
    FileTooShort {
        path: PathBuf,
        len: u64,
        offset: u64,
        need: u64,
    },
}

/// How guest RAM is backed. The default is private anonymous memory on the host's normal
/// pages (what exitless used before any other backing existed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Backing {
    /// Each region is a memfd mapped `MAP_SHARED`: another process (a vhost-user back end)
    /// maps the same pages through the file descriptor ([`shared_file`]).
    pub shared: bool,
    /// Huge pages of this size ([`HUGEPAGE_2M`] or [`HUGEPAGE_1G`]) from the host's hugetlb
    /// pool (a memfd with `MFD_HUGETLB`, mapped shared or private as `shared` says).
    pub hugepage_size: Option<u64>,
}

impl Backing {
    /// Whether regions are files (memfds) rather than anonymous memory.
    fn is_file(&self) -> bool {
        self.shared || self.hugepage_size.is_some()
    }
}

/// A huge page size as people write it ("2M", "1G").
fn page_name(size: u64) -> String {
    match size {
        HUGEPAGE_1G => "1G".into(),
        s => format!("{}M", s >> 20),
    }
}

/// The sysfs directory of the host's huge pages of `size` bytes.
fn hugepage_dir(size: u64) -> PathBuf {
    PathBuf::from(format!(
        "/sys/kernel/mm/hugepages/hugepages-{}kB",
        size >> 10
    ))
}

/// Fails with how many are needed and free unless the host has `needed` free huge pages of
/// `size` bytes (`free_hugepages` in sysfs).
pub fn check_free_hugepages(size: u64, needed: u64) -> Result<(), MemoryError> {
    let path = hugepage_dir(size).join("free_hugepages");
    let page = page_name(size);
    let text = std::fs::read_to_string(&path).map_err(|_| MemoryError::NoHugePages {
        page: page.clone(),
        path: path.clone(),
    })?;
    let free = text.trim().parse::<u64>().unwrap_or(0);
    if free < needed {
        return Err(MemoryError::TooFewHugePages {
            page,
            needed,
            free,
            path,
        });
    }
    Ok(())
}

/// A new memfd of `len` bytes for guest RAM, on huge pages of `hugepage_size` if given.
/// Called through `syscall(2)`: the static musl build links libc's `memfd_create`, which std
/// also declares weak, as a null symbol.
fn memfd(len: u64, hugepage_size: Option<u64>) -> Result<File, MemoryError> {
    let mut flags = libc::MFD_CLOEXEC;
    match hugepage_size {
        None => {}
        Some(HUGEPAGE_2M) => flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
        Some(HUGEPAGE_1G) => flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_1GB,
        Some(other) => return Err(MemoryError::HugePageSize(other)),
    }
    let name = c"exitless-guest-ram";
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the call creates a
    // new file descriptor and touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_memfd_create, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(MemoryError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor, which nothing else owns.
    let file = unsafe { File::from_raw_fd(fd as RawFd) };
    file.set_len(len)
        .map_err(|error| MemoryError::Truncate { len, error })?;
    Ok(file)
}

/// One region of guest RAM at `start`, `len` bytes, backed as `backing` says. The free huge
/// pages are checked first (a clear error rather than a failed mapping). Also what adds a
/// region to a running VM's memory (a hot-added memory slot) with the VM's backing.
pub fn create_region(
    start: GuestAddress,
    len: u64,
    backing: &Backing,
) -> Result<GuestRegionMmap, MemoryError> {
    let region_error = |error| MemoryError::Region {
        start: start.0,
        len,
        error,
    };
    if len == 0 || len % 4096 != 0 {
        return Err(MemoryError::Unaligned(len));
    }
    let mut builder =
        MmapRegionBuilder::new(len as usize).with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE);
    if backing.is_file() {
        if let Some(page) = backing.hugepage_size {
            check_hugepage_fit(start.0, len, page)?;
            check_free_hugepages(page, len / page)?;
        }
        let file = memfd(len, backing.hugepage_size)?;
        let flags = if backing.shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        builder = builder
            .with_file_offset(FileOffset::new(file, 0))
            .with_mmap_flags(flags)
            .with_hugetlbfs(backing.hugepage_size.is_some());
    } else {
        builder =
            builder.with_mmap_flags(libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_PRIVATE);
    }
    let mapping = builder.build().map_err(region_error)?;
    GuestRegionMmap::new(mapping, start).ok_or(MemoryError::Unaligned(len))
}

/// Where a zone of guest RAM comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneSource {
    /// New memory, backed as [`Backing`] says.
    Fresh(Backing),
    /// A named file: `MAP_SHARED` when `shared` (the guest's writes reach the file), else
    /// `MAP_PRIVATE` (copy-on-write: the file is only read).
    File { path: PathBuf, shared: bool },
}

/// One zone of guest RAM: `size` bytes from `source`. Zones fill guest RAM in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    pub size: u64,
    pub source: ZoneSource,
}

/// Opens a guest memory file: read-write to map it shared, read-only to map it private.
pub fn open_memory_file(path: &std::path::Path, shared: bool) -> Result<File, MemoryError> {
    File::options()
        .read(true)
        .write(shared)
        .open(path)
        .map_err(|error| MemoryError::OpenFile {
            path: path.to_path_buf(),
            error,
        })
}

/// A region of guest RAM at `start`, `len` bytes of `file` from `offset` (`path` names it in
/// errors): `MAP_SHARED` when `shared`, else `MAP_PRIVATE` (copy-on-write, filled lazily from
/// the file's page cache, which every private mapping of it shares).
pub fn create_file_region(
    start: GuestAddress,
    len: u64,
    file: File,
    offset: u64,
    shared: bool,
    path: &std::path::Path,
) -> Result<GuestRegionMmap, MemoryError> {
    if len == 0 || len % 4096 != 0 || offset % 4096 != 0 {
        return Err(MemoryError::Unaligned(len));
    }
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(MemoryError::FileTooShort {
            path: path.to_path_buf(),
            len: file_len,
            offset,
            need: len,
        });
    }
    let flags = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE | libc::MAP_NORESERVE
    };
    let mapping = MmapRegionBuilder::new(len as usize)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_file_offset(FileOffset::new(file, offset))
        .with_mmap_flags(flags)
        .build()
        .map_err(|error| MemoryError::Region {
            start: start.0,
            len,
            error,
        })?;
    GuestRegionMmap::new(mapping, start).ok_or(MemoryError::Unaligned(len))
}

/// Guest RAM laid out by [`ram_ranges`] for the zones' total size, the zones placed in order
/// (a zone that crosses the MMIO gap becomes two regions, its file mapped at the right
/// offsets).
pub fn create_zoned_memory(zones: &[Zone]) -> Result<GuestMemoryMmap, MemoryError> {
    let total: u64 = zones.iter().map(|z| z.size).sum();
    if total < MIN_MEMORY {
        return Err(MemoryError::TooSmall(total));
    }
    let mut regions = Vec::new();
    let mut ranges = ram_ranges(total).into_iter();
    let mut range = ranges.next();
    for zone in zones {
        if zone.size == 0 || zone.size % 4096 != 0 {
            return Err(MemoryError::Unaligned(zone.size));
        }
        let mut done = 0;
        while done < zone.size {
            let Some((start, len)) = range else {
                return Err(MemoryError::TooSmall(total));
            };
            let take = len.min(zone.size - done);
            regions.push(zone_region(start, take, &zone.source, done)?);
            done += take;
            range = match len - take {
                0 => ranges.next(),
                left => Some((GuestAddress(start.0 + take), left)),
            };
        }
    }
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Regions)
}

/// `len` bytes of `source` at guest address `start`, from byte `offset` of the zone.
fn zone_region(
    start: GuestAddress,
    len: u64,
    source: &ZoneSource,
    offset: u64,
) -> Result<GuestRegionMmap, MemoryError> {
    match source {
        ZoneSource::Fresh(backing) => create_region(start, len, backing),
        ZoneSource::File { path, shared } => {
            let file = open_memory_file(path, *shared)?;
            create_file_region(start, len, file, offset, *shared, path)
        }
    }
}

/// Fails unless `[start, start + len)` is whole huge pages of `page` bytes.
fn check_hugepage_fit(start: u64, len: u64, page: u64) -> Result<(), MemoryError> {
    if page != HUGEPAGE_2M && page != HUGEPAGE_1G {
        return Err(MemoryError::HugePageSize(page));
    }
    if start % page != 0 || len % page != 0 {
        return Err(MemoryError::HugePageAlign {
            start,
            len,
            page: page_name(page),
        });
    }
    Ok(())
}

/// The file descriptor and offset that map `region`, when it is shared memory another
/// process can map (what vhost-user's `SET_MEM_TABLE` sends); None for private memory.
pub fn shared_file(region: &GuestRegionMmap) -> Option<(RawFd, u64)> {
    if region.flags() & libc::MAP_SHARED == 0 {
        return None;
    }
    let f = region.file_offset()?;
    Some((f.file().as_raw_fd(), f.start()))
}

/// The RAM ranges (start, length) for `size` bytes of guest memory, split around the MMIO gap.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, u64)> {
    if size <= MMIO_GAP_START {
        vec![(GuestAddress(0), size)]
    } else {
        vec![
            (GuestAddress(0), MMIO_GAP_START),
            (GuestAddress(MMIO_GAP_END), size - MMIO_GAP_START),
        ]
    }
}

/// Allocates `size` bytes of guest memory laid out by [`ram_ranges`], backed as `backing`
/// says (anonymous private memory by default).
pub fn create_guest_memory(size: u64, backing: &Backing) -> Result<GuestMemoryMmap, MemoryError> {
    if size < MIN_MEMORY {
        return Err(MemoryError::TooSmall(size));
    }
    if size % 4096 != 0 {
        return Err(MemoryError::Unaligned(size));
    }
    if !backing.is_file() {
        let ranges: Vec<(GuestAddress, usize)> = ram_ranges(size)
            .into_iter()
            .map(|(a, l)| (a, l as usize))
            .collect();
        return Ok(GuestMemoryMmap::from_ranges(&ranges)?);
    }
    if let Some(page) = backing.hugepage_size {
        // All regions at once: the error says what the whole guest needs.
        for (start, len) in ram_ranges(size) {
            check_hugepage_fit(start.0, len, page)?;
        }
        check_free_hugepages(page, size / page)?;
    }
    let regions = ram_ranges(size)
        .into_iter()
        .map(|(start, len)| create_region(start, len, backing))
        .collect::<Result<Vec<_>, _>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(MemoryError::Regions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryBackend;

    #[test]
    fn small_memory_is_one_range() {
        assert_eq!(ram_ranges(256 << 20), vec![(GuestAddress(0), 256 << 20)]);
    }

    #[test]
    fn large_memory_skips_the_mmio_gap() {
        let r = ram_ranges(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), MMIO_GAP_START));
        assert_eq!(
            r[1],
            (GuestAddress(MMIO_GAP_END), (4 << 30) - MMIO_GAP_START)
        );
    }

    #[test]
    fn too_small_is_an_error() {
        assert!(matches!(
            create_guest_memory(1 << 20, &Backing::default()),
            Err(MemoryError::TooSmall(_))
        ));
    }

    #[test]
    fn private_memory_has_no_file_to_share() {
        let mem = create_guest_memory(MIN_MEMORY, &Backing::default()).unwrap();
        let region = mem.iter().next().unwrap();
        assert_eq!(shared_file(region), None);
    }

    #[test]
    fn shared_memory_is_a_memfd_another_mapping_sees() {
        use vm_memory::Bytes;
        let shared = Backing {
            shared: true,
            hugepage_size: None,
        };
        let mem = create_guest_memory(MIN_MEMORY, &shared).unwrap();
        let region = mem.iter().next().unwrap();
        let (fd, offset) = shared_file(region).expect("a shared region has a file");
        assert_eq!(offset, 0);
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        assert!(
            link.to_string_lossy().contains("memfd:exitless-guest-ram"),
            "{link:?}"
        );
        // A second mapping of the same file (what a back end makes) sees the guest's writes.
        mem.write_obj(0x1234_5678u32, GuestAddress(0x2000)).unwrap();
        // SAFETY: `fd` is open for the life of `mem`; the new file is a duplicate it owns.
        let dup = unsafe { File::from_raw_fd(libc::dup(fd)) };
        let other = MmapRegionBuilder::<()>::new(MIN_MEMORY as usize)
            .with_file_offset(FileOffset::new(dup, 0))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_SHARED)
            .build()
            .unwrap();
        let other = GuestRegionMmap::new(other, GuestAddress(0)).unwrap();
        let seen: u32 = GuestMemoryMmap::from_regions(vec![other])
            .unwrap()
            .read_obj(GuestAddress(0x2000))
            .unwrap();
        assert_eq!(seen, 0x1234_5678);
    }

    #[test]
    fn zones_fill_ram_in_order_across_the_mmio_gap() {
        use vm_memory::Bytes;
        let dir = std::env::temp_dir().join(format!("exitless-zones-{}", std::process::id()));
        let path = dir.with_extension("ram");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(2 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        file.write_all_at(&0xabcd_u32.to_le_bytes(), 4096).unwrap();
        let zones = [
            Zone {
                size: 2 << 20,
                source: ZoneSource::File {
                    path: path.clone(),
                    shared: false,
                },
            },
            Zone {
                size: MIN_MEMORY,
                source: ZoneSource::Fresh(Backing::default()),
            },
        ];
        let mem = create_zoned_memory(&zones).unwrap();
        assert_eq!(mem.num_regions(), 2);
        // The file's bytes are the zone's; a write stays private.
        let got: u32 = mem.read_obj(GuestAddress(4096)).unwrap();
        assert_eq!(got, 0xabcd);
        mem.write_obj(7u32, GuestAddress(4096)).unwrap();
        let mut on_disk = [0u8; 4];
        file.read_exact_at(&mut on_disk, 4096).unwrap();
        assert_eq!(u32::from_le_bytes(on_disk), 0xabcd);
        let short = [Zone {
            size: 32 << 20,
            source: ZoneSource::File {
                path: path.clone(),
                shared: true,
            },
        }];
        let e = create_zoned_memory(&short).unwrap_err().to_string();
        assert!(e.contains("is 2097152 bytes"), "{e}");
        std::fs::remove_file(&path).unwrap();
        // A zone crossing the gap: two regions.
        let big = [Zone {
            size: MMIO_GAP_START + (16 << 20),
            source: ZoneSource::Fresh(Backing::default()),
        }];
        let mem = create_zoned_memory(&big).unwrap();
        assert_eq!(mem.num_regions(), 2);
        assert!(mem.address_in_range(GuestAddress(MMIO_GAP_END)));
    }

    #[test]
    fn huge_pages_say_what_is_missing() {
        let huge = |size| Backing {
            shared: true,
            hugepage_size: Some(size),
        };
        let e = create_guest_memory(MIN_MEMORY, &huge(3 << 20)).unwrap_err();
        assert!(matches!(e, MemoryError::HugePageSize(_)), "{e}");
        let e = create_guest_memory(MIN_MEMORY + 4096, &huge(HUGEPAGE_2M)).unwrap_err();
        assert!(
            e.to_string().contains("whole number of 2M huge pages"),
            "{e}"
        );
        // Far more than any host here has free: the error names both counts.
        match create_guest_memory(1 << 40, &huge(HUGEPAGE_1G)).unwrap_err() {
            MemoryError::TooFewHugePages { needed, free, .. } => {
                assert_eq!(needed, 1024);
                assert!(free < needed);
            }
            MemoryError::NoHugePages { .. } => {}
            other => panic!("{other}"),
        }
    }
}
