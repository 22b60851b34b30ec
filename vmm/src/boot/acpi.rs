//! ACPI tables through the `acpi_tables` crate: how a kernel without MP table support
//! (`CONFIG_X86_MPPARSE` off) finds its CPUs and I/O APIC, and how it finds PCI. Written into
//! the BIOS area, which the E820 map reserves:
//!
//! - RSDP (revision 2) at [`RSDP_START`], where Linux's scan of 0xe0000..0x100000 also finds it;
//! - XSDT listing the FADT, the MADT and (with PCI) the MCFG;
//! - FADT (6.5) for a hardware-reduced platform: no PM timer, SCI or fixed registers;
//! - DSDT whose AML the devices contribute (see [`AcpiPlatform`]);
//! - MADT with one Processor Local APIC per vCPU and the I/O APIC;
//! - MCFG with the PCI ECAM range, when the VM has PCI.
//!
//! Each table starts on a 16-byte boundary after the previous one, between [`RSDP_START`] and
//! [`ACPI_MAX_END`].

use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::{EBDA_START, HIGH_MEMORY_START};
use super::mptable::{checksum_byte, IOAPIC_ADDR, LAPIC_ADDR, MPTABLE_MAX_END};
use super::BootError;

/// Guest address of the RSDP, the first of the tables.
pub const RSDP_START: u64 = 0xe_0000;
/// End (exclusive) of the space for the tables: the rest of the reserved BIOS area.
pub const ACPI_MAX_END: u64 = HIGH_MEMORY_START;
/// Most vCPUs the MADT describes: APIC IDs are 8 bits, 0xff is the broadcast ID, and the I/O
/// APIC takes the ID after the last vCPU (as in the MP table).
pub const MAX_ACPI_VCPUS: usize = 254;

/// OEM fields of every table.
const OEM_ID: [u8; 6] = *b"EXITLS";
const OEM_TABLE_ID: [u8; 8] = *b"EXITLESS";
const OEM_REVISION: u32 = 1;

/// Size of the header all system description tables share; the checksum byte's offset in it.
const HEADER_SIZE: usize = 36;
const HEADER_CHECKSUM: usize = 9;
/// DSDT revision 2: 64-bit AML integers.
const DSDT_REVISION: u8 = 2;
/// Alignment of every table.
const TABLE_ALIGN: u64 = 16;

/// FADT IAPC_BOOT_ARCH: no VGA, no CMOS RTC (so the guest probes neither). The 8042 bit stays
/// clear: the i8042 device only takes the reset command (which Linux sends regardless).
const BOOT_ARCH_VGA_NOT_PRESENT: u16 = 1 << 2;
const BOOT_ARCH_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
/// FADT hypervisor vendor identity.
const HYPERVISOR_VENDOR: &[u8; 8] = b"EXITLESS";

/// MADT flags (offset 40): the platform also has dual 8259 PICs (KVM's in-kernel irqchip).
const MADT_FLAGS_OFFSET: usize = 40;
const MADT_PCAT_COMPAT: u32 = 1;

const _: () = assert!(EBDA_START < RSDP_START && MPTABLE_MAX_END <= RSDP_START);

/// PCI Express enhanced configuration space (ECAM) for the MCFG: segment 0, buses 0..=`last_bus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ecam {
    pub base: u64,
    pub last_bus: u8,
}

impl Ecam {
    /// Bytes the range takes: 1 MiB per bus.
    pub fn size(&self) -> u64 {
        (u64::from(self.last_bus) + 1) << 20
    }
}

/// What the devices contribute: the DSDT's AML (device objects) and the ECAM, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcpiPlatform {
    pub dsdt_aml: Vec<u8>,
    pub ecam: Option<Ecam>,
    /// vCPUs the VM may have once vCPUs are added (0: only those at boot): the MADT lists
    /// them, not enabled but online capable.
    pub max_vcpus: u8,
    /// The I/O port of the sleep control and status register (the FADT's), if the platform
    /// has one: how a guest powers off through ACPI (S5).
    pub sleep_port: Option<u16>,
}

fn bytes_of(table: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    table.to_aml_bytes(&mut bytes);
    bytes
}

