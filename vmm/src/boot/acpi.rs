//! Minimal ACPI tables: how a kernel without MP table support (`CONFIG_X86_MPPARSE` off) finds
//! its CPUs and I/O APIC. Written from the ACPI 6.5 specification into the BIOS area, which the
//! E820 map reserves:
//!
//! - RSDP (revision 2) at [`RSDP_START`], where Linux's scan of 0xe0000..0x100000 also finds it;
//! - XSDT listing the FADT and the MADT;
//! - FADT (revision 6.5) for a hardware-reduced platform: no PM timer, SCI or fixed registers;
//! - DSDT with a header and no AML;
//! - MADT with one Processor Local APIC per vCPU and the I/O APIC.
//!
//! Each table starts on a 16-byte boundary after the previous one; all of them fit between
//! [`RSDP_START`] and [`ACPI_MAX_END`].

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::{EBDA_START, HIGH_MEMORY_START};
use super::mptable::{checksum_byte, TableBytes, IOAPIC_ADDR, LAPIC_ADDR, MPTABLE_MAX_END};
use super::BootError;

/// Guest address of the RSDP, the first of the tables.
pub const RSDP_START: u64 = 0xe_0000;
/// End (exclusive) of the space reserved for the tables.
pub const ACPI_MAX_END: u64 = 0xe_1000;
/// Most vCPUs the MADT describes: APIC IDs are 8 bits, 0xff is the broadcast ID, and the I/O
/// APIC takes the ID after the last vCPU (as in the MP table).
pub const MAX_ACPI_VCPUS: usize = 254;

/// OEM fields of every table.
const OEM_ID: &[u8; 6] = b"EXITLS";
const OEM_TABLE_ID: &[u8; 8] = b"EXITLESS";
const OEM_REVISION: u32 = 1;
const CREATOR_ID: &[u8; 4] = b"EXLS";
const CREATOR_REVISION: u32 = 1;

/// Size of the header all system description tables share.
const HEADER_SIZE: usize = 36;
/// Offset of the checksum byte in that header.
const HEADER_CHECKSUM: usize = 9;
/// Size of a revision 2 RSDP, and the prefix the revision 0 checksum covers.
const RSDP_SIZE: usize = 36;
const RSDP_V1_SIZE: usize = 20;
const RSDP_CHECKSUM: usize = 8;
const RSDP_EXT_CHECKSUM: usize = 32;
const RSDP_REVISION: u8 = 2;
/// Sizes of the other tables (the MADT's depends on the vCPU count).
const XSDT_SIZE: usize = HEADER_SIZE + 2 * 8;
const FADT_SIZE: usize = 276;
const DSDT_SIZE: usize = HEADER_SIZE;
const MADT_FIXED_SIZE: usize = HEADER_SIZE + 8 + IOAPIC_ENTRY_SIZE;
const LOCAL_APIC_ENTRY_SIZE: usize = 8;
const IOAPIC_ENTRY_SIZE: usize = 12;
/// Size of a Generic Address Structure.
const GAS_SIZE: usize = 12;
/// Alignment of every table.
const TABLE_ALIGN: u64 = 16;

/// Table revisions: XSDT 1, FADT 6 (minor 5: ACPI 6.5), DSDT 2 (64-bit AML integers), MADT 5.
const XSDT_REVISION: u8 = 1;
const FADT_REVISION: u8 = 6;
const FADT_MINOR_REVISION: u8 = 5;
const DSDT_REVISION: u8 = 2;
const MADT_REVISION: u8 = 5;

/// FADT IAPC_BOOT_ARCH: no VGA, no CMOS RTC. The 8042 bit stays clear: the i8042 device only
/// takes the reset command (which Linux sends to port 0x64 regardless of this flag).
const BOOT_ARCH_VGA_NOT_PRESENT: u16 = 1 << 2;
const BOOT_ARCH_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
/// FADT flags: HW_REDUCED_ACPI, so the OS expects no PM timer, SCI or fixed-feature registers.
pub const FADT_HW_REDUCED_ACPI: u32 = 1 << 20;
/// FADT hypervisor vendor identity.
const HYPERVISOR_VENDOR: &[u8; 8] = b"EXITLESS";

