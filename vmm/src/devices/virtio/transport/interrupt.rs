//! How a virtio-pci device interrupts the driver: MSI-X vectors, each an irqfd KVM routes as
//! an MSI. Shared by the transport (vCPU threads program it) and the device's queue work
//! (the event loop raises it); its own lock, never held across anything slow.

use std::io;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::common::NO_VECTOR;
use crate::devices::pci::msix::{MsiMessage, Msix, TableWrite};
use crate::devices::virtio::VirtioInterrupt;

/// Where MSI routes are changed: the device manager, which owns the GSI routing table.
pub trait MsiRoutes: Send + Sync {
    /// Points `gsi` at `message`.
    fn set_route(&self, gsi: u32, message: MsiMessage);
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
        let ready = self.msix().write_control(value);
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
