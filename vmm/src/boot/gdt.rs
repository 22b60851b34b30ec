//! The boot GDT, IDT and identity-mapped page tables, and the segment/control register state
//! that goes with them. Nothing here touches KVM: the vCPU code copies [`BootSregs`] into the
//! vCPU's `kvm_sregs`.

use kvm_bindings::{kvm_dtable, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::BootError;

/// Guest address of the boot GDT.
pub const BOOT_GDT_START: u64 = 0x500;
/// Guest address of the (empty) boot IDT.
pub const BOOT_IDT_START: u64 = 0x540;
/// Guest address of the page-map level 4 table (the value of CR3).
pub const PML4_START: u64 = 0x9000;
/// Guest address of the page directory pointer table.
pub const PDPT_START: u64 = 0xa000;
/// Guest address of the page directory mapping the first 1 GiB with 2 MiB pages.
pub const PD_START: u64 = 0xb000;

/// Selector of the code segment.
pub const CODE_SELECTOR: u16 = 0x08;
/// Selector of the data segment.
pub const DATA_SELECTOR: u16 = 0x10;
/// Selector of the task state segment.
pub const TSS_SELECTOR: u16 = 0x18;

/// Number of u64 slots in the boot GDT: null, code, data, and a 16-byte TSS descriptor.
pub const GDT_ENTRY_COUNT: usize = 5;

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Page-table entry bits: present, writable, and (in a PD) 2 MiB page.
const PTE_PRESENT: u64 = 1;
const PTE_WRITABLE: u64 = 1 << 1;
const PDE_LARGE_PAGE: u64 = 1 << 7;
const LARGE_PAGE_SIZE: u64 = 2 << 20;

/// Access byte: present, ring 0, code/data, execute/read code (accessed).
const ACCESS_CODE: u8 = 0x9b;
/// Access byte: present, ring 0, code/data, read/write data (accessed).
const ACCESS_DATA: u8 = 0x93;
/// Access byte: present, ring 0, system, busy 32/64-bit TSS.
const ACCESS_BUSY_TSS: u8 = 0x8b;
/// Flags nibble bits (descriptor bits 52-55).
const FLAG_LONG: u8 = 1 << 1;
const FLAG_DEFAULT_32: u8 = 1 << 2;
const FLAG_GRANULARITY_4K: u8 = 1 << 3;
/// Limit of a minimal TSS (104 bytes).
const TSS_LIMIT: u32 = 0x67;

/// The fields of a legacy 8-byte segment descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentDescriptor {
    /// Segment base (32 bits).
    pub base: u32,
    /// Raw 20-bit limit, in bytes or 4 KiB units depending on the granularity flag.
    pub limit: u32,
    /// Access byte: present, DPL, S, type.
    pub access: u8,
    /// Flags nibble: granularity, default size, long mode, available.
    pub flags: u8,
}

impl SegmentDescriptor {
    /// Packs the fields into the descriptor's u64 layout.
    pub fn to_u64(self) -> u64 {
        let base = u64::from(self.base);
        let limit = u64::from(self.limit);
        (limit & 0xffff)
            | ((base & 0x00ff_ffff) << 16)
            | (u64::from(self.access) << 40)
            | (((limit >> 16) & 0xf) << 48)
            | (u64::from(self.flags & 0xf) << 52)
            | (((base >> 24) & 0xff) << 56)
    }

    /// Unpacks a descriptor from its u64 layout.
    pub fn from_u64(entry: u64) -> Self {
        SegmentDescriptor {
            base: (((entry >> 16) & 0x00ff_ffff) | (((entry >> 56) & 0xff) << 24)) as u32,
            limit: ((entry & 0xffff) | (((entry >> 48) & 0xf) << 16)) as u32,
            access: ((entry >> 40) & 0xff) as u8,
            flags: ((entry >> 52) & 0xf) as u8,
        }
    }
}