/// MADT flags: the platform also has dual 8259 PICs (KVM's in-kernel irqchip provides them).
const MADT_PCAT_COMPAT: u32 = 1;
const MADT_LOCAL_APIC: u8 = 0;
const MADT_IO_APIC: u8 = 1;
const LOCAL_APIC_ENABLED: u32 = 1;

const _: () = assert!(EBDA_START < RSDP_START && MPTABLE_MAX_END <= RSDP_START);
const _: () = assert!(ACPI_MAX_END <= HIGH_MEMORY_START);
const _: () = assert!(table_end(MAX_ACPI_VCPUS) <= ACPI_MAX_END);

/// Guest addresses of the tables for a given vCPU count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpiLayout {
    pub rsdp: GuestAddress,
    pub xsdt: GuestAddress,
    pub fadt: GuestAddress,
    pub dsdt: GuestAddress,
    pub madt: GuestAddress,
    /// First address after the MADT.
    pub end: GuestAddress,
}

const fn align_up(addr: u64) -> u64 {
    addr.next_multiple_of(TABLE_ALIGN)
}

const fn madt_size(vcpu_count: usize) -> usize {
    MADT_FIXED_SIZE + vcpu_count * LOCAL_APIC_ENTRY_SIZE
}

/// Address of each table: RSDP, XSDT, FADT, DSDT, MADT, end.
const fn table_addrs(vcpu_count: usize) -> [u64; 6] {
    let xsdt = align_up(RSDP_START + RSDP_SIZE as u64);
    let fadt = align_up(xsdt + XSDT_SIZE as u64);
    let dsdt = align_up(fadt + FADT_SIZE as u64);
    let madt = align_up(dsdt + DSDT_SIZE as u64);
    let end = madt + madt_size(vcpu_count) as u64;
    [RSDP_START, xsdt, fadt, dsdt, madt, end]
}

const fn table_end(vcpu_count: usize) -> u64 {
    table_addrs(vcpu_count)[5]
}

impl AcpiLayout {
    /// Where the tables for `vcpu_count` vCPUs go.
    pub fn new(vcpu_count: usize) -> Self {
        let [rsdp, xsdt, fadt, dsdt, madt, end] = table_addrs(vcpu_count).map(GuestAddress);
        AcpiLayout {
            rsdp,
            xsdt,
            fadt,
            dsdt,
            madt,
            end,
        }
    }
}

/// The common table header with length and checksum left at zero (see [`finish_table`]).
fn table_header(signature: &[u8; 4], revision: u8) -> TableBytes {
    let mut table = TableBytes::default();
    table
        .bytes(signature)
        .u32(0) // length, filled in by finish_table
        .u8(revision)
        .u8(0) // checksum, filled in by finish_table
        .bytes(OEM_ID)
        .bytes(OEM_TABLE_ID)
        .u32(OEM_REVISION)
        .bytes(CREATOR_ID)
        .u32(CREATOR_REVISION);
    table
}

/// Fills in the header's length and checksum so the whole table sums to zero.
fn finish_table(table: TableBytes) -> Vec<u8> {
    let mut bytes = table.0;
    let length = bytes.len() as u32;
    bytes[4..8].copy_from_slice(&length.to_le_bytes());
    bytes[HEADER_CHECKSUM] = checksum_byte(&bytes);
    bytes
}

