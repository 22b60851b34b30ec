//! The virtio functions of `snapshot_state`: each saved virtio device's state handed to a real
//! device of its kind (virtio-rng, virtio-blk on a scratch image, virtio-vsock on a scratch
//! socket, virtio-balloon with free page reporting) behind a real virtio-pci transport, on
//! 1 MiB of guest memory and an event loop of its own, as a restore does: the transport's
//! parser (registers, queues, MSI-X table) and the device's own (the balloon's) both run. A
//! device restored running starts on its rings, then is shut down again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::GuestMemoryMmap;

use vmm::config::{BalloonConfig, DiskConfig, VsockConfig};
use vmm::devices::virtio::balloon::Balloon;
use vmm::devices::virtio::blk::Block;
use vmm::devices::virtio::rng::Rng;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::vsock::{SocketFile, Vsock};
use vmm::devices::virtio::{SharedGuestMemory, VirtioDevice};
use vmm::event_loop::EventLoop;
use vmm::snapshot::Snapshottable;

/// Where a function's BAR is when made (what an untouched device's saved BAR must say).
const BAR: u64 = 0xc000_0000;

/// A scratch file or socket path of this process, `n`th of its kind.
fn scratch(what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("exitless-fuzz-{what}-{}-{n}", std::process::id());
    std::env::temp_dir().join(name)
}

/// The device model of `kind`, and the socket file that must live as long as it.
fn model(kind: &str) -> Option<(Box<dyn VirtioDevice>, Option<SocketFile>)> {
    Some(match kind {
        "virtio-rng" => (Box::new(Rng::new()), None),
        "virtio-balloon" => {
            let config: BalloonConfig =
                serde_json::from_value(serde_json::json!({"free_page_reporting": true})).ok()?;
            (Box::new(Balloon::new(&config)), None)
        }
        "virtio-blk" => {
            let path = scratch("disk");
            std::fs::File::create(&path).ok()?.set_len(1 << 20).ok()?;
            let config = serde_json::json!({"path": path, "lock": false});
            let config: DiskConfig = serde_json::from_value(config).ok()?;
            let block = Block::open(&config);
            let _ = std::fs::remove_file(&path);
            (Box::new(block.ok()?), None)
        }
        "virtio-vsock" => {
            let config = serde_json::json!({"cid": 3, "socket": scratch("vsock")});
            let config: VsockConfig = serde_json::from_value(config).ok()?;
            let (vsock, file) = Vsock::new(&config).ok()?;
            (Box::new(vsock), Some(file))
        }
        _ => return None,
    })
}

/// Virtio functions made on demand, all on one memory and event loop.
pub struct VirtioFunctions {
    mem: GuestMemoryMmap,
    event_loop: Option<EventLoop>,
    made: Vec<(Arc<VirtioPciDevice>, Option<SocketFile>)>,
}

impl VirtioFunctions {
    pub fn new(mem: GuestMemoryMmap) -> Self {
        VirtioFunctions {
            mem,
            event_loop: None,
            made: Vec::new(),
        }
    }

    /// A function of `kind` made anew, or None for a kind that is not virtio's.
    pub fn device(&mut self, kind: &str) -> Option<Arc<dyn Snapshottable>> {
        let (device, keep) = model(kind)?;
        if self.event_loop.is_none() {
            // A fuzzing process is not a VMM: its sanitizer runtime makes calls the device
            // thread's filter does not list.
            vmm::seccomp::disable();
            self.event_loop = Some(EventLoop::start().ok()?);
        }
        let handle = self.event_loop.as_ref()?.handle();
        let shared = SharedGuestMemory::new(self.mem.clone());
        let dev = VirtioPciDevice::new(kind, device, BAR, shared, handle).ok()?;
        self.made.push((dev.clone(), keep));
        Some(dev)
    }
}

impl Drop for VirtioFunctions {
    /// Each device stops as a removed one does (a worker a restore started goes).
    fn drop(&mut self) {
        for (dev, _) in &self.made {
            dev.shut_down();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed of a hot-plugged VM's snapshot (its rings moved into the 1 MiB): its disk
    /// and balloon are restored running by real devices, the balloon's own state taken; a
    /// kind that is not virtio's gets no device.
    #[test]
    fn saved_virtio_devices_reach_real_devices() {
        let seed = include_bytes!("../../../fuzz/corpus/snapshot_state/seed-hotplugged");
        let state: serde_json::Value = serde_json::from_slice(seed).unwrap();
        let mut functions = VirtioFunctions::new(super::super::small_memory().unwrap());
        assert!(functions.device("serial").is_none());
        for id in ["_disk0", "_balloon0", "virtio-rng"] {
            let mut saved = state["devices"][id]["state"].clone();
            let queues = saved.pointer_mut("/transport/common/queues");
            if let Some(queues) = queues.and_then(|q| q.as_array_mut()) {
                for (i, q) in queues.iter_mut().enumerate() {
                    for (k, at) in [(3, 0x1000), (4, 0x2000), (5, 0x3000)] {
                        q[k] = serde_json::json!(at + i * 0x4000);
                    }
                }
            }
            let kind = state["devices"][id]["kind"].as_str().unwrap();
            let dev = functions.device(kind).unwrap();
            dev.restore(saved.clone())
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            if id == "_balloon0" {
                saved["transport"]["device"] = serde_json::json!({"actual_pages": 1});
                let e = functions.device(kind).unwrap().restore(saved).unwrap_err();
                assert!(e.contains("missing field"), "{e}");
            }
        }
    }
}
