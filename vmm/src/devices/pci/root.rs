//! Bus 0: a host bridge at 00:00.0 and devices by slot (function 0 each), with the two ways
//! to reach configuration space: mechanism #1 (ports 0xCF8-0xCFF) and ECAM (MMIO).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::config::{PciConfig, PciIds};
use super::{BarChange, BarMapper, PciDevice};
use crate::bus::{BusDevice, DeviceEvent};
use crate::snapshot::{from_state, to_state, Snapshottable};

/// Slots on bus 0.
pub const SLOTS: usize = 32;

/// The host bridge: identity, and what any function lets a guest write (the command word's
/// writable bits, the interrupt line; it has no BARs and no ROM, so sizing them changes
/// nothing).
struct HostBridge(Mutex<PciConfig>);

impl PciDevice for HostBridge {
    fn config_read(&self, offset: usize, data: &mut [u8]) {
        lock(&self.0).read(offset, data);
    }
    fn config_write(&self, offset: usize, data: &[u8]) -> Vec<BarChange> {
        lock(&self.0).write(offset, data)
    }
    fn bar_read(&self, _bar: u8, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn bar_write(&self, _bar: u8, _offset: u64, _data: &[u8]) {}
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// PCI bus 0. Devices come and go while the VM runs (hotplug); its lock is taken per
/// configuration access, which is not on a data path.
pub struct PciRoot {
    slots: Mutex<Vec<Option<Arc<dyn PciDevice>>>>,
    mapper: OnceLock<Arc<dyn BarMapper>>,
    /// Slot 0, also in `slots`: its guest-writable state goes in the snapshot.
    bridge: Arc<HostBridge>,
}

impl Default for PciRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl PciRoot {
    /// A bus with only the host bridge (slot 0).
    pub fn new() -> Self {
        let bridge = PciConfig::new(PciIds {
            vendor: 0x8086,
            device: 0x29c0,
            revision: 0,
            class: (0x06, 0x00, 0x00),
            subsystem_vendor: 0,
            subsystem: 0,
        });
        let mut slots: Vec<Option<Arc<dyn PciDevice>>> = vec![None; SLOTS];
        let bridge = Arc::new(HostBridge(Mutex::new(bridge)));
        slots[0] = Some(bridge.clone());
        PciRoot {
            slots: Mutex::new(slots),
            mapper: OnceLock::new(),
            bridge,
        }
    }

    /// Puts `device` in the first free slot; returns it (None when the bus is full).
    pub fn add(&self, device: Arc<dyn PciDevice>) -> Option<u8> {
        let mut slots = lock(&self.slots);
        let slot = slots.iter().position(Option::is_none)?;
        slots[slot] = Some(device);
        Some(slot as u8)
    }

    /// Puts `device` in `slot` (a restore puts a function back where it was); None if
    /// the slot is the host bridge's, taken, or not on the bus.
    pub fn add_at(&self, slot: u8, device: Arc<dyn PciDevice>) -> Option<u8> {
        let mut slots = lock(&self.slots);
        let free = slots.get_mut(usize::from(slot)).filter(|s| s.is_none())?;
        *free = Some(device);
        Some(slot)
    }

    /// The slots holding a function, a bit per slot (bit 0: the host bridge).
    pub fn occupied(&self) -> u32 {
        let slots = lock(&self.slots);
        (0..SLOTS)
            .filter(|&s| slots[s].is_some())
            .fold(0, |bits, s| bits | 1 << s)
    }

    /// The host bridge (slot 0), as a function.
    #[cfg(test)]
    pub fn host_bridge(&self) -> Arc<dyn PciDevice> {
        self.bridge.clone()
    }

    /// Takes the device out of `slot` (not the host bridge); the slot then reads all ones.
    pub fn remove(&self, slot: u8) -> Option<Arc<dyn PciDevice>> {
        if slot == 0 {
            return None;
        }
        lock(&self.slots).get_mut(usize::from(slot))?.take()
    }

    /// Who remaps BARs the guest moves (set once, before the guest runs).
    pub fn set_mapper(&self, mapper: Arc<dyn BarMapper>) {
        let _ = self.mapper.set(mapper);
    }

    fn device(&self, bus: u32, slot: u32, function: u32) -> Option<Arc<dyn PciDevice>> {
        if bus != 0 || function != 0 {
            return None;
        }
        lock(&self.slots).get(slot as usize)?.clone()
    }

    /// A configuration read; absent functions read as all ones.
    pub fn config_read(&self, bus: u32, slot: u32, function: u32, offset: usize, data: &mut [u8]) {
        match self.device(bus, slot, function) {
            Some(d) => d.config_read(offset, data),
            None => data.fill(0xff),
        }
    }

    /// A configuration write; moved BARs go to the mapper.
    pub fn config_write(&self, bus: u32, slot: u32, function: u32, offset: usize, data: &[u8]) {
        let Some(d) = self.device(bus, slot, function) else {
            return;
        };
        for change in d.config_write(offset, data) {
            if let Some(m) = self.mapper.get() {
                m.bar_moved(slot as u8, change);
            }
        }
    }
}

/// Configuration mechanism #1: the address register at 0xCF8, data at 0xCFC-0xCFF.
pub struct PciConfigPorts {
    root: Arc<PciRoot>,
    address: AtomicU32,
}

impl PciConfigPorts {
    pub fn new(root: Arc<PciRoot>) -> Self {
        PciConfigPorts {
            root,
            address: AtomicU32::new(0),
        }
    }

    /// (bus, slot, function, register offset) the address register selects, if enabled.
    fn target(&self, data_offset: u64) -> Option<(u32, u32, u32, usize)> {
        let a = self.address.load(Ordering::Acquire);
        (a & 0x8000_0000 != 0).then_some((
            (a >> 16) & 0xff,
            (a >> 11) & 0x1f,
            (a >> 8) & 0x7,
            (a & 0xfc) as usize + data_offset as usize,
        ))
    }
}

impl BusDevice for PciConfigPorts {
    fn read(&self, offset: u64, data: &mut [u8]) {
        match (offset, data.len()) {
            (0, 4) => data.copy_from_slice(&self.address.load(Ordering::Acquire).to_le_bytes()),
            (4..=7, _) => match self.target(offset - 4) {
                Some((b, s, f, reg)) => self.root.config_read(b, s, f, reg, data),
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        match (offset, data.len()) {
            (0, 4) => {
                let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                self.address.store(v, Ordering::Release);
            }
            (4..=7, _) => {
                if let Some((b, s, f, reg)) = self.target(offset - 4) {
                    self.root.config_write(b, s, f, reg, data);
                }
            }
            _ => {}
        }
        Ok(DeviceEvent::None)
    }
}

/// Bus 0's own state in a snapshot beyond its devices': what the guest wrote to the host
/// bridge (Linux writes every function's BARs and ROM BAR to size them, and may set its
/// command word). A snapshot made before this was saved has none: the bridge as at power-on.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RootState {
    #[serde(default)]
    bridge: Option<BridgeState>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BridgeState {
    command: u16,
    interrupt_line: u8,
}

impl Snapshottable for PciRoot {
    fn kind(&self) -> &'static str {
        "pci-root"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        let (command, interrupt_line) = lock(&self.bridge.0).guest_writable();
        to_state(&RootState {
            bridge: Some(BridgeState {
                command,
                interrupt_line,
            }),
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: RootState = from_state(state)?;
        let b = s.bridge.unwrap_or(BridgeState {
            command: 0,
            interrupt_line: 0,
        });
        lock(&self.bridge.0).set_guest_writable(b.command, b.interrupt_line);
        Ok(())
    }
}

/// The address register of configuration mechanism #1, in a snapshot.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigPortsState {
    address: u32,
}

impl Snapshottable for PciConfigPorts {
    fn kind(&self) -> &'static str {
        "pci-config-ports"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        to_state(&ConfigPortsState {
            address: self.address.load(Ordering::Acquire),
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: ConfigPortsState = from_state(state)?;
        self.address.store(s.address, Ordering::Release);
        Ok(())
    }
}

/// PCI Express enhanced configuration access (ECAM): 4 KiB per function, bus 0.
pub struct PciEcam {
    root: Arc<PciRoot>,
}

impl PciEcam {
    pub fn new(root: Arc<PciRoot>) -> Self {
        PciEcam { root }
    }
}

fn ecam_target(offset: u64) -> (u32, u32, u32, usize) {
    (
        (offset >> 20) as u32,
        ((offset >> 15) & 0x1f) as u32,
        ((offset >> 12) & 0x7) as u32,
        (offset & 0xfff) as usize,
    )
}

impl BusDevice for PciEcam {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let (b, s, f, reg) = ecam_target(offset);
        self.root.config_read(b, s, f, reg, data);
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
        let (b, s, f, reg) = ecam_target(offset);
        self.root.config_write(b, s, f, reg, data);
        Ok(DeviceEvent::None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{BarKind, PciIds};
    use super::*;

    struct Recorder(Mutex<Vec<(u8, BarChange)>>);

    impl BarMapper for Recorder {
        fn bar_moved(&self, slot: u8, change: BarChange) {
            self.0.lock().unwrap().push((slot, change));
        }
    }

    struct Plain(Mutex<PciConfig>);

    impl PciDevice for Plain {
        fn config_read(&self, offset: usize, data: &mut [u8]) {
            self.0.lock().unwrap().read(offset, data);
        }
        fn config_write(&self, offset: usize, data: &[u8]) -> Vec<BarChange> {
            self.0.lock().unwrap().write(offset, data)
        }
        fn bar_read(&self, _: u8, _: u64, _: &mut [u8]) {}
        fn bar_write(&self, _: u8, _: u64, _: &[u8]) {}
    }

    fn root_with_device() -> (Arc<PciRoot>, Arc<Recorder>) {
        let mut cfg = PciConfig::new(PciIds {
            vendor: 0x1af4,
            device: 0x1044,
            revision: 1,
            class: (0xff, 0, 0),
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        });
        cfg.set_bar(0, BarKind::Mem32, 0x1000, 0xc000_0000);
        let root = PciRoot::new();
        assert_eq!(root.add(Arc::new(Plain(Mutex::new(cfg)))), Some(1));
        let rec = Arc::new(Recorder(Mutex::new(Vec::new())));
        let root = Arc::new(root);
        root.set_mapper(rec.clone());
        (root, rec)
    }

    fn cf8(ports: &PciConfigPorts, slot: u32, reg: u32) {
        let addr = 0x8000_0000 | (slot << 11) | reg;
        ports.write(0, &addr.to_le_bytes()).unwrap();
    }

    #[test]
    fn mechanism_1_and_ecam_reach_the_same_config_space() {
        let (root, rec) = root_with_device();
        let ports = PciConfigPorts::new(root.clone());
        let ecam = PciEcam::new(root);
        let mut d = [0u8; 4];
        cf8(&ports, 1, 0);
        ports.read(4, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x1044_1af4);
        let mut w = [0u8; 2];
        ports.read(6, &mut w);
        assert_eq!(u16::from_le_bytes(w), 0x1044);
        ecam.read(1 << 15, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x1044_1af4);
        ecam.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x29c0_8086, "host bridge");
        // Absent slot, other bus, disabled address: all ones.
        ecam.read(5 << 15, &mut d);
        assert_eq!(d, [0xff; 4]);
        ecam.read(1 << 20, &mut d);
        assert_eq!(d, [0xff; 4]);
        ports.write(0, &1u32.to_le_bytes()).unwrap();
        ports.read(4, &mut d);
        assert_eq!(d, [0xff; 4]);
        // Enabling memory decoding through ECAM reports the BAR to the mapper.
        ecam.write((1 << 15) | 4, &[2, 0]).unwrap();
        let moved = rec.0.lock().unwrap().clone();
        assert_eq!(
            moved,
            [(
                1,
                BarChange {
                    bar: 0,
                    old: None,
                    new: Some(0xc000_0000)
                }
            )]
        );
        // Odd widths on the address port are ignored, never a panic.
        ports.write(1, &[1]).unwrap();
        ports.read(2, &mut [0u8; 2]);
    }

    /// Linux sizes the host bridge's BARs and ROM BAR (all ones, then the old value back) and
    /// may set its command word: a snapshot saves that, a restore puts it back.
    #[test]
    fn the_host_bridge_written_as_linux_does_is_saved_and_restored() {
        let (root, _) = root_with_device();
        let ports = PciConfigPorts::new(root.clone());
        let mut d = [0u8; 4];
        for reg in (0x10..=0x24).step_by(4).chain([0x30]) {
            cf8(&ports, 0, reg);
            ports.read(4, &mut d);
            let old = d;
            ports.write(4, &[0xff; 4]).unwrap();
            ports.read(4, &mut d);
            assert_eq!(d, [0; 4], "no BAR at {reg:#x}");
            ports.write(4, &old).unwrap();
        }
        cf8(&ports, 0, 0x04);
        ports.write(4, &[0x06, 0]).unwrap(); // memory and bus master
        cf8(&ports, 0, 0x3c);
        ports.write(4, &[11]).unwrap();
        let state = root.snapshot().expect("the bridge is saved, not refused");
        let fresh = PciRoot::new();
        fresh.restore(state).unwrap();
        for (reg, want) in [(0x04, 0x06u8), (0x3c, 11)] {
            let mut b = [0u8];
            fresh.config_read(0, 0, 0, reg, &mut b);
            assert_eq!(b[0], want, "register {reg:#x} after restore");
        }
        // A snapshot from before the bridge was saved restores it as at power-on.
        root.restore(serde_json::json!({})).unwrap();
        let mut b = [0u8];
        root.config_read(0, 0, 0, 0x04, &mut b);
        assert_eq!(b[0], 0);
    }

    /// A restore puts a function in the slot it had; a taken slot, the host bridge's and
    /// one past the bus are refused.
    #[test]
    fn add_at_puts_a_function_in_a_free_slot_only() {
        let root = PciRoot::new();
        let function: Arc<dyn PciDevice> = PciRoot::new().host_bridge();
        assert_eq!(root.add_at(5, function.clone()), Some(5));
        assert_eq!(root.occupied(), 1 | 1 << 5);
        assert_eq!(root.add_at(5, function.clone()), None);
        assert_eq!(root.add_at(0, function.clone()), None);
        assert_eq!(root.add_at(32, function.clone()), None);
        assert_eq!(
            root.add(function),
            Some(1),
            "add takes the lowest free slot"
        );
    }
}