fn flat_segment(access: u8, flags: u8) -> u64 {
    SegmentDescriptor {
        base: 0,
        limit: 0xf_ffff,
        access,
        flags: flags | FLAG_GRANULARITY_4K,
    }
    .to_u64()
}

fn busy_tss() -> u64 {
    SegmentDescriptor {
        base: 0,
        limit: TSS_LIMIT,
        access: ACCESS_BUSY_TSS,
        flags: 0,
    }
    .to_u64()
}

/// GDT for the 64-bit Linux boot protocol: null, 64-bit code (0x8), data (0x10), TSS (0x18,
/// with its upper 8 bytes zero since a long-mode TSS descriptor is 16 bytes).
pub fn gdt_entries_64() -> [u64; GDT_ENTRY_COUNT] {
    [
        0,
        flat_segment(ACCESS_CODE, FLAG_LONG),
        flat_segment(ACCESS_DATA, FLAG_DEFAULT_32),
        busy_tss(),
        0,
    ]
}

/// GDT for the PVH boot protocol (32-bit protected mode): null, 32-bit code (0x8), data
/// (0x10), TSS (0x18).
pub fn gdt_entries_32() -> [u64; GDT_ENTRY_COUNT] {
    [
        0,
        flat_segment(ACCESS_CODE, FLAG_DEFAULT_32),
        flat_segment(ACCESS_DATA, FLAG_DEFAULT_32),
        busy_tss(),
        0,
    ]
}

/// Writes `entries` as a GDT at `addr`.
pub fn write_gdt(
    mem: &GuestMemoryMmap,
    addr: GuestAddress,
    entries: &[u64],
) -> Result<(), BootError> {
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write_slice(&bytes, addr)
        .map_err(|source| BootError::GuestMemory {
            what: "GDT",
            source,
        })
}

/// Writes identity page tables mapping the first 1 GiB with 2 MiB pages (PML4 at
/// [`PML4_START`], PDPT at [`PDPT_START`], PD at [`PD_START`]) and returns the CR3 value.
pub fn write_identity_page_tables(mem: &GuestMemoryMmap) -> Result<u64, BootError> {
    let table_flags = PTE_PRESENT | PTE_WRITABLE;
    let mut tables = vec![0u8; 3 * 4096];
    tables[..8].copy_from_slice(&(PDPT_START | table_flags).to_le_bytes());
    tables[4096..4096 + 8].copy_from_slice(&(PD_START | table_flags).to_le_bytes());
    for (i, pde) in tables[2 * 4096..].chunks_exact_mut(8).enumerate() {
        let entry = (i as u64 * LARGE_PAGE_SIZE) | table_flags | PDE_LARGE_PAGE;
        pde.copy_from_slice(&entry.to_le_bytes());
    }
    mem.write_slice(&tables, GuestAddress(PML4_START))
        .map_err(|source| BootError::GuestMemory {
            what: "page tables",
            source,
        })?;
    Ok(PML4_START)
}

