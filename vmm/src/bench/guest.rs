//! The embedded bench guest and the addresses it uses (mirrors guest/layout.h).

use std::io::Cursor;

use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

use crate::boot::linux::{write_cmdline, CMDLINE_MAX_SIZE};
use crate::boot::params::write_pvh_start_info;
use crate::boot::{e820_map, BootError};

/// The bench guest ELF (PVH note, loads at 1 MiB), built from guest/ by build.rs.
pub const BENCH_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bench-guest.elf"));

pub const COM1_PORT: u64 = 0x3f8;
pub const EXIT_PORT: u64 = 0xf4;
pub const MARKER_PORT: u64 = 0x7e8;
pub const BENCH_PORT: u64 = 0x7e0;
pub const BENCH_MMIO: u64 = 0xd000_0000;
pub const BENCH_MAGIC: u32 = 0x600d_cafe;
pub const MARKER_BEGIN: u32 = 1;
pub const MARKER_END: u32 = 2;

/// Errors loading the bench guest.
#[derive(Debug, Error)]
pub enum GuestError {
    #[error("Cannot load the bench guest: {0}")]
    Load(#[from] linux_loader::loader::Error),
    #[error("The bench guest has no PVH entry note")]
    NoPvhEntry,
    #[error(transparent)]
    Boot(#[from] BootError),
}

/// Where the loaded guest starts and where its start info lies.
pub struct LoadedGuest {
    pub entry: u64,
    pub start_info: u64,
}

/// Loads the bench guest and its PVH start info (memory map, `cmdline`) into `mem`.
pub fn load(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    cmdline: &str,
) -> Result<LoadedGuest, GuestError> {
    let loaded = Elf::load(mem, None, &mut Cursor::new(BENCH_GUEST), None)?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(GuestError::NoPvhEntry);
    };
    write_cmdline(mem, cmdline, CMDLINE_MAX_SIZE)?;
    let start_info = write_pvh_start_info(mem, None, &e820_map(mem_size), None)?;
    Ok(LoadedGuest {
        entry: entry.0,
        start_info: start_info.0,
    })
}
