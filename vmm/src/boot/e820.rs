//! The guest's E820 physical memory map, derived from the RAM layout in [`crate::memory`].

use std::fmt;

use linux_loader::loader::bootparam::boot_e820_entry;
use linux_loader::loader::elf::start_info::hvm_memmap_table_entry;

use crate::memory::ram_ranges;

/// End of usable conventional memory: 640 KiB minus the 1 KiB Extended BIOS Data Area.
pub const EBDA_START: u64 = 0x9_fc00;
/// Start of high memory (1 MiB): the EBDA, VGA hole and BIOS ROM lie between `EBDA_START` and here.
pub const HIGH_MEMORY_START: u64 = 0x10_0000;

/// Type of an E820 range, with the numeric values of the BIOS interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM (type 1).
    Ram = 1,
    /// Reserved, not usable by the OS (type 2).
    Reserved = 2,
}

impl E820Kind {
    /// The E820 type number the BIOS interface and `boot_params` use.
    pub fn type_number(self) -> u32 {
        self as u32
    }

    /// The word Linux prints for this type in its boot log.
    pub fn linux_name(self) -> &'static str {
        match self {
            E820Kind::Ram => "usable",
            E820Kind::Reserved => "reserved",
        }
    }
}

/// One range of the E820 map: `size` bytes from `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// First guest physical address of the range.
    pub addr: u64,
    /// Length of the range in bytes.
    pub size: u64,
    /// What the range is.
    pub kind: E820Kind,
}

impl E820Entry {
    /// Last address covered by the range (inclusive).
    pub fn last_addr(&self) -> u64 {
        self.addr + self.size.saturating_sub(1)
    }

    /// The entry in the layout of the Linux zero page (`boot_params.e820_table`).
    pub fn to_boot_e820_entry(&self) -> boot_e820_entry {
        boot_e820_entry {
            addr: self.addr,
            size: self.size,
            r#type: self.kind.type_number(),
        }
    }

    /// The entry in the layout of the PVH `hvm_start_info` memory map.
    pub fn to_hvm_memmap_entry(&self) -> hvm_memmap_table_entry {
        hvm_memmap_table_entry {
            addr: self.addr,
            size: self.size,
            type_: self.kind.type_number(),
            reserved: 0,
        }
    }
}

/// Formats the entry exactly as Linux prints it in the boot log, e.g.
/// `BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable`.
impl fmt::Display for E820Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BIOS-e820: [mem {:#018x}-{:#018x}] {}",
            self.addr,
            self.last_addr(),
            self.kind.linux_name()
        )
    }
}

/// The line Linux prints for `entry` in its "BIOS-provided physical RAM map".
pub fn linux_log_line(entry: &E820Entry) -> String {
    entry.to_string()
}

/// The E820 map for `mem_size` bytes of guest RAM laid out by [`ram_ranges`]: conventional
/// memory below the EBDA, one reserved range for the EBDA and BIOS hole up to 1 MiB, RAM from
/// 1 MiB up to the MMIO gap, and RAM above 4 GiB for the rest.
pub fn e820_map(mem_size: u64) -> Vec<E820Entry> {
    let mut map = Vec::new();
    for (start, len) in ram_ranges(mem_size) {
        let start = start.0;
        let end = start + len;
        if start == 0 {
            push_ram(&mut map, 0, end.min(EBDA_START));
            map.push(E820Entry {
                addr: EBDA_START,
                size: HIGH_MEMORY_START - EBDA_START,
                kind: E820Kind::Reserved,
            });
            push_ram(&mut map, HIGH_MEMORY_START, end);
        } else {
            push_ram(&mut map, start, end);
        }
    }
    map
}

/// Adds a reserved range for `size` bytes from `addr` (outside RAM: an MMIO range the guest
/// must leave alone, such as PCI ECAM), keeping the map sorted.
pub fn reserve(map: &mut Vec<E820Entry>, addr: u64, size: u64) {
    let at = map.iter().position(|e| e.addr > addr).unwrap_or(map.len());
    map.insert(
        at,
        E820Entry {
            addr,
            size,
            kind: E820Kind::Reserved,
        },
    );
}

