//! `--disk path=FILE[,readonly=on][,direct=on][,lock=off]`: a raw image file behind a virtio-blk
//! device; `--disk vhost_user=on,socket=PATH`: a vhost-user-blk back end (qemu-storage-daemon,
//! SPDK) serving the disk, the guest seeing the same virtio-blk.

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
    /// Served by the vhost-user-blk back end at `vhost_socket` (no image opened here; the
    /// back end decides what the disk is, read-only included). Needs shared guest memory.
    #[serde(default, skip_serializing_if = "is_off")]
    pub vhost_user: bool,
    /// The back end's socket, with `vhost_user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_socket: Option<PathBuf>,
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
            vhost_user: false,
            vhost_socket: None,
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

impl DiskConfig {
    /// Checks a disk's fields against each other: a vhost-user disk names its socket and
    /// nothing of an image (the back end has it), an image disk its path.
    pub fn check(&self) -> Result<(), String> {
        if !self.vhost_user {
            if self.vhost_socket.is_some() {
                return Err("socket= (vhost_socket) needs vhost_user=on".into());
            }
            if self.path.as_os_str().is_empty() {
                return Err("path=FILE is required".into());
            }
            return Ok(());
        }
        if self.vhost_socket.is_none() {
            return Err("vhost_user=on needs socket=PATH (the back end's vhost_socket)".into());
        }
        if !self.path.as_os_str().is_empty() || self.readonly || self.direct {
            return Err(
                "path=, readonly= and direct= are the vhost-user back end's to set (its export), not exitless's"
                    .into(),
            );
        }
        Ok(())
    }
}

impl FromStr for DiskConfig {
    type Err = ConfigError;

    /// `path=FILE` with optional `,readonly=on|off`, `,direct=on|off` and `,lock=on|off`, or
    /// `vhost_user=on,socket=PATH`.
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let mut d = DiskConfig::default();
        for part in input.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(input, format!("'{part}' is not key=value")))?;
            match key {
                "path" if !value.is_empty() => d.path = PathBuf::from(value),
                "readonly" => d.readonly = on_off(input, key, value)?,
                "direct" => d.direct = on_off(input, key, value)?,
                "lock" => d.lock = on_off(input, key, value)?,
                "vhost_user" => d.vhost_user = on_off(input, key, value)?,
                "socket" if !value.is_empty() => d.vhost_socket = Some(PathBuf::from(value)),
                _ => {
                    return Err(bad(
                        input,
                        format!(
                            "unknown key '{key}' (path=, readonly=, direct=, lock=, vhost_user=, socket=)"
                        ),
                    ))
                }
            }
        }
        d.check().map_err(|reason| bad(input, reason))?;
        Ok(d)
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
            ("vhost_user=on", "needs socket=PATH"),
            ("path=a,socket=/s", "needs vhost_user=on"),
            (
                "vhost_user=on,socket=/s,path=a",
                "the vhost-user back end's to set",
            ),
            (
                "vhost_user=on,socket=/s,readonly=on",
                "the vhost-user back end's to set",
            ),
        ] {
            let e = input.parse::<DiskConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --disk '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
        let v: DiskConfig = "vhost_user=on,socket=/run/blk.sock".parse().unwrap();
        assert!(v.vhost_user && v.path.as_os_str().is_empty());
        assert_eq!(
            v.vhost_socket.as_deref(),
            Some(std::path::Path::new("/run/blk.sock"))
        );
        let json: DiskConfig =
            serde_json::from_str(r#"{"path": "x.img", "readonly": true}"#).unwrap();
        assert!(json.readonly);
        assert!(serde_json::from_str::<DiskConfig>(r#"{"path": "x", "ro": 1}"#).is_err());
    }
}
