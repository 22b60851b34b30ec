//! The layout of a guest's ELF core (`vm.coredump`), as gdb reads a Linux process's: an ELF64
//! header of type ET_CORE for x86-64, one PT_NOTE segment holding an NT_PRSTATUS note per vCPU
//! (its general registers in `user_regs_struct` order, the vCPU as a thread), then one
//! PT_LOAD segment per region of guest RAM, its guest-physical address as both the virtual and
//! the physical address (a guest that maps itself 1:1, as the bench guest and early kernels
//! do, reads its variables at their link addresses). The regions' bytes start page-aligned
//! after the notes; this module computes where, the caller writes them there.

use kvm_bindings::{kvm_regs, kvm_sregs};

/// ELF64 header, program header, note header sizes.
const EHDR_LEN: usize = 64;
const PHDR_LEN: usize = 56;
const NOTE_HEADER_LEN: usize = 12;
/// `struct elf_prstatus` on x86-64 and where its `pr_reg` starts.
pub const PRSTATUS_LEN: usize = 336;
const PRSTATUS_PID: usize = 32;
const PRSTATUS_REG: usize = 112;
/// `user_regs_struct`: 27 registers.
pub const USER_REGS: usize = 27;
const ET_CORE: u16 = 4;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const NT_PRSTATUS: u32 = 1;
const PF_RWX: u32 = 7;
/// Where the regions' bytes start: page-aligned, as a core's loads are.
pub const REGION_ALIGN: u64 = 4096;

/// One vCPU's registers for its note: its id (the note's thread id is id + 1: gdb takes 0
/// as "no thread") and `user_regs_struct`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreVcpu {
    pub id: u32,
    pub regs: [u64; USER_REGS],
}

impl CoreVcpu {
    /// `user_regs_struct` from KVM's registers: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx
    /// rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs.
    pub fn from_kvm(id: u32, r: &kvm_regs, s: &kvm_sregs) -> Self {
        let sel = |seg: &kvm_bindings::kvm_segment| u64::from(seg.selector);
        let regs = [
            r.r15,
            r.r14,
            r.r13,
            r.r12,
            r.rbp,
            r.rbx,
            r.r11,
            r.r10,
            r.r9,
            r.r8,
            r.rax,
            r.rcx,
            r.rdx,
            r.rsi,
            r.rdi,
            u64::MAX, // orig_rax: not in a system call
            r.rip,
            sel(&s.cs),
            r.rflags,
            r.rsp,
            sel(&s.ss),
            s.fs.base,
            s.gs.base,
            sel(&s.ds),
            sel(&s.es),
            sel(&s.fs),
            sel(&s.gs),
        ];
        CoreVcpu { id, regs }
    }
}

/// A region of guest RAM: its guest-physical address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreRegion {
    pub gpa: u64,
    pub len: u64,
}

/// The core file's layout: its first bytes (header, program headers, notes) and where each
/// region's bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreLayout {
    pub head: Vec<u8>,
    /// File offset of each region's bytes, in the order given.
    pub region_offsets: Vec<u64>,
    /// The whole file's size.
    pub file_size: u64,
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The ELF header for `phnum` program headers right after it.
fn elf_header(phnum: u16) -> [u8; EHDR_LEN] {
    let mut h = [0u8; EHDR_LEN];
    // Magic, 64-bit, little-endian, version 1, System V ABI.
    h[..7].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    put16(&mut h, 16, ET_CORE);
    put16(&mut h, 18, EM_X86_64);
    put32(&mut h, 20, 1);
    put64(&mut h, 32, EHDR_LEN as u64); // e_phoff
    put16(&mut h, 52, EHDR_LEN as u16);
    put16(&mut h, 54, PHDR_LEN as u16);
    put16(&mut h, 56, phnum);
    h
}

fn program_header(kind: u32, offset: u64, addr: u64, size: u64, align: u64) -> [u8; PHDR_LEN] {
    let mut p = [0u8; PHDR_LEN];
    put32(&mut p, 0, kind);
    put32(&mut p, 4, if kind == PT_LOAD { PF_RWX } else { 0 });
    put64(&mut p, 8, offset);
    put64(&mut p, 16, addr); // p_vaddr
    put64(&mut p, 24, addr); // p_paddr
    put64(&mut p, 32, size); // p_filesz
    put64(&mut p, 40, size); // p_memsz
    put64(&mut p, 48, align);
    p
}

/// One NT_PRSTATUS note: name "CORE", the vCPU's thread id and registers.
fn prstatus_note(vcpu: &CoreVcpu) -> Vec<u8> {
    let mut note = vec![0u8; NOTE_HEADER_LEN + 8 + PRSTATUS_LEN];
    put32(&mut note, 0, 5); // namesz, "CORE\0"
    put32(&mut note, 4, PRSTATUS_LEN as u32);
    put32(&mut note, 8, NT_PRSTATUS);
    note[12..16].copy_from_slice(b"CORE"); // padded to 8 bytes with zeros
    let desc = &mut note[NOTE_HEADER_LEN + 8..];
    put32(desc, PRSTATUS_PID, vcpu.id + 1);
    for (i, r) in vcpu.regs.iter().enumerate() {
        put64(desc, PRSTATUS_REG + 8 * i, *r);
    }
    note
}

