//! `--memory SIZE` or
//! `--memory size=SIZE[,shared=on][,hugepages=on][,hugepage_size=2M|1G][,hotplug_size=SIZE]`:
//! how much guest RAM, what backs it (see [`crate::memory::Backing`]), and how much may be
//! added while the VM runs (see [`crate::memory::hotplug`]).

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{ConfigError, MemorySize, VmConfig};
use crate::memory::hotplug::HotplugRam;
use crate::memory::{Backing, Zone, ZoneSource, HUGEPAGE_1G, HUGEPAGE_2M};

/// One zone of guest RAM (the API's `memory.zones[]`): fresh memory backed as its flags say,
/// or a named file, mapped shared (the guest's writes reach the file: a VM template's memory)
/// or private (copy-on-write). Zones fill guest RAM in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryZoneConfig {
    pub id: String,
    pub size: MemorySize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub hugepages: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<MemorySize>,
}

impl MemoryZoneConfig {
    /// Where the zone's memory comes from.
    pub fn source(&self) -> ZoneSource {
        match &self.file {
            Some(path) => ZoneSource::File {
                path: path.clone(),
                shared: self.shared,
            },
            None => ZoneSource::Fresh(Backing {
                shared: self.shared,
                hugepage_size: self
                    .hugepages
                    .then(|| self.hugepage_size.map_or(HUGEPAGE_2M, MemorySize::bytes)),
            }),
        }
    }
}

/// The `--memory` option: each part given overrides the config file's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryOption {
    pub size: Option<MemorySize>,
    pub shared: Option<bool>,
    pub hugepages: Option<bool>,
    pub hugepage_size: Option<MemorySize>,
    pub hotplug_size: Option<MemorySize>,
}

fn on_off(
    key: &str,
    value: &str,
    bad: &dyn Fn(String) -> ConfigError,
) -> Result<bool, ConfigError> {
    match value {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(bad(format!("{key}={value}: use on or off"))),
    }
}

impl FromStr for MemoryOption {
    type Err = ConfigError;

    /// A bare size (`512M`), or `key=value` parts: `size=`, `shared=`, `hugepages=`,
    /// `hugepage_size=`, `hotplug_size=`.
    fn from_str(input: &str) -> Result<Self, ConfigError> {
        if !input.contains('=') {
            return Ok(MemoryOption {
                size: Some(input.parse()?),
                ..MemoryOption::default()
            });
        }
        let bad = |reason| ConfigError::Memory {
            input: input.to_string(),
            reason,
        };
        let mut m = MemoryOption::default();
        for part in input.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            match key {
                "size" => m.size = Some(value.parse()?),
                "shared" => m.shared = Some(on_off(key, value, &bad)?),
                "hugepages" => m.hugepages = Some(on_off(key, value, &bad)?),
                "hugepage_size" => m.hugepage_size = Some(value.parse()?),
                "hotplug_size" => m.hotplug_size = Some(value.parse()?),
                _ => {
                    return Err(bad(format!(
                        "unknown key '{key}' (size=, shared=, hugepages=, hugepage_size=, hotplug_size=)"
                    )))
                }
            }
        }
        Ok(m)
    }
}

impl MemoryOption {
    /// Applies the parts given to `c`.
    pub fn apply(self, c: &mut VmConfig) {
        c.memory = self.size.unwrap_or(c.memory);
        c.shared_memory = self.shared.unwrap_or(c.shared_memory);
        c.hugepages = self.hugepages.unwrap_or(c.hugepages);
        c.hugepage_size = self.hugepage_size.or(c.hugepage_size);
        c.hotplug_memory = self.hotplug_size.or(c.hotplug_memory);
    }
}

impl VmConfig {
    /// Where memory added while the VM runs goes (None: no memory hotplug, or less than a
    /// block of it).
    pub fn hotplug_ram(&self) -> Option<HotplugRam> {
        let hotplug = self.hotplug_memory?.bytes();
        HotplugRam::new(
            self.memory.bytes(),
            hotplug,
            self.memory_backing().hugepage_size,
        )
    }

    /// What backs guest RAM: shared and huge pages as configured (2M pages by default).
    pub fn memory_backing(&self) -> Backing {
        Backing {
            shared: self.shared_memory,
            hugepage_size: self
                .hugepages
                .then(|| self.hugepage_size.map_or(HUGEPAGE_2M, MemorySize::bytes)),
        }
    }

    /// The zones guest RAM is made of, if the config has zones.
    pub fn zones(&self) -> Option<Vec<Zone>> {
        let zones = self.memory_zones.iter().map(|z| Zone {
            size: z.size.bytes(),
            source: z.source(),
        });
        (!self.memory_zones.is_empty()).then(|| zones.collect())
    }

    /// Zones with distinct ids adding up to `memory`; no huge pages on a named file.
    fn validate_zones(&self) -> Result<(), ConfigError> {
        let mut total = 0u64;
        for (i, z) in self.memory_zones.iter().enumerate() {
            let bad = |reason: &str| ConfigError::MemoryZone {
                id: z.id.clone(),
                reason: reason.to_string(),
            };
            if z.id.is_empty() || self.memory_zones[..i].iter().any(|o| o.id == z.id) {
                return Err(bad("zone ids must be given and distinct"));
            }
            if z.file.is_some() && z.hugepages {
                return Err(bad("huge pages come from the host's pool, not from a file"));
            }
            if z.hugepage_size.is_some() && !z.hugepages {
                return Err(bad("hugepage_size needs hugepages"));
            }
            total += z.size.bytes();
        }
        if !self.memory_zones.is_empty() && total != self.memory.bytes() {
            return Err(ConfigError::MemoryZone {
                id: self.memory_zones[0].id.clone(),
                reason: format!(
                    "the zones add up to {total} bytes, the memory size is {}",
                    self.memory.bytes()
                ),
            });
        }
        Ok(())
    }

