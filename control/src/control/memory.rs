//! `vm.resize {"desired_ram": N}`, as Cloud Hypervisor answers it with `hotplug_method`
//! `Acpi`: before boot the size joins the configuration (the VM boots with it); once booted,
//! guest RAM grows through ACPI memory hotplug (see `launch::memory_hotplug`) up to
//! `memory.size` + `memory.hotplug_size`, in whole 128 MiB blocks, and the configuration
//! follows (a reboot boots with the new size). A size the VM has already, or a smaller one,
//! changes nothing: memory is never taken back in ACPI mode.
//!
//! `vm.resize-zone {"id", "desired_ram"}` does the same for a VM made of memory zones, each
//! with its own `hotplug_size` (together the VM's hotplug area): the zone grows by fresh
//! memory (backed as the VM's memory is: shared, huge pages; not from the zone's file) up to
//! its `size` + `hotplug_size`, and its `hotplugged_size` says by how much. A reboot boots
//! with the zones' sizes.

use super::{ControlError, VmSlot};
use vmm::config::{MemorySize, MAX_VCPUS};
use vmm::launch::LaunchError;

impl VmSlot {
    pub(super) fn resize_memory(&mut self, desired: u64) -> Result<(), ControlError> {
        if self
            .api
            .memory
            .zones
            .as_ref()
            .is_some_and(|z| !z.is_empty())
        {
            let now = self
                .booted
                .as_ref()
                .map_or(self.config.memory.bytes(), |vm| vm.memory_size());
            if desired <= now {
                return Ok(()); // as without zones: never taken back
            }
            return Err(ControlError::Invalid(
                "vm.resize: growing a VM made of memory.zones is not supported: use vm.resize-zone"
                    .into(),
            ));
        }
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
    pub(super) fn resize_zone(&mut self, id: &str, desired: u64) -> Result<(), ControlError> {
        let zones = self.api.memory.zones.as_deref().unwrap_or_default();
        let Some(index) = zones.iter().position(|z| z.id == id) else {
            return Err(ControlError::UnknownDevice(id.to_string()));
        };
        let zone = &zones[index];
        let hotplug = zone.hotplug_size.unwrap_or(0);
        let invalid = |why: String| Err(ControlError::Invalid(format!("vm.resize-zone: {why}")));
        if hotplug == 0 {
            return invalid(format!("memory zone {id} has no hotplug_size"));
        }
        if desired % (1 << 20) != 0 {
            return invalid(format!(
                "desired_ram {desired} is not a whole number of MiB"
            ));
        }
        let limit = zone.size.saturating_add(hotplug);
        if desired > limit {
            return invalid(format!(
                "desired_ram {desired} is above memory zone {id}'s limit of {limit} bytes \
                 (size + hotplug_size)"
            ));
        }
        let added = zone.hotplugged_size.unwrap_or(0);
        let current = zone.size + added;
        if self.booted.is_none() {
            return Err(self.wrong("vm.resize-zone", "Running or Paused"));
        }
        if desired <= current {
            return Ok(()); // memory is never taken back
        }
        let vm = self.running()?;
        let total = vm.memory_size() + (desired - current);
        let grown = match vm.resize_memory(total) {
            Ok(grown) => grown,
            Err(LaunchError::MemoryHotplug(e)) => return invalid(e.to_string()),
            Err(e) => return Err(e.into()),
        };
        if let Some(z) = self
            .api
            .memory
            .zones
            .as_mut()
            .and_then(|z| z.get_mut(index))
        {
            z.hotplugged_size = Some(added + grown);
        }
        Ok(())
    }
}
