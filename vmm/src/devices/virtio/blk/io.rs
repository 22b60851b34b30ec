//! Asynchronous disk I/O for virtio-blk, straight between the image file and guest memory:
//! io_uring (one submit per batch of requests, completions signalled on an eventfd), or
//! where the host refuses io_uring, a small thread pool doing preadv/pwritev/fdatasync.
//! Either way every request of a batch is in flight at once: a queue depth of 32 in the
//! guest is 32 requests on the host. A write marked `durable` completes only once its data is
//! on stable storage (RWF_DSYNC on the one write: no second operation, no second syscall).
//!
//! Stopping: an operation the host started writes into its buffers until it ends, whatever
//! happens to the ring or the threads. So before the owner of the buffers (the device worker)
//! lets go of them, [`DiskIo::quiesce`] cancels every operation in flight (io_uring's
//! IORING_OP_ASYNC_CANCEL; the pool's queued jobs are skipped) and reaps every completion,
//! waiting for the ones already running; what is still running after the bound is reported,
//! and the owner leaks its buffers rather than free memory the kernel may still write.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// What one operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// Data reaches the file's storage (fdatasync) before it completes.
    Flush,
}

/// Host buffers of one operation: pointers into guest memory or a bounce buffer. The device
/// keeps the memory they point at (its map of guest memory, its bounce buffers) until the
/// operation was reaped, [`DiskIo::quiesce`] included, and leaks it if that never happens.
pub struct Iovecs(pub Vec<libc::iovec>);

/// How long [`DiskIo::quiesce`] waits for operations that could not be cancelled (already
/// running on the host) before giving up on them.
pub const QUIESCE_BOUND: Duration = Duration::from_secs(10);

/// What [`DiskIo::quiesce`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiesced {
    /// Operations that ended (completed, failed or cancelled) during the call.
    pub reaped: usize,
    /// Operations still running on the host when the bound was reached: their buffers must
    /// never be freed.
    pub left: usize,
}

// SAFETY: the pointers refer to guest memory shared by the whole VMM, not to memory owned by
// the submitting thread; moving them to another thread changes nothing about their validity.
unsafe impl Send for Iovecs {}

/// One operation, identified by `slot` in its completion.
pub struct IoOp {
    pub slot: u32,
    pub kind: IoKind,
    pub offset: u64,
    pub iovecs: Iovecs,
    /// A write that completes only after its data reached stable storage (RWF_DSYNC).
    pub durable: bool,
}

impl IoOp {
    /// The RWF_* flags of the operation's read or write.
    fn rw_flags(&self) -> libc::c_int {
        if self.durable && self.kind == IoKind::Write {
            libc::RWF_DSYNC
        } else {
            0
        }
    }
}

/// An ended operation: bytes moved, or the error.
#[derive(Debug)]
pub struct Completion {
    pub slot: u32,
    pub result: io::Result<usize>,
}

/// Which backend runs the I/O.
pub enum DiskIo {
    Uring(Box<Uring>),
    Pool(Pool),
}

impl DiskIo {
    /// io_uring unless `thread_pool` or the host refuses it (then says why, once).
    pub fn new(file: Arc<File>, thread_pool: bool, entries: u32) -> io::Result<Self> {
        if !thread_pool {
            match Uring::new(file.clone(), entries) {
                Ok(u) => return Ok(DiskIo::Uring(Box::new(u))),
                Err(e) => {
                    eprintln!("exitless: io_uring unavailable ({e}); disk I/O on a thread pool")
                }
            }
        }
        Ok(DiskIo::Pool(Pool::new(file, 4)?))
    }

