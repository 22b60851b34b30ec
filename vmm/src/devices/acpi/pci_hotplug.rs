//! The PCI hotplug controller: which bus-0 slots came up (`PCIU`) and which the guest is
//! asked to give back (`PCID`), both cleared when read, and the eject register (`B0EJ`) the
//! guest's `_EJ0` writes, a bit per slot. A segment select (`PSEG`) reads back; only
//! segment 0 has slots.
//!
//! | offset | register | access |
//! |---|---|---|
//! | 0x0 | PCIU | read (clears) |
//! | 0x4 | PCID | read (clears) |
//! | 0x8 | B0EJ | write: slots ejected |
//! | 0xc | PSEG | read/write |

use std::sync::mpsc::Sender;

use super::{put, value, Ejected};
use crate::bus::{DeviceEvent, MutBusDevice};
use crate::devices::GuestFaults;

pub const PCIU: u64 = 0x0;
pub const PCID: u64 = 0x4;
pub const B0EJ: u64 = 0x8;
pub const PSEG: u64 = 0xc;

/// The controller's state.
#[derive(Debug)]
pub struct PciHotplug {
    up: u32,
    down: u32,
    segment: u32,
    ejected: Sender<Ejected>,
    faults: GuestFaults,
}

impl PciHotplug {
    /// Ejects go to `ejected`.
    pub fn new(ejected: Sender<Ejected>) -> Self {
        PciHotplug {
            up: 0,
            down: 0,
            segment: 0,
            ejected,
            faults: GuestFaults::new("pci-hotplug"),
        }
    }

    /// Slot `slot` has a new device.
    pub fn slot_added(&mut self, slot: u8) {
        self.up |= 1 << (slot & 31);
        self.down &= !(1 << (slot & 31));
    }

    /// The guest is asked to give slot `slot` back.
    pub fn removal_requested(&mut self, slot: u8) {
        self.down |= 1 << (slot & 31);
        self.up &= !(1 << (slot & 31));
    }

    pub fn faults(&self) -> u64 {
        self.faults.count()
    }
}

impl MutBusDevice for PciHotplug {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = match (offset, data.len()) {
            (PCIU, 4) => std::mem::take(&mut self.up),
            (PCID, 4) => std::mem::take(&mut self.down),
            (B0EJ, 4) => 0,
            (PSEG, 4) => self.segment,
            _ => {
                self.faults.record("read", offset, data.len());
                u32::MAX
            }
        };
        put(v, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<DeviceEvent> {
        match (offset, data.len()) {
            (B0EJ, 4) if self.segment == 0 => {
                let bits = value(data);
                for slot in (1..32u8).filter(|s| bits & (1 << s) != 0) {
                    // The owner may be gone (the VM is ending): nothing to remove then.
                    let _ = self.ejected.send(Ejected::PciSlot(slot));
                    // The main loop completes the eject (control::serve).
                    crate::wake::wake();
                }
            }
            (B0EJ, 4) => {}
            (PSEG, 4) => self.segment = value(data),
            _ => self.faults.record("write", offset, data.len()),
        }
        Ok(DeviceEvent::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    fn read(c: &mut PciHotplug, at: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn slots_up_and_down_are_read_once_and_ejects_reported() {
        let (tx, rx) = channel();
        let mut c = PciHotplug::new(tx);
        c.slot_added(3);
        assert_eq!(read(&mut c, PCIU), 1 << 3);
        assert_eq!(read(&mut c, PCIU), 0, "read clears");
        c.removal_requested(3);
        assert_eq!((read(&mut c, PCIU), read(&mut c, PCID)), (0, 1 << 3));
        c.write(B0EJ, &((1u32 << 3) | (1 << 5) | 1).to_le_bytes())
            .unwrap();
        // Slot 0 (the host bridge) is never ejected.
        assert_eq!(
            rx.try_iter().collect::<Vec<_>>(),
            vec![Ejected::PciSlot(3), Ejected::PciSlot(5)]
        );
        c.write(PSEG, &1u32.to_le_bytes()).unwrap();
        assert_eq!(read(&mut c, PSEG), 1);
        c.write(B0EJ, &(1u32 << 4).to_le_bytes()).unwrap();
        assert!(rx.try_recv().is_err(), "no slots on segment 1");
    }

    #[test]
    fn odd_accesses_are_counted() {
        let (tx, _rx) = channel();
        let mut c = PciHotplug::new(tx);
        let mut b = [0u8; 2];
        c.read(PCIU, &mut b);
        assert_eq!(b, [0xff, 0xff]);
        c.write(0x40, &[1]).unwrap();
        assert_eq!(c.faults(), 2);
    }
}
