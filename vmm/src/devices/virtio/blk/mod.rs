//! virtio-blk over a raw image file. Requests are parsed and checked on the device event loop
//! ([`request`]), then all of them go to the host at once through asynchronous I/O ([`io`]:
//! io_uring, or a thread pool); completions are batched into one interrupt where the ring
//! allows (event idx). Nothing runs on a vCPU thread, and with ioeventfd notify and MSI-X a
//! request costs no exit to userspace.
//!
//! Durability follows the features the driver accepted (see docs/durability.md): with
//! VIRTIO_BLK_F_FLUSH writes complete from the host's page cache and FLUSH makes them durable;
//! without it every write completes only once its data is on stable storage (write-through).

pub mod direct;
pub mod image;
pub mod io;
pub mod request;
mod resize;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use thiserror::Error;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{
    Activation, DeviceDirtyLog, DeviceHealth, MemoryView, QueueCounters, StallGuard, VirtioDevice,
    VirtioError, VirtioInterrupt, TYPE_BLOCK, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::config::DiskConfig;
use crate::event_loop::Subscriber;
use direct::{Alignment, Bounce};
use io::{Completion, DiskIo, IoKind, IoOp, Iovecs};
use request::{DiskShape, Op, Refused, Request, ID_LEN, MAX_REQUEST_BYTES, SECTOR};

/// Entries of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Bytes of requests' data in flight on the host at once; past it requests wait in the ring.
/// Bounce buffers (direct=on with unaligned guest buffers) are the host memory it bounds.
pub const MAX_INFLIGHT_BYTES: u64 = MAX_REQUEST_BYTES;
const F_SIZE_MAX: u64 = 1 << 1;
const F_SEG_MAX: u64 = 1 << 2;
const F_RO: u64 = 1 << 5;
const F_BLK_SIZE: u64 = 1 << 6;
const F_FLUSH: u64 = 1 << 9;

/// Errors opening a disk.
#[derive(Debug, Error)]
pub enum BlockError {
    #[error("Cannot open disk {path}: {error}")]
    Open { path: String, error: std::io::Error },
    #[error("Disk {path} is {size} bytes, not a whole number of 512-byte sectors")]
    Size { path: String, size: u64 },
    #[error("Disk {0}: the file system refuses direct I/O (O_DIRECT); direct=off works")]
    DirectRefused(String),
    #[error("Disk {path} is in use: {holder} holds a lock on it (lock=off shares it on purpose)")]
    Locked { path: String, holder: String },
    #[error("Cannot lock disk {path}: {error}")]
    Lock { path: String, error: std::io::Error },
    #[error("Disk {path} is a {format} image; exitless serves raw images only")]
    Format { path: String, format: &'static str },
}

/// What the device did with the driver's requests, for tests and the bench.
#[derive(Debug, Default)]
pub struct BlockStats {
    /// Writes made write-through (completed only once durable).
    pub writes_durable: AtomicU64,
    /// fdatasyncs the device made itself for write-through writes (group commit).
    pub write_syncs: AtomicU64,
    /// Writes submitted to the page cache (the driver accepted FLUSH).
    pub writes_cached: AtomicU64,
    /// Flushes submitted (fdatasync).
    pub flushes: AtomicU64,
    /// Requests through a bounce buffer (direct=on, unaligned guest buffers).
    pub bounced: AtomicU64,
    /// Times the in-flight byte budget left requests waiting in the ring.
    pub deferred: AtomicU64,
    /// Chains refused for having more segments than seg_max.
    pub too_long: AtomicU64,
    /// Operations still on the host when the device stopped (reset, unplugged, VM stopped):
    /// cancelled, or waited for, before their buffers were let go.
    pub stopped_in_flight: AtomicU64,
    /// Of those, operations still running after the wait: their buffers were leaked.
    pub abandoned: AtomicU64,
}

impl BlockStats {
    /// The counters by name, for the profile.
    pub fn list(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        vec![
            ("writes_durable", get(&self.writes_durable)),
            ("write_syncs", get(&self.write_syncs)),
            ("writes_cached", get(&self.writes_cached)),
            ("flushes", get(&self.flushes)),
            ("bounced", get(&self.bounced)),
            ("deferred", get(&self.deferred)),
            ("too_long", get(&self.too_long)),
            ("stopped_in_flight", get(&self.stopped_in_flight)),
            ("abandoned", get(&self.abandoned)),
        ]
    }
}

/// How writes are made durable before they complete when the driver did not accept FLUSH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteThrough {
    /// Each write carries RWF_DSYNC.
    Dsync,
    /// Writes go to the page cache; once some completed, one fdatasync covers them all and
    /// they complete after it (group commit). The default: see docs/durability.md.
    GroupSync,
}

/// The virtio-blk device model.
pub struct Block {
    file: Arc<File>,
    /// direct=on: what the image's O_DIRECT needs of guest buffers.
    direct: Option<Alignment>,
    shape: DiskShape,
    id: [u8; ID_LEN],
    config: [u8; 24],
    /// The image's size now, shared with the queue work (`vm.resize-disk` grows it).
    capacity: Arc<AtomicU64>,
    thread_pool: bool,
    write_through: WriteThrough,
    counters: Arc<[QueueCounters]>,
    stats: Arc<BlockStats>,
    /// The image's path, when the device holds its lock (lock=on).
    locked: Option<String>,
}

impl Block {
    /// Opens the image (read-only when the config says so; O_DIRECT with direct=on).
    pub fn open(disk: &DiskConfig) -> Result<Self, BlockError> {
        let path = disk.path.display().to_string();
        let open_err = |error| BlockError::Open {
            path: path.clone(),
            error,
        };
        let (file, direct) = if disk.direct {
            let (file, align) = direct::open(&disk.path, disk.readonly)?;
            (file, Some(align))
        } else {
            let file = OpenOptions::new()
                .read(true)
                .write(!disk.readonly)
                .open(&disk.path)
                .map_err(open_err)?;
            (file, None)
        };
        if disk.lock {
            image::lock(&file, &path, disk.readonly)?;
        }
        if disk.probe_format {
            if let Some(format) = image::probe_format(&file).map_err(open_err)? {
                return Err(BlockError::Format { path, format });
            }
        }
        let meta = file.metadata().map_err(open_err)?;
        let size = meta.len();
        if size % SECTOR != 0 {
            return Err(BlockError::Size { path, size });
        }
        // A serial the guest can tell disks apart by: the image's device and inode.
        let serial = format!("{:x}-{:x}", meta.dev(), meta.ino());
        let mut id = [0u8; ID_LEN];
        let n = serial.len().min(ID_LEN);
        id[..n].copy_from_slice(&serial.as_bytes()[..n]);
        let mut config = [0u8; 24];
        config[0..8].copy_from_slice(&(size / SECTOR).to_le_bytes());
        config[8..12].copy_from_slice(&request::SIZE_MAX.to_le_bytes());
        config[12..16].copy_from_slice(&request::SEG_MAX.to_le_bytes());
        config[20..24].copy_from_slice(&(SECTOR as u32).to_le_bytes());
        Ok(Block {
            file: Arc::new(file),
            direct,
            shape: DiskShape {
                capacity_bytes: size,
                readonly: disk.readonly,
            },
            id,
            config,
            capacity: Arc::new(AtomicU64::new(size)),
            thread_pool: false,
            write_through: WriteThrough::GroupSync,
            counters: Arc::from(vec![QueueCounters::default()]),
            stats: Arc::default(),
            locked: disk.lock.then_some(path),
        })
    }

