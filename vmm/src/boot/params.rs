//! Boot parameters handed to the kernel: the zero page (`boot_params`) of the 64-bit Linux
//! boot protocol and the `hvm_start_info` of the PVH boot protocol.

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_params, E820_MAX_ENTRIES_ZEROPAGE};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::e820::E820Entry;
use super::linux::{InitrdRegion, KernelKind, LoadedKernel, CMDLINE_START};
use super::BootError;

/// Guest address of the zero page.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Guest address of the PVH `hvm_start_info`.
pub const PVH_INFO_START: u64 = 0x6000;
/// Guest address of the PVH memory map, right after the 56-byte `hvm_start_info`.
pub const PVH_MEMMAP_START: u64 = 0x6040;
/// End of the page holding the PVH structures.
const PVH_INFO_END: u64 = PVH_INFO_START + 0x1000;

/// "HdrS": the setup header magic.
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// The boot sector signature expected in `boot_flag`.
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `type_of_loader` for a boot loader without an assigned ID.
const KERNEL_LOADER_OTHER: u8 = 0xff;
/// Physical alignment a vmlinux expects (CONFIG_PHYSICAL_ALIGN default).
const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x0100_0000;
/// `hvm_start_info` version carrying the memory map fields.
const PVH_START_INFO_VERSION: u32 = 1;

