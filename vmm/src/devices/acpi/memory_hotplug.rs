//! The memory hotplug controller: one slot per hot-added region of RAM. The guest selects a
//! slot (`MSEL`), reads its state (`MSTA`: enabled, being inserted) and its base and length,
//! and acknowledges an insert by writing [`INSERTING`] back. Memory is never taken back (as
//! in Cloud Hypervisor's ACPI mode): no removal request, and an eject is only counted.
//!
//! | offset | register | access |
//! |---|---|---|
//! | 0x00 | MSEL | read/write (4 bytes): the selected slot |
//! | 0x04 | MSTA | read (1 byte): [`ENABLED`], [`INSERTING`]; write: acknowledge |
//! | 0x08 | MCNT | read (4 bytes): how many slots the VM has |
//! | 0x10 | MHBL, MHBH | read (4 bytes each): the selected slot's base, low and high half |
//! | 0x18 | MHLL, MHLH | read (4 bytes each): its length, low and high half |
//!
//! A base or length may also be read 8 bytes at once at 0x10 or 0x18.

use super::put;
use crate::bus::{DeviceEvent, MutBusDevice};
use crate::devices::GuestFaults;
use crate::snapshot::{from_state, to_state, Snapshottable};

pub const MSEL: u64 = 0x00;
pub const MSTA: u64 = 0x04;
pub const MCNT: u64 = 0x08;
pub const MHBL: u64 = 0x10;
pub const MHBH: u64 = 0x14;
pub const MHLL: u64 = 0x18;
pub const MHLH: u64 = 0x1c;
/// Bytes of registers.
pub const MEMORY_HOTPLUG_LEN: u64 = 0x20;
pub const ENABLED: u8 = 1 << 0;
pub const INSERTING: u8 = 1 << 1;
/// What a guest's `_EJ0` would write: no memory is ever ejected (counted as a fault).
pub const EJECT: u8 = 1 << 3;

/// One slot: a region of RAM the VM was given while it ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    base: u64,
    len: u64,
    status: u8,
}

/// The controller's state.
#[derive(Debug)]
pub struct MemoryHotplug {
    slots: Vec<Slot>,
    selected: u32,
    faults: GuestFaults,
}

impl MemoryHotplug {
    /// A controller of `slots` empty slots.
    pub fn new(slots: usize) -> Self {
        MemoryHotplug {
            slots: vec![Slot::default(); slots],
            selected: 0,
            faults: GuestFaults::new("memory-hotplug"),
        }
    }

    /// Slot `slot` now holds `len` bytes of RAM at `base`, to be inserted by the guest.
    /// False if there is no such slot.
    pub fn region_added(&mut self, slot: usize, base: u64, len: u64) -> bool {
        let Some(s) = self.slots.get_mut(slot) else {
            return false;
        };
        *s = Slot {
            base,
            len,
            status: ENABLED | INSERTING,
        };
        true
    }

    /// Whether the guest acknowledged slot `slot`'s insert.
    pub fn acknowledged(&self, slot: usize) -> bool {
        self.slots
            .get(slot)
            .is_some_and(|s| s.status & (ENABLED | INSERTING) == ENABLED)
    }

    /// How many slots the controller has.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    pub fn faults(&self) -> u64 {
        self.faults.count()
    }

    fn selected(&self) -> Option<&Slot> {
        self.slots.get(usize::try_from(self.selected).ok()?)
    }

    /// A register's value for a read of `len` bytes, or None for an access it does not take.
    fn register(&self, offset: u64, len: usize) -> Option<u64> {
        let slot = self.selected().copied().unwrap_or_default();
        Some(match (offset, len) {
            (MSEL, 4) => u64::from(self.selected),
            (MSTA, 1) => u64::from(slot.status),
            (MCNT, 4) => self.slots.len() as u64,
            (MHBL, 4) => slot.base & 0xffff_ffff,
            (MHBH, 4) => slot.base >> 32,
            (MHLL, 4) => slot.len & 0xffff_ffff,
            (MHLH, 4) => slot.len >> 32,
            (MHBL, 8) => slot.base,
            (MHLL, 8) => slot.len,
            _ => return None,
        })
    }
}

