//! Intel MultiProcessor Specification 1.4 table: how the guest finds its CPUs, the I/O APIC and
//! the ISA interrupt routing without ACPI. Written into the EBDA, which the E820 map reserves.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::{EBDA_START, HIGH_MEMORY_START};
use super::BootError;

/// Guest address of the MP floating pointer structure (start of the EBDA).
pub const MPTABLE_START: u64 = EBDA_START;
/// The table must fit in the 1 KiB EBDA, which Linux scans for the floating pointer.
pub const MPTABLE_MAX_END: u64 = 0xa_0000;
/// Guest address of the I/O APIC registers.
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// Guest address of the local APIC registers.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// Number of ISA interrupt lines routed to the I/O APIC.
pub const ISA_IRQ_COUNT: u8 = 16;

const FLOATING_POINTER_SIZE: usize = 16;
const CONFIG_HEADER_SIZE: usize = 44;
const PROCESSOR_ENTRY_SIZE: usize = 20;
const SMALL_ENTRY_SIZE: usize = 8;
const MP_SPEC_REVISION: u8 = 4;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;

const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 1 << 1;
const IOAPIC_ENABLED: u8 = 1;
/// Local APIC version of an integrated xAPIC.
const LAPIC_VERSION: u8 = 0x14;
/// I/O APIC version KVM's in-kernel I/O APIC reports.
const IOAPIC_VERSION: u8 = 0x11;
/// CPUID signature (family 6) and feature flags (FPU, APIC) of the processor entries.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = (1 << 0) | (1 << 9);

const INTERRUPT_INT: u8 = 0;
const INTERRUPT_NMI: u8 = 1;
const INTERRUPT_EXTINT: u8 = 3;
/// Polarity and trigger "conform to the bus" (edge, active high for ISA).
const INTERRUPT_FLAGS_CONFORM: u16 = 0;
const ISA_BUS_ID: u8 = 0;
const ALL_LOCAL_APICS: u8 = 0xff;

const FIXED_ENTRIES: usize = 2 + ISA_IRQ_COUNT as usize + 2;
const FIXED_SIZE: usize =
    FLOATING_POINTER_SIZE + CONFIG_HEADER_SIZE + FIXED_ENTRIES * SMALL_ENTRY_SIZE;

const _: () = assert!(MPTABLE_MAX_END <= HIGH_MEMORY_START);

/// Largest vCPU count whose MP table fits between [`MPTABLE_START`] and [`MPTABLE_MAX_END`].
pub const MAX_MPTABLE_VCPUS: usize =
    ((MPTABLE_MAX_END - MPTABLE_START) as usize - FIXED_SIZE) / PROCESSOR_ENTRY_SIZE;

/// The byte that makes `bytes` sum to zero modulo 256.
pub(super) fn checksum_byte(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |sum, b| sum.wrapping_add(*b)))
}

/// Little-endian byte builder for MP (and ACPI) table structures.
#[derive(Default)]
pub(super) struct TableBytes(pub(super) Vec<u8>);

