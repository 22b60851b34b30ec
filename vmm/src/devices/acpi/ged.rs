//! The Generic Event Device (ACPI0013): one register that says what changed since the guest
//! last read it (read clears), and an interrupt the guest's `_EVT` method answers.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

use vmm_sys_util::eventfd::EventFd;

use crate::bus::{BusDevice, DeviceEvent};
use crate::snapshot::{from_state, to_state, Snapshottable};

/// Notification bits (the power button's is pressed by `vm.power-button`).
pub use super::layout::{CPU_CHANGED, MEMORY_CHANGED, PCI_CHANGED, POWER_BUTTON};

/// The GED: its pending bits and the eventfd KVM turns into its interrupt (an irqfd).
#[derive(Debug)]
pub struct Ged {
    pending: AtomicU8,
    irq: EventFd,
}

impl Ged {
    pub fn new(irq: EventFd) -> Self {
        Ged {
            pending: AtomicU8::new(0),
            irq,
        }
    }

    pub fn irq(&self) -> &EventFd {
        &self.irq
    }

    /// Records `bits` and raises the interrupt.
    pub fn notify(&self, bits: u8) -> io::Result<()> {
        self.pending.fetch_or(bits, Ordering::AcqRel);
        self.irq.write(1)
    }
}

impl BusDevice for Ged {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        // A zero-length access (which KVM never makes, the fuzzer does) takes nothing.
        if let (0, Some(first)) = (offset, data.first_mut()) {
            *first = self.pending.swap(0, Ordering::AcqRel);
        }
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> io::Result<DeviceEvent> {
        Ok(DeviceEvent::None)
    }
}

/// The GED's saved state: the bits the guest has not read yet.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GedState {
    pending: u8,
}

impl Snapshottable for Ged {
    fn kind(&self) -> &'static str {
        "acpi-ged"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        to_state(&GedState {
            pending: self.pending.load(Ordering::Acquire),
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: GedState = from_state(state)?;
        self.pending.store(s.pending, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn reading_takes_the_pending_bits_and_the_interrupt_is_raised() {
        let ged = Ged::new(EventFd::new(EFD_NONBLOCK).unwrap());
        ged.notify(PCI_CHANGED).unwrap();
        ged.notify(CPU_CHANGED).unwrap();
        assert_eq!(ged.irq().read().unwrap(), 2);
        let mut b = [0u8; 1];
        ged.read(0, &mut b);
        assert_eq!(b[0], PCI_CHANGED | CPU_CHANGED);
        ged.read(0, &mut b);
        assert_eq!(b[0], 0, "read clears");
        ged.notify(CPU_CHANGED).unwrap();
        ged.read(0, &mut []);
        ged.read(0, &mut b);
        assert_eq!(b[0], CPU_CHANGED, "an empty read takes nothing");
        let mut wide = [0xffu8; 4];
        ged.read(4, &mut wide);
        assert_eq!(wide, [0; 4]);
    }
}
