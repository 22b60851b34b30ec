//! virtio-pmem: the file mapped (created, grown, private), a flush that reaches the file, and
//! the guest's malformed or unknown requests counted and answered, never a panic.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EFD_NONBLOCK;

use super::*;
use crate::config::PmemConfig;
use crate::devices::virtio::test_support::{desc as test_desc, CountingIrq};
use crate::devices::virtio::{ActiveQueue, SharedGuestMemory};
use crate::event_loop::EventLoop;

const WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
const NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;

fn scratch(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("exitless-pmem-{name}-{}", std::process::id()))
}

fn config(file: &std::path::Path, size: Option<u64>, discard_writes: bool) -> PmemConfig {
    PmemConfig {
        file: file.to_path_buf(),
        size,
        discard_writes,
        id: None,
    }
}

/// Writes `bytes` at `offset` of the mapping, as the guest's stores do.
fn store(m: &PmemMapping, offset: usize, bytes: &[u8]) {
    assert!(offset + bytes.len() <= m.len() as usize);
    // SAFETY: the range lies inside the live mapping, which nothing else writes meanwhile.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), m.host_address().add(offset), bytes.len())
    };
}

#[test]
fn the_file_is_created_grown_or_refused_and_private_writes_stay_out_of_it() {
    let path = scratch("map");
    let m = PmemMapping::open(&config(&path, Some(2 << 20), false)).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 << 20);
    store(&m, 4096, b"persisted");
    m.sync().unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[4096..4105], b"persisted");
    drop(m);
    let m = PmemMapping::open(&config(&path, None, true)).unwrap();
    store(&m, 4096, b"discarded");
    m.sync().unwrap();
    drop(m);
    assert_eq!(&std::fs::read(&path).unwrap()[4096..4105], b"persisted");
    std::fs::write(&path, vec![0u8; 4096]).unwrap();
    let e = PmemMapping::open(&config(&path, None, false)).unwrap_err();
    assert!(e.to_string().contains("multiple of 2 MiB"), "{e}");
    std::fs::remove_file(&path).ok();
    let e = PmemMapping::open(&config(&path, None, false)).unwrap_err();
    assert!(e.to_string().contains("Cannot open the pmem file"), "{e}");
}

fn d(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    test_desc(addr, len, flags, next)
}

#[test]
fn a_flush_reaches_the_file_and_bad_requests_are_counted() {
    let path = scratch("flush");
    let mapping = Arc::new(PmemMapping::open(&config(&path, Some(2 << 20), false)).unwrap());
    let mut dev = Pmem::new(mapping.clone(), 1 << 32);
    let mut space = [0u8; 16];
    dev.read_config(0, &mut space);
    assert_eq!(u64::from_le_bytes(space[..8].try_into().unwrap()), 1 << 32);
    assert_eq!(u64::from_le_bytes(space[8..].try_into().unwrap()), 2 << 20);
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    mem.write_obj(0u32, GuestAddress(0x8000)).unwrap(); // FLUSH
    mem.write_obj(7u32, GuestAddress(0x8100)).unwrap(); // unknown
    for at in [0x9000u64, 0x9100, 0x9200] {
        mem.write_obj(0xffu32, GuestAddress(at)).unwrap();
    }
    let vq = MockSplitQueue::new(&mem, 16);
    // 0-1: a flush. 2-3: an unknown type. 4: no answer part. 5-6: the answer first.
    // 7-8: the answer outside guest memory.
    let table = [
        d(0x8000, 4, NEXT, 1),
        d(0x9000, 4, WRITE, 0),
        d(0x8100, 4, NEXT, 3),
        d(0x9100, 4, WRITE, 0),
        d(0x8000, 4, 0, 0),
        d(0x9200, 4, WRITE | NEXT, 6),
        d(0x8000, 4, 0, 0),
        d(0x8000, 4, NEXT, 8),
        d(0x4000_0000, 4, WRITE, 0),
    ];
    for (i, t) in table.iter().enumerate() {
        vq.desc_table().store(i as u16, *t).unwrap();
    }
    for (slot, head) in [0u16, 2, 4, 5, 7].into_iter().enumerate() {
        vq.avail().ring().ref_at(slot).unwrap().store(head.to_le());
    }
    vq.avail().idx().store(5u16.to_le());
    store(&mapping, 0, b"guest wrote this");
    let irq = Arc::new(CountingIrq::default());
    let el = EventLoop::start().unwrap();
    let notify = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let worker = dev
        .activate(Activation {
            mem: SharedGuestMemory::new(mem.clone()),
            features: VIRTIO_F_VERSION_1,
            queues: vec![ActiveQueue {
                index: 0,
                queue: vq.create_queue().unwrap(),
                notify,
            }],
            interrupt: irq.clone(),
            health: crate::devices::virtio::test_support::health(),
            dirty: Default::default(),
        })
        .unwrap();
    el.handle().add(worker).unwrap();
    let start = Instant::now();
    while dev.counters()[0].completed.load(Ordering::Relaxed) < 5 {
        assert!(start.elapsed() < Duration::from_secs(5), "queue not served");
        std::thread::sleep(Duration::from_millis(1));
    }
    let ret = |at: u64| mem.read_obj::<u32>(GuestAddress(at)).unwrap();
    assert_eq!(
        (ret(0x9000), ret(0x9100), ret(0x9200)),
        (RESP_OK, RESP_EIO, 0xff)
    );
    assert_eq!(dev.counters()[0].malformed.load(Ordering::Relaxed), 3);
    let counters: std::collections::BTreeMap<_, _> = dev.device_counters().into_iter().collect();
    assert_eq!((counters["flushes"], counters["unknown_requests"]), (1, 1));
    assert_eq!(&std::fs::read(&path).unwrap()[..16], b"guest wrote this");
    std::fs::remove_file(&path).ok();
}
