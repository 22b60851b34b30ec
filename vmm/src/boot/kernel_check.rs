//! Is the kernel file whole? A truncated ELF vmlinux otherwise fails as "memory too small"
//! (the loader's failed copy looks like one), and a truncated bzImage boots and dies: the
//! headers say how long the file must be, so check that before loading.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::BootError;

const ELF_PT_LOAD: u32 = 1;
const ELF_HEADER_LEN: usize = 64;
const ELF_PHDR_MIN: usize = 56;
/// bzImage setup header fields (boot protocol): setup_sects and syssize (16-byte units).
const BZ_SETUP_SECTS: usize = 0x1f1;
const BZ_SYSSIZE: usize = 0x1f4;

fn le_u16(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn le_u32(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u64::from(u32::from_le_bytes(v))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// Bytes an ELF64 file must have: its program headers and every loadable segment's bytes.
fn elf_needs(file: &mut File) -> std::io::Result<u64> {
    let mut header = [0u8; ELF_HEADER_LEN];
    file.read_exact(&mut header)?;
    let (phoff, phentsize, phnum) = (
        le_u64(&header, 0x20),
        le_u16(&header, 0x36),
        le_u16(&header, 0x38),
    );
    let table_end = phoff.saturating_add(phentsize.saturating_mul(phnum));
    let mut needs = table_end.max(ELF_HEADER_LEN as u64);
    if (phentsize as usize) < ELF_PHDR_MIN {
        return Ok(needs);
    }
    let mut phdr = vec![0u8; phentsize as usize];
    for i in 0..phnum {
        file.seek(SeekFrom::Start(phoff.saturating_add(i * phentsize)))?;
        if file.read_exact(&mut phdr).is_err() {
            break; // the table itself is cut short: `needs` already says so
        }
        if le_u32(&phdr, 0) as u32 == ELF_PT_LOAD {
            let end = le_u64(&phdr, 0x08).saturating_add(le_u64(&phdr, 0x20));
            needs = needs.max(end);
        }
    }
    Ok(needs)
}

/// Bytes a bzImage must have: its setup sectors and protected-mode code (syssize).
fn bzimage_needs(file: &mut File) -> std::io::Result<u64> {
    let mut header = [0u8; BZ_SYSSIZE + 4];
    file.read_exact(&mut header)?;
    let setup_sects = match header[BZ_SETUP_SECTS] {
        0 => 4, // the boot protocol's meaning of 0
        n => u64::from(n),
    };
    Ok((setup_sects + 1) * 512 + le_u32(&header, BZ_SYSSIZE) * 16)
}

/// Fails with [`BootError::Truncated`] when `file` is shorter than its headers say.
pub fn check_complete(file: &mut File, path: &Path, elf: bool) -> Result<(), BootError> {
    let io_error = |source| BootError::KernelFile {
        path: path.to_path_buf(),
        source,
    };
    let has = file.metadata().map_err(io_error)?.len();
    file.seek(SeekFrom::Start(0)).map_err(io_error)?;
    let needs = if elf {
        elf_needs(file)
    } else {
        bzimage_needs(file)
    };
    file.seek(SeekFrom::Start(0)).map_err(io_error)?;
    // A header that cannot even be read is as truncated as it gets.
    let needs = needs.unwrap_or(u64::MAX);
    if needs > has {
        return Err(BootError::Truncated {
            path: path.to_path_buf(),
            needs,
            has,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::test_images::{bzimage, elf_image, BzImageSpec, TempFile};

    fn check(image: &[u8], elf: bool) -> Result<(), BootError> {
        let f = TempFile::with_contents(image);
        let mut file = File::open(f.path()).unwrap();
        check_complete(&mut file, f.path(), elf)
    }

    #[test]
    fn whole_images_pass_and_cut_ones_say_so() {
        let elf = elf_image(0x100_0000, &[0x90; 4096], 8192, Some(0x100_0000));
        check(&elf, true).unwrap();
        let err = check(&elf[..elf.len() - 100], true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is truncated or invalid"), "{err}");
        assert!(
            err.contains(&format!("the file has {}", elf.len() - 100)),
            "{err}"
        );
        assert!(check(&elf[..40], true).is_err());

        let mut bz = bzimage(&BzImageSpec::default(), &[0u8; 4096]);
        bz[BZ_SYSSIZE..BZ_SYSSIZE + 4].copy_from_slice(&(4096u32 / 16).to_le_bytes());
        check(&bz, false).unwrap();
        let err = check(&bz[..bz.len() - 1], false).unwrap_err().to_string();
        assert!(
            err.contains(&format!("describe {} bytes", bz.len())),
            "{err}"
        );
    }
}
