//! The CPU hotplug controller: the guest selects a CPU by id (`CSEL`) and reads its state
//! (`CSTA`: present, being inserted, being removed), acknowledges an insert or a removal
//! request by writing the bit back, and ejects the CPU by writing [`EJECT`].
//!
//! | offset | register | access |
//! |---|---|---|
//! | 0x0 | CSEL | read/write: the selected CPU id |
//! | 0x4 | CSTA | read: [`PRESENT`], [`INSERTING`], [`REMOVING`]; write: acknowledge, [`EJECT`] |
//! | 0x8 | CCNT | read: how many CPUs the VM may have |

use std::sync::Arc;

use super::{put, value, PendingEjects};
use crate::bus::{DeviceEvent, MutBusDevice};
use crate::devices::GuestFaults;
use crate::snapshot::{from_state, to_state, Snapshottable};

pub const CSEL: u64 = 0x0;
pub const CSTA: u64 = 0x4;
pub const CCNT: u64 = 0x8;
pub use super::layout::{EJECT, INSERTING, PRESENT, REMOVING};

/// The controller's state, by CPU id.
#[derive(Debug)]
pub struct CpuHotplug {
    state: Vec<u8>,
    /// CPUs the guest was asked to give back, until it ejected them (host-side only).
    asked: Vec<u8>,
    selected: u32,
    ejected: Arc<PendingEjects>,
    faults: GuestFaults,
}

impl CpuHotplug {
    /// `max` possible CPUs, the first `boot` present; ejects go to `ejected`.
    pub fn new(boot: u8, max: u8, ejected: Arc<PendingEjects>) -> Self {
        let state = (0..max)
            .map(|i| if i < boot { PRESENT } else { 0 })
            .collect();
        CpuHotplug {
            state,
            asked: Vec::new(),
            selected: 0,
            ejected,
            faults: GuestFaults::new("cpu-hotplug"),
        }
    }

    /// CPU `id` was added (its vCPU waits for the guest's INIT/SIPI).
    pub fn cpu_added(&mut self, id: u8) {
        if let Some(s) = self.state.get_mut(usize::from(id)) {
            *s = PRESENT | INSERTING;
        }
        self.asked.retain(|a| *a != id);
    }

    /// The guest is asked to give CPU `id` back.
    pub fn removal_requested(&mut self, id: u8) {
        if let Some(s) = self.state.get_mut(usize::from(id)) {
            *s |= REMOVING;
            if *s & PRESENT != 0 && !self.asked.contains(&id) {
                self.asked.push(id);
            }
        }
    }

    /// CPU `id` is gone (the guest ejected it).
    pub fn removal_done(&mut self, id: u8) {
        self.asked.retain(|a| *a != id);
    }

    /// The CPUs asked back and not yet ejected.
    pub fn asked(&self) -> &[u8] {
        &self.asked
    }

    /// Whether CPU `id` is present.
    pub fn present(&self, id: u8) -> bool {
        self.state
            .get(usize::from(id))
            .is_some_and(|s| s & PRESENT != 0)
    }

    pub fn faults(&self) -> u64 {
        self.faults.count()
    }

    fn selected(&mut self) -> Option<(u8, &mut u8)> {
        let id = u8::try_from(self.selected).ok()?;
        Some((id, self.state.get_mut(usize::from(id))?))
    }
}

impl MutBusDevice for CpuHotplug {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let v = match (offset, data.len()) {
            (CSEL, 4) => self.selected,
            (CSTA, 1) => self.selected().map_or(0, |(_, s)| u32::from(*s)),
            (CCNT, 4) => self.state.len() as u32,
            _ => {
                self.faults.record("read", offset, data.len());
                u32::MAX
            }
        };
        put(v, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<DeviceEvent> {
        match (offset, data.len()) {
            (CSEL, 4) => self.selected = value(data),
            (CSTA, 1) => {
                let bits = data[0];
                let ejected = self.ejected.clone();
                if let Some((id, s)) = self.selected() {
                    *s &= !(bits & (INSERTING | REMOVING));
                    if bits & EJECT != 0 && *s & PRESENT != 0 {
                        *s = 0;
                        ejected.eject_cpu(id);
                    }
                }
            }
            _ => self.faults.record("write", offset, data.len()),
        }
        Ok(DeviceEvent::None)
    }
}

/// The controller's saved registers: the selected CPU and each CPU's status bits.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CpuHotplugState {
    selected: u32,
    cpus: Vec<u8>,
    /// CPUs asked back and not yet ejected (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    asked: Vec<u8>,
}

