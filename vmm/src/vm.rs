//! A VM: its KVM fd, guest memory, irqchip, and the threads running its vCPUs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvm_ioctls::{Kvm, VmFd};
use thiserror::Error;
use vm_memory::{GuestAddressSpace, GuestMemoryBackend, GuestMemoryLoadGuard, GuestMemoryMmap};
use vm_memory::{GuestRegionCollectionError, GuestRegionMmap};
use vmm_sys_util::signal::Killable;

use crate::config::IrqchipMode;
use crate::devices::virtio::SharedGuestMemory;
use crate::kvm::CreatedVm;
use crate::kvm::{self, Capabilities, KvmError, StatsFd, SupportedCpuid};
use crate::memory::{self, MemoryError};
use crate::vcpu::{Vcpu, VcpuError, VcpuOutcome, VcpuTask, VmControl, VmEnd};

/// Errors setting up or running a VM.
#[derive(Debug, Error)]
pub enum VmError {
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("Split irqchip is not supported by this KVM")]
    NoSplitIrqchip,
    #[error("Cannot start vCPU thread: {0}")]
    Thread(std::io::Error),
    #[error("vCPU {0} thread panicked")]
    Panicked(usize),
    #[error("Guest did not finish within {0:?}")]
    Timeout(Duration),
    #[error("vCPU(s) {0:?} did not leave KVM_RUN within {STOP_GRACE:?} of being stopped")]
    StuckVcpus(Vec<usize>),
    #[error("The vCPUs did not pause within {0:?}")]
    PauseTimeout(Duration),
    #[error("No vCPU {0}")]
    NoVcpu(usize),
    #[error("vCPU(s) {0:?} did not do what they were asked while paused")]
    VcpusBusy(Vec<usize>),
    #[error("The new memory region overlaps guest memory: {0}")]
    MemoryRegion(GuestRegionCollectionError),
}

/// How long a stopped vCPU may take to leave KVM_RUN before it is left behind.
/// Short enough that a stop signal or `--timeout` ends the process within a second even with a
/// vCPU that does not leave KVM_RUN.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// A created VM with its memory registered.
///
/// One of the lab's entry points: the bench runs its VMs' vCPUs itself.
pub struct Vm {
    /// Shared with the thread that asks KVM's CPUID entries ahead.
    pub kvm: Arc<Kvm>,
    /// Shared with the device manager, which registers eventfds and routes while the VM runs.
    pub fd: Arc<VmFd>,
    /// Guest memory: the devices share it, and it grows when memory is hot-added
    /// ([`Vm::add_memory_region`]).
    pub mem: SharedGuestMemory,
    pub caps: Capabilities,
    pub irqchip: IrqchipMode,
    pub control: Arc<VmControl>,
    pub stats: Option<StatsFd>,
    /// KVM's CPUID entries, asked once for every vCPU.
    pub supported_cpuid: SupportedCpuid,
    /// How the vCPUs' writes are tracked for migration (the ring or the bitmap).
    pub dirty: Arc<kvm::dirty_tracking::DirtyTracking>,
}

impl Vm {
    /// Creates a VM with `mem_size` bytes of RAM backed as `backing` says and the chosen
    /// interrupt controller; on `created` if given (the head start's empty VM).
    pub fn new(
        kvm: Kvm,
        created: Option<CreatedVm>,
        mem_size: u64,
        backing: &memory::Backing,
        irqchip: IrqchipMode,
    ) -> Result<Self, VmError> {
        // A head start's VM made before `--dirty-log` was read is replaced if it differs.
        let created = match created {
            Some(created) if created.dirty.as_preferred() => created,
            _ => CreatedVm::create(&kvm)?,
        };
        let mem = memory::create_guest_memory(mem_size, backing)?;
        Self::assemble(kvm, created, mem, irqchip)
    }

    /// Creates a VM with guest memory the caller made (memory zones, a snapshot's memory).
    pub fn with_memory(
        kvm: Kvm,
        mem: GuestMemoryMmap,
        irqchip: IrqchipMode,
    ) -> Result<Self, VmError> {
        let created = CreatedVm::create(&kvm)?;
        Self::assemble(kvm, created, mem, irqchip)
    }