/// The `kvm_segment` a vCPU gets when `selector` is loaded with the GDT descriptor `entry`.
pub fn kvm_segment_from_gdt(entry: u64, selector: u16) -> kvm_segment {
    let desc = SegmentDescriptor::from_u64(entry);
    let granularity = (desc.flags & FLAG_GRANULARITY_4K) != 0;
    let limit = if granularity {
        (desc.limit << 12) | 0xfff
    } else {
        desc.limit
    };
    let present = (desc.access >> 7) & 1;
    kvm_segment {
        base: u64::from(desc.base),
        limit,
        selector,
        type_: desc.access & 0xf,
        present,
        dpl: (desc.access >> 5) & 3,
        db: (desc.flags >> 2) & 1,
        s: (desc.access >> 4) & 1,
        l: (desc.flags >> 1) & 1,
        g: u8::from(granularity),
        avl: desc.flags & 1,
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

/// Segment, descriptor-table and control-register state for entering the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BootSregs {
    /// Code segment.
    pub cs: kvm_segment,
    /// Data segment loaded into DS, ES, FS, GS and SS.
    pub data: kvm_segment,
    /// Task register.
    pub tr: kvm_segment,
    /// GDT base and limit.
    pub gdt: kvm_dtable,
    /// IDT base and limit.
    pub idt: kvm_dtable,
    /// CR0.
    pub cr0: u64,
    /// CR3 (0 when paging is off).
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER.
    pub efer: u64,
}

impl BootSregs {
    /// Copies this state into `sregs` (as read from the vCPU), leaving the other fields alone.
    pub fn apply_to(&self, sregs: &mut kvm_sregs) {
        sregs.cs = self.cs;
        sregs.ds = self.data;
        sregs.es = self.data;
        sregs.fs = self.data;
        sregs.gs = self.data;
        sregs.ss = self.data;
        sregs.tr = self.tr;
        sregs.gdt = self.gdt;
        sregs.idt = self.idt;
        sregs.cr0 = self.cr0;
        sregs.cr3 = self.cr3;
        sregs.cr4 = self.cr4;
        sregs.efer = self.efer;
    }

    fn from_gdt(gdt: &[u64; GDT_ENTRY_COUNT]) -> Self {
        BootSregs {
            cs: kvm_segment_from_gdt(gdt[1], CODE_SELECTOR),
            data: kvm_segment_from_gdt(gdt[2], DATA_SELECTOR),
            tr: kvm_segment_from_gdt(gdt[3], TSS_SELECTOR),
            gdt: kvm_dtable {
                base: BOOT_GDT_START,
                limit: (GDT_ENTRY_COUNT * 8 - 1) as u16,
                padding: [0; 3],
            },
            idt: kvm_dtable {
                base: BOOT_IDT_START,
                limit: 7,
                padding: [0; 3],
            },
            ..Default::default()
        }
    }
}

fn write_gdt_and_idt(mem: &GuestMemoryMmap, gdt: &[u64]) -> Result<(), BootError> {
    write_gdt(mem, GuestAddress(BOOT_GDT_START), gdt)?;
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|source| BootError::GuestMemory {
            what: "IDT",
            source,
        })
}

/// Writes the 64-bit GDT, an empty IDT and identity page tables, and returns the long-mode
/// register state for the 64-bit Linux boot protocol (paging on, PAE, EFER.LME/LMA).
pub fn write_long_mode_tables(mem: &GuestMemoryMmap) -> Result<BootSregs, BootError> {
    let gdt = gdt_entries_64();
    write_gdt_and_idt(mem, &gdt)?;
    let cr3 = write_identity_page_tables(mem)?;
    Ok(BootSregs {
        cr0: CR0_PE | CR0_ET | CR0_PG,
        cr3,
        cr4: CR4_PAE,
        efer: EFER_LME | EFER_LMA,
        ..BootSregs::from_gdt(&gdt)
    })
}

