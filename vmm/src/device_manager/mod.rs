//! The device manager: what a VM's devices need from KVM and from each other. It owns bus
//! assembly (stable ids and names), address and GSI allocation and routing, ioeventfd, irqfd
//! and coalesced-zone registration, each device's ACPI part, and the hotplug controllers.
//! Every device (COM1, the i8042, the bench guest's ports, PCI devices) goes on the buses
//! through it, before boot and while the VM runs alike: after [`DeviceManager::finish`] the
//! buses are published through [`SharedBuses`], whose vCPU snapshots change without a lock on
//! the exit path.

pub mod hotplug;
pub mod pci;

use crate::memory::hotplug::MemoryListener;
pub mod routing;
mod snapshot;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kvm_ioctls::{IoEventAddress, VmFd};
use thiserror::Error;
use vm_allocator::{AddressAllocator, AllocPolicy};
use vmm_sys_util::eventfd::EventFd;

use crate::boot::acpi::{AcpiPlatform, Ecam};
use crate::bus::{BusBuilder, BusError, Buses, SharedBuses, SharedDevice};
use crate::config::IrqchipMode;
use crate::devices::pci::{PciConfigPorts, PciDevice, PciEcam, PciRoot};
use crate::devices::virtio::transport::VirtioPciDevice;
use crate::devices::virtio::{DeviceDirtyLog, SharedGuestMemory, VirtioDevice};
use crate::event_loop::EventLoopHandle;
use crate::kvm::{IoEvent, KvmError};
use crate::memory;
use crate::snapshot::format::PciPlace;
use hotplug::Hotplug;
use pci::{BarRange, IoEvents, MappedVirtio, PciMapper, RouteUpdater, VIRTIO_BAR_SIZE};
use routing::{GsiRouting, RoutingError};

/// Errors adding devices or registering their events.
#[derive(Debug, Error)]
pub enum DeviceManagerError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Routing(#[from] RoutingError),
    #[error("{0} needs an in-kernel irqchip (--irqchip kernel or split)")]
    NeedsIrqchip(&'static str),
    #[error("No room left for {0}: the PCI BAR window or bus 0 is full")]
    PciFull(String),
    #[error("{name} cannot go back to PCI slot {slot} with its BAR at {bar:#x}, where the saved VM had it: another device is there")]
    PlaceTaken { name: String, slot: u8, bar: u64 },
    #[error("Cannot create {0}: {1}")]
    Device(String, std::io::Error),
    #[error("No device in PCI slot {0}")]
    NoSlot(u8),
    #[error("This VM has no hotplug controllers")]
    NoHotplug,
    #[error("This VM has no memory hotplug controller (memory.hotplug_size is not set)")]
    NoMemoryHotplug,
    #[error("The memory hotplug controller has no slot {0}")]
    NoMemorySlot(usize),
    #[error("{0} did not take the new memory region (the guest was not given it): {1}")]
    MemoryListener(String, String),
}

/// How a virtio device's queue notifications reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Notify {
    /// A zero-length ioeventfd per queue: KVM signals it, no exit to userspace.
    Ioeventfd,
    /// No ioeventfd: the notify register is plain MMIO, each write exits to userspace and the
    /// vCPU thread that took it signals the queue (what a VMM without ioeventfds does). The
    /// transport handles such writes in any case (one made while the guest moves the BAR,
    /// before the ioeventfds follow, exits too), so this mode costs the core only the choice;
    /// `exitless run` never picks it, the lab measures what ioeventfds save against it.
    MmioExit,
}

/// Which bus a range is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusKind {
    Pio,
    Mmio,
}

/// The buses: being assembled, or published to the vCPUs.
enum Layout {
    Building { pio: BusBuilder, mmio: BusBuilder },
    Running(Arc<SharedBuses>),
}

/// A virtio-pci device on bus 0.
pub struct PlacedVirtio {
    pub device: Arc<VirtioPciDevice>,
    pub slot: u8,
}

