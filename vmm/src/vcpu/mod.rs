//! vCPUs: one thread per vCPU owning its `VcpuFd`, dispatching exits through the frozen buses.
//!
//! Nothing shared is written per exit: the profile is the vCPU's own (padded, single-writer),
//! the stop flag and the bus generation are only read, and no lock is held across KVM_RUN.

pub mod affinity;
pub mod control;
pub mod exit;
pub mod observer;
pub mod regs;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvm_ioctls::{SyncReg, VcpuFd};
use thiserror::Error;

use crate::bus::{BusSnapshot, SharedBuses};
use crate::kvm;
use crate::kvm::ring::{CoalescedRing, CoalescedWrite};
use crate::profile::{self, ExitReason, VcpuProfile};
pub use affinity::pin_current_thread;
pub use control::{Unparked, VcpuTask, VmControl};
pub use exit::{dispatch, handle_exit, Buses, ExitAction, Handled, UnhandledExit, VmEnd};
pub use observer::{ExitObserver, ObservedVcpu};

/// Errors running a vCPU.
#[derive(Debug, Error)]
pub enum VcpuError {
    #[error("KVM ioctl {0} failed: {1}")]
    Ioctl(&'static str, kvm_ioctls::Error),
    #[error("KVM_RUN failed: {0}")]
    Run(kvm_ioctls::Error),
    #[error("Device failed on the host: {0}")]
    Device(#[from] io::Error),
    #[error(transparent)]
    Kvm(#[from] kvm::KvmError),
    #[error("Cannot pin vCPU thread to host CPU {0}: {1}")]
    Affinity(usize, io::Error),
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error("The VM was not started: its vCPU never came")]
    NeverStarted,
}

/// How the VMM reads guest registers (RIP, for its messages: read when one is printed, not per
/// exit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum RegsAccess {
    /// Not at all: no sync regs, no ioctl (a VMM that never needs registers).
    None,
    /// From the kvm_run page (KVM_CAP_SYNC_REGS): no extra ioctl.
    SyncRegs,
}

/// What a vCPU thread hands back when it ends.
#[derive(Debug)]
pub struct VcpuOutcome {
    pub id: usize,
    pub end: VmEnd,
}

/// A vCPU ready to run on its own thread.
pub struct Vcpu {
    pub id: usize,
    fd: VcpuFd,
    shared_buses: Arc<SharedBuses>,
    buses: BusSnapshot,
    control: Arc<VmControl>,
    profile: Arc<VcpuProfile>,
    regs: RegsAccess,
    coalesced_ring: Option<Arc<CoalescedRing>>,
    observer: Option<Box<dyn ExitObserver>>,
    /// The observer wants every exit (read per exit instead of asking it).
    observe_every_exit: bool,
    /// The next access to an address without a device is logged (until one is, unless the
    /// bench turned the message off).
    log_next_unmapped: bool,
    /// Unhandled exit kinds already logged (each once).
    logged_unhandled: Vec<UnhandledExit>,
    profiling: bool,
    /// The profile times one exit in this many (at least 1); every exit is counted.
    profile_every: u32,
    user_exits: u64,
    affinity: Option<usize>,
    /// Set (then the thread kicked) to park this vCPU alone, when the guest ejected its CPU.
    retired: Arc<AtomicBool>,
    /// The generation of the last task this vCPU ran while parked.
    task_seen: u64,
    /// Its dirty ring, when the VM tracks with the ring: harvested here when KVM says it is
    /// full.
    dirty_ring: Option<kvm::dirty_tracking::OwnRing>,
}

impl Vcpu {
    /// Wraps `fd`; general registers are synced through kvm_run when `regs` is `SyncRegs`.
    pub fn new(
        id: usize,
        mut fd: VcpuFd,
        buses: Arc<SharedBuses>,
        control: Arc<VmControl>,
        profile: Arc<VcpuProfile>,
        regs: RegsAccess,
    ) -> Result<Self, VcpuError> {
        if regs == RegsAccess::SyncRegs {
            // Only the general registers: exit handling reads nothing else, and each synced
            // set is copied into kvm_run on every exit.
            fd.set_sync_valid_reg(SyncReg::Register);
        }
        Ok(Vcpu {
            id,
            fd,
            buses: buses.snapshot(),
            shared_buses: buses,
            control,
            profile,
            regs,
            coalesced_ring: None,
            observer: None,
            observe_every_exit: false,
            log_next_unmapped: true,
            logged_unhandled: Vec::new(),
            profiling: true,
            profile_every: 1,
            user_exits: 0,
            affinity: None,
            retired: Arc::new(AtomicBool::new(false)),
            task_seen: 0,
            dirty_ring: None,
        })
    }

