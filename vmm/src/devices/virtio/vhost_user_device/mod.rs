//! A virtio device whose queues and configuration space a vhost-user back end holds, exitless
//! offering only the PCI function: vhost-user-blk (a disk with `vhost_user`, served by e.g.
//! qemu-storage-daemon or SPDK) and Cloud Hypervisor's generic vhost-user device (any device
//! type, the queues the user names).
//!
//! The connection, start, stop and memory hotplug are the shared front end's
//! ([`super::vhost_user`], as for virtio-fs): kick through the queue's KVM ioeventfd, call
//! through its MSI-X irqfd, so no request passes through exitless. The configuration space
//! is read from the back end once, at connect (GET_CONFIG), and served from that copy: the
//! driver's reads never wait on the back end (they come on a vCPU thread); its writes are
//! counted and ignored (no device offered here needs them: vhost-user-blk's writeback toggle,
//! CONFIG_WCE, is not offered).

pub mod storage_daemon;
#[cfg(test)]
mod tests;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::VhostUserProtocolFeatures;

use super::vhost_user::fs::FsRegions;
use super::vhost_user::start::{Backend, StartCounters};
use super::vhost_user::{Frontend, VhostUserError, REPLY_TIMEOUT, WANTED_PROTOCOL_FEATURES};
use super::{
    Activation, QueueCounters, VirtioDevice, VirtioError, TYPE_BLOCK, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::event_loop::{EventLoopHandle, Subscriber};

/// Queue size of a vhost-user-blk disk (Cloud Hypervisor's default for one).
pub const BLK_QUEUE_SIZE: u16 = 128;
/// Bytes of virtio-blk's configuration space read from its back end: up to and including
/// `write_zeroes_may_unmap` and its padding (virtio 1.2, 5.2.4), what every back end has.
pub const BLK_CONFIG_LEN: u32 = 60;
/// The largest configuration space asked of a generic device's back end: libvhost-user's
/// limit (a larger GET_CONFIG makes QEMU's daemons close the connection).
const MAX_CONFIG_LEN: u32 = 256;
/// The ring features passed on to any driver when the back end offers them.
const RING_FEATURES: u64 =
    VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC;
/// virtio-blk's features passed on: SIZE_MAX, SEG_MAX, GEOMETRY, RO, BLK_SIZE, FLUSH,
/// TOPOLOGY, DISCARD, WRITE_ZEROES (not CONFIG_WCE: configuration writes are not forwarded;
/// not MQ: one queue is served).
const BLK_FEATURES: u64 = (1 << 1)
    | (1 << 2)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 9)
    | (1 << 10)
    | (1 << 13)
    | (1 << 14);
/// A generic device's own feature bits (0-23, virtio 1.2 section 6), all passed on.
const DEVICE_FEATURES: u64 = (1 << 24) - 1;

/// What kind of device sits on the back end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// vhost-user-blk: one queue of [`BLK_QUEUE_SIZE`], virtio-blk's features.
    Block,
    /// Cloud Hypervisor's generic vhost-user device: the virtio `device_type` and the queues
    /// named; every device feature the back end offers passed on.
    Generic {
        device_type: u32,
        queue_sizes: Vec<u16>,
    },
}

impl Kind {
    fn device_type(&self) -> u32 {
        match self {
            Kind::Block => TYPE_BLOCK,
            Kind::Generic { device_type, .. } => *device_type,
        }
    }

    fn queue_sizes(&self) -> Vec<u16> {
        match self {
            Kind::Block => vec![BLK_QUEUE_SIZE],
            Kind::Generic { queue_sizes, .. } => queue_sizes.clone(),
        }
    }

    fn passed_features(&self) -> u64 {
        match self {
            Kind::Block => RING_FEATURES | BLK_FEATURES,
            Kind::Generic { .. } => RING_FEATURES | DEVICE_FEATURES,
        }
    }
}

/// What the device counts (its queues are the back end's: exitless sees no request).
#[derive(Debug, Default)]
struct Counters {
    start: StartCounters,
    /// Driver writes to the configuration space, which are not forwarded.
    config_writes_ignored: AtomicU64,
}

