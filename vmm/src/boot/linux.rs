//! Loading a Linux kernel (bzImage or ELF vmlinux), its initrd and command line into guest
//! memory, and the initial register state for the 64-bit and PVH boot protocols.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use kvm_bindings::kvm_regs;
use linux_loader::cmdline::{Cmdline, Error as CmdlineError};
use linux_loader::loader::bootparam::XLF_KERNEL_64;
use linux_loader::loader::elf::PvhBootCapability;
use linux_loader::loader::{load_cmdline, BzImage, Elf, KernelLoader, KernelLoaderResult};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::acpi;
use super::gdt::{self, BootSregs};
use super::kernel::{InitrdRegion, KernelKind, LoadedKernel, CMDLINE_START};
use super::params::{self, ZERO_PAGE_START};
use super::BootError;
use crate::memory::MMIO_GAP_START;

/// Lowest address a kernel may be loaded at (1 MiB).
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// Initial stack pointer for the 64-bit boot protocol (just below the page tables).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Initial RFLAGS: only the always-one bit 1.
pub const BOOT_RFLAGS: u64 = 0x2;

/// Offset of the 64-bit entry point from the load address of a bzImage's protected-mode code.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// Offset and value of the bzImage setup header magic "HdrS".
const BZIMAGE_MAGIC_OFFSET: usize = 0x202;
const BZIMAGE_MAGIC: &[u8; 4] = b"HdrS";
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// Boot protocol 2.12 introduced `xloadflags` (and with it the 64-bit entry flag).
const BOOT_PROTOCOL_2_12: u16 = 0x020c;
const PAGE_SIZE: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KernelFormat {
    BzImage,
    Elf,
}

fn kernel_file_error(path: &Path) -> impl FnOnce(std::io::Error) -> BootError + '_ {
    move |source| BootError::KernelFile {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads the start of the file and tells a bzImage from an ELF file.
fn detect_format(file: &mut File, path: &Path) -> Result<KernelFormat, BootError> {
    let mut head = Vec::with_capacity(BZIMAGE_MAGIC_OFFSET + 4);
    file.by_ref()
        .take((BZIMAGE_MAGIC_OFFSET + 4) as u64)
        .read_to_end(&mut head)
        .map_err(kernel_file_error(path))?;
    if head.starts_with(ELF_MAGIC) {
        Ok(KernelFormat::Elf)
    } else if head.get(BZIMAGE_MAGIC_OFFSET..) == Some(BZIMAGE_MAGIC.as_slice()) {
        Ok(KernelFormat::BzImage)
    } else {
        Err(BootError::NotAKernel {
            path: path.to_path_buf(),
        })
    }
}

/// Loads the bzImage or ELF vmlinux at `path` into `mem`.
pub fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<LoadedKernel, BootError> {
    let mut file = File::open(path).map_err(kernel_file_error(path))?;
    let format = detect_format(&mut file, path)?;
    super::kernel_check::check_complete(&mut file, path, format == KernelFormat::Elf)?;
    let highmem = Some(GuestAddress(HIGH_RAM_START));
    let load_error = |source| BootError::KernelLoad {
        path: path.to_path_buf(),
        source,
    };
    match format {
        KernelFormat::Elf => {
            let result = Elf::load(mem, None, &mut file, highmem).map_err(load_error)?;
            Ok(loaded_elf(&result))
        }
        KernelFormat::BzImage => {
            let result = BzImage::load(mem, None, &mut file, highmem).map_err(load_error)?;
            loaded_bzimage(&result, path)
        }
    }
}

fn loaded_elf(result: &KernelLoaderResult) -> LoadedKernel {
    let (entry, kind) = match result.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) => (entry, KernelKind::ElfPvh { entry }),
        _ => {
            let entry = result.kernel_load;
            (entry, KernelKind::Elf64 { entry })
        }
    };
    LoadedKernel {
        entry,
        kernel_end: result.kernel_end,
        kind,
    }
}

