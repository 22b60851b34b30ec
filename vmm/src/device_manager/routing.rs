//! GSI routing: the in-kernel irqchip's legacy routes plus one MSI route per MSI-X vector.
//!
//! `KVM_SET_GSI_ROUTING` replaces the VM's whole table, so the table always carries the
//! routes KVM sets up by default for its PIC and IOAPIC (GSI i to IOAPIC pin i, and to the PIC
//! for i < 16) next to the MSI routes; otherwise COM1's irqfd on GSI 4 would stop working.
//! The table is a plain value built and tested here; [`GsiRouting::apply`] hands it to KVM.

use std::collections::BTreeMap;

use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use thiserror::Error;
use vm_allocator::IdAllocator;

use crate::config::IrqchipMode;

/// GSIs below this belong to the IOAPIC's pins.
pub const LEGACY_GSIS: u32 = 24;
/// Highest GSI handed out for MSI routes (KVM allows 4096 routes; a few hundred is plenty).
pub const LAST_MSI_GSI: u32 = 1023;

/// Errors allocating or applying routes.
#[derive(Debug, Error)]
pub enum RoutingError {
    #[error("No free GSI left for an MSI route")]
    Exhausted,
    #[error("GSI {0} is not an allocated MSI route")]
    UnknownGsi(u32),
    #[error("MSI needs an in-kernel local APIC (--irqchip kernel or split)")]
    NoIrqchip,
    #[error("Cannot build the GSI routing table: {0}")]
    Table(vmm_sys_util::fam::Error),
    #[error("KVM_SET_GSI_ROUTING failed: {0}")]
    Apply(kvm_ioctls::Error),
}

use crate::devices::pci::msix::MsiMessage;

/// One entry of the table, before it becomes KVM's union.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A pin of the PIC master (0), PIC slave (1) or IOAPIC (2).
    Irqchip {
        gsi: u32,
        chip: u32,
        pin: u32,
    },
    Msi {
        gsi: u32,
        message: MsiMessage,
    },
}

/// The VM's routing table.
pub struct GsiRouting {
    irqchip: IrqchipMode,
    gsis: IdAllocator,
    msi: BTreeMap<u32, MsiMessage>,
}

impl GsiRouting {
    pub fn new(irqchip: IrqchipMode) -> Self {
        GsiRouting {
            irqchip,
            // The range is a non-empty constant range: IdAllocator cannot refuse it.
            gsis: IdAllocator::new(LEGACY_GSIS, LAST_MSI_GSI).expect("valid GSI range"),
            msi: BTreeMap::new(),
        }
    }

    /// A new MSI route (message all zero until [`GsiRouting::set_msi`]); returns its GSI.
    pub fn allocate_msi(&mut self) -> Result<u32, RoutingError> {
        if self.irqchip == IrqchipMode::None {
            return Err(RoutingError::NoIrqchip);
        }
        let gsi = self
            .gsis
            .allocate_id()
            .map_err(|_| RoutingError::Exhausted)?;
        self.msi.insert(gsi, MsiMessage::default());
        Ok(gsi)
    }

    /// Gives back an MSI route (its device was removed); the table no longer has it.
    pub fn free_msi(&mut self, gsi: u32) -> Result<(), RoutingError> {
        self.msi.remove(&gsi).ok_or(RoutingError::UnknownGsi(gsi))?;
        self.gsis
            .free_id(gsi)
            .map_err(|_| RoutingError::UnknownGsi(gsi))?;
        Ok(())
    }

    /// Points the MSI route `gsi` at `message`; returns whether anything changed.
    pub fn set_msi(&mut self, gsi: u32, message: MsiMessage) -> Result<bool, RoutingError> {
        let slot = self
            .msi
            .get_mut(&gsi)
            .ok_or(RoutingError::UnknownGsi(gsi))?;
        let changed = *slot != message;
        *slot = message;
        Ok(changed)
    }

    /// Whether any MSI route was allocated.
    pub fn has_msi(&self) -> bool {
        !self.msi.is_empty()
    }

    /// The whole table, legacy routes first.
    pub fn routes(&self) -> Vec<Route> {
        let mut routes = Vec::new();
        if self.irqchip == IrqchipMode::Kernel {
            for gsi in 0..LEGACY_GSIS {
                if gsi < 8 {
                    routes.push(Route::Irqchip {
                        gsi,
                        chip: KVM_IRQCHIP_PIC_MASTER,
                        pin: gsi,
                    });
                } else if gsi < 16 {
                    let pin = gsi - 8;
                    routes.push(Route::Irqchip {
                        gsi,
                        chip: KVM_IRQCHIP_PIC_SLAVE,
                        pin,
                    });
                }
                routes.push(Route::Irqchip {
                    gsi,
                    chip: KVM_IRQCHIP_IOAPIC,
                    pin: gsi,
                });
            }
        }
        routes.extend(
            self.msi
                .iter()
                .map(|(&gsi, &message)| Route::Msi { gsi, message }),
        );
        routes
    }

