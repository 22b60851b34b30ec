//! Quiescing the disk backends: operations still waiting on the host when the device stops are
//! cancelled and reaped before `quiesce` returns, and touch no buffer afterwards. The "disk" is
//! the read end of a pipe, so reads wait until the test writes: their completions can only come
//! after the quiesce, deterministically.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;

use super::*;

const BUF: usize = 4096;
const OPS: usize = 8;
const UNTOUCHED: u8 = 0x5a;

/// The read and write ends of a new pipe.
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors the call writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned by nothing else.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Heap buffers and a read into each, pushed and submitted on `io`.
fn reads_in_flight(io: &mut DiskIo) -> (Vec<Box<[u8]>>, Vec<IoOp>) {
    let mut bufs: Vec<Box<[u8]>> = (0..OPS)
        .map(|_| vec![UNTOUCHED; BUF].into_boxed_slice())
        .collect();
    let ops: Vec<IoOp> = bufs
        .iter_mut()
        .enumerate()
        .map(|(slot, b)| IoOp {
            slot: slot as u32,
            kind: IoKind::Read,
            offset: 0,
            iovecs: Iovecs(vec![libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: BUF,
            }]),
            durable: false,
        })
        .collect();
    for op in &ops {
        io.push(op).unwrap();
    }
    io.submit().unwrap();
    (bufs, ops)
}

/// After `quiesce`, data reaching the pipe is all still in it and no buffer changed.
fn nothing_reads_after(rx: &File, mut tx: File, bufs: &[Box<[u8]>]) {
    let sent = vec![0xa5u8; OPS * BUF];
    tx.write_all(&sent).unwrap();
    drop(tx);
    let mut left = Vec::new();
    (&*rx).read_to_end(&mut left).unwrap();
    assert_eq!(
        left.len(),
        sent.len(),
        "an operation consumed pipe data after quiesce"
    );
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            b.iter().all(|&x| x == UNTOUCHED),
            "buffer {i} written after quiesce"
        );
    }
}

fn uring_over_pipe(any_refused: bool) {
    let (rx, tx) = pipe();
    let rx = Arc::new(rx);
    let mut io = DiskIo::new(rx.clone(), false, 64).unwrap();
    let DiskIo::Uring(u) = &mut io else {
        crate::test_skip::skip("blk_io_quiesce", "io_uring unavailable on this host");
        return;
    };
    u.any_refused = any_refused; // the one-by-one cancels of kernels before 5.19
    let (bufs, ops) = reads_in_flight(&mut io);
    assert_eq!(io.in_flight(), OPS);
    let q = io.quiesce(QUIESCE_BOUND);
    assert_eq!(
        q,
        Quiesced {
            reaped: OPS,
            left: 0
        }
    );
    assert_eq!(io.in_flight(), 0);
    drop(io);
    drop(ops);
    nothing_reads_after(&rx, tx, &bufs);
}

#[test]
fn quiesce_cancels_and_reaps_every_uring_read_before_it_returns() {
    uring_over_pipe(false);
}

#[test]
fn quiesce_cancels_one_by_one_where_the_kernel_refuses_cancel_any() {
    uring_over_pipe(true);
}

#[test]
fn the_pool_quiesces_queued_jobs_and_leaves_none_in_flight() {
    let path = std::env::temp_dir().join(format!("exitless-io-quiesce-{}", std::process::id()));
    std::fs::write(&path, vec![0x11u8; BUF]).unwrap();
    let file = Arc::new(File::open(&path).unwrap());
    let _ = std::fs::remove_file(&path);
    let mut io = DiskIo::new(file, true, 64).unwrap();
    let (bufs, ops) = reads_in_flight(&mut io);
    let q = io.quiesce(QUIESCE_BOUND);
    assert_eq!(
        q,
        Quiesced {
            reaped: OPS,
            left: 0
        }
    );
    assert_eq!(io.in_flight(), 0);
    // Each read either ran whole before the cancel or never touched its buffer.
    for b in &bufs {
        assert!(b.iter().all(|&x| x == UNTOUCHED) || b.iter().all(|&x| x == 0x11));
    }
    drop(io);
    drop(ops);
}

#[test]
fn reaping_counts_completions_out_of_the_in_flight_count() {
    let (rx, mut tx) = pipe();
    let mut io = DiskIo::new(Arc::new(rx), false, 64).unwrap();
    if io.name() != "io_uring" {
        crate::test_skip::skip("blk_io_quiesce", "io_uring unavailable on this host");
        return;
    }
    let (bufs, ops) = reads_in_flight(&mut io);
    tx.write_all(&vec![0x33u8; OPS * BUF]).unwrap();
    let mut done = Vec::new();
    for _ in 0..1000 {
        io.reap(&mut done);
        if done.len() == OPS {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(done.len(), OPS);
    assert_eq!(io.in_flight(), 0);
    assert_eq!(io.quiesce(QUIESCE_BOUND), Quiesced { reaped: 0, left: 0 });
    drop(ops);
    drop(bufs);
}
