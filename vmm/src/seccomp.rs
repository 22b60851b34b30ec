//! Seccomp filters per thread kind. Each thread that a guest can reach installs, once set
//! up, a filter allowing only the system calls it makes; any other call raises SIGSYS, whose
//! handler says which thread made which call and ends the process with [`EXIT_SECCOMP`]. The
//! lists and why each call is there: docs/seccomp.md.
//!
//! Filters are on unless [`disable`] was called (`--seccomp off`). The system call number is
//! filtered, not its arguments, except `socket` on the devices thread: AF_UNIX only (the vsock
//! device connects guest streams to the host's Unix sockets). The programs are binary
//! searches over the call numbers ([`tree`]: a tenth of the install time of `seccompiler`'s
//! row of comparisons), built when exitless is compiled ([`program`]: nothing is compiled or
//! allocated as a thread starts) and installed with `seccompiler`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use seccompiler::sock_filter;
use thiserror::Error;

mod tree;

/// Exit code of a process that a seccomp filter stopped (128 + SIGSYS, as a shell reports a
/// process killed by SIGSYS).
pub const EXIT_SECCOMP: i32 = 128 + libc::SIGSYS;

#[derive(Debug, Error)]
pub enum SeccompError {
    #[error("Cannot install the seccomp filter of the {0} thread: {1}")]
    Install(&'static str, seccompiler::Error),
    #[error("Cannot install the SIGSYS handler: {0}")]
    Handler(std::io::Error),
}

/// The kinds of thread exitless runs, each with its own allowed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// `exitless run`'s main thread once the VM runs: signals, reports, stopping the vCPUs.
    Main,
    /// A vCPU: KVM_RUN and the exits it handles (BAR moves and MSI-X routes are KVM ioctls).
    Vcpu,
    /// The device event loop: queues, console input, completions.
    Devices,
    /// A disk's I/O thread where io_uring is unavailable.
    DiskIo,
    /// The API's thread: socket I/O and polling only.
    Api,
}

impl ThreadKind {
    fn name(self) -> &'static str {
        match self {
            ThreadKind::Main => "main",
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::Devices => "devices",
            ThreadKind::DiskIo => "disk I/O",
            ThreadKind::Api => "API",
        }
    }

    /// The system calls this kind of thread may make.
    pub fn allowed(self) -> Vec<libc::c_long> {
        let mut calls = COMMON.to_vec();
        calls.extend_from_slice(match self {
            ThreadKind::Main => MAIN,
            ThreadKind::Vcpu => VCPU,
            ThreadKind::Devices => DEVICES,
            ThreadKind::DiskIo => DISK_IO,
            ThreadKind::Api => API,
        });
        if self == ThreadKind::Devices {
            // A disk's I/O threads start on the devices thread, which activates the disk, and
            // keep its filter under their own: both must allow their calls.
            calls.extend(DISK_IO.iter().filter(|c| !DEVICES.contains(c)));
        }
        if cfg!(debug_assertions) && !calls.contains(&libc::SYS_fcntl) {
            // A debug build's std asks fcntl(F_GETFD) whether a descriptor it closes is open
            // (a debug assertion): without it `cargo run` and `cargo test`'s dev builds stop at
            // the first closed file. Release builds, the ones that ship, never make the call.
            calls.push(libc::SYS_fcntl);
        }
        calls
    }
}

/// Every thread: memory, locks, signals, its own end, and writing diagnostics.
const COMMON: &[libc::c_long] = &[
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_prctl,
    libc::SYS_restart_syscall,
    libc::SYS_rseq,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    // Only ever narrows: a thread started by a filtered one (a disk's I/O threads, started by
    // the vCPU that activated the disk) adds its own filter.
    libc::SYS_seccomp,
    libc::SYS_set_robust_list,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    // musl's pthread_kill (kicking a vCPU thread) is tkill(2), glibc's tgkill(2).
    libc::SYS_tkill,
    libc::SYS_write,
    libc::SYS_writev,
];

