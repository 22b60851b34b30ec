//! The PCI host bridge's part of the DSDT: `\_SB_.PCI0` for segment 0 and, as a motherboard
//! resource, the ECAM range (Linux uses ECAM only when the firmware reserves it so).
//! Self-contained (it stands on `acpi_tables` only): `vmm/build.rs` includes it to build the
//! bytes when exitless is compiled, and [`super::acpi`] holds them.

use acpi_tables::aml::{
    self, AddressSpace, AddressSpaceCacheable, Device, EISAName, Memory32Fixed, Name,
    ResourceTemplate, IO,
};
use acpi_tables::Aml;

/// Where the host bridge's resources are: the BAR window, the ECAM range and the
/// configuration ports (the crate's `memory::PCI_*`).
pub struct PciWindows {
    pub mmio_start: u64,
    pub mmio_size: u64,
    pub ecam_start: u64,
    pub ecam_size: u64,
    pub config_port: u64,
    pub config_port_len: u64,
}

/// `\_SB_.PCI0` (PNP0A08, a PCI Express root bridge also known as PNP0A03) decoding bus 0,
/// the configuration ports, the legacy I/O ports around them and the BAR window; and
/// `\_SB_.MRES` (PNP0C02) holding the ECAM range.
pub fn build(w: &PciWindows) -> Vec<u8> {
    let bar_window = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        w.mmio_start as u32,
        (w.mmio_start + w.mmio_size - 1) as u32,
        None,
    );
    let config_ports = IO::new(
        w.config_port as u16,
        w.config_port as u16,
        1,
        w.config_port_len as u8,
    );
    let io_below = AddressSpace::new_io(0u16, (w.config_port - 1) as u16, None);
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
    let ecam = Memory32Fixed::new(false, w.ecam_start as u32, w.ecam_size as u32);
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
