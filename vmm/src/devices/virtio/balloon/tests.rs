use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::devices::virtio::test_support::{desc, health, CountingIrq};
use crate::devices::virtio::ActiveQueue;
use crate::event_loop::EventLoop;

const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
const NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
const MIB: u64 = 1 << 20;
const RAM: u64 = 16 * MIB;
/// Where each queue's rings are, by index.
const RINGS: [u64; 3] = [0x0, 0x1000, 0x2000];

fn config(reporting: bool) -> BalloonConfig {
    BalloonConfig {
        size: 0,
        deflate_on_oom: false,
        free_page_reporting: reporting,
        id: None,
    }
}

/// Guest RAM with every byte of [1 MiB, end) set to 0xaa.
fn guest_ram() -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM as usize)]).unwrap();
    mem.write_slice(&vec![0xaa; (RAM - MIB) as usize], GuestAddress(MIB))
        .unwrap();
    mem
}

fn all(mem: &GuestMemoryMmap, addr: u64, len: u64, byte: u8) -> bool {
    let mut v = vec![0u8; len as usize];
    mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
    v.iter().all(|&b| b == byte)
}

/// Resident pages of `[addr, addr + len)` of `mem` (mincore(2)).
fn resident(mem: &GuestMemoryMmap, addr: u64, len: u64) -> usize {
    let host = mem.get_host_address(GuestAddress(addr)).unwrap();
    let mut vec = vec![0u8; (len / 4096) as usize];
    // SAFETY: the range is mapped guest memory; `vec` has one byte per page.
    let r = unsafe { libc::mincore(host.cast(), len as usize, vec.as_mut_ptr()) };
    assert_eq!(r, 0);
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

/// `dev` started with `features` and the queues of `vqs` (queue i at index i), on `el`.
fn start(
    dev: &mut Balloon,
    mem: &GuestMemoryMmap,
    vqs: &[MockSplitQueue<GuestMemoryMmap>],
    features: u64,
    el: &EventLoop,
) {
    let queues = vqs
        .iter()
        .enumerate()
        .map(|(i, vq)| ActiveQueue {
            index: i as u16,
            queue: vq.create_queue::<Queue>().unwrap(),
            notify: std::sync::Arc::new(EventFd::new(EFD_NONBLOCK).unwrap()),
        })
        .collect();
    let worker = dev
        .activate(Activation {
            mem: crate::devices::virtio::SharedGuestMemory::new(mem.clone()),
            features,
            queues,
            interrupt: std::sync::Arc::new(CountingIrq::default()),
            health: health(),
            dirty: Default::default(),
        })
        .unwrap();
    el.handle().add(worker).unwrap();
}

/// Waits until queue `q` of `dev` completed `n` chains.
fn wait_completed(dev: &Balloon, q: usize, n: u64) {
    let start = Instant::now();
    while dev.counters()[q].completed.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "queue {q} not served"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn stat(dev: &Balloon, name: &str) -> u64 {
    let all = dev.device_counters();
    all.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .unwrap()
}

#[test]
fn queue_indexes_follow_the_negotiated_features() {
    let base = VIRTIO_F_VERSION_1;
    assert_eq!(role_of(0, base), Some(Role::Inflate));
    assert_eq!(role_of(1, base), Some(Role::Deflate));
    assert_eq!(
        role_of(2, base),
        None,
        "no reporting queue without REPORTING"
    );
    assert_eq!(role_of(2, base | F_REPORTING), Some(Role::Reporting));
    // Queues that exist are numbered in order: a statistics or hinting queue comes first.
    assert_eq!(role_of(2, base | F_REPORTING | F_STATS_VQ), None);
    assert_eq!(
        role_of(3, base | F_REPORTING | F_STATS_VQ),
        Some(Role::Reporting)
    );
    let both = base | F_REPORTING | F_STATS_VQ | F_FREE_PAGE_HINT;
    assert_eq!(role_of(4, both), Some(Role::Reporting));
    assert_eq!(role_of(3, both), None);
}

#[test]
fn features_and_queues_follow_the_config() {
    let plain = Balloon::new(&config(false));
    assert_eq!(plain.device_type(), 5);
    assert_eq!(plain.queue_max_sizes().len(), 2);
    assert_eq!(plain.features() & (F_REPORTING | F_DEFLATE_ON_OOM), 0);
    let mut c = config(true);
    c.deflate_on_oom = true;
    let full = Balloon::new(&c);
    assert_eq!(full.queue_max_sizes().len(), 3);
    assert_ne!(full.features() & F_REPORTING, 0);
    assert_ne!(full.features() & F_DEFLATE_ON_OOM, 0);
    assert_ne!(full.features() & VIRTIO_F_VERSION_1, 0);
    assert_eq!(
        full.features() & (F_STATS_VQ | F_FREE_PAGE_HINT | F_MUST_TELL_HOST),
        0
    );
}

#[test]
fn config_space_holds_the_target_and_the_guests_actual() {
    let mut c = config(true);
    c.size = 64 * MIB;
    let mut dev = Balloon::new(&c);
    let handle = dev.handle();
    let read32 = |dev: &Balloon, at: u64| {
        let mut b = [0u8; 4];
        dev.read_config(at, &mut b);
        u32::from_le_bytes(b)
    };
    assert_eq!(read32(&dev, 0), 16384, "num_pages: 64 MiB of 4 KiB pages");
    assert_eq!(read32(&dev, 4), 0);
    dev.write_config(4, &1000u32.to_le_bytes());
    assert_eq!(read32(&dev, 4), 1000);
    assert_eq!(handle.actual_bytes(), 1000 * 4096);
    // A byte-wide write of actual's second byte; num_pages and past the end are not the
    // driver's to write.
    dev.write_config(5, &[1]);
    assert_eq!(read32(&dev, 4), 1000 & !0xff00 | 0x100);
    dev.write_config(0, &7u32.to_le_bytes());
    dev.write_config(6, &[1, 2, 3, 4]);
    dev.write_config(u64::MAX, &[1]);
    assert_eq!(read32(&dev, 0), 16384);
    let mut far = [0xffu8; 8];
    dev.read_config(12, &mut far);
    assert_eq!(far, [0; 8], "past the structure reads 0");
    dev.read_config(u64::MAX - 1, &mut far);
    assert!(handle.set_target_bytes(32 * MIB));
    assert!(!handle.set_target_bytes(32 * MIB + 100), "same page count");
    assert_eq!(read32(&dev, 0), 8192);
    assert_eq!(handle.target_bytes(), 32 * MIB);
    dev.reset();
    assert_eq!(handle.actual_bytes(), 0, "a reset empties the balloon");
    assert_eq!(read32(&dev, 0), 8192, "the host's target stays");
}

#[test]
fn reported_ranges_are_given_back_and_hostile_ones_refused_or_clipped() {
    let mem = guest_ram();
    let vqs: Vec<_> = RINGS
        .iter()
        .map(|&a| MockSplitQueue::create(&mem, GuestAddress(a), 16))
        .collect();
    // Chain 0: 2 MiB at 4 MiB (device-writable, as Linux posts them) and 4 MiB at 8 MiB
    // (device-readable). Chain 1: an unaligned range and one past RAM (both refused).
    // Chain 2: 4 MiB from 14 MiB, running 2 MiB past the end of RAM (clipped).
    let chains = [
        desc(4 * MIB, 2 * MIB as u32, WRITE | NEXT, 1),
        desc(8 * MIB, 4 * MIB as u32, 0, 0),
        desc(6 * MIB + 0x800, 4096, WRITE | NEXT, 3),
        desc(64 * MIB, 4096, WRITE, 0),
        desc(14 * MIB, 4 * MIB as u32, WRITE, 0),
    ];
    vqs[2].add_desc_chains(&chains, 0).unwrap();
    assert_eq!(resident(&mem, 4 * MIB, 2 * MIB), 512);
    let mut dev = Balloon::new(&config(true));
    let el = EventLoop::start().unwrap();
    start(&mut dev, &mem, &vqs, VIRTIO_F_VERSION_1 | F_REPORTING, &el);
    wait_completed(&dev, 2, 3);
    assert_eq!(stat(&dev, "reported_pages"), 512 + 1024 + 512);
    assert_eq!(stat(&dev, "refused_ranges"), 2);
    assert_eq!(stat(&dev, "clipped_ranges"), 1);
    assert_eq!(stat(&dev, "discard_errors"), 0);
    assert_eq!(dev.counters()[2].malformed.load(Ordering::Relaxed), 0);
    assert_eq!(
        resident(&mem, 4 * MIB, 2 * MIB),
        0,
        "given back to the host"
    );
    assert_eq!(resident(&mem, 8 * MIB, 4 * MIB), 0);
    assert!(all(&mem, 4 * MIB, 2 * MIB, 0) && all(&mem, 8 * MIB, 4 * MIB, 0));
    assert!(all(&mem, 14 * MIB, 2 * MIB, 0));
    // What was not reported (and the refused range's page) keeps its bytes.
    assert!(all(&mem, 6 * MIB, 2 * MIB, 0xaa));
    assert!(all(&mem, 12 * MIB, 2 * MIB, 0xaa));
    let used = vqs[2].used().ring().ref_at(0).unwrap().load();
    assert_eq!(used.len(), 0, "nothing written into reported pages");
}

#[test]
fn inflated_pfns_are_given_back_and_malformed_chains_counted() {
    let mem = guest_ram();
    let vqs: Vec<_> = RINGS[..2]
        .iter()
        .map(|&a| MockSplitQueue::create(&mem, GuestAddress(a), 16))
        .collect();
    // PFN arrays: 16 pages from 4 MiB and one at 5 MiB; three for the deflate queue.
    let mut pfns: Vec<u32> = (0x400..0x410).collect();
    pfns.push(0x500);
    let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(0x8000)).unwrap();
    let inflate = [
        desc(0x8000, bytes.len() as u32, 0, 0),
        desc(0x8000, 8, WRITE, 0),   // device-writable PFNs: malformed
        desc(0x8000, 6, 0, 0),       // not whole PFNs: malformed
        desc(RAM + 0x1000, 8, 0, 0), // outside guest memory: malformed
        desc(0x8000 + 64, 4, 0, 0),  // the lone PFN again: given back once more
    ];
    vqs[0].add_desc_chains(&inflate, 0).unwrap();
    vqs[1]
        .add_desc_chains(&[desc(0x8000, 12, 0, 0)], 0)
        .unwrap();
    let mut dev = Balloon::new(&config(false));
    let el = EventLoop::start().unwrap();
    start(&mut dev, &mem, &vqs, VIRTIO_F_VERSION_1, &el);
    wait_completed(&dev, 0, 5);
    wait_completed(&dev, 1, 1);
    assert_eq!(stat(&dev, "inflated_pages"), 18);
    assert_eq!(stat(&dev, "deflated_pages"), 3);
    assert_eq!(dev.counters()[0].malformed.load(Ordering::Relaxed), 3);
    assert_eq!(dev.counters()[1].malformed.load(Ordering::Relaxed), 0);
    assert_eq!(resident(&mem, 4 * MIB, 64 * 1024), 0);
    assert!(all(&mem, 4 * MIB, 64 * 1024, 0) && all(&mem, 5 * MIB, 4096, 0));
    assert!(all(&mem, 4 * MIB + 64 * 1024, 4096, 0xaa));
    assert!(all(&mem, 5 * MIB + 4096, 4096, 0xaa));
}

#[test]
fn a_queue_without_its_feature_is_not_served() {
    let mem = guest_ram();
    let vqs: Vec<_> = RINGS
        .iter()
        .map(|&a| MockSplitQueue::create(&mem, GuestAddress(a), 16))
        .collect();
    vqs[2]
        .add_desc_chains(&[desc(4 * MIB, 4096, WRITE, 0)], 0)
        .unwrap();
    vqs[0].add_desc_chains(&[desc(0x8000, 0, 0, 0)], 0).unwrap();
    let mut dev = Balloon::new(&config(true));
    let el = EventLoop::start().unwrap();
    // The driver enabled queue 2 but did not take REPORTING: it is no reporting queue.
    start(&mut dev, &mem, &vqs, VIRTIO_F_VERSION_1, &el);
    wait_completed(&dev, 0, 1);
    assert_eq!(
        dev.counters()[0].malformed.load(Ordering::Relaxed),
        1,
        "an empty PFN chain"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(dev.counters()[2].completed.load(Ordering::Relaxed), 0);
    assert!(all(&mem, 4 * MIB, 4096, 0xaa));
}

/// The target, what the guest put in the balloon and the counters go into a snapshot and
/// back into a balloon made anew (whose config may say another target); a damaged state is
/// refused.
#[test]
fn the_balloon_s_own_state_is_saved_and_restored() {
    let mut saved = Balloon::new(&config(true));
    saved.handle().set_target_bytes(8 * MIB);
    saved.write_config(4, &512u32.to_le_bytes());
    saved
        .shared
        .stats
        .inflated_pages
        .store(512, Ordering::Relaxed);
    let state = saved
        .save_state()
        .expect("the balloon has state of its own");
    let mut restored = Balloon::new(&config(true));
    restored.load_state(state.clone()).unwrap();
    let h = restored.handle();
    assert_eq!((h.target_bytes(), h.actual_bytes()), (8 * MIB, 2 * MIB));
    assert_eq!(h.stats().inflated_pages.load(Ordering::Relaxed), 512);
    let mut image = [0u8; 8];
    restored.read_config(0, &mut image);
    assert_eq!(
        image,
        [0, 8, 0, 0, 0, 2, 0, 0],
        "num_pages 2048, actual 512"
    );
    let mut damaged = state;
    damaged["actual_pages"] = serde_json::json!(-1);
    assert!(restored.load_state(damaged).is_err());
    assert!(restored.snapshot_support().is_ok());
}
