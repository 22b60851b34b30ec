//! virtio-blk durability and limits: write-through without FLUSH (both backends), FLUSH still
//! syncing, direct=on with unaligned guest buffers, seg_max, request size, the in-flight
//! budget, and an operation the kernel refuses at submission.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vm_memory::GuestAddress;

use super::io::dirty_pages;
use super::request::*;
use super::tests::*;
use super::*;
use crate::devices::virtio::test_support::desc as d;

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The disk's file, with everything written so far on stable storage.
fn synced(disk: &Disk) -> File {
    let f = OpenOptions::new().read(true).open(&disk.path).unwrap();
    f.sync_all().unwrap();
    f
}

/// `n` 4 KiB writes of `0x5a` (then optionally a flush), the driver accepting `features`.
fn writes(disk: &Disk, thread_pool: bool, features: u64, n: u16, flush: bool) -> Rig {
    writes_through(
        disk,
        thread_pool,
        WriteThrough::GroupSync,
        features,
        n,
        flush,
    )
}

/// `writes`, write-through made durable `how`.
fn writes_through(
    disk: &Disk,
    thread_pool: bool,
    how: WriteThrough,
    features: u64,
    n: u16,
    flush: bool,
) -> Rig {
    let mut block = Block::open(&disk.config(false))
        .unwrap()
        .with_write_through(how);
    if thread_pool {
        block = block.with_thread_pool();
    }
    let mut descs = Vec::new();
    for i in 0..n {
        descs.extend(request(i * 3, u64::from(i), 4096, 0));
    }
    let at = 3 * n;
    if flush {
        descs.extend([
            d(HDR + 16 * u64::from(n), 16, NEXT, at + 1),
            d(STATUS + u64::from(n), 1, WRITE, 0),
        ]);
    }
    let r = rig_accepting(block, &descs, false, features, |mem| {
        for i in 0..u64::from(n) {
            header(mem, HDR + 16 * i, VIRTIO_BLK_T_OUT, 8 * i);
            mem.write_slice(&[0x5a; 4096], GuestAddress(DATA + 4096 * i))
                .unwrap();
        }
        header(mem, HDR + 16 * u64::from(n), VIRTIO_BLK_T_FLUSH, 0);
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, u64::from(n) + u64::from(flush));
    for i in 0..u64::from(n) + u64::from(flush) {
        assert_eq!(status(&r.mem, STATUS + i), VIRTIO_BLK_S_OK, "request {i}");
    }
    r
}

fn write_through_without_flush(thread_pool: bool, how: WriteThrough) {
    let disk = Disk::new(&format!("wt-{thread_pool}-{how:?}"), 256);
    let file = synced(&disk);
    let features = Block::open(&disk.config(false)).unwrap().features() & !F_FLUSH;
    let r = writes_through(&disk, thread_pool, how, features, 8, false);
    let stats = r.dev.stats();
    // Every completed write was made durable (RWF_DSYNC, or the device's fdatasync after
    // it), none left to the cache only...
    assert_eq!(
        (load(&stats.writes_durable), load(&stats.writes_cached)),
        (8, 0)
    );
    let syncs = load(&stats.write_syncs);
    match how {
        WriteThrough::Dsync => assert_eq!(syncs, 0),
        WriteThrough::GroupSync => assert!((1..=8).contains(&syncs), "{syncs} syncs"),
    }
    // ...and the host's page cache holds nothing of the file not yet on disk.
    assert_eq!(
        dirty_pages(&file).unwrap(),
        0,
        "a completed write is not durable"
    );
    let data = std::fs::read(&disk.path).unwrap();
    assert!(data[..8 * 4096].iter().all(|&b| b == 0x5a));
}

#[test]
fn without_flush_every_write_completes_durable_through_io_uring() {
    write_through_without_flush(false, WriteThrough::GroupSync);
    write_through_without_flush(false, WriteThrough::Dsync);
}

#[test]
fn without_flush_every_write_completes_durable_through_the_thread_pool() {
    write_through_without_flush(true, WriteThrough::GroupSync);
    write_through_without_flush(true, WriteThrough::Dsync);
}

fn cached_until_flush(thread_pool: bool) {
    let disk = Disk::new(if thread_pool { "wb-pool" } else { "wb-uring" }, 256);
    let file = synced(&disk);
    let features = Block::open(&disk.config(false)).unwrap().features();
    let r = writes(&disk, thread_pool, features, 8, false);
    let stats = r.dev.stats();
    assert_eq!(
        (load(&stats.writes_durable), load(&stats.writes_cached)),
        (0, 8)
    );
    // Cached writes leave dirty pages (the check above can fail)...
    assert!(dirty_pages(&file).unwrap() > 0, "writes were not cached");
    drop(r);
    // ...and a FLUSH writes back what completed before it, before it completes itself.
    let r = writes(&disk, thread_pool, features, 0, true);
    assert_eq!(load(&r.dev.stats().flushes), 1);
    assert_eq!(dirty_pages(&file).unwrap(), 0, "the flush left dirty pages");
}

#[test]
fn with_flush_writes_are_cached_and_flush_syncs_them_through_io_uring() {
    cached_until_flush(false);
}

#[test]
fn with_flush_writes_are_cached_and_flush_syncs_them_through_the_thread_pool() {
    cached_until_flush(true);
}

/// A direct=on device serving `descs` (guest memory prepared by `prep`).
fn direct_rig(disk: &Disk, descs: &[RawDesc], prep: impl FnOnce(&GuestMemoryMmap)) -> Rig {
    let config = DiskConfig {
        direct: true,
        ..disk.config(false)
    };
    let block = Block::open(&config).unwrap();
    assert!(block.direct.is_some());
    rig(block, descs, false, prep)
}

type RawDesc = virtio_queue::desc::RawDescriptor;

#[test]
fn direct_on_moves_unaligned_guest_buffers_through_a_bounce_buffer() {
    let disk = Disk::new("direct", 256);
    let pattern = |i: usize| (i * 7 + i / 511) as u8;
    let data: Vec<u8> = (0..4096).map(pattern).collect();
    // Write 4 KiB at sector 8 from an odd address, and 512 bytes at sector 0 in two
    // segments of 100 and 412 bytes.
    let descs = [
        d(HDR, 16, NEXT, 1),
        d(DATA + 1, 4096, NEXT, 2),
        d(STATUS, 1, WRITE, 0),
        d(HDR + 16, 16, NEXT, 4),
        d(DATA + 0x2000, 100, NEXT, 5),
        d(DATA + 0x3000, 412, NEXT, 6),
        d(STATUS + 1, 1, WRITE, 0),
    ];
    let r = direct_rig(&disk, &descs, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_OUT, 8);
        header(mem, HDR + 16, VIRTIO_BLK_T_OUT, 0);
        mem.write_slice(&data, GuestAddress(DATA + 1)).unwrap();
        mem.write_slice(&data[..100], GuestAddress(DATA + 0x2000))
            .unwrap();
        mem.write_slice(&data[100..512], GuestAddress(DATA + 0x3000))
            .unwrap();
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 2);
    assert_eq!((status(&r.mem, STATUS), status(&r.mem, STATUS + 1)), (0, 0));
    assert_eq!(load(&r.dev.stats().bounced), 2);
    let file = std::fs::read(&disk.path).unwrap();
    assert_eq!(&file[8 * 512..8 * 512 + 4096], &data[..]);
    assert_eq!(&file[..512], &data[..512]);
    drop(r);
    // Read both back: into an odd address, and into an aligned buffer (no bounce).
    let descs = [
        d(HDR, 16, NEXT, 1),
        d(DATA + 0x10003, 4096, WRITE | NEXT, 2),
        d(STATUS, 1, WRITE, 0),
        d(HDR + 16, 16, NEXT, 4),
        d(DATA + 0x20000, 512, WRITE | NEXT, 5),
        d(STATUS + 1, 1, WRITE, 0),
    ];
    let r = direct_rig(&disk, &descs, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_IN, 8);
        header(mem, HDR + 16, VIRTIO_BLK_T_IN, 0);
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 2);
    let mut got = vec![0u8; 4096];
    r.mem
        .read_slice(&mut got, GuestAddress(DATA + 0x10003))
        .unwrap();
    assert_eq!(got, data, "the unaligned read differs");
    let mut got = vec![0u8; 512];
    r.mem
        .read_slice(&mut got, GuestAddress(DATA + 0x20000))
        .unwrap();
    assert_eq!(got, data[..512]);
    assert_eq!(load(&r.dev.stats().bounced), 1, "only the unaligned read");
}

