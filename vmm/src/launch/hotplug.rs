//! A running VM's hotplug: devices added and removed through the device manager (the guest
//! told and ejecting through ACPI), vCPUs added and removed through the CPU controller.

use super::vhost_user_devices::{disk_model, generic_model};
use super::{device_name, LaunchError, LaunchedVm};
use crate::config::{
    DiskConfig, FsConfig, GenericVhostUserConfig, NetConfig, PmemConfig, VsockConfig,
};
use crate::device_manager::Notify;
use crate::devices::acpi::Ejected;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::vsock::Vsock;
use crate::devices::virtio::VirtioDevice;

/// A device to add while the VM runs.
pub enum HotplugDevice<'a> {
    Disk(&'a DiskConfig),
    Net(&'a NetConfig),
    Vsock(&'a VsockConfig),
    Fs(&'a FsConfig),
    GenericVhostUser(&'a GenericVhostUserConfig),
    Pmem(&'a PmemConfig),
}

impl LaunchedVm {
    /// Adds `device` as a PCI function named `id` and tells the guest (ACPI); returns its
    /// bdf (`0000:00:SS.0`).
    pub fn hot_add(&mut self, id: &str, device: HotplugDevice<'_>) -> Result<String, LaunchError> {
        // A VM booted without virtio devices may not have started the devices thread.
        self.event_loop
            .run()
            .map_err(crate::builder::BuildError::from)?;
        let mut socket = None;
        let model: Box<dyn VirtioDevice> = match device {
            HotplugDevice::Disk(d) => {
                disk_model(id, d, &mut self.devices, self.event_loop.handle())?
            }
            HotplugDevice::Pmem(p) => {
                let fd = self.vm.fd.clone();
                Box::new(self.pmem.attach(&fd, p)?)
            }
            HotplugDevice::GenericVhostUser(g) => {
                generic_model(id, g, &mut self.devices, self.event_loop.handle())?
            }
            HotplugDevice::Net(n) => Box::new(Net::open(n)?),
            HotplugDevice::Vsock(v) => {
                let (dev, file) = Vsock::new(v)?;
                socket = Some(file);
                Box::new(dev)
            }
            HotplugDevice::Fs(f) => {
                let dev = super::connect_fs(id, f)?;
                let listener = dev.memory_listener(id, self.event_loop.handle());
                self.devices.add_memory_listener(Box::new(listener));
                Box::new(dev)
            }
        };
        let handle = self.event_loop.handle();
        let name = device_name(Some(id), "", 0);
        self.devices
            .add_virtio(&name, model, &self.vm.mem, handle, Notify::Ioeventfd)?;
        if let Some(file) = socket {
            self.socket_files.push((name.clone(), file));
        }
        let slot = self
            .slot_of(&name)
            .ok_or_else(|| LaunchError::NotPlaced(id.to_string()))?;
        Ok(format!("0000:00:{slot:02x}.0"))
    }

    fn slot_of(&self, name: &str) -> Option<u8> {
        let placed = self.devices.virtio_devices().iter();
        placed
            .filter(|p| p.device.name() == name)
            .map(|p| p.slot)
            .next()
    }

    /// Asks the guest to eject device `id`; its resources go once it has.
    pub fn request_removal(&mut self, id: &str) -> Result<(), LaunchError> {
        let slot = self
            .slot_of(id)
            .ok_or_else(|| LaunchError::NoSuchDevice(id.to_string()))?;
        Ok(self.devices.request_removal(slot)?)
    }

    /// What the guest was asked to give back and has not yet: CPU ids and device names.
    pub fn pending_removals(&self) -> (Vec<u8>, Vec<String>) {
        self.devices.pending_removals()
    }

    /// Tells the guest that CPU `id` was added (its vCPU waits for INIT/SIPI).
    pub fn cpu_added(&mut self, id: u8) -> Result<(), LaunchError> {
        Ok(self.devices.cpu_added(id)?)
    }

    /// Asks the guest to eject CPU `id`.
    pub fn request_cpu_removal(&mut self, id: u8) -> Result<(), LaunchError> {
        Ok(self.devices.request_cpu_removal(id)?)
    }

    /// Completes what the guest ejected: PCI devices are taken off the VM here (their socket
    /// files removed). Returns the CPUs it ejected, for their vCPUs to be retired, and the
    /// names of the devices removed.
    pub fn complete_ejects(&mut self) -> (Vec<u8>, Vec<String>) {
        let (mut cpus, mut devices) = (Vec::new(), Vec::new());
        for ejected in self.devices.take_ejected() {
            match ejected {
                Ejected::Cpu(id) => cpus.push(id),
                Ejected::PciSlot(slot) => match self.devices.remove_virtio(slot) {
                    Ok(dev) => {
                        self.socket_files.retain(|(n, _)| n != dev.name());
                        devices.push(dev.name().to_string());
                    }
                    Err(e) => eprintln!("exitless: the guest ejected PCI slot {slot}: {e}"),
                },
            }
        }
        (cpus, devices)
    }

    /// [`LaunchedVm::complete_ejects`] where no API drives the VM (`exitless run`): the
    /// devices the guest ejected are gone (said once each), the vCPUs of the CPUs it ejected
    /// retired.
    pub(super) fn complete_ejects_unattended(&mut self) {
        let (cpus, devices) = self.complete_ejects();
        for name in devices {
            eprintln!("exitless: the guest ejected device {name}; it is removed");
        }
        for id in cpus {
            if let Err(e) = self.remove_vcpu(usize::from(id)) {
                eprintln!("exitless: vCPU {id} ejected by the guest but not stopped: {e}");
            }
        }
    }
}
