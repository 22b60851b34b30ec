//! `vm.resize {"desired_ram": N}`, as Cloud Hypervisor answers it with `hotplug_method`
//! `Acpi`: before boot the size joins the configuration (the VM boots with it); once booted,
//! guest RAM grows through ACPI memory hotplug (see `launch::memory_hotplug`) up to
//! `memory.size` + `memory.hotplug_size`, in whole 128 MiB blocks, and the configuration
//! follows (a reboot boots with the new size). A size the VM has already, or a smaller one,
//! changes nothing: memory is never taken back in ACPI mode.

use super::{ControlError, VmSlot};
use vmm::config::{MemorySize, MAX_VCPUS};
use vmm::launch::LaunchError;

impl VmSlot {
    pub(super) fn resize_memory(&mut self, desired: u64) -> Result<(), ControlError> {
        if desired % (1 << 20) != 0 {
            return Err(ControlError::Invalid(format!(
                "vm.resize: desired_ram {desired} is not a whole number of MiB"
            )));
        }
        let Some(vm) = self.booted.as_mut() else {
            let mut config = self.config.clone();
            config.memory = MemorySize::from_mib(desired >> 20);
            config.validate(MAX_VCPUS)?;
            self.config = config;
            self.api.memory.size = desired;
            return Ok(());
        };
        match vm.resize_memory(desired) {
            Ok(0) => Ok(()),
            Ok(_) => {
                let now = vm.memory_size();
                self.config.memory = MemorySize::from_mib(now >> 20);
                self.api.memory.size = now;
                Ok(())
            }
            Err(LaunchError::MemoryHotplug(e)) => {
                Err(ControlError::Invalid(format!("vm.resize: {e}")))
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl VmSlot {
    /// `vm.resize-zone`: not offered yet (zones with a hotplug size are refused at
    /// `vm.create`), so no zone can grow.
    pub(super) fn resize_zone(&mut self, id: &str, _desired: u64) -> Result<(), ControlError> {
        let zones = self.api.memory.zones.as_deref().unwrap_or_default();
        if !zones.iter().any(|z| z.id == id) {
            return Err(ControlError::UnknownDevice(id.to_string()));
        }
        Err(ControlError::Unsupported(format!(
            "vm.resize-zone: memory zone {id} has no hotplug_size"
        )))
    }
}