/// The revision 2 Root System Description Pointer: no RSDT, only the XSDT.
fn rsdp(xsdt: GuestAddress) -> Vec<u8> {
    let mut table = TableBytes::default();
    table
        .bytes(b"RSD PTR ")
        .u8(0) // checksum of the first 20 bytes, filled in below
        .bytes(OEM_ID)
        .u8(RSDP_REVISION)
        .u32(0) // RSDT address: none
        .u32(RSDP_SIZE as u32)
        .u64(xsdt.0)
        .u8(0) // extended checksum, filled in below
        .bytes(&[0; 3]);
    let mut bytes = table.0;
    bytes[RSDP_CHECKSUM] = checksum_byte(&bytes[..RSDP_V1_SIZE]);
    bytes[RSDP_EXT_CHECKSUM] = checksum_byte(&bytes);
    bytes
}

/// The Extended System Description Table: 64-bit pointers to the other tables.
fn xsdt(entries: &[GuestAddress]) -> Vec<u8> {
    let mut table = table_header(b"XSDT", XSDT_REVISION);
    for entry in entries {
        table.u64(entry.0);
    }
    finish_table(table)
}

/// The Fixed ACPI Description Table of a hardware-reduced platform whose DSDT is at `dsdt`.
/// Every fixed-hardware block, register and length is zero.
fn fadt(dsdt: GuestAddress) -> Vec<u8> {
    let mut table = table_header(b"FACP", FADT_REVISION);
    table
        .u32(0) // FIRMWARE_CTRL: no FACS (optional when hardware-reduced)
        .u32(0) // DSDT: the 64-bit X_DSDT below is used instead
        .u8(0) // reserved
        .u8(0) // Preferred_PM_Profile: unspecified
        .u16(0) // SCI_INT: no SCI
        .u32(0) // SMI_CMD: no SMM, so ACPI_ENABLE/ACPI_DISABLE are unused
        .bytes(&[0; 4]) // ACPI_ENABLE, ACPI_DISABLE, S4BIOS_REQ, PSTATE_CNT
        .bytes(&[0; 8 * 4]) // PM1a/b event, PM1a/b control, PM2 control, PM timer, GPE0/1
        .bytes(&[0; 8]) // the lengths of those blocks and GPE1_BASE, CST_CNT
        .bytes(&[0; 8]) // P_LVL2_LAT, P_LVL3_LAT, FLUSH_SIZE, FLUSH_STRIDE
        .bytes(&[0; 5]) // DUTY_OFFSET, DUTY_WIDTH, DAY_ALRM, MON_ALRM, CENTURY
        .u16(BOOT_ARCH_VGA_NOT_PRESENT | BOOT_ARCH_CMOS_RTC_NOT_PRESENT)
        .u8(0) // reserved
        .u32(FADT_HW_REDUCED_ACPI)
        .bytes(&[0; GAS_SIZE]) // RESET_REG: none (RESET_REG_SUP is clear)
        .u8(0) // RESET_VALUE
        .u16(0) // ARM_BOOT_ARCH
        .u8(FADT_MINOR_REVISION)
        .u64(0) // X_FIRMWARE_CTRL
        .u64(dsdt.0) // X_DSDT
        .bytes(&[0; 8 * GAS_SIZE]) // X_PM1a/b_EVT, X_PM1a/b_CNT, X_PM2_CNT, X_PM_TMR, X_GPE0/1
        .bytes(&[0; 2 * GAS_SIZE]) // SLEEP_CONTROL_REG, SLEEP_STATUS_REG
        .bytes(HYPERVISOR_VENDOR);
    finish_table(table)
}

/// The Differentiated System Description Table: a header without AML, so no devices yet.
fn dsdt() -> Vec<u8> {
    finish_table(table_header(b"DSDT", DSDT_REVISION))
}