    /// Registers `mem` with the `created` VM and creates its interrupt controller.
    fn assemble(
        kvm: Kvm,
        created: CreatedVm,
        mem: GuestMemoryMmap,
        irqchip: IrqchipMode,
    ) -> Result<Self, VmError> {
        let CreatedVm { fd, caps, dirty } = created;
        let kvm = Arc::new(kvm);
        kvm::register_memory(&fd, &mem)?;
        match irqchip {
            IrqchipMode::Kernel => fd
                .create_irq_chip()
                .map_err(|e| KvmError::Ioctl("KVM_CREATE_IRQCHIP", e))?,
            IrqchipMode::Split if !caps.split_irqchip => return Err(VmError::NoSplitIrqchip),
            IrqchipMode::Split => kvm::enable_split_irqchip(&fd, 24)?,
            IrqchipMode::None => {}
        }
        kvm::kick::install_handler()?;
        let stats = StatsFd::open(&fd).ok();
        Ok(Vm {
            kvm,
            fd: Arc::new(fd),
            mem: SharedGuestMemory::new(mem),
            caps,
            irqchip,
            control: Arc::new(VmControl::default()),
            stats,
            supported_cpuid: SupportedCpuid::for_new_vm(),
            dirty: Arc::new(dirty),
        })
    }

    /// Guest memory as it is now.
    pub fn memory(&self) -> GuestMemoryLoadGuard<GuestMemoryMmap> {
        self.mem.memory()
    }

    /// Adds `region` to guest memory while the VM runs (a hot-added memory slot): a new KVM
    /// memory slot, then the map the devices see. Regions are never removed, so the slot
    /// numbers are the regions' count. Returns the region as the map holds it.
    pub fn add_memory_region(
        &self,
        region: GuestRegionMmap,
    ) -> Result<Arc<GuestRegionMmap>, VmError> {
        let writer = self.mem.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.mem.memory();
        let region = Arc::new(region);
        let grown = current
            .insert_region(region.clone())
            .map_err(VmError::MemoryRegion)?;
        kvm::register_region(&self.fd, current.num_regions() as u32, &region)?;
        writer.replace(grown);
        Ok(region)
    }

    /// Starts one thread per vCPU.
    pub fn start(&self, vcpus: Vec<Vcpu>) -> Result<RunningVm, VmError> {
        self.start_ahead(VcpuThreadsAhead::default(), vcpus)
    }

    /// Like [`Vm::start`], each vCPU handed to its thread from `ahead` (a vCPU without one
    /// gets a new thread).
    pub fn start_ahead(
        &self,
        ahead: VcpuThreadsAhead,
        vcpus: Vec<Vcpu>,
    ) -> Result<RunningVm, VmError> {
        let mut running = RunningVm {
            threads: Vec::new(),
            control: self.control.clone(),
        };
        running.hand_over(ahead, vcpus)?;
        Ok(running)
    }
}

/// One vCPU's thread.
struct VcpuThread {
    id: usize,
    handle: JoinHandle<Result<VcpuOutcome, VcpuError>>,
    retired: Arc<AtomicBool>,
    /// Set by the thread as its last act, before it wakes the main thread.
    ended: Arc<AtomicBool>,
}

impl VcpuThread {
    /// Whether the thread has ended (or is about to: it set its flag and woke the main
    /// thread, which then joins it at once).
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || self.handle.is_finished()
    }
}

/// Work a thread started ahead runs for the VM's build before it takes its vCPU (the PIT,
/// KVM's CPUID entries: see [`crate::builder`]).
pub type SetUpTask = Box<dyn FnOnce() + Send>;

/// vCPU threads started before their vCPUs exist: each names itself `vcpuN`, pins itself and
/// installs its seccomp filter while the VM is still being built, then waits for its vCPU
/// ([`Vm::start_ahead`]). The first also runs the build's set-up tasks it is lent for
/// ([`VcpuThreadsAhead::lend_for_set_up`]) until their sender is dropped: no thread of their
/// own. Dropped unused, the threads end. Every vCPU thread starts this way.
#[derive(Default)]
pub struct VcpuThreadsAhead {
    waiting: Vec<WaitingThread>,
}

struct WaitingThread {
    id: usize,
    vcpu: SyncSender<Vcpu>,
    /// Set-up tasks for the thread to run before it takes its vCPU (the first thread's).
    tasks: Option<Sender<SetUpTask>>,
    named: Receiver<()>,
    handle: JoinHandle<Result<VcpuOutcome, VcpuError>>,
    ended: Arc<AtomicBool>,
}

impl VcpuThreadsAhead {
    /// One thread per `(vCPU id, host CPU to pin it to)`.
    pub fn spawn(vcpus: impl IntoIterator<Item = (usize, Option<usize>)>) -> Result<Self, VmError> {
        let waiting = vcpus
            .into_iter()
            .enumerate()
            .map(|(i, (id, cpu))| WaitingThread::spawn(id, cpu, i == 0))
            .collect::<Result<_, _>>()?;
        Ok(VcpuThreadsAhead { waiting })
    }