    pub fn name(&self) -> &'static str {
        match self {
            DiskIo::Uring(_) => "io_uring",
            DiskIo::Pool(_) => "thread pool",
        }
    }

    /// Readable when operations completed.
    pub fn eventfd(&self) -> &EventFd {
        match self {
            DiskIo::Uring(u) => &u.done,
            DiskIo::Pool(p) => &p.done,
        }
    }

    /// Queues an operation (the caller keeps its buffers valid until it completes).
    pub fn push(&mut self, op: &IoOp) -> io::Result<()> {
        match self {
            DiskIo::Uring(u) => u.push(op),
            DiskIo::Pool(p) => p.push(op),
        }
    }

    /// Starts everything queued since the last call (io_uring: one syscall). An operation
    /// the kernel refuses at submission completes with its error; it holds back no other.
    pub fn submit(&mut self) -> io::Result<()> {
        match self {
            DiskIo::Uring(u) => u.submit_all(),
            DiskIo::Pool(_) => Ok(()),
        }
    }

    /// Takes the completed operations.
    pub fn reap(&mut self, out: &mut Vec<Completion>) {
        let _ = self.eventfd().read();
        match self {
            DiskIo::Uring(u) => u.reap(out),
            DiskIo::Pool(p) => p.reap(out),
        }
    }

    /// Operations pushed and not yet reaped.
    pub fn in_flight(&self) -> usize {
        match self {
            DiskIo::Uring(u) => u.pending.len(),
            DiskIo::Pool(p) => p.in_flight,
        }
    }

    /// Cancels every operation in flight and reaps them all (their completions are dropped),
    /// waiting up to `bound` for those already running. Once `left` is 0 no operation of this
    /// backend touches any buffer again.
    pub fn quiesce(&mut self, bound: Duration) -> Quiesced {
        let deadline = Instant::now() + bound;
        let reaped = match self {
            DiskIo::Uring(u) => u.quiesce(deadline),
            DiskIo::Pool(p) => p.quiesce(deadline),
        };
        let _ = self.eventfd().read();
        let left = self.in_flight();
        if left > 0 {
            // The owner leaks the buffers; dropping the backend does not wait again.
            match self {
                DiskIo::Uring(u) => u.given_up = true,
                DiskIo::Pool(p) => p.given_up = true,
            }
        }
        Quiesced { reaped, left }
    }
}

/// user_data of the backend's own cancel requests (an operation's is its slot, below 2^32).
const CANCEL_ANY: u64 = 1 << 32;
const CANCEL_ONE: u64 = 2 << 32;

/// The io_uring backend.
pub struct Uring {
    ring: IoUring,
    file: Arc<File>,
    done: EventFd,
    /// Slots of the operations pushed and not yet reaped.
    pending: HashSet<u32>,
    /// The kernel refused IORING_ASYNC_CANCEL_ANY (before Linux 5.19): cancel one by one.
    any_refused: bool,
    /// A quiesce ran out of time: what is still pending is the owner's to leak.
    given_up: bool,
}

impl Uring {
    fn new(file: Arc<File>, entries: u32) -> io::Result<Self> {
        let entries = entries.next_power_of_two();
        // SUBMIT_ALL (Linux 5.18): a refused entry does not stop the rest of the batch.
        let ring = match IoUring::builder().setup_submit_all().build(entries) {
            Ok(ring) => ring,
            Err(_) => IoUring::new(entries)?,
        };
        let done = EventFd::new(EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(done.as_raw_fd())?;
        Ok(Uring {
            ring,
            file,
            done,
            pending: HashSet::with_capacity(entries as usize + 1),
            any_refused: false,
            given_up: false,
        })
    }

    fn push(&mut self, op: &IoOp) -> io::Result<()> {
        let fd = types::Fd(self.file.as_raw_fd());
        let (ptr, n) = (op.iovecs.0.as_ptr(), op.iovecs.0.len() as u32);
        let entry = match op.kind {
            IoKind::Read => opcode::Readv::new(fd, ptr, n).offset(op.offset).build(),
            IoKind::Write => opcode::Writev::new(fd, ptr, n)
                .offset(op.offset)
                .rw_flags(op.rw_flags())
                .build(),
            IoKind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(u64::from(op.slot));
        loop {
            // SAFETY: the iovec array and the buffers it points at stay valid until this
            // operation's completion is reaped (the caller's contract), and the fd is kept
            // open by `self.file`. Dropping the ring does not wait for operations: the owner
            // quiesces first (`DiskIo::quiesce`) and leaks the buffers if that fails.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.pending.insert(op.slot);
                return Ok(());
            }
            self.submit_all()?; // the submission queue is full: start what is there
        }
    }

    /// Submits until the submission queue is empty. Without SUBMIT_ALL the kernel stops a
    /// batch at an entry it refuses (that entry completes with its error) and leaves the
    /// rest queued: submit again for them.
    fn submit_all(&mut self) -> io::Result<()> {
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        loop {
            let submitted = self.ring.submit()?;
            if self.ring.submission().is_empty() || submitted == 0 {
                return Ok(());
            }
        }
    }

    fn reap(&mut self, out: &mut Vec<Completion>) {
        for cqe in self.ring.completion() {
            let (r, tag) = (cqe.result(), cqe.user_data());
            if tag >= CANCEL_ANY {
                // A cancel request's own completion: how many it cancelled, or why not.
                self.any_refused |= tag == CANCEL_ANY && r == -libc::EINVAL;
                continue;
            }
            self.pending.remove(&(tag as u32));
            out.push(Completion {
                slot: tag as u32,
                result: if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as usize)
                },
            });
        }
    }
}