/// Writes the 32-bit GDT and an empty IDT, and returns the register state the PVH boot
/// protocol requires: flat 32-bit protected mode, paging off.
pub fn write_protected_mode_tables(mem: &GuestMemoryMmap) -> Result<BootSregs, BootError> {
    let gdt = gdt_entries_32();
    write_gdt_and_idt(mem, &gdt)?;
    Ok(BootSregs {
        cr0: CR0_PE | CR0_ET,
        ..BootSregs::from_gdt(&gdt)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap()
    }

    #[test]
    fn descriptor_round_trips() {
        let desc = SegmentDescriptor {
            base: 0x1234_5678,
            limit: 0xa_bcde,
            access: 0x9a,
            flags: 0xc,
        };
        assert_eq!(SegmentDescriptor::from_u64(desc.to_u64()), desc);
    }

    #[test]
    fn gdt_64_has_the_architectural_encodings() {
        let gdt = gdt_entries_64();
        assert_eq!(gdt[0], 0);
        assert_eq!(gdt[1], 0x00af_9b00_0000_ffff);
        assert_eq!(gdt[2], 0x00cf_9300_0000_ffff);
        assert_eq!(gdt[3], 0x0000_8b00_0000_0067);
        assert_eq!(gdt_entries_32()[1], 0x00cf_9b00_0000_ffff);
    }

    #[test]
    fn code_64_segment_is_long_mode() {
        let cs = kvm_segment_from_gdt(gdt_entries_64()[1], CODE_SELECTOR);
        assert_eq!((cs.l, cs.db, cs.g, cs.s, cs.present), (1, 0, 1, 1, 1));
        assert_eq!((cs.type_, cs.dpl, cs.unusable), (0xb, 0, 0));
        assert_eq!((cs.base, cs.limit, cs.selector), (0, 0xffff_ffff, 0x8));
    }

    #[test]
    fn data_and_tss_segments_decode() {
        let ds = kvm_segment_from_gdt(gdt_entries_64()[2], DATA_SELECTOR);
        assert_eq!((ds.type_, ds.db, ds.l, ds.limit), (3, 1, 0, 0xffff_ffff));
        let tr = kvm_segment_from_gdt(gdt_entries_64()[3], TSS_SELECTOR);
        assert_eq!((tr.type_, tr.s, tr.g, tr.limit), (0xb, 0, 0, 0x67));
        assert_eq!(tr.selector, 0x18);
        let null = kvm_segment_from_gdt(0, 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn gdt_is_written_little_endian() {
        let mem = test_memory();
        let gdt = gdt_entries_64();
        write_gdt(&mem, GuestAddress(BOOT_GDT_START), &gdt).unwrap();
        for (i, entry) in gdt.iter().enumerate() {
            let read: u64 = mem
                .read_obj(GuestAddress(BOOT_GDT_START + 8 * i as u64))
                .unwrap();
            assert_eq!(read, *entry);
        }
    }

    #[test]
    fn page_tables_identity_map_1_gib() {
        let mem = test_memory();
        assert_eq!(write_identity_page_tables(&mem).unwrap(), 0x9000);
        let pml4: u64 = mem.read_obj(GuestAddress(0x9000)).unwrap();
        let pdpt: u64 = mem.read_obj(GuestAddress(0xa000)).unwrap();
        assert_eq!((pml4, pdpt), (0xa003, 0xb003));
        let first: u64 = mem.read_obj(GuestAddress(0xb000)).unwrap();
        let last: u64 = mem.read_obj(GuestAddress(0xb000 + 511 * 8)).unwrap();
        assert_eq!(first, 0x83);
        assert_eq!(last, (511 << 21) | 0x83);
    }

    #[test]
    fn long_mode_state_enables_paging() {
        let mem = test_memory();
        let state = write_long_mode_tables(&mem).unwrap();
        let mut sregs = kvm_sregs::default();
        state.apply_to(&mut sregs);
        assert_eq!(sregs.cr3, PML4_START);
        assert_eq!(sregs.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(sregs.efer, 0x500);
        assert_eq!(sregs.cr4, 0x20);
        assert_eq!(sregs.cs.l, 1);
        assert_eq!(sregs.ss.selector, DATA_SELECTOR);
        assert_eq!((sregs.gdt.base, sregs.gdt.limit), (BOOT_GDT_START, 39));
    }

    #[test]
    fn protected_mode_state_has_paging_off() {
        let mem = test_memory();
        let state = write_protected_mode_tables(&mem).unwrap();
        assert_eq!(state.cr0 & CR0_PG, 0);
        assert_eq!((state.cr3, state.cr4, state.efer), (0, 0, 0));
        assert_eq!((state.cs.db, state.cs.l), (1, 0));
    }

    #[test]
    fn writing_outside_memory_fails() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(write_identity_page_tables(&mem).is_err());
    }
}
