//! PLACEHOLDER until the api-server branch lands.
use serde::{Deserialize, Serialize};
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CpusConfig {
    pub boot_vcpus: u8,
    pub max_vcpus: u8,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemoryConfig {
    pub size: u64,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PayloadConfig {
    pub kernel: Option<String>,
    pub cmdline: Option<String>,
    pub initramfs: Option<String>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DiskConfig {
    pub path: Option<String>,
    #[serde(default)]
    pub readonly: bool,
    pub id: Option<String>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NetConfig {
    pub tap: Option<String>,
    pub mac: Option<String>,
    pub id: Option<String>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VsockConfig {
    pub cid: u64,
    pub socket: String,
    pub id: Option<String>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VmConfig {
    pub cpus: CpusConfig,
    pub memory: MemoryConfig,
    pub payload: PayloadConfig,
    pub disks: Option<Vec<DiskConfig>>,
    pub net: Option<Vec<NetConfig>>,
    pub vsock: Option<VsockConfig>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VmRemoveDevice {
    pub id: Option<String>,
}
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VmResize {
    pub desired_vcpus: Option<u8>,
    pub desired_ram: Option<u64>,
    pub desired_balloon: Option<u64>,
}
#[derive(Clone, Debug, Serialize)]
pub struct VmInfo {
    pub config: VmConfig,
    pub state: String,
    pub memory_actual_size: u64,
}
#[derive(Clone, Debug, Serialize)]
pub struct PciDeviceInfo {
    pub id: String,
    pub bdf: String,
}

use super::ApiError;
fn e(m: &str) -> ApiError {
    ApiError {
        status: 400,
        message: m.into(),
    }
}
impl VmConfig {
    pub fn to_vm_config(&self) -> Result<crate::config::VmConfig, ApiError> {
        let mut c = crate::config::VmConfig::new(
            self.payload.kernel.clone().ok_or_else(|| e("no kernel"))?,
        );
        c.cpus = self.cpus.boot_vcpus.max(1);
        c.max_vcpus = Some(self.cpus.max_vcpus.max(c.cpus));
        c.memory = crate::config::MemorySize::from_mib(self.memory.size >> 20);
        if let Some(cmd) = &self.payload.cmdline {
            c.cmdline = cmd.clone();
        }
        for d in self.disks.iter().flatten() {
            c.disks.push(d.to_disk_config()?);
        }
        Ok(c)
    }
}
impl DiskConfig {
    pub fn to_disk_config(&self) -> Result<crate::config::DiskConfig, ApiError> {
        Ok(crate::config::DiskConfig {
            path: self.path.clone().ok_or_else(|| e("no path"))?.into(),
            readonly: self.readonly,
        })
    }
}
impl NetConfig {
    pub fn to_net_config(
        &self,
        _fds: Vec<std::os::fd::OwnedFd>,
    ) -> Result<crate::config::NetConfig, ApiError> {
        Ok(crate::config::NetConfig {
            tap: self.tap.clone().ok_or_else(|| e("no tap"))?,
            mac: None,
        })
    }
}
impl VsockConfig {
    pub fn to_vsock_config(&self) -> Result<crate::config::VsockConfig, ApiError> {
        Ok(crate::config::VsockConfig {
            cid: self.cid as u32,
            socket: self.socket.clone().into(),
        })
    }
}
impl VmConfig {
    pub fn from_vm_config(c: &crate::config::VmConfig) -> Self {
        VmConfig {
            cpus: CpusConfig {
                boot_vcpus: c.cpus,
                max_vcpus: c.max_vcpus.unwrap_or(c.cpus),
            },
            memory: MemoryConfig {
                size: c.memory.bytes(),
            },
            ..Default::default()
        }
    }
}