/// The layout of a core with `vcpus`' notes and `regions`' bytes.
pub fn layout(vcpus: &[CoreVcpu], regions: &[CoreRegion]) -> CoreLayout {
    let notes: Vec<u8> = vcpus.iter().flat_map(prstatus_note).collect();
    let phnum = 1 + regions.len();
    let notes_at = (EHDR_LEN + phnum * PHDR_LEN) as u64;
    let mut next = (notes_at + notes.len() as u64).next_multiple_of(REGION_ALIGN);
    let mut region_offsets = Vec::with_capacity(regions.len());
    let mut head = elf_header(phnum as u16).to_vec();
    head.extend(program_header(PT_NOTE, notes_at, 0, notes.len() as u64, 4));
    for r in regions {
        head.extend(program_header(PT_LOAD, next, r.gpa, r.len, REGION_ALIGN));
        region_offsets.push(next);
        next += r.len.next_multiple_of(REGION_ALIGN);
    }
    head.extend(notes);
    let file_size = match regions.last() {
        Some(r) => region_offsets[regions.len() - 1] + r.len,
        None => head.len() as u64,
    };
    CoreLayout {
        head,
        region_offsets,
        file_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn registers_go_where_user_regs_struct_has_them() {
        let r = kvm_regs {
            rip: 0x10_0000,
            rsp: 0x20_0000,
            rax: 1,
            r15: 15,
            rflags: 0x202,
            ..Default::default()
        };
        let mut s = kvm_sregs::default();
        s.cs.selector = 8;
        s.ss.selector = 0x10;
        s.gs.base = 0xdead;
        let v = CoreVcpu::from_kvm(0, &r, &s);
        assert_eq!(v.regs[0], 15, "r15 first");
        assert_eq!(v.regs[10], 1, "rax");
        assert_eq!(v.regs[15], u64::MAX, "orig_rax");
        assert_eq!((v.regs[16], v.regs[17], v.regs[18]), (0x10_0000, 8, 0x202));
        assert_eq!(
            (v.regs[19], v.regs[20], v.regs[22]),
            (0x20_0000, 0x10, 0xdead)
        );
    }

    #[test]
    fn the_header_notes_and_loads_are_where_the_program_headers_say() {
        let vcpus = [
            CoreVcpu {
                id: 0,
                regs: [0x11; USER_REGS],
            },
            CoreVcpu {
                id: 1,
                regs: [0x22; USER_REGS],
            },
        ];
        let regions = [
            CoreRegion {
                gpa: 0,
                len: 0xc000_0000,
            },
            CoreRegion {
                gpa: 0x1_0000_0000,
                len: 0x3000,
            },
        ];
        let l = layout(&vcpus, &regions);
        let h = &l.head;
        assert_eq!(&h[..4], b"\x7fELF");
        assert_eq!((h[4], h[5]), (2, 1), "ELF64, little-endian");
        assert_eq!((u16_at(h, 16), u16_at(h, 18)), (ET_CORE, EM_X86_64));
        assert_eq!((u64_at(h, 32), u16_at(h, 54), u16_at(h, 56)), (64, 56, 3));
        // PT_NOTE: right after the three program headers, two notes of 12 + 8 + 336 bytes.
        let note = &h[64..120];
        assert_eq!(u32_at(note, 0), PT_NOTE);
        let (at, size) = (u64_at(note, 8) as usize, u64_at(note, 32) as usize);
        assert_eq!((at, size), (64 + 3 * 56, 2 * 356));
        let second = &h[at + 356..at + 2 * 356];
        assert_eq!((u32_at(second, 0), u32_at(second, 4)), (5, 336));
        assert_eq!(
            (u32_at(second, 8), &second[12..17]),
            (NT_PRSTATUS, &b"CORE\0"[..])
        );
        assert_eq!(u32_at(second, 20 + PRSTATUS_PID), 2, "vCPU 1 is thread 2");
        assert_eq!(u64_at(second, 20 + PRSTATUS_REG + 8 * 16), 0x22, "rip");
        // PT_LOADs: page-aligned, one after the other, at their guest-physical addresses.
        let load = |i: usize| &h[64 + 56 * (i + 1)..64 + 56 * (i + 2)];
        assert_eq!(u32_at(load(0), 0), PT_LOAD);
        assert_eq!(u64_at(load(0), 8), 4096);
        assert_eq!(u64_at(load(1), 8), 4096 + 0xc000_0000);
        assert_eq!(u64_at(load(1), 16), 0x1_0000_0000);
        assert_eq!(u64_at(load(1), 32), 0x3000);
        assert_eq!(l.region_offsets, vec![4096, 4096 + 0xc000_0000]);
        assert_eq!(l.file_size, 4096 + 0xc000_0000 + 0x3000);
        assert_eq!(h.len(), at + size, "the notes end the head");
    }
}