impl Uring {
    /// Submits what is queued, cancels everything in flight, and reaps until nothing is, or
    /// until `deadline`. Returns the operations reaped.
    fn quiesce(&mut self, deadline: Instant) -> usize {
        let mut ended = Vec::new();
        let _ = self.submit_all();
        self.reap(&mut ended);
        if !self.pending.is_empty() {
            self.cancel(types::CancelBuilder::any(), CANCEL_ANY);
        }
        let mut each_sent = false;
        while !self.pending.is_empty() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            self.wait(left);
            self.reap(&mut ended);
            if self.any_refused && !each_sent {
                each_sent = true;
                let slots: Vec<u32> = self.pending.iter().copied().collect();
                for slot in slots {
                    self.cancel(types::CancelBuilder::user_data(u64::from(slot)), CANCEL_ONE);
                }
            }
        }
        ended.len()
    }

    /// Asks the kernel to cancel what `what` matches (an operation already running goes on).
    fn cancel(&mut self, what: types::CancelBuilder, tag: u64) {
        let entry = opcode::AsyncCancel2::new(what).build().user_data(tag);
        for _ in 0..2 {
            // SAFETY: a cancel request points at no memory of ours.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                break;
            }
            let _ = self.submit_all(); // full: start what is there, then try once more
        }
        let _ = self.submit_all();
    }

    /// Waits for a completion, at most `left` (and 100 ms, to look at the clock again).
    fn wait(&mut self, left: Duration) {
        let ts = types::Timespec::from(left.min(Duration::from_millis(100)));
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                // No IORING_ENTER_EXT_ARG (before Linux 5.11): look again shortly.
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => {}
        }
    }
}

impl Drop for Uring {
    /// Not waited for by closing the ring: an owner that did not quiesce gets it done here.
    fn drop(&mut self) {
        if !self.pending.is_empty() && !self.given_up {
            self.quiesce(Instant::now() + QUIESCE_BOUND);
        }
    }
}

/// An operation handed to a pool thread.
struct Job {
    slot: u32,
    kind: IoKind,
    offset: u64,
    iovecs: Iovecs,
    flags: libc::c_int,
}

/// What the pool's threads share with the device.
#[derive(Default)]
struct PoolShared {
    completed: Mutex<Vec<Completion>>,
    /// Signalled with each completion (for `quiesce`).
    ended: Condvar,
    /// Set by `quiesce`: jobs not yet started end with ECANCELED instead of running.
    cancelled: AtomicBool,
}