#[test]
fn direct_open_refused_says_which_file_and_that_direct_off_works() {
    let e = BlockError::DirectRefused("/x/disk.img".into()).to_string();
    assert_eq!(
        e,
        "Disk /x/disk.img: the file system refuses direct I/O (O_DIRECT); direct=off works"
    );
    assert!(!e.contains('\n'));
}

/// An indirect table at TABLE: the header, `segments` 8-byte data buffers (all the same
/// guest bytes) and the status byte.
fn long_table(mem: &GuestMemoryMmap, segments: u16) {
    let mut table = vec![(HDR, 16, NEXT, 1)];
    for i in 0..segments {
        table.push((DATA, 8, WRITE | NEXT, i + 2));
    }
    table.push((STATUS, 1, WRITE, 0));
    indirect_table(mem, TABLE, &table);
}

#[test]
fn a_chain_longer_than_seg_max_gets_an_io_error_and_one_within_it_is_served() {
    let disk = Disk::new("segmax", 2048);
    for (segments, want) in [(65024u16, VIRTIO_BLK_S_IOERR), (192, VIRTIO_BLK_S_OK)] {
        let len = 16 * (u32::from(segments) + 2);
        let r = rig(
            Block::open(&disk.config(false)).unwrap(),
            &[d(TABLE, len, INDIRECT, 0)],
            false,
            |mem| {
                header(mem, HDR, VIRTIO_BLK_T_IN, 0);
                long_table(mem, segments);
            },
        );
        r.notify.write(1).unwrap();
        wait_completed(&r, 1);
        assert_eq!(status(&r.mem, STATUS), want, "{segments} segments");
        let too_long = u64::from(want == VIRTIO_BLK_S_IOERR);
        assert_eq!(load(&r.dev.stats().too_long), too_long);
    }
}

