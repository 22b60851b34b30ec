//! virtio-net over a tap. One receive and one transmit queue, served on the device event loop:
//! frames the kernel sends out of the tap are read there and copied into the guest's receive
//! buffers (merged across buffers with `VIRTIO_NET_F_MRG_RXBUF`); frames the guest queues are
//! written to the tap. The 12-byte virtio-net header travels on the tap as it is
//! (`IFF_VNET_HDR`), so checksum and segmentation offloads pass through where the tap takes
//! them. With ioeventfd notifies and MSI-X no frame costs an exit to userspace.
//!
//! A frame that finds no receive buffer waits: the device holds the one frame it read and
//! stops reading the tap (the rest wait in the tap's own queue, which the kernel bounds) until
//! the guest posts buffers and notifies the queue, as it is asked to. A frame the tap cannot
//! take yet waits with its chain until the tap is writable. A guest that stops taking frames
//! never blocks the VMM nor grows its memory; frames are dropped (`rx_dropped`) only when no
//! chain could ever hold them, or while a snapshot is being taken.

pub mod private_net;
pub mod tap;
#[cfg(test)]
mod tests;
pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_net as vn;

use super::running::RunningWorker;
use super::{
    Activation, QueueCounters, VirtioDevice, VirtioError, TYPE_NET, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::config::NetConfig;
use crate::event_loop::Subscriber;
use tap::{Tap, TapError, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN};
use worker::NetWorker;

/// Entries of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Queue indexes.
pub const RX: u16 = 0;
pub const TX: u16 = 1;

const fn bit(b: u32) -> u64 {
    1 << b
}

/// Offload features offered when the tap takes them.
const OFFLOADS: u64 = bit(vn::VIRTIO_NET_F_CSUM)
    | bit(vn::VIRTIO_NET_F_GUEST_CSUM)
    | bit(vn::VIRTIO_NET_F_GUEST_TSO4)
    | bit(vn::VIRTIO_NET_F_GUEST_TSO6)
    | bit(vn::VIRTIO_NET_F_GUEST_ECN)
    | bit(vn::VIRTIO_NET_F_HOST_TSO4)
    | bit(vn::VIRTIO_NET_F_HOST_TSO6)
    | bit(vn::VIRTIO_NET_F_HOST_ECN);
/// `VIRTIO_NET_F_MRG_RXBUF`: a received frame may span several receive chains.
pub const F_MRG_RXBUF: u64 = bit(vn::VIRTIO_NET_F_MRG_RXBUF);
const F_MAC: u64 = bit(vn::VIRTIO_NET_F_MAC);
const F_STATUS: u64 = bit(vn::VIRTIO_NET_F_STATUS);
const LINK_UP: u16 = 1;

/// What a net device counted beyond its queues, written on the event loop only.
#[derive(Debug, Default)]
pub struct NetCounters {
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames the tap gave that no receive chain could hold (too small without merged
    /// buffers, or the whole ring too small), or that came while a snapshot was taken.
    pub rx_dropped: AtomicU64,
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Frames the tap refused (interface down, a bad header): completed, not sent.
    pub tx_errors: AtomicU64,
}

impl NetCounters {
    fn list(&self) -> Vec<(&'static str, u64)> {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("rx_frames", l(&self.rx_frames)),
            ("rx_bytes", l(&self.rx_bytes)),
            ("rx_dropped", l(&self.rx_dropped)),
            ("tx_frames", l(&self.tx_frames)),
            ("tx_bytes", l(&self.tx_bytes)),
            ("tx_errors", l(&self.tx_errors)),
        ]
    }
}

/// The virtio-net device model.
pub struct Net {
    tap: Arc<Tap>,
    mac: [u8; 6],
    counters: Arc<[QueueCounters]>,
    net: Arc<NetCounters>,
    /// The queue work while the device runs (the event loop owns it), for a snapshot.
    worker: RunningWorker<NetWorker>,
}

/// A locally administered unicast MAC derived from the tap's name (stable across runs).
pub fn default_mac(tap: &str) -> [u8; 6] {
    let mut h: u32 = 0x811c_9dc5;
    for b in tap.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let [a, b, c, _] = h.to_le_bytes();
    [0x52, 0x54, 0x00, a, b, c]
}

impl Net {
    /// Opens the tap the config names.
    pub fn open(config: &NetConfig) -> Result<Self, TapError> {
        let tap = match &config.tap_fd {
            // A duplicate: the config keeps its fd for a reboot.
            Some(fd) => Tap::from_fd(fd.0.try_clone().map_err(TapError::NotTap)?)?,
            None => Tap::open(&config.tap)?,
        };
        let mac = config.mac.map_or_else(|| default_mac(tap.name()), |m| m.0);
        Ok(Self::with_tap(tap, mac))
    }

    /// A device on an already open tap.
    pub fn with_tap(tap: Tap, mac: [u8; 6]) -> Self {
        Net {
            tap: Arc::new(tap),
            mac,
            counters: Arc::from(vec![QueueCounters::default(), QueueCounters::default()]),
            net: Arc::default(),
            worker: RunningWorker::default(),
        }
    }

    /// Frame counters beyond the queues'.
    pub fn net_counters(&self) -> Arc<NetCounters> {
        self.net.clone()
    }
}

/// `TUNSETOFFLOAD` flags for what the driver accepted.
fn tap_offloads(features: u64) -> u32 {
    let mut flags = 0;
    for (feature, flag) in [
        (vn::VIRTIO_NET_F_GUEST_CSUM, TUN_F_CSUM),
        (vn::VIRTIO_NET_F_GUEST_TSO4, TUN_F_TSO4),
        (vn::VIRTIO_NET_F_GUEST_TSO6, TUN_F_TSO6),
        (vn::VIRTIO_NET_F_GUEST_ECN, TUN_F_TSO_ECN),
    ] {
        if features & bit(feature) != 0 {
            flags |= flag;
        }
    }
    // Segmentation offloads mean nothing to the kernel without checksum offload.
    if flags & TUN_F_CSUM == 0 {
        flags = 0;
    }
    flags
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        TYPE_NET
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }
    fn features(&self) -> u64 {
        let base = VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_EVENT_IDX
            | VIRTIO_RING_F_INDIRECT_DESC
            | F_MAC
            | F_STATUS
            | F_MRG_RXBUF;
        if self.tap.supports_offloads() {
            base | OFFLOADS
        } else {
            base
        }
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // mac[6], status (le16).
        let mut config = [0u8; 8];
        config[..6].copy_from_slice(&self.mac);
        config[6..].copy_from_slice(&LINK_UP.to_le_bytes());
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| config.get(o.checked_add(i)?))
                .copied()
                .unwrap_or(0);
        }
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        // The MAC is read-only without VIRTIO_NET_F_CTRL_MAC_ADDR.
    }

    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        let mut queues = a.queues;
        queues.sort_by_key(|q| q.index);
        let got = queues.len();
        let indexes: Vec<u16> = queues.iter().map(|q| q.index).collect();
        if indexes != [RX, TX] {
            return Err(VirtioError::QueueCount {
                device: "virtio-net".into(),
                want: 2,
                got,
            });
        }
        if let Err(e) = self.tap.set_offloads(tap_offloads(a.features)) {
            return Err(VirtioError::Backend {
                device: "virtio-net".into(),
                message: format!("Tap {} refused the offloads: {e}", self.tap.name()),
            });
        }
        let tx = queues.pop().expect("two queues");
        let rx = queues.pop().expect("two queues");
        let worker = NetWorker::new(
            rx,
            tx,
            self.tap.clone(),
            a.mem,
            a.interrupt,
            self.counters.clone(),
            self.net.clone(),
            a.features & F_MRG_RXBUF != 0,
            (a.health, a.dirty),
        );
        Ok(self.worker.start(worker))
    }

    fn reset(&mut self) {
        self.worker.stop();
    }

    /// Its configuration (the MAC) is made anew from the config and the tap opened again by
    /// name; transmit chains drain, receive buffers are given back (the worker's
    /// [`quiesce`](super::running::QuiesceWorker::quiesce)).
    fn snapshot_support(&self) -> Result<(), String> {
        Ok(())
    }

    fn prefilled_queues(&self) -> &[u16] {
        &[RX]
    }

    fn quiesce(&mut self) -> Result<(), String> {
        self.worker.quiesce()
    }

    fn unquiesce(&mut self) {
        self.worker.unquiesce();
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.counters.clone()
    }

    /// The tap, let go of for a destination on this host (which opens it by name) and
    /// taken back when the migration failed: the worker, on the devices thread, stops
    /// watching it before it is closed here, and watches it again once it is opened anew
    /// here (the devices thread may not open files).
    fn image_lock(&self, held: bool) -> Result<(), String> {
        let name = self.tap.name();
        if held {
            self.tap.retake().map_err(|e| e.to_string())?;
            self.worker.with(|w| w.wake());
            return Ok(());
        }
        self.tap.ask_release();
        if self.worker.with(|w| w.wake()).is_some() {
            let limit = std::time::Duration::from_secs(5);
            (self.tap.wait_unwatched(limit)).map_err(|e| format!("tap {name}: {e}"))?;
        }
        (self.tap.release()).map_err(|e| format!("letting go of tap {name}: {e}"))
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.net.list()
    }
}