    /// Turns the per-exit profile off (only the plain exit count remains): for measuring what
    /// the profiler itself costs.
    pub fn set_profiling(&mut self, on: bool) {
        self.profiling = on;
    }

    /// Times one exit in `every` (0 is taken as 1): the profile still counts every exit by
    /// reason and device, but reads the TSC (twice, `rdtsc` costs ~57 ns on a nested host)
    /// and the host CPU only on the timed ones; its times are scaled to all exits.
    pub fn set_profile_sample(&mut self, every: u32) {
        self.profile_every = every.max(1);
    }

    /// Whether the first access to an unmapped address is logged (the bench pokes one on
    /// purpose).
    pub fn set_log_unmapped(&mut self, on: bool) {
        self.log_next_unmapped = on;
    }

    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// The vCPU's fd, to run it outside [`Vcpu::run_on_prepared_thread`].
    ///
    /// One of the lab's entry points: the exit-path ablation (`lab/src/bench/ablation*.rs`)
    /// drives KVM_RUN on it with a loop of its own, adding exitless's ingredients one by one.
    pub fn fd_mut(&mut self) -> &mut VcpuFd {
        &mut self.fd
    }

    /// Gives the vCPU the VM's coalesced MMIO/PIO ring: on every userspace exit it is drained
    /// to the devices before the exit itself is handled, so writes reach them in guest order.
    pub fn set_coalesced_ring(&mut self, ring: Arc<CoalescedRing>) {
        self.coalesced_ring = Some(ring);
    }

    /// Gives the vCPU its dirty ring, which it harvests on `KVM_EXIT_DIRTY_RING_FULL`.
    pub fn set_dirty_ring(&mut self, ring: kvm::dirty_tracking::OwnRing) {
        self.dirty_ring = Some(ring);
    }

    /// Shows this vCPU's exits to `observer` (replacing any earlier one).
    pub fn set_observer(&mut self, observer: Box<dyn ExitObserver>) {
        self.observe_every_exit = observer.wants_every_exit();
        self.observer = Some(observer);
    }

    /// The flag that parks this vCPU alone once set and the thread kicked.
    pub fn retire_flag(&self) -> Arc<AtomicBool> {
        self.retired.clone()
    }

    /// Pins the thread this vCPU is started on to host CPU `cpu` (see [`Vcpu::host_cpu`]).
    pub fn pin_to(&mut self, cpu: usize) {
        self.affinity = Some(cpu);
    }

    /// The host CPU this vCPU's thread is to be pinned to, if any.
    pub fn host_cpu(&self) -> Option<usize> {
        self.affinity
    }

    /// Runs until the guest ends the VM or the VMM stops it, on a thread [`prepare_thread`]
    /// readied (pinned to [`Vcpu::host_cpu`], filtered).
    pub fn run_on_prepared_thread(mut self) -> Result<VcpuOutcome, VcpuError> {
        kvm::kick::arm(&mut self.fd);
        crate::startup::mark(crate::startup::moment::FIRST_RUN);
        let result = self.run_loop();
        kvm::kick::disarm();
        Ok(VcpuOutcome {
            id: self.id,
            end: result?,
        })
    }

