//! PCI devices in the device manager: BAR placement, the BAR's range on the MMIO bus, queue
//! notify ioeventfds, MSI-X vectors as irqfds with MSI routes, and what happens when the
//! guest moves a BAR or reprograms a vector while the VM runs.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::EventFd;

use super::routing::GsiRouting;
use crate::bus::{BusDevice, DeviceEvent, SharedBuses};
use crate::devices::pci::msix::MsiMessage;
use crate::devices::pci::{BarChange, BarMapper, PciDevice};
use crate::devices::virtio::transport::{MsiRoutes, VirtioPciDevice, BAR_SIZE};
use crate::kvm::{self, IoEvent, KvmError};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One BAR of a PCI device as a bus range: accesses reach `bar_read`/`bar_write`.
pub struct BarRange {
    pub device: Arc<dyn PciDevice>,
    pub bar: u8,
}

impl BusDevice for BarRange {
    fn read(&self, offset: u64, data: &mut [u8]) {
        self.device.bar_read(self.bar, offset, data);
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        self.device.bar_write(self.bar, offset, data);
        Ok(DeviceEvent::None)
    }
}

/// MSI route changes from a device's MSI-X table, applied to KVM at once.
pub struct RouteUpdater {
    pub routing: Arc<Mutex<GsiRouting>>,
    pub vm: Arc<VmFd>,
    /// The device's log (a guest reprograms vectors as often as it likes). Weak: the device's
    /// health holds its interrupt, which holds this; a strong reference would keep the
    /// interrupt and its irqfds alive after the device is removed.
    pub log: std::sync::Weak<crate::devices::virtio::DeviceHealth>,
}

impl RouteUpdater {
    fn log(&self, line: impl FnOnce(&str) -> String) {
        if let Some(health) = self.log.upgrade() {
            health.log.log(|| line(health.name()));
        }
    }
}

impl MsiRoutes for RouteUpdater {
    fn set_route(&self, gsi: u32, message: MsiMessage) {
        let mut routing = lock(&self.routing);
        match routing.set_msi(gsi, message) {
            Ok(true) => {
                if let Err(e) = routing.apply(&self.vm) {
                    self.log(|name| format!("{name}: MSI route for GSI {gsi} not applied: {e}"));
                }
            }
            Ok(false) => {}
            Err(e) => self.log(|name| format!("{name}: {e}")),
        }
    }

    fn set_irqfd(&self, gsi: u32, irqfd: &EventFd, connected: bool) {
        let done = if connected {
            self.vm.register_irqfd(irqfd, gsi)
        } else {
            self.vm.unregister_irqfd(irqfd, gsi)
        };
        if let Err(e) = done {
            let what = if connected {
                "put back on"
            } else {
                "taken off"
            };
            self.log(|name| format!("{name}: the irqfd of GSI {gsi} not {what} KVM: {e}"));
        }
    }
}

/// Where a virtio-pci device's BAR 0 is mapped, and what it holds of the VM's resources.
pub struct MappedVirtio {
    pub device: Arc<VirtioPciDevice>,
    /// Its range id on the MMIO bus.
    pub range: usize,
    pub addr: u64,
    /// The part of the BAR window allocated to it (freed when the device goes).
    pub bar: vm_allocator::RangeInclusive,
    /// Whether its queue notifications are ioeventfds (else they exit: `Notify::MmioExit`).
    pub ioeventfds: bool,
    /// The MSI route of each MSI-X vector.
    pub gsis: Vec<u32>,
}

/// Every ioeventfd of the VM, registered and withdrawn in this one place (so hotplug and
/// BAR moves can take them back), counted.
pub struct IoEvents {
    vm: Arc<VmFd>,
    registered: Mutex<Vec<(IoEvent, RawFd)>>,
}

impl IoEvents {
    pub fn new(vm: Arc<VmFd>) -> Self {
        IoEvents {
            vm,
            registered: Mutex::new(Vec::new()),
        }
    }

    /// KVM signals `evt` when the guest writes `event`.
    pub fn register(&self, evt: &EventFd, event: &IoEvent) -> Result<(), KvmError> {
        kvm::ioeventfd(&self.vm, evt, event, true)?;
        lock(&self.registered).push((*event, evt.as_raw_fd()));
        Ok(())
    }

