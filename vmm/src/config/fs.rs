//! `--fs tag=TAG,socket=PATH[,num_queues=N][,queue_size=Q]`: a virtio-fs device served by a
//! vhost-user back end (virtiofsd) listening on PATH.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Longest tag (the virtio-fs configuration's field, not NUL-terminated when full).
pub const MAX_TAG_LEN: usize = 36;
/// Request queues a device may have (virtiofsd serves one).
pub const MAX_REQUEST_QUEUES: u16 = 16;
/// Largest split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;

fn one() -> u16 {
    1
}

fn default_queue_size() -> u16 {
    1024
}

/// One shared file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsConfig {
    /// The name the guest mounts (`mount -t virtiofs TAG /mnt`).
    pub tag: String,
    /// The back end's vhost-user socket (virtiofsd's `--socket-path`).
    pub socket: PathBuf,
    /// Request queues (besides the high-priority queue).
    #[serde(default = "one")]
    pub num_queues: u16,
    /// Size of each queue.
    #[serde(default = "default_queue_size")]
    pub queue_size: u16,
    /// The device's id in the API (`_fs0`, or the client's); none from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl FsConfig {
    /// The tag fits the configuration space, the queues are ones virtio allows.
    pub fn check(&self) -> Result<(), String> {
        if self.tag.is_empty() || self.tag.len() > MAX_TAG_LEN || self.tag.contains('\0') {
            return Err(format!(
                "tag={}: 1 to {MAX_TAG_LEN} bytes, no NUL",
                self.tag
            ));
        }
        if self.num_queues == 0 || self.num_queues > MAX_REQUEST_QUEUES {
            return Err(format!(
                "num_queues={}: 1 to {MAX_REQUEST_QUEUES}",
                self.num_queues
            ));
        }
        if !self.queue_size.is_power_of_two() {
            return Err(format!(
                "queue_size={}: a power of two up to {MAX_QUEUE_SIZE}",
                self.queue_size
            ));
        }
        Ok(())
    }
}

impl FromStr for FsConfig {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let bad = |reason| ConfigError::Fs {
            input: input.to_string(),
            reason,
        };
        let number = |key: &str, value: &str| {
            value
                .parse::<u16>()
                .map_err(|_| bad(format!("{key}={value} is not a number up to 65535")))
        };
        let (mut tag, mut socket) = (None, None);
        let (mut num_queues, mut queue_size) = (one(), default_queue_size());
        for part in input.split(',') {
            let (key, value) = part
                .split_once('=')
                .filter(|(_, v)| !v.is_empty())
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            match key {
                "tag" => tag = Some(value.to_string()),
                "socket" => socket = Some(PathBuf::from(value)),
                "num_queues" => num_queues = number(key, value)?,
                "queue_size" => queue_size = number(key, value)?,
                _ => {
                    return Err(bad(format!(
                        "unknown key '{key}' (tag=, socket=, num_queues=, queue_size=)"
                    )))
                }
            }
        }
        let config = FsConfig {
            tag: tag.ok_or_else(|| bad("tag=TAG is required".into()))?,
            socket: socket.ok_or_else(|| bad("socket=PATH is required".into()))?,
            num_queues,
            queue_size,
            id: None,
        };
        config.check().map_err(bad)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_systems_parse_and_bad_ones_say_why() {
        let f: FsConfig = "tag=kataShared,socket=/run/fs.sock".parse().unwrap();
        assert_eq!(
            (f.tag.as_str(), f.num_queues, f.queue_size),
            ("kataShared", 1, 1024)
        );
        let f: FsConfig = "tag=t,socket=/s,num_queues=2,queue_size=256"
            .parse()
            .unwrap();
        assert_eq!((f.num_queues, f.queue_size), (2, 256));
        for (input, why) in [
            ("socket=/s", "tag=TAG is required"),
            ("tag=t", "socket=PATH is required"),
            ("tag=t,socket=/s,num_queues=0", "num_queues=0"),
            ("tag=t,socket=/s,queue_size=1000", "power of two"),
            ("tag=t,socket=/s,queue_size=x", "not a number"),
            ("tag=t,socket=/s,cache=auto", "unknown key 'cache'"),
            ("tag=,socket=/s", "'tag=' is not key=value"),
        ] {
            let e = input.parse::<FsConfig>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("Invalid --fs '{input}'")), "{e}");
            assert!(e.contains(why), "{input}: {e}");
        }
        let long = format!("tag={},socket=/s", "x".repeat(MAX_TAG_LEN + 1));
        assert!(long
            .parse::<FsConfig>()
            .unwrap_err()
            .to_string()
            .contains("1 to 36 bytes"));
    }
}