fn loaded_bzimage(result: &KernelLoaderResult, path: &Path) -> Result<LoadedKernel, BootError> {
    let not_64bit = || BootError::Not64BitBzImage {
        path: path.to_path_buf(),
    };
    let header = result.setup_header.ok_or_else(not_64bit)?;
    if header.version < BOOT_PROTOCOL_2_12 || header.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(not_64bit());
    }
    // The kernel decompresses itself into `init_size` bytes at its runtime address, which is
    // the load address or `pref_address`, whichever is higher: keep the initrd clear of both.
    let load_addr = result.kernel_load.0;
    let runtime_start = load_addr.max(header.pref_address);
    let kernel_end = result
        .kernel_end
        .max(runtime_start.saturating_add(u64::from(header.init_size)));
    Ok(LoadedKernel {
        entry: GuestAddress(load_addr + BZIMAGE_64BIT_ENTRY_OFFSET),
        kernel_end,
        kind: KernelKind::Bzimage {
            setup_header: header,
        },
    })
}

/// Total bytes of RAM in `mem`.
pub fn ram_size(mem: &GuestMemoryMmap) -> u64 {
    mem.iter().map(|region| region.len()).sum()
}

/// Picks the highest page-aligned address for an initrd of `size` bytes that ends at or below
/// `addr_max` (inclusive) and `low_ram_end` (exclusive) and starts at or above `kernel_end`.
pub fn place_initrd(
    low_ram_end: u64,
    kernel_end: u64,
    addr_max: u64,
    size: u64,
) -> Result<GuestAddress, BootError> {
    let too_small = BootError::MemoryTooSmall {
        kernel_end,
        initrd_size: size,
    };
    let top = low_ram_end.min(addr_max.saturating_add(1));
    let Some(start) = top.checked_sub(size) else {
        return Err(too_small);
    };
    let start = start & !(PAGE_SIZE - 1);
    let lowest = kernel_end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    if start < lowest {
        return Err(too_small);
    }
    Ok(GuestAddress(start))
}

/// Loads the initrd at `path` as high as the kernel allows in low RAM, above the kernel.
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    path: &Path,
    kernel: &LoadedKernel,
) -> Result<InitrdRegion, BootError> {
    let file_error = |source| BootError::InitrdFile {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(file_error)?;
    let size = file.metadata().map_err(file_error)?.len();
    let low_ram_end = ram_size(mem).min(MMIO_GAP_START);
    let addr = place_initrd(
        low_ram_end,
        kernel.kernel_end,
        kernel.initrd_addr_max(),
        size,
    )?;
    let count = usize::try_from(size).map_err(|_| BootError::MemoryTooSmall {
        kernel_end: kernel.kernel_end,
        initrd_size: size,
    })?;
    mem.read_exact_volatile_from(addr, &mut file, count)
        .map_err(|source| BootError::GuestMemory {
            what: "initrd",
            source,
        })?;
    Ok(InitrdRegion { addr, size })
}

/// Writes `cmdline` at [`CMDLINE_START`] if it fits in `capacity` bytes including the NUL, and
/// returns its length without the NUL.
pub fn write_cmdline(
    mem: &GuestMemoryMmap,
    cmdline: &str,
    capacity: usize,
) -> Result<usize, BootError> {
    let mut parsed = Cmdline::new(capacity).map_err(BootError::InvalidCmdline)?;
    parsed.insert_str(cmdline).map_err(|e| match e {
        CmdlineError::TooLarge => BootError::CmdlineTooLong {
            len: cmdline.trim().len() + 1,
            max: capacity,
        },
        other => BootError::InvalidCmdline(other),
    })?;
    let length = parsed
        .as_cstring()
        .map_err(BootError::InvalidCmdline)?
        .as_bytes()
        .len();
    load_cmdline(mem, GuestAddress(CMDLINE_START), &parsed).map_err(BootError::CmdlineWrite)?;
    Ok(length)
}

/// General-purpose register state for the first instruction of the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BootRegs {
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    /// Zero page address (64-bit boot protocol).
    pub rsi: u64,
    /// `hvm_start_info` address (PVH).
    pub rbx: u64,
    pub rflags: u64,
}

