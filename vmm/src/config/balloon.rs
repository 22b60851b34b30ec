//! `--balloon [size=SIZE][,deflate_on_oom=on][,free_page_reporting=on]`: a virtio-balloon
//! device, through which the guest gives memory back to the host (see docs/balloon.md).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{ConfigError, MemorySize};

/// The balloon.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonConfig {
    /// The host's target at boot, in bytes: how much memory the guest is asked to put in the
    /// balloon (whole 4 KiB pages; 0 asks for nothing).
    #[serde(default)]
    pub size: u64,
    /// Offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM: the guest takes pages back out of the balloon
    /// when it runs out of memory.
    #[serde(default)]
    pub deflate_on_oom: bool,
    /// Offer VIRTIO_BALLOON_F_REPORTING: the guest reports its free pages, which the host
    /// discards.
    #[serde(default)]
    pub free_page_reporting: bool,
    /// The device's id in the API (`_balloon0`, or the client's); none from the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

fn bad(input: &str, reason: String) -> ConfigError {
    ConfigError::Balloon {
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

/// `0`, or a size as `--memory` takes it (a bare number is MiB).
fn size(input: &str, value: &str) -> Result<u64, ConfigError> {
    BalloonConfig::parse_size(value).map_err(|e| bad(input, e.to_string()))
}

impl FromStr for BalloonConfig {
    type Err = ConfigError;

    /// `size=SIZE`, `deflate_on_oom=on|off`, `free_page_reporting=on|off`, in any order, each
    /// optional.
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let mut config = BalloonConfig::default();
        for part in input.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(input, format!("'{part}' is not key=value")))?;
            match key {
                "size" => config.size = size(input, value)?,
                "deflate_on_oom" => config.deflate_on_oom = on_off(input, key, value)?,
                "free_page_reporting" => config.free_page_reporting = on_off(input, key, value)?,
                _ => {
                    return Err(bad(
                        input,
                        format!(
                            "unknown key '{key}' (size=, deflate_on_oom=, free_page_reporting=)"
                        ),
                    ))
                }
            }
        }
        Ok(config)
    }
}

impl BalloonConfig {
    /// A balloon size in bytes: `0`, or a size as `--memory` takes it (a bare number is MiB).
    pub fn parse_size(value: &str) -> Result<u64, ConfigError> {
        if value.trim() == "0" {
            return Ok(0);
        }
        value.parse::<MemorySize>().map(MemorySize::bytes)
    }

    /// The target fits in `memory` bytes of guest RAM.
    pub fn check(&self, memory: u64) -> Result<(), String> {
        if self.size > memory {
            return Err(format!(
                "size {} is more than the guest's {} of memory",
                MemorySize(self.size),
                MemorySize(memory)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balloons_parse_and_bad_ones_say_why() {
        let b: BalloonConfig = "free_page_reporting=on".parse().unwrap();
        assert_eq!(
            (b.size, b.free_page_reporting, b.deflate_on_oom),
            (0, true, false)
        );
        let b: BalloonConfig = "size=64M,deflate_on_oom=on".parse().unwrap();
        assert_eq!(
            (b.size, b.deflate_on_oom, b.free_page_reporting),
            (64 << 20, true, false)
        );
        let b: BalloonConfig = "size=0,free_page_reporting=off".parse().unwrap();
        assert_eq!(b, BalloonConfig::default());
        assert_eq!("size=2".parse::<BalloonConfig>().unwrap().size, 2 << 20);
        for (input, why) in [
            ("reporting", "'reporting' is not key=value"),
            (
                "size=1K",
                "Invalid memory size '1K': must be a multiple of 4K",
            ),
            ("size=lots", "Invalid memory size 'lots'"),
            (
                "free_page_reporting=1",
                "free_page_reporting=1: use on or off",
            ),
            ("stats=on", "unknown key 'stats'"),
        ] {
            let e = input.parse::<BalloonConfig>().unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("Invalid --balloon '{input}'")),
                "{e}"
            );
            assert!(e.contains(why), "{input}: {e}");
        }
        let json: BalloonConfig =
            serde_json::from_str(r#"{"size": 4096, "free_page_reporting": true}"#).unwrap();
        assert!(json.free_page_reporting && json.size == 4096);
        assert!(serde_json::from_str::<BalloonConfig>(r#"{"stats": true}"#).is_err());
    }

    #[test]
    fn the_target_must_fit_in_guest_memory() {
        let b = BalloonConfig {
            size: 512 << 20,
            ..BalloonConfig::default()
        };
        assert!(b.check(512 << 20).is_ok());
        let e = b.check(256 << 20).unwrap_err();
        assert_eq!(e, "size 512M is more than the guest's 256M of memory");
    }
}
