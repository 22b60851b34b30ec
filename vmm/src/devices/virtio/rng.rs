//! virtio-rng: an entropy source backed by the host's `getrandom(2)`. Its one queue is served
//! on the device event loop: each chain's device-writable buffers are filled (at most 64 KiB
//! per chain, so a guest cannot make the host allocate without bound) and returned.

use std::sync::{Arc, Mutex};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use crate::event_loop::Subscriber;
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::{
    serve_available, signal_used, Activation, DeviceDirtyLog, DeviceHealth, MemoryView,
    QueueCounters, VirtioDevice, VirtioError, VirtioInterrupt, TYPE_RNG, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

/// Most bytes served for one chain.
pub const MAX_BYTES_PER_CHAIN: u32 = 64 * 1024;
const QUEUE_SIZE: u16 = 256;

/// The virtio-rng device model.
pub struct Rng {
    counters: Arc<[QueueCounters]>,
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng {
    pub fn new() -> Self {
        Rng {
            counters: Arc::from(vec![QueueCounters::default()]),
        }
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        TYPE_RNG
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | VIRTIO_RING_F_INDIRECT_DESC
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0); // virtio-rng has no configuration
    }
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    /// Its configuration is read-only and made anew from the config; every request
    /// completes before a snapshot (the transport waits for the rings to drain).
    fn snapshot_support(&self) -> Result<(), String> {
        Ok(())
    }

    fn activate(&mut self, mut a: Activation) -> Result<Subscriber, VirtioError> {
        let Some(q) = a.queues.pop().filter(|q| q.index == 0) else {
            return Err(VirtioError::QueueCount {
                device: "virtio-rng".into(),
                want: 1,
                got: a.queues.len(),
            });
        };
        let worker = RngWorker {
            queue: q.queue,
            notify: q.notify,
            mem: MemoryView::new(a.mem),
            interrupt: a.interrupt,
            counters: self.counters.clone(),
            health: a.health,
            dirty: a.dirty,
        };
        Ok(Arc::new(Mutex::new(worker)))
    }

    fn counters(&self) -> Arc<[QueueCounters]> {
        self.counters.clone()
    }
}

/// The queue's work, on the event loop.
struct RngWorker {
    queue: Queue,
    notify: Arc<EventFd>,
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    health: Arc<DeviceHealth>,
    dirty: Arc<DeviceDirtyLog>,
}

/// Fills the chain's writable buffers; returns the bytes written, or None for a chain that
/// has no writable buffer or points outside guest memory.
fn fill_chain(chain: DescriptorChain<&GuestMemoryMmap>, mem: &GuestMemoryMmap) -> Option<u32> {
    let mut written = 0u32;
    let mut any = false;
    for desc in chain.writable() {
        any = true;
        let len = desc.len().min(MAX_BYTES_PER_CHAIN - written);
        if len == 0 {
            continue;
        }
        let mut bytes = vec![0u8; len as usize];
        host_random(&mut bytes).ok()?;
        mem.write_slice(&bytes, desc.addr()).ok()?;
        written += len;
    }
    any.then_some(written)
}

/// Fills `buf` from the host's entropy pool.
fn host_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // The system call, not libc's getrandom(): in the static musl build std declares that
        // symbol weak, so under LTO nothing pulls it from libc.a and the call would go to
        // address 0 (docs/performance.md, "Lean by default").
        // SAFETY: getrandom(2) writes at most `rest.len()` bytes into the valid buffer `rest`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                rest.as_mut_ptr(),
                rest.len(),
                0 as libc::c_uint,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            done += n as usize;
        }
    }
    Ok(())
}

impl RngWorker {
    /// Serves every available chain, re-checking after re-enabling notifications (event
    /// idx), then raises the interrupt if the driver asked for one.
    fn serve(&mut self) {
        self.mem.refresh();
        let (mem, counters) = (self.mem.get(), &self.counters[0]);
        let queue = (&mut self.queue, 0);
        let completed =
            serve_available(queue, mem, (counters, &self.health, &self.dirty), |chain| {
                fill_chain(chain, mem)
            });
        if completed {
            signal_used(&mut self.queue, mem, self.interrupt.as_ref(), 0, counters);
        }
    }
}

