//! The transport driven as a guest driver would, against a fake device.

use std::sync::{Arc, Mutex};

use event_manager::{EventOps, Events, MutEventSubscriber};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::common::*;
use super::*;
use crate::devices::virtio::{QueueCounters, VirtioError, VIRTIO_F_VERSION_1};
use crate::event_loop::EventLoop;

/// (queue index, size, descriptor table address, next available index) of an activated queue.
type QueueSeen = (u16, u16, u64, u16);

#[derive(Default)]
struct Seen {
    activations: Vec<(u64, Vec<QueueSeen>)>,
    resets: usize,
    /// Queue workers alive now (made at activation, dropped when the loop lets them go).
    workers: usize,
}

/// The fake's queue work: nothing to do, but it says when it is dropped.
struct Worker(Arc<Mutex<Seen>>);

impl MutEventSubscriber for Worker {
    fn process(&mut self, _: Events, _: &mut EventOps) {}
    fn init(&mut self, _: &mut EventOps) {}
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.0.lock().unwrap().workers -= 1;
    }
}

struct Fake(Arc<Mutex<Seen>>, Arc<[QueueCounters]>);

impl VirtioDevice for Fake {
    fn device_type(&self) -> u32 {
        4
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[64, 16]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(offset as u8 + 0x10);
    }
    fn write_config(&mut self, _: u64, _: &[u8]) {}
    fn activate(&mut self, a: Activation) -> Result<Subscriber, VirtioError> {
        let queues = a
            .queues
            .iter()
            .map(|q| {
                (
                    q.index,
                    q.queue.size(),
                    q.queue.desc_table(),
                    q.queue.next_avail(),
                )
            })
            .collect();
        let mut seen = self.0.lock().unwrap();
        seen.activations.push((a.features, queues));
        seen.workers += 1;
        Ok(Arc::new(Mutex::new(Worker(self.0.clone()))))
    }
    fn reset(&mut self) {
        self.0.lock().unwrap().resets += 1;
    }
    fn counters(&self) -> Arc<[QueueCounters]> {
        self.1.clone()
    }
}

fn device() -> (Arc<VirtioPciDevice>, Arc<Mutex<Seen>>, EventLoop) {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let el = EventLoop::start().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let counters: Arc<[QueueCounters]> = (0..2).map(|_| QueueCounters::default()).collect();
    let fake = Box::new(Fake(seen.clone(), counters));
    let shared = crate::devices::virtio::SharedGuestMemory::new(mem);
    let dev = VirtioPciDevice::new("virtio-fake0", fake, 0xc000_0000, shared, el.handle()).unwrap();
    (dev, seen, el)
}

fn w(dev: &VirtioPciDevice, offset: u64, data: &[u8]) {
    dev.bar_write(0, offset, data);
}

/// Waits until the event loop did everything handed to it so far (starts, resets).
fn settle(el: &EventLoop) {
    el.handle().call(|_| {}).unwrap();
}

fn status(dev: &VirtioPciDevice) -> u8 {
    let mut s = [0u8];
    dev.bar_read(0, 0x14, &mut s);
    s[0]
}

fn setup_queue(dev: &VirtioPciDevice, q: u16, size: u16, base: u32) {
    w(dev, 0x16, &q.to_le_bytes());
    w(dev, 0x18, &size.to_le_bytes());
    w(dev, 0x20, &base.to_le_bytes());
    w(dev, 0x28, &(base + 0x1000).to_le_bytes());
    w(dev, 0x30, &(base + 0x2000).to_le_bytes());
    w(dev, 0x1c, &1u16.to_le_bytes());
}

fn negotiate(dev: &VirtioPciDevice, high: u32) {
    w(dev, 0x14, &[STATUS_ACKNOWLEDGE | STATUS_DRIVER]);
    w(dev, 0x08, &0u32.to_le_bytes());
    w(dev, 0x0c, &(1u32 << 29).to_le_bytes()); // EVENT_IDX
    w(dev, 0x08, &1u32.to_le_bytes());
    w(dev, 0x0c, &high.to_le_bytes());
    w(dev, 0x14, &[3 | STATUS_FEATURES_OK]);
}

