//! virtio 1.x devices (split virtqueues through the `virtio-queue` crate) and what they share
//! with the virtio-pci transport in front of them.
//!
//! The transport owns the registers the driver programs; when the driver sets DRIVER_OK it
//! hands the device an [`Activation`]: guest memory (shared: it grows when memory is
//! hot-added, see [`memory_view`]), the negotiated features, each enabled
//! queue with the eventfd that signals its notifications (a KVM ioeventfd, or written by the
//! transport itself on a notify exit), an [`VirtioInterrupt`] to raise the queue's MSI-X
//! vector, and the device event loop, where all queue work runs (never on a vCPU thread).

pub mod balloon;
pub mod blk;
pub mod dirty_log;
pub mod health;
pub mod memory_view;
pub mod net;
pub mod pmem;
pub mod rng;
pub mod running;
pub mod transport;
pub mod vhost_user;
pub mod vhost_user_device;
pub mod vsock;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::event_loop::Subscriber;
pub use dirty_log::DeviceDirtyLog;
pub use health::{DeviceHealth, RateLimitedLog};
pub use memory_view::{MemoryView, SharedGuestMemory};

/// Feature bit every exitless device offers and requires: virtio 1.x (no legacy interface).
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// The driver may publish used/avail event indexes to suppress notifications and interrupts.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
/// The driver may use indirect descriptor tables.
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 =
    1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;

/// virtio device type of a network card.
pub const TYPE_NET: u32 = 1;
/// virtio device type of a block device.
pub const TYPE_BLOCK: u32 = 2;
/// virtio device type of an entropy source.
pub const TYPE_RNG: u32 = 4;
/// virtio device type of a memory balloon.
pub const TYPE_BALLOON: u32 = 5;
/// virtio device type of a socket device (vsock).
pub const TYPE_VSOCK: u32 = 19;
/// virtio device type of a shared file system (virtio-fs).
pub const TYPE_FS: u32 = 26;

/// Errors activating a device.
#[derive(Debug, Error)]
pub enum VirtioError {
    #[error("{device}: driver enabled {got} queues, the device needs {want}")]
    QueueCount {
        device: String,
        want: usize,
        got: usize,
    },
    #[error("{device}: {message}")]
    Backend { device: String, message: String },
}

/// How a device tells the driver that a queue has used buffers (or its config changed).
/// Implemented by the transport: an MSI-X vector through an irqfd, held pending in the PBA
/// while masked, nothing when the driver chose no vector and polls.
pub trait VirtioInterrupt: Send + Sync {
    /// Raises the interrupt of queue `queue`; false if the driver gave the queue no vector
    /// (it polls), so nothing was raised.
    fn signal_queue(&self, queue: u16) -> io::Result<bool>;
    /// Raises the configuration-change interrupt.
    fn signal_config(&self) -> io::Result<()>;
    /// The eventfd that raises queue `queue`'s interrupt in the kernel (an irqfd of its MSI-X
    /// vector), for a process outside exitless to write (a vhost-user back end's call fd).
    /// Ok(None): the driver gave the queue no vector and polls. An error: this interrupt has
    /// no such eventfd (no in-kernel irqchip).
    fn queue_irqfd(&self, _queue: u16) -> io::Result<Option<RawFd>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the interrupt has no irqfd to hand out",
        ))
    }
}

/// One queue the driver enabled.
pub struct ActiveQueue {
    /// Index of the queue in the device.
    pub index: u16,
    /// The queue as the driver configured it (size, ring addresses, ready).
    pub queue: Queue,
    /// Becomes readable when the driver notifies the queue (shared with the transport, which
    /// registers it as the queue's ioeventfd).
    pub notify: Arc<EventFd>,
}

/// Everything a device gets when the driver sets DRIVER_OK.
pub struct Activation {
    /// The VM's guest memory, which grows when memory is hot-added: a worker serves through
    /// a [`MemoryView`] of it, refreshed at each event.
    pub mem: SharedGuestMemory,
    /// Features the driver accepted (a subset of [`VirtioDevice::features`]).
    pub features: u64,
    /// The enabled queues, by index.
    pub queues: Vec<ActiveQueue>,
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// Where the queue work reports a broken ring (the device then needs a reset).
    pub health: Arc<DeviceHealth>,
    /// The VM's log of the pages the devices write, for live migration: each completion
    /// calls [`DeviceDirtyLog::completing`] before `add_used` (one relaxed load while off).
    pub dirty: Arc<DeviceDirtyLog>,
}

