//! PCI's part of the DSDT: the host bridge of segment 0 and, as a motherboard resource, the
//! ECAM range (Linux uses ECAM only when the firmware reserves it so).

use acpi_tables::aml::{
    self, AddressSpace, AddressSpaceCacheable, Device, EISAName, Memory32Fixed, Name,
    ResourceTemplate, IO,
};
use acpi_tables::Aml;

use crate::memory::{
    PCI_CONFIG_PORT, PCI_CONFIG_PORT_LEN, PCI_ECAM_SIZE, PCI_ECAM_START, PCI_MMIO_SIZE,
    PCI_MMIO_START,
};

/// `\_SB_.PCI0` (PNP0A08, a PCI Express root bridge also known as PNP0A03) decoding bus 0,
/// the configuration ports, the legacy I/O ports around them and the BAR window; and
/// `\_SB_.MRES` (PNP0C02) holding the ECAM range.
pub fn dsdt_aml() -> Vec<u8> {
    let bar_window = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        PCI_MMIO_START as u32,
        (PCI_MMIO_START + PCI_MMIO_SIZE - 1) as u32,
        None,
    );
    let config_ports = IO::new(
        PCI_CONFIG_PORT as u16,
        PCI_CONFIG_PORT as u16,
        1,
        PCI_CONFIG_PORT_LEN as u8,
    );
    let io_below = AddressSpace::new_io(0u16, (PCI_CONFIG_PORT - 1) as u16, None);
    let io_above = AddressSpace::new_io(0x0d00u16, 0xffffu16, None);
    let bus = AddressSpace::new_bus_number(0u16, 0u16);
    let crs = ResourceTemplate::new(vec![&bus, &config_ports, &io_below, &io_above, &bar_window]);
    let (hid, cid) = (EISAName::new("PNP0A08"), EISAName::new("PNP0A03"));
    let mut bytes = Vec::new();
    // Built and written in one statement: the children are temporaries.
    Device::new(
        "_SB_.PCI0".into(),
        vec![
            &Name::new("_HID".into(), &hid),
            &Name::new("_CID".into(), &cid),
            &Name::new("_ADR".into(), &aml::ZERO),
            &Name::new("_SEG".into(), &aml::ZERO),
            &Name::new("_UID".into(), &aml::ZERO),
            &Name::new("_BBN".into(), &aml::ZERO),
            &Name::new("_CRS".into(), &crs),
        ],
    )
    .to_aml_bytes(&mut bytes);
    let ecam = Memory32Fixed::new(false, PCI_ECAM_START as u32, PCI_ECAM_SIZE as u32);
    let ecam_crs = ResourceTemplate::new(vec![&ecam]);
    let motherboard = EISAName::new("PNP0C02");
    Device::new(
        "_SB_.MRES".into(),
        vec![
            &Name::new("_HID".into(), &motherboard),
            &Name::new("_UID".into(), &aml::ONE),
            &Name::new("_CRS".into(), &ecam_crs),
        ],
    )
    .to_aml_bytes(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
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
