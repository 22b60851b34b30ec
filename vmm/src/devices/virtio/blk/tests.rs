//! virtio-blk driven through mock queues: real files, both I/O backends, hostile chains.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;

use std::time::{Duration, Instant};
use virtio_queue::desc::RawDescriptor;

use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::request::*;
use super::*;
use crate::devices::virtio::test_support::{desc as d, CountingIrq as Irq};
use crate::devices::virtio::ActiveQueue;
use crate::event_loop::EventLoop;

pub(super) const NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
pub(super) const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
pub(super) const HDR: u64 = 0x10_0000;
pub(super) const DATA: u64 = 0x20_0000;
pub(super) const STATUS: u64 = 0x30_0000;
/// The used ring, away from the mock's own: the mock places its used ring over the end of the
/// avail ring (it counts the avail ring's length in elements, not bytes), so completions would
/// overwrite `used_event`.
pub(super) const USED_RING: u64 = 0x8000;

pub(super) struct Disk {
    pub(super) path: std::path::PathBuf,
}

impl Disk {
    pub(super) fn new(tag: &str, sectors: u64) -> Self {
        let path = std::env::temp_dir().join(format!("exitless-blk-{tag}-{}", std::process::id()));
        std::fs::write(&path, vec![0xaau8; (sectors * SECTOR) as usize]).unwrap();
        Disk { path }
    }
    pub(super) fn config(&self, readonly: bool) -> DiskConfig {
        DiskConfig {
            path: self.path.clone(),
            readonly,
            ..DiskConfig::default()
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(super) fn header(mem: &GuestMemoryMmap, at: u64, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(at)).unwrap();
}

pub(super) struct Rig {
    pub(super) mem: GuestMemoryMmap,
    pub(super) dev: Block,
    irq: Arc<Irq>,
    pub(super) notify: EventFd,
    health: Arc<crate::devices::virtio::DeviceHealth>,
    el: EventLoop,
    /// The queue work on the loop (removing it is what a reset does).
    worker: event_manager::SubscriberId,
}

/// A device on a mock queue whose avail ring already holds `descs`, guest memory prepared by
/// `prep` before the device starts (it serves what is queued at once).
pub(super) fn rig(
    block: Block,
    descs: &[RawDescriptor],
    event_idx: bool,
    prep: impl FnOnce(&GuestMemoryMmap),
) -> Rig {
    let features = block.features();
    rig_accepting(block, descs, event_idx, features, prep)
}

/// `rig` where the driver accepted `features`.
pub(super) fn rig_accepting(
    block: Block,
    descs: &[RawDescriptor],
    event_idx: bool,
    features: u64,
    prep: impl FnOnce(&GuestMemoryMmap),
) -> Rig {
    let mem: &'static GuestMemoryMmap = Box::leak(Box::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap(),
    ));
    let vq = MockSplitQueue::new(mem, 64);
    vq.add_desc_chains(descs, 0).unwrap();
    prep(mem);
    let mut queue: Queue = vq.create_queue().unwrap();
    queue.set_used_ring_address(Some(USED_RING as u32), Some(0));
    queue.set_event_idx(event_idx);
    let el = EventLoop::start().unwrap();
    let irq = Arc::new(Irq::default());
    let notify = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut dev = block;
    let health = Arc::new(crate::devices::virtio::DeviceHealth::new(
        "virtio-blk",
        irq.clone(),
    ));
    let worker = dev
        .activate(Activation {
            mem: crate::devices::virtio::SharedGuestMemory::new(mem.clone()),
            features,
            queues: vec![ActiveQueue {
                index: 0,
                queue,
                notify: Arc::new(notify.try_clone().unwrap()),
            }],
            interrupt: irq.clone(),
            health: health.clone(),
            dirty: Default::default(),
        })
        .map(|worker| el.handle().add(worker).unwrap())
        .unwrap();
    Rig {
        mem: mem.clone(),
        dev,
        irq,
        notify,
        health,
        el,
        worker,
    }
}

pub(super) fn wait_completed(r: &Rig, n: u64) {
    let start = Instant::now();
    while r.dev.counters()[0].completed.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "requests not completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(super) fn status(mem: &GuestMemoryMmap, at: u64) -> u8 {
    mem.read_obj(GuestAddress(at)).unwrap()
}

/// The id and length of used ring entry `i`.
pub(super) fn used(r: &Rig, i: u16) -> (u32, u32) {
    let at = USED_RING + 4 + 8 * u64::from(i);
    let id: u32 = r.mem.read_obj(GuestAddress(at)).unwrap();
    (id, r.mem.read_obj(GuestAddress(at + 4)).unwrap())
}

