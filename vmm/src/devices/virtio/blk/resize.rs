//! `vm.resize-disk`: the image grows (its file extended, the new part reads as zeros), the
//! capacity the driver reads and the queue work checks requests against follows. Shrinking is
//! refused: the guest may have data there. The transport then tells the driver (a new
//! configuration generation and the configuration-change interrupt).

use std::sync::atomic::Ordering;

use super::{Block, SECTOR};

impl Block {
    /// Grows the image to `bytes`: Ok(true) once done, Ok(false) if it has that size, or why
    /// not (read-only, smaller, not whole sectors, the file cannot grow).
    pub(super) fn grow(&mut self, bytes: u64) -> Result<bool, String> {
        let now = self.capacity.load(Ordering::Acquire);
        check_growth(now, bytes, self.shape.readonly)?;
        if bytes == now {
            return Ok(false);
        }
        self.file
            .set_len(bytes)
            .map_err(|e| format!("the image cannot grow to {bytes} bytes: {e}"))?;
        self.config[0..8].copy_from_slice(&(bytes / SECTOR).to_le_bytes());
        self.capacity.store(bytes, Ordering::Release);
        Ok(true)
    }
}

/// Whether a disk of `now` bytes may become `bytes`.
fn check_growth(now: u64, bytes: u64, readonly: bool) -> Result<(), String> {
    if readonly {
        return Err("the disk is read-only".into());
    }
    if bytes < now {
        return Err(format!(
            "shrinking is not supported (the disk has {now} bytes, {bytes} asked)"
        ));
    }
    if bytes % SECTOR != 0 {
        return Err(format!(
            "{bytes} bytes is not a whole number of {SECTOR}-byte sectors"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DiskConfig;
    use crate::devices::virtio::VirtioDevice;

    #[test]
    fn growth_is_checked_by_name() {
        assert!(check_growth(1 << 20, 2 << 20, false).is_ok());
        assert!(check_growth(1 << 20, 1 << 20, false).is_ok());
        let shrink = check_growth(2 << 20, 1 << 20, false).unwrap_err();
        assert!(shrink.contains("shrinking is not supported"), "{shrink}");
        assert!(check_growth(0, 1000, false)
            .unwrap_err()
            .contains("sectors"));
        assert!(check_growth(0, 1024, true)
            .unwrap_err()
            .contains("read-only"));
    }

    #[test]
    fn a_grown_disk_has_the_new_size_in_its_file_and_its_config() {
        let dir = std::env::temp_dir().join(format!("exitless-grow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let disk = DiskConfig {
            path: path.clone(),
            ..DiskConfig::default()
        };
        let mut block = Block::open(&disk).unwrap();
        assert_eq!(block.resize(1 << 20), Ok(true));
        assert_eq!(block.resize(1 << 20), Ok(false), "the size it has");
        assert!(block.resize(4096).is_err(), "a shrink");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
        let mut capacity = [0u8; 8];
        block.read_config(0, &mut capacity);
        assert_eq!(u64::from_le_bytes(capacity), (1 << 20) / SECTOR);
        let head = std::fs::read(&path).unwrap();
        assert!(head[..4096].iter().all(|&b| b == 7) && head[4096..].iter().all(|&b| b == 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