    /// Where the first thread takes set-up tasks (once: `None` after, or without threads).
    /// It runs them, under its vCPU filter (KVM ioctls and memory only), until the sender
    /// is dropped, and takes its vCPU after: drop it before handing the vCPUs over.
    pub fn lend_for_set_up(&mut self) -> Option<Sender<SetUpTask>> {
        self.waiting.first_mut()?.tasks.take()
    }
}

impl WaitingThread {
    /// The thread of vCPU `id`, named `vcpuN` (how Kata finds vCPU threads). Ending, it
    /// wakes the main thread ([`crate::wake`]), which then sees how the guest ended the VM.
    fn spawn(id: usize, cpu: Option<usize>, takes_tasks: bool) -> Result<Self, VmError> {
        let (vcpu, given) = mpsc::sync_channel::<Vcpu>(1);
        let (name_done, named) = mpsc::sync_channel(1);
        let (tasks, set_up) = match takes_tasks {
            true => {
                let (tasks, set_up) = mpsc::channel::<SetUpTask>();
                (Some(tasks), Some(set_up))
            }
            false => (None, None),
        };
        let ended = Arc::new(AtomicBool::new(false));
        let ends = ended.clone();
        let handle = thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || {
                let run = || {
                    let _ = name_done.send(());
                    crate::vcpu::prepare_thread(cpu)?;
                    for task in set_up.into_iter().flatten() {
                        task();
                    }
                    let vcpu = given.recv().map_err(|_| VcpuError::NeverStarted)?;
                    vcpu.run_on_prepared_thread()
                };
                let outcome = run();
                ends.store(true, Ordering::Release);
                crate::wake::wake();
                outcome
            })
            .map_err(VmError::Thread)?;
        Ok(WaitingThread {
            id,
            vcpu,
            tasks,
            named,
            handle,
            ended,
        })
    }
}

/// vCPU threads of a running VM.
pub struct RunningVm {
    threads: Vec<VcpuThread>,
    control: Arc<VmControl>,
}

impl RunningVm {
    /// Starts `vcpu` on a thread of its own named `vcpuN` (how Kata finds vCPU threads), also
    /// while the VM runs (a hot-added vCPU). A paused VM's new vCPU parks at once.
    pub fn add(&mut self, vcpu: Vcpu) -> Result<(), VmError> {
        self.hand_over(VcpuThreadsAhead::default(), vec![vcpu])
    }

    /// Gives each vCPU to its thread in `ahead`, or to a new one.
    fn hand_over(&mut self, ahead: VcpuThreadsAhead, vcpus: Vec<Vcpu>) -> Result<(), VmError> {
        let mut waiting = ahead.waiting;
        for vcpu in vcpus {
            let mut t = match waiting.iter().position(|t| t.id == vcpu.id) {
                Some(at) => waiting.swap_remove(at),
                None => WaitingThread::spawn(vcpu.id, vcpu.host_cpu(), false)?,
            };
            // Ends its set-up tasks if it was never lent (else the builder dropped its end).
            drop(t.tasks.take());
            let retired = vcpu.retire_flag();
            // A thread that ended already (its filter failed) says why when joined.
            let _ = t.vcpu.send(vcpu);
            // Named once this returns: whoever looks for `vcpuN` threads (Kata) finds it.
            let _ = t.named.recv();
            self.threads.push(VcpuThread {
                id: t.id,
                handle: t.handle,
                retired,
                ended: t.ended,
            });
        }
        Ok(())
    }

    /// The ids of the vCPUs running (not retired).
    pub fn vcpu_ids(&self) -> Vec<usize> {
        let live = self.threads.iter();
        live.filter(|t| !t.retired.load(Ordering::Acquire))
            .map(|t| t.id)
            .collect()
    }

    fn kick_all(&self) {
        for t in &self.threads {
            if !t.handle.is_finished() {
                let _ = t.handle.kill(kvm::kick::kick_signal());
            }
        }
    }

    /// Asks every vCPU to stop: sets the flag, then kicks each thread out of KVM_RUN.
    pub fn stop(&self) {
        self.control.request_stop();
        self.kick_all();
    }

    /// Parks every vCPU at its next exit; Ok once all are parked. A vCPU that does not leave
    /// KVM_RUN within [`STOP_GRACE`] fails the pause (the VM is resumed).
    pub fn pause(&self) -> Result<(), VmError> {
        self.control.request_pause();
        self.kick_all();
        let live = self
            .threads
            .iter()
            .filter(|t| !t.handle.is_finished())
            .count();
        if self
            .control
            .wait_parked(live, STOP_GRACE, || self.kick_all())
        {
            return Ok(());
        }
        self.control.resume();
        Err(VmError::PauseTimeout(STOP_GRACE))
    }

    /// Lets paused vCPUs run again.
    pub fn resume(&self) {
        self.control.resume();
    }