fn lock(m: &std::sync::Mutex<CpuHotplug>) -> std::sync::MutexGuard<'_, CpuHotplug> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Snapshottable for std::sync::Mutex<CpuHotplug> {
    fn kind(&self) -> &'static str {
        "acpi-cpu-hotplug"
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        let c = lock(self);
        to_state(&CpuHotplugState {
            selected: c.selected,
            cpus: c.state.clone(),
            asked: c.asked.clone(),
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: CpuHotplugState = from_state(state)?;
        let mut c = lock(self);
        if s.cpus.len() != c.state.len() {
            return Err(format!(
                "{} CPUs saved for a controller of {}",
                s.cpus.len(),
                c.state.len()
            ));
        }
        let absent = s.asked.iter().find(|&&id| {
            let status = s.cpus.get(usize::from(id)).copied().unwrap_or(0);
            status & PRESENT == 0
        });
        if let Some(id) = absent {
            return Err(format!("CPU {id} saved as asked back, but not present"));
        }
        c.selected = s.selected;
        c.state = s.cpus;
        c.asked = s.asked;
        c.asked.dedup();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Ejected;
    use super::*;

    fn status(c: &mut CpuHotplug, id: u32) -> u8 {
        c.write(CSEL, &id.to_le_bytes()).unwrap();
        let mut b = [0u8];
        c.read(CSTA, &mut b);
        b[0]
    }

    #[test]
    fn an_insert_is_seen_acknowledged_and_an_eject_reported() {
        let pending = Arc::new(PendingEjects::default());
        let mut c = CpuHotplug::new(1, 4, pending.clone());
        let mut n = [0u8; 4];
        c.read(CCNT, &mut n);
        assert_eq!(u32::from_le_bytes(n), 4);
        assert_eq!((status(&mut c, 0), status(&mut c, 1)), (PRESENT, 0));
        c.cpu_added(1);
        assert_eq!(status(&mut c, 1), PRESENT | INSERTING);
        c.write(CSTA, &[INSERTING]).unwrap();
        assert_eq!(status(&mut c, 1), PRESENT);
        c.removal_requested(1);
        assert_eq!(status(&mut c, 1), PRESENT | REMOVING);
        c.write(CSTA, &[REMOVING | EJECT]).unwrap();
        assert_eq!(status(&mut c, 1), 0);
        assert!(!c.present(1));
        assert_eq!(pending.take(), vec![Ejected::Cpu(1)]);
        // Ejecting an absent CPU, or one past the end, does nothing.
        c.write(CSTA, &[EJECT]).unwrap();
        assert_eq!(status(&mut c, 200), 0);
        c.write(CSTA, &[EJECT]).unwrap();
        assert!(pending.take().is_empty());
    }

    /// A CPU asked back stays asked (saved with the controller) until the guest ejects it;
    /// a saved one that is not present is refused.
    #[test]
    fn cpus_asked_back_are_saved_until_ejected() {
        let c = std::sync::Mutex::new(CpuHotplug::new(2, 4, Arc::default()));
        lock(&c).removal_requested(1);
        lock(&c).removal_requested(1);
        lock(&c).removal_requested(3);
        assert_eq!(lock(&c).asked(), [1], "CPU 3 is not present");
        let saved = c.snapshot().unwrap();
        assert_eq!(saved["asked"], serde_json::json!([1]));
        let restored = std::sync::Mutex::new(CpuHotplug::new(2, 4, Arc::default()));
        restored.restore(saved.clone()).unwrap();
        assert_eq!(lock(&restored).asked(), [1]);
        lock(&restored).removal_done(1);
        assert!(lock(&restored).asked().is_empty());
        let mut absent = saved;
        absent["asked"] = serde_json::json!([3]);
        let e = restored.restore(absent).unwrap_err();
        assert!(e.contains("CPU 3 saved as asked back"), "{e}");
    }
}
