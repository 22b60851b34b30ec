//! Devices' bytes beyond their JSON state (a vhost-user back end's own state), one file per
//! device beside `state.json`: `device-<id>.bin`, named with its size and CRC-32 in the
//! device's entry. Written before `state.json` (a snapshot is complete once that is there),
//! read and checked on restore before the devices get their state.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::format::{DeviceData, DeviceEntry};
use super::{write_file, SnapshotError};

/// The most a device's file may hold (a back end's state; see `vhost_user::device_state`).
pub const MAX_DEVICE_DATA: u64 = 256 << 20;

/// The data file of device `id`; ids that could leave the directory are refused.
pub fn file_name(id: &str) -> Result<String, String> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if id.is_empty() || id.starts_with('.') || !id.chars().all(safe) {
        return Err(format!(
            "its id cannot name a file beside state.json ({id:?}: letters, digits, '_', '-' \
             and '.' only)"
        ));
    }
    Ok(format!("device-{id}.bin"))
}

/// The entry's data for `bytes` (kept in it until [`write_all`]).
pub fn describe(id: &str, bytes: Vec<u8>) -> Result<DeviceData, String> {
    Ok(DeviceData {
        file: file_name(id)?,
        size: bytes.len() as u64,
        crc32: crc_of(&bytes),
        bytes,
    })
}

fn crc_of(bytes: &[u8]) -> String {
    format!("crc32:{:08x}", crc32fast::hash(bytes))
}

/// Writes every device's data to its file (through a temporary name).
pub fn write_all(dir: &Path, devices: &BTreeMap<String, DeviceEntry>) -> Result<(), SnapshotError> {
    for data in devices.values().filter_map(|e| e.data.as_ref()) {
        write_file(dir, &data.file, &data.bytes)?;
    }
    Ok(())
}

/// Reads every device's data file into its entry, checked: the name the id gives, the size
/// and CRC-32 the entry says.
pub fn read_all(
    dir: &Path,
    devices: &mut BTreeMap<String, DeviceEntry>,
) -> Result<(), SnapshotError> {
    for (id, entry) in devices.iter_mut() {
        let Some(data) = entry.data.as_mut() else {
            continue;
        };
        let invalid = |reason: String| SnapshotError::DeviceState {
            id: id.clone(),
            kind: entry.kind.clone(),
            reason,
        };
        let want = file_name(id).map_err(invalid)?;
        if data.file != want {
            return Err(invalid(format!(
                "its data file is {:?}, not {want:?}",
                data.file
            )));
        }
        if data.size > MAX_DEVICE_DATA {
            return Err(invalid(format!(
                "{} bytes of data, more than {MAX_DEVICE_DATA}",
                data.size
            )));
        }
        let path = dir.join(&data.file);
        let read_error = |error| SnapshotError::Read {
            path: path.clone(),
            error,
        };
        let file = std::fs::File::open(&path).map_err(read_error)?;
        let mut bytes = Vec::new();
        file.take(data.size + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 != data.size || crc_of(&bytes) != data.crc32 {
            return Err(invalid(format!(
                "{} is not what the snapshot wrote ({} bytes read, {} saved; or its CRC-32 differs)",
                path.display(),
                bytes.len(),
                data.size
            )));
        }
        data.bytes = bytes;
    }
    Ok(())
}

/// A live migration's State payload: the length of `json` (u64, little-endian), `json`
/// (state.json), then each device's data bytes in the entries' order (ids sorted), each
/// named with its size and CRC-32 in state.json as a snapshot names its file.
pub fn frame_state(json: &[u8], devices: &BTreeMap<String, DeviceEntry>) -> Vec<u8> {
    let data: usize = devices
        .values()
        .filter_map(|e| e.data.as_ref())
        .map(|d| d.bytes.len())
        .sum();
    let mut out = Vec::with_capacity(8 + json.len() + data);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json);
    for d in devices.values().filter_map(|e| e.data.as_ref()) {
        out.extend_from_slice(&d.bytes);
    }
    out
}

/// Splits a State payload ([`frame_state`]) into state.json's bytes and what follows.
pub fn unframe_state(payload: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let (len, rest) = payload
        .split_first_chunk::<8>()
        .ok_or("the state is shorter than its length")?;
    let len = usize::try_from(u64::from_le_bytes(*len)).unwrap_or(usize::MAX);
    if len > rest.len() {
        return Err(format!(
            "the state says {len} bytes of state.json, {} came",
            rest.len()
        ));
    }
    Ok(rest.split_at(len))
}