/// The Multiple APIC Description Table: one enabled local APIC per vCPU (processor UID and
/// APIC ID both equal to the vCPU index) and the I/O APIC, with ID `vcpu_count` as in the MP
/// table, taking GSIs from 0.
///
/// There are no Interrupt Source Overrides: KVM's default routing sends ISA IRQ n to I/O APIC
/// pin n (GSI n), which is what the OS assumes for an IRQ without an override, and what the
/// MP table's identity IRQ entries say.
fn madt(vcpu_count: u8) -> Vec<u8> {
    let mut table = table_header(b"APIC", MADT_REVISION);
    table.u32(LAPIC_ADDR).u32(MADT_PCAT_COMPAT);
    for id in 0..vcpu_count {
        table
            .u8(MADT_LOCAL_APIC)
            .u8(LOCAL_APIC_ENTRY_SIZE as u8)
            .u8(id) // ACPI processor UID
            .u8(id) // APIC ID
            .u32(LOCAL_APIC_ENABLED);
    }
    table
        .u8(MADT_IO_APIC)
        .u8(IOAPIC_ENTRY_SIZE as u8)
        .u8(vcpu_count) // I/O APIC ID
        .u8(0) // reserved
        .u32(IOAPIC_ADDR)
        .u32(0); // global system interrupt base
    finish_table(table)
}

/// All tables for `vcpu_count` vCPUs with their guest addresses.
fn build_tables(vcpu_count: u8) -> Vec<(GuestAddress, Vec<u8>)> {
    let layout = AcpiLayout::new(usize::from(vcpu_count));
    vec![
        (layout.rsdp, rsdp(layout.xsdt)),
        (layout.xsdt, xsdt(&[layout.fadt, layout.madt])),
        (layout.fadt, fadt(layout.dsdt)),
        (layout.dsdt, dsdt()),
        (layout.madt, madt(vcpu_count)),
    ]
}

