//! How a virtio-pci device interrupts the driver: MSI-X vectors, each an irqfd KVM routes as
//! an MSI. Shared by the transport (vCPU threads program it) and the device's queue work
//! (the event loop raises it); its own lock, never held across anything slow.
//!
//! A vector can also be handed to a process outside exitless ([`MsixInterrupt::queue_irqfd`]:
//! a vhost-user back end writes the irqfd itself, so the interrupt never passes through
//! exitless). Masking then cannot be applied by holding the interrupt back here: while such a
//! vector is masked its irqfd is taken off KVM, so the back end's writes wait in the eventfd's
//! counter, and KVM delivers them when the irqfd is put back on unmask.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::common::NO_VECTOR;
use crate::devices::pci::msix::{MsiMessage, Msix, MsixState, TableWrite};
use crate::devices::virtio::VirtioInterrupt;

/// Where MSI routes are changed: the device manager, which owns the GSI routing table.
pub trait MsiRoutes: Send + Sync {
    /// Points `gsi` at `message`.
    fn set_route(&self, gsi: u32, message: MsiMessage);
    /// Puts `irqfd` on KVM as `gsi`'s source (`connected`) or takes it off (a masked vector
    /// another process writes).
    fn set_irqfd(&self, gsi: u32, irqfd: &EventFd, connected: bool);
}

/// ISR bit: a queue has used buffers.
pub const ISR_QUEUE: u8 = 1;
/// ISR bit: the device configuration changed.
pub const ISR_CONFIG: u8 = 2;

/// The MSI-X side of one virtio-pci function.
pub struct MsixInterrupt {
    msix: Mutex<Msix>,
    irqfds: Vec<EventFd>,
    queue_vectors: Vec<AtomicU16>,
    config_vector: AtomicU16,
    isr: AtomicU8,
    /// GSIs of the vectors and where to route them, once the device manager connected them.
    routes: OnceLock<(Vec<u32>, Box<dyn MsiRoutes>)>,
    /// Per vector: another process writes its irqfd (see the module docs).
    handed_out: Vec<AtomicBool>,
    /// Per vector: its irqfd is off KVM because the vector is masked.
    irqfd_off: Vec<AtomicBool>,
}