/// A 3-descriptor request at descriptor `at`: header, data, status.
pub(super) fn request(at: u16, n: u64, data_len: u32, data_flags: u16) -> [RawDescriptor; 3] {
    [
        d(HDR + n * 16, 16, NEXT, at + 1),
        d(DATA + n * 4096, data_len, data_flags | NEXT, at + 2),
        d(STATUS + n, 1, WRITE, 0),
    ]
}

fn write_then_read(thread_pool: bool) {
    let disk = Disk::new(if thread_pool { "pool" } else { "uring" }, 64);
    let mut block = Block::open(&disk.config(false)).unwrap();
    if thread_pool {
        block = block.with_thread_pool();
    }
    let mut descs = Vec::new();
    descs.extend(request(0, 0, 4096, 0)); // OUT sector 8
    descs.extend([d(HDR + 16, 16, NEXT, 4), d(STATUS + 1, 1, WRITE, 0)]); // FLUSH
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_OUT, 8);
        header(mem, HDR + 16, VIRTIO_BLK_T_FLUSH, 0);
        mem.write_slice(&[0x5a; 4096], GuestAddress(DATA)).unwrap();
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 2);
    assert_eq!((status(&r.mem, STATUS), status(&r.mem, STATUS + 1)), (0, 0));
    let file = std::fs::read(&disk.path).unwrap();
    assert!(file[8 * 512..8 * 512 + 4096].iter().all(|&b| b == 0x5a));
    assert!(
        file[..8 * 512].iter().all(|&b| b == 0xaa),
        "nothing else written"
    );
    assert_eq!(used(&r, 0), (0, 1));
    drop(r);
    // Read it back into guest memory.
    let descs = request(0, 0, 4096, WRITE);
    let block = Block::open(&disk.config(true)).unwrap();
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_IN, 8)
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 1);
    let mut got = vec![0u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got.iter().all(|&b| b == 0x5a));
    assert_eq!((status(&r.mem, STATUS), used(&r, 0)), (0, (0, 4097)));
}

#[test]
fn writes_reach_the_file_and_read_back_through_io_uring() {
    write_then_read(false);
}

#[test]
fn writes_reach_the_file_and_read_back_through_the_thread_pool() {
    write_then_read(true);
}

#[test]
fn a_full_queue_is_in_flight_at_once_and_completes_with_few_interrupts() {
    let disk = Disk::new("qd", 1024);
    let mut descs = Vec::new();
    for n in 0..21u16 {
        descs.extend(request(n * 3, u64::from(n), 4096, WRITE));
    }
    let block = Block::open(&disk.config(false)).unwrap();
    let r = rig(block, &descs, true, |mem| {
        for n in 0..21u64 {
            header(mem, HDR + n * 16, VIRTIO_BLK_T_IN, n * 8);
        }
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 21);
    // The interrupt follows the last completion of a batch.
    let start = Instant::now();
    while r.irq.0.load(Ordering::SeqCst) == 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let irqs = r.irq.0.load(Ordering::SeqCst);
    assert!((1..21).contains(&irqs), "{irqs} interrupts for 21 requests");
    assert_eq!(r.dev.counters()[0].malformed.load(Ordering::Relaxed), 0);
}

#[test]
fn hostile_chains_get_an_error_or_are_dropped_and_counted() {
    let disk = Disk::new("bad", 16);
    let descs = [
        // 0: a read past the end of the disk.
        d(HDR, 16, NEXT, 1),
        d(DATA, 4096, WRITE | NEXT, 2),
        d(STATUS, 1, WRITE, 0),
        // 3: a header too short.
        d(HDR + 16, 8, NEXT, 4),
        d(STATUS + 1, 1, WRITE, 0),
        // 5: a read whose data buffer the device cannot write (wrong direction).
        d(HDR + 32, 16, NEXT, 6),
        d(DATA + 4096, 512, NEXT, 7),
        d(STATUS + 2, 1, WRITE, 0),
        // 8: no status byte at all: dropped.
        d(HDR + 48, 16, 0, 0),
        // 9: data outside guest memory.
        d(HDR + 64, 16, NEXT, 10),
        d(0x4000_0000, 512, WRITE | NEXT, 11),
        d(STATUS + 4, 1, WRITE, 0),
        // 12: a write to a read-only disk.
        d(HDR + 80, 16, NEXT, 13),
        d(DATA, 512, NEXT, 14),
        d(STATUS + 5, 1, WRITE, 0),
        // 15: a zero-length read.
        d(HDR + 96, 16, NEXT, 16),
        d(DATA, 0, WRITE | NEXT, 17),
        d(STATUS + 6, 1, WRITE, 0),
        // 18: an unknown request type.
        d(HDR + 112, 16, NEXT, 19),
        d(STATUS + 7, 1, WRITE, 0),
        // 20: a descriptor loop.
        d(HDR + 128, 16, NEXT, 21),
        d(STATUS + 8, 1, WRITE | NEXT, 20),
    ];
    let before = std::fs::read(&disk.path).unwrap();
    let block = Block::open(&disk.config(true)).unwrap();
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_IN, 15);
        header(mem, HDR + 32, VIRTIO_BLK_T_IN, 0);
        header(mem, HDR + 48, VIRTIO_BLK_T_IN, 0);
        header(mem, HDR + 64, VIRTIO_BLK_T_IN, 0);
        header(mem, HDR + 80, VIRTIO_BLK_T_OUT, 0);
        header(mem, HDR + 96, VIRTIO_BLK_T_IN, 0);
        header(mem, HDR + 112, 77, 0);
        header(mem, HDR + 128, VIRTIO_BLK_T_FLUSH, 0);
        mem.write_slice(&[0x11; 4096], GuestAddress(DATA)).unwrap();
        for s in 0..9 {
            mem.write_obj(0xeeu8, GuestAddress(STATUS + s)).unwrap();
        }
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 9);
    let statuses: Vec<u8> = (0..8).map(|s| status(&r.mem, STATUS + s)).collect();
    // past end, short header, wrong direction, (no status), outside memory, read-only write,
    // zero length, unknown type.
    assert_eq!(statuses, [1, 1, 1, 0xee, 1, 1, 1, 2]);
    assert_eq!(
        used(&r, 3),
        (8, 0),
        "no status byte: returned with length 0"
    );
    let mut data = [0u8; 16];
    r.mem.read_slice(&mut data, GuestAddress(DATA)).unwrap();
    assert_eq!(data, [0x11; 16], "a refused read wrote nothing");
    assert_eq!(
        std::fs::read(&disk.path).unwrap(),
        before,
        "the read-only file is unchanged"
    );
    assert!(r.dev.counters()[0].malformed.load(Ordering::Relaxed) >= 6);
}

