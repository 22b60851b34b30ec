//! `--pmem file=PATH[,size=SIZE][,discard_writes=on]`: a virtio-pmem device, the file mapped
//! into guest physical memory (the guest reads and writes it with loads and stores) and made
//! durable by the driver's flush request.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{ConfigError, MemorySize};

/// A virtio-pmem region's size and place are multiples of this (2 MiB, a huge page).
pub const PMEM_ALIGN: u64 = 2 << 20;

/// One persistent memory device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PmemConfig {
    /// The file backing the region (created with `size` if missing).
    pub file: PathBuf,
    /// Bytes mapped; the file's size when not given (grown to it if shorter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The guest's writes stay in this process's copy (MAP_PRIVATE) and never reach the file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discard_writes: bool,
    /// The device's id in the API (`_pmem0`, or the client's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl PmemConfig {
    /// A given size must be a non-zero multiple of 2 MiB.
    pub fn check(&self) -> Result<(), String> {
        match self.size {
            Some(s) if s == 0 || s % PMEM_ALIGN != 0 => {
                Err(format!("size {s} is not a non-zero multiple of 2 MiB"))
            }
            _ => Ok(()),
        }
    }
}

impl FromStr for PmemConfig {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let bad = |reason: String| ConfigError::Pmem {
            input: input.to_string(),
            reason,
        };
        let (mut file, mut size, mut discard_writes, mut id) = (None, None, false, None);
        for part in input.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            match key {
                "file" if !value.is_empty() => file = Some(PathBuf::from(value)),
                "size" => {
                    let s: MemorySize = value
                        .parse()
                        .map_err(|_| bad(format!("size={value}: a size like 128M")))?;
                    size = Some(s.bytes());
                }
                "discard_writes" => {
                    discard_writes = match value {
                        "on" | "true" => true,
                        "off" | "false" => false,
                        _ => return Err(bad(format!("discard_writes={value}: use on or off"))),
                    }
                }
                "id" if !value.is_empty() => id = Some(value.to_string()),
                _ => {
                    return Err(bad(format!(
                        "unknown key '{key}' (file=, size=, discard_writes=, id=)"
                    )))
                }
            }
        }
        let c = PmemConfig {
            file: file.ok_or_else(|| bad("file=PATH is required".into()))?,
            size,
            discard_writes,
            id,
        };
        c.check().map_err(bad)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmem_devices_parse_and_bad_ones_say_why() {
        let p: PmemConfig = "file=/tmp/p.img,size=128M".parse().unwrap();
        assert_eq!((p.size, p.discard_writes), (Some(128 << 20), false));
        let p: PmemConfig = "file=/tmp/p.img,discard_writes=on,id=p0".parse().unwrap();
        assert!(p.discard_writes && p.size.is_none());
        for (input, why) in [
            ("size=2M", "file=PATH is required"),
            ("file=/p,size=4K", "not a non-zero multiple of 2 MiB"),
            ("file=/p,size=big", "a size like"),
            ("file=/p,discard_writes=2", "use on or off"),
            ("file=/p,iommu=on", "unknown key 'iommu'"),
        ] {
            let e = input.parse::<PmemConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --pmem '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
    }
}
