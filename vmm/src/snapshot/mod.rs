//! Snapshots: a paused VM written to a directory (`vm.snapshot`) and a new VM made from one in
//! a fresh process (`vm.restore`, `exitless run --restore`). See docs/snapshot.md.
//!
//! ```text
//! DIR/config.json   the VM config in Cloud Hypervisor's schema (what vm.info shows)
//! DIR/state.json    vCPUs, irqchip, PIT, clock, the CPU features the guest saw, the memory
//!                   layout and each device's state ([`format::SnapshotState`])
//! DIR/guest-ram     guest memory, sparse: only the pages the guest touched are written
//! ```
//!
//! Devices take part through [`Snapshottable`]: each saves its own state under its id in
//! `state.json`'s `devices` map and puts it back into the same device made anew.

pub mod blob;
pub mod cpu_features;
pub mod device_data;
pub mod format;
pub mod memory_file;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use crate::kvm::KvmError;
use crate::memory::MemoryError;
pub use format::{DeviceEntry, SnapshotState, FORMAT_VERSION};

/// The VM's config, as `vm.info` shows it.
pub const CONFIG_FILE: &str = "config.json";
/// Everything else but memory ([`format::SnapshotState`]).
pub const STATE_FILE: &str = "state.json";
/// Guest memory, sparse. Not `memory`: a Kata VM template keeps its own RAM file under that
/// name in the same directory.
pub const MEMORY_FILE: &str = "guest-ram";

/// Errors saving or restoring a snapshot.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error("'{0}' is not a file:// URL of a directory")]
    Url(String),
    #[error("Cannot use snapshot directory {}: {error}", path.display())]
    Dir {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("The snapshot is format version {found} (written by exitless {by}); this exitless reads version {FORMAT_VERSION}")]
    Version { found: u32, by: String },
    #[error("state.json is damaged: {0}")]
    Corrupt(String),
    #[error("state.json is damaged: its checksum does not match its content (the file was changed or truncated)")]
    Checksum,
    #[error("config.json is not a VM config: {0}")]
    Config(String),
    #[error("The snapshot does not fit its config.json: {0}")]
    Mismatch(String),
    #[error("The snapshot cannot run on this host: {0}")]
    Host(String),
    #[error("device {id} ({kind}) cannot be snapshotted yet: {reason}")]
    Device {
        id: String,
        kind: String,
        reason: String,
    },
    #[error("The saved state of device {id} ({kind}) is invalid: {reason}")]
    DeviceState {
        id: String,
        kind: String,
        reason: String,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("vCPU(s) {0:?} did not hand over their state in time")]
    Vcpus(Vec<usize>),
    #[error("Cannot encode the snapshot: {0}")]
    Encode(String),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

impl SnapshotError {
    /// Whether the client's request or files are at fault (400), not the host (500).
    pub fn is_input_fault(&self) -> bool {
        !matches!(
            self,
            SnapshotError::Write { .. }
                | SnapshotError::Vcpus(_)
                | SnapshotError::Encode(_)
                | SnapshotError::Kvm(_)
                | SnapshotError::Memory(MemoryError::Mmap(_) | MemoryError::Region { .. })
        )
    }
}

/// A device a snapshot saves: its state goes into `state.json`'s `devices` map under the
/// device's id, written by [`Snapshottable::snapshot`] and handed back on restore to the same
/// device made anew from the config, before any vCPU runs.
///
/// Both run with the vCPUs parked. A device that cannot save what it holds (a virtio device
/// its driver set up, until virtio state is saved) says why in an error: the snapshot is
/// refused with that line. `restore` gets what `state.json` holds, which is hostile input:
/// it checks it ([`from_state`] gives serde's message) and never panics.
pub trait Snapshottable: Send + Sync {
    /// The device's kind ("serial", "i8042", "virtio-blk"...), saved beside its state and
    /// checked on restore.
    fn kind(&self) -> &'static str;
    /// The device's state as JSON ([`to_state`] of a serde struct of its own).
    fn snapshot(&self) -> Result<serde_json::Value, String>;
    /// Puts state saved by [`Snapshottable::snapshot`] back.
    fn restore(&self, state: serde_json::Value) -> Result<(), String>;
    /// The snapshot is over, written or not (guest memory included): what
    /// [`Snapshottable::snapshot`] held still for it goes on.
    fn snapshot_ended(&self) {}
    /// Bytes the device's state has beyond its JSON (a vhost-user back end's own state),
    /// taken once right after [`Snapshottable::snapshot`]: a snapshot writes them to a file
    /// beside `state.json` (its entry's `data`), a migration sends them.
    fn take_data(&self) -> Option<Vec<u8>> {
        None
    }
    /// On restore, before [`Snapshottable::restore`]: the bytes [`Snapshottable::take_data`]
    /// gave (read from a file: the device checks them, or its back end does).
    fn put_data(&self, _data: Vec<u8>) -> Result<(), String> {
        Err("it saves nothing beside its state, and the snapshot has data for it".into())
    }
}