    /// The backing's checks: a page size exitless knows, given only with huge pages on, that
    /// divides the memory; virtio-fs only on shared memory; zones that add up.
    pub(super) fn validate_memory_backing(&self) -> Result<(), ConfigError> {
        self.validate_zones()?;
        if let Some(page) = self.hugepage_size {
            if !self.hugepages {
                return Err(ConfigError::HugePagesOff);
            }
            if page.bytes() != HUGEPAGE_2M && page.bytes() != HUGEPAGE_1G {
                return Err(ConfigError::HugePageSize(page));
            }
        }
        if let Some(page) = self.memory_backing().hugepage_size {
            if self.memory.bytes() % page != 0 {
                return Err(ConfigError::HugePageFit {
                    memory: self.memory,
                    page: MemorySize::from_mib(page >> 20),
                });
            }
        }
        if !self.fs.is_empty() && !self.shared_memory {
            return Err(ConfigError::FsNeedsSharedMemory);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_size_and_key_value_parts_parse() {
        let m: MemoryOption = "512M".parse().unwrap();
        assert_eq!(m.size.map(MemorySize::mib), Some(512));
        assert_eq!((m.shared, m.hugepages), (None, None));
        let m: MemoryOption = "size=1G,shared=on,hugepages=on,hugepage_size=2M,hotplug_size=2G"
            .parse()
            .unwrap();
        assert_eq!(m.hotplug_size.map(MemorySize::mib), Some(2048));
        assert_eq!(m.size.map(MemorySize::mib), Some(1024));
        assert_eq!((m.shared, m.hugepages), (Some(true), Some(true)));
        assert_eq!(m.hugepage_size.map(MemorySize::bytes), Some(HUGEPAGE_2M));
        for (input, why) in [
            ("size=1G,shared=maybe", "shared=maybe: use on or off"),
            ("size=1G,numa=0", "unknown key 'numa'"),
            ("size=1G,shared", "'shared' is not key=value"),
            ("size=lots", "Invalid memory size 'lots'"),
        ] {
            let e = input.parse::<MemoryOption>().unwrap_err().to_string();
            assert!(e.contains(why), "{input}: {e}");
        }
    }

    #[test]
    fn zones_must_add_up_and_round_trip_through_json() {
        let zone = |id: &str, mib, file: Option<&str>| MemoryZoneConfig {
            id: id.into(),
            size: MemorySize::from_mib(mib),
            file: file.map(PathBuf::from),
            shared: true,
            hugepages: false,
            hugepage_size: None,
        };
        let mut c = VmConfig::new("k");
        c.memory = MemorySize::from_mib(512);
        c.memory_zones = vec![
            zone("mem0", 256, Some("/dev/shm/t")),
            zone("mem1", 256, None),
        ];
        c.validate(8).unwrap();
        let zones = c.zones().unwrap();
        assert_eq!(zones.len(), 2);
        assert!(matches!(
            &zones[0].source,
            ZoneSource::File { shared: true, .. }
        ));
        assert_eq!(
            zones[1].source,
            ZoneSource::Fresh(Backing {
                shared: true,
                hugepage_size: None
            })
        );
        let back = VmConfig::from_json_str(&c.to_json(), std::path::Path::new("c.json")).unwrap();
        assert_eq!(back, c);
        c.memory = MemorySize::from_mib(1024);
        let e = c.validate(8).unwrap_err().to_string();
        assert!(e.contains("add up to 536870912 bytes"), "{e}");
        c.memory = MemorySize::from_mib(512);
        c.memory_zones[1].id = "mem0".into();
        assert!(c.validate(8).unwrap_err().to_string().contains("distinct"));
        c.memory_zones[1].id = "mem1".into();
        c.memory_zones[0].hugepages = true;
        assert!(c
            .validate(8)
            .unwrap_err()
            .to_string()
            .contains("not from a file"));
        assert!(VmConfig::new("k").zones().is_none());
    }

    #[test]
    fn backing_follows_the_config_and_bad_ones_are_refused() {
        let mut c = VmConfig::new("k");
        assert_eq!(c.memory_backing(), Backing::default());
        "shared=on,hugepages=on"
            .parse::<MemoryOption>()
            .unwrap()
            .apply(&mut c);
        assert_eq!(c.memory.mib(), 512, "the size stays");
        let b = c.memory_backing();
        assert!(b.shared);
        assert_eq!(b.hugepage_size, Some(HUGEPAGE_2M));
        assert!(c.validate(8).is_ok());
        c.hugepage_size = Some("1G".parse().unwrap());
        let e = c.validate(8).unwrap_err().to_string();
        assert!(e.contains("not a whole number of 1G"), "{e}");
        c.hugepage_size = Some("4M".parse().unwrap());
        assert!(c.validate(8).unwrap_err().to_string().contains("2M or 1G"));
        c.hugepages = false;
        c.hugepage_size = Some("2M".parse().unwrap());
        assert!(c
            .validate(8)
            .unwrap_err()
            .to_string()
            .contains("hugepages=on"));
    }
}