impl MsixInterrupt {
    /// `vectors` MSI-X vectors (each with its irqfd) for `queues` queues.
    pub fn new(vectors: u16, queues: usize) -> io::Result<Self> {
        let irqfds = (0..vectors)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(MsixInterrupt {
            msix: Mutex::new(Msix::new(vectors)),
            irqfds,
            queue_vectors: (0..queues).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            config_vector: AtomicU16::new(NO_VECTOR),
            isr: AtomicU8::new(0),
            routes: OnceLock::new(),
            handed_out: (0..vectors).map(|_| AtomicBool::new(false)).collect(),
            irqfd_off: (0..vectors).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    fn msix(&self) -> std::sync::MutexGuard<'_, Msix> {
        self.msix.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The irqfd of each vector, for the device manager to connect as MSI routes.
    pub fn irqfds(&self) -> &[EventFd] {
        &self.irqfds
    }

    /// Connects the vectors: `gsis[v]` is vector v's route, changed through `routes`.
    pub fn connect(&self, gsis: Vec<u32>, routes: Box<dyn MsiRoutes>) {
        let _ = self.routes.set((gsis, routes));
    }

    /// Which vector queue `queue` (or the configuration, `None`) raises.
    pub fn set_vector(&self, queue: Option<u16>, vector: u16) {
        let slot = match queue {
            Some(q) => self.queue_vectors.get(usize::from(q)),
            None => Some(&self.config_vector),
        };
        if let Some(slot) = slot {
            slot.store(vector, Ordering::Release);
        }
    }

    /// The irqfd of queue `queue`'s vector (open as long as this interrupt lives), for another
    /// process to write (a vhost-user back
    /// end's call eventfd): the interrupt then reaches the guest without exitless. None when
    /// the driver gave the queue no vector (it polls); an error when the vectors have no
    /// routes (no in-kernel irqchip). From now until [`MsixInterrupt::reset`], masking that vector takes
    /// its irqfd off KVM.
    pub fn queue_irqfd(&self, queue: u16) -> io::Result<Option<RawFd>> {
        if self.routes.get().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "MSI-X vectors without routes (no in-kernel irqchip)",
            ));
        }
        let vector = self
            .queue_vectors
            .get(usize::from(queue))
            .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire));
        let v = usize::from(vector);
        if vector == NO_VECTOR || v >= self.irqfds.len() {
            return Ok(None);
        }
        self.handed_out[v].store(true, Ordering::Release);
        self.follow_masks(&self.msix());
        Ok(Some(self.irqfds[v].as_raw_fd()))
    }

    /// Takes the irqfd of each handed-out vector off KVM while it is masked, and puts it back
    /// when unmasked (called with the table's lock held, so changes apply in order).
    fn follow_masks(&self, msix: &Msix) {
        let Some((gsis, routes)) = self.routes.get() else {
            return;
        };
        for (v, handed) in self.handed_out.iter().enumerate() {
            if !handed.load(Ordering::Acquire) {
                continue;
            }
            let off = !msix.is_deliverable(v as u16);
            if self.irqfd_off[v].swap(off, Ordering::AcqRel) != off {
                if let Some(&gsi) = gsis.get(v) {
                    routes.set_irqfd(gsi, &self.irqfds[v], !off);
                }
            }
        }
    }

    /// Reads and clears the ISR (legacy status; MSI-X drivers never need it).
    pub fn take_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::AcqRel)
    }

    /// Forgets pending interrupts and vector choices (device reset); the table stays, as the
    /// PCI function was not reset.
    pub fn reset(&self) {
        self.isr.store(0, Ordering::Release);
        for v in &self.queue_vectors {
            v.store(NO_VECTOR, Ordering::Release);
        }
        self.config_vector.store(NO_VECTOR, Ordering::Release);
        // Vectors handed out go back to exitless's own masking, their irqfds on KVM.
        let msix = self.msix();
        for (v, handed) in self.handed_out.iter().enumerate() {
            handed.store(false, Ordering::Release);
            if self.irqfd_off[v].swap(false, Ordering::AcqRel) {
                if let Some((gsis, routes)) = self.routes.get() {
                    if let Some(&gsi) = gsis.get(v) {
                        routes.set_irqfd(gsi, &self.irqfds[v], true);
                    }
                }
            }
        }
        drop(msix);
    }

    /// Sends `vector` (or leaves it pending while masked); false for no vector.
    fn fire(&self, vector: u16) -> io::Result<bool> {
        if vector == NO_VECTOR {
            return Ok(false); // the driver polls
        }
        if self.msix().trigger(vector) {
            self.irqfds[usize::from(vector)].write(1)?;
        }
        Ok(true)
    }

    fn deliver(&self, vectors: &[u16]) {
        for &v in vectors {
            let _ = self.irqfds[usize::from(v)].write(1);
        }
    }

    /// The guest wrote the message control word.
    pub fn write_control(&self, value: u16) {
        let ready = {
            let mut msix = self.msix();
            let ready = msix.write_control(value);
            self.follow_masks(&msix);
            ready
        };
        self.deliver(&ready);
    }

    pub fn control(&self) -> u16 {
        self.msix().control()
    }

    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        self.msix().table_read(offset, data);
    }

    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        self.msix().pba_read(offset, data);
    }

    /// The guest wrote the table: a changed message is rerouted before anything is delivered.
    pub fn table_write(&self, offset: u64, data: &[u8]) {
        let (TableWrite { rerouted, deliver }, message) = {
            let mut msix = self.msix();
            let change = msix.table_write(offset, data);
            self.follow_masks(&msix);
            let message = change.rerouted.and_then(|v| msix.vector(v));
            (change, message)
        };
        if let (Some(v), Some(m), Some((gsis, routes))) = (rerouted, message, self.routes.get()) {
            if let Some(&gsi) = gsis.get(usize::from(v)) {
                routes.set_route(
                    gsi,
                    MsiMessage {
                        address: m.address,
                        data: m.data,
                    },
                );
            }
        }
        self.deliver(&deliver);
    }
}

/// What a snapshot saves of the interrupt side: the MSI-X table and pending bits, the ISR
/// (the vectors each queue raises are the common configuration's).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptState {
    pub msix: MsixState,
    pub isr: u8,
}

impl MsixInterrupt {
    /// The state to save; refused while a vector is handed to another process.
    pub fn save(&self) -> Result<InterruptState, String> {
        if self.handed_out.iter().any(|h| h.load(Ordering::Acquire)) {
            return Err("an MSI-X vector is written by another process (vhost-user)".into());
        }
        Ok(InterruptState {
            msix: self.msix().save(),
            isr: self.isr.load(Ordering::Acquire),
        })
    }