const MAIN: &[libc::c_long] = &[
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_fsync,
    libc::SYS_ioctl,
    libc::SYS_lseek,
    libc::SYS_newfstatat,
    // musl opens files with open(2) and stats paths with stat(2), glibc with openat(2) and
    // newfstatat(2): `--profile-json` at the end.
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_openat,
    libc::SYS_poll,
    libc::SYS_pread64,
    libc::SYS_read,
    libc::SYS_rt_sigaction,
    libc::SYS_statx,
    // Removing the vsock device's socket file at the end.
    libc::SYS_unlink,
    libc::SYS_unlinkat,
];

/// What the exit path needs: KVM_RUN and the KVM ioctls a guest's register writes cause
/// (ioeventfds and routes for a moved BAR or a programmed MSI-X vector), KVM's binary stats
/// read by an exit observer (the lab's markers). Devices start and reset on the devices
/// thread, not here.
const VCPU: &[libc::c_long] = &[libc::SYS_ioctl, libc::SYS_pread64];

const DEVICES: &[libc::c_long] = &[
    // vsock: host programs connecting to the device's Unix socket, and streams ending.
    libc::SYS_accept4,
    // vsock: joining a guest connection to the host's Unix socket PATH_P (the socket itself
    // is allowed for AF_UNIX only, see `DEVICES_AF_UNIX_SOCKET`).
    libc::SYS_connect,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    // virtio-balloon: pages the guest reported free or inflated, given back from shared
    // (memfd) guest memory by punching a hole in the file (private memory uses madvise).
    libc::SYS_fallocate,
    libc::SYS_fdatasync,
    libc::SYS_fsync,
    // Starting a disk: its io_uring and completion eventfd, or its I/O threads.
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_eventfd2,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_io_uring_setup,
    libc::SYS_ioctl,
    libc::SYS_read,
    // vsock: std's Unix stream reads and writes are recv and send.
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    // vhost-user: a device's start and reset talk to its back end; SET_MEM_TABLE and
    // SET_VRING_KICK/CALL carry file descriptors (SCM_RIGHTS), which only sendmsg sends.
    libc::SYS_sendmsg,
    // vhost-user: a snapshot reads a back end's state from a pipe (SET_DEVICE_STATE_FD),
    // each read after a bounded poll (musl's poll is poll(2), glibc's ppoll(2)).
    libc::SYS_pipe2,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_shutdown,
    libc::SYS_timerfd_settime,
];

const DISK_IO: &[libc::c_long] = &[
    libc::SYS_fdatasync,
    libc::SYS_fsync,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
];

const API: &[libc::c_long] = &[
    // One thread serves every connection: the listener's, the connections' and the owner
    // thread's wake-ups polled together (musl's poll is poll(2), glibc's ppoll(2)).
    libc::SYS_accept4,
    libc::SYS_poll,
    libc::SYS_ppoll,
    // The wake-up's eventfd.
    libc::SYS_read,
    // Requests with their file descriptors (SCM_RIGHTS).
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    // Replies (send(2) with MSG_NOSIGNAL).
    libc::SYS_sendto,
];

static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turns filtering off for the rest of the process (`--seccomp off`): threads started later
/// run unfiltered.
pub fn disable() {
    DISABLED.store(true, Ordering::SeqCst);
}

/// Whether threads install their filters.
pub fn enabled() -> bool {
    !DISABLED.load(Ordering::SeqCst)
}

/// Calls allowed only with their first argument equal to a value, per thread kind:
/// `socket(AF_UNIX, ...)` on the devices thread.
const fn conditional(kind: ThreadKind) -> &'static [(libc::c_long, u32)] {
    match kind {
        ThreadKind::Devices => &[(libc::SYS_socket, libc::AF_UNIX as u32)],
        _ => &[],
    }
}

