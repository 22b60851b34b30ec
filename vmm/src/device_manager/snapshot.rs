//! The devices a snapshot saves: each registers under its id as it is added, and the whole
//! set is saved into, and restored from, `state.json`'s `devices` map (docs/snapshot.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{routing_lock, DeviceManager};
use crate::snapshot::format::PciPlace;
use crate::snapshot::{DeviceEntry, SnapshotError, Snapshottable};

impl DeviceManager {
    /// Makes `device` part of every snapshot under `id`.
    pub fn register_snapshottable(&mut self, id: &str, device: Arc<dyn Snapshottable>) {
        self.snapshottable.push((id.to_string(), device));
    }

    /// Whether devices were added or removed since the VM started.
    pub fn hotplugged(&self) -> bool {
        self.hotplugged
    }

    /// Where each PCI function is: its slot and the BAR address it was given.
    pub(super) fn place_of(&self, name: &str) -> Option<PciPlace> {
        let placed = self.virtio.iter().find(|p| p.device.name() == name)?;
        let slots = routing_lock(&self.mapper.slots);
        let bar = slots.get(&placed.slot)?.addr;
        Some(PciPlace {
            slot: placed.slot,
            bar,
        })
    }

    /// Before the devices of a restore are added: each PCI function named in `saved` goes
    /// to the slot and BAR address it had (else the config's order decides, as at a boot).
    pub fn restore_places(&mut self, saved: &BTreeMap<String, DeviceEntry>) {
        let placed = saved
            .iter()
            .filter_map(|(id, e)| Some((id.clone(), e.pci?)));
        self.places = placed.collect();
    }

    /// Every device's state by id; the first device that cannot be saved fails it, by name.
    pub fn snapshot_devices(&self) -> Result<BTreeMap<String, DeviceEntry>, SnapshotError> {
        let mut all = BTreeMap::new();
        for (id, device) in &self.snapshottable {
            let kind = device.kind();
            let state = device.snapshot().map_err(|reason| SnapshotError::Device {
                id: id.clone(),
                kind: kind.into(),
                reason,
            })?;
            let data = device
                .take_data()
                .map(|bytes| crate::snapshot::device_data::describe(id, bytes))
                .transpose()
                .map_err(|reason| SnapshotError::Device {
                    id: id.clone(),
                    kind: kind.into(),
                    reason,
                })?;
            let entry = DeviceEntry {
                kind: kind.into(),
                state,
                data,
                pci: self.place_of(id),
            };
            if all.insert(id.clone(), entry).is_some() {
                return Err(SnapshotError::Device {
                    id: id.clone(),
                    kind: kind.into(),
                    reason: "another device has the same id".into(),
                });
            }
        }
        Ok(all)
    }

    /// Tells every device the snapshot is over (written or not): devices that held still
    /// for it go on.
    pub fn snapshot_ended(&self) {
        for (_, device) in &self.snapshottable {
            device.snapshot_ended();
        }
    }

    /// Puts each device's saved state back. The saved set must be this VM's: a device
    /// without saved state, saved state without its device, or another kind is refused.
    pub fn restore_devices(
        &self,
        mut saved: BTreeMap<String, DeviceEntry>,
    ) -> Result<(), SnapshotError> {
        for (id, device) in &self.snapshottable {
            let kind = device.kind();
            let invalid = |reason: String| SnapshotError::DeviceState {
                id: id.clone(),
                kind: kind.into(),
                reason,
            };
            let entry = saved
                .remove(id)
                .ok_or_else(|| invalid("state.json has no state for it".into()))?;
            if entry.kind != kind {
                return Err(invalid(format!("state.json saved a {} there", entry.kind)));
            }
            if let Some(data) = entry.data {
                device.put_data(data.bytes).map_err(invalid)?;
            }
            device.restore(entry.state).map_err(invalid)?;
        }
        // A BAR the guest had moved is where it put it: its range and ioeventfds follow.
        for placed in &self.virtio {
            let to = placed.device.bar_base();
            self.mapper
                .follow_bar(placed.slot, to)
                .map_err(|e| SnapshotError::DeviceState {
                    id: placed.device.name().to_string(),
                    kind: placed.device.kind().into(),
                    reason: format!("its BAR cannot go back to {to:#x}: {e}"),
                })?;
        }
        match saved.into_iter().next() {
            Some((id, entry)) => Err(SnapshotError::Mismatch(format!(
                "state.json has device {id} ({}), which config.json does not describe",
                entry.kind
            ))),
            None => Ok(()),
        }
    }
}
