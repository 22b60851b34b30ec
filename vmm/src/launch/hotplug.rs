//! A running VM's hotplug: devices added and removed through the device manager, vCPUs
//! added and removed through the ACPI CPU hotplug controller.

use super::{LaunchError, LaunchedVm};
use crate::config::{DiskConfig, NetConfig, VsockConfig};

/// A device to add while the VM runs.
pub enum HotplugDevice<'a> {
    Disk(&'a DiskConfig),
    Net(&'a NetConfig),
    Vsock(&'a VsockConfig),
}

impl LaunchedVm {
    /// Adds `device` as a PCI function and tells the guest (ACPI); returns its bdf.
    pub fn hot_add(
        &mut self,
        _id: &str,
        _device: HotplugDevice<'_>,
    ) -> Result<String, LaunchError> {
        Err(LaunchError::Hotplug("PCI hotplug is not wired yet".into()))
    }

    /// Asks the guest to eject device `id`; its resources go once it has.
    pub fn request_removal(&mut self, _id: &str) -> Result<(), LaunchError> {
        Err(LaunchError::Hotplug("PCI hotplug is not wired yet".into()))
    }

    /// Tells the guest that CPU `id` was added (its vCPU waits for INIT/SIPI).
    pub fn cpu_added(&mut self, _id: u8) -> Result<(), LaunchError> {
        Ok(())
    }

    /// Asks the guest to eject CPU `id`.
    pub fn request_cpu_removal(&mut self, _id: u8) -> Result<(), LaunchError> {
        Err(LaunchError::Hotplug("CPU hotplug is not wired yet".into()))
    }

    /// The CPUs the guest ejected since the last call.
    pub fn take_ejected_cpus(&mut self) -> Vec<u8> {
        Vec::new()
    }
}
