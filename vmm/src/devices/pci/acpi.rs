//! PCI's part of the DSDT: the host bridge of segment 0 and, as a motherboard resource, the
//! ECAM range, built when exitless is compiled ([`super::host_bridge_aml`], which `vmm/build.rs`
//! includes): the same bytes for every VM.

use super::host_bridge_aml::PciWindows;
use crate::memory::{
    PCI_CONFIG_PORT, PCI_CONFIG_PORT_LEN, PCI_ECAM_SIZE, PCI_ECAM_START, PCI_MMIO_SIZE,
    PCI_MMIO_START,
};

/// The windows the host bridge describes (`vmm/build.rs` builds with the same values; a test
/// checks the bytes).
pub const WINDOWS: PciWindows = PciWindows {
    mmio_start: PCI_MMIO_START,
    mmio_size: PCI_MMIO_SIZE,
    ecam_start: PCI_ECAM_START,
    ecam_size: PCI_ECAM_SIZE,
    config_port: PCI_CONFIG_PORT,
    config_port_len: PCI_CONFIG_PORT_LEN,
};

/// `\_SB_.PCI0` and `\_SB_.MRES`, as `vmm/build.rs` built them from [`WINDOWS`].
static HOST_BRIDGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pci_host_bridge.aml"));

/// `\_SB_.PCI0` (PNP0A08, a PCI Express root bridge also known as PNP0A03) decoding bus 0,
/// the configuration ports, the legacy I/O ports around them and the BAR window; and
/// `\_SB_.MRES` (PNP0C02) holding the ECAM range.
pub fn dsdt_aml() -> Vec<u8> {
    HOST_BRIDGE.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_bytes_built_at_compile_time_are_those_built_now() {
        assert_eq!(dsdt_aml(), super::super::host_bridge_aml::build(&WINDOWS));
    }

    #[test]
    fn the_host_bridge_and_the_ecam_reservation_are_described() {
        let aml = dsdt_aml();
        // DeviceOp is ExtOpPrefix 0x5b, 0x82; names are 4 characters.
        assert!(contains(&aml, b"PCI0") && contains(&aml, b"MRES"));
        // EISA IDs: PNP0A08 and PNP0C02 compressed (big-endian 0x41d00a08, 0x41d00c02).
        assert!(contains(&aml, &[0x41, 0xd0, 0x0a, 0x08]));
        assert!(contains(&aml, &[0x41, 0xd0, 0x0c, 0x02]));
        // The ECAM as a fixed 32-bit memory range: base and length, little-endian.
        let mut ecam = (PCI_ECAM_START as u32).to_le_bytes().to_vec();
        ecam.extend_from_slice(&(PCI_ECAM_SIZE as u32).to_le_bytes());
        assert!(contains(&aml, &ecam));
        // The BAR window's bounds and the configuration ports.
        assert!(contains(&aml, &(PCI_MMIO_START as u32).to_le_bytes()));
        let last = (PCI_MMIO_START + PCI_MMIO_SIZE - 1) as u32;
        assert!(contains(&aml, &last.to_le_bytes()));
        assert!(contains(
            &aml,
            &[0x47, 0x01, 0xf8, 0x0c, 0xf8, 0x0c, 0x01, 0x08]
        ));
    }
}
