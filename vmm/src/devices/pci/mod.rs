//! PCI: bus 0 with a host bridge and devices by slot, configuration space through ports
//! 0xCF8/0xCFC and through ECAM, BARs the guest can size and move, and MSI-X.
//!
//! A [`PciDevice`] is reached through `&self` from any vCPU thread and locks what it needs.
//! When a configuration write moves a BAR (or turns memory decoding on or off), the root
//! reports it to the [`BarMapper`] the VMM gave it, which remaps the MMIO bus and the
//! device's ioeventfds.

pub mod acpi;
pub mod config;
pub mod host_bridge_aml;
pub mod msix;
pub mod root;

pub use config::{PciConfig, PciIds};
pub use root::{PciConfigPorts, PciEcam, PciRoot};

/// The kinds of memory BAR exitless devices use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarKind {
    Mem32,
    /// Takes two BAR registers.
    Mem64,
}

/// A BAR whose decoded address changed (None: not decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarChange {
    pub bar: u8,
    pub old: Option<u64>,
    pub new: Option<u64>,
}

/// A PCI function on bus 0.
pub trait PciDevice: Send + Sync {
    /// Reads its configuration space (`offset` < 4096; 1, 2 or 4 bytes).
    fn config_read(&self, offset: usize, data: &mut [u8]);
    /// Writes its configuration space; returns the BARs this moved.
    fn config_write(&self, offset: usize, data: &[u8]) -> Vec<BarChange>;
    /// The guest reads BAR `bar` at `offset`.
    fn bar_read(&self, bar: u8, offset: u64, data: &mut [u8]);
    /// The guest writes BAR `bar` at `offset`.
    fn bar_write(&self, bar: u8, offset: u64, data: &[u8]);
}

/// Told when a device's BAR moves, to remap it (on the vCPU thread that moved it).
pub trait BarMapper: Send + Sync {
    fn bar_moved(&self, slot: u8, change: BarChange);
}