impl MutEventSubscriber for RngWorker {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {
        if self.notify.read().is_ok() {
            QueueCounters::add(&self.counters[0].notifies, 1);
        }
        self.serve();
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.notify, EventSet::IN)) {
            eprintln!("virtio-rng: cannot watch queue notifications: {e}");
        }
        // Work the driver queued before activation is served now.
        self.serve();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_support::{desc as test_desc, CountingIrq};
    use crate::devices::virtio::{ActiveQueue, SharedGuestMemory};
    use crate::event_loop::EventLoop;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;

    fn desc(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        test_desc(addr, len, flags, 0)
    }

    fn used_len(vq: &MockSplitQueue<GuestMemoryMmap>, i: u16) -> u32 {
        vq.used().ring().ref_at(i.into()).unwrap().load().len()
    }

    #[test]
    fn buffers_fill_with_random_bytes_and_bad_chains_are_counted() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let vq = MockSplitQueue::new(&mem, 16);
        // Chain 0: a 64-byte writable buffer. Chain 1: read-only (malformed).
        // Chain 2: a buffer outside guest memory (malformed).
        let chains = [
            desc(0x8000, 64, WRITE),
            desc(0x9000, 64, 0),
            desc(0x4000_0000, 64, WRITE),
        ];
        vq.add_desc_chains(&chains, 0).unwrap();
        let rng = Rng::new();
        let irq = Arc::new(CountingIrq::default());
        let el = EventLoop::start().unwrap();
        let notify = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut dev = rng;
        let queue: Queue = vq.create_queue().unwrap();
        dev.activate(Activation {
            mem: SharedGuestMemory::new(mem.clone()),
            features: VIRTIO_F_VERSION_1,
            queues: vec![ActiveQueue {
                index: 0,
                queue,
                notify: Arc::new(notify.try_clone().unwrap()),
            }],
            interrupt: irq.clone(),
            health: crate::devices::virtio::test_support::health(),
            dirty: Default::default(),
        })
        .map(|worker| el.handle().add(worker).unwrap())
        .unwrap();
        let start = Instant::now();
        while dev.counters()[0].completed.load(Ordering::Relaxed) < 3 {
            assert!(start.elapsed() < Duration::from_secs(5), "queue not served");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(used_len(&vq, 0), 64);
        let mut got = [0u8; 64];
        mem.read_slice(&mut got, GuestAddress(0x8000)).unwrap();
        assert!(got.iter().any(|&b| b != got[0]), "random bytes: {got:?}");
        assert_eq!((used_len(&vq, 1), used_len(&vq, 2)), (0, 0));
        assert_eq!(dev.counters()[0].malformed.load(Ordering::Relaxed), 2);
        assert!(irq.0.load(Ordering::SeqCst) >= 1);
        dev.reset();
    }

    /// Memory hot-added after the device started (as `vm.resize` adds it): a buffer the guest
    /// places there is filled, not refused as outside guest memory.
    #[test]
    fn a_buffer_in_memory_added_after_activation_is_served() {
        use vm_memory::{Address, GuestAddressSpace};
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let shared = SharedGuestMemory::new(mem.clone());
        let vq = MockSplitQueue::new(&mem, 16);
        let el = EventLoop::start().unwrap();
        let notify = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let mut dev = Rng::new();
        let worker = dev
            .activate(Activation {
                mem: shared.clone(),
                features: VIRTIO_F_VERSION_1,
                queues: vec![ActiveQueue {
                    index: 0,
                    queue: vq.create_queue().unwrap(),
                    notify: notify.clone(),
                }],
                interrupt: Arc::new(CountingIrq::default()),
                health: crate::devices::virtio::test_support::health(),
                dirty: Default::default(),
            })
            .unwrap();
        el.handle().add(worker).unwrap();
        let high = GuestAddress(1 << 32);
        let region = crate::memory::create_region(high, 1 << 20, &Default::default()).unwrap();
        let grown = shared.memory().insert_region(Arc::new(region)).unwrap();
        shared.lock().unwrap().replace(grown);
        let buffer = high.unchecked_add(0x100);
        vq.add_desc_chains(&[desc(buffer.0, 64, WRITE)], 0).unwrap();
        notify.write(1).unwrap();
        let start = Instant::now();
        while dev.counters()[0].completed.load(Ordering::Relaxed) < 1 {
            assert!(start.elapsed() < Duration::from_secs(5), "queue not served");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(dev.counters()[0].malformed.load(Ordering::Relaxed), 0);
        assert_eq!(used_len(&vq, 0), 64);
        let mut got = [0u8; 64];
        shared.memory().read_slice(&mut got, buffer).unwrap();
        assert!(got.iter().any(|&b| b != got[0]), "random bytes: {got:?}");
        dev.reset();
    }
}