/// Gives each device its data from `rest` (what followed state.json in a State payload),
/// checked as [`read_all`] checks files: the size and CRC-32 its entry says; nothing may be
/// left over.
pub fn take_all(
    mut rest: &[u8],
    devices: &mut BTreeMap<String, DeviceEntry>,
) -> Result<(), SnapshotError> {
    for (id, entry) in devices.iter_mut() {
        let Some(data) = entry.data.as_mut() else {
            continue;
        };
        let invalid = |reason: String| SnapshotError::DeviceState {
            id: id.clone(),
            kind: entry.kind.clone(),
            reason,
        };
        let size = usize::try_from(data.size).unwrap_or(usize::MAX);
        if size > rest.len() {
            return Err(invalid(format!(
                "{size} bytes of data, {} came",
                rest.len()
            )));
        }
        let (bytes, more) = rest.split_at(size);
        if crc_of(bytes) != data.crc32 {
            return Err(invalid(
                "its data's CRC-32 differs from the one named".into(),
            ));
        }
        data.bytes = bytes.to_vec();
        rest = more;
    }
    match rest.is_empty() {
        true => Ok(()),
        false => Err(SnapshotError::Corrupt(format!(
            "{} bytes after the devices' data",
            rest.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, bytes: &[u8]) -> (String, DeviceEntry) {
        let entry = DeviceEntry {
            kind: "virtio-fs".into(),
            state: serde_json::json!({}),
            data: Some(describe(id, bytes.to_vec()).unwrap()),
            pci: None,
        };
        (id.to_string(), entry)
    }

    #[test]
    fn a_migrations_state_carries_the_data_after_state_json_checked() {
        let saved: BTreeMap<_, _> = [entry("_fs0", b"state of fs0"), entry("fs1", b"x")]
            .into_iter()
            .collect();
        let json = serde_json::to_vec(&saved).unwrap();
        let payload = frame_state(&json, &saved);
        let (got, data) = unframe_state(&payload).unwrap();
        assert_eq!((got, data), (&json[..], &b"state of fs0x"[..]));
        let mut read: BTreeMap<String, DeviceEntry> = serde_json::from_slice(got).unwrap();
        take_all(data, &mut read).unwrap();
        assert_eq!(read, saved);
        // Too short, a changed byte, bytes left over, a length past the end: refused.
        for (bytes, why) in [
            (&b"state of fs0"[..], "1 bytes of data, 0 came"),
            (b"state of fs1x", "CRC-32"),
            (b"state of fs0xy", "1 bytes after"),
        ] {
            let mut again: BTreeMap<String, DeviceEntry> = serde_json::from_slice(got).unwrap();
            let e = take_all(bytes, &mut again).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        assert!(unframe_state(&payload[..8 + json.len() - 1]).is_err());
        assert!(unframe_state(&payload[..7]).is_err());
    }

    #[test]
    fn data_goes_to_a_file_per_device_and_comes_back_checked() {
        let dir = std::env::temp_dir().join(format!("exitless-devdata-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let saved: BTreeMap<_, _> = [entry("_fs0", b"state of fs0"), entry("fs1", b"")]
            .into_iter()
            .collect();
        write_all(&dir, &saved).unwrap();
        assert_eq!(
            std::fs::read(dir.join("device-_fs0.bin")).unwrap(),
            b"state of fs0"
        );
        // What state.json holds: the bytes are not in it.
        let json = serde_json::to_string(&saved).unwrap();
        let mut read: BTreeMap<String, DeviceEntry> = serde_json::from_str(&json).unwrap();
        assert!(read["_fs0"].data.as_ref().unwrap().bytes.is_empty());
        read_all(&dir, &mut read).unwrap();
        assert_eq!(read, saved);
        // A changed byte, a truncated file, a file name that is not the id's: refused.
        std::fs::write(dir.join("device-_fs0.bin"), b"state of fs1").unwrap();
        let mut again: BTreeMap<String, DeviceEntry> = serde_json::from_str(&json).unwrap();
        let e = read_all(&dir, &mut again).unwrap_err().to_string();
        assert!(
            e.contains("device _fs0 (virtio-fs)") && e.contains("CRC-32"),
            "{e}"
        );
        std::fs::write(dir.join("device-_fs0.bin"), b"state").unwrap();
        let e = read_all(&dir, &mut again).unwrap_err().to_string();
        assert!(e.contains("5 bytes read, 12 saved"), "{e}");
        std::fs::write(dir.join("device-_fs0.bin"), b"state of fs0").unwrap();
        let mut moved: BTreeMap<String, DeviceEntry> = serde_json::from_str(&json).unwrap();
        moved.get_mut("fs1").unwrap().data.as_mut().unwrap().file = "../x".into();
        let e = read_all(&dir, &mut moved).unwrap_err().to_string();
        assert!(e.contains("not \"device-fs1.bin\""), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(file_name("../etc").is_err() && file_name("a/b").is_err());
        assert!(file_name(".hidden").is_err() && file_name("").is_err());
    }
}