    /// Whether the vCPUs were told to pause (and not yet to run again).
    pub fn is_paused(&self) -> bool {
        self.control.state() == crate::vcpu::control::PAUSE
    }

    /// Runs `task` on the thread of each vCPU that is parked (not retired) while the VM is
    /// paused, with the vCPU's own fd; waits up to `timeout` for all of them.
    pub fn on_each_vcpu(&self, task: VcpuTask, timeout: Duration) -> Result<(), VmError> {
        let ids: Vec<usize> = self
            .threads
            .iter()
            .filter(|t| !t.handle.is_finished() && !t.retired.load(Ordering::Acquire))
            .map(|t| t.id)
            .collect();
        let missing = self.control.run_task(task, &ids, timeout);
        match missing.is_empty() {
            true => Ok(()),
            false => Err(VmError::VcpusBusy(missing)),
        }
    }

    /// Whether a vCPU is retired (its CPU ejected by the guest).
    pub fn any_retired(&self) -> bool {
        let mut threads = self.threads.iter();
        threads.any(|t| t.retired.load(Ordering::Acquire))
    }

    /// Parks vCPU `id` alone, out of KVM_RUN, until [`RunningVm::unretire`] (the guest
    /// ejected its CPU). Returns at once.
    pub fn retire(&mut self, id: usize) -> Result<(), VmError> {
        let t = self.thread(id)?;
        t.retired.store(true, Ordering::Release);
        let _ = t.handle.kill(kvm::kick::kick_signal());
        Ok(())
    }

    /// Lets a retired vCPU run again (its CPU was added back; the guest starts it with
    /// INIT/SIPI).
    pub fn unretire(&mut self, id: usize) -> Result<(), VmError> {
        self.thread(id)?.retired.store(false, Ordering::Release);
        self.control.wake_retired();
        Ok(())
    }

    /// Whether vCPU `id` has a thread (running or retired).
    pub fn has_vcpu(&self, id: usize) -> bool {
        self.thread(id).is_ok()
    }

    fn thread(&self, id: usize) -> Result<&VcpuThread, VmError> {
        self.threads
            .iter()
            .find(|t| t.id == id)
            .ok_or(VmError::NoVcpu(id))
    }

    /// Whether a vCPU thread has ended or the stop flag is set (what [`RunningVm::wait`] polls).
    pub fn is_done(&self) -> bool {
        self.threads.iter().any(VcpuThread::ended) || self.control.stopping()
    }

    /// Whether every vCPU thread has ended (each is joined at once).
    pub fn all_finished(&self) -> bool {
        self.threads.iter().all(VcpuThread::ended)
    }

    /// Waits until a vCPU ends the VM (then stops the others), the VMM's stop flag is set, or
    /// `timeout` passes (an error). Returns every vCPU's outcome.
    pub fn wait(self, timeout: Option<Duration>) -> Result<Vec<VcpuOutcome>, VmError> {
        let start = Instant::now();
        let mut timed_out = false;
        while !self.is_done() {
            if timeout.is_some_and(|t| start.elapsed() > t) {
                timed_out = true;
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        let outcomes = self.stop_and_join()?;
        match timeout {
            Some(t) if timed_out => Err(VmError::Timeout(t)),
            _ => Ok(outcomes),
        }
    }

    /// Stops every vCPU and joins its thread. A kick can be lost on some hosts (seen on PVM),
    /// so vCPUs still running are kicked again every 20 ms; one still in KVM_RUN after
    /// [`STOP_GRACE`] is left behind and reported as [`VmError::StuckVcpus`].
    pub fn stop_and_join(self) -> Result<Vec<VcpuOutcome>, VmError> {
        let start = Instant::now();
        self.stop();
        while !self.all_finished() {
            if start.elapsed() >= STOP_GRACE {
                let stuck = self.threads.iter().filter(|t| !t.handle.is_finished());
                return Err(VmError::StuckVcpus(stuck.map(|t| t.id).collect()));
            }
            thread::sleep(Duration::from_millis(20));
            self.stop();
        }
        let mut outcomes = Vec::new();
        for t in self.threads {
            match t.handle.join() {
                Ok(Ok(o)) => outcomes.push(o),
                Ok(Err(e)) => return Err(VmError::Vcpu(e)),
                Err(_) => return Err(VmError::Panicked(t.id)),
            }
        }
        Ok(outcomes)
    }
}

/// The end that describes the whole VM: the first vCPU end that was not a VMM stop.
pub fn vm_end(outcomes: &[VcpuOutcome]) -> VmEnd {
    outcomes
        .iter()
        .map(|o| o.end)
        .find(|e| *e != VmEnd::Stopped)
        .unwrap_or(VmEnd::Stopped)
}