    /// Withdraws an ioeventfd [`IoEvents::register`] made.
    pub fn unregister(&self, evt: &EventFd, event: &IoEvent) -> Result<(), KvmError> {
        let mut registered = lock(&self.registered);
        let key = (*event, evt.as_raw_fd());
        registered.retain(|r| *r != key);
        kvm::ioeventfd(&self.vm, evt, event, false)
    }

    /// How many are registered.
    pub fn count(&self) -> usize {
        lock(&self.registered).len()
    }
}

/// Follows BAR moves: the MMIO range and the notify ioeventfds go where the guest put the BAR.
pub struct PciMapper {
    pub io_events: Arc<IoEvents>,
    /// Weak: the buses hold PCI configuration access, which holds the root, which holds this
    /// mapper; a strong reference would keep every device (and its files) alive after the VM
    /// is dropped.
    pub buses: OnceLock<Weak<SharedBuses>>,
    pub slots: Mutex<HashMap<u8, MappedVirtio>>,
}

impl PciMapper {
    /// Maps the virtio device in `slot` at `to` if it is elsewhere (a restored device whose
    /// BAR the guest had moved).
    pub(crate) fn follow_bar(&self, slot: u8, to: u64) -> Result<(), String> {
        let mut slots = lock(&self.slots);
        match slots.get_mut(&slot) {
            Some(m) if m.addr != to => self.move_bar(m, to),
            _ => Ok(()),
        }
    }

    /// Moves the device's range and notify ioeventfds to `to`, all or nothing: the new
    /// ioeventfds are registered first (KVM refuses one where another device's is), the range
    /// moved next, and only then the old ioeventfds withdrawn; a step that fails undoes the
    /// ones before it, so a refused move leaves the device wholly where it was.
    fn move_bar(&self, m: &mut MappedVirtio, to: u64) -> Result<(), String> {
        let buses = self
            .buses
            .get()
            .and_then(Weak::upgrade)
            .ok_or("the buses are not built yet, or gone")?;
        if m.ioeventfds {
            self.register_all(m, to)?;
        }
        let moved = buses.update(|old| {
            let mut mmio = old.mmio.to_builder();
            mmio.relocate(m.range, to)?;
            Ok(crate::bus::Buses {
                pio: old.pio.clone(),
                mmio: mmio.freeze(),
            })
        });
        let gone = if moved.is_ok() { m.addr } else { to };
        if m.ioeventfds {
            for (event, evt) in m.device.notify_events(gone) {
                let _ = self.io_events.unregister(evt, &event);
            }
        }
        moved.map_err(|e| e.to_string())?;
        m.addr = to;
        Ok(())
    }

    /// Registers the device's notify ioeventfds for its BAR at `at`, every one or none.
    fn register_all(&self, m: &MappedVirtio, at: u64) -> Result<(), String> {
        let events = m.device.notify_events(at);
        for (i, (event, evt)) in events.iter().enumerate() {
            if let Err(e) = self.io_events.register(evt, event) {
                for (event, evt) in &events[..i] {
                    let _ = self.io_events.unregister(evt, event);
                }
                return Err(e.to_string());
            }
        }
        Ok(())
    }
}

impl BarMapper for PciMapper {
    fn bar_moved(&self, slot: u8, change: BarChange) {
        // Decoding turned off (or a BAR being sized) keeps the old mapping: an access there
        // still reaches the device, which is harmless; a new address moves it.
        let (0, Some(to)) = (change.bar, change.new) else {
            return;
        };
        let mut slots = lock(&self.slots);
        let Some(m) = slots.get_mut(&slot) else {
            return;
        };
        if m.addr == to {
            return;
        }
        if let Err(e) = self.move_bar(m, to) {
            let health = m.device.health().clone();
            health
                .refused_bar_moves
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (name, at) = (m.device.name(), m.addr);
            health
                .log
                .log(|| format!("{name}: BAR 0 not moved to {to:#x} ({e}); it stays at {at:#x}"));
        }
    }
}

/// Size BAR 0 of a virtio-pci device takes in the window (its alignment too).
pub const VIRTIO_BAR_SIZE: u64 = BAR_SIZE;