    /// Installs the table in KVM.
    pub fn apply(&self, vm: &VmFd) -> Result<(), RoutingError> {
        let entries: Vec<kvm_irq_routing_entry> = self.routes().iter().map(kvm_entry).collect();
        let table = KvmIrqRouting::from_entries(&entries).map_err(RoutingError::Table)?;
        vm.set_gsi_routing(&table).map_err(RoutingError::Apply)
    }
}

fn kvm_entry(route: &Route) -> kvm_irq_routing_entry {
    let mut entry = kvm_irq_routing_entry::default();
    match *route {
        Route::Irqchip { gsi, chip, pin } => {
            entry.gsi = gsi;
            entry.type_ = KVM_IRQ_ROUTING_IRQCHIP;
            entry.u.irqchip.irqchip = chip;
            entry.u.irqchip.pin = pin;
        }
        Route::Msi { gsi, message } => {
            entry.gsi = gsi;
            entry.type_ = KVM_IRQ_ROUTING_MSI;
            entry.u.msi.address_lo = message.address as u32;
            entry.u.msi.address_hi = (message.address >> 32) as u32;
            entry.u.msi.data = message.data;
        }
    }
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_irqchip_keeps_the_default_legacy_routes() {
        let mut r = GsiRouting::new(IrqchipMode::Kernel);
        let gsi = r.allocate_msi().unwrap();
        assert_eq!(gsi, LEGACY_GSIS);
        let routes = r.routes();
        // 16 PIC pins + 24 IOAPIC pins + the MSI route.
        assert_eq!(routes.len(), 16 + 24 + 1);
        let com1: Vec<&Route> = routes
            .iter()
            .filter(|x| matches!(x, Route::Irqchip { gsi: 4, .. }))
            .collect();
        assert_eq!(com1.len(), 2, "GSI 4 reaches the PIC and the IOAPIC");
        assert!(routes.contains(&Route::Irqchip {
            gsi: 12,
            chip: KVM_IRQCHIP_PIC_SLAVE,
            pin: 4
        }));
        assert!(routes.contains(&Route::Irqchip {
            gsi: 20,
            chip: KVM_IRQCHIP_IOAPIC,
            pin: 20
        }));
    }

    #[test]
    fn msi_routes_follow_what_the_guest_programs() {
        let mut r = GsiRouting::new(IrqchipMode::Split);
        let a = r.allocate_msi().unwrap();
        let b = r.allocate_msi().unwrap();
        assert_ne!(a, b);
        let m = MsiMessage {
            address: 0xfee0_1000,
            data: 0x41,
        };
        assert!(r.set_msi(b, m).unwrap());
        assert!(!r.set_msi(b, m).unwrap(), "same message: no change");
        assert_eq!(r.routes()[1], Route::Msi { gsi: b, message: m });
        assert!(matches!(r.set_msi(7, m), Err(RoutingError::UnknownGsi(7))));
        let e = kvm_entry(&Route::Msi {
            gsi: b,
            message: MsiMessage {
                address: 0x1_fee0_0000,
                data: 5,
            },
        });
        // SAFETY: the entry was just written as an MSI route, so `msi` is the active field.
        let msi = unsafe { e.u.msi };
        assert_eq!(
            (e.type_, msi.address_lo, msi.address_hi, msi.data),
            (KVM_IRQ_ROUTING_MSI, 0xfee0_0000, 1, 5)
        );
    }

    #[test]
    fn no_irqchip_means_no_msi_and_gsis_run_out_cleanly() {
        let mut none = GsiRouting::new(IrqchipMode::None);
        assert!(matches!(none.allocate_msi(), Err(RoutingError::NoIrqchip)));
        assert!(none.routes().is_empty());
        let mut r = GsiRouting::new(IrqchipMode::Split);
        let n = (LEGACY_GSIS..=LAST_MSI_GSI).count();
        for _ in 0..n {
            r.allocate_msi().unwrap();
        }
        assert!(matches!(r.allocate_msi(), Err(RoutingError::Exhausted)));
    }

    #[test]
    fn kvm_takes_the_table() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            crate::test_skip::skip("kvm_takes_the_table", "/dev/kvm is not usable");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        vm.create_irq_chip().unwrap();
        let mut r = GsiRouting::new(IrqchipMode::Kernel);
        let gsi = r.allocate_msi().unwrap();
        r.set_msi(
            gsi,
            MsiMessage {
                address: 0xfee0_0000,
                data: 0x45,
            },
        )
        .unwrap();
        r.apply(&vm).unwrap();
        let evt = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        vm.register_irqfd(&evt, gsi).unwrap();
        // A route KVM rejects: an IOAPIC pin past its 24.
        let bad = kvm_entry(&Route::Irqchip {
            gsi: 30,
            chip: KVM_IRQCHIP_IOAPIC,
            pin: 99,
        });
        let table = KvmIrqRouting::from_entries(&[bad]).unwrap();
        assert!(vm.set_gsi_routing(&table).is_err());
    }
}
