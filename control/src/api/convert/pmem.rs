//! Cloud Hypervisor's `pmem[]` and `vm.add-pmem` body: a virtio-pmem device over a file.

use std::path::PathBuf;

use super::{refuse, refuse_set};
use crate::api::schema::PmemConfig;
use crate::api::ApiError;
use vmm::config;

impl PmemConfig {
    /// Its segment must be one the platform has; `iommu` is refused; its size a multiple of
    /// 2 MiB.
    pub fn check(&self, segments: u64) -> Result<(), ApiError> {
        if u64::from(self.pci_segment) >= segments {
            return Err(refuse(format!(
                "pmem[].pci_segment {} is not below platform.num_pci_segments {segments}",
                self.pci_segment
            )));
        }
        refuse_set(&self.extra, "pmem[].", &["iommu", "pci_device_id"])?;
        self.to_config()
            .check()
            .map_err(|e| refuse(format!("pmem: {e}")))
    }

    /// exitless's device for this body (checked by [`PmemConfig::check`]).
    pub fn to_config(&self) -> config::PmemConfig {
        config::PmemConfig {
            file: PathBuf::from(&self.file),
            size: self.size,
            discard_writes: self.discard_writes,
            id: self.id.clone(),
        }
    }

    /// The body describing exitless's device `c`.
    pub fn from_config(c: &config::PmemConfig) -> Self {
        PmemConfig {
            file: c.file.display().to_string(),
            size: c.size,
            discard_writes: c.discard_writes,
            pci_segment: 0,
            id: c.id.clone(),
            extra: Default::default(),
        }
    }
}
