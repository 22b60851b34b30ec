//! The I/O and MMIO buses: address ranges mapped to devices, frozen after set-up.
//!
//! A [`BusBuilder`] takes devices during VM set-up and rejects overlapping ranges. Freezing it
//! gives a [`Bus`]: a sorted `Vec` searched without any lock on the exit path; each device
//! sits behind its own mutex, taken only for the access itself.

use std::io;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// What a device asks of the vCPU loop after an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    /// Nothing: the guest goes on.
    None,
    /// The guest asked for a reset (e.g. i8042 pulse of the reset line).
    Reset,
    /// The guest asked to power off, with a status code.
    Shutdown(u32),
    /// A bench-guest marker (begin/end of a measured loop); the loop snapshots its counters.
    Marker(u32),
}

/// A device on a bus. `offset` is relative to the start of the device's range.
///
/// Guest-caused faults (bad offsets, unsupported widths) are counted and logged by the device;
/// an `Err` means the host failed (e.g. the serial output could not be written).
pub trait BusDevice: Send {
    /// The guest reads `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent>;
}

/// A device shared between the bus and whoever set it up.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Errors building a bus.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BusError {
    #[error("Range {base:#x}+{len:#x} of {name} overlaps {other}")]
    Overlap {
        name: String,
        other: String,
        base: u64,
        len: u64,
    },
    #[error("Range of {0} is empty or wraps around")]
    BadRange(String),
}

/// One mapped range.
#[derive(Clone)]
pub struct BusRange {
    pub base: u64,
    pub len: u64,
    pub name: String,
    pub device: SharedDevice,
}

impl BusRange {
    fn end(&self) -> u64 {
        self.base + self.len
    }
}

/// A bus being set up.
#[derive(Default)]
pub struct BusBuilder {
    ranges: Vec<BusRange>,
}

impl BusBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `device` at `[base, base + len)`; fails if the range overlaps one already mapped.
    pub fn insert(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        device: SharedDevice,
    ) -> Result<(), BusError> {
        if len == 0 || base.checked_add(len).is_none() {
            return Err(BusError::BadRange(name.to_string()));
        }
        if let Some(other) = self
            .ranges
            .iter()
            .find(|r| base < r.end() && r.base < base + len)
        {
            return Err(BusError::Overlap {
                name: name.to_string(),
                other: other.name.clone(),
                base,
                len,
            });
        }
        self.ranges.push(BusRange {
            base,
            len,
            name: name.to_string(),
            device,
        });
        Ok(())
    }

    /// Ends set-up: the ranges are sorted and can no longer change.
    pub fn freeze(mut self) -> Bus {
        self.ranges.sort_by_key(|r| r.base);
        Bus {
            ranges: self.ranges,
        }
    }
}

/// A frozen bus: lookups take no lock.
#[derive(Clone, Default)]
pub struct Bus {
    ranges: Vec<BusRange>,
}

/// Result of resolving an address: the device's index on its bus and the offset into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub index: usize,
    pub offset: u64,
}

impl Bus {
    /// Finds the device mapped at `addr`, if any.
    #[inline]
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        let i = self.ranges.partition_point(|r| r.base <= addr);
        let index = i.checked_sub(1)?;
        let r = &self.ranges[index];
        (addr < r.end()).then_some(Resolved {
            index,
            offset: addr - r.base,
        })
    }

    /// The mapped ranges, sorted by base (device names are reported by index).
    pub fn ranges(&self) -> &[BusRange] {
        &self.ranges
    }

    /// Reads from the device at `addr`; an unmapped address reads as all-ones.
    /// Returns the device index when one was mapped.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Option<usize> {
        match self.resolve(addr) {
            Some(Resolved { index, offset }) => {
                lock(&self.ranges[index].device).read(offset, data);
                Some(index)
            }
            None => {
                data.fill(0xff);
                None
            }
        }
    }

    /// Writes to the device at `addr`. `Ok(None)` means the address is unmapped.
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<Option<(usize, DeviceEvent)>> {
        match self.resolve(addr) {
            Some(Resolved { index, offset }) => {
                let ev = lock(&self.ranges[index].device).write(offset, data)?;
                Ok(Some((index, ev)))
            }
            None => Ok(None),
        }
    }
}

/// Locks a device; a device whose holder panicked is still used (its state is plain data).
fn lock(device: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Latch {
        last: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Latch {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
            self.last.push((offset, data.to_vec()));
            Ok(DeviceEvent::None)
        }
    }

    fn dev() -> SharedDevice {
        Arc::new(Mutex::new(Latch::default()))
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        let mut b = BusBuilder::new();
        b.insert("a", 0x100, 0x10, dev()).unwrap();
        let e = b.insert("b", 0x10f, 1, dev()).unwrap_err();
        assert!(matches!(e, BusError::Overlap { ref other, .. } if other == "a"));
        assert!(b.insert("c", 0xf8, 0x9, dev()).is_err());
        b.insert("d", 0x110, 1, dev()).unwrap();
        b.insert("e", 0xf0, 0x10, dev()).unwrap();
    }

    #[test]
    fn empty_or_wrapping_ranges_are_rejected() {
        let mut b = BusBuilder::new();
        assert!(matches!(
            b.insert("a", 0, 0, dev()),
            Err(BusError::BadRange(_))
        ));
        assert!(matches!(
            b.insert("a", u64::MAX, 2, dev()),
            Err(BusError::BadRange(_))
        ));
    }

    #[test]
    fn resolve_finds_device_and_offset() {
        let mut b = BusBuilder::new();
        b.insert("hi", 0x3f8, 8, dev()).unwrap();
        b.insert("lo", 0x60, 1, dev()).unwrap();
        let bus = b.freeze();
        assert_eq!(
            bus.resolve(0x3fa),
            Some(Resolved {
                index: 1,
                offset: 2
            })
        );
        assert_eq!(
            bus.resolve(0x60),
            Some(Resolved {
                index: 0,
                offset: 0
            })
        );
        assert_eq!(bus.resolve(0x61), None);
        assert_eq!(bus.resolve(0x400), None);
        assert_eq!(bus.resolve(0), None);
    }

    #[test]
    fn unmapped_reads_are_all_ones_and_writes_report_unmapped() {
        let bus = BusBuilder::new().freeze();
        let mut d = [0u8; 4];
        assert_eq!(bus.read(0x80, &mut d), None);
        assert_eq!(d, [0xff; 4]);
        assert_eq!(bus.write(0x80, &[1]).unwrap(), None);
    }

    #[test]
    fn accesses_reach_the_device() {
        let latch = Arc::new(Mutex::new(Latch::default()));
        let mut b = BusBuilder::new();
        b.insert("l", 0x1000, 0x100, latch.clone()).unwrap();
        let bus = b.freeze();
        let mut d = [0u8; 2];
        assert_eq!(bus.read(0x1004, &mut d), Some(0));
        assert_eq!(d, [4, 4]);
        assert_eq!(
            bus.write(0x1010, &[7, 8]).unwrap(),
            Some((0, DeviceEvent::None))
        );
        assert_eq!(latch.lock().unwrap().last, vec![(0x10, vec![7, 8])]);
    }
}