impl BootRegs {
    /// The full `kvm_regs` for KVM_SET_REGS: these values, every other register zero.
    pub fn to_kvm_regs(&self) -> kvm_regs {
        kvm_regs {
            rip: self.rip,
            rsp: self.rsp,
            rbp: self.rbp,
            rsi: self.rsi,
            rbx: self.rbx,
            rflags: self.rflags,
            ..Default::default()
        }
    }
}

/// Registers for the 64-bit Linux boot protocol: RSI points at the zero page.
pub fn boot_regs_64(entry: GuestAddress, zero_page: GuestAddress) -> BootRegs {
    BootRegs {
        rip: entry.0,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: zero_page.0,
        rbx: 0,
        rflags: BOOT_RFLAGS,
    }
}

/// Registers for the PVH boot protocol: RBX points at the `hvm_start_info`.
pub fn boot_regs_pvh(entry: GuestAddress, start_info: GuestAddress) -> BootRegs {
    BootRegs {
        rip: entry.0,
        rbx: start_info.0,
        rflags: BOOT_RFLAGS,
        ..Default::default()
    }
}

/// Everything [`configure_linux_boot`] set up, for the vCPU code to apply.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinuxBoot {
    pub kernel: LoadedKernel,
    pub initrd: Option<InitrdRegion>,
    pub regs: BootRegs,
    pub sregs: BootSregs,
}