#[test]
fn get_id_and_config_space() {
    let disk = Disk::new("id", 2048);
    let descs = [
        d(HDR, 16, NEXT, 1),
        d(DATA, 20, WRITE | NEXT, 2),
        d(STATUS, 1, WRITE, 0),
    ];
    let block = Block::open(&disk.config(false)).unwrap();
    let mut cap = [0u8; 8];
    block.read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 2048);
    assert_eq!(block.features() & F_RO, 0);
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_GET_ID, 0)
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 1);
    let mut id = [0u8; 20];
    r.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert!(id.iter().any(|&b| b != 0));
    assert_eq!((status(&r.mem, STATUS), used(&r, 0).1), (0, 21));
    let odd = std::env::temp_dir().join(format!("exitless-blk-odd-{}", std::process::id()));
    std::fs::write(&odd, [0u8; 1000]).unwrap();
    let err = Block::open(&DiskConfig {
        path: odd.clone(),
        ..DiskConfig::default()
    })
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .contains("not a whole number of 512-byte sectors"),
        "{err}"
    );
    std::fs::remove_file(&odd).ok();
}

pub(super) const INDIRECT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;
pub(super) const TABLE: u64 = 0x40_0000;

/// Writes split descriptors `table` at `at` (an indirect table in guest memory).
pub(super) fn indirect_table(mem: &GuestMemoryMmap, at: u64, table: &[(u64, u32, u16, u16)]) {
    for (i, &(addr, len, flags, next)) in table.iter().enumerate() {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&raw, GuestAddress(at + 16 * i as u64))
            .unwrap();
    }
}

#[test]
fn a_request_through_an_indirect_table_is_served_and_a_nested_one_is_dropped() {
    let disk = Disk::new("indirect", 64);
    let descs = [
        d(TABLE, 48, INDIRECT, 0),
        // A second request whose table holds an indirect descriptor again (not allowed).
        d(TABLE + 0x1000, 16, INDIRECT, 0),
    ];
    let block = Block::open(&disk.config(false)).unwrap();
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_IN, 0);
        indirect_table(
            mem,
            TABLE,
            &[
                (HDR, 16, NEXT, 1),
                (DATA, 4096, WRITE | NEXT, 2),
                (STATUS, 1, WRITE, 0),
            ],
        );
        indirect_table(mem, TABLE + 0x1000, &[(TABLE, 48, INDIRECT, 0)]);
        mem.write_obj(0xffu8, GuestAddress(STATUS + 1)).unwrap();
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 1);
    let start = Instant::now();
    while r.dev.counters()[0].malformed.load(Ordering::Relaxed) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nested table not counted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Both chains are back in the used ring (its index follows the counters).
    while r.mem.read_obj::<u16>(GuestAddress(USED_RING + 2)).unwrap() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "used ring not filled"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = vec![0u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got.iter().all(|&b| b == 0xaa), "the disk's bytes were read");
    assert_eq!(status(&r.mem, STATUS), 0);
    // The nested chain is returned empty (so the guest gets its descriptor back), the good one
    // with its data and status; the malformed one completes first.
    let mut entries = [used(&r, 0), used(&r, 1)];
    entries.sort();
    assert_eq!(entries, [(0, 4097), (1, 0)]);
    assert_eq!(
        status(&r.mem, STATUS + 1),
        0xff,
        "nothing written for the nested table"
    );
}