    /// The exit loop, a function of its own in the exit path's section:
    /// its code and place do not change with what is inlined into [`Vcpu::run_on_prepared_thread`].
    ///
    /// Every branch an access exit does not take leads to a cold function (not running, a kick,
    /// a failed KVM_RUN, a changed bus layout) or one of its own (a coalesced ring's drain): the
    /// compiler then lays the access's path out in a few lines in a row, where it spread over
    /// two pages of this function's code before (issue 42, docs/performance.md "The p50 at
    /// the floor").
    #[inline(never)]
    #[link_section = ".text.hot.exitless_exit_path"]
    fn run_loop(&mut self) -> Result<VmEnd, VcpuError> {
        let profiling = self.profiling;
        // Exits left before the next timed one (0: the next one is timed). A counter of the
        // thread's own and a branch predicted right but once in `profile_every`.
        let mut untimed_left = 0u32;
        let mut t_entry = tsc_if(profiling);
        loop {
            if self.control.state() != control::RUN {
                match self.not_running()? {
                    Some(end) => return Ok(end),
                    None => {
                        t_entry = tsc_if(profiling);
                        continue;
                    }
                }
            }
            // The raw KVM_RUN, inlined here: no page far from the loop on the way
            // (vmm::kvm::raw_run; the same exits as `VcpuFd::run`).
            let result = kvm::raw_run::run(&mut self.fd);
            let timed = profiling && untimed_left == 0;
            let t_exit = tsc_if(timed);
            let buses = self.buses.current(&self.shared_buses);
            // Writes queued in a coalesced ring reach their devices before the exit is handled.
            let handled = match result {
                Ok(exit) => match &self.coalesced_ring {
                    None => handle_exit(buses, exit)?,
                    Some(ring) => with_ring(buses, ring, Some(exit), &self.profile, profiling)?,
                },
                Err(e) => {
                    let Some((handled, waited)) = self.kicked(e)? else {
                        return Ok(VmEnd::Stopped);
                    };
                    if waited {
                        t_entry = tsc_if(profiling);
                    }
                    handled
                }
            };
            self.user_exits += 1;
            self.after_exit(&handled)?;
            (t_entry, untimed_left) =
                self.account(&handled, timed, (t_entry, t_exit), untimed_left);
            match handled.action {
                ExitAction::Resume => {}
                ExitAction::Observe(value) => {
                    self.observe(value);
                    // The observer's time is in neither KVM_RUN nor an exit's handling.
                    t_entry = tsc_if(profiling && untimed_left == 0);
                }
                ExitAction::End(end) => return Ok(end),
            }
        }
    }

    /// The VM is paused or stopping: parks this vCPU until it runs again (`None`), running the
    /// tasks it is given meanwhile, or says how the loop ends.
    #[cold]
    #[inline(never)]
    fn not_running(&mut self) -> Result<Option<VmEnd>, VcpuError> {
        match self.control.state() {
            control::PAUSE => match self.control.park(self.task_seen) {
                Unparked::Run => Ok(None),
                Unparked::Stop => Ok(Some(VmEnd::Stopped)),
                Unparked::Task(generation, task) => self.run_task(generation, &task),
            },
            control::RUN => Ok(None),
            _ => Ok(Some(VmEnd::Stopped)),
        }
    }

    /// KVM_RUN failed: with EINTR or EAGAIN it was kicked (the ring's writes, if any, reach
    /// their devices), and a retired vCPU waits here until its CPU is added back (then `true`
    /// with the exit; `None` when the VM stopped meanwhile); any other error ends the loop.
    #[cold]
    #[inline(never)]
    fn kicked(&mut self, e: kvm_ioctls::Error) -> Result<Option<(Handled, bool)>, VcpuError> {
        if e.errno() != libc::EINTR && e.errno() != libc::EAGAIN {
            return Err(VcpuError::Run(e));
        }
        let buses = self.buses.current(&self.shared_buses);
        let handled = match &self.coalesced_ring {
            Some(ring) => with_ring(buses, ring, None, &self.profile, self.profiling)?,
            None => dispatch(buses, std::iter::empty(), None, |_, _| {})?,
        };
        self.fd.set_kvm_immediate_exit(0);
        // Only a kick retires one vCPU (its CPU ejected): checked here, not per exit.
        // It waits, out of KVM_RUN, until the CPU is added back (KVM cannot
        // destroy a vCPU, so the same one serves again).
        if !self.retired.load(Ordering::Acquire) {
            return Ok(Some((handled, false)));
        }
        match self.control.park_retired(&self.retired) {
            true => Ok(Some((handled, true))),
            false => Ok(None),
        }
    }

    /// Runs a parked vCPU's task on this thread: first KVM_RUN with `immediate_exit` set,
    /// which completes an I/O or MMIO read the last exit left pending (its value reaches the
    /// guest's registers only on the next entry) without running a guest instruction, so the
    /// task sees consistent state. An exit met on the way is handled as usual; should it end
    /// the VM, that end is returned once the task has run.
    #[cold]
    fn run_task(&mut self, generation: u64, task: &VcpuTask) -> Result<Option<VmEnd>, VcpuError> {
        let end = self.complete_pending_io()?;
        task(self.id, &self.fd);
        self.task_seen = generation;
        self.control.task_done(self.id, generation);
        Ok(end)
    }