/// Loads kernel, initrd and command line, writes the ACPI tables for `vcpu_count` vCPUs, the
/// zero page or PVH start info (pointing at the ACPI RSDP) and the boot GDT (plus page tables
/// for 64-bit boot), and returns the boot vCPU's initial state.
pub fn configure_linux_boot(
    mem: &GuestMemoryMmap,
    kernel_path: &Path,
    initrd_path: Option<&Path>,
    cmdline: &str,
    vcpu_count: usize,
    platform: &acpi::AcpiPlatform,
) -> Result<LinuxBoot, BootError> {
    let kernel = load_kernel(mem, kernel_path)?;
    let cmdline_len = write_cmdline(mem, cmdline, kernel.cmdline_capacity())?;
    let initrd = initrd_path
        .map(|path| load_initrd(mem, path, &kernel))
        .transpose()?;
    let mut e820 = super::e820_map(ram_size(mem));
    if let Some(ecam) = platform.ecam {
        super::e820::reserve(&mut e820, ecam.base, ecam.size());
    }
    let rsdp = Some(acpi::setup_acpi(mem, vcpu_count, platform)?);
    if kernel.is_pvh() {
        let start_info = params::write_pvh_start_info(mem, initrd, &e820, rsdp)?;
        Ok(LinuxBoot {
            kernel,
            initrd,
            regs: boot_regs_pvh(kernel.entry, start_info),
            sregs: gdt::write_protected_mode_tables(mem)?,
        })
    } else {
        let zero_page = params::build_zero_page(&kernel, cmdline_len, initrd, &e820, rsdp)?;
        params::write_zero_page(mem, &zero_page)?;
        Ok(LinuxBoot {
            kernel,
            initrd,
            regs: boot_regs_64(kernel.entry, GuestAddress(ZERO_PAGE_START)),
            sregs: gdt::write_long_mode_tables(mem)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::e820::e820_map;
    use crate::boot::gdt::PML4_START;
    use crate::boot::kernel::{CMDLINE_MAX_SIZE, DEFAULT_INITRD_ADDR_MAX};
    use crate::boot::params::PVH_INFO_START;
    use crate::boot::test_images::{bzimage, elf_image, BzImageSpec, TempFile};
    use linux_loader::loader::bootparam::boot_params;
    use linux_loader::loader::elf::start_info::{
        hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
    };

    const MIB: u64 = 1 << 20;
    const VMLINUX_PADDR: u64 = 0x100_0000;

    fn memory(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
    }

    fn read_bytes(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn vmlinux(pvh_entry: Option<u32>) -> TempFile {
        TempFile::with_contents(&elf_image(VMLINUX_PADDR, b"vmlinux!", 0x10_0000, pvh_entry))
    }

    #[test]
    fn not_a_kernel_is_a_clear_error() {
        let mem = memory(16 * MIB);
        for contents in [&b""[..], b"#!/bin/sh\necho hello\n", &[0u8; 4096]] {
            let file = TempFile::with_contents(contents);
            let err = load_kernel(&mem, file.path()).unwrap_err();
            assert!(matches!(err, BootError::NotAKernel { .. }), "{err}");
            assert!(err
                .to_string()
                .starts_with("File is neither a bzImage nor an ELF vmlinux"));
        }
    }

    #[test]
    fn missing_kernel_names_the_path() {
        let mem = memory(16 * MIB);
        let path = Path::new("/nonexistent/exitless/vmlinux");
        let err = load_kernel(&mem, path).unwrap_err();
        assert!(matches!(err, BootError::KernelFile { .. }));
        assert!(
            err.to_string().contains("/nonexistent/exitless/vmlinux"),
            "{err}"
        );
    }

    #[test]
    fn elf_without_pvh_note_boots_64_bit() {
        let mem = memory(32 * MIB);
        let kernel = load_kernel(&mem, vmlinux(None).path()).unwrap();
        let entry = GuestAddress(VMLINUX_PADDR);
        assert_eq!(kernel.kind, KernelKind::Elf64 { entry });
        assert_eq!(kernel.entry, entry);
        assert_eq!(kernel.kernel_end, VMLINUX_PADDR + 0x10_0000);
        assert_eq!(read_bytes(&mem, VMLINUX_PADDR, 8), b"vmlinux!");
        assert!(!kernel.is_pvh());
    }

    #[test]
    fn elf_with_pvh_note_boots_pvh() {
        let mem = memory(32 * MIB);
        let kernel = load_kernel(&mem, vmlinux(Some(0x100_0040)).path()).unwrap();
        let entry = GuestAddress(0x100_0040);
        assert_eq!(kernel.kind, KernelKind::ElfPvh { entry });
        assert_eq!(kernel.entry, entry);
        assert!(kernel.is_pvh());
        assert_eq!(kernel.initrd_addr_max(), DEFAULT_INITRD_ADDR_MAX);
    }

    #[test]
    fn elf_below_1_mib_is_rejected() {
        let mem = memory(16 * MIB);
        let file = TempFile::with_contents(&elf_image(0x8000, b"low", 0x1000, None));
        let err = load_kernel(&mem, file.path()).unwrap_err();
        assert!(matches!(err, BootError::KernelLoad { .. }), "{err}");
    }

    #[test]
    fn bzimage_loads_at_1_mib_with_64_bit_entry() {
        let mem = memory(32 * MIB);
        let file = TempFile::with_contents(&bzimage(&BzImageSpec::default(), b"payload"));
        let kernel = load_kernel(&mem, file.path()).unwrap();
        assert_eq!(read_bytes(&mem, HIGH_RAM_START, 7), b"payload");
        assert_eq!(kernel.entry, GuestAddress(0x10_0200));
        // Decompression needs init_size bytes at pref_address (16 MiB).
        assert_eq!(kernel.kernel_end, 0x100_0000 + 0x20_0000);
        let KernelKind::Bzimage { setup_header } = kernel.kind else {
            panic!("not a bzImage: {kernel:?}");
        };
        assert_eq!({ setup_header.version }, 0x020f);
        assert_eq!({ setup_header.code32_start }, 0x10_0000);
        assert_eq!(kernel.initrd_addr_max(), 0x7fff_ffff);
        assert_eq!(kernel.cmdline_capacity(), 2048);
    }

    #[test]
    fn bzimage_without_64_bit_entry_is_rejected() {
        let mem = memory(32 * MIB);
        for spec in [
            BzImageSpec {
                xloadflags: 0,
                ..Default::default()
            },
            BzImageSpec {
                version: 0x020a,
                ..Default::default()
            },
        ] {
            let file = TempFile::with_contents(&bzimage(&spec, b"payload"));
            let err = load_kernel(&mem, file.path()).unwrap_err();
            assert!(matches!(err, BootError::Not64BitBzImage { .. }), "{err}");
        }
    }

    #[test]
    fn cmdline_is_written_with_nul() {
        let mem = memory(16 * MIB);
        let len = write_cmdline(&mem, "console=ttyS0 reboot=k", CMDLINE_MAX_SIZE).unwrap();
        assert_eq!(len, 22);
        assert_eq!(
            read_bytes(&mem, CMDLINE_START, 23),
            b"console=ttyS0 reboot=k\0"
        );
    }

    #[test]
    fn cmdline_limit_counts_the_nul() {
        let mem = memory(16 * MIB);
        let longest = "a".repeat(CMDLINE_MAX_SIZE - 1);
        assert_eq!(
            write_cmdline(&mem, &longest, CMDLINE_MAX_SIZE).unwrap(),
            4095
        );
        let too_long = "a".repeat(CMDLINE_MAX_SIZE);
        let err = write_cmdline(&mem, &too_long, CMDLINE_MAX_SIZE).unwrap_err();
        assert!(
            matches!(
                err,
                BootError::CmdlineTooLong {
                    len: 4097,
                    max: 4096
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn cmdline_with_control_characters_is_invalid() {
        let mem = memory(16 * MIB);
        let err = write_cmdline(&mem, "console=ttyS0\nquiet", CMDLINE_MAX_SIZE).unwrap_err();
        assert!(matches!(err, BootError::InvalidCmdline(_)), "{err}");
    }

    #[test]
    fn initrd_goes_as_high_as_allowed_and_page_aligned() {
        let addr = place_initrd(64 * MIB, 17 * MIB, DEFAULT_INITRD_ADDR_MAX, 5000).unwrap();
        assert_eq!(addr, GuestAddress(64 * MIB - 8192));
        // initrd_addr_max is inclusive: the initrd may end exactly at addr_max + 1.
        let addr = place_initrd(1 << 30, 17 * MIB, 0x1fff_ffff, 4096).unwrap();
        assert_eq!(addr, GuestAddress(0x2000_0000 - 4096));
    }

    #[test]
    fn initrd_that_does_not_fit_is_an_error() {
        let err = place_initrd(32 * MIB, 18 * MIB, DEFAULT_INITRD_ADDR_MAX, 15 * MIB).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Memory too small: kernel ends at 0x1200000, initrd needs 15728640 bytes"
        );
        assert!(place_initrd(32 * MIB, 18 * MIB, DEFAULT_INITRD_ADDR_MAX, u64::MAX).is_err());
        // Exactly fitting between the page-aligned kernel end and the top of RAM is fine.
        assert!(place_initrd(32 * MIB, 18 * MIB - 1, DEFAULT_INITRD_ADDR_MAX, 14 * MIB).is_ok());
    }

    #[test]
    fn initrd_is_loaded_above_the_kernel() {
        let mem = memory(64 * MIB);
        let kernel = load_kernel(&mem, vmlinux(None).path()).unwrap();
        let initrd = TempFile::with_contents(b"initramfs contents");
        let region = load_initrd(&mem, initrd.path(), &kernel).unwrap();
        assert_eq!(region.size, 18);
        assert_eq!(region.addr, GuestAddress(64 * MIB - 4096));
        assert_eq!(read_bytes(&mem, region.addr.0, 18), b"initramfs contents");
    }

    #[test]
    fn initrd_too_big_for_memory_is_an_error() {
        let mem = memory(32 * MIB);
        let file = TempFile::with_contents(&bzimage(&BzImageSpec::default(), b"payload"));
        let kernel = load_kernel(&mem, file.path()).unwrap();
        let initrd = TempFile::with_contents(&vec![0u8; 15 * MIB as usize]);
        let err = load_initrd(&mem, initrd.path(), &kernel).unwrap_err();
        assert!(matches!(err, BootError::MemoryTooSmall { .. }), "{err}");
        let missing = load_initrd(&mem, Path::new("/nonexistent/initrd"), &kernel).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/initrd"));
    }

    #[test]
    fn boot_regs_point_at_the_boot_structures() {
        let regs = boot_regs_64(GuestAddress(0x10_0200), GuestAddress(0x7000));
        assert_eq!((regs.rip, regs.rsi, regs.rflags), (0x10_0200, 0x7000, 2));
        assert_eq!(regs.rsp, BOOT_STACK_POINTER);
        let kvm = boot_regs_pvh(GuestAddress(0x100_0040), GuestAddress(0x6000)).to_kvm_regs();
        assert_eq!(
            (kvm.rip, kvm.rbx, kvm.rflags, kvm.rsi),
            (0x100_0040, 0x6000, 2, 0)
        );
    }

    #[test]
    fn bzimage_cmdline_limit_comes_from_the_header() {
        let mem = memory(64 * MIB);
        let file = TempFile::with_contents(&bzimage(&BzImageSpec::default(), b"payload"));
        let cmdline = "a".repeat(3000);
        let err = configure_linux_boot(&mem, file.path(), None, &cmdline, 1, &Default::default())
            .unwrap_err();
        assert!(
            matches!(err, BootError::CmdlineTooLong { max: 2048, .. }),
            "{err}"
        );
    }

    // The zero page and PVH start info as configure_linux_boot writes them.

    const BOOT_CMDLINE: &str = "console=ttyS0 panic=1";

    fn read_zero_page(mem: &GuestMemoryMmap) -> boot_params {
        mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap()
    }

    fn assert_e820_matches(params: &boot_params, mem_size: u64) {
        let expected = e820_map(mem_size);
        assert_eq!(usize::from(params.e820_entries), expected.len());
        for (slot, entry) in params.e820_table.iter().zip(&expected) {
            let (addr, size, kind) = ({ slot.addr }, { slot.size }, { slot.r#type });
            assert_eq!(
                (addr, size, kind),
                (entry.addr, entry.size, entry.kind as u32)
            );
        }
    }

    #[test]
    fn bzimage_zero_page_has_header_cmdline_initrd_and_e820() {
        let mem = memory(64 * MIB);
        let kernel = TempFile::with_contents(&bzimage(&BzImageSpec::default(), b"payload"));
        let initrd = TempFile::with_contents(&[7u8; 10_000]);
        let boot = configure_linux_boot(
            &mem,
            kernel.path(),
            Some(initrd.path()),
            BOOT_CMDLINE,
            1,
            &Default::default(),
        )
        .unwrap();
        let params = read_zero_page(&mem);
        let hdr = params.hdr;
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!(
            { hdr.version },
            0x020f,
            "setup header copied from the image"
        );
        assert_eq!({ hdr.type_of_loader }, 0xff);
        assert_eq!({ hdr.cmd_line_ptr }, 0x2_0000);
        assert_eq!({ hdr.cmdline_size }, BOOT_CMDLINE.len() as u32);
        assert_eq!({ hdr.ramdisk_image }, (64 * MIB - 3 * 4096) as u32);
        assert_eq!({ hdr.ramdisk_size }, 10_000);
        assert_e820_matches(&params, 64 * MIB);
        assert_eq!({ params.acpi_rsdp_addr }, 0xe_0000, "ACPI RSDP");
        assert_eq!(boot.regs.rsi, ZERO_PAGE_START);
        assert_eq!(boot.regs.rip, 0x10_0200);
        assert_eq!(boot.sregs.cr3, PML4_START);
        assert_eq!(boot.initrd.map(|i| i.size), Some(10_000));
    }

    #[test]
    fn elf_zero_page_has_a_synthesized_header() {
        let mem = memory(64 * MIB);
        let image = elf_image(0x100_0000, b"vmlinux", 0x1000, None);
        let kernel = TempFile::with_contents(&image);
        let boot = configure_linux_boot(
            &mem,
            kernel.path(),
            None,
            BOOT_CMDLINE,
            1,
            &Default::default(),
        )
        .unwrap();
        let params = read_zero_page(&mem);
        let hdr = params.hdr;
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!({ hdr.kernel_alignment }, 0x0100_0000);
        assert_eq!({ hdr.type_of_loader }, 0xff);
        assert_eq!({ hdr.cmd_line_ptr }, 0x2_0000);
        assert_eq!(({ hdr.ramdisk_image }, { hdr.ramdisk_size }), (0, 0));
        assert_e820_matches(&params, 64 * MIB);
        assert_eq!(
            (boot.regs.rip, boot.regs.rsi),
            (0x100_0000, ZERO_PAGE_START)
        );
        let mut cmdline = vec![0u8; BOOT_CMDLINE.len() + 1];
        mem.read_slice(&mut cmdline, GuestAddress(0x2_0000))
            .unwrap();
        assert_eq!(&cmdline[..BOOT_CMDLINE.len()], BOOT_CMDLINE.as_bytes());
        assert_eq!(cmdline[BOOT_CMDLINE.len()], 0);
    }

    #[test]
    fn pvh_start_info_has_magic_memmap_cmdline_and_module() {
        let mem = memory(64 * MIB);
        let image = elf_image(0x100_0000, b"vmlinux", 0x1000, Some(0x100_0040));
        let kernel = TempFile::with_contents(&image);
        let initrd = TempFile::with_contents(b"initrd");
        let boot = configure_linux_boot(
            &mem,
            kernel.path(),
            Some(initrd.path()),
            BOOT_CMDLINE,
            1,
            &Default::default(),
        )
        .unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(PVH_INFO_START)).unwrap();
        assert_eq!((info.magic, info.version), (0x336e_c578, 1));
        assert_eq!(info.cmdline_paddr, 0x2_0000);
        assert_eq!(info.rsdp_paddr, 0xe_0000, "ACPI RSDP");
        assert_eq!(info.memmap_paddr, 0x6040);
        let expected = e820_map(64 * MIB);
        assert_eq!(info.memmap_entries as usize, expected.len());
        for (i, entry) in expected.iter().enumerate() {
            let addr = GuestAddress(info.memmap_paddr + 24 * i as u64);
            let read: hvm_memmap_table_entry = mem.read_obj(addr).unwrap();
            assert_eq!((read.addr, read.size), (entry.addr, entry.size));
            assert_eq!(read.type_, entry.kind as u32);
        }
        assert_eq!(info.nr_modules, 1);
        let module: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!((module.paddr, module.size), (64 * MIB - 4096, 6));
        assert!(info.modlist_paddr >= info.memmap_paddr + 24 * expected.len() as u64);
        assert_eq!((boot.regs.rip, boot.regs.rbx), (0x100_0040, PVH_INFO_START));
        assert_eq!(boot.sregs.cr3, 0);
    }

    #[test]
    fn pvh_without_initrd_has_no_modules() {
        let mem = memory(32 * MIB);
        let image = elf_image(0x100_0000, b"vmlinux", 0x1000, Some(0x100_0040));
        let kernel = TempFile::with_contents(&image);
        configure_linux_boot(&mem, kernel.path(), None, "", 1, &Default::default()).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(PVH_INFO_START)).unwrap();
        assert_eq!((info.nr_modules, info.modlist_paddr), (0, 0));
        let mut signature = [0u8; 8];
        mem.read_slice(&mut signature, GuestAddress(info.rsdp_paddr))
            .unwrap();
        assert_eq!(&signature, b"RSD PTR ");
    }
}