/// The device manager.
///
/// One of the lab's entry points (the bench adds its devices through it).
pub struct DeviceManager {
    vm: Arc<VmFd>,
    irqchip: IrqchipMode,
    layout: Layout,
    routing: Arc<Mutex<GsiRouting>>,
    bar_window: AddressAllocator,
    pci: Option<Arc<PciRoot>>,
    mapper: Arc<PciMapper>,
    io_events: Arc<IoEvents>,
    virtio: Vec<PlacedVirtio>,
    /// Whether a coalesced zone was registered (the vCPUs then drain KVM's ring).
    coalesced_zones: bool,
    hotplug: Option<Hotplug>,
    /// The devices a snapshot saves, by id ([`DeviceManager::register_snapshottable`]).
    snapshottable: Vec<(String, Arc<dyn crate::snapshot::Snapshottable>)>,
    /// Devices added or removed since the VM started.
    hotplugged: bool,
    /// Told of memory added while the VM runs ([`DeviceManager::memory_added`]).
    memory_listeners: Vec<Box<dyn MemoryListener>>,
    /// Where a restore puts each PCI function, by name ([`DeviceManager::restore_places`]).
    places: HashMap<String, PciPlace>,
    /// The log of the guest pages the virtio devices write, shared by all of them (read by a
    /// live migration's passes; off otherwise).
    device_log: Arc<DeviceDirtyLog>,
}

impl DeviceManager {
    pub fn new(vm: Arc<VmFd>, irqchip: IrqchipMode) -> Self {
        let io_events = Arc::new(IoEvents::new(vm.clone()));
        let mapper = Arc::new(PciMapper {
            io_events: io_events.clone(),
            buses: OnceLock::new(),
            slots: Mutex::new(HashMap::new()),
        });
        DeviceManager {
            vm,
            irqchip,
            layout: Layout::Building {
                pio: BusBuilder::new(),
                mmio: BusBuilder::new(),
            },
            routing: Arc::new(Mutex::new(GsiRouting::new(irqchip))),
            // A constant, non-empty window: the allocator cannot refuse it.
            bar_window: AddressAllocator::new(memory::PCI_MMIO_START, memory::PCI_MMIO_SIZE)
                .expect("valid BAR window"),
            pci: None,
            mapper,
            io_events,
            virtio: Vec::new(),
            coalesced_zones: false,
            hotplug: None,
            snapshottable: Vec::new(),
            hotplugged: false,
            memory_listeners: Vec::new(),
            places: HashMap::new(),
            device_log: Arc::default(),
        }
    }

    /// Lets go of (`held` false) or takes back what of the host every virtio device holds
    /// (disk images' locks, taps, vsock sockets), for a live migration to a destination on
    /// this host.
    pub fn image_locks(&self, held: bool) -> Result<(), String> {
        for v in &self.virtio {
            let name = v.device.name();
            v.device
                .image_lock(held)
                .map_err(|e| format!("{name}: {e}"))?;
        }
        Ok(())
    }

    /// [`VirtioDevice::backend_log`] on every virtio device (live migration: vhost-user back
    /// ends logging their writes to guest memory); the names of those that log (or would).
    pub fn backend_logs(
        &self,
        log: crate::devices::virtio::BackendLog,
    ) -> Result<Vec<String>, String> {
        let mut logging = Vec::new();
        for v in &self.virtio {
            let name = v.device.name();
            if v.device
                .backend_log(log.clone())
                .map_err(|e| format!("device {name}: {e}"))?
            {
                logging.push(name.to_string());
            }
        }
        Ok(logging)
    }

    /// The virtio devices' log of the guest pages they write ([`DeviceDirtyLog`]).
    pub fn device_log(&self) -> &Arc<DeviceDirtyLog> {
        &self.device_log
    }

    /// Maps `device` at `[base, base + len)` on `bus` under `name`; returns its stable id.
    /// After [`DeviceManager::finish`] the new layout is published to the vCPUs.
    pub fn add(
        &mut self,
        bus: BusKind,
        name: &str,
        base: u64,
        len: u64,
        device: SharedDevice,
    ) -> Result<usize, DeviceManagerError> {
        let insert = |b: &mut BusBuilder| b.insert(name, base, len, device.clone());
        match &mut self.layout {
            Layout::Building { pio, mmio } => Ok(insert(match bus {
                BusKind::Pio => pio,
                BusKind::Mmio => mmio,
            })?),
            Layout::Running(buses) => {
                let mut id = 0;
                buses.update(|old| {
                    let mut new = old.clone();
                    let target = match bus {
                        BusKind::Pio => &mut new.pio,
                        BusKind::Mmio => &mut new.mmio,
                    };
                    let mut builder = target.to_builder();
                    id = insert(&mut builder)?;
                    *target = builder.freeze();
                    Ok(new)
                })?;
                Ok(id)
            }
        }
    }