/// Counters of one queue, written only by the thread serving the queue (relaxed atomics: no
/// shared write from a vCPU thread), read by the profile.
#[derive(Debug, Default)]
pub struct QueueCounters {
    /// Notifications taken (eventfd reads that found the counter non-zero).
    pub notifies: AtomicU64,
    /// Interrupts raised for this queue.
    pub interrupts: AtomicU64,
    /// Requests (descriptor chains) completed.
    pub completed: AtomicU64,
    /// Malformed chains the guest sent: answered with an error status or dropped, and counted.
    pub malformed: AtomicU64,
}

impl QueueCounters {
    /// Adds `n` to one counter (single writer: a load and a store, no locked instruction).
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }
}

/// Ends a loop over a ring that announces work it cannot hand out: a guest that sets the
/// available index past what the ring holds (or puts the ring where nothing can be read) makes
/// `enable_notification` report new chains forever while `pop_descriptor_chain` yields none.
/// Two rounds in a row that popped nothing end the loop (one such round is a guest adding a
/// chain just after the last pop): the ring is broken, the device goes to DEVICE_NEEDS_RESET
/// ([`DeviceHealth::ring_broken`]) and its queues wait for the driver's reset.
#[derive(Debug)]
pub struct StallGuard {
    queue: u16,
    idle_rounds: u8,
}

impl StallGuard {
    /// A guard for queue `queue`'s loop.
    pub fn new(queue: u16) -> Self {
        StallGuard {
            queue,
            idle_rounds: 0,
        }
    }

    /// After a round that popped `popped` chains while more were announced: whether to go on.
    pub fn go_on(
        &mut self,
        popped: usize,
        counters: &QueueCounters,
        health: &DeviceHealth,
    ) -> bool {
        if popped > 0 {
            self.idle_rounds = 0;
            return true;
        }
        self.idle_rounds += 1;
        if self.idle_rounds < 2 {
            return true;
        }
        QueueCounters::add(&counters.malformed, 1);
        health.ring_broken(self.queue);
        false
    }
}

/// Serves every chain the driver made available on queue `q`: `serve` takes one and returns
/// the length it wrote, or None for a malformed chain (completed empty and counted).
/// Notifications are off while serving and the ring is checked again after turning them back
/// on (event idx), under a [`StallGuard`]; nothing is served while the device needs a reset.
/// Returns whether any chain was completed.
pub fn serve_available(
    (queue, q): (&mut Queue, u16),
    mem: &GuestMemoryMmap,
    (counters, health, dirty): (&QueueCounters, &DeviceHealth, &DeviceDirtyLog),
    mut serve: impl FnMut(DescriptorChain<&GuestMemoryMmap>) -> Option<u32>,
) -> bool {
    let mut stall = StallGuard::new(q);
    let mut completed = false;
    loop {
        if health.needs_reset() {
            break;
        }
        if queue.disable_notification(mem).is_err() {
            break;
        }
        let mut popped = 0;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            popped += 1;
            let head = chain.head_index();
            let len = serve(chain).unwrap_or_else(|| {
                QueueCounters::add(&counters.malformed, 1);
                0
            });
            dirty.completing(mem, queue, head);
            if queue.add_used(mem, head, len).is_err() {
                QueueCounters::add(&counters.malformed, 1);
            }
            QueueCounters::add(&counters.completed, 1);
            completed = true;
        }
        if !queue.enable_notification(mem).unwrap_or(false)
            || !stall.go_on(popped, counters, health)
        {
            break;
        }
    }
    completed
}

/// Raises queue `q`'s interrupt if the driver asked for one (event idx may say no), and
/// counts it.
pub fn signal_used(
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
    interrupt: &dyn VirtioInterrupt,
    q: u16,
    counters: &QueueCounters,
) {
    if queue.needs_notification(mem).unwrap_or(true)
        && matches!(interrupt.signal_queue(q), Ok(true))
    {
        QueueCounters::add(&counters.interrupts, 1);
    }
}

