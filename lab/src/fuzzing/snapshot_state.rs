//! `snapshot_state`: a snapshot's `state.json` from arbitrary bytes. The checked parse (version,
//! shape, checksum, fields) must refuse in one line, never panic; since a mutated file rarely
//! keeps its checksum, the shape and field checks also run without it, and each device's
//! saved state is handed to a device of its kind made anew, as a restore does: virtio
//! devices behind a real virtio-pci transport (`snapshot_virtio`).

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use vmm::devices::acpi::cpu_hotplug::CpuHotplug;
use vmm::devices::acpi::ged::Ged;
use vmm::devices::acpi::memory_hotplug::MemoryHotplug;
use vmm::devices::acpi::pci_hotplug::PciHotplug;
use vmm::devices::i8042::I8042;
use vmm::devices::pci::root::{PciConfigPorts, PciRoot};
use vmm::devices::serial::{SerialDevice, SerialOutput};
use vmm::snapshot::{SnapshotState, Snapshottable};

use super::snapshot_virtio::VirtioFunctions;

/// A device of `kind` as a restore makes it (virtio devices need a VM: not here).
fn device(kind: &str) -> Option<Arc<dyn Snapshottable>> {
    let evt = || EventFd::new(EFD_NONBLOCK).ok();
    Some(match kind {
        "serial" => Arc::new(Mutex::new(SerialDevice::new(
            evt()?,
            SerialOutput::discard(),
        ))),
        "i8042" => Arc::new(Mutex::new(I8042::new())),
        "acpi-ged" => Arc::new(Ged::new(evt()?)),
        "acpi-pci-hotplug" => Arc::new(Mutex::new(PciHotplug::new(
            Arc::new(PciRoot::new()),
            Arc::default(),
        ))),
        "acpi-cpu-hotplug" => Arc::new(Mutex::new(CpuHotplug::new(1, 4, Arc::default()))),
        "acpi-memory-hotplug" => Arc::new(Mutex::new(MemoryHotplug::new(4))),
        "pci-root" => Arc::new(PciRoot::new()),
        "pci-config-ports" => Arc::new(PciConfigPorts::new(Arc::new(PciRoot::new()))),
        _ => return None,
    })
}

pub fn snapshot_state(data: &[u8]) {
    if let Ok(mut state) = SnapshotState::parse(data) {
        // What parses writes back to the same state.
        let text = state.to_json().expect("a parsed state encodes");
        let again = SnapshotState::parse(text.as_bytes()).expect("written state parses");
        assert_eq!(again, state);
    }
    let Ok(state) = serde_json::from_slice::<SnapshotState>(data) else {
        return;
    };
    let _ = state.validate();
    let mut virtio = super::small_memory().map(VirtioFunctions::new);
    for entry in state.devices.into_values() {
        if let Some(d) = device(&entry.kind) {
            if d.restore(entry.state).is_ok() {
                d.snapshot().expect("a restored device saves its state");
            }
        } else if let Some(d) = virtio.as_mut().and_then(|v| v.device(&entry.kind)) {
            // Not saved again: a device restored running on arbitrary rings may not drain
            // them (the snapshot would wait seconds for it, then refuse).
            let _ = d.restore(entry.state);
        }
    }
}
