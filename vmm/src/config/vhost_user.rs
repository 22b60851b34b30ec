//! `--generic-vhost-user socket=PATH,device_type=N,queue_sizes=[Q,...]`: Cloud Hypervisor's
//! generic vhost-user device (v52): a virtio device of any type whose queues and
//! configuration space a vhost-user back end serves. Needs shared guest memory.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Most queues a generic device may name.
pub const MAX_QUEUES: usize = 64;

/// One generic vhost-user device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenericVhostUserConfig {
    /// The back end's socket.
    pub socket: PathBuf,
    /// The virtio device type (2 block, 26 fs, ...), the device id the guest sees.
    pub device_type: u32,
    /// Each queue's size, one entry per queue.
    pub queue_sizes: Vec<u16>,
    /// The device's id in the API (`_generic_vhost_user0`, or the client's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl GenericVhostUserConfig {
    /// The fields against virtio's limits: a device type (1..=63, not 0), 1..=64 queues of
    /// power-of-two sizes up to 32768.
    pub fn check(&self) -> Result<(), String> {
        if self.device_type == 0 || self.device_type > 63 {
            return Err(format!(
                "device_type {} is not a virtio device type (1..=63)",
                self.device_type
            ));
        }
        if self.queue_sizes.is_empty() || self.queue_sizes.len() > MAX_QUEUES {
            return Err(format!("queue_sizes needs 1 to {MAX_QUEUES} queues"));
        }
        if let Some(q) = self
            .queue_sizes
            .iter()
            .find(|q| !q.is_power_of_two() || **q > 32768)
        {
            return Err(format!("queue size {q} is not a power of two up to 32768"));
        }
        Ok(())
    }
}

/// Splits `input` at commas outside brackets (`queue_sizes=[128,128]` is one part).
fn parts(input: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in input.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&input[start..]);
    out
}

impl FromStr for GenericVhostUserConfig {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let bad = |reason: String| ConfigError::GenericVhostUser {
            input: input.to_string(),
            reason,
        };
        let (mut socket, mut device_type, mut queue_sizes, mut id) = (None, None, None, None);
        for part in parts(input) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            match key {
                "socket" if !value.is_empty() => socket = Some(PathBuf::from(value)),
                "device_type" => {
                    let t = value.parse().map_err(|_| {
                        bad(format!("device_type={value}: a number (2 block, 26 fs)"))
                    })?;
                    device_type = Some(t);
                }
                "queue_sizes" => {
                    let list = value.trim_start_matches('[').trim_end_matches(']');
                    let sizes = list
                        .split([',', ':'])
                        .map(str::parse)
                        .collect::<Result<Vec<u16>, _>>()
                        .map_err(|_| bad(format!("queue_sizes={value}: a list like [128,128]")))?;
                    queue_sizes = Some(sizes);
                }
                "id" if !value.is_empty() => id = Some(value.to_string()),
                _ => {
                    return Err(bad(format!(
                        "unknown key '{key}' (socket=, device_type=, queue_sizes=, id=)"
                    )))
                }
            }
        }
        let c = GenericVhostUserConfig {
            socket: socket.ok_or_else(|| bad("socket=PATH is required".into()))?,
            device_type: device_type.ok_or_else(|| bad("device_type=N is required".into()))?,
            queue_sizes: queue_sizes
                .ok_or_else(|| bad("queue_sizes=[Q,...] is required".into()))?,
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
    fn generic_devices_parse_and_bad_ones_say_why() {
        let g: GenericVhostUserConfig = "socket=/run/b.sock,device_type=2,queue_sizes=[128,256]"
            .parse()
            .unwrap();
        assert_eq!((g.device_type, g.queue_sizes), (2, vec![128, 256]));
        let g: GenericVhostUserConfig = "device_type=26,queue_sizes=1024,socket=/s,id=x"
            .parse()
            .unwrap();
        assert_eq!((g.queue_sizes, g.id.as_deref()), (vec![1024], Some("x")));
        for (input, why) in [
            ("device_type=2,queue_sizes=[8]", "socket=PATH is required"),
            ("socket=/s,queue_sizes=[8]", "device_type=N is required"),
            ("socket=/s,device_type=2", "queue_sizes=[Q,...] is required"),
            (
                "socket=/s,device_type=0,queue_sizes=[8]",
                "not a virtio device type",
            ),
            ("socket=/s,device_type=block,queue_sizes=[8]", "a number"),
            (
                "socket=/s,device_type=2,queue_sizes=[100]",
                "not a power of two",
            ),
            ("socket=/s,device_type=2,queue_sizes=[x]", "a list like"),
            (
                "socket=/s,device_type=2,queue_sizes=[8],num=1",
                "unknown key 'num'",
            ),
        ] {
            let e = input
                .parse::<GenericVhostUserConfig>()
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("Invalid --generic-vhost-user '{input}'")),
                "{e}"
            );
            assert!(e.contains(why), "{input}: {e}");
        }
    }
}