/// A chain of device-writable buffers taken off a ring (receive buffers), checked once: every
/// buffer writable and inside guest memory.
#[derive(Debug)]
pub struct WritableChain {
    pub head: u16,
    buffers: Vec<(GuestAddress, u32)>,
    /// Bytes the buffers hold in all.
    pub capacity: usize,
}

impl WritableChain {
    /// The chain's buffers, or None for a chain with a readable buffer, more than
    /// `max_buffers` buffers, one outside guest memory, or fewer than `min` bytes in all.
    pub fn take(
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
        max_buffers: usize,
        min: usize,
    ) -> Option<Self> {
        let head = chain.head_index();
        let mut buffers = Vec::new();
        let mut capacity = 0usize;
        for desc in chain {
            if !desc.is_write_only() || buffers.len() >= max_buffers {
                return None;
            }
            mem.get_slice(desc.addr(), desc.len() as usize).ok()?;
            capacity = capacity.saturating_add(desc.len() as usize);
            buffers.push((desc.addr(), desc.len()));
        }
        (capacity >= min).then_some(WritableChain {
            head,
            buffers,
            capacity,
        })
    }

    /// Copies as much of `data` as the buffers hold, in order; returns the bytes written.
    pub fn fill(&self, mem: &GuestMemoryMmap, data: &[u8]) -> usize {
        let mut done = 0;
        for &(addr, len) in &self.buffers {
            let take = (len as usize).min(data.len() - done);
            if take == 0 {
                break;
            }
            // The range was checked when the chain was taken.
            let _ = mem.write_slice(&data[done..done + take], addr);
            done += take;
        }
        done
    }
}

