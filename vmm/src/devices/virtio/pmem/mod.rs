//! virtio-pmem (virtio 1.2, 5.19): a file mapped into guest physical memory, which the guest
//! reads and writes with loads and stores (no request, no exit), and one queue for its flush
//! request, served on the devices thread (fdatasync of the file). The configuration space is
//! the region's guest address and size (le64 each); where the region lies is the launch's
//! choice ([`crate::launch`]: above RAM and the memory hotplug area, a KVM memory slot of its
//! own).

pub mod mapping;
pub mod request;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{
    serve_available, signal_used, Activation, DeviceDirtyLog, DeviceHealth, MemoryView,
    QueueCounters, VirtioDevice, VirtioError, VirtioInterrupt, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::event_loop::Subscriber;
pub use mapping::{PmemError, PmemMapping};
use request::{Request, REQ_FLUSH, RESP_EIO, RESP_OK};

/// virtio device type of persistent memory.
pub const TYPE_PMEM: u32 = 27;
const QUEUE_SIZE: u16 = 256;

/// What the device counts beyond its queue.
#[derive(Debug, Default)]
pub struct PmemCounters {
    pub flushes: AtomicU64,
    pub failed_flushes: AtomicU64,
    /// Requests of a type other than FLUSH (answered EIO).
    pub unknown_requests: AtomicU64,
}

/// The virtio-pmem device model.
pub struct Pmem {
    mapping: Arc<PmemMapping>,
    /// Guest physical address of the region.
    gpa: u64,
    queue_counters: Arc<[QueueCounters]>,
    counters: Arc<PmemCounters>,
}

impl Pmem {
    /// The device for `mapping`, which the guest sees at `gpa`.
    pub fn new(mapping: Arc<PmemMapping>, gpa: u64) -> Self {
        Pmem {
            mapping,
            gpa,
            queue_counters: Arc::from(vec![QueueCounters::default()]),
            counters: Arc::default(),
        }
    }
}

impl VirtioDevice for Pmem {
    fn device_type(&self) -> u32 {
        TYPE_PMEM
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut space = [0u8; 16];
        space[..8].copy_from_slice(&self.gpa.to_le_bytes());
        space[8..].copy_from_slice(&self.mapping.len().to_le_bytes());
        data.fill(0);
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        if let Some(src) = space.get(start..start.saturating_add(data.len())) {
            data.copy_from_slice(src);
        }
    }

    /// The configuration space is read-only.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn activate(&mut self, mut a: Activation) -> Result<Subscriber, VirtioError> {
        let Some(q) = a.queues.pop().filter(|q| q.index == 0) else {
            return Err(VirtioError::QueueCount {
                device: a.health.name().to_string(),
                want: 1,
                got: a.queues.len(),
            });
        };
        Ok(Arc::new(Mutex::new(PmemWorker {
            queue: q.queue,
            notify: q.notify,
            mem: MemoryView::new(a.mem),
            interrupt: a.interrupt,
            queue_counters: self.queue_counters.clone(),
            counters: self.counters.clone(),
            health: a.health,
            dirty: a.dirty,
            mapping: self.mapping.clone(),
        })))
    }

    fn snapshot_support(&self) -> Result<(), String> {
        Err("a virtio-pmem region (its file's mapping and place) is not saved yet".into())
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.queue_counters.clone()
    }

    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("flushes", l(&self.counters.flushes)),
            ("failed_flushes", l(&self.counters.failed_flushes)),
            ("unknown_requests", l(&self.counters.unknown_requests)),
        ]
    }
}

/// The queue's work, on the devices thread.
struct PmemWorker {
    queue: Queue,
    notify: Arc<EventFd>,
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    queue_counters: Arc<[QueueCounters]>,
    counters: Arc<PmemCounters>,
    health: Arc<DeviceHealth>,
    dirty: Arc<DeviceDirtyLog>,
    mapping: Arc<PmemMapping>,
}

/// Does request `r` (a flush syncs the file) and writes its answer; the used length (4).
fn answer(
    r: Request,
    mem: &GuestMemoryMmap,
    mapping: &PmemMapping,
    counters: &PmemCounters,
    health: &DeviceHealth,
) -> Option<u32> {
    let ret = if r.kind != REQ_FLUSH {
        counters.unknown_requests.fetch_add(1, Ordering::Relaxed);
        let kind = r.kind;
        health.log.log(|| {
            format!(
                "{}: request type {kind} is not FLUSH; answered EIO",
                health.name()
            )
        });
        RESP_EIO
    } else if let Err(e) = mapping.sync() {
        counters.failed_flushes.fetch_add(1, Ordering::Relaxed);
        health
            .log
            .log(|| format!("{}: the flush failed: {e}", health.name()));
        RESP_EIO
    } else {
        counters.flushes.fetch_add(1, Ordering::Relaxed);
        RESP_OK
    };
    mem.write_obj(ret.to_le(), r.answer).ok()?;
    Some(4)
}

impl PmemWorker {
    fn serve(&mut self) {
        self.mem.refresh();
        let (mem, qc) = (self.mem.get(), &self.queue_counters[0]);
        let (mapping, counters, health) = (&self.mapping, &self.counters, &self.health);
        let dirty = &self.dirty;
        let completed = serve_available((&mut self.queue, 0), mem, (qc, health, dirty), |chain| {
            let r = request::parse(chain, mem)?;
            answer(r, mem, mapping, counters, health)
        });
        if completed {
            signal_used(&mut self.queue, mem, self.interrupt.as_ref(), 0, qc);
        }
    }
}

impl MutEventSubscriber for PmemWorker {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        if self.notify.read().is_ok() {
            QueueCounters::add(&self.queue_counters[0].notifies, 1);
        }
        self.serve();
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.notify, EventSet::IN)) {
            let name = self.health.name().to_string();
            self.health
                .log
                .log(|| format!("{name}: cannot watch queue notifications: {e}"));
        }
        self.serve();
    }
}
