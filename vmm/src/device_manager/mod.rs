//! The device manager: what a VM's devices need from KVM and from each other. It owns bus
//! assembly (stable ids and names), GSI allocation and routing, and ioeventfd, irqfd and
//! coalesced-zone registration. Every device (COM1, the i8042, the bench guest's ports, PCI
//! devices) goes on the buses through it.

pub mod pci;
pub mod routing;

use crate::boot::acpi::{AcpiPlatform, Ecam};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kvm_ioctls::{IoEventAddress, VmFd};
use thiserror::Error;
use vm_allocator::{AddressAllocator, AllocPolicy};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::bus::{BusBuilder, BusError, Buses, SharedBuses, SharedDevice};
use crate::config::IrqchipMode;
use crate::devices::pci::{PciConfigPorts, PciDevice, PciEcam, PciRoot};
use crate::devices::virtio::transport::VirtioPciDevice;
use crate::devices::virtio::VirtioDevice;
use crate::event_loop::EventLoopHandle;
use crate::kvm::{self, IoEvent, KvmError};
use crate::memory;
use pci::{BarRange, MappedVirtio, PciMapper, RouteUpdater, VIRTIO_BAR_SIZE};
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
    #[error("Cannot create {0}: {1}")]
    Device(String, std::io::Error),
}

/// How a virtio device's queue notifications reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Notify {
    /// A zero-length ioeventfd per queue: KVM signals it, no exit to userspace.
    Ioeventfd,
    /// A write that exits to the vCPU thread, which signals the queue (the bench compares).
    VcpuThread,
}

/// Which bus a range is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusKind {
    Pio,
    Mmio,
}

/// The device manager while the VM is being built.
pub struct DeviceManager {
    vm: Arc<VmFd>,
    irqchip: IrqchipMode,
    pio: BusBuilder,
    mmio: BusBuilder,
    routing: Arc<Mutex<GsiRouting>>,
    bar_window: AddressAllocator,
    pci: Option<PciRoot>,
    mapper: Arc<PciMapper>,
    virtio: Vec<Arc<VirtioPciDevice>>,
    /// Whether a coalesced zone was registered (the vCPUs then drain KVM's ring).
    coalesced_zones: bool,
}

impl DeviceManager {
    pub fn new(vm: Arc<VmFd>, irqchip: IrqchipMode) -> Self {
        let mapper = Arc::new(PciMapper {
            vm: vm.clone(),
            buses: OnceLock::new(),
            slots: Mutex::new(HashMap::new()),
        });
        DeviceManager {
            vm,
            irqchip,
            pio: BusBuilder::new(),
            mmio: BusBuilder::new(),
            routing: Arc::new(Mutex::new(GsiRouting::new(irqchip))),
            // A constant, non-empty window: the allocator cannot refuse it.
            bar_window: AddressAllocator::new(memory::PCI_MMIO_START, memory::PCI_MMIO_SIZE)
                .expect("valid BAR window"),
            pci: None,
            mapper,
            virtio: Vec::new(),
            coalesced_zones: false,
        }
    }

    /// Maps `device` at `[base, base + len)` on `bus` under `name`; returns its stable id.
    pub fn add(
        &mut self,
        bus: BusKind,
        name: &str,
        base: u64,
        len: u64,
        device: SharedDevice,
    ) -> Result<usize, DeviceManagerError> {
        let builder = match bus {
            BusKind::Pio => &mut self.pio,
            BusKind::Mmio => &mut self.mmio,
        };
        Ok(builder.insert(name, base, len, device)?)
    }

    /// Signals `evt` (in the kernel, no exit to userspace) when the guest writes `event`.
    pub fn register_ioeventfd(
        &self,
        evt: &EventFd,
        event: &IoEvent,
    ) -> Result<(), DeviceManagerError> {
        Ok(kvm::ioeventfd(&self.vm, evt, event, true)?)
    }

