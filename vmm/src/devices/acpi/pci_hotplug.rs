//! The PCI hotplug controller: which bus-0 slots came up (`PCIU`) and which the guest is
//! asked to give back (`PCID`), both cleared when read, and the eject register (`B0EJ`) the
//! guest's `_EJ0` writes, a bit per slot. A segment select (`PSEG`) reads back; only
//! segment 0 has slots. An eject of a slot that holds a device is left pending for the VM's
//! owner ([`PendingEjects`]: a bit, however often it is written); bits of empty slots and of
//! the host bridge are ignored, counted, and logged the first time.
//!
//! | offset | register | access |
//! |---|---|---|
//! | 0x0 | PCIU | read (clears) |
//! | 0x4 | PCID | read (clears) |
//! | 0x8 | B0EJ | write: slots ejected |
//! | 0xc | PSEG | read/write |

use std::sync::Arc;

use super::{put, value, PendingEjects};
use crate::bus::{DeviceEvent, MutBusDevice};
use crate::devices::pci::root::PciRoot;
use crate::devices::GuestFaults;
use crate::snapshot::{from_state, to_state, Snapshottable};

pub const PCIU: u64 = 0x0;
pub const PCID: u64 = 0x4;
pub const B0EJ: u64 = 0x8;
pub const PSEG: u64 = 0xc;

/// The controller's state.
pub struct PciHotplug {
    up: u32,
    down: u32,
    segment: u32,
    /// Bus 0: which slots hold a device.
    root: Arc<PciRoot>,
    ejected: Arc<PendingEjects>,
    faults: GuestFaults,
    /// B0EJ writes that named an empty slot (or the host bridge).
    empty_ejects: u64,
    /// Slots the guest was asked to give back, until the device is gone (host-side only).
    asked: u32,
}

impl PciHotplug {
    /// Ejects of `root`'s devices go to `ejected`.
    pub fn new(root: Arc<PciRoot>, ejected: Arc<PendingEjects>) -> Self {
        PciHotplug {
            up: 0,
            down: 0,
            segment: 0,
            root,
            ejected,
            faults: GuestFaults::new("pci-hotplug"),
            empty_ejects: 0,
            asked: 0,
        }
    }

    /// B0EJ written with `bits`: the slots holding a device are left pending for the owner.
    fn eject(&mut self, bits: u32) {
        let populated = self.root.occupied() & !1; // slot 0, the host bridge, never goes
        if bits & !populated != 0 {
            self.empty_ejects += 1;
            if self.empty_ejects == 1 {
                eprintln!(
                    "pci-hotplug: the guest ejected slots {:#x} that hold no device; ignored \
                     (further ones are only counted)",
                    bits & !populated
                );
            }
        }
        if bits & populated != 0 {
            self.ejected.eject_slots(bits & populated);
        }
    }

    /// B0EJ writes that named a slot holding no device.
    pub fn empty_ejects(&self) -> u64 {
        self.empty_ejects
    }

    /// Slot `slot` has a new device.
    pub fn slot_added(&mut self, slot: u8) {
        self.up |= 1 << (slot & 31);
        self.down &= !(1 << (slot & 31));
        self.asked &= !(1 << (slot & 31));
    }

    /// The guest is asked to give slot `slot` back.
    pub fn removal_requested(&mut self, slot: u8) {
        self.down |= 1 << (slot & 31);
        self.up &= !(1 << (slot & 31));
        self.asked |= 1 << (slot & 31);
    }

    /// The device in `slot` is gone (the guest ejected it).
    pub fn removal_done(&mut self, slot: u8) {
        self.asked &= !(1 << (slot & 31));
    }

    /// The slots asked back whose device is still there, a bit each.
    pub fn asked(&self) -> u32 {
        self.asked
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
            (B0EJ, 4) if self.segment == 0 => self.eject(value(data)),
            (B0EJ, 4) => {}
            (PSEG, 4) => self.segment = value(data),
            _ => self.faults.record("write", offset, data.len()),
        }
        Ok(DeviceEvent::None)
    }
}

