//! `--disk path=FILE[,readonly=on][,direct=on][,lock=off]`: a raw image file behind a virtio-blk
//! device.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// One disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// The raw image file.
    pub path: PathBuf,
    /// The guest may only read it (writes and flushes fail in the guest; the file is opened
    /// read-only).
    #[serde(default)]
    pub readonly: bool,
    /// Open the image O_DIRECT (bypassing the host's page cache).
    #[serde(default)]
    pub direct: bool,
    /// Lock the image while the disk is attached: exclusive when writable, shared when
    /// read-only, so that no other device or program writes it meanwhile. Off (`lock=off`)
    /// only to share an image with another writer on purpose.
    #[serde(default = "on", skip_serializing_if = "is_on")]
    pub lock: bool,
    /// Probe the image's format before use (the API's `image_type: "Unknown"`): raw goes on,
    /// any other format is refused by name.
    #[serde(default, skip_serializing_if = "is_off")]
    pub probe_format: bool,
    /// The device's id in the API (`_disk0`, or the client's); none from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            path: PathBuf::new(),
            readonly: false,
            direct: false,
            lock: true,
            probe_format: false,
            id: None,
        }
    }
}

fn on() -> bool {
    true
}

fn is_on(b: &bool) -> bool {
    *b
}

fn is_off(b: &bool) -> bool {
    !*b
}

fn bad(input: &str, reason: String) -> ConfigError {
    ConfigError::Disk {
        input: input.to_string(),
        reason,
    }
}

fn on_off(input: &str, key: &str, value: &str) -> Result<bool, ConfigError> {
    match value {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(bad(input, format!("{key}={value}: use on or off"))),
    }
}

impl FromStr for DiskConfig {
    type Err = ConfigError;

    /// `path=FILE` with optional `,readonly=on|off`, `,direct=on|off` and `,lock=on|off`.
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let mut path = None;
        let (mut readonly, mut direct, mut lock) = (false, false, true);
        for part in input.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(input, format!("'{part}' is not key=value")))?;
            match key {
                "path" if !value.is_empty() => path = Some(PathBuf::from(value)),
                "readonly" => readonly = on_off(input, key, value)?,
                "direct" => direct = on_off(input, key, value)?,
                "lock" => lock = on_off(input, key, value)?,
                _ => {
                    return Err(bad(
                        input,
                        format!("unknown key '{key}' (path=, readonly=, direct=, lock=)"),
                    ))
                }
            }
        }
        let path = path.ok_or_else(|| bad(input, "path=FILE is required".into()))?;
        Ok(DiskConfig {
            path,
            readonly,
            direct,
            lock,
            ..DiskConfig::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disks_parse_and_bad_ones_say_why() {
        let d: DiskConfig = "path=/tmp/a.img".parse().unwrap();
        assert_eq!((d.path.to_str(), d.readonly), (Some("/tmp/a.img"), false));
        let d: DiskConfig = "path=b.img,readonly=on".parse().unwrap();
        assert!(d.readonly && !d.direct);
        let d: DiskConfig = "path=b.img,direct=on".parse().unwrap();
        assert!(d.direct && !d.readonly && d.lock);
        let d: DiskConfig = "path=b.img,lock=off".parse().unwrap();
        assert!(!d.lock);
        for (input, why) in [
            ("b.img", "'b.img' is not key=value"),
            ("path=a,size=3", "unknown key 'size'"),
            ("readonly=on", "path=FILE is required"),
            ("path=a,readonly=maybe", "readonly=maybe: use on or off"),
            ("path=a,direct=2", "direct=2: use on or off"),
            ("path=a,lock=later", "lock=later: use on or off"),
            ("path=", "unknown key 'path'"),
        ] {
            let e = input.parse::<DiskConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --disk '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
        let json: DiskConfig =
            serde_json::from_str(r#"{"path": "x.img", "readonly": true}"#).unwrap();
        assert!(json.readonly);
        assert!(serde_json::from_str::<DiskConfig>(r#"{"path": "x", "ro": 1}"#).is_err());
    }
}