/// Found by the virtio_transport fuzz target (on virtio-rng, which shares the loop): an
/// available index far past what the ring holds made the serve loop spin forever on the
/// event loop thread. Now the loop ends, the ring is counted broken once, the device needs a
/// reset (its queue waits for it), and the event loop serves everything else.
#[test]
fn an_available_index_past_the_ring_ends_the_serve_loop_and_is_counted() {
    let disk = Disk::new("stall", 64);
    let descs = request(0, 0, 512, WRITE);
    let block = Block::open(&disk.config(false)).unwrap();
    let r = rig(block, &descs, true, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_IN, 0);
        // The mock's available ring follows its 64-entry descriptor table; idx is its 2nd u16.
        mem.write_obj(0x8000u16, GuestAddress(64 * 16 + 2)).unwrap();
    });
    r.notify.write(1).unwrap();
    let start = Instant::now();
    while r.dev.counters()[0].malformed.load(Ordering::Relaxed) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "serve loop did not end"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(r.health.needs_reset());
    assert_eq!(r.irq.configs(), 1, "the driver is told once");
    // The event loop is free: more notifies are taken without touching the broken ring.
    for _ in 0..100 {
        r.notify.write(1).unwrap();
    }
    r.el.handle().call(|_| {}).unwrap();
    assert_eq!(r.dev.counters()[0].malformed.load(Ordering::Relaxed), 1);
    assert_eq!(r.health.broken_rings.load(Ordering::Relaxed), 1);
}

/// Reads on a disk whose "image" is a FIFO wait until the test writes to it: a reset (the
/// transport removes the queue work from the loop) with all of them in flight must end them
/// first, so that data arriving afterwards lands nowhere.
#[test]
fn a_reset_with_reads_in_flight_ends_them_and_later_data_touches_no_guest_memory() {
    let path = std::env::temp_dir().join(format!("exitless-blk-fifo-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let config = DiskConfig {
        path: path.clone(),
        lock: false,
        probe_format: false,
        ..DiskConfig::default()
    };
    let mut block = Block::open(&config).unwrap();
    block.shape.capacity_bytes = 1 << 20;
    block.capacity.store(1 << 20, Ordering::Relaxed);
    let n = 8u16;
    let mut descs = Vec::new();
    for i in 0..n {
        descs.extend(request(i * 3, u64::from(i), 4096, WRITE));
    }
    let r = rig(block, &descs, false, |mem| {
        for i in 0..u64::from(n) {
            header(mem, HDR + i * 16, VIRTIO_BLK_T_IN, i * 8);
        }
        mem.write_slice(&vec![0x77; 4096 * usize::from(n)], GuestAddress(DATA))
            .unwrap();
    });
    if DiskIo::new(r.dev.file.clone(), false, 8).unwrap().name() != "io_uring" {
        return crate::test_skip::skip("blk_reset_in_flight", "io_uring unavailable");
    }
    // The worker started every read when it joined the loop; none can have completed.
    r.el.handle().remove(r.worker).unwrap();
    let _ = std::fs::remove_file(&path);
    let fifo = std::path::Path::new("/proc/self/fd").join(r.dev.file.as_raw_fd().to_string());
    let open = |write: bool| {
        std::fs::OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let sent = vec![0x11u8; 4096 * usize::from(n)];
    std::io::Write::write_all(&mut open(true), &sent).unwrap();
    let mut left = vec![0u8; sent.len() + 1];
    let got = std::io::Read::read(&mut open(false), &mut left).unwrap_or(0);
    assert_eq!(got, sent.len(), "a read consumed data after the reset");
    let mut data = vec![0u8; sent.len()];
    r.mem.read_slice(&mut data, GuestAddress(DATA)).unwrap();
    assert!(
        data.iter().all(|&b| b == 0x77),
        "guest memory written after the reset"
    );
    assert_eq!(r.dev.counters()[0].completed.load(Ordering::Relaxed), 0);
    let stats = r.dev.stats();
    assert_eq!(
        stats.stopped_in_flight.load(Ordering::Relaxed),
        u64::from(n)
    );
    assert_eq!(stats.abandoned.load(Ordering::Relaxed), 0);
}