    /// Removes an ioeventfd registered with [`DeviceManager::register_ioeventfd`].
    pub fn unregister_ioeventfd(
        &self,
        evt: &EventFd,
        event: &IoEvent,
    ) -> Result<(), DeviceManagerError> {
        Ok(kvm::ioeventfd(&self.vm, evt, event, false)?)
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

    /// Puts `device` on PCI bus 0 behind virtio-pci: BAR 0 from the window, its MMIO range,
    /// one notify ioeventfd per queue (unless `notify` says otherwise), and an irqfd with an
    /// MSI route per MSI-X vector (without an in-kernel irqchip there is none: the driver must
    /// poll).
    pub fn add_virtio(
        &mut self,
        name: &str,
        device: Box<dyn VirtioDevice>,
        mem: &GuestMemoryMmap,
        event_loop: EventLoopHandle,
        notify: Notify,
    ) -> Result<Arc<VirtioPciDevice>, DeviceManagerError> {
        let full = || DeviceManagerError::PciFull(name.to_string());
        let bar = self
            .bar_window
            .allocate(VIRTIO_BAR_SIZE, VIRTIO_BAR_SIZE, AllocPolicy::FirstMatch)
            .map_err(|_| full())?;
        let addr = bar.start();
        let dev = VirtioPciDevice::new(name, device, addr, mem.clone(), event_loop)
            .map_err(|e| DeviceManagerError::Device(name.to_string(), e))?;
        let dev = Arc::new(dev);
        if self.irqchip != IrqchipMode::None {
            let irq = dev.interrupt().clone();
            let gsis = irq
                .irqfds()
                .iter()
                .map(|evt| self.connect_msi(evt))
                .collect::<Result<Vec<_>, _>>()?;
            let routes = RouteUpdater {
                routing: self.routing.clone(),
                vm: self.vm.clone(),
            };
            irq.connect(gsis, Box::new(routes));
        }
        let ioeventfds = notify == Notify::Ioeventfd;
        if ioeventfds {
            for (event, evt) in dev.notify_events(addr) {
                self.register_ioeventfd(evt, &event)?;
            }
        }
        let as_pci: Arc<dyn PciDevice> = dev.clone();
        let range = BarRange {
            device: as_pci.clone(),
            bar: 0,
        };
        let id = self
            .mmio
            .insert(name, addr, VIRTIO_BAR_SIZE, Arc::new(range))?;
        let slot = self
            .pci
            .get_or_insert_with(PciRoot::new)
            .add(as_pci)
            .ok_or_else(full)?;
        let mapped = MappedVirtio {
            device: dev.clone(),
            range: id,
            addr,
            ioeventfds,
        };
        routing_lock(self.mapper.slots_map()).insert(slot, mapped);
        self.virtio.push(dev.clone());
        Ok(dev)
    }

    /// What the devices put in the ACPI tables: PCI's host bridge and ECAM when there is PCI.
    pub fn acpi_platform(&self) -> AcpiPlatform {
        if self.pci.is_none() {
            return AcpiPlatform::default();
        }
        AcpiPlatform {
            dsdt_aml: crate::devices::pci::acpi::dsdt_aml(),
            ecam: Some(Ecam {
                base: memory::PCI_ECAM_START,
                last_bus: 0,
            }),
        }
    }

    /// The virtio devices added so far.
    pub fn virtio_devices(&self) -> &[Arc<VirtioPciDevice>] {
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

    /// Ends set-up: PCI configuration access (when there are PCI devices), the buses frozen
    /// (the layout vCPUs start with, later changed only by BAR moves), the routes installed.
    pub fn finish(mut self) -> Result<Arc<SharedBuses>, DeviceManagerError> {
        if let Some(root) = self.pci.take() {
            let root = Arc::new(root);
            root.set_mapper(self.mapper.clone());
            let ports = Arc::new(PciConfigPorts::new(root.clone()));
            let (port, ports_len) = (memory::PCI_CONFIG_PORT, memory::PCI_CONFIG_PORT_LEN);
            self.pio.insert("pci-config", port, ports_len, ports)?;
            let ecam = Arc::new(PciEcam::new(root));
            let (base, len) = (memory::PCI_ECAM_START, memory::PCI_ECAM_SIZE);
            self.mmio.insert("pci-ecam", base, len, ecam)?;
        }
        {
            // KVM's default table is what a VM without MSI routes needs: leave it alone then.
            let routing = routing_lock(&self.routing);
            if routing.has_msi() {
                routing.apply(&self.vm)?;
            }
        }
        let buses = Arc::new(SharedBuses::new(Buses {
            pio: self.pio.freeze(),
            mmio: self.mmio.freeze(),
        }));
        let _ = self.mapper.buses.set(buses.clone());
        Ok(buses)
    }
}

fn routing_lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
