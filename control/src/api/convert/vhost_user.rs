//! Cloud Hypervisor's vhost-user bodies: a disk with `vhost_user` and `vhost_socket` (a
//! vhost-user-blk back end) and a generic vhost-user device.

use std::path::PathBuf;

use serde_json::Value;

use super::{refuse, refuse_set};
use crate::api::schema::{DiskConfig, GenericVhostUserConfig};
use crate::api::ApiError;
use vmm::config;

impl DiskConfig {
    /// Whether the disk is served by a vhost-user-blk back end (`"vhost_user": true`).
    pub fn vhost_user(&self) -> bool {
        self.extra.get("vhost_user").and_then(Value::as_bool) == Some(true)
    }

    /// exitless's disk for a vhost-user body: the socket required; what the back end's
    /// export decides (the image, read-only, O_DIRECT) refused by name.
    pub(super) fn to_vhost_user_disk(&self) -> Result<config::DiskConfig, ApiError> {
        let socket = self
            .extra
            .get("vhost_socket")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| refuse("disks[].vhost_user needs disks[].vhost_socket".into()))?;
        if self.path.is_some() || self.readonly || self.direct {
            return Err(refuse(
                "disks[].path, readonly and direct are the vhost-user back end's to set, not \
                 exitless's (leave them out with vhost_user)"
                    .into(),
            ));
        }
        refuse_set(&self.extra, "disks[].", &["rate_limiter_config"])?;
        let queues = self.extra.get("num_queues").and_then(Value::as_u64);
        if queues.is_some_and(|n| n > 1) {
            return Err(refuse(
                "disks[].num_queues above 1 is not supported by exitless for a vhost-user disk"
                    .into(),
            ));
        }
        Ok(config::DiskConfig {
            vhost_user: true,
            vhost_socket: Some(PathBuf::from(socket)),
            id: self.id.clone(),
            ..config::DiskConfig::default()
        })
    }
}

impl GenericVhostUserConfig {
    /// The device needs shared memory; its segment must be one the platform has; its type
    /// and queues ones virtio allows.
    pub fn check(&self, shared_memory: bool, segments: u64) -> Result<(), ApiError> {
        if !shared_memory {
            return Err(refuse(
                "generic_vhost_user needs memory.shared=true: the vhost-user back end maps guest memory"
                    .into(),
            ));
        }
        if u64::from(self.pci_segment) >= segments {
            return Err(refuse(format!(
                "generic_vhost_user[].pci_segment {} is not below platform.num_pci_segments {segments}",
                self.pci_segment
            )));
        }
        refuse_set(&self.extra, "generic_vhost_user[].", &["pci_device_id"])?;
        self.to_config()
            .check()
            .map_err(|e| refuse(format!("generic_vhost_user: {e}")))
    }

    /// exitless's device for this body (checked by [`GenericVhostUserConfig::check`]).
    pub fn to_config(&self) -> config::GenericVhostUserConfig {
        config::GenericVhostUserConfig {
            socket: PathBuf::from(&self.socket),
            device_type: self.device_type,
            queue_sizes: self.queue_sizes.clone(),
            id: self.id.clone(),
        }
    }

    /// The body describing exitless's device `c`.
    pub fn from_config(c: &config::GenericVhostUserConfig) -> Self {
        GenericVhostUserConfig {
            socket: c.socket.display().to_string(),
            queue_sizes: c.queue_sizes.clone(),
            device_type: c.device_type,
            pci_segment: 0,
            id: c.id.clone(),
            extra: Default::default(),
        }
    }
}