    /// Unmaps range `id` of the MMIO bus (a device removed while the VM runs).
    fn remove_mmio(&mut self, id: usize) -> Result<(), DeviceManagerError> {
        match &mut self.layout {
            Layout::Building { mmio, .. } => mmio.remove(id).map(drop)?,
            Layout::Running(buses) => buses.update(|old| {
                let mut builder = old.mmio.to_builder();
                builder.remove(id)?;
                Ok(Buses {
                    pio: old.pio.clone(),
                    mmio: builder.freeze(),
                })
            })?,
        }
        Ok(())
    }

    /// Signals `evt` (in the kernel, no exit to userspace) when the guest writes `event`.
    pub fn register_ioeventfd(
        &self,
        evt: &EventFd,
        event: &IoEvent,
    ) -> Result<(), DeviceManagerError> {
        Ok(self.io_events.register(evt, event)?)
    }

    /// Removes an ioeventfd registered with [`DeviceManager::register_ioeventfd`].
    pub fn unregister_ioeventfd(
        &self,
        evt: &EventFd,
        event: &IoEvent,
    ) -> Result<(), DeviceManagerError> {
        Ok(self.io_events.unregister(evt, event)?)
    }

    /// How many ioeventfds are registered now.
    pub fn ioeventfd_count(&self) -> usize {
        self.io_events.count()
    }

    /// Raises legacy interrupt line `gsi` whenever `evt` is written. Without an in-kernel
    /// irqchip there is nothing to raise: the line stays unconnected (Ok(false)).
    pub fn connect_legacy_irq(&self, evt: &EventFd, gsi: u32) -> Result<bool, DeviceManagerError> {
        if self.irqchip != IrqchipMode::Kernel {
            return Ok(false);
        }
        self.vm
            .register_irqfd(evt, gsi)
            .map_err(|e| KvmError::Ioctl("KVM_IRQFD", e))?;
        Ok(true)
    }

    /// A new MSI route whose interrupts `evt` raises (an irqfd); returns its GSI. The route's
    /// message is set when the guest programs it (see [`pci::RouteUpdater`]).
    pub fn connect_msi(&mut self, evt: &EventFd) -> Result<u32, DeviceManagerError> {
        let gsi = routing_lock(&self.routing).allocate_msi()?;
        self.vm
            .register_irqfd(evt, gsi)
            .map_err(|e| KvmError::Ioctl("KVM_IRQFD", e))?;
        Ok(gsi)
    }

    /// Takes back MSI routes connected with [`DeviceManager::connect_msi`].
    fn disconnect_msi(&mut self, irqfds: &[EventFd], gsis: &[u32]) {
        let mut routing = routing_lock(&self.routing);
        for (evt, &gsi) in irqfds.iter().zip(gsis) {
            let _ = self.vm.unregister_irqfd(evt, gsi);
            let _ = routing.free_msi(gsi);
        }
        if let Err(e) = routing.apply(&self.vm) {
            eprintln!("exitless: MSI routes of a removed device not withdrawn: {e}");
        }
    }

    /// Bus 0 (created with the first PCI device).
    fn pci_root(&mut self) -> Arc<PciRoot> {
        self.pci
            .get_or_insert_with(|| Arc::new(PciRoot::new()))
            .clone()
    }