/// Sets the header checksum so that the whole table sums to zero again.
fn fix_checksum(table: &mut [u8]) {
    table[HEADER_CHECKSUM] = 0;
    table[HEADER_CHECKSUM] = checksum_byte(table);
}

/// The FADT of a hardware-reduced platform whose DSDT is at `dsdt`, with the sleep control
/// and status register at I/O port `sleep_port` if given.
fn fadt(dsdt: GuestAddress, sleep_port: Option<u16>) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt.0)
        .flag(Flags::HwReducedAcpi);
    if let Some(port) = sleep_port {
        let reg = GAS::new(
            AddressSpace::SystemIo,
            8,
            0,
            AccessSize::ByteAccess,
            port.into(),
        );
        fadt.sleep_control_reg = reg;
        fadt.sleep_status_reg = reg;
    }
    fadt.iapc_boot_arch = (BOOT_ARCH_VGA_NOT_PRESENT | BOOT_ARCH_CMOS_RTC_NOT_PRESENT).into();
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*HYPERVISOR_VENDOR).into();
    bytes_of(&fadt.finalize())
}

/// The DSDT: a header and the devices' AML.
pub fn dsdt(aml: &[u8]) -> Vec<u8> {
    let mut sdt = Sdt::new(
        *b"DSDT",
        HEADER_SIZE as u32,
        DSDT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    sdt.append_slice(aml);
    sdt.as_slice().to_vec()
}

/// The MADT: one enabled local APIC per vCPU (processor UID and APIC ID both equal to the
/// vCPU index) and the I/O APIC, with ID `vcpu_count` as in the MP table, taking GSIs from 0.
///
/// There are no Interrupt Source Overrides: KVM's default routing sends ISA IRQ n to I/O APIC
/// pin n (GSI n), which is what the OS assumes for an IRQ without an override, and what the
/// MP table's identity IRQ entries say.
fn madt(vcpu_count: u8, max_vcpus: u8) -> Vec<u8> {
    let lapic = LocalInterruptController::Address(LAPIC_ADDR);
    let mut madt = MADT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION, lapic);
    let possible = max_vcpus.max(vcpu_count);
    for id in 0..possible {
        let status = if id < vcpu_count {
            EnabledStatus::Enabled
        } else {
            EnabledStatus::DisabledOnlineCapable
        };
        madt.add_structure(ProcessorLocalApic::new(id, id, status));
    }
    madt.add_structure(IoApic::new(possible, IOAPIC_ADDR, 0));
    let mut bytes = bytes_of(&madt);
    bytes[MADT_FLAGS_OFFSET..MADT_FLAGS_OFFSET + 4]
        .copy_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    fix_checksum(&mut bytes);
    bytes
}

fn mcfg(ecam: Ecam) -> Vec<u8> {
    let mut mcfg = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    mcfg.add_ecam(ecam.base, 0, 0, ecam.last_bus);
    bytes_of(&mcfg)
}

/// Places tables one after another from `at`, each on a 16-byte boundary.
struct Placer {
    next: u64,
    tables: Vec<(GuestAddress, Vec<u8>)>,
}

impl Placer {
    fn place(&mut self, bytes: Vec<u8>) -> GuestAddress {
        let at = GuestAddress(self.next);
        self.next = (self.next + bytes.len() as u64).next_multiple_of(TABLE_ALIGN);
        self.tables.push((at, bytes));
        at
    }
}

/// All tables for `vcpu_count` vCPUs with their guest addresses, RSDP first.
fn build_tables(vcpu_count: u8, platform: &AcpiPlatform) -> Vec<(GuestAddress, Vec<u8>)> {
    let rsdp_len = bytes_of(&Rsdp::new(OEM_ID, 0)).len() as u64;
    let mut placer = Placer {
        next: (RSDP_START + rsdp_len).next_multiple_of(TABLE_ALIGN),
        tables: Vec::new(),
    };
    let dsdt = placer.place(dsdt(&platform.dsdt_aml));
    let madt = madt(vcpu_count, platform.max_vcpus);
    let mut entries = vec![
        placer.place(fadt(dsdt, platform.sleep_port)),
        placer.place(madt),
    ];
    if let Some(ecam) = platform.ecam {
        entries.push(placer.place(mcfg(ecam)));
    }
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for entry in entries {
        xsdt.add_entry(entry.0);
    }
    let xsdt = placer.place(bytes_of(&xsdt));
    let mut tables = vec![(
        GuestAddress(RSDP_START),
        bytes_of(&Rsdp::new(OEM_ID, xsdt.0)),
    )];
    tables.append(&mut placer.tables);
    tables
}