/// The controller's saved registers.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PciHotplugState {
    up: u32,
    down: u32,
    segment: u32,
    /// Slots asked back and not yet ejected (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    asked: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn lock(m: &std::sync::Mutex<PciHotplug>) -> std::sync::MutexGuard<'_, PciHotplug> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Snapshottable for std::sync::Mutex<PciHotplug> {
    fn kind(&self) -> &'static str {
        "acpi-pci-hotplug"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        let c = lock(self);
        to_state(&PciHotplugState {
            up: c.up,
            down: c.down,
            segment: c.segment,
            asked: c.asked,
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: PciHotplugState = from_state(state)?;
        let mut c = lock(self);
        (c.up, c.down, c.segment) = (s.up, s.down, s.segment);
        // Only slots that hold a device can be waiting for their eject.
        c.asked = s.asked & c.root.occupied() & !1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Ejected;
    use super::*;
    use crate::devices::pci::PciDevice;

    /// A bus whose slots 1 to `n` hold a device.
    fn root(n: usize) -> Arc<PciRoot> {
        let root = Arc::new(PciRoot::new());
        for _ in 0..n {
            let other: Arc<dyn PciDevice> = root.host_bridge();
            root.add(other).unwrap();
        }
        root
    }

    fn controller(slots: usize) -> (PciHotplug, Arc<PendingEjects>) {
        let pending = Arc::new(PendingEjects::default());
        (PciHotplug::new(root(slots), pending.clone()), pending)
    }

    fn read(c: &mut PciHotplug, at: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(at, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn slots_up_and_down_are_read_once_and_ejects_reported() {
        let (mut c, pending) = controller(5);
        c.slot_added(3);
        assert_eq!(read(&mut c, PCIU), 1 << 3);
        assert_eq!(read(&mut c, PCIU), 0, "read clears");
        c.removal_requested(3);
        assert_eq!((read(&mut c, PCIU), read(&mut c, PCID)), (0, 1 << 3));
        c.write(B0EJ, &((1u32 << 3) | (1 << 5) | 1).to_le_bytes())
            .unwrap();
        // Slot 0 (the host bridge) is never ejected.
        assert_eq!(
            pending.take(),
            vec![Ejected::PciSlot(3), Ejected::PciSlot(5)]
        );
        assert_eq!(c.empty_ejects(), 1, "slot 0");
        c.write(PSEG, &1u32.to_le_bytes()).unwrap();
        assert_eq!(read(&mut c, PSEG), 1);
        c.write(B0EJ, &(1u32 << 4).to_le_bytes()).unwrap();
        assert!(pending.take().is_empty(), "no slots on segment 1");
    }

    /// A guest writing B0EJ in a loop: ejects of one slot stay one pending eject, empty slots
    /// are only counted, and nothing grows.
    #[test]
    fn repeated_and_empty_slot_ejects_coalesce_and_are_counted() {
        let (mut c, pending) = controller(2);
        for _ in 0..100_000 {
            c.write(B0EJ, &u32::MAX.to_le_bytes()).unwrap();
        }
        assert_eq!(
            pending.take(),
            vec![Ejected::PciSlot(1), Ejected::PciSlot(2)]
        );
        assert!(pending.take().is_empty(), "taken once");
        assert_eq!(c.empty_ejects(), 100_000);
        c.write(B0EJ, &(1u32 << 9).to_le_bytes()).unwrap();
        assert!(pending.take().is_empty(), "slot 9 holds no device");
    }

    #[test]
    fn odd_accesses_are_counted() {
        let (mut c, _) = controller(0);
        let mut b = [0u8; 2];
        c.read(PCIU, &mut b);
        assert_eq!(b, [0xff, 0xff]);
        c.write(0x40, &[1]).unwrap();
        assert_eq!(c.faults(), 2);
    }

    /// A slot asked back stays asked (saved with the controller) until its device goes; a
    /// restore keeps only slots that hold a device.
    #[test]
    fn slots_asked_back_are_saved_until_their_device_goes() {
        use std::sync::Mutex;
        let (mut c, _) = controller(3);
        c.removal_requested(2);
        assert_eq!(c.asked(), 1 << 2);
        let saved = Mutex::new(c).snapshot().unwrap();
        assert_eq!(saved["asked"], 1 << 2);
        let (restored, _) = controller(3);
        let restored = Mutex::new(restored);
        restored.restore(saved.clone()).unwrap();
        assert_eq!(lock(&restored).asked(), 1 << 2);
        lock(&restored).removal_done(2);
        assert_eq!(lock(&restored).asked(), 0);
        let (fewer, _) = controller(1);
        let fewer = Mutex::new(fewer);
        fewer.restore(saved).unwrap();
        assert_eq!(lock(&fewer).asked(), 0, "slot 2 holds no device there");
    }
}
