//! The device manager's hotplug: the ACPI controllers on the MMIO bus and what happens when
//! a device or a vCPU is added, the power button pressed (and the guest's ACPI power-off), asked to go, or ejected by the guest, or when memory is added
//! (the guest told through the memory controller once the
//! [`MemoryListener`](crate::memory::hotplug::MemoryListener)s have the new region).

use std::sync::{Arc, Mutex};

use vm_memory::{GuestMemoryRegion, GuestRegionMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{routing_lock, BusKind, DeviceManager, DeviceManagerError};
use crate::devices::acpi::cpu_hotplug::CpuHotplug;
use crate::devices::acpi::ged::{Ged, CPU_CHANGED, MEMORY_CHANGED, PCI_CHANGED, POWER_BUTTON};
use crate::devices::acpi::memory_hotplug::{MemoryHotplug, MEMORY_HOTPLUG_LEN};
use crate::devices::acpi::pci_hotplug::PciHotplug;
use crate::devices::acpi::sleep::{SleepControl, SLEEP_LEN, SLEEP_PORT};
use crate::devices::acpi::{self, Ejected, PendingEjects};
use crate::memory::hotplug::MemoryListener;

/// The controllers and the guest's ejects.
pub struct Hotplug {
    ged: Arc<Ged>,
    pci: Arc<Mutex<PciHotplug>>,
    cpu: Arc<Mutex<CpuHotplug>>,
    /// With `memory.hotplug_size`: the memory slots.
    memory: Option<Arc<Mutex<MemoryHotplug>>>,
    ejected: Arc<PendingEjects>,
    max_vcpus: u8,
}

impl Hotplug {
    fn notify(&self, bits: u8) {
        if let Err(e) = self.ged.notify(bits) {
            eprintln!("exitless: the guest could not be told of a hotplug event: {e}");
        }
    }

    /// A device came up in `slot`: the guest is told.
    pub fn slot_added(&self, slot: u8) {
        routing_lock(&self.pci).slot_added(slot);
        self.notify(PCI_CHANGED);
    }

    /// The DSDT's part for these controllers.
    pub fn dsdt_aml(&self) -> Vec<u8> {
        acpi::aml::dsdt_aml(self.max_vcpus, self.memory_slots())
    }

    /// How many memory slots the memory controller has (0: no memory hotplug).
    pub fn memory_slots(&self) -> usize {
        self.memory
            .as_ref()
            .map_or(0, |m| routing_lock(m).slot_count())
    }

    /// The most vCPUs the VM may have.
    pub fn max_vcpus(&self) -> u8 {
        self.max_vcpus
    }
}

impl DeviceManager {
    /// Puts the GED (its interrupt on [`acpi::GED_GSI`]), the PCI and the CPU hotplug
    /// controllers on the MMIO bus, for a VM of `boot` vCPUs that may grow to `max`, and with
    /// `memory_slots` the memory hotplug controller; bus 0 exists from now on even without
    /// devices, so that devices can be added later.
    pub fn enable_hotplug(
        &mut self,
        boot: u8,
        max: u8,
        memory_slots: usize,
    ) -> Result<(), DeviceManagerError> {
        let root = self.pci_root();
        let evt =
            EventFd::new(EFD_NONBLOCK).map_err(|e| DeviceManagerError::Device("ged".into(), e))?;
        self.connect_legacy_irq(&evt, acpi::GED_GSI)?;
        let ejected = Arc::new(PendingEjects::default());
        let hotplug = Hotplug {
            ged: Arc::new(Ged::new(evt)),
            pci: Arc::new(Mutex::new(PciHotplug::new(root, ejected.clone()))),
            cpu: Arc::new(Mutex::new(CpuHotplug::new(
                boot,
                max.max(boot),
                ejected.clone(),
            ))),
            memory: (memory_slots > 0)
                .then(|| Arc::new(Mutex::new(MemoryHotplug::new(memory_slots)))),
            ejected,
            max_vcpus: max.max(boot),
        };
        let mmio = BusKind::Mmio;
        self.add(
            mmio,
            "ged",
            acpi::GED_ADDR,
            acpi::GED_LEN,
            hotplug.ged.clone(),
        )?;
        let (addr, len) = (acpi::PCI_HOTPLUG_ADDR, acpi::PCI_HOTPLUG_LEN);
        self.add(mmio, "pci-hotplug", addr, len, hotplug.pci.clone())?;
        let (addr, len) = (acpi::CPU_HOTPLUG_ADDR, acpi::CPU_HOTPLUG_LEN);
        self.add(mmio, "cpu-hotplug", addr, len, hotplug.cpu.clone())?;
        let sleep = Arc::new(SleepControl::default());
        self.add(
            BusKind::Pio,
            "acpi-sleep",
            SLEEP_PORT.into(),
            SLEEP_LEN,
            sleep,
        )?;
        self.register_snapshottable("ged", hotplug.ged.clone());
        self.register_snapshottable("pci-hotplug", hotplug.pci.clone());
        self.register_snapshottable("cpu-hotplug", hotplug.cpu.clone());
        if let Some(memory) = &hotplug.memory {
            let addr = acpi::MEMORY_HOTPLUG_ADDR;
            let len = MEMORY_HOTPLUG_LEN;
            self.add(mmio, "memory-hotplug", addr, len, memory.clone())?;
            self.register_snapshottable("memory-hotplug", memory.clone());
        }
        self.hotplug = Some(hotplug);
        Ok(())
    }

    fn hotplug(&self) -> Result<&Hotplug, DeviceManagerError> {
        self.hotplug.as_ref().ok_or(DeviceManagerError::NoHotplug)
    }

    /// Asks the guest to give back the device in `slot` (it stays until the guest ejects it).
    pub fn request_removal(&self, slot: u8) -> Result<(), DeviceManagerError> {
        let h = self.hotplug()?;
        if !self.virtio.iter().any(|p| p.slot == slot) {
            return Err(DeviceManagerError::NoSlot(slot));
        }
        routing_lock(&h.pci).removal_requested(slot);
        h.notify(PCI_CHANGED);
        Ok(())
    }

    /// Tells the guest that CPU `id` was added.
    pub fn cpu_added(&self, id: u8) -> Result<(), DeviceManagerError> {
        let h = self.hotplug()?;
        routing_lock(&h.cpu).cpu_added(id);
        h.notify(CPU_CHANGED);
        Ok(())
    }

    /// Presses the power button: the GED tells the guest, whose ACPI code then powers off.
    pub fn press_power_button(&self) -> Result<(), DeviceManagerError> {
        let h = self.hotplug()?;
        h.ged
            .notify(POWER_BUTTON)
            .map_err(|e| DeviceManagerError::Device("ged".into(), e))
    }

    /// Asks the guest to give back CPU `id`.
    pub fn request_cpu_removal(&self, id: u8) -> Result<(), DeviceManagerError> {
        let h = self.hotplug()?;
        routing_lock(&h.cpu).removal_requested(id);
        h.notify(CPU_CHANGED);
        Ok(())
    }

    /// Adds a listener told of every region of RAM added from now on.
    pub fn add_memory_listener(&mut self, listener: Box<dyn MemoryListener>) {
        self.memory_listeners.retain(|l| !l.is_gone());
        self.memory_listeners.push(listener);
    }

    /// `region` (now guest memory: KVM and the devices' map have it) is given to the guest in
    /// memory slot `slot`: every [`MemoryListener`] first, then the controller, then the GED's
    /// interrupt. Slots come from [`crate::memory::hotplug::HotplugRam`].
    pub fn memory_added(
        &mut self,
        slot: usize,
        region: &Arc<GuestRegionMmap>,
    ) -> Result<(), DeviceManagerError> {
        let memory = self.hotplug()?.memory.clone();
        let memory = memory.ok_or(DeviceManagerError::NoMemoryHotplug)?;
        if slot >= routing_lock(&memory).slot_count() {
            return Err(DeviceManagerError::NoMemorySlot(slot));
        }
        for listener in &mut self.memory_listeners {
            listener.region_added(region).map_err(|why| {
                DeviceManagerError::MemoryListener(listener.name().to_string(), why)
            })?;
        }
        let (base, len) = (region.start_addr().0, region.len());
        if !routing_lock(&memory).region_added(slot, base, len) {
            return Err(DeviceManagerError::NoMemorySlot(slot));
        }
        self.hotplug()?.notify(MEMORY_CHANGED);
        Ok(())
    }

    /// What the guest ejected since the last call (each slot or CPU once); the controllers
    /// no longer wait for them.
    pub fn take_ejected(&self) -> Vec<Ejected> {
        let Some(h) = self.hotplug.as_ref() else {
            return Vec::new();
        };
        let ejected = h.ejected.take();
        for e in &ejected {
            match *e {
                Ejected::Cpu(id) => routing_lock(&h.cpu).removal_done(id),
                Ejected::PciSlot(slot) => routing_lock(&h.pci).removal_done(slot),
            }
        }
        ejected
    }

    /// Whether the guest ejected something whose removal the VM's owner has not done yet.
    pub fn ejects_waiting(&self) -> bool {
        self.hotplug.as_ref().is_some_and(|h| h.ejected.any())
    }

    /// What the guest was asked to give back and still has: the CPUs' ids, and the devices'
    /// names (a snapshot saves them as they are; a restore asks again, see docs/snapshot.md).
    pub fn pending_removals(&self) -> (Vec<u8>, Vec<String>) {
        let Some(h) = self.hotplug.as_ref() else {
            return (Vec::new(), Vec::new());
        };
        let cpus = routing_lock(&h.cpu).asked().to_vec();
        let slots = routing_lock(&h.pci).asked();
        let devices = self
            .virtio
            .iter()
            .filter(|p| slots & (1 << (p.slot & 31)) != 0);
        (cpus, devices.map(|p| p.device.name().to_string()).collect())
    }

    /// Memory slot `slot` holds the `len` bytes at `base` again (a restore: the memory is
    /// mapped, the guest already knows it; the controller's saved state follows). Nobody is
    /// told.
    pub fn memory_restored(
        &self,
        slot: usize,
        base: u64,
        len: u64,
    ) -> Result<(), DeviceManagerError> {
        let memory = self.hotplug()?.memory.as_ref();
        let memory = memory.ok_or(DeviceManagerError::NoMemoryHotplug)?;
        match routing_lock(memory).region_added(slot, base, len) {
            true => Ok(()),
            false => Err(DeviceManagerError::NoMemorySlot(slot)),
        }
    }
}
