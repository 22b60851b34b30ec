//! Everything the guest needs in memory and registers before its first instruction: the E820
//! map, the kernel, initrd and command line, the zero page or PVH start info, the boot GDT and
//! page tables, the MP and ACPI tables, and the CPUID and MSR values. Pure code: no KVM ioctls
//! here.

pub mod acpi;
pub mod cpuid;
pub mod e820;
pub mod gdt;
pub mod kernel;
pub mod kernel_check;
pub mod linux;
pub mod mptable;
pub mod msrs;
pub mod params;

#[cfg(test)]
mod test_images;

use std::path::PathBuf;

use thiserror::Error;

/// Errors preparing the guest for boot.
#[derive(Debug, Error)]
pub enum BootError {
    /// The kernel image cannot be opened or read.
    #[error("Cannot read kernel {}: {source}", path.display())]
    KernelFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The kernel file has neither a bzImage setup header nor an ELF header.
    #[error("File is neither a bzImage nor an ELF vmlinux: {}", path.display())]
    NotAKernel { path: PathBuf },
    /// The kernel file is shorter than its own headers say.
    #[error("Kernel {} is truncated or invalid: its headers describe {needs} bytes, the file has {has}", path.display())]
    Truncated { path: PathBuf, needs: u64, has: u64 },
    /// linux-loader rejected the kernel image.
    #[error("Cannot load kernel {}: {source}", path.display())]
    KernelLoad {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    /// The bzImage does not support the 64-bit boot protocol.
    #[error("bzImage {} does not support the 64-bit boot protocol", path.display())]
    Not64BitBzImage { path: PathBuf },
    /// The initrd cannot be opened or read.
    #[error("Cannot read initrd {}: {source}", path.display())]
    InitrdFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// There is no room for the initrd between the kernel and the top of usable low memory.
    #[error("Memory too small: kernel ends at {kernel_end:#x}, initrd needs {initrd_size} bytes")]
    MemoryTooSmall { kernel_end: u64, initrd_size: u64 },
    /// The command line (with its NUL) is longer than the kernel accepts.
    #[error("Kernel command line too long: {len} bytes, the limit is {max} including the NUL")]
    CmdlineTooLong { len: usize, max: usize },
    /// The command line contains something the kernel cannot parse.
    #[error("Invalid kernel command line: {0}")]
    InvalidCmdline(linux_loader::cmdline::Error),
    /// The command line cannot be written to guest memory.
    #[error("Cannot write kernel command line: {0}")]
    CmdlineWrite(linux_loader::loader::Error),
    /// The zero page or PVH start info cannot be written.
    #[error("Cannot write boot parameters: {0}")]
    BootParams(linux_loader::configurator::Error),
    /// A boot structure cannot be written to guest memory.
    #[error("Cannot write {what} to guest memory: {source}")]
    GuestMemory {
        what: &'static str,
        source: vm_memory::GuestMemoryError,
    },
    /// The memory map has more entries than the boot protocol can carry.
    #[error("Too many E820 entries: {0}")]
    TooManyE820Entries(usize),
    /// The MP table and the ACPI tables need at least one vCPU.
    #[error("The MP and ACPI tables need at least one vCPU")]
    NoVcpus,
    /// The MP table (or ACPI MADT) for this many vCPUs does not fit in its reserved space.
    #[error("Too many vCPUs for the {table}: {count} (at most {max})")]
    TooManyVcpus {
        table: &'static str,
        count: usize,
        max: usize,
    },
    #[error("The ACPI tables take {size} bytes; the BIOS area has room for {room}")]
    AcpiTooLarge { size: u64, room: u64 },
}

pub use e820::{e820_map, E820Entry, E820Kind};
pub use kernel::{KernelKind, LoadedKernel};
pub use linux::{configure_linux_boot, load_kernel, LinuxBoot};