#[test]
fn a_driver_init_sequence_activates_the_device_with_its_queues() {
    let (dev, seen, _el) = device();
    negotiate(&dev, 1);
    assert_eq!(status(&dev) & STATUS_FEATURES_OK, STATUS_FEATURES_OK);
    setup_queue(&dev, 0, 32, 0x10000);
    setup_queue(&dev, 1, 16, 0x20000);
    w(&dev, 0x14, &[0xf]);
    settle(&_el);
    let s = seen.lock().unwrap();
    assert_eq!(s.activations.len(), 1);
    let (features, queues) = &s.activations[0];
    assert_eq!(*features, VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX);
    assert_eq!(queues, &[(0, 32, 0x10000, 0), (1, 16, 0x20000, 0)]);
    assert!(dev.is_running());
}

#[test]
fn features_ok_needs_version_1_and_reset_clears_everything() {
    let (dev, seen, _el) = device();
    negotiate(&dev, 0);
    assert_eq!(status(&dev) & STATUS_FEATURES_OK, 0);
    w(&dev, 0x14, &[0]);
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    w(&dev, 0x14, &[0xf]);
    w(&dev, 0x14, &[0]);
    settle(&_el);
    assert_eq!(status(&dev), 0);
    assert_eq!(seen.lock().unwrap().resets, 2);
    let mut size = [0u8; 2];
    w(&dev, 0x16, &0u16.to_le_bytes());
    dev.bar_read(0, 0x18, &mut size);
    assert_eq!(u16::from_le_bytes(size), 64);
}

#[test]
fn a_queue_outside_guest_memory_needs_a_reset_instead_of_a_panic() {
    let (dev, seen, _el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0xfff0_0000);
    w(&dev, 0x14, &[0xf]);
    settle(&_el);
    assert_eq!(status(&dev) & STATUS_NEEDS_RESET, STATUS_NEEDS_RESET);
    assert_eq!(dev.health().refused_starts.load(Ordering::Relaxed), 1);
    assert!(seen.lock().unwrap().activations.is_empty());
}

#[test]
fn notify_writes_signal_the_queue_and_ioeventfds_cover_each_queue() {
    let (dev, _seen, _el) = device();
    w(&dev, 0x3004, &1u16.to_le_bytes());
    assert_eq!(dev.notify[1].read().unwrap(), 1);
    let events = dev.notify_events(0xc000_0000);
    let addrs: Vec<u64> = events.iter().map(|(e, _)| e.addr).collect();
    assert_eq!(addrs, [0xc000_3000, 0xc000_3004]);
    assert!(events.iter().all(|(e, _)| e.len == 0 && !e.pio));
    w(&dev, 0x3400, &[1]);
    assert_eq!(dev.faults(), 1);
}

#[test]
fn config_space_has_the_virtio_capabilities_and_live_msix_control() {
    let (dev, _seen, _el) = device();
    let mut d = [0u8; 4];
    dev.config_read(0, &mut d);
    assert_eq!(u32::from_le_bytes(d), 0x1044_1af4);
    let mut at = {
        let mut p = [0u8];
        dev.config_read(0x34, &mut p);
        p[0] as usize
    };
    let mut found = Vec::new();
    while at != 0 {
        let mut cap = [0u8; 4];
        dev.config_read(at, &mut cap);
        found.push((cap[0], if cap[0] == 0x09 { cap[3] } else { 0 }));
        at = cap[1] as usize;
    }
    assert_eq!(found, [(9, 1), (9, 2), (9, 3), (9, 4), (9, 5), (0x11, 0)]);
    // Enable MSI-X through the control word and read it back.
    let control = dev.msix_cap + 2;
    dev.config_write(control, &0x8000u16.to_le_bytes());
    let mut c = [0u8; 2];
    dev.config_read(control, &mut c);
    assert_eq!(u16::from_le_bytes(c), 0x8002, "enabled, 3 vectors");
    let mut bad = [0u8; 3];
    dev.config_read(control, &mut bad);
    dev.bar_read(0, 0x2000, &mut d);
    assert_eq!(d, [0x10, 0x10, 0x10, 0x10]);
}

/// Found by the virtio_transport fuzz target: a zero-length read of the ISR register indexed
/// an empty buffer. Accesses of no bytes or more than 8 are counted faults, never a panic.
#[test]
fn accesses_of_zero_or_more_than_eight_bytes_are_counted_faults() {
    let (dev, _, _el) = device();
    let mut none = [0u8; 0];
    dev.bar_read(0, ISR, &mut none);
    dev.bar_write(0, ISR, &[]);
    let mut wide = [0u8; 16];
    dev.bar_read(0, 0, &mut wide);
    assert_eq!(dev.faults(), 3);
    assert_eq!(wide, [0; 16]);
}