/// Writes the ACPI tables for `vcpu_count` vCPUs (see the module documentation) and returns
/// the RSDP address, for `hvm_start_info.rsdp_paddr` or `boot_params.acpi_rsdp_addr`.
pub fn setup_acpi(mem: &GuestMemoryMmap, vcpu_count: usize) -> Result<GuestAddress, BootError> {
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
    for (addr, bytes) in build_tables(count) {
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

    fn u32_at(bytes: &[u8], offset: usize) -> u32 {
        u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
    }

    fn u64_at(bytes: &[u8], offset: usize) -> u64 {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
    }

    /// Reads the table at `addr` (its length from its header), checking signature and checksum.
    fn read_table(mem: &GuestMemoryMmap, addr: u64, signature: &[u8; 4]) -> Vec<u8> {
        let header = read(mem, addr, HEADER_SIZE);
        assert_eq!(&header[..4], signature, "table at {addr:#x}");
        let table = read(mem, addr, u32_at(&header, 4) as usize);
        assert!(
            sums_to_zero(&table),
            "{} checksum",
            signature.escape_ascii()
        );
        assert_eq!(&table[10..16], b"EXITLS");
        assert_eq!(&table[16..24], b"EXITLESS");
        assert_eq!(u32_at(&table, 24), 1);
        assert_eq!(&table[28..32], b"EXLS");
        assert_eq!(u32_at(&table, 32), 1);
        table
    }

    /// Follows the RSDP to the XSDT and returns (XSDT, FADT, MADT, DSDT address).
    fn walk(mem: &GuestMemoryMmap, rsdp: GuestAddress) -> (Vec<u8>, Vec<u8>, Vec<u8>, u64) {
        let rsdp = read(mem, rsdp.0, RSDP_SIZE);
        let xsdt = read_table(mem, u64_at(&rsdp, 24), b"XSDT");
        assert_eq!(xsdt.len(), HEADER_SIZE + 16);
        let fadt = read_table(mem, u64_at(&xsdt, 36), b"FACP");
        let madt = read_table(mem, u64_at(&xsdt, 44), b"APIC");
        let dsdt = u64_at(&fadt, 140);
        (xsdt, fadt, madt, dsdt)
    }

    #[test]
    fn rsdp_has_signature_both_checksums_and_the_xsdt() {
        let mem = test_memory();
        let addr = setup_acpi(&mem, 2).unwrap();
        assert_eq!(addr, GuestAddress(0xe_0000));
        let rsdp = read(&mem, addr.0, RSDP_SIZE);
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert!(sums_to_zero(&rsdp[..20]));
        assert!(sums_to_zero(&rsdp));
        assert_eq!(&rsdp[9..15], b"EXITLS");
        assert_eq!(rsdp[15], 2, "revision");
        assert_eq!(u32_at(&rsdp, 16), 0, "no RSDT");
        assert_eq!(u32_at(&rsdp, 20), 36, "length");
        assert_eq!(u64_at(&rsdp, 24), AcpiLayout::new(2).xsdt.0);
        assert_eq!(u64_at(&rsdp, 24) % 16, 0);
    }

    #[test]
    fn every_table_has_a_valid_header_and_checksum() {
        for count in [1, 2, 7, MAX_ACPI_VCPUS] {
            let mem = test_memory();
            let rsdp = setup_acpi(&mem, count).unwrap();
            let (_, fadt, madt, dsdt) = walk(&mem, rsdp);
            assert_eq!((fadt.len(), fadt[8]), (276, 6));
            assert_eq!(madt.len(), 44 + 8 * count + 12);
            let dsdt = read_table(&mem, dsdt, b"DSDT");
            assert_eq!(dsdt.len(), 36, "header only, no AML");
        }
    }

    #[test]
    fn fadt_is_hardware_reduced_and_points_at_the_dsdt() {
        let mem = test_memory();
        let (_, fadt, _, dsdt) = walk(&mem, setup_acpi(&mem, 1).unwrap());
        assert_eq!(dsdt, AcpiLayout::new(1).dsdt.0);
        assert_eq!(&read(&mem, dsdt, 4), b"DSDT");
        assert_eq!(u32_at(&fadt, 40), 0, "32-bit DSDT pointer unused");
        let flags = u32_at(&fadt, 112);
        assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
        assert_eq!(fadt[131], FADT_MINOR_REVISION);
        assert_eq!(
            u16::from_le_bytes([fadt[109], fadt[110]]),
            (1 << 2) | (1 << 5)
        );
        assert_eq!(&fadt[268..276], b"EXITLESS");
    }

    #[test]
    fn madt_lists_every_vcpu_and_the_ioapic() {
        for count in [1usize, 2, 5, MAX_ACPI_VCPUS] {
            let mem = test_memory();
            let (_, _, madt, _) = walk(&mem, setup_acpi(&mem, count).unwrap());
            assert_eq!(u32_at(&madt, 36), 0xfee0_0000);
            assert_eq!(u32_at(&madt, 40), 1, "PCAT_COMPAT");
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
    fn tables_are_aligned_disjoint_and_in_the_reserved_bios_area() {
        let layout = AcpiLayout::new(MAX_ACPI_VCPUS);
        let ranges = build_tables(MAX_ACPI_VCPUS as u8)
            .into_iter()
            .map(|(addr, bytes)| (addr.0, addr.0 + bytes.len() as u64))
            .collect::<Vec<_>>();
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
        assert_eq!(ranges.last().map(|r| r.1), Some(layout.end.0));
    }

    #[test]
    fn mp_table_and_acpi_tables_coexist() {
        let mem = test_memory();
        setup_mptable(&mem, 4).unwrap();
        let rsdp = setup_acpi(&mem, 4).unwrap();
        assert_eq!(&read(&mem, MPTABLE_START, 4), b"_MP_");
        walk(&mem, rsdp);
    }

    #[test]
    fn vcpu_count_limits_are_errors() {
        let mem = test_memory();
        for count in [MAX_ACPI_VCPUS + 1, 256, 1000] {
            let err = setup_acpi(&mem, count).unwrap_err();
            assert!(matches!(err, BootError::TooManyVcpus { max: 254, .. }));
        }
        assert!(matches!(setup_acpi(&mem, 0), Err(BootError::NoVcpus)));
    }

    #[test]
    fn too_small_memory_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x8_0000)]).unwrap();
        assert!(matches!(
            setup_acpi(&mem, 1),
            Err(BootError::GuestMemory { .. })
        ));
    }
}