    /// Puts `device` on PCI bus 0 behind virtio-pci: BAR 0 from the window, its MMIO range,
    /// one notify ioeventfd per queue (unless `notify` says otherwise), and an irqfd with an
    /// MSI route per MSI-X vector (without an in-kernel irqchip there is none: the driver must
    /// poll). Before boot or while the VM runs (then the guest is told through ACPI hotplug).
    pub fn add_virtio(
        &mut self,
        name: &str,
        device: Box<dyn VirtioDevice>,
        mem: &SharedGuestMemory,
        event_loop: EventLoopHandle,
        notify: Notify,
    ) -> Result<Arc<VirtioPciDevice>, DeviceManagerError> {
        let place = self.places.get(name).copied();
        let full = || match place {
            Some(p) => DeviceManagerError::PlaceTaken {
                name: name.to_string(),
                slot: p.slot,
                bar: p.bar,
            },
            None => DeviceManagerError::PciFull(name.to_string()),
        };
        let policy = place.map_or(AllocPolicy::FirstMatch, |p| AllocPolicy::ExactMatch(p.bar));
        let bar = self
            .bar_window
            .allocate(VIRTIO_BAR_SIZE, VIRTIO_BAR_SIZE, policy)
            .map_err(|_| full())?;
        let addr = bar.start();
        let logged = (mem.clone(), self.device_log.clone());
        let dev = VirtioPciDevice::with_dirty_log(name, device, addr, logged, event_loop)
            .map_err(|e| DeviceManagerError::Device(name.to_string(), e))?;

        let mut mapped = MappedVirtio {
            device: dev.clone(),
            range: 0,
            addr,
            bar,
            ioeventfds: notify == Notify::Ioeventfd,
            gsis: Vec::new(),
        };
        if let Err(e) = self.place_virtio(name, &mut mapped) {
            self.unplace_virtio(&mapped, false);
            return Err(e);
        }
        let as_pci: Arc<dyn PciDevice> = dev.clone();
        let root = self.pci_root();
        let slot = match place {
            Some(p) => root.add_at(p.slot, as_pci),
            None => root.add(as_pci),
        };
        let Some(slot) = slot else {
            self.unplace_virtio(&mapped, true);
            return Err(full());
        };
        routing_lock(&self.mapper.slots).insert(slot, mapped);
        self.virtio.push(PlacedVirtio {
            device: dev.clone(),
            slot,
        });
        self.register_snapshottable(name, dev.clone());
        if let (Some(h), Layout::Running(_)) = (&self.hotplug, &self.layout) {
            h.slot_added(slot);
            self.hotplugged = true;
        }
        Ok(dev)
    }

    /// MSI routes, notify ioeventfds and the MMIO range of a new virtio device.
    fn place_virtio(&mut self, name: &str, m: &mut MappedVirtio) -> Result<(), DeviceManagerError> {
        if self.irqchip != IrqchipMode::None {
            let irq = m.device.interrupt().clone();
            for evt in irq.irqfds() {
                let gsi = self.connect_msi(evt)?;
                m.gsis.push(gsi);
            }
            let routes = RouteUpdater {
                routing: self.routing.clone(),
                vm: self.vm.clone(),
                log: Arc::downgrade(m.device.health()),
            };
            irq.connect(m.gsis.clone(), Box::new(routes));
            if let Layout::Running(_) = self.layout {
                routing_lock(&self.routing).apply(&self.vm)?;
            }
        }
        if m.ioeventfds {
            for (event, evt) in m.device.notify_events(m.addr) {
                self.io_events.register(evt, &event)?;
            }
        }
        let range = Arc::new(BarRange {
            device: m.device.clone(),
            bar: 0,
        });
        m.range = self.add(BusKind::Mmio, name, m.addr, VIRTIO_BAR_SIZE, range)?;
        Ok(())
    }

    /// Undoes [`DeviceManager::place_virtio`] (as far as it went) and frees the BAR.
    fn unplace_virtio(&mut self, m: &MappedVirtio, mapped: bool) {
        self.unmap_virtio(m, mapped);
        self.release_virtio(m);
    }

    /// The guest's ways in to a virtio device: its MMIO range and notify ioeventfds.
    fn unmap_virtio(&mut self, m: &MappedVirtio, mapped: bool) {
        if mapped {
            let _ = self.remove_mmio(m.range);
        }
        if m.ioeventfds {
            for (event, evt) in m.device.notify_events(m.addr) {
                let _ = self.io_events.unregister(evt, &event);
            }
        }
    }

    /// The device's ways out (its MSI routes: GSIs another device may get next) and its BAR.
    fn release_virtio(&mut self, m: &MappedVirtio) {
        let irqfds = m.device.interrupt().irqfds();
        self.disconnect_msi(&irqfds[..m.gsis.len()], &m.gsis);
        let _ = self.bar_window.free(&m.bar);
    }