/// The driver cannot clear DRIVER_OK (or any bit) except by a reset: toggling it a thousand
/// times leaves one start and one queue worker.
#[test]
fn clearing_driver_ok_is_refused_and_never_starts_a_second_worker() {
    let (dev, seen, el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    w(&dev, 0x14, &[0xf]);
    for _ in 0..1000 {
        w(&dev, 0x14, &[0xb]); // DRIVER_OK cleared
        w(&dev, 0x14, &[0xf]);
    }
    settle(&el);
    let s = seen.lock().unwrap();
    assert_eq!((s.activations.len(), s.workers), (1, 1));
    assert_eq!(status(&dev), 0xf);
    assert_eq!(dev.health().refused_status.load(Ordering::Relaxed), 1000);
}

/// A reset is done on the event loop: the status reads as before until it is, then 0; the
/// queue worker is dropped (its descriptors with it).
#[test]
fn a_reset_completes_on_the_event_loop_and_drops_the_worker() {
    let (dev, seen, el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    w(&dev, 0x14, &[0xf]);
    settle(&el);
    assert_eq!(seen.lock().unwrap().workers, 1);
    // Hold the loop so the reset cannot run yet.
    let (hold, release) = std::sync::mpsc::channel::<()>();
    el.handle()
        .fire(move |_| {
            let _ = release.recv();
        })
        .unwrap();
    w(&dev, 0x14, &[0]);
    assert_eq!(status(&dev), 0xf, "still resetting");
    w(&dev, 0x14, &[0xf]);
    hold.send(()).unwrap();
    settle(&el);
    assert_eq!(status(&dev), 0);
    let s = seen.lock().unwrap();
    assert_eq!((s.activations.len(), s.workers), (1, 0));
}

/// A driver that resets the device and sets the same ring up again resumes where the used
/// ring says the device left off: completed requests are not served twice.
#[test]
fn a_restart_resumes_from_the_used_ring() {
    let (dev, seen, el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    // The used ring (at base + 0x2000) says 5 requests were completed.
    dev.mem
        .memory()
        .write_obj(5u16, GuestAddress(0x12002))
        .unwrap();
    w(&dev, 0x14, &[0xf]);
    settle(&el);
    assert_eq!(seen.lock().unwrap().activations[0].1[0].3, 5);
}

/// A reset written while the start is still waiting for the event loop wins: the device never
/// starts, no queue worker is left, the status reads 0.
#[test]
fn a_reset_while_the_start_waits_for_the_event_loop_means_no_start() {
    let (dev, seen, el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    let (hold, release) = std::sync::mpsc::channel::<()>();
    el.handle()
        .fire(move |_| {
            let _ = release.recv();
        })
        .unwrap();
    w(&dev, 0x14, &[0xf]);
    w(&dev, 0x14, &[0]);
    hold.send(()).unwrap();
    settle(&el);
    assert_eq!(status(&dev), 0);
    assert!(!dev.is_running());
    let s = seen.lock().unwrap();
    assert_eq!((s.activations.len(), s.workers, s.resets), (0, 0, 1));
}

/// A device in NEEDS_RESET (its start failed on a queue outside guest memory) is usable again
/// after the driver's reset: NEEDS_RESET is gone and a good set-up starts it.
#[test]
fn a_reset_clears_needs_reset_and_a_good_setup_then_starts_the_device() {
    let (dev, seen, el) = device();
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0xfff0_0000);
    w(&dev, 0x14, &[0xf]);
    settle(&el);
    assert_eq!(status(&dev) & STATUS_NEEDS_RESET, STATUS_NEEDS_RESET);
    w(&dev, 0x14, &[0]);
    settle(&el);
    assert_eq!(status(&dev), 0, "NEEDS_RESET is gone with the reset");
    negotiate(&dev, 1);
    setup_queue(&dev, 0, 32, 0x10000);
    w(&dev, 0x14, &[0xf]);
    settle(&el);
    assert_eq!(status(&dev), 0xf);
    assert!(dev.is_running());
    let s = seen.lock().unwrap();
    assert_eq!((s.activations.len(), s.workers), (1, 1));
}