    /// The state to save of a device whose vhost-user back end has stopped its queues
    /// (GET_VRING_BASE: it writes no irqfd any more). A handed-out vector's interrupt that
    /// waits in its irqfd while the vector is masked is saved as pending, and left in the
    /// irqfd for the VM that goes on; an unmasked vector's went to KVM.
    pub fn save_with_stopped_backend(&self) -> Result<InterruptState, String> {
        let msix = self.msix();
        let mut state = InterruptState {
            msix: msix.save(),
            isr: self.isr.load(Ordering::Acquire),
        };
        drop(msix);
        for (v, handed) in self.handed_out.iter().enumerate() {
            if !handed.load(Ordering::Acquire) || !self.irqfd_off[v].load(Ordering::Acquire) {
                continue;
            }
            if let Ok(count) = self.irqfds[v].read() {
                let _ = self.irqfds[v].write(count);
                if let Some(p) = state.msix.pending.get_mut(v) {
                    *p = true;
                }
            }
        }
        Ok(state)
    }

    /// Puts saved state back (before the VM runs): the table, the vector of the
    /// configuration and of each queue, and each programmed vector's MSI route.
    pub fn restore(
        &self,
        s: &InterruptState,
        config_vector: u16,
        queue_vectors: &[u16],
    ) -> Result<(), String> {
        let messages: Vec<(u16, MsiMessage)> = {
            let mut msix = self.msix();
            msix.load(&s.msix)?;
            (0..msix.count())
                .filter_map(|v| msix.vector(v).map(|m| (v, m)))
                .filter(|(_, m)| m.address != 0)
                .map(|(v, m)| {
                    let message = MsiMessage {
                        address: m.address,
                        data: m.data,
                    };
                    (v, message)
                })
                .collect()
        };
        self.isr.store(s.isr, Ordering::Release);
        self.config_vector.store(config_vector, Ordering::Release);
        for (slot, &v) in self.queue_vectors.iter().zip(queue_vectors) {
            slot.store(v, Ordering::Release);
        }
        if let Some((gsis, routes)) = self.routes.get() {
            for (v, message) in messages {
                if let Some(&gsi) = gsis.get(usize::from(v)) {
                    routes.set_route(gsi, message);
                }
            }
        }
        Ok(())
    }
}