/// Builds the zero page: the kernel's setup header (copied from a bzImage, synthesized for an
/// ELF vmlinux), the command line pointer, the initrd, the E820 map and the ACPI RSDP address
/// (`boot_params.acpi_rsdp_addr`, boot protocol 2.14 on; older kernels scan for the RSDP).
pub fn build_zero_page(
    kernel: &LoadedKernel,
    cmdline_len: usize,
    initrd: Option<InitrdRegion>,
    e820: &[E820Entry],
    rsdp: Option<GuestAddress>,
) -> Result<boot_params, BootError> {
    if e820.len() > E820_MAX_ENTRIES_ZEROPAGE {
        return Err(BootError::TooManyE820Entries(e820.len()));
    }
    let mut params = boot_params::default();
    match kernel.kind {
        KernelKind::Bzimage { setup_header } => params.hdr = setup_header,
        KernelKind::Elf64 { .. } | KernelKind::ElfPvh { .. } => {
            params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
            params.hdr.header = KERNEL_HDR_MAGIC;
            params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
        }
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    if let Some(initrd) = initrd {
        // `place_initrd` keeps the initrd below `initrd_addr_max`, which is a 32-bit field.
        params.hdr.ramdisk_image = initrd.addr.0 as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(e820) {
        *slot = entry.to_boot_e820_entry();
    }
    params.e820_entries = e820.len() as u8;
    params.acpi_rsdp_addr = rsdp.map_or(0, |addr| addr.0);
    Ok(params)
}

/// Writes `params` at [`ZERO_PAGE_START`] and returns that address.
pub fn write_zero_page(
    mem: &GuestMemoryMmap,
    params: &boot_params,
) -> Result<GuestAddress, BootError> {
    let addr = GuestAddress(ZERO_PAGE_START);
    let boot_params = BootParams::new::<boot_params>(params, addr);
    LinuxBootConfigurator::write_bootparams(&boot_params, mem).map_err(BootError::BootParams)?;
    Ok(addr)
}

/// Guest addresses of the PVH memory map and module list for `e820_len` map entries.
fn pvh_layout(e820_len: usize) -> Result<(GuestAddress, GuestAddress), BootError> {
    let memmap_size = (e820_len * std::mem::size_of::<hvm_memmap_table_entry>()) as u64;
    let modlist = (PVH_MEMMAP_START + memmap_size).next_multiple_of(8);
    let end = modlist + std::mem::size_of::<hvm_modlist_entry>() as u64;
    if end > PVH_INFO_END {
        return Err(BootError::TooManyE820Entries(e820_len));
    }
    Ok((GuestAddress(PVH_MEMMAP_START), GuestAddress(modlist)))
}

/// Writes the PVH `hvm_start_info` at [`PVH_INFO_START`], the memory map after it, and a
/// module entry for the initrd, with the ACPI RSDP address if there is one; returns the start
/// info address (the kernel's RBX).
pub fn write_pvh_start_info(
    mem: &GuestMemoryMmap,
    initrd: Option<InitrdRegion>,
    e820: &[E820Entry],
    rsdp: Option<GuestAddress>,
) -> Result<GuestAddress, BootError> {
    let (memmap_addr, modlist_addr) = pvh_layout(e820.len())?;
    let mut start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: PVH_START_INFO_VERSION,
        cmdline_paddr: CMDLINE_START,
        rsdp_paddr: rsdp.map_or(0, |addr| addr.0),
        memmap_paddr: memmap_addr.0,
        memmap_entries: e820.len() as u32,
        ..Default::default()
    };
    let memmap: Vec<hvm_memmap_table_entry> =
        e820.iter().map(E820Entry::to_hvm_memmap_entry).collect();
    let modules: Vec<hvm_modlist_entry> = initrd
        .map(|initrd| hvm_modlist_entry {
            paddr: initrd.addr.0,
            size: initrd.size,
            ..Default::default()
        })
        .into_iter()
        .collect();
    if !modules.is_empty() {
        start_info.nr_modules = modules.len() as u32;
        start_info.modlist_paddr = modlist_addr.0;
    }
    let addr = GuestAddress(PVH_INFO_START);
    let mut params = BootParams::new::<hvm_start_info>(&start_info, addr);
    params.set_sections::<hvm_memmap_table_entry>(&memmap, memmap_addr);
    if !modules.is_empty() {
        params.set_modules::<hvm_modlist_entry>(&modules, modlist_addr);
    }
    PvhBootConfigurator::write_bootparams(&params, mem).map_err(BootError::BootParams)?;
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::e820::{e820_map, E820Kind};
    use crate::boot::gdt::PML4_START;
    use crate::boot::linux::configure_linux_boot;
    use crate::boot::test_images::{bzimage, elf_image, BzImageSpec, TempFile};
    use vm_memory::Bytes;

    const MIB: u64 = 1 << 20;
    const CMDLINE: &str = "console=ttyS0 panic=1";

    fn memory(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
    }

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
            CMDLINE,
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
        assert_eq!({ hdr.cmdline_size }, CMDLINE.len() as u32);
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
        let boot = configure_linux_boot(&mem, kernel.path(), None, CMDLINE, 1, &Default::default())
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
        let mut cmdline = vec![0u8; CMDLINE.len() + 1];
        mem.read_slice(&mut cmdline, GuestAddress(0x2_0000))
            .unwrap();
        assert_eq!(&cmdline[..CMDLINE.len()], CMDLINE.as_bytes());
        assert_eq!(cmdline[CMDLINE.len()], 0);
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
            CMDLINE,
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

    #[test]
    fn zero_page_carries_memory_above_4_gib() {
        let mem = memory(64 * MIB);
        let image = elf_image(0x100_0000, b"vmlinux", 0x1000, None);
        let file = TempFile::with_contents(&image);
        let kernel = crate::boot::load_kernel(&mem, file.path()).unwrap();
        let e820 = e820_map(8 << 30);
        let params = build_zero_page(&kernel, 0, None, &e820, None).unwrap();
        assert_eq!(params.e820_entries, 4);
        let high = params.e820_table[3];
        assert_eq!(({ high.addr }, { high.size }), (4 << 30, 5 << 30));
    }

    #[test]
    fn too_many_e820_entries_are_rejected() {
        let mem = memory(16 * MIB);
        let entry = E820Entry {
            addr: 0,
            size: 4096,
            kind: E820Kind::Ram,
        };
        let kernel = LoadedKernel {
            entry: GuestAddress(0x100_0000),
            kernel_end: 0x100_1000,
            kind: KernelKind::Elf64 {
                entry: GuestAddress(0x100_0000),
            },
        };
        let e820 = vec![entry; 129];
        assert!(matches!(
            build_zero_page(&kernel, 0, None, &e820, None),
            Err(BootError::TooManyE820Entries(129))
        ));
        // The PVH page holds up to 165 entries after the start info.
        assert!(write_pvh_start_info(&mem, None, &e820, None).is_ok());
        let e820 = vec![entry; 200];
        assert!(matches!(
            write_pvh_start_info(&mem, None, &e820, None),
            Err(BootError::TooManyE820Entries(200))
        ));
    }
}