impl TableBytes {
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(super) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

fn processor_entry(table: &mut TableBytes, apic_id: u8) {
    let flags = CPU_ENABLED | if apic_id == 0 { CPU_BOOTSTRAP } else { 0 };
    table
        .u8(ENTRY_PROCESSOR)
        .u8(apic_id)
        .u8(LAPIC_VERSION)
        .u8(flags)
        .u32(CPU_SIGNATURE)
        .u32(CPU_FEATURES)
        .u32(0)
        .u32(0);
}

fn interrupt_entry(table: &mut TableBytes, kind: u8, irq_type: u8, src_irq: u8, dst: (u8, u8)) {
    table
        .u8(kind)
        .u8(irq_type)
        .u16(INTERRUPT_FLAGS_CONFORM)
        .u8(ISA_BUS_ID)
        .u8(src_irq)
        .u8(dst.0)
        .u8(dst.1);
}

/// The configuration table entries: processors, the ISA bus, the I/O APIC, ISA IRQs 0-15 to
/// I/O APIC pins 0-15, and LINT0 (ExtINT) / LINT1 (NMI) on every local APIC.
fn config_entries(vcpu_count: u8) -> TableBytes {
    let ioapic_id = vcpu_count;
    let mut table = TableBytes::default();
    for apic_id in 0..vcpu_count {
        processor_entry(&mut table, apic_id);
    }
    table.u8(ENTRY_BUS).u8(ISA_BUS_ID).bytes(b"ISA   ");
    table
        .u8(ENTRY_IOAPIC)
        .u8(ioapic_id)
        .u8(IOAPIC_VERSION)
        .u8(IOAPIC_ENABLED)
        .u32(IOAPIC_ADDR);
    for irq in 0..ISA_IRQ_COUNT {
        interrupt_entry(
            &mut table,
            ENTRY_IO_INTERRUPT,
            INTERRUPT_INT,
            irq,
            (ioapic_id, irq),
        );
    }
    let all = ALL_LOCAL_APICS;
    interrupt_entry(
        &mut table,
        ENTRY_LOCAL_INTERRUPT,
        INTERRUPT_EXTINT,
        0,
        (all, 0),
    );
    interrupt_entry(
        &mut table,
        ENTRY_LOCAL_INTERRUPT,
        INTERRUPT_NMI,
        0,
        (all, 1),
    );
    table
}

/// The configuration table ("PCMP" header plus entries) with its checksum filled in.
fn config_table(vcpu_count: u8) -> Vec<u8> {
    let entries = config_entries(vcpu_count);
    let entry_count = vcpu_count as u16 + FIXED_ENTRIES as u16;
    let length = (CONFIG_HEADER_SIZE + entries.0.len()) as u16;
    let mut table = TableBytes::default();
    table
        .bytes(b"PCMP")
        .u16(length)
        .u8(MP_SPEC_REVISION)
        .u8(0) // checksum, filled in below
        .bytes(b"EXITLESS")
        .bytes(b"KVM VM      ")
        .u32(0) // OEM table pointer
        .u16(0) // OEM table size
        .u16(entry_count)
        .u32(LAPIC_ADDR)
        .u16(0) // extended table length
        .u8(0) // extended table checksum
        .u8(0)
        .bytes(&entries.0);
    let mut bytes = table.0;
    bytes[7] = checksum_byte(&bytes);
    bytes
}

/// The 16-byte floating pointer pointing at a configuration table at `config_addr`.
fn floating_pointer(config_addr: u32) -> Vec<u8> {
    let mut table = TableBytes::default();
    table
        .bytes(b"_MP_")
        .u32(config_addr)
        .u8(1) // length in 16-byte units
        .u8(MP_SPEC_REVISION)
        .u8(0) // checksum, filled in below
        .bytes(&[0; 5]); // feature bytes: configuration table present, no IMCR
    let mut bytes = table.0;
    bytes[10] = checksum_byte(&bytes);
    bytes
}

/// Writes the MP table for `vcpu_count` vCPUs (APIC IDs 0..count, I/O APIC ID = count) at
/// [`MPTABLE_START`].
pub fn setup_mptable(mem: &GuestMemoryMmap, vcpu_count: usize) -> Result<(), BootError> {
    if vcpu_count == 0 {
        return Err(BootError::NoVcpus);
    }
    if vcpu_count > MAX_MPTABLE_VCPUS {
        return Err(BootError::TooManyVcpus {
            table: "MP table",
            count: vcpu_count,
            max: MAX_MPTABLE_VCPUS,
        });
    }
    let config_addr = MPTABLE_START + FLOATING_POINTER_SIZE as u64;
    let mut bytes = floating_pointer(config_addr as u32);
    bytes.extend_from_slice(&config_table(vcpu_count as u8));
    debug_assert!(MPTABLE_START + bytes.len() as u64 <= MPTABLE_MAX_END);
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|source| BootError::GuestMemory {
            what: "MP table",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::boot::test_images::{read, sums_to_zero, test_memory};

    /// Parses the table back from guest memory: (config table bytes, entry types in order).
    fn parse(mem: &GuestMemoryMmap) -> (Vec<u8>, Vec<u8>) {
        let fp = read(mem, MPTABLE_START, 16);
        assert_eq!(&fp[..4], b"_MP_");
        assert!(sums_to_zero(&fp));
        let config_addr = u32::from_le_bytes(fp[4..8].try_into().unwrap()) as u64;
        let header = read(mem, config_addr, CONFIG_HEADER_SIZE);
        assert_eq!(&header[..4], b"PCMP");
        let length = u16::from_le_bytes([header[4], header[5]]) as usize;
        let table = read(mem, config_addr, length);
        let count = u16::from_le_bytes([table[34], table[35]]) as usize;
        let mut types = Vec::new();
        let mut offset = CONFIG_HEADER_SIZE;
        for _ in 0..count {
            let kind = table[offset];
            types.push(kind);
            offset += if kind == ENTRY_PROCESSOR { 20 } else { 8 };
        }
        assert_eq!(offset, length, "entries must fill the table exactly");
        (table, types)
    }

    #[test]
    fn checksums_are_valid() {
        let mem = test_memory();
        setup_mptable(&mem, 4).unwrap();
        let (table, _) = parse(&mem);
        assert!(sums_to_zero(&table));
    }

    #[test]
    fn cpu_count_reads_back() {
        for count in [1, 2, 7, MAX_MPTABLE_VCPUS] {
            let mem = test_memory();
            setup_mptable(&mem, count).unwrap();
            let (table, types) = parse(&mem);
            let cpus = types.iter().filter(|t| **t == ENTRY_PROCESSOR).count();
            assert_eq!(cpus, count);
            // The first processor is the bootstrap processor, APIC ID 0.
            let first = &table[CONFIG_HEADER_SIZE..CONFIG_HEADER_SIZE + 20];
            assert_eq!((first[1], first[3]), (0, CPU_ENABLED | CPU_BOOTSTRAP));
        }
    }

    #[test]
    fn entries_cover_bus_ioapic_and_interrupts() {
        let mem = test_memory();
        setup_mptable(&mem, 3).unwrap();
        let (table, types) = parse(&mem);
        let count = |kind| types.iter().filter(|t| **t == kind).count();
        assert_eq!(count(ENTRY_BUS), 1);
        assert_eq!(count(ENTRY_IOAPIC), 1);
        assert_eq!(count(ENTRY_IO_INTERRUPT), 16);
        assert_eq!(count(ENTRY_LOCAL_INTERRUPT), 2);
        let ioapic = CONFIG_HEADER_SIZE + 3 * 20 + 8;
        assert_eq!(table[ioapic], ENTRY_IOAPIC);
        assert_eq!(table[ioapic + 1], 3, "I/O APIC ID follows the CPU APIC IDs");
        let addr = u32::from_le_bytes(table[ioapic + 4..ioapic + 8].try_into().unwrap());
        assert_eq!(addr, 0xfec0_0000);
        let lapic = u32::from_le_bytes(table[36..40].try_into().unwrap());
        assert_eq!(lapic, 0xfee0_0000);
    }

    #[test]
    fn too_many_vcpus_is_an_error() {
        let mem = test_memory();
        let err = setup_mptable(&mem, MAX_MPTABLE_VCPUS + 1).unwrap_err();
        assert!(matches!(err, BootError::TooManyVcpus { .. }));
        assert!(setup_mptable(&mem, 0).is_err());
    }

    #[test]
    fn largest_table_stays_in_the_ebda() {
        let bytes = config_table(MAX_MPTABLE_VCPUS as u8);
        assert!(MPTABLE_START + 16 + bytes.len() as u64 <= MPTABLE_MAX_END);
    }
}