    /// KVM_RUN with `immediate_exit` until KVM says it returned at once (EINTR).
    fn complete_pending_io(&mut self) -> Result<Option<VmEnd>, VcpuError> {
        let mut end = None;
        // An access split in parts exits once per part: a few rounds at most.
        for _ in 0..8 {
            self.fd.set_kvm_immediate_exit(1);
            let result = self.fd.run();
            let buses = self.buses.current(&self.shared_buses);
            let handled = match result {
                Ok(exit) => handle_exit(buses, exit)?,
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    if let Some(ring) = &self.coalesced_ring {
                        let queued = ring.drain().into_iter().flatten();
                        let h = dispatch(buses, queued, None, |_, _| {})?;
                        if let ExitAction::End(e) = h.action {
                            end.get_or_insert(e);
                        }
                    }
                    return Ok(end);
                }
                Err(e) => return Err(VcpuError::Run(e)),
            };
            if let ExitAction::End(e) = handled.action {
                end.get_or_insert(e);
            }
        }
        self.fd.set_kvm_immediate_exit(0);
        Err(VcpuError::Run(kvm_ioctls::Error::new(libc::EBUSY)))
    }

    /// The profile's part of an exit: recorded with its times when `timed`, else counted.
    /// Returns the next KVM_RUN's start (read when the next exit is the timed one, as a timed
    /// exit's end is) and the exits left before the next timed one.
    #[inline(always)]
    fn account(&self, h: &Handled, timed: bool, times: (u64, u64), left: u32) -> (u64, u32) {
        let (t_entry, t_exit) = times;
        if timed {
            let t_done = profile::rdtsc();
            self.record(h, t_entry, t_exit, t_done);
            return (t_done, self.profile_every - 1);
        }
        if !self.profiling {
            return (t_entry, left);
        }
        self.profile.count_exit(h.reason, h.device);
        let left = left - 1;
        (tsc_if(left == 0), left)
    }

    #[inline]
    fn record(&self, h: &Handled, t_entry: u64, t_exit: u64, t_done: u64) {
        self.profile.record_in_kvm(t_exit.wrapping_sub(t_entry));
        self.profile
            .record_exit(h.reason, h.device, t_done.wrapping_sub(t_exit));
        if let Some(cpu) = profile::current_cpu() {
            self.profile.record_cpu(cpu);
        }
    }

    /// Work common to every userspace exit: the observer's hook, then one test for what only
    /// some exits need (a kind exitless does not handle, a full dirty ring, the first access to
    /// nothing), so that an access exit reads no register and no more of kvm_run: RIP is read
    /// from the synced registers only for a message, before the next KVM_RUN as before.
    #[inline(always)]
    fn after_exit(&mut self, h: &Handled) -> Result<(), VcpuError> {
        if self.observe_every_exit {
            self.every_exit_hook()?;
        }
        let unmapped = self.log_next_unmapped && h.device.is_none() && is_access(h.reason);
        if unmapped || h.unhandled.is_some() || h.reason == ExitReason::DirtyRingFull {
            return self.rare_exit(h);
        }
        Ok(())
    }

    /// Shows the exit to an observer that wants every one (the lab's, the tests').
    #[cold]
    #[inline(never)]
    fn every_exit_hook(&mut self) -> Result<(), VcpuError> {
        match self.observer.as_mut() {
            Some(observer) => observer.every_exit(&self.fd),
            None => Ok(()),
        }
    }

    /// An exit to log once or a full dirty ring: out of the access exits' way.
    #[cold]
    #[inline(never)]
    fn rare_exit(&mut self, h: &Handled) -> Result<(), VcpuError> {
        let rip = self.read_rip();
        if let Some(kind) = h.unhandled {
            self.log_unhandled(kind, rip);
        }
        if h.reason == ExitReason::DirtyRingFull {
            self.harvest_full_ring()?;
        }
        if self.log_next_unmapped && h.device.is_none() && is_access(h.reason) {
            self.log_unmapped_access(h, rip);
        }
        Ok(())
    }

    /// `KVM_EXIT_DIRTY_RING_FULL`: harvests the vCPU's own ring (see
    /// [`kvm::dirty_tracking::OwnRing`]), after which KVM_RUN goes on. Without a ring (KVM
    /// sends the exit only with one) there is nothing to do.
    #[cold]
    fn harvest_full_ring(&mut self) -> Result<(), VcpuError> {
        match &self.dirty_ring {
            Some(ring) => ring.harvest_full().map(drop).map_err(VcpuError::Kvm),
            None => Ok(()),
        }
    }