/// `kind`'s calls as the filter decides them, from the same lists as
/// [`ThreadKind::allowed`] and [`conditional`], in `const` context.
const fn rules(kind: ThreadKind) -> tree::Rules {
    let mut rules = tree::Rules::new().allow_all(COMMON).allow_all(match kind {
        ThreadKind::Main => MAIN,
        ThreadKind::Vcpu => VCPU,
        ThreadKind::Devices => DEVICES,
        ThreadKind::DiskIo => DISK_IO,
        ThreadKind::Api => API,
    });
    if matches!(kind, ThreadKind::Devices) {
        // See `allowed`: a disk's I/O threads keep the devices filter under their own.
        rules = rules.allow_all(DISK_IO);
    }
    if cfg!(debug_assertions) {
        // See `allowed`: a debug build's std.
        rules = rules.allow(libc::SYS_fcntl);
    }
    // A call listed both ways keeps its condition.
    let conditions = conditional(kind);
    let mut i = 0;
    while i < conditions.len() {
        rules = rules.allow_if_first_arg(conditions[i].0, conditions[i].1);
        i += 1;
    }
    rules
}

/// `kind`'s program, built when exitless is compiled: a static array of instructions.
macro_rules! built_program {
    ($kind:expr) => {{
        const PROGRAM: tree::Program = tree::Program::compile(&rules($kind));
        static CODE: [sock_filter; PROGRAM.len()] = PROGRAM.code();
        &CODE
    }};
}

/// The BPF program for `kind`: allowed calls pass, anything else raises SIGSYS. Built when
/// exitless is compiled, so a thread's start costs only the kernel's install (the lists'
/// merging, sorting and the tree's compilation took each thread ~30-60 allocations before).
pub fn program(kind: ThreadKind) -> &'static [sock_filter] {
    match kind {
        ThreadKind::Main => built_program!(ThreadKind::Main),
        ThreadKind::Vcpu => built_program!(ThreadKind::Vcpu),
        ThreadKind::Devices => built_program!(ThreadKind::Devices),
        ThreadKind::DiskIo => built_program!(ThreadKind::DiskIo),
        ThreadKind::Api => built_program!(ThreadKind::Api),
    }
}

/// Installs `kind`'s filter on the calling thread, unless filtering is off.
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    if !enabled() {
        return Ok(());
    }
    install_sigsys_handler()?;
    prepare_malloc();
    seccompiler::apply_filter(program(kind)).map_err(|e| SeccompError::Install(kind.name(), e))
}

/// Most malloc arenas (glibc's default is 8 per CPU): one, the main heap, shared by every
/// thread. The exit path allocates nothing and the device threads little, so sharing costs
/// them nothing measurable, while each thread arena kept 16-20 kB of private dirty memory
/// per VM (measured on the bench guest: 488 -> 468 kB with one arena).
#[cfg(target_env = "gnu")]
const MALLOC_ARENAS: libc::c_int = 1;

/// glibc opens files behind a thread's back in two places a filtered thread may not: the first
/// time it trims a thread's heap (/proc/sys/vm/overcommit_memory) and the first time it needs
/// to know how many arenas it may create (/sys/devices/system/cpu/online, when a thread's
/// first allocation finds the existing arenas busy). So heaps are not trimmed (freed memory
/// stays with its heap; large buffers are still mapped and unmapped on their own) and the
/// arena limit is set here, before any filter. musl's allocator has neither (one heap, no
/// files opened).
pub fn prepare_malloc() {
    #[cfg(target_env = "gnu")]
    {
        static ONCE: Once = Once::new();
        // SAFETY: mallopt only sets allocator parameters.
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        });
    }
}

fn install_sigsys_handler() -> Result<(), SeccompError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler only makes async-signal-safe calls
        // (prctl, write, _exit).
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            result = Err(SeccompError::Handler(std::io::Error::last_os_error()));
        }
    });
    result
}

/// Says which thread made which system call, then ends the process: a filtered thread went
/// outside its list (a bug in exitless or its list, or an exploited device model).
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let mut thread = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes and a NUL into the 17-byte buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, thread.as_mut_ptr()) };
    // SAFETY: the kernel passes a valid siginfo for SIGSYS; si_syscall sits at a fixed place
    // in its union (the `_sigsys` member: call address, then system call number).
    let call = unsafe { syscall_number(info) };
    let mut line = Line::default();
    line.push(b"exitless: seccomp: thread ");
    line.push(&thread[..thread.iter().position(|&b| b == 0).unwrap_or(16)]);
    line.push(b" made system call ");
    line.push_number(call);
    line.push(
        b", which its filter does not allow; stopping (--seccomp off disables the filters)\n",
    );
    // SAFETY: write and _exit are async-signal-safe; the buffer is live.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(EXIT_SECCOMP);
    }
}