    /// Makes write-through writes durable this way (to compare, and in tests).
    pub fn with_write_through(mut self, how: WriteThrough) -> Self {
        self.write_through = how;
        self
    }

    /// What the device did with the requests so far.
    pub fn stats(&self) -> Arc<BlockStats> {
        self.stats.clone()
    }

    /// Uses the thread pool even where io_uring works (to compare, and in tests).
    pub fn with_thread_pool(mut self) -> Self {
        self.thread_pool = true;
        self
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        TYPE_BLOCK
    }

    /// The image's lock (lock=on), let go of for a destination on this host and taken back
    /// when the migration failed.
    fn image_lock(&self, held: bool) -> Result<(), String> {
        let Some(path) = &self.locked else {
            return Ok(());
        };
        match held {
            true => image::lock(&self.file, path, self.shape.readonly).map_err(|e| e.to_string()),
            false => image::unlock(&self.file).map_err(|e| format!("unlocking {path}: {e}")),
        }
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }
    fn features(&self) -> u64 {
        let ro = if self.shape.readonly { F_RO } else { 0 };
        VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_EVENT_IDX
            | VIRTIO_RING_F_INDIRECT_DESC
            | F_SIZE_MAX
            | F_SEG_MAX
            | F_BLK_SIZE
            | F_FLUSH
            | ro
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = self.config.get(offset as usize + i).copied().unwrap_or(0);
        }
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn resize(&mut self, bytes: u64) -> Result<bool, String> {
        self.grow(bytes)
    }