/// A device served whole by a vhost-user back end.
pub struct VhostUserDevice {
    /// Shared with the device's memory listener ([`FsRegions`]), on the devices thread only.
    frontend: Arc<Mutex<Frontend>>,
    device_type: u32,
    config_space: Vec<u8>,
    queue_sizes: Vec<u16>,
    features: u64,
    /// A second handle on the socket, made at connect: what the watch of a running device
    /// registers.
    watch_socket: Arc<UnixStream>,
    gone: Arc<AtomicBool>,
    counters: Arc<Counters>,
}

impl VhostUserDevice {
    /// Connects to the back end at `socket`, negotiates and reads the configuration space.
    pub fn connect(socket: &Path, kind: Kind) -> Result<Self, VhostUserError> {
        let queues = kind.queue_sizes().len();
        let wanted = WANTED_PROTOCOL_FEATURES | VhostUserProtocolFeatures::CONFIG;
        let frontend = Frontend::connect_wanting(socket, queues, REPLY_TIMEOUT, wanted)?;
        Self::new(frontend, kind)
    }

    /// The device on a back end already connected (its configuration read here).
    pub fn new(mut frontend: Frontend, kind: Kind) -> Result<Self, VhostUserError> {
        let config_space = read_config(&mut frontend, &kind)?;
        let watch_socket = frontend
            .socket()
            .try_clone()
            .map_err(VhostUserError::Socket)?;
        Ok(VhostUserDevice {
            features: frontend.offered_features() & kind.passed_features(),
            frontend: Arc::new(Mutex::new(frontend)),
            device_type: kind.device_type(),
            config_space,
            queue_sizes: kind.queue_sizes(),
            watch_socket: Arc::new(watch_socket),
            gone: Arc::default(),
            counters: Arc::default(),
        })
    }

    /// The front end (for tests and logs).
    pub fn frontend(&self) -> MutexGuard<'_, Frontend> {
        self.frontend.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration space as read from the back end.
    pub fn config_space(&self) -> &[u8] {
        &self.config_space
    }

    /// What tells the back end of memory added while the VM runs (register it with the
    /// device manager); it does nothing once the device is gone.
    pub fn memory_listener(&self, name: &str, event_loop: EventLoopHandle) -> FsRegions {
        let frontend = Arc::downgrade(&self.frontend);
        FsRegions::new(name, frontend, self.gone.clone(), event_loop)
    }

    /// What activate and reset share with the other vhost-user devices.
    fn backend(&self) -> Backend<'_> {
        Backend {
            frontend: &self.frontend,
            watch_socket: &self.watch_socket,
            gone: &self.gone,
            counters: &self.counters.start,
        }
    }
}

/// The configuration space of a `kind` device from its back end: virtio-blk's
/// [`BLK_CONFIG_LEN`] bytes (required), a generic device's largest power of two up to 256
/// bytes the back end answers (none without CONFIG: the space reads as zeros).
fn read_config(frontend: &mut Frontend, kind: &Kind) -> Result<Vec<u8>, VhostUserError> {
    let has_config = frontend
        .protocol_features()
        .contains(VhostUserProtocolFeatures::CONFIG);
    if *kind == Kind::Block {
        return frontend
            .get_config(BLK_CONFIG_LEN)?
            .ok_or(VhostUserError::Missing(
                "virtio-blk's configuration space (GET_CONFIG of 60 bytes)",
            ));
    }
    if !has_config {
        return Ok(Vec::new());
    }
    let mut size = MAX_CONFIG_LEN;
    while size >= 4 {
        if let Some(space) = frontend.get_config(size)? {
            return Ok(space);
        }
        size /= 2;
    }
    Ok(Vec::new())
}

impl VirtioDevice for VhostUserDevice {
    fn device_type(&self) -> u32 {
        self.device_type
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(data.len());
        if let Some(src) = self.config_space.get(start..end) {
            data.copy_from_slice(src);
        }
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {
        self.counters
            .config_writes_ignored
            .fetch_add(1, Ordering::Relaxed);
    }

    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        self.backend().activate(&a).map(|(watch, _)| watch)
    }

    fn reset(&mut self) {
        self.backend().reset();
    }

    fn resets_on_stop(&self) -> bool {
        true
    }

    fn snapshot_support(&self) -> Result<(), String> {
        Err("its queues are a vhost-user back end's, whose state is not saved yet".into())
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        Arc::from(Vec::new())
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = self.counters.start.entries();
        let ignored = self.counters.config_writes_ignored.load(Ordering::Relaxed);
        counters.push(("config_writes_ignored", ignored));
        counters
    }
}