/// Writes the ACPI tables for `vcpu_count` vCPUs and `platform`'s devices (see the module
/// documentation) and returns the RSDP address, for `hvm_start_info.rsdp_paddr` or
/// `boot_params.acpi_rsdp_addr`.
pub fn setup_acpi(
    mem: &GuestMemoryMmap,
    vcpu_count: usize,
    platform: &AcpiPlatform,
) -> Result<GuestAddress, BootError> {
    if vcpu_count == 0 {
        return Err(BootError::NoVcpus);
    }
    let count = u8::try_from(vcpu_count)
        .ok()
        .filter(|count| usize::from(*count) <= MAX_ACPI_VCPUS)
        .ok_or(BootError::TooManyVcpus {
            table: "ACPI MADT",
            count: vcpu_count,
            max: MAX_ACPI_VCPUS,
        })?;
    let tables = build_tables(count, platform);
    let end = tables
        .iter()
        .map(|(a, b)| a.0 + b.len() as u64)
        .max()
        .unwrap_or(RSDP_START);
    if end > ACPI_MAX_END {
        return Err(BootError::AcpiTooLarge {
            size: end - RSDP_START,
            room: ACPI_MAX_END - RSDP_START,
        });
    }
    for (addr, bytes) in tables {
        mem.write_slice(&bytes, addr)
            .map_err(|source| BootError::GuestMemory {
                what: "ACPI tables",
                source,
            })?;
    }
    Ok(GuestAddress(RSDP_START))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::e820::{e820_map, E820Kind};
    use crate::boot::mptable::{setup_mptable, MPTABLE_START};
    use crate::boot::test_images::{read, sums_to_zero, test_memory};

    const RSDP_SIZE: usize = 36;

    fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
    }

    fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
    }

    fn pci() -> AcpiPlatform {
        AcpiPlatform {
            dsdt_aml: b"\x5b\x82AML!".to_vec(),
            ecam: Some(Ecam {
                base: 0xe000_0000,
                last_bus: 0,
            }),
            max_vcpus: 0,
            sleep_port: Some(0x600),
        }
    }

    /// Reads the table at `addr` (its length from its header), checking signature and checksum.
    fn read_table(mem: &GuestMemoryMmap, addr: u64, signature: &[u8; 4]) -> Vec<u8> {
        let header = read(mem, addr, HEADER_SIZE);
        assert_eq!(&header[..4], signature, "table at {addr:#x}");
        let table = read(mem, addr, u32_at(&header, 4) as usize);
        let name = signature.escape_ascii();
        assert!(sums_to_zero(&table), "{name} checksum");
        assert_eq!(&table[10..16], b"EXITLS", "{name}");
        assert_eq!(&table[16..24], b"EXITLESS", "{name}");
        assert_eq!(u32_at(&table, 24), 1, "{name}");
        assert_eq!(addr % TABLE_ALIGN, 0, "{name} aligned");
        table
    }

    /// Follows the RSDP to the XSDT and returns every table it lists (with its address) and the
    /// DSDT (from the FADT).
    fn walk(mem: &GuestMemoryMmap, rsdp: GuestAddress) -> Vec<(u64, Vec<u8>)> {
        let rsdp = read(mem, rsdp.0, RSDP_SIZE);
        let xsdt_addr = u64_at(&rsdp, 24);
        let xsdt = read_table(mem, xsdt_addr, b"XSDT");
        let mut tables = vec![(xsdt_addr, xsdt.clone())];
        for at in (HEADER_SIZE..xsdt.len()).step_by(8) {
            let addr = u64_at(&xsdt, at);
            let signature: [u8; 4] = read(mem, addr, 4).try_into().unwrap();
            tables.push((addr, read_table(mem, addr, &signature)));
        }
        let fadt = &tables.iter().find(|t| &t.1[..4] == b"FACP").unwrap().1;
        let dsdt = u64_at(fadt, 140);
        tables.push((dsdt, read_table(mem, dsdt, b"DSDT")));
        tables
    }

    fn table<'a>(tables: &'a [(u64, Vec<u8>)], signature: &[u8; 4]) -> Option<&'a Vec<u8>> {
        tables.iter().find(|t| &t.1[..4] == signature).map(|t| &t.1)
    }

    #[test]
    fn rsdp_has_signature_both_checksums_and_the_xsdt() {
        let mem = test_memory();
        let addr = setup_acpi(&mem, 2, &AcpiPlatform::default()).unwrap();
        assert_eq!(addr, GuestAddress(0xe_0000));
        let rsdp = read(&mem, addr.0, RSDP_SIZE);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert!(sums_to_zero(&rsdp[..20]));
        assert!(sums_to_zero(&rsdp));
        assert_eq!(&rsdp[9..15], b"EXITLS");
        assert_eq!(rsdp[15], 2, "revision");
        assert_eq!(u32_at(&rsdp, 20), 36, "length");
        assert_eq!(u64_at(&rsdp, 24) % 16, 0);
    }

    #[test]
    fn without_pci_the_xsdt_lists_fadt_and_madt_and_the_dsdt_is_empty() {
        for count in [1, 2, 7, MAX_ACPI_VCPUS] {
            let mem = test_memory();
            let rsdp = setup_acpi(&mem, count, &AcpiPlatform::default()).unwrap();
            let tables = walk(&mem, rsdp);
            let sigs: Vec<&[u8]> = tables.iter().map(|t| &t.1[..4]).collect();
            assert_eq!(sigs, [b"XSDT", b"FACP", b"APIC", b"DSDT"]);
            let fadt = table(&tables, b"FACP").unwrap();
            assert_eq!((fadt.len(), fadt[8]), (276, 6));
            assert_eq!(table(&tables, b"APIC").unwrap().len(), 44 + 8 * count + 12);
            assert_eq!(table(&tables, b"DSDT").unwrap().len(), 36, "no AML");
        }
    }

    #[test]
    fn with_pci_the_dsdt_carries_the_devices_aml_and_the_mcfg_the_ecam() {
        let mem = test_memory();
        let tables = walk(&mem, setup_acpi(&mem, 2, &pci()).unwrap());
        let dsdt = table(&tables, b"DSDT").unwrap();
        assert_eq!(dsdt[8], DSDT_REVISION);
        assert_eq!(&dsdt[HEADER_SIZE..], &pci().dsdt_aml[..]);
        let mcfg = table(&tables, b"MCFG").expect("MCFG listed in the XSDT");
        // Header, 8 reserved bytes, one 16-byte allocation: base, segment, start and end bus.
        assert_eq!(mcfg.len(), HEADER_SIZE + 8 + 16);
        assert_eq!(u64_at(mcfg, 44), 0xe000_0000);
        assert_eq!(&mcfg[52..56], &[0, 0, 0, 0]);
    }

    #[test]
    fn fadt_is_hardware_reduced_and_points_at_the_dsdt() {
        let mem = test_memory();
        let tables = walk(&mem, setup_acpi(&mem, 1, &AcpiPlatform::default()).unwrap());
        let fadt = table(&tables, b"FACP").unwrap();
        assert_eq!(u32_at(fadt, 40), 0, "32-bit DSDT pointer unused");
        let flags = u32_at(fadt, 112);
        assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
        assert_eq!(fadt[131], 5, "FADT minor revision");
        assert_eq!(
            u16::from_le_bytes([fadt[109], fadt[110]]),
            (1 << 2) | (1 << 5)
        );
        assert_eq!(&fadt[268..276], b"EXITLESS");
        assert_eq!(&fadt[244..256], &[0; 12], "no sleep register without one");
    }

    #[test]
    fn the_sleep_register_is_the_fadts_control_and_status() {
        let mem = test_memory();
        let tables = walk(&mem, setup_acpi(&mem, 1, &pci()).unwrap());
        let fadt = table(&tables, b"FACP").unwrap();
        // SystemIo, 8 bits, offset 0, byte access, port 0x600: SLEEP_CONTROL_REG, then STATUS.
        let gas = [1, 8, 0, 1, 0x00, 0x06, 0, 0, 0, 0, 0, 0];
        assert_eq!(&fadt[244..256], &gas);
        assert_eq!(&fadt[256..268], &gas);
    }

    #[test]
    fn madt_lists_every_vcpu_and_the_ioapic() {
        for count in [1usize, 2, 5, MAX_ACPI_VCPUS] {
            let mem = test_memory();
            let tables = walk(&mem, setup_acpi(&mem, count, &pci()).unwrap());
            let madt = table(&tables, b"APIC").unwrap();
            assert_eq!(u32_at(madt, 36), 0xfee0_0000);
            assert_eq!(u32_at(madt, 40), 1, "PCAT_COMPAT");
            let (mut lapic_ids, mut ioapics) = (Vec::new(), Vec::new());
            let mut offset = 44;
            while offset < madt.len() {
                let (kind, len) = (madt[offset], usize::from(madt[offset + 1]));
                let entry = &madt[offset..offset + len];
                match kind {
                    0 => {
                        assert_eq!((len, entry[2]), (8, entry[3]), "UID = APIC ID");
                        assert_eq!(u32_at(entry, 4), 1, "enabled");
                        lapic_ids.push(usize::from(entry[3]));
                    }
                    1 => {
                        assert_eq!(len, 12);
                        ioapics.push((entry[2], u32_at(entry, 4), u32_at(entry, 8)));
                    }
                    other => panic!("unexpected MADT entry type {other}"),
                }
                offset += len;
            }
            assert_eq!(offset, madt.len(), "entries fill the table exactly");
            assert_eq!(lapic_ids, (0..count).collect::<Vec<_>>());
            assert_eq!(ioapics, vec![(count as u8, 0xfec0_0000, 0)]);
        }
    }

    #[test]
    fn tables_are_disjoint_and_in_the_reserved_bios_area() {
        let tables = build_tables(MAX_ACPI_VCPUS as u8, &pci());
        let mut ranges: Vec<(u64, u64)> = tables
            .iter()
            .map(|(addr, bytes)| (addr.0, addr.0 + bytes.len() as u64))
            .collect();
        ranges.sort_unstable();
        let reserved = e820_map(256 << 20)
            .into_iter()
            .find(|e| e.kind == E820Kind::Reserved)
            .unwrap();
        for (i, &(start, end)) in ranges.iter().enumerate() {
            assert_eq!(start % 16, 0);
            assert!(start >= reserved.addr && end <= reserved.addr + reserved.size);
            assert!(start >= MPTABLE_MAX_END, "clear of the MP table");
            assert!(end <= ACPI_MAX_END);
            if let Some(&(next, _)) = ranges.get(i + 1) {
                assert!(end <= next, "table {i} overlaps the next one");
            }
        }
    }

    #[test]
    fn tables_too_large_for_the_bios_area_are_an_error() {
        let mem = test_memory();
        let huge = AcpiPlatform {
            dsdt_aml: vec![0; 0x2_0000],
            ecam: None,
            max_vcpus: 0,
            sleep_port: None,
        };
        assert!(matches!(
            setup_acpi(&mem, 1, &huge),
            Err(BootError::AcpiTooLarge { .. })
        ));
    }

    #[test]
    fn mp_table_and_acpi_tables_coexist() {
        let mem = test_memory();
        setup_mptable(&mem, 4).unwrap();
        let rsdp = setup_acpi(&mem, 4, &pci()).unwrap();
        assert_eq!(&read(&mem, MPTABLE_START, 4), b"_MP_");
        walk(&mem, rsdp);
    }

    #[test]
    fn vcpu_count_limits_are_errors() {
        let mem = test_memory();
        let none = AcpiPlatform::default();
        for count in [MAX_ACPI_VCPUS + 1, 256, 1000] {
            let err = setup_acpi(&mem, count, &none).unwrap_err();
            assert!(matches!(err, BootError::TooManyVcpus { max: 254, .. }));
        }
        assert!(matches!(
            setup_acpi(&mem, 0, &none),
            Err(BootError::NoVcpus)
        ));
    }

    #[test]
    fn too_small_memory_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x8_0000)]).unwrap();
        assert!(matches!(
            setup_acpi(&mem, 1, &AcpiPlatform::default()),
            Err(BootError::GuestMemory { .. })
        ));
    }
}