    /// Its configuration is read-only and made anew from the config; every request
    /// completes before a snapshot (the transport waits for the rings to drain).
    fn snapshot_support(&self) -> Result<(), String> {
        Ok(())
    }

    fn activate(&mut self, mut a: Activation) -> Result<Subscriber, VirtioError> {
        let got = a.queues.len();
        let Some(q) = a.queues.pop().filter(|q| q.index == 0 && got == 1) else {
            let device = "virtio-blk".into();
            return Err(VirtioError::QueueCount {
                device,
                want: 1,
                got,
            });
        };
        let io = DiskIo::new(self.file.clone(), self.thread_pool, u32::from(QUEUE_SIZE)).map_err(
            |e| VirtioError::Backend {
                device: "virtio-blk".into(),
                message: e.to_string(),
            },
        )?;
        let size = usize::from(q.queue.size());
        let worker = BlockWorker {
            io,
            queue: q.queue,
            notify: q.notify,
            mem: MemoryView::new(a.mem),
            interrupt: a.interrupt,
            counters: self.counters.clone(),
            stats: self.stats.clone(),
            shape: self.shape,
            capacity: self.capacity.clone(),
            id: self.id,
            write_through: (a.features & F_FLUSH == 0).then_some(self.write_through),
            group: GroupSync::default(),
            direct: self.direct,
            inflight: (0..size).map(|_| None).collect(),
            free: (0..size as u32).rev().collect(),
            inflight_bytes: 0,
            deferred: false,
            warned_io: false,
            health: a.health,
            dirty: a.dirty,
        };
        Ok(Arc::new(Mutex::new(worker)))
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.counters.clone()
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        self.stats.list()
    }
}

/// A request on the host, with the buffers its I/O uses.
struct InFlight {
    request: Request,
    op: IoOp,
    /// The host buffer the I/O uses instead of the guest's (copied back after a read).
    bounce: Option<Bounce>,
}

/// The queue's work, on the event loop. Dropping it (the device reset, unplugged, or its VM
/// stopped) first quiesces `io` (see its `Drop`): no operation outlives the bounce buffers and
/// the guest memory it points into.
struct BlockWorker {
    io: DiskIo,
    queue: Queue,
    notify: Arc<EventFd>,
    /// Refreshed at each event (memory may have been hot-added).
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    stats: Arc<BlockStats>,
    shape: DiskShape,
    /// The image's size now (it grows while the queue runs: `vm.resize-disk`).
    capacity: Arc<AtomicU64>,
    id: [u8; ID_LEN],
    /// The driver did not accept FLUSH: every write completes only once durable, made so
    /// this way.
    write_through: Option<WriteThrough>,
    group: GroupSync,
    direct: Option<Alignment>,
    inflight: Vec<Option<InFlight>>,
    free: Vec<u32>,
    /// Data bytes of the requests in `inflight`, at most MAX_INFLIGHT_BYTES (or one request).
    inflight_bytes: u64,
    /// Requests wait in the ring for in-flight ones to complete.
    deferred: bool,
    warned_io: bool,
    health: Arc<DeviceHealth>,
    dirty: Arc<DeviceDirtyLog>,
}

impl Drop for BlockWorker {
    /// Every operation in flight is cancelled and reaped before the buffers go (the transport
    /// drops the worker before the status register reads 0). One the host still runs after
    /// [`io::QUIESCE_BOUND`] keeps its buffers for good: its bounce buffer and this worker's
    /// map of guest memory are leaked, not freed under the kernel.
    fn drop(&mut self) {
        let q = self.io.quiesce(io::QUIESCE_BOUND);
        let ended = (q.reaped + q.left) as u64;
        QueueCounters::add(&self.stats.stopped_in_flight, ended);
        if q.left == 0 {
            return;
        }
        QueueCounters::add(&self.stats.abandoned, q.left as u64);
        eprintln!(
            "virtio-blk: {} disk operations still running {:?} after the device stopped; their buffers are left allocated",
            q.left,
            io::QUIESCE_BOUND
        );
        std::mem::forget(std::mem::take(&mut self.inflight));
        std::mem::forget(self.mem.current());
    }
}

/// Write-through writes that completed in the cache and wait for the device's fdatasync.
#[derive(Default)]
struct GroupSync {
    /// Waiting for the next sync.
    waiting: Vec<Request>,
    /// Covered by the running sync (which started after each of them completed).
    running: Vec<Request>,
    in_flight: bool,
}

#[cfg(test)]
mod durability_tests;
mod group_sync;
#[cfg(test)]
mod tests;

mod worker;
