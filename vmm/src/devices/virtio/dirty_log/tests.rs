use super::*;
use crate::devices::virtio::test_support::desc;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;

const NEXT: u16 = DESC_F_NEXT;
const WRITE: u16 = DESC_F_WRITE;
const INDIRECT: u16 = DESC_F_INDIRECT;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
}

/// Queue of 16 over `mem`, descriptor `i` of its table set to each `(i, addr, len, flags,
/// next)`.
fn queue(mem: &GuestMemoryMmap, descs: &[(u16, u64, u32, u16, u16)]) -> Queue {
    let vq = MockSplitQueue::new(mem, 16);
    for &(i, addr, len, flags, next) in descs {
        vq.desc_table()
            .store(i, desc(addr, len, flags, next))
            .unwrap();
    }
    vq.create_queue().unwrap()
}

fn pages(of: &[u64]) -> Vec<u64> {
    of.iter().map(|a| a / PAGE).collect()
}

#[test]
fn off_it_marks_nothing_and_on_it_marks_the_writable_descriptors_pages() {
    let mem = memory();
    // A read-only header, a writable buffer across a page boundary, a writable status byte.
    let q = queue(
        &mem,
        &[
            (0, 0x10000, 16, NEXT, 1),
            (1, 0x20f00, 0x200, WRITE | NEXT, 2),
            (2, 0x30000, 1, WRITE, 0),
        ],
    );
    let log = DeviceDirtyLog::default();
    log.completing(&mem, &q, 0);
    log.start();
    assert!(log.take(&mem).is_empty(), "nothing marked while off");
    log.completing(&mem, &q, 0);
    assert_eq!(log.take(&mem), pages(&[0x20000, 0x21000, 0x30000]));
    assert!(log.take(&mem).is_empty(), "a harvest clears the log");
    log.completing(&mem, &q, 0);
    log.stop();
    log.start();
    assert!(log.take(&mem).is_empty(), "stopping forgets the marks");
}

#[test]
fn indirect_tables_are_walked() {
    let mem = memory();
    let table = 0x40000;
    let q = queue(&mem, &[(3, table, 3 * 16, INDIRECT, 0)]);
    let entries = [
        desc(0x50000, 16, NEXT, 1),
        desc(0x60000, 0x3000, WRITE | NEXT, 2),
        desc(0x70000, 8, WRITE, 0),
    ];
    for (i, d) in entries.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(table + 16 * i as u64))
            .unwrap();
    }
    let log = DeviceDirtyLog::default();
    log.start();
    log.completing(&mem, &q, 3);
    let want = pages(&[0x60000, 0x61000, 0x62000, 0x70000]);
    assert_eq!(log.take(&mem), want);
}

#[test]
fn a_looping_chain_or_nested_tables_end_the_walk_and_outside_memory_is_skipped() {
    let mem = memory();
    // 0 -> 1 -> 0 -> ...: the walk stops after the queue's size of descriptors.
    let q = queue(
        &mem,
        &[
            (0, 0x8000, 8, WRITE | NEXT, 1),
            (1, 0x4000_0000, 0x1000, WRITE | NEXT, 0),
            (5, 0x9000, 16, INDIRECT, 0),
        ],
    );
    // An indirect table whose one entry is another indirect table.
    mem.write_obj(desc(0xa000, 16, INDIRECT, 0), GuestAddress(0x9000))
        .unwrap();
    let log = DeviceDirtyLog::default();
    log.start();
    log.completing(&mem, &q, 0);
    log.completing(&mem, &q, 5);
    log.completing(&mem, &q, 200);
    assert_eq!(log.take(&mem), pages(&[0x8000]));
    // A buffer running past the end of guest memory marks only what is memory.
    log.mark_range(&mem, (1 << 20) - 0x1000, 1 << 40);
    assert_eq!(log.take(&mem), [(1 << 20) / PAGE - 1]);
}

#[test]
fn used_rings_are_reported_whole_at_every_harvest() {
    let mem = memory();
    let log = DeviceDirtyLog::default();
    // 256 elements: 6 + 2048 bytes from 0x7f800, over two pages.
    log.add_ring("virtio-blk0", 0, 0x7f800, 256);
    log.add_ring("virtio-blk0", 0, 0x7f800, 256);
    log.start();
    assert_eq!(log.take(&mem), pages(&[0x7f000, 0x80000]));
    assert_eq!(log.take(&mem), pages(&[0x7f000, 0x80000]));
}

#[test]
fn marks_span_words_of_the_bitmap() {
    let mem = memory();
    let log = DeviceDirtyLog::default();
    log.start();
    // Pages 60..=130: across three words.
    log.mark_range(&mem, 60 * PAGE + 1, 70 * PAGE);
    assert_eq!(log.take(&mem), (60..=130).collect::<Vec<u64>>());
}