/// A virtio device model behind the transport. Configuration calls come from vCPU threads and
/// are short; queue work runs on the event loop once activated.
pub trait VirtioDevice: Send {
    /// virtio device type ([`TYPE_BLOCK`], [`TYPE_RNG`], ...).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Feature bits offered (including [`VIRTIO_F_VERSION_1`]).
    fn features(&self) -> u64;
    /// The driver reads the device-specific configuration space.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// The driver writes the device-specific configuration space.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK: the queue work to run on the event loop (the transport adds
    /// it there, and removes it, which drops it, when the driver resets the device).
    fn activate(&mut self, activation: Activation) -> Result<Subscriber, VirtioError>;
    /// The driver reset the device: anything beyond the queue work to forget.
    fn reset(&mut self) {}
    /// The host asks the device to grow to `bytes` (`vm.resize-disk`): Ok(true) when its
    /// configuration changed (the transport then tells the driver), Ok(false) when it has
    /// that size already, Err(why) when it cannot (a device without a size, a shrink).
    fn resize(&mut self, _bytes: u64) -> Result<bool, String> {
        Err("it is not a disk".into())
    }
    /// Whether stopping the VM resets the device first, on the event loop (a vhost-user back
    /// end is told to stop its queues); other devices end with the loop.
    fn resets_on_stop(&self) -> bool {
        false
    }
    /// Whether a snapshot can save the device once its driver has set it up: Ok when the
    /// transport's registers and the rings in guest memory are all its state (nothing of its
    /// own beyond what its config makes anew), else why not (docs/snapshot.md).
    fn snapshot_support(&self) -> Result<(), String> {
        Err(
            "its own state is not saved yet (only virtio-blk's, virtio-rng's, virtio-net's \
             and virtio-vsock's are)"
                .into(),
        )
    }
    /// The device's own state beyond its transport and rings (the balloon's target and what
    /// the guest says it holds), saved with the transport once its driver set it up; None
    /// for a device that has none.
    fn save_state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Puts state [`VirtioDevice::save_state`] saved back (before the device starts). It is
    /// hostile input: checked, never a panic.
    fn load_state(&mut self, _state: serde_json::Value) -> Result<(), String> {
        Err("state saved for a device that keeps none of its own".into())
    }
    /// The queues whose buffers the driver posts ahead for the device to fill when something
    /// comes (receive, event): a snapshot does not wait for them to drain (available and
    /// used indexes equal), the device's [`VirtioDevice::quiesce`] answers for them.
    fn prefilled_queues(&self) -> &[u16] {
        &[]
    }
    /// Before a snapshot reads the running device (vCPUs parked, its other queues drained):
    /// stop filling prefilled queues and give back every chain taken off them and not used,
    /// so that each queue's used index is where the restored device resumes (no buffer lost
    /// or used twice). Err(why) refuses the snapshot. Lasts until
    /// [`VirtioDevice::unquiesce`].
    fn quiesce(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// The snapshot is over (written or not): the device goes on.
    fn unquiesce(&mut self) {}
    /// A snapshot's state was put back and the device is about to start from its rings:
    /// what the guest must be told (vsock's transport reset) is told once it can be.
    fn restored(&mut self) {}
    /// Whether the device's back end holds state beyond the rings and the transport that a
    /// snapshot must move (a vhost-user back end's own: virtiofsd's open files), through
    /// [`VirtioDevice::save_backend_state`] and [`VirtioDevice::load_backend_state`].
    fn has_backend_state(&self) -> bool {
        false
    }
    /// A snapshot's, on the devices thread, once the rings drained and the device is
    /// quiesced: stop the back end's queues and read its state. The queues start again at
    /// [`VirtioDevice::unquiesce`], which then also runs on the devices thread.
    fn save_backend_state(&mut self) -> Result<Vec<u8>, String> {
        Err("it has no back end state".into())
    }
    /// A restore's, before the device starts from its rings: hand the new back end the state
    /// [`VirtioDevice::save_backend_state`] read (bytes from a file: the back end checks them).
    fn load_backend_state(&mut self, _state: &[u8]) -> Result<(), String> {
        Err("it has no back end state".into())
    }
    /// Per-queue counters, by queue index.
    fn counters(&self) -> Arc<[QueueCounters]>;
    /// Live migration to this host: lets go of (`held` false) or takes back what of the
    /// host the device holds that the destination opens too (a disk image's lock, a tap, the
    /// vsock socket's path), so that the destination can take it. Nothing by default.
    fn image_lock(&self, _held: bool) -> Result<(), String> {
        Ok(())
    }
    /// Live migration: a device whose back end writes guest memory outside exitless
    /// (vhost-user) has it log those writes ([`BackendLog`]). Ok(true): it logs (or, for
    /// `Check`, would); Ok(false): nothing to log (no back end, or not running); Err(why):
    /// its back end cannot log. Runs on the devices thread. Nothing by default.
    fn backend_log(&mut self, _log: BackendLog) -> Result<bool, String> {
        Ok(false)
    }
    /// What the device counts beyond its queues (frames, drops, connections), by name.
    fn device_counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// What [`VirtioDevice::backend_log`] is asked.
#[derive(Debug, Clone)]
pub enum BackendLog {
    /// Whether the back end could log (before a migration starts).
    Check,
    /// Log into this region from now on.
    Start(std::sync::Arc<dirty_log::shared::SharedLog>),
    /// Stop logging.
    Stop,
}

/// What the devices' tests share: an interrupt that counts, descriptors.
#[cfg(test)]
pub mod test_support {
    use super::VirtioInterrupt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};

    /// Counts the interrupts raised: queue ones in `.0`, configuration changes in `config`.
    #[derive(Default)]
    pub struct CountingIrq(pub AtomicU64, pub AtomicU64);

    impl CountingIrq {
        /// Configuration-change interrupts raised.
        pub fn configs(&self) -> u64 {
            self.1.load(Ordering::SeqCst)
        }
    }

    impl VirtioInterrupt for CountingIrq {
        fn signal_queue(&self, _queue: u16) -> std::io::Result<bool> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(true)
        }
        fn signal_config(&self) -> std::io::Result<()> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// The health of a device under test (its config interrupts counted nowhere).
    pub fn health() -> std::sync::Arc<super::DeviceHealth> {
        std::sync::Arc::new(super::DeviceHealth::new(
            "virtio-test",
            std::sync::Arc::new(CountingIrq::default()),
        ))
    }

    /// A split-ring descriptor.
    pub fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
    }
}
