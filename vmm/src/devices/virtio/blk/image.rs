//! What exitless checks of an image file before a guest may use it: its format (only raw is
//! served; with `image_type: "Unknown"` the first bytes are probed) and a lock on it, so that
//! two writers never share one image: an exclusive lock for a writable disk, a shared one for
//! a read-only disk, both open file description (OFD) locks as QEMU and Cloud Hypervisor take.
//! An OFD lock belongs to the open file, so a second device of the same VM on the same image
//! conflicts too; it goes when the device's file is closed (for a hot-unplugged disk, once the
//! guest has ejected it).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};

use super::BlockError;

/// Image formats other than raw, by their signature at offset 0.
const SIGNATURES: &[(&[u8], &str)] = &[
    (b"QFI\xfb", "qcow2"),
    (b"QED\0", "qed"),
    (b"vhdxfile", "vhdx"),
    (b"conectix", "vhd"),
    (b"KDMV", "vmdk"),
    (b"# Disk DescriptorFile", "vmdk"),
    (b"LUKS\xba\xbe", "luks"),
];
/// VirtualBox's VDI: its signature sits at offset 0x40.
const VDI_SIGNATURE: (u64, [u8; 4]) = (0x40, [0x7f, 0x10, 0xda, 0xbe]);

/// The format of `file` when it is not raw (by signature), or None for raw.
pub fn probe_format(file: &File) -> io::Result<Option<&'static str>> {
    let mut head = [0u8; 512];
    let n = read_at_most(file, &mut head, 0)?;
    let head = &head[..n];
    if let Some((_, name)) = SIGNATURES.iter().find(|(sig, _)| head.starts_with(sig)) {
        return Ok(Some(name));
    }
    let (at, sig) = VDI_SIGNATURE;
    if head.get(at as usize..at as usize + 4) == Some(&sig[..]) {
        return Ok(Some("vdi"));
    }
    // A fixed-size VHD is raw data with a 512-byte footer carrying the signature.
    let len = file.metadata()?.len();
    if len >= 512 {
        let mut footer = [0u8; 8];
        if read_at_most(file, &mut footer, len - 512)? == 8 && &footer == b"conectix" {
            return Ok(Some("vhd"));
        }
    }
    Ok(None)
}

fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Takes the image's lock: exclusive for a writable disk, shared for a read-only one.
/// Refused with who holds a conflicting lock.
pub fn lock(file: &File, path: &str, readonly: bool) -> Result<(), BlockError> {
    let kind = if readonly {
        libc::F_RDLCK
    } else {
        libc::F_WRLCK
    };
    // SAFETY: flock is plain data; all-zero is a valid value to fill in.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // l_start 0, l_len 0: the whole file, however it grows.
    // SAFETY: F_OFD_SETLK reads the flock we pass, which lives across the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if r == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if !matches!(error.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) {
        return Err(BlockError::Lock {
            path: path.into(),
            error,
        });
    }
    let meta = file.metadata().map_err(|error| BlockError::Lock {
        path: path.into(),
        error,
    })?;
    Err(BlockError::Locked {
        path: path.into(),
        holder: holder(meta.dev(), meta.ino()),
    })
}

/// Lets go of the image's lock (taken again with [`lock`]).
pub fn unlock(file: &File) -> io::Result<()> {
    // SAFETY: flock is plain data; all-zero is a valid value to fill in.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_UNLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_OFD_SETLK reads the flock we pass, which lives across the call.
    match unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Who holds a lock on the file with this device and inode, from the `lock:` lines of
/// /proc/*/fdinfo (OFD locks show no pid in /proc/locks): "process 123 (exitless)", "this
/// VM (another device)", or "another program" when it cannot be told.
fn holder(dev: u64, ino: u64) -> String {
    let key = format!(" {:02x}:{:02x}:{ino} ", libc::major(dev), libc::minor(dev));
    let me = std::process::id();
    let found = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| holds(pid, &key));
    match found {
        Some(pid) if pid == me => "this VM (another of its disks)".into(),
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("process {pid} ({})", comm.trim())
        }
        None => "another program".into(),
    }
}

/// Whether process `pid` has a file open with a lock line naming `key` (" MAJ:MIN:INODE ").
fn holds(pid: u32, key: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_to_string(fd.path()).is_ok_and(|info| {
            info.lines()
                .any(|l| l.starts_with("lock:") && l.contains(key))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Write;

    fn image(tag: &str, bytes: &[u8], len: u64) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("exitless-image-{tag}-{}", std::process::id()));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        f.set_len(len).unwrap();
        path
    }

    fn open(path: &std::path::Path, write: bool) -> File {
        OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .unwrap()
    }

    #[test]
    fn formats_are_told_by_their_signature_and_anything_else_is_raw() {
        for (bytes, want) in [
            (&b"QFI\xfb\0\0\0\x03"[..], Some("qcow2")),
            (b"vhdxfile", Some("vhdx")),
            (b"KDMV", Some("vmdk")),
            (b"\0\0\0\0", None),
            (b"QFI", None),
        ] {
            let path = image("probe", bytes, 1 << 20);
            assert_eq!(
                probe_format(&open(&path, false)).unwrap(),
                want,
                "{bytes:?}"
            );
            std::fs::remove_file(&path).unwrap();
        }
        // A fixed VHD: the signature is in the footer.
        let path = image("vhd", b"", 1 << 20);
        open(&path, true)
            .write_at(b"conectix", (1 << 20) - 512)
            .unwrap();
        assert_eq!(probe_format(&open(&path, false)).unwrap(), Some("vhd"));
        std::fs::remove_file(&path).unwrap();
        // An empty file is raw.
        let path = image("empty", b"", 0);
        assert_eq!(probe_format(&open(&path, false)).unwrap(), None);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_writer_excludes_everyone_and_readers_share() {
        let path = image("lock", b"", 1 << 20);
        let shown = path.display().to_string();
        let writer = open(&path, true);
        lock(&writer, &shown, false).unwrap();
        for readonly in [false, true] {
            let e = lock(&open(&path, !readonly), &shown, readonly).unwrap_err();
            let e = e.to_string();
            assert!(e.contains(&shown) && e.contains("this VM"), "{e}");
        }
        drop(writer);
        let (r1, r2) = (open(&path, false), open(&path, false));
        lock(&r1, &shown, true).unwrap();
        lock(&r2, &shown, true).unwrap();
        assert!(lock(&open(&path, true), &shown, false).is_err());
        drop((r1, r2));
        lock(&open(&path, true), &shown, false).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
