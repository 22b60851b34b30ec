//! Asynchronous disk I/O for virtio-blk, straight between the image file and guest memory:
//! io_uring (one submit per batch of requests, completions signalled on an eventfd), or
//! where the host refuses io_uring, a small thread pool doing preadv/pwritev/fdatasync.
//! Either way every request of a batch is in flight at once: a queue depth of 32 in the
//! guest is 32 requests on the host. A write marked `durable` completes only once its data is
//! on stable storage (RWF_DSYNC on the one write: no second operation, no second syscall).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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

/// Host buffers of one operation: pointers into guest memory, valid while the VM's memory is
/// mapped (the device keeps its memory and this backend alive until every operation ended).
pub struct Iovecs(pub Vec<libc::iovec>);

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
            DiskIo::Pool(p) => {
                out.append(&mut p.completed.lock().unwrap_or_else(|e| e.into_inner()))
            }
        }
    }
}

/// The io_uring backend.
pub struct Uring {
    ring: IoUring,
    file: Arc<File>,
    done: EventFd,
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
        Ok(Uring { ring, file, done })
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
            // open by `self.file`.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
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
            let r = cqe.result();
            out.push(Completion {
                slot: cqe.user_data() as u32,
                result: if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as usize)
                },
            });
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

/// The thread-pool backend.
pub struct Pool {
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    completed: Arc<Mutex<Vec<Completion>>>,
    done: EventFd,
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
        let completed = Arc::new(Mutex::new(Vec::new()));
        let done = EventFd::new(EFD_NONBLOCK)?;
        let mut workers = Vec::new();
        for i in 0..threads {
            let (rx, completed, file) = (rx.clone(), completed.clone(), file.clone());
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
                    let result = run_op(&file, &job);
                    if let Ok(mut c) = completed.lock() {
                        c.push(Completion {
                            slot: job.slot,
                            result,
                        });
                    }
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
            completed,
            done,
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
            .ok_or_else(|| io::Error::other("disk I/O threads stopped"))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs = None; // workers see the channel close and end
        for w in self.workers.drain(..) {
            let _ = w.join();
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
