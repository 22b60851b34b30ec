//! The device manager: what a VM's devices need from KVM and from each other. It owns bus
//! assembly (stable ids and names), GSI allocation and routing, and ioeventfd, irqfd and
//! coalesced-zone registration. Every device (COM1, the i8042, the bench guest's ports, PCI
//! devices) goes on the buses through it.

pub mod routing;

use std::sync::Arc;

use kvm_ioctls::{IoEventAddress, VmFd};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use crate::bus::{BusBuilder, BusError, Buses, SharedBuses, SharedDevice};
use crate::config::IrqchipMode;
use crate::kvm::{self, IoEvent, KvmError};
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
    routing: GsiRouting,
}

impl DeviceManager {
    pub fn new(vm: Arc<VmFd>, irqchip: IrqchipMode) -> Self {
        DeviceManager {
            vm,
            irqchip,
            pio: BusBuilder::new(),
            mmio: BusBuilder::new(),
            routing: GsiRouting::new(irqchip),
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
    /// message is set later with [`routing::GsiRouting::set_msi`] and applied.
    pub fn connect_msi(&mut self, evt: &EventFd) -> Result<u32, DeviceManagerError> {
        let gsi = self.routing.allocate_msi()?;
        self.vm
            .register_irqfd(evt, gsi)
            .map_err(|e| KvmError::Ioctl("KVM_IRQFD", e))?;
        Ok(gsi)
    }

    /// The routing table (MSI routes are allocated through [`DeviceManager::connect_msi`]).
    pub fn routing(&mut self) -> &mut GsiRouting {
        &mut self.routing
    }

    /// Makes KVM queue guest writes to `[addr, addr + len)` in its coalesced ring instead of
    /// exiting; they reach the bus at a vCPU's next exit.
    pub fn register_coalesced(
        &self,
        addr: IoEventAddress,
        len: u32,
    ) -> Result<(), DeviceManagerError> {
        self.vm
            .register_coalesced_mmio(addr, len)
            .map_err(|e| KvmError::Ioctl("KVM_REGISTER_COALESCED_MMIO", e))?;
        Ok(())
    }

    /// Ends set-up: freezes the buses (the layout vCPUs start with) and installs the routes.
    pub fn finish(self) -> Result<Arc<SharedBuses>, DeviceManagerError> {
        // KVM's default table is what a VM without MSI routes needs: leave it alone then.
        if self.routing.has_msi() {
            self.routing.apply(&self.vm)?;
        }
        Ok(Arc::new(SharedBuses::new(Buses {
            pio: self.pio.freeze(),
            mmio: self.mmio.freeze(),
        })))
    }
}