/// # Safety
/// `info` points at the siginfo of a SIGSYS raised by seccomp.
unsafe fn syscall_number(info: *const libc::siginfo_t) -> u64 {
    // The union starts after si_signo, si_errno, si_code and padding (16 bytes on x86_64);
    // `_sigsys` holds `void *_call_addr; int _syscall; unsigned _arch`.
    let base = info.cast::<u8>().add(16);
    let call = std::ptr::read_unaligned(base.add(8).cast::<libc::c_int>());
    call as u64
}

/// A fixed buffer for the handler's one line (no allocation in a signal handler).
struct Line {
    buf: [u8; 200],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 200],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn every_kind_builds_a_program_and_lists_each_call_once() {
        for kind in [
            ThreadKind::Main,
            ThreadKind::Vcpu,
            ThreadKind::Devices,
            ThreadKind::DiskIo,
        ] {
            assert!(!program(kind).is_empty());
            let mut calls = kind.allowed();
            let n = calls.len();
            calls.sort();
            calls.dedup();
            assert_eq!(calls.len(), n, "{kind:?} lists a call twice");
        }
    }

    const ALL_KINDS: [ThreadKind; 5] = [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::Devices,
        ThreadKind::DiskIo,
        ThreadKind::Api,
    ];

    /// What `seccompiler` builds from the same lists (one comparison per call in a row): the
    /// reference the search tree must agree with.
    fn seccompiler_program(kind: ThreadKind) -> seccompiler::BpfProgram {
        use seccompiler::{
            BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
            SeccompFilter, SeccompRule, TargetArch,
        };
        let mut rules: BTreeMap<_, Vec<SeccompRule>> =
            kind.allowed().into_iter().map(|n| (n, vec![])).collect();
        for &(call, value) in conditional(kind) {
            let arg = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                u64::from(value),
            );
            let rule = SeccompRule::new(vec![arg.unwrap()]).unwrap();
            rules.insert(call, vec![rule]);
        }
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Trap,
            SeccompAction::Allow,
            TargetArch::x86_64,
        );
        BpfProgram::try_from(filter.unwrap()).unwrap()
    }

    #[test]
    fn the_search_tree_decides_every_call_as_seccompiler_does() {
        let args = [0, libc::AF_UNIX as u64, libc::AF_INET as u64, 1 << 32];
        for kind in ALL_KINDS {
            let (ours, reference) = (program(kind), seccompiler_program(kind));
            let (mut allowed, mut longest, mut reference_longest) = (0, 0, 0);
            let x32 = (0..600u32).map(|n| n | 0x4000_0000);
            for nr in (0..600u32).chain(x32).chain([u32::MAX]) {
                for arch in [0xc000_003e, 0x4000_0003] {
                    for &arg in &args {
                        let (action, steps) = tree::run(ours, arch, nr, arg);
                        let (expected, reference_steps) = tree::run(&reference, arch, nr, arg);
                        assert_eq!(action, expected, "{kind:?}: call {nr}, arch {arch:#x}");
                        allowed += usize::from(action == tree::RET_ALLOW);
                        longest = longest.max(steps);
                        reference_longest = reference_longest.max(reference_steps);
                    }
                }
            }
            assert!(allowed >= kind.allowed().len(), "{kind:?}");
            // What makes the install cheap: a short walk for every call number.
            assert!(longest <= 20, "{kind:?}: {longest} steps");
            assert!(longest * 5 < reference_longest, "{kind:?}");
        }
    }

    #[test]
    fn no_guest_facing_thread_may_open_files_or_sockets_or_exec() {
        for kind in [ThreadKind::Vcpu, ThreadKind::Devices, ThreadKind::DiskIo] {
            let calls = kind.allowed();
            for forbidden in [
                libc::SYS_openat,
                libc::SYS_open,
                libc::SYS_socket,
                libc::SYS_execve,
                libc::SYS_ptrace,
            ] {
                assert!(!calls.contains(&forbidden), "{kind:?} allows {forbidden}");
            }
            // Only the devices thread connects (vsock), and it can make Unix sockets only.
            let connects = calls.contains(&libc::SYS_connect);
            assert_eq!(connects, kind == ThreadKind::Devices, "{kind:?}");
        }
        let socket_rules = conditional(ThreadKind::Devices);
        assert_eq!(socket_rules, [(libc::SYS_socket, libc::AF_UNIX as u32)]);
        assert!(conditional(ThreadKind::Vcpu).is_empty());
    }

    /// Forks a child that installs `kind`'s filter and makes a socket of `domain`; its exit
    /// status (0: the call was allowed).
    fn child_making_a_socket(kind: ThreadKind, domain: libc::c_int) -> i32 {
        // SAFETY: a plain system call.
        child_calling(kind, || unsafe {
            libc::socket(domain, libc::SOCK_STREAM, 0);
        })
    }

    /// A forked child under `kind`'s filter makes `call`; its exit status (0: allowed).
    fn child_calling(kind: ThreadKind, call: impl FnOnce()) -> i32 {
        let program = program(kind);
        install_sigsys_handler().unwrap();
        // SAFETY: the child only makes system calls (no allocation) before it ends.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            if seccompiler::apply_filter(program).is_err() {
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(2) };
            }
            call();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    const HEAP_CHILD: &str = "EXITLESS_SECCOMP_HEAP_CHILD";

    /// glibc opens /proc/sys/vm/overcommit_memory the first time it shrinks a thread's heap,
    /// which a filtered thread must never do: a devices thread freeing its buffers was stopped
    /// with code 159. Run in a fresh process (this test binary again), where a new thread gets
    /// a heap of its own with glibc's default trimming.
    #[test]
    fn a_filtered_thread_that_frees_its_heap_is_not_stopped() {
        if std::env::var_os(HEAP_CHILD).is_some() {
            let t = std::thread::spawn(|| {
                apply(ThreadKind::Devices).unwrap();
                for round in 0..20u8 {
                    let bufs: Vec<Vec<u8>> = (0..64).map(|i| vec![round; 64 * 1024 + i]).collect();
                    drop(std::hint::black_box(bufs));
                }
            });
            t.join().unwrap();
            return;
        }
        let name = "seccomp::tests::a_filtered_thread_that_frees_its_heap_is_not_stopped";
        let o = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads", "1"])
            .env(HEAP_CHILD, "1")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{:?}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }

    #[test]
    fn the_devices_thread_may_make_unix_sockets_and_no_other() {
        assert_eq!(child_making_a_socket(ThreadKind::Devices, libc::AF_UNIX), 0);
        assert_eq!(
            child_making_a_socket(ThreadKind::Devices, libc::AF_INET),
            EXIT_SECCOMP
        );
    }

    #[test]
    fn the_handler_line_says_the_call_number() {
        let mut line = Line::default();
        line.push(b"call ");
        line.push_number(41);
        line.push_number(0);
        assert_eq!(&line.buf[..line.len], b"call 410");
    }

    /// A forked child with the vCPU filter that opens a socket is stopped by the handler with
    /// its exit code and its line (the parent only waits).
    #[test]
    fn a_call_outside_the_list_stops_the_process_with_its_code() {
        assert_eq!(
            child_making_a_socket(ThreadKind::Vcpu, libc::AF_UNIX),
            EXIT_SECCOMP
        );
    }

    /// A vCPU thread does no disk or device set-up work any more (devices start on the
    /// devices thread): its filter refuses a disk write and setting up an io_uring.
    #[test]
    fn a_vcpu_thread_may_not_touch_a_disk() {
        // SAFETY: plain system calls on no real fd or buffer.
        let write = || unsafe {
            libc::pwrite64(-1, std::ptr::null(), 0, 0);
        };
        assert_eq!(child_calling(ThreadKind::Vcpu, write), EXIT_SECCOMP);
        // SAFETY: as above.
        let uring = || unsafe {
            libc::syscall(libc::SYS_io_uring_setup, 8, std::ptr::null_mut::<u8>());
        };
        assert_eq!(child_calling(ThreadKind::Vcpu, uring), EXIT_SECCOMP);
        assert_eq!(child_calling(ThreadKind::Devices, write), 0);
    }
}
