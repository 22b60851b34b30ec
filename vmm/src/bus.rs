//! The I/O and MMIO buses: address ranges mapped to devices.
//!
//! A [`BusBuilder`] takes devices and rejects overlapping ranges. Freezing it gives a [`Bus`]:
//! a sorted `Vec` searched without any lock on the exit path. Devices are reached through
//! `&self` and choose their own locking: a state machine with `&mut self` accesses
//! ([`MutBusDevice`]) sits in a `Mutex`, taken only for the access itself; a device with
//! several ranges registers one small object per range, so it knows which range was hit.
//!
//! A bus never changes in place. When the guest moves a device (a PCI BAR), a new `Bus` is
//! built and published through [`SharedBuses`]; each vCPU keeps its own snapshot and only
//! compares a generation counter per exit (a read of a line nobody writes while the layout
//! holds still), so the exit path gains no lock and no shared write.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
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
    /// Show this exit, with a value, to the vCPU's exit observer if it has one (the lab's
    /// markers); without one the guest just goes on. See [`crate::vcpu::ExitObserver`].
    Observe(u32),
}

/// A device on a bus, reached from any vCPU thread. `offset` is relative to the start of the
/// range that was hit.
///
/// Guest-caused faults (bad offsets, unsupported widths) are counted and logged by the device;
/// an `Err` means the host failed in a way the VM cannot go on from.
pub trait BusDevice: Send + Sync {
    /// The guest reads `data.len()` bytes at `offset`.
    fn read(&self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset`.
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent>;
}

/// A device model as a plain state machine (`&mut self`, vm-superio style): put it in a
/// `Mutex` to place it on a bus.
pub trait MutBusDevice: Send {
    /// The guest reads `data.len()` bytes at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent>;
}

impl<T: MutBusDevice> BusDevice for Mutex<T> {
    fn read(&self, offset: u64, data: &mut [u8]) {
        lock(self).read(offset, data);
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        lock(self).write(offset, data)
    }
}

/// A device shared between the bus and whoever set it up.
pub type SharedDevice = Arc<dyn BusDevice>;

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
    #[error("No bus range has id {0}")]
    UnknownId(usize),
}

/// One mapped range.
#[derive(Clone)]
pub struct BusRange {
    pub base: u64,
    pub len: u64,
    pub name: String,
    /// Stable id on its bus (the order ranges were first inserted): it survives moves, so the
    /// profile can count per device across layout changes.
    pub id: usize,
    pub device: SharedDevice,
}

impl BusRange {
    fn end(&self) -> u64 {
        self.base + self.len
    }
}

/// A bus being set up (or rebuilt from a [`Bus`] to change its layout).
///
/// One of the lab's entry points: the bench's own devices and the fuzz targets' buses.
#[derive(Default)]
pub struct BusBuilder {
    ranges: Vec<BusRange>,
    next_id: usize,
}

impl BusBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `device` at `[base, base + len)` under a new id (returned); fails if the range
    /// overlaps one already mapped.
    pub fn insert(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        device: SharedDevice,
    ) -> Result<usize, BusError> {
        let id = self.next_id;
        self.insert_with_id(name, base, len, device, id)?;
        self.next_id += 1;
        Ok(id)
    }

    /// Moves the range `id` to `new_base` (its length and device stay); fails, leaving the
    /// builder unchanged, when the new place overlaps another range or `id` is unknown.
    pub fn relocate(&mut self, id: usize, new_base: u64) -> Result<(), BusError> {
        let at = self
            .ranges
            .iter()
            .position(|r| r.id == id)
            .ok_or(BusError::UnknownId(id))?;
        let old = self.ranges.remove(at);
        let moved = self.insert_with_id(&old.name, new_base, old.len, old.device.clone(), id);
        if moved.is_err() {
            self.ranges.insert(at, old);
        }
        moved
    }

    /// Unmaps the range `id` (a device removed while the VM runs); its id is not reused.
    pub fn remove(&mut self, id: usize) -> Result<SharedDevice, BusError> {
        let at = self
            .ranges
            .iter()
            .position(|r| r.id == id)
            .ok_or(BusError::UnknownId(id))?;
        Ok(self.ranges.remove(at).device)
    }

    fn insert_with_id(
        &mut self,
        name: &str,
        base: u64,
        len: u64,
        device: SharedDevice,
        id: usize,
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
            id,
            device,
        });
        Ok(())
    }

    /// Ends set-up: the ranges are sorted and can no longer change.
    pub fn freeze(mut self) -> Bus {
        self.ranges.sort_by_key(|r| r.base);
        let claimed = ClaimedBlocks::of(&self.ranges);
        Bus {
            ranges: self.ranges,
            next_id: self.next_id,
            claimed,
        }
    }
}

/// Addresses below 64 Ki (every I/O port) in blocks of 16: which blocks a range touches. An
/// access to a block no device touches (a guest probing for absent hardware, the bench's
/// port) is answered without searching the ranges: one load and a bit test, 512 bytes per bus.
#[derive(Clone)]
struct ClaimedBlocks([u64; CLAIMED_WORDS]);

/// Each block covers 2^4 addresses.
const BLOCK_SHIFT: u32 = 4;
/// 64 Ki addresses / 16 per block / 64 blocks per word.
const CLAIMED_WORDS: usize = (1 << (16 - BLOCK_SHIFT)) / 64;
/// The first address the blocks do not cover.
const CLAIMED_END: u64 = 1 << 16;

impl Default for ClaimedBlocks {
    fn default() -> Self {
        ClaimedBlocks([0; CLAIMED_WORDS])
    }
}

impl ClaimedBlocks {
    fn of(ranges: &[BusRange]) -> Self {
        let mut map = ClaimedBlocks::default();
        for r in ranges.iter().filter(|r| r.base < CLAIMED_END) {
            let last = r.end().min(CLAIMED_END) - 1;
            for block in (r.base >> BLOCK_SHIFT)..=(last >> BLOCK_SHIFT) {
                map.0[(block / 64) as usize] |= 1 << (block % 64);
            }
        }
        map
    }

    /// Whether no range touches `addr`'s block (false above the blocks: not known here).
    #[inline]
    fn unclaimed(&self, addr: u64) -> bool {
        if addr >= CLAIMED_END {
            return false;
        }
        let block = addr >> BLOCK_SHIFT;
        self.0[(block / 64) as usize] & (1 << (block % 64)) == 0
    }
}

/// A frozen bus: lookups take no lock.
#[derive(Clone, Default)]
pub struct Bus {
    ranges: Vec<BusRange>,
    next_id: usize,
    claimed: ClaimedBlocks,
}

/// Result of resolving an address: the device's index on its bus and the offset into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub index: usize,
    pub offset: u64,
}

impl Bus {
    /// Finds the device mapped at `addr`, if any.
    #[inline(always)]
    pub fn resolve(&self, addr: u64) -> Option<Resolved> {
        if self.claimed.unclaimed(addr) {
            return None;
        }
        let i = self.ranges.partition_point(|r| r.base <= addr);
        let index = i.checked_sub(1)?;
        let r = &self.ranges[index];
        (addr < r.end()).then_some(Resolved {
            index,
            offset: addr - r.base,
        })
    }

    /// The mapped ranges, sorted by base.
    pub fn ranges(&self) -> &[BusRange] {
        &self.ranges
    }

    /// Range names by id: what the profile's device indexes refer to.
    pub fn names_by_id(&self) -> Vec<String> {
        let mut names = vec![String::new(); self.next_id];
        for r in &self.ranges {
            names[r.id] = r.name.clone();
        }
        names
    }

    /// A builder holding this bus's ranges and ids, to build a changed layout from.
    pub fn to_builder(&self) -> BusBuilder {
        BusBuilder {
            ranges: self.ranges.clone(),
            next_id: self.next_id,
        }
    }

    /// Reads from the device at `addr`; an unmapped address reads as all-ones.
    /// Returns the range's id when one was mapped. In the exit path's section, should it not
    /// be inlined: every exit runs it (see exitless/build.rs).
    #[inline]
    #[link_section = ".text.hot.exitless_exit_path"]
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Option<usize> {
        match self.resolve(addr) {
            Some(Resolved { index, offset }) => {
                let range = &self.ranges[index];
                range.device.read(offset, data);
                Some(range.id)
            }
            None => {
                data.fill(0xff);
                None
            }
        }
    }

    /// Writes to the device at `addr`; returns the range's id and what the device asks for.
    /// `Ok(None)` means the address is unmapped. In the exit path's section, as `read`.
    #[inline]
    #[link_section = ".text.hot.exitless_exit_path"]
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<Option<(usize, DeviceEvent)>> {
        match self.resolve(addr) {
            Some(Resolved { index, offset }) => {
                let range = &self.ranges[index];
                let ev = range.device.write(offset, data)?;
                Ok(Some((range.id, ev)))
            }
            None => Ok(None),
        }
    }
}

/// A VM's two buses.
///
/// One of the lab's entry points (the fuzz targets' buses).
#[derive(Clone, Default)]
pub struct Buses {
    pub pio: Bus,
    pub mmio: Bus,
}

/// The buses of a running VM as its vCPUs see them: the published layout and its generation.
#[derive(Default)]
pub struct SharedBuses {
    /// Read by every vCPU on every exit, written only when the layout changes: on a cache
    /// line of its own, away from the mutex that publishing writes.
    generation: CachePadded<AtomicU64>,
    current: Mutex<Arc<Buses>>,
}

impl SharedBuses {
    pub fn new(buses: Buses) -> Self {
        Self {
            generation: CachePadded::new(AtomicU64::new(0)),
            current: Mutex::new(Arc::new(buses)),
        }
    }

    /// The layout's generation now.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current layout and its generation.
    pub fn snapshot(&self) -> BusSnapshot {
        let current = lock(&self.current);
        BusSnapshot {
            generation: self.generation.load(Ordering::Acquire),
            buses: current.clone(),
        }
    }

    /// Publishes a layout built from the current one by `change`; on error nothing changes.
    /// vCPUs pick it up at their next exit.
    pub fn update(
        &self,
        change: impl FnOnce(&Buses) -> Result<Buses, BusError>,
    ) -> Result<(), BusError> {
        let mut current = lock(&self.current);
        *current = Arc::new(change(&current)?);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// One vCPU's copy of the layout.
#[derive(Clone)]
pub struct BusSnapshot {
    generation: u64,
    buses: Arc<Buses>,
}

impl BusSnapshot {
    /// The buses of this copy, as they were when it was taken.
    pub fn buses(&self) -> &Buses {
        &self.buses
    }

    /// The buses, refreshed first when the layout changed since this copy was taken.
    #[inline]
    pub fn current(&mut self, shared: &SharedBuses) -> &Buses {
        if shared.generation() != self.generation {
            self.refresh(shared);
        }
        &self.buses
    }

    /// Takes the published layout: cold, so that the vCPU loop's code for an exit does not
    /// hold the lock, the reference counts and the drop of the old layout in its way.
    #[cold]
    #[inline(never)]
    fn refresh(&mut self, shared: &SharedBuses) {
        *self = shared.snapshot();
    }
}

/// Locks a device; a device whose holder panicked is still used (its state is plain data).
fn lock<T>(device: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    device.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Latch {
        last: Vec<(u64, Vec<u8>)>,
    }

    impl MutBusDevice for Latch {
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
    fn ports_in_blocks_no_device_touches_resolve_to_nothing_and_the_others_still_do() {
        let mut b = BusBuilder::new();
        b.insert("com1", 0x3f8, 8, dev()).unwrap();
        b.insert("wide", 0x5ff, 0x12, dev()).unwrap();
        b.insert("mmio", 0xd000_0000, 0x1000, dev()).unwrap();
        b.insert("edge", 0xfff8, 0x10, dev()).unwrap();
        let bus = b.freeze();
        // Mapped addresses, at the first and last byte of each range.
        for (addr, index, offset) in [
            (0x3f8, 0, 0),
            (0x3ff, 0, 7),
            (0x5ff, 1, 0),
            (0x610, 1, 0x11),
            (0xfff8, 2, 0),
            (0x1_0007, 2, 0xf),
            (0xd000_0fff, 3, 0xfff),
        ] {
            assert_eq!(
                bus.resolve(addr),
                Some(Resolved { index, offset }),
                "{addr:#x}"
            );
        }
        // Unmapped: in an untouched block, in a touched block beside a range, above 64 Ki.
        for addr in [
            0x0,
            0x7e0,
            0x3f7,
            0x5fe,
            0x611,
            0xfff7,
            0x1_0008,
            0xc000_0000,
        ] {
            assert_eq!(bus.resolve(addr), None, "{addr:#x}");
        }
        assert!(bus.claimed.unclaimed(0x7e0) && !bus.claimed.unclaimed(0x3f0));
        // A moved range moves its blocks.
        let mut b = bus.to_builder();
        b.relocate(0, 0x7e0).unwrap();
        let bus = b.freeze();
        assert!(bus.resolve(0x7e3).is_some() && bus.resolve(0x3f8).is_none());
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
    fn relocated_ranges_keep_their_id_and_snapshots_follow_the_generation() {
        let latch = Arc::new(Mutex::new(Latch::default()));
        let mut pio = BusBuilder::new();
        let a = pio.insert("a", 0x100, 0x10, latch.clone()).unwrap();
        let b = pio.insert("b", 0x10, 0x10, dev()).unwrap();
        let shared = SharedBuses::new(Buses {
            pio: pio.freeze(),
            mmio: Bus::default(),
        });
        let mut snap = shared.snapshot();
        assert_eq!(
            snap.current(&shared)
                .pio
                .write(0x101, &[1])
                .unwrap()
                .unwrap()
                .0,
            a
        );
        // Moving onto another range fails and changes nothing.
        let onto_b = shared.update(|old| {
            let mut pio = old.pio.to_builder();
            pio.relocate(a, 0x18)?;
            Ok(Buses {
                pio: pio.freeze(),
                mmio: old.mmio.clone(),
            })
        });
        assert!(matches!(onto_b, Err(BusError::Overlap { .. })));
        assert_eq!(shared.generation(), 0);
        shared
            .update(|old| {
                let mut pio = old.pio.to_builder();
                pio.relocate(a, 0x200)?;
                Ok(Buses {
                    pio: pio.freeze(),
                    mmio: old.mmio.clone(),
                })
            })
            .unwrap();
        assert_eq!(shared.generation(), 1);
        let buses = snap.current(&shared);
        assert_eq!(buses.pio.write(0x101, &[2]).unwrap(), None);
        assert_eq!(buses.pio.write(0x20f, &[3]).unwrap().unwrap().0, a);
        assert_eq!(buses.pio.names_by_id(), vec!["a", "b"]);
        assert_eq!(buses.pio.resolve(0x10).map(|r| r.offset), Some(0));
        assert_eq!(
            latch.lock().unwrap().last,
            vec![(1, vec![1]), (0xf, vec![3])]
        );
        let _ = b;
        let mut bad = Bus::default().to_builder();
        assert_eq!(bad.relocate(9, 0), Err(BusError::UnknownId(9)));
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