#[test]
fn a_request_past_seg_max_times_size_max_bytes_gets_an_io_error() {
    let disk = Disk::new("big", 12288); // 6 MiB: the request is not past the end
    let big = (MAX_REQUEST_BYTES + SECTOR) as u32;
    // Writes: the data is only read from guest memory (a read would overwrite the statuses).
    let descs = [
        request(0, 0, big, 0),
        request(3, 1, MAX_REQUEST_BYTES as u32, 0),
    ]
    .concat();
    let block = Block::open(&disk.config(false)).unwrap();
    let mut cfg = [0u8; 8];
    block.read_config(8, &mut cfg);
    let (size_max, seg_max) = (
        u32::from_le_bytes(cfg[..4].try_into().unwrap()),
        u32::from_le_bytes(cfg[4..].try_into().unwrap()),
    );
    assert_eq!(u64::from(size_max) * u64::from(seg_max), MAX_REQUEST_BYTES);
    assert_ne!(block.features() & F_SIZE_MAX, 0);
    let r = rig(block, &descs, false, |mem| {
        header(mem, HDR, VIRTIO_BLK_T_OUT, 0);
        header(mem, HDR + 16, VIRTIO_BLK_T_OUT, 0);
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 2);
    assert_eq!(status(&r.mem, STATUS), VIRTIO_BLK_S_IOERR);
    assert_eq!(status(&r.mem, STATUS + 1), VIRTIO_BLK_S_OK);
}

#[test]
fn requests_past_the_in_flight_budget_wait_in_the_ring_and_all_complete() {
    let disk = Disk::new("budget", 16384); // 8 MiB
    let len = (MAX_INFLIGHT_BYTES / 2 + SECTOR) as u32; // two never fit together
    let descs = [
        d(HDR, 16, NEXT, 1),
        d(0x10_0000 + 0x1000, len, WRITE | NEXT, 2),
        d(STATUS, 1, WRITE, 0),
        d(HDR + 16, 16, NEXT, 4),
        d(0x10_0000 + 0x1000, len, WRITE | NEXT, 5),
        d(STATUS + 1, 1, WRITE, 0),
        d(HDR + 32, 16, NEXT, 7),
        d(0x10_0000 + 0x1000, len, WRITE | NEXT, 8),
        d(STATUS + 2, 1, WRITE, 0),
    ];
    let block = Block::open(&disk.config(false)).unwrap();
    let r = rig(block, &descs, false, |mem| {
        for i in 0..3 {
            header(mem, HDR + 16 * i, VIRTIO_BLK_T_IN, 8 * i);
        }
    });
    r.notify.write(1).unwrap();
    wait_completed(&r, 3);
    for i in 0..3 {
        assert_eq!(status(&r.mem, STATUS + i), VIRTIO_BLK_S_OK);
    }
    assert!(load(&r.dev.stats().deferred) >= 2, "the budget never held");
}

/// Found by a hostile guest (issue 24 #4): a read with more buffers than the kernel takes
/// (1,536 > UIO_MAXIOV) ahead of a good read in one batch. The first is refused when it is
/// submitted; the second must still run, without another submit.
#[test]
fn an_operation_refused_at_submission_holds_back_no_other() {
    let disk = Disk::new("refused", 16);
    let file = Arc::new(OpenOptions::new().read(true).open(&disk.path).unwrap());
    let mut buf = vec![0u8; 4096];
    for thread_pool in [false, true] {
        let mut io = DiskIo::new(file.clone(), thread_pool, 8).unwrap();
        let base = buf.as_mut_ptr();
        let iov = |n: usize, len: usize| {
            Iovecs(
                (0..n)
                    .map(|_| libc::iovec {
                        iov_base: base.cast(),
                        iov_len: len,
                    })
                    .collect(),
            )
        };
        let op = |slot, iovecs| IoOp {
            slot,
            kind: IoKind::Read,
            offset: 0,
            iovecs,
            durable: false,
        };
        let (bad, good) = (op(1, iov(1536, 1)), op(2, iov(1, 4096)));
        io.push(&bad).unwrap();
        io.push(&good).unwrap();
        io.submit().unwrap();
        let mut done = Vec::new();
        let start = Instant::now();
        while done.len() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{}: completed only {done:?}",
                io.name()
            );
            io.reap(&mut done);
            std::thread::sleep(Duration::from_millis(1));
        }
        done.sort_by_key(|c| c.slot);
        assert!(done[0].result.is_err(), "{}: {done:?}", io.name());
        assert_eq!(done[1].result.as_ref().ok(), Some(&4096), "{}", io.name());
    }
}
