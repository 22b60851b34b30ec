//! The bench guest, embedded, and the addresses it uses (mirrors layout.h): what the lab runs
//! and the core's tests boot. The lowest crate of the workspace: it imports nothing of ours.

/// The bench guest ELF (PVH note, loads at 1 MiB), built from this crate's C by build.rs.
pub const BENCH_GUEST: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bench-guest.elf"));

pub const COM1_PORT: u64 = 0x3f8;
pub const EXIT_PORT: u64 = 0xf4;
pub const MARKER_PORT: u64 = 0x7e8;
pub const BENCH_PORT: u64 = 0x7e0;
pub const BENCH_MMIO: u64 = 0xd000_0000;
pub const BENCH_MAGIC: u32 = 0x600d_cafe;
pub const MARKER_BEGIN: u32 = 1;
pub const MARKER_END: u32 = 2;