impl MutBusDevice for MemoryHotplug {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match self.register(offset, data.len()) {
            Some(v) if data.len() == 8 => data.copy_from_slice(&v.to_le_bytes()),
            Some(v) => put(v as u32, data),
            None => {
                self.faults.record("read", offset, data.len());
                data.fill(0xff);
            }
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<DeviceEvent> {
        match (offset, data) {
            (MSEL, [a, b, c, d]) => self.selected = u32::from_le_bytes([*a, *b, *c, *d]),
            (MSTA, [bits]) => {
                let index = usize::try_from(self.selected).unwrap_or(usize::MAX);
                match self.slots.get_mut(index) {
                    Some(s) if bits & EJECT == 0 => s.status &= !(bits & INSERTING),
                    _ => self.faults.record("write", offset, data.len()),
                }
            }
            _ => self.faults.record("write", offset, data.len()),
        }
        Ok(DeviceEvent::None)
    }
}

/// The controller's saved state: the selected slot, and each slot's region and status
/// (memory hot-added while the VM ran; empty slots are all zeros).
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MemoryHotplugState {
    selected: u32,
    slots: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    regions: Vec<SlotState>,
}

/// One slot that holds memory.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotState {
    slot: usize,
    base: u64,
    len: u64,
    status: u8,
}

