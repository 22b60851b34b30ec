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
use super::kernel::{InitrdRegion, KernelKind, LoadedKernel, CMDLINE_START};
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
    use crate::boot::test_images::{elf_image, TempFile};

    const MIB: u64 = 1 << 20;

    fn memory(size: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size as usize)]).unwrap()
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
