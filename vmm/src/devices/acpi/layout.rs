//! Where the hotplug controllers sit and what their register bits mean: plain constants,
//! shared by the devices and by the AML that reads them ([`super::hotplug_aml`]), which
//! `vmm/build.rs` includes to build the DSDT's common parts when exitless is compiled.

/// Where the controllers' registers sit (in the MMIO gap, below the I/O APIC).
pub const GED_ADDR: u64 = 0xfeb0_0000;
pub const GED_LEN: u64 = 0x10;
pub const PCI_HOTPLUG_ADDR: u64 = 0xfeb0_1000;
pub const PCI_HOTPLUG_LEN: u64 = 0x10;
pub const CPU_HOTPLUG_ADDR: u64 = 0xfeb0_2000;
pub const CPU_HOTPLUG_LEN: u64 = 0x10;
pub const MEMORY_HOTPLUG_ADDR: u64 = 0xfeb0_3000;
/// The GED's interrupt: ISA IRQ 5 (free on this platform), edge, active high.
pub const GED_GSI: u32 = 5;

/// What the GED's register says changed (bits, cleared when read).
pub const CPU_CHANGED: u8 = 1 << 0;
pub const PCI_CHANGED: u8 = 1 << 1;
pub const MEMORY_CHANGED: u8 = 1 << 2;
/// The power button was pressed: `_EVT` notifies `\_SB_.PWRB` (0x80).
pub const POWER_BUTTON: u8 = 1 << 3;

/// The CPU hotplug controller's `CSTA` bits.
pub const PRESENT: u8 = 1 << 0;
pub const INSERTING: u8 = 1 << 1;
pub const REMOVING: u8 = 1 << 2;
pub const EJECT: u8 = 1 << 3;

/// `\_S5_`'s sleep type: what a guest writes to the sleep control register to power off.
pub const S5_SLEEP_TYPE: u8 = 5;