/// Appends a RAM entry for `start..end` unless the range is empty.
fn push_ram(map: &mut Vec<E820Entry>, start: u64, end: u64) {
    if end > start {
        map.push(E820Entry {
            addr: start,
            size: end - start,
            kind: E820Kind::Ram,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MMIO_GAP_END, MMIO_GAP_START};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn ram(addr: u64, size: u64) -> E820Entry {
        E820Entry {
            addr,
            size,
            kind: E820Kind::Ram,
        }
    }

    fn low_entries() -> Vec<E820Entry> {
        vec![
            ram(0, 0x9_fc00),
            E820Entry {
                addr: 0x9_fc00,
                size: 0x6_0400,
                kind: E820Kind::Reserved,
            },
        ]
    }

    fn expect(extra: &[E820Entry]) -> Vec<E820Entry> {
        let mut v = low_entries();
        v.extend_from_slice(extra);
        v
    }

    #[test]
    fn map_for_16_mib() {
        assert_eq!(e820_map(16 * MIB), expect(&[ram(MIB, 15 * MIB)]));
    }

    #[test]
    fn map_for_256_mib() {
        assert_eq!(e820_map(256 * MIB), expect(&[ram(MIB, 255 * MIB)]));
    }

    #[test]
    fn map_for_exactly_3_gib_has_nothing_above_4_gib() {
        assert_eq!(e820_map(3 * GIB), expect(&[ram(MIB, MMIO_GAP_START - MIB)]));
    }

    #[test]
    fn map_for_4_gib_puts_1_gib_above_the_gap() {
        assert_eq!(
            e820_map(4 * GIB),
            expect(&[ram(MIB, MMIO_GAP_START - MIB), ram(MMIO_GAP_END, GIB)])
        );
    }

    #[test]
    fn map_for_8_gib_puts_5_gib_above_the_gap() {
        let map = e820_map(8 * GIB);
        assert_eq!(
            map,
            expect(&[ram(MIB, MMIO_GAP_START - MIB), ram(MMIO_GAP_END, 5 * GIB)])
        );
        let total_ram: u64 = map
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.size)
            .sum();
        assert_eq!(total_ram, 8 * GIB - (HIGH_MEMORY_START - EBDA_START));
    }

    #[test]
    fn entries_are_sorted_and_do_not_overlap() {
        for size in [16 * MIB, 3 * GIB, 8 * GIB] {
            let map = e820_map(size);
            for pair in map.windows(2) {
                assert!(pair[0].last_addr() < pair[1].addr, "{pair:?}");
            }
        }
    }

    #[test]
    fn log_lines_match_linux_format() {
        let map = e820_map(4 * GIB);
        let lines: Vec<String> = map.iter().map(linux_log_line).collect();
        assert_eq!(
            lines,
            [
                "BIOS-e820: [mem 0x0000000000000000-0x000000000009fbff] usable",
                "BIOS-e820: [mem 0x000000000009fc00-0x00000000000fffff] reserved",
                "BIOS-e820: [mem 0x0000000000100000-0x00000000bfffffff] usable",
                "BIOS-e820: [mem 0x0000000100000000-0x000000013fffffff] usable",
            ]
        );
    }

    #[test]
    fn conversions_keep_type_numbers() {
        let reserved = low_entries()[1];
        let zero_page = reserved.to_boot_e820_entry();
        assert_eq!({ zero_page.r#type }, 2);
        assert_eq!({ zero_page.addr }, 0x9_fc00);
        let pvh = ram(MIB, 2 * MIB).to_hvm_memmap_entry();
        assert_eq!((pvh.addr, pvh.size, pvh.type_), (MIB, 2 * MIB, 1));
    }

    #[test]
    fn a_reserved_mmio_range_goes_in_address_order() {
        let mut map = e820_map(4 * GIB);
        reserve(&mut map, 0xe000_0000, MIB);
        let at = map.iter().position(|e| e.addr == 0xe000_0000).unwrap();
        assert_eq!(map[at].kind, E820Kind::Reserved);
        assert!(map.windows(2).all(|w| w[0].addr + w[0].size <= w[1].addr));
        assert!(map[at - 1].addr < 0xe000_0000 && map[at + 1].addr >= 4 * GIB);
    }
}