    /// Takes the virtio device in `slot` off the VM: out of the guest's reach first (slot,
    /// range, notify ioeventfds: nothing can start it again), then stopped (as a reset
    /// would), and only then its MSI routes and BAR given back: its queue work, which may
    /// interrupt the guest until it stops, never signals a GSI that another device took.
    pub fn remove_virtio(&mut self, slot: u8) -> Result<Arc<VirtioPciDevice>, DeviceManagerError> {
        let m = routing_lock(&self.mapper.slots)
            .remove(&slot)
            .ok_or(DeviceManagerError::NoSlot(slot))?;
        if let Some(root) = &self.pci {
            root.remove(slot);
        }
        self.unmap_virtio(&m, true);
        m.device.shut_down();
        self.release_virtio(&m);
        self.virtio.retain(|p| p.slot != slot);
        self.snapshottable.retain(|(id, _)| id != m.device.name());
        self.hotplugged = true;
        Ok(m.device)
    }

    /// What the devices put in the ACPI tables: PCI's host bridge and ECAM when there is PCI,
    /// the hotplug controllers' methods when there are some.
    pub fn acpi_platform(&self) -> AcpiPlatform {
        let mut platform = AcpiPlatform::default();
        if self.pci.is_some() {
            platform.dsdt_aml = crate::devices::pci::acpi::dsdt_aml();
            platform.ecam = Some(Ecam {
                base: memory::PCI_ECAM_START,
                last_bus: 0,
            });
        }
        if let Some(h) = &self.hotplug {
            platform.dsdt_aml.extend(h.dsdt_aml());
            platform.max_vcpus = h.max_vcpus();
            platform.sleep_port = Some(crate::devices::acpi::sleep::SLEEP_PORT);
        }
        platform
    }

    /// The virtio devices on the VM now, with their slots.
    pub fn virtio_devices(&self) -> &[PlacedVirtio] {
        &self.virtio
    }

    /// Makes KVM queue guest writes to `[addr, addr + len)` in its coalesced ring instead of
    /// exiting; they reach the bus at a vCPU's next exit.
    pub fn register_coalesced(
        &mut self,
        addr: IoEventAddress,
        len: u32,
    ) -> Result<(), DeviceManagerError> {
        self.vm
            .register_coalesced_mmio(addr, len)
            .map_err(|e| KvmError::Ioctl("KVM_REGISTER_COALESCED_MMIO", e))?;
        self.coalesced_zones = true;
        Ok(())
    }

    /// Whether KVM may queue writes in its coalesced ring (a zone was registered).
    pub fn has_coalesced_zones(&self) -> bool {
        self.coalesced_zones
    }

    /// Ends set-up: PCI configuration access (when there are PCI devices), the buses published
    /// (the layout vCPUs start with; later changes go through the same manager), the routes
    /// installed. Calling it again returns the same buses.
    pub fn finish(&mut self) -> Result<Arc<SharedBuses>, DeviceManagerError> {
        if let Layout::Running(buses) = &self.layout {
            return Ok(buses.clone());
        }
        // Devices added from now on go where the bus has room.
        self.places.clear();
        if let Some(root) = self.pci.clone() {
            root.set_mapper(self.mapper.clone());
            self.register_snapshottable("pci-root", root.clone());
            let ports = Arc::new(PciConfigPorts::new(root.clone()));
            self.register_snapshottable("pci-config", ports.clone());
            let (port, ports_len) = (memory::PCI_CONFIG_PORT, memory::PCI_CONFIG_PORT_LEN);
            self.add(BusKind::Pio, "pci-config", port, ports_len, ports)?;
            let ecam = Arc::new(PciEcam::new(root));
            let (base, len) = (memory::PCI_ECAM_START, memory::PCI_ECAM_SIZE);
            self.add(BusKind::Mmio, "pci-ecam", base, len, ecam)?;
        }
        {
            // KVM's default table is what a VM without MSI routes needs: leave it alone then.
            let routing = routing_lock(&self.routing);
            if routing.has_msi() {
                routing.apply(&self.vm)?;
            }
        }
        let layout = std::mem::replace(&mut self.layout, Layout::Running(Arc::default()));
        let Layout::Building { pio, mmio } = layout else {
            unreachable!("checked above");
        };
        let buses = Arc::new(SharedBuses::new(Buses {
            pio: pio.freeze(),
            mmio: mmio.freeze(),
        }));
        let _ = self.mapper.buses.set(Arc::downgrade(&buses));
        self.layout = Layout::Running(buses.clone());
        Ok(buses)
    }
}

fn routing_lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
