//! What a loaded kernel is (its format, entry and limits) and where the boot protocol puts
//! the command line: shared by the loader (`linux`) and the boot parameters (`params`).

use linux_loader::loader::bootparam::setup_header;
use vm_memory::GuestAddress;

/// Guest address of the kernel command line.
pub const CMDLINE_START: u64 = 0x2_0000;
/// Largest command line exitless writes, including the terminating NUL.
pub const CMDLINE_MAX_SIZE: usize = 4096;
/// Highest initrd address for kernels that do not say otherwise (boot protocol < 2.03).
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;
/// Boot protocol 2.06 introduced the `cmdline_size` field.
pub(super) const BOOT_PROTOCOL_2_06: u16 = 0x0206;

/// What kind of kernel was loaded and how it must be entered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelKind {
    /// A bzImage, entered through the 64-bit boot protocol with a zero page.
    Bzimage {
        /// The image's setup header, with `code32_start` set to where it was loaded.
        setup_header: setup_header,
    },
    /// An ELF vmlinux with a PVH note, entered in 32-bit protected mode at `entry`.
    ElfPvh { entry: GuestAddress },
    /// An ELF vmlinux without a PVH note, entered through the 64-bit boot protocol.
    Elf64 { entry: GuestAddress },
}

/// A kernel in guest memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadedKernel {
    /// Where the vCPU starts executing.
    pub entry: GuestAddress,
    /// First guest address past everything the kernel occupies before it reads its memory map.
    pub kernel_end: u64,
    /// The format and boot protocol.
    pub kind: KernelKind,
}

impl LoadedKernel {
    /// Whether the kernel boots through the PVH protocol (otherwise the 64-bit Linux protocol).
    pub fn is_pvh(&self) -> bool {
        matches!(self.kind, KernelKind::ElfPvh { .. })
    }

    /// Highest address the initrd may occupy (inclusive).
    pub fn initrd_addr_max(&self) -> u64 {
        match self.kind {
            KernelKind::Bzimage { setup_header } if setup_header.initrd_addr_max != 0 => {
                u64::from(setup_header.initrd_addr_max)
            }
            _ => DEFAULT_INITRD_ADDR_MAX,
        }
    }

    /// Longest command line the kernel accepts, including the NUL.
    pub fn cmdline_capacity(&self) -> usize {
        match self.kind {
            KernelKind::Bzimage { setup_header }
                if setup_header.version >= BOOT_PROTOCOL_2_06 && setup_header.cmdline_size != 0 =>
            {
                CMDLINE_MAX_SIZE.min(setup_header.cmdline_size as usize + 1)
            }
            _ => CMDLINE_MAX_SIZE,
        }
    }
}

/// Where an initrd was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitrdRegion {
    /// First guest address (page aligned).
    pub addr: GuestAddress,
    /// Size in bytes.
    pub size: u64,
}