    /// Says once what an access to nothing means, unless the port is one guests are known to
    /// probe for legacy hardware this VM does not have.
    #[cold]
    fn log_unmapped_access(&mut self, h: &Handled, rip: u64) {
        let pio = matches!(h.reason, ExitReason::IoIn | ExitReason::IoOut);
        if pio && exit::is_known_probe_port(h.addr) {
            return;
        }
        self.log_next_unmapped = false;
        let (what, place) = match h.reason {
            ExitReason::IoIn => ("read", format!("I/O port {:#x}", h.addr)),
            ExitReason::IoOut => ("wrote", format!("I/O port {:#x}", h.addr)),
            ExitReason::MmioRead => ("read", format!("guest address {:#x}", h.addr)),
            _ => ("wrote", format!("guest address {:#x}", h.addr)),
        };
        eprintln!(
            "exitless: vcpu{} {what} {place} (rip {rip:#x}), where this VM has no device: reads \
             return all ones and writes are dropped, as on hardware without the device; \
             further such accesses are only counted (see --profile)",
            self.id
        );
    }

    /// Says once per kind that an exit was not handled, and what happens now.
    #[cold]
    fn log_unhandled(&mut self, kind: UnhandledExit, rip: u64) {
        if self.logged_unhandled.contains(&kind) {
            return;
        }
        self.logged_unhandled.push(kind);
        let next = if kind.repeats() {
            "resuming would repeat it: the VM ends"
        } else {
            "the guest resumes (further ones are counted as OTHER in the profile)"
        };
        eprintln!(
            "exitless: vcpu{} {kind} at rip {rip:#x} is not handled by exitless; {next}",
            self.id
        );
    }

    /// The guest's RIP for messages (0 when registers are not read).
    fn read_rip(&mut self) -> u64 {
        match self.regs {
            RegsAccess::None => 0,
            RegsAccess::SyncRegs => kvm::sync_rip_rax(&mut self.fd).0,
        }
    }

    /// Shows the exit a device asked to be shown to the observer, if there is one.
    #[cold]
    fn observe(&mut self, value: u32) {
        if let Some(observer) = self.observer.as_mut() {
            let vcpu = ObservedVcpu {
                id: self.id,
                user_exits: self.user_exits,
                profile: &self.profile,
                fd: &self.fd,
            };
            observer.observe(value, &vcpu);
        }
    }
}

/// Readies the calling thread to run a vCPU: pinned to host CPU `cpu` if given, the vCPU
/// seccomp filter installed. A thread started before its vCPU exists calls it while the VM is
/// still being built, so that neither is on the way to the guest's first instruction.
pub fn prepare_thread(cpu: Option<usize>) -> Result<(), VcpuError> {
    if let Some(cpu) = cpu {
        pin_current_thread(cpu).map_err(|e| VcpuError::Affinity(cpu, e))?;
    }
    crate::seccomp::apply(crate::seccomp::ThreadKind::Vcpu)?;
    Ok(())
}

/// An exit (`None`: a kick) of a vCPU whose VM has a coalesced ring: the writes queued in the
/// ring reach their devices first, counted in the profile when `profiling`. A function of its
/// own, out of the loop's way for VMs without a ring.
#[inline(never)]
#[link_section = ".text.hot.exitless_exit_path.warm"]
fn with_ring(
    buses: &Buses,
    ring: &CoalescedRing,
    exit: Option<kvm_ioctls::VcpuExit<'_>>,
    profile: &VcpuProfile,
    profiling: bool,
) -> Result<Handled, VcpuError> {
    let delivered = |write: &CoalescedWrite, device| {
        if profiling {
            profile.record_coalesced(write.pio, device);
        }
    };
    let queued = ring.drain().into_iter().flatten();
    Ok(dispatch(buses, queued, exit, delivered)?)
}

/// A port or MMIO access (the exits that can find no device).
#[inline(always)]
fn is_access(reason: ExitReason) -> bool {
    matches!(
        reason,
        ExitReason::IoIn | ExitReason::IoOut | ExitReason::MmioRead | ExitReason::MmioWrite
    )
}

/// The host TSC when profiling, else 0 (no rdtsc on the exit path).
#[inline]
fn tsc_if(profiling: bool) -> u64 {
    if profiling {
        profile::rdtsc()
    } else {
        0
    }
}
