//! What a snapshot saves of a virtio-pci device today: that its driver never touched it (no
//! configuration or BAR write since power-on), so the device made anew from the config on
//! restore is the same. A device its driver has set up is refused by name; saving the
//! transport, queues and device state is the next step (docs/snapshot.md, "Devices").

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{lock, VirtioPciDevice};
use crate::devices::virtio::{TYPE_BALLOON, TYPE_BLOCK, TYPE_FS, TYPE_NET, TYPE_RNG, TYPE_VSOCK};
use crate::snapshot::{from_state, to_state, Snapshottable};

/// A device in its power-on state, at the BAR address the VM gave it (a restored VM that
/// placed it elsewhere is refused).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UntouchedState {
    untouched: bool,
    bar: u64,
}

impl VirtioPciDevice {
    /// Whether the guest has written the device's configuration space or BAR.
    pub fn touched(&self) -> bool {
        self.touched.load(Ordering::Relaxed)
    }
}

impl Snapshottable for VirtioPciDevice {
    fn kind(&self) -> &'static str {
        match lock(&self.transport).device.device_type() {
            TYPE_NET => "virtio-net",
            TYPE_BLOCK => "virtio-blk",
            TYPE_RNG => "virtio-rng",
            TYPE_VSOCK => "virtio-vsock",
            TYPE_FS => "virtio-fs",
            TYPE_BALLOON => "virtio-balloon",
            _ => "virtio",
        }
    }

    fn snapshot(&self) -> Result<serde_json::Value, String> {
        match lock(&self.transport).device.device_type() {
            TYPE_FS => {
                return Err(
                    "a vhost-user device's state is its back end's (virtiofsd), \
                            which is not saved yet"
                        .into(),
                )
            }
            TYPE_BALLOON => {
                return Err("the balloon's state (its target and the pages it holds) \
                            is not saved yet"
                    .into())
            }
            _ => {}
        }
        if self.touched() {
            return Err(
                "its driver has set it up, and virtio device state is not saved yet \
                        (only devices the guest never touched are)"
                    .into(),
            );
        }
        let bar = lock(&self.config).bar_base(0);
        to_state(&UntouchedState {
            untouched: true,
            bar,
        })
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), String> {
        let s: UntouchedState = from_state(state)?;
        let bar = lock(&self.config).bar_base(0);
        match (s.untouched, s.bar == bar) {
            (false, _) => Err("only an untouched device can be restored".into()),
            (true, false) => Err(format!(
                "it was at BAR address {:#x}, the restored VM put it at {bar:#x}",
                s.bar
            )),
            (true, true) => Ok(()),
        }
    }
}
