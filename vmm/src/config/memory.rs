//! `--memory SIZE` or
//! `--memory size=SIZE[,shared=on][,hugepages=on][,hugepage_size=2M|1G][,hotplug_size=SIZE]`:
//! how much guest RAM, what backs it (see [`crate::memory::Backing`]), and how much may be
//! added while the VM runs (see [`crate::memory::hotplug`]).

use std::str::FromStr;

use super::{ConfigError, MemorySize, VmConfig};
use crate::memory::hotplug::HotplugRam;
use crate::memory::{Backing, HUGEPAGE_1G, HUGEPAGE_2M};

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

    /// The backing's checks: a page size exitless knows, given only with huge pages on, that
    /// divides the memory; virtio-fs only on shared memory.
    pub(super) fn validate_memory_backing(&self) -> Result<(), ConfigError> {
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
