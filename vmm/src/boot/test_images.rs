//! Tiny synthetic kernel images, temporary files and guest-memory helpers for the boot tests.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use linux_loader::loader::bootparam::{setup_header, LOADED_HIGH, XLF_KERNEL_64};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

/// 16 MiB of guest memory at address 0.
pub fn test_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap()
}

/// `len` bytes of guest memory at `addr`.
pub fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
    buf
}

/// Whether the bytes sum to zero modulo 256 (ACPI and MP table checksums).
pub fn sums_to_zero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b)) == 0
}

const ELF_HEADER_SIZE: usize = 64;
const PROGRAM_HEADER_SIZE: usize = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// A file in the system temp directory, removed when dropped.
pub struct TempFile(PathBuf);

impl TempFile {
    pub fn with_contents(contents: &[u8]) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "exitless-boot-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn program_header(kind: u32, offset: u64, paddr: u64, filesz: u64, memsz: u64) -> Vec<u8> {
    let mut ph = Vec::with_capacity(PROGRAM_HEADER_SIZE);
    ph.extend_from_slice(&kind.to_le_bytes());
    ph.extend_from_slice(&5u32.to_le_bytes()); // flags: R+X
    ph.extend_from_slice(&offset.to_le_bytes());
    ph.extend_from_slice(&paddr.to_le_bytes()); // vaddr
    ph.extend_from_slice(&paddr.to_le_bytes());
    ph.extend_from_slice(&filesz.to_le_bytes());
    ph.extend_from_slice(&memsz.to_le_bytes());
    ph.extend_from_slice(&0x1000u64.to_le_bytes()); // align
    ph
}

fn elf_header(entry: u64, phnum: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(ELF_HEADER_SIZE);
    h.extend_from_slice(b"\x7fELF");
    h.extend_from_slice(&[2, 1, 1, 0]); // 64-bit, little endian, version 1, System V
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&entry.to_le_bytes());
    h.extend_from_slice(&(ELF_HEADER_SIZE as u64).to_le_bytes()); // phoff
    h.extend_from_slice(&0u64.to_le_bytes()); // shoff
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    h.extend_from_slice(&(ELF_HEADER_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&(PROGRAM_HEADER_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&phnum.to_le_bytes());
    h.extend_from_slice(&[0; 6]); // shentsize, shnum, shstrndx
    h
}

fn pvh_note(entry: u32) -> Vec<u8> {
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes()); // namesz
    note.extend_from_slice(&4u32.to_le_bytes()); // descsz
    note.extend_from_slice(&XEN_ELFNOTE_PHYS32_ENTRY.to_le_bytes());
    note.extend_from_slice(b"Xen\0");
    note.extend_from_slice(&entry.to_le_bytes());
    note
}

/// A minimal ELF64 vmlinux: one PT_LOAD of `payload` at physical `paddr` (occupying `memsz`
/// bytes in memory), entry point `paddr`, and optionally a PVH note with `pvh_entry`.
pub fn elf_image(paddr: u64, payload: &[u8], memsz: u64, pvh_entry: Option<u32>) -> Vec<u8> {
    let phnum: u16 = if pvh_entry.is_some() { 2 } else { 1 };
    let payload_offset = (ELF_HEADER_SIZE + PROGRAM_HEADER_SIZE * phnum as usize) as u64;
    let note_offset = payload_offset + payload.len() as u64;
    let note = pvh_entry.map(pvh_note).unwrap_or_default();
    let mut image = elf_header(paddr, phnum);
    let size = payload.len() as u64;
    image.extend(program_header(PT_LOAD, payload_offset, paddr, size, memsz));
    if pvh_entry.is_some() {
        let note_len = note.len() as u64;
        image.extend(program_header(PT_NOTE, note_offset, 0, note_len, note_len));
    }
    image.extend_from_slice(payload);
    image.extend(note);
    image
}

/// Knobs of a synthetic bzImage.
pub struct BzImageSpec {
    pub version: u16,
    pub xloadflags: u16,
    pub init_size: u32,
    pub initrd_addr_max: u32,
    pub cmdline_size: u32,
}

impl Default for BzImageSpec {
    fn default() -> Self {
        BzImageSpec {
            version: 0x020f,
            xloadflags: XLF_KERNEL_64,
            init_size: 0x20_0000,
            initrd_addr_max: 0x7fff_ffff,
            cmdline_size: 2047,
        }
    }
}

pub const BZIMAGE_SETUP_SECTS: u8 = 3;

/// A bzImage: boot sector and `BZIMAGE_SETUP_SECTS` setup sectors carrying a setup header at
/// 0x1f1, followed by `payload` as the protected-mode kernel.
pub fn bzimage(spec: &BzImageSpec, payload: &[u8]) -> Vec<u8> {
    let header = setup_header {
        setup_sects: BZIMAGE_SETUP_SECTS,
        boot_flag: 0xaa55,
        header: u32::from_le_bytes(*b"HdrS"),
        version: spec.version,
        loadflags: LOADED_HIGH,
        code32_start: 0x10_0000,
        initrd_addr_max: spec.initrd_addr_max,
        kernel_alignment: 0x20_0000,
        relocatable_kernel: 1,
        xloadflags: spec.xloadflags,
        cmdline_size: spec.cmdline_size,
        pref_address: 0x100_0000,
        init_size: spec.init_size,
        ..Default::default()
    };
    let setup_len = (usize::from(BZIMAGE_SETUP_SECTS) + 1) * 512;
    let mut image = vec![0u8; setup_len];
    image[0x1f1..0x1f1 + header.as_slice().len()].copy_from_slice(header.as_slice());
    image.extend_from_slice(payload);
    image
}