impl PoolShared {
    fn completed(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.completed.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The thread-pool backend.
pub struct Pool {
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    shared: Arc<PoolShared>,
    done: EventFd,
    /// Jobs sent and not yet reaped.
    in_flight: usize,
    /// A quiesce ran out of time: threads still in a job are left behind, not waited for.
    given_up: bool,
}

/// Runs one operation with plain syscalls.
fn run_op(file: &File, job: &Job) -> io::Result<usize> {
    let fd = file.as_raw_fd();
    let (ptr, n) = (job.iovecs.0.as_ptr(), job.iovecs.0.len() as libc::c_int);
    let offset = job.offset as libc::off_t;
    // SAFETY: the iovecs point at live guest memory (see `Iovecs`) and `fd` is open.
    let r = unsafe {
        match job.kind {
            IoKind::Read => libc::preadv(fd, ptr, n, offset),
            IoKind::Write => libc::pwritev2(fd, ptr, n, offset, job.flags),
            IoKind::Flush => libc::fdatasync(fd) as isize,
        }
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

impl Pool {
    fn new(file: Arc<File>, threads: usize) -> io::Result<Self> {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(PoolShared::default());
        let done = EventFd::new(EFD_NONBLOCK)?;
        let mut workers = Vec::new();
        for i in 0..threads {
            let (rx, shared, file) = (rx.clone(), shared.clone(), file.clone());
            let done = done.try_clone()?;
            let worker = move || {
                if let Err(e) = crate::seccomp::apply(crate::seccomp::ThreadKind::DiskIo) {
                    eprintln!("exitless: {e}; this disk I/O thread ends");
                    return;
                }
                loop {
                    let job = rx.lock().map(|r| r.recv());
                    let Ok(Ok(job)) = job else {
                        return;
                    };
                    let result = if shared.cancelled.load(Ordering::Acquire) {
                        Err(io::Error::from_raw_os_error(libc::ECANCELED))
                    } else {
                        run_op(&file, &job)
                    };
                    shared.completed().push(Completion {
                        slot: job.slot,
                        result,
                    });
                    shared.ended.notify_all();
                    let _ = done.write(1);
                }
            };
            workers.push(
                std::thread::Builder::new()
                    .name(format!("disk-io{i}"))
                    .spawn(worker)?,
            );
        }
        Ok(Pool {
            jobs: Some(tx),
            workers,
            shared,
            done,
            in_flight: 0,
            given_up: false,
        })
    }

    fn push(&mut self, op: &IoOp) -> io::Result<()> {
        let job = Job {
            slot: op.slot,
            kind: op.kind,
            offset: op.offset,
            iovecs: Iovecs(op.iovecs.0.clone()),
            flags: op.rw_flags(),
        };
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| io::Error::other("disk I/O threads stopped"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Completion>) {
        let mut c = self.shared.completed();
        self.in_flight = self.in_flight.saturating_sub(c.len());
        out.append(&mut c);
    }

    /// Jobs not yet started end cancelled; waits for the running ones until `deadline`.
    /// Returns the jobs reaped.
    fn quiesce(&mut self, deadline: Instant) -> usize {
        self.shared.cancelled.store(true, Ordering::Release);
        let mut reaped = 0;
        let mut c = self.shared.completed();
        loop {
            reaped += c.len();
            self.in_flight = self.in_flight.saturating_sub(c.len());
            c.clear();
            let left = deadline.checked_duration_since(Instant::now());
            match left {
                Some(left) if self.in_flight > 0 => {
                    c = self
                        .shared
                        .ended
                        .wait_timeout(c, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                _ => return reaped,
            }
        }
    }
}

impl Drop for Pool {
    /// Queued jobs are cancelled and running ones waited for (bounded); threads still in a
    /// job after that are left behind rather than joined.
    fn drop(&mut self) {
        if self.in_flight > 0 && !self.given_up {
            self.quiesce(Instant::now() + QUIESCE_BOUND);
        }
        self.jobs = None; // workers see the channel close and end
        let stuck = self.in_flight > 0;
        for w in self.workers.drain(..) {
            if !stuck {
                let _ = w.join();
            }
        }
    }
}

/// Pages of `file` in the host's page cache not yet written back (cachestat, Linux 6.5):
/// a write that completed durable leaves none.
pub fn dirty_pages(file: &File) -> io::Result<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 }; // len 0: to the end of the file
    let mut stat = CacheStat::default();
    // SAFETY: both structs match the kernel's and live across the call; the fd is open.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut CacheStat,
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.dirty + stat.writeback)
}

#[cfg(test)]
#[path = "io_tests.rs"]
mod tests;