/// A device's state struct as JSON.
pub fn to_state<T: Serialize>(state: &T) -> Result<serde_json::Value, String> {
    serde_json::to_value(state).map_err(|e| e.to_string())
}

/// A device's state struct from JSON, with serde's message on a mismatch.
pub fn from_state<T: DeserializeOwned>(state: serde_json::Value) -> Result<T, String> {
    serde_json::from_value(state).map_err(|e| e.to_string())
}

/// The directory a `file://DIR` URL names (Cloud Hypervisor's `destination_url` and
/// `source_url`). `file:///a/b`, `file:/a/b` and a bare absolute path are taken.
pub fn dir_from_url(url: &str) -> Result<PathBuf, SnapshotError> {
    let path = url
        .strip_prefix("file://")
        .or_else(|| url.strip_prefix("file:"))
        .unwrap_or(url);
    if path.is_empty() || !path.starts_with('/') || path.contains('\0') {
        return Err(SnapshotError::Url(url.to_string()));
    }
    Ok(PathBuf::from(path))
}

/// Fails unless `dir` is a directory.
pub fn check_dir(dir: &Path) -> Result<(), SnapshotError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SnapshotError::Dir {
            path: dir.to_path_buf(),
            error: std::io::Error::from(std::io::ErrorKind::NotADirectory),
        }),
        Err(error) => Err(SnapshotError::Dir {
            path: dir.to_path_buf(),
            error,
        }),
    }
}

/// Reads a snapshot's two small files: `config.json` (as JSON, for the caller to convert)
/// and `state.json` (checked).
pub fn read(dir: &Path) -> Result<(serde_json::Value, SnapshotState), SnapshotError> {
    crate::startup::mark(crate::startup::restore_moment::ASKED);
    check_dir(dir)?;
    let state_path = dir.join(STATE_FILE);
    let bytes = read_bounded(&state_path)?;
    let state = SnapshotState::parse(&bytes)?;
    let config_path = dir.join(CONFIG_FILE);
    let text = read_bounded(&config_path)?;
    let config = serde_json::from_slice(&text)
        .map_err(|e| SnapshotError::Config(format!("{e} in {}", config_path.display())))?;
    crate::startup::mark(crate::startup::restore_moment::READ);
    Ok((config, state))
}

/// A file's bytes, refusing one larger than a state file may be.
fn read_bounded(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    use std::io::Read;
    let read_error = |error| SnapshotError::Read {
        path: path.to_path_buf(),
        error,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(format::MAX_STATE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    Ok(bytes)
}

/// Writes `text` to `dir/name` through a temporary name, renamed once complete: a reader
/// never finds a half-written file under the real name.
pub fn write_file(dir: &Path, name: &str, text: &[u8]) -> Result<(), SnapshotError> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    let write_error = |error| SnapshotError::Write {
        path: path.clone(),
        error,
    };
    std::fs::write(&tmp, text).map_err(write_error)?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        write_error(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_name_directories() {
        assert_eq!(dir_from_url("file:///tmp/s").unwrap(), Path::new("/tmp/s"));
        assert_eq!(dir_from_url("file:/tmp/s").unwrap(), Path::new("/tmp/s"));
        assert_eq!(dir_from_url("/tmp/s").unwrap(), Path::new("/tmp/s"));
        for bad in [
            "http://x/s",
            "file://",
            "file://relative",
            "",
            "tcp:1.2.3.4:5",
        ] {
            let e = dir_from_url(bad).unwrap_err().to_string();
            assert!(e.contains("is not a file:// URL"), "{bad}: {e}");
        }
    }
}