impl VirtioInterrupt for MsixInterrupt {
    fn signal_queue(&self, queue: u16) -> io::Result<bool> {
        self.isr.fetch_or(ISR_QUEUE, Ordering::AcqRel);
        let vector = self
            .queue_vectors
            .get(usize::from(queue))
            .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire));
        self.fire(vector)
    }

    fn signal_config(&self) -> io::Result<()> {
        self.isr.fetch_or(ISR_CONFIG, Ordering::AcqRel);
        self.fire(self.config_vector.load(Ordering::Acquire))
            .map(drop)
    }

    fn queue_irqfd(&self, queue: u16) -> io::Result<Option<RawFd>> {
        MsixInterrupt::queue_irqfd(self, queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex as StdMutex};

    struct Routes(Arc<StdMutex<Vec<(u32, MsiMessage)>>>);

    impl MsiRoutes for Routes {
        fn set_route(&self, gsi: u32, message: MsiMessage) {
            self.0.lock().unwrap().push((gsi, message));
        }
        fn set_irqfd(&self, _gsi: u32, _irqfd: &EventFd, _connected: bool) {}
    }

    /// Records irqfd changes: (gsi, connected).
    struct Irqfds(Arc<StdMutex<Vec<(u32, bool)>>>);

    impl MsiRoutes for Irqfds {
        fn set_route(&self, _gsi: u32, _message: MsiMessage) {}
        fn set_irqfd(&self, gsi: u32, _irqfd: &EventFd, connected: bool) {
            self.0.lock().unwrap().push((gsi, connected));
        }
    }

    #[test]
    fn a_handed_out_vector_leaves_kvm_while_masked() {
        let irq = MsixInterrupt::new(3, 2).unwrap();
        let log = Arc::new(StdMutex::new(Vec::new()));
        assert!(irq.queue_irqfd(0).is_err(), "no routes: no irqfd");
        irq.connect(vec![40, 41, 42], Box::new(Irqfds(log.clone())));
        assert!(irq.queue_irqfd(0).unwrap().is_none(), "no vector: it polls");
        irq.write_control(1 << 15); // enabled
        irq.table_write(2 * 16 + 12, &0u32.to_le_bytes()); // vectors start masked
        irq.set_vector(Some(1), 2);
        let fd = irq.queue_irqfd(1).unwrap().expect("vector 2's irqfd");
        assert_eq!(fd, irq.irqfds()[2].as_raw_fd(), "the vector's own irqfd");
        assert!(log.lock().unwrap().is_empty(), "deliverable: stays on KVM");
        irq.table_write(2 * 16 + 12, &1u32.to_le_bytes()); // mask vector 2
        irq.table_write(16 + 12, &1u32.to_le_bytes()); // vector 1 is not handed out
        irq.write_control(1 << 15 | 1 << 14); // function mask: no change for vector 2
        irq.write_control(1 << 15);
        irq.table_write(2 * 16 + 12, &0u32.to_le_bytes()); // unmask
        assert_eq!(*log.lock().unwrap(), [(42, false), (42, true)]);
        irq.table_write(2 * 16 + 12, &1u32.to_le_bytes());
        irq.reset();
        assert_eq!(log.lock().unwrap().last(), Some(&(42, true)), "back on KVM");
        irq.table_write(2 * 16 + 12, &0u32.to_le_bytes());
        assert_eq!(
            log.lock().unwrap().len(),
            4,
            "no longer followed after reset"
        );
    }

    #[test]
    fn a_back_end_s_interrupt_behind_a_masked_vector_is_saved_pending_and_kept() {
        let irq = MsixInterrupt::new(3, 2).unwrap();
        let log = Arc::new(StdMutex::new(Vec::new()));
        irq.connect(vec![40, 41, 42], Box::new(Irqfds(log.clone())));
        irq.write_control(1 << 15);
        irq.table_write(2 * 16 + 12, &0u32.to_le_bytes());
        irq.set_vector(Some(1), 2);
        irq.queue_irqfd(1).unwrap().expect("vector 2's irqfd");
        assert!(
            irq.save().is_err(),
            "handed out: the back end may still write"
        );
        irq.table_write(2 * 16 + 12, &1u32.to_le_bytes()); // masked: off KVM
        irq.irqfds()[2].write(1).unwrap(); // the back end's completion waits there
        let saved = irq.save_with_stopped_backend().unwrap();
        assert_eq!(saved.msix.pending, [false, false, true]);
        assert_eq!(
            irq.irqfds()[2].read().unwrap(),
            1,
            "left for the VM that goes on"
        );
        let saved = irq.save_with_stopped_backend().unwrap();
        assert_eq!(saved.msix.pending, [false; 3], "nothing waited");
    }

    #[test]
    fn queue_interrupts_follow_vectors_masking_and_routes() {
        let irq = MsixInterrupt::new(2, 1).unwrap();
        let log = Arc::new(StdMutex::new(Vec::new()));
        irq.connect(vec![40, 41], Box::new(Routes(log.clone())));
        irq.write_control(1 << 15);
        irq.set_vector(Some(0), 1);
        irq.table_write(16, &0xfee0_0000u32.to_le_bytes());
        irq.table_write(24, &0x45u32.to_le_bytes());
        let routed = log.lock().unwrap().clone();
        assert_eq!(
            routed.last(),
            Some(&(
                41,
                MsiMessage {
                    address: 0xfee0_0000,
                    data: 0x45
                }
            ))
        );
        assert!(irq.signal_queue(0).unwrap(), "masked: left pending");
        assert!(
            irq.irqfds()[1].read().is_err(),
            "masked: nothing delivered yet"
        );
        irq.table_write(28, &0u32.to_le_bytes());
        assert_eq!(
            irq.irqfds()[1].read().unwrap(),
            1,
            "pending vector delivered on unmask"
        );
        irq.signal_queue(0).unwrap();
        assert_eq!(irq.irqfds()[1].read().unwrap(), 1);
        assert_eq!(irq.take_isr(), ISR_QUEUE);
        // No vector: the driver polls; nothing is raised, nothing breaks.
        irq.set_vector(Some(0), NO_VECTOR);
        assert!(
            !irq.signal_queue(0).unwrap(),
            "nothing raised without a vector"
        );
        assert!(!irq.signal_queue(9).unwrap());
        assert!(irq.irqfds()[1].read().is_err());
    }
}