fn lock(m: &std::sync::Mutex<MemoryHotplug>) -> std::sync::MutexGuard<'_, MemoryHotplug> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Snapshottable for std::sync::Mutex<MemoryHotplug> {
    fn kind(&self) -> &'static str {
        "acpi-memory-hotplug"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        let c = lock(self);
        let filled = c.slots.iter().enumerate().filter(|(_, s)| s.status != 0);
        let regions = filled
            .map(|(slot, s)| SlotState {
                slot,
                base: s.base,
                len: s.len,
                status: s.status,
            })
            .collect();
        to_state(&MemoryHotplugState {
            selected: c.selected,
            slots: c.slots.len(),
            regions,
        })
    }

    /// The restored VM has the slots' memory already (from the snapshot's memory section):
    /// the slots must be the ones it mapped there ([`MemoryHotplug::region_added`]).
    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: MemoryHotplugState = from_state(state)?;
        let mut c = lock(self);
        if s.slots != c.slots.len() {
            return Err(format!(
                "it had {} slots, the restored VM has {}",
                s.slots,
                c.slots.len()
            ));
        }
        let mut slots = vec![Slot::default(); c.slots.len()];
        for r in &s.regions {
            let mapped = c.slots.get(r.slot).filter(|m| m.status != 0);
            match mapped {
                Some(m) if m.base == r.base && m.len == r.len && r.status & ENABLED != 0 => {
                    slots[r.slot] = Slot {
                        base: r.base,
                        len: r.len,
                        status: r.status & (ENABLED | INSERTING),
                    }
                }
                _ => {
                    return Err(format!(
                        "slot {} held {:#x} bytes at {:#x}, which the restored VM's memory \
                         does not have there",
                        r.slot, r.len, r.base
                    ))
                }
            }
        }
        if let Some(i) = (0..slots.len()).find(|&i| c.slots[i].status != 0 && slots[i].status == 0)
        {
            return Err(format!(
                "state.json has nothing in slot {i}, which holds memory"
            ));
        }
        c.slots = slots;
        c.selected = s.selected;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(c: &mut MemoryHotplug, at: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        c.read(at, &mut b[..len]);
        u64::from_le_bytes(b)
    }

    fn select(c: &mut MemoryHotplug, slot: u32) {
        c.write(MSEL, &slot.to_le_bytes()).unwrap();
    }

    #[test]
    fn an_insert_is_seen_with_its_range_and_acknowledged() {
        let mut c = MemoryHotplug::new(4);
        assert_eq!(read(&mut c, MCNT, 4), 4);
        select(&mut c, 1);
        assert_eq!(read(&mut c, MSTA, 1), 0, "an empty slot");
        assert!(c.region_added(1, 0x1_1000_0000, 0x1_0000_0000));
        assert!(!c.region_added(4, 0, 1 << 27), "no slot 4");
        assert_eq!(read(&mut c, MSEL, 4), 1);
        assert_eq!(read(&mut c, MSTA, 1), u64::from(ENABLED | INSERTING));
        assert_eq!(
            (read(&mut c, MHBL, 4), read(&mut c, MHBH, 4)),
            (0x1000_0000, 1)
        );
        assert_eq!((read(&mut c, MHLL, 4), read(&mut c, MHLH, 4)), (0, 1));
        assert_eq!(read(&mut c, MHBL, 8), 0x1_1000_0000);
        assert_eq!(read(&mut c, MHLL, 8), 0x1_0000_0000);
        assert!(!c.acknowledged(1));
        c.write(MSTA, &[INSERTING]).unwrap();
        assert_eq!(read(&mut c, MSTA, 1), u64::from(ENABLED));
        assert!(c.acknowledged(1));
        // Writing the enabled bit does not disable the slot.
        c.write(MSTA, &[ENABLED]).unwrap();
        assert_eq!(read(&mut c, MSTA, 1), u64::from(ENABLED));
        assert_eq!(c.faults(), 0);
    }

    #[test]
    fn ejects_and_odd_accesses_are_counted() {
        let mut c = MemoryHotplug::new(2);
        assert!(c.region_added(0, 1 << 32, 1 << 27));
        c.write(MSTA, &[EJECT]).unwrap();
        assert_eq!(read(&mut c, MSTA, 1), u64::from(ENABLED | INSERTING));
        select(&mut c, 9);
        assert_eq!(read(&mut c, MSTA, 1), 0, "past the last slot: empty");
        c.write(MSTA, &[INSERTING]).unwrap();
        assert_eq!(read(&mut c, MHBL, 2), 0xffff);
        c.write(0x40, &[1]).unwrap();
        c.write(MSEL, &[1]).unwrap();
        assert_eq!(c.faults(), 5);
    }

    /// A slot holding memory is saved with its region and status, and restored onto a VM
    /// whose memory has that region in that slot; anything else is refused.
    #[test]
    fn slots_holding_memory_are_saved_and_restored_onto_the_same_regions() {
        use std::sync::Mutex;
        let region = |slots: usize, slot: usize| {
            let mut c = MemoryHotplug::new(slots);
            assert!(c.region_added(slot, 1 << 32, 1 << 27));
            Mutex::new(c)
        };
        let saved_vm = region(4, 1);
        select(&mut lock(&saved_vm), 1);
        lock(&saved_vm).write(MSTA, &[INSERTING]).unwrap();
        let saved = saved_vm.snapshot().unwrap();
        let restored = region(4, 1);
        restored.restore(saved.clone()).unwrap();
        let mut c = lock(&restored);
        assert!(c.acknowledged(1), "the guest's acknowledgement kept");
        assert_eq!(read(&mut c, MSEL, 4), 1);
        assert_eq!(read(&mut c, MHBL, 8), 1 << 32);
        drop(c);
        let e = Mutex::new(MemoryHotplug::new(4)).restore(saved.clone());
        assert!(e
            .unwrap_err()
            .contains("slot 1 held 0x8000000 bytes at 0x100000000"));
        let e = region(4, 2).restore(saved.clone()).unwrap_err();
        assert!(e.contains("slot 1 held"), "{e}");
        let e = region(8, 1).restore(saved).unwrap_err();
        assert!(e.contains("it had 4 slots"), "{e}");
    }
}
