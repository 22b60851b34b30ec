//! Building and running a Linux VM from a [`VmConfig`]: KVM, memory, irqchip and PIT, the
//! kernel and initrd, COM1 (fed from stdin on the device event loop) and the i8042, one thread
//! per vCPU, and the exit profile.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;

mod balloon;
mod console;
mod coredump;
pub mod head_start;
mod hotplug;
mod memory_hotplug;
pub mod migrate;
mod operations;
mod pmem;
mod restore;
mod signals;
mod snapshot;
mod start_up_memory;
mod vhost_user_devices;
use console::{attach_idle_flush, attach_stdin, console_output};
pub use hotplug::HotplugDevice;
pub use operations::OperationError;
pub use restore::{premade_vm, restore, restore_premade, PremadeVm, RestoreOptions};
pub use signals::{install_signal_handlers, stop_signal, take_report_request};
pub use snapshot::SnapshotSummary;
pub use start_up_memory::{release_unused_stack, set_heap_release};

use crate::boot::BootError;
use crate::builder::{
    BuildError, BuiltVm, KernelImage, VcpuOptions, VcpuTemplate, VmBuilder, VmSpec,
};
use crate::config::{ConfigError, DiskConfig, VmConfig, MAX_VCPUS};
use crate::device_manager::{DeviceManager, Notify};
use crate::devices::serial::{SerialDevice, SerialError};
use crate::devices::serial_idle_flush::IdleFlush;
use crate::devices::virtio::blk::Block;
use crate::devices::virtio::net::Net;
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::transport::VirtioPciDevice;
use crate::devices::virtio::vhost_user::fs::Fs;
use crate::devices::virtio::vsock::{SocketFile, Vsock};
use crate::event_loop::EventLoop;
use crate::kvm::CreatedVm;
use crate::kvm::{self, KvmError, StatsFd, StatsSnapshot};
use crate::memory::hotplug::HotplugRam;
use crate::memory::Backing;
use crate::memory::MemoryError;
use crate::profile::virtio::VirtioStats;
use crate::profile::{KvmStatDelta, ProfileReport, VcpuProfile, VcpuProfileSnapshot};
use crate::startup::{self, moment};
use crate::vcpu::{Vcpu, VcpuOutcome, VmEnd};
use crate::vm::{self, RunningVm, VcpuThreadsAhead, Vm, VmError};
use crate::wake;

/// Errors building or running a Linux VM.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Serial(#[from] SerialError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("Cannot read kernel {}: {error}", path.display())]
    KernelFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Memory too small: kernel {} does not fit in {memory} of guest RAM", path.display())]
    KernelTooBig { path: PathBuf, memory: String },
    #[error("Cannot install signal handler: {0}")]
    Signal(vmm_sys_util::errno::Error),
    #[error("The VM is no longer running")]
    NotRunning,
    #[error(transparent)]
    Disk(#[from] crate::devices::virtio::blk::BlockError),
    #[error(transparent)]
    Tap(#[from] crate::devices::virtio::net::tap::TapError),
    #[error(transparent)]
    Vsock(#[from] crate::devices::virtio::vsock::VsockError),
    #[error("{name}: {error}")]
    Fs {
        name: String,
        error: crate::devices::virtio::vhost_user::VhostUserError,
    },
    #[error(transparent)]
    Pmem(#[from] crate::devices::virtio::pmem::PmemError),
    #[error(
        "A restored VM takes no virtio-pmem device yet (its guest memory layout has no pmem area)"
    )]
    PmemUnplaced,
    #[error("{name}: {error}")]
    VhostUser {
        name: String,
        error: crate::devices::virtio::vhost_user::VhostUserError,
    },
    #[error("Device {0} is not on the VM")]
    NoSuchDevice(String),
    #[error("Device {0} was added but has no PCI slot")]
    NotPlaced(String),
    #[error(transparent)]
    Devices(#[from] crate::device_manager::DeviceManagerError),
    #[error("The VM has no balloon device")]
    NoBalloon,
    #[error("Cannot tell the guest of the balloon's new target: {0}")]
    BalloonNotice(std::io::Error),
    #[error("Cannot write the serial console to {}: {error}", path.display())]
    SerialFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error(transparent)]
    MemoryHotplug(#[from] crate::memory::hotplug::MemoryHotplugError),
    #[error(transparent)]
    Operation(#[from] OperationError),
}

impl LaunchError {
    /// Whether what the client gave is at fault (a file that cannot be opened or used, a tap
    /// that is not one, a socket path in use), not the host: the API answers 400, not 500.
    pub fn is_input_fault(&self) -> bool {
        use crate::devices::virtio::net::tap::TapError;
        match self {
            LaunchError::Tap(TapError::OpenTun(_)) => false,
            LaunchError::Config(_)
            | LaunchError::KernelFile { .. }
            | LaunchError::KernelTooBig { .. }
            | LaunchError::Disk(_)
            | LaunchError::Tap(_)
            | LaunchError::Vsock(_)
            | LaunchError::SerialFile { .. }
            | LaunchError::Memory(
                MemoryError::OpenFile { .. }
                | MemoryError::FileTooShort { .. }
                | MemoryError::NoHugePages { .. }
                | MemoryError::TooFewHugePages { .. },
            ) => true,
            LaunchError::Snapshot(e) | LaunchError::Build(BuildError::Snapshot(e)) => {
                e.is_input_fault()
            }
            LaunchError::Operation(e) => e.is_input_fault(),
            _ => false,
        }
    }
}

/// Launch choices that are not part of the VM configuration.
#[derive(Debug, Clone, Copy)]
pub struct LaunchOptions {
    /// Feed the VMM's stdin to the guest's COM1.
    pub stdin_to_serial: bool,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        Self {
            stdin_to_serial: true,
        }
    }
}

/// Why [`LaunchedVm::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchEnd {
    /// A vCPU ended the VM (or every vCPU stopped).
    Guest(VmEnd),
    /// The timeout passed; the VM was stopped.
    TimedOut,
    /// The poll callback asked to stop (e.g. a signal).
    StopRequested,
}

/// A vCPU's stats fd and its value at launch.
struct StatsBaseline {
    scope: String,
    fd: StatsFd,
    start: StatsSnapshot,
}

/// A running Linux VM and what is needed to report on it.
pub struct LaunchedVm {
    vm: Vm,
    event_loop: EventLoop,
    running: Option<RunningVm>,
    profiles: Vec<Arc<VcpuProfile>>,
    stats: Vec<StatsBaseline>,
    io_names: Vec<String>,
    serial: Arc<Mutex<SerialDevice>>,
    /// Where devices are added and removed while the VM runs.
    devices: DeviceManager,
    /// Socket files the devices listen on (by device name), removed with their device or
    /// when the VM is dropped.
    socket_files: Vec<(String, SocketFile)>,
    tsc_khz: u64,
    started: Instant,
    /// How to create vCPUs added while the VM runs (`vm.resize`).
    template: Option<VcpuTemplate>,
    /// The balloon, if the VM has one.
    balloon: Option<balloon::BalloonControl>,
    /// Where memory added while the VM runs goes (with `memory.hotplug_size`).
    hotplug_ram: Option<HotplugRam>,
    /// What backs guest RAM, hot-added RAM too.
    memory_backing: Backing,
    /// The main thread's flush of partial console lines (a console that takes whole lines).
    idle_flush: Option<IdleFlush>,
    /// Where virtio-pmem regions go; holds their mappings until the VM ends (last: dropped
    /// after everything that could run the guest).
    pmem: pmem::PmemArea,
}

/// What a launch keeps beside the built VM: the console, the devices' socket files, the
/// balloon's control and where hot-added memory goes.
struct HostParts {
    serial: Arc<Mutex<SerialDevice>>,
    socket_files: Vec<(String, SocketFile)>,
    balloon: Option<balloon::BalloonControl>,
    hotplug_ram: Option<HotplugRam>,
}

impl LaunchedVm {
    /// The VM `built` from `config` (booted or restored), and its vCPUs, not started yet.
    fn new(built: BuiltVm, config: &VmConfig, parts: HostParts) -> (Self, Vec<Vcpu>) {
        let launched = LaunchedVm {
            vm: built.vm,
            event_loop: built.event_loop,
            running: None,
            profiles: built.profiles,
            stats: Vec::new(),
            io_names: built.io_names,
            serial: parts.serial,
            devices: built.devices,
            socket_files: parts.socket_files,
            tsc_khz: built.tsc_khz,
            started: Instant::now(),
            template: built.template,
            balloon: parts.balloon,
            hotplug_ram: parts.hotplug_ram,
            memory_backing: config.memory_backing(),
            idle_flush: None,
            pmem: pmem::PmemArea::default(),
        };
        (launched, built.vcpus)
    }
}

/// Builds the VM described by `config` and starts its vCPUs.
pub fn launch(config: &VmConfig, opts: LaunchOptions) -> Result<LaunchedVm, LaunchError> {
    // Before the first thread: the arena limit decides how many heaps the threads get.
    crate::seccomp::prepare_malloc();
    config.validate(MAX_VCPUS)?;
    std::fs::metadata(&config.kernel).map_err(|error| LaunchError::KernelFile {
        path: config.kernel.clone(),
        error,
    })?;
    let (kvm, created) = kvm_and_head_start()?;
    startup::mark(moment::KVM_OPEN);
    config.validate(kvm.get_max_vcpus())?;
    let spec = vm_spec(config);
    // The vCPU threads start, and install their seccomp filters (~0.2 ms of CPU each), while
    // the VM is created: started after it, they took the main thread's CPU while it wrote the
    // ACPI tables and loaded the kernel (0.15 -> 0.3-0.5 ms on 2 host CPUs).
    let affinity = config.cpu_affinity.as_ref();
    let mut threads_ahead = VcpuThreadsAhead::spawn(
        (0..usize::from(config.cpus)).map(|id| (id, affinity.and_then(|a| a.host_cpu(id)))),
    )?;
    let mut builder = match config.zones() {
        Some(zones) => {
            let mem = crate::memory::create_zoned_memory(&zones)?;
            VmBuilder::with_memory(kvm, spec, mem)?
        }
        // The PIT and KVM's CPUID entries on vCPU 0's thread until its vCPU is ready: one
        // thread fewer than a set-up thread of their own.
        None => VmBuilder::new_on(kvm, created, spec, threads_ahead.lend_for_set_up())?,
    };
    startup::mark(moment::VM_CREATED);
    let serial = builder.add_console(console_output(config)?)?;
    builder.add_i8042()?;
    let hotplug_ram = config.hotplug_ram();
    builder.enable_hotplug(hotplug_ram.as_ref().map_or(0, HotplugRam::slots))?;
    let socket_files = add_virtio_devices(&mut builder, config)?;
    let pmem_area = add_pmem_devices(&mut builder, config)?;
    let balloon = balloon::add_balloon(&mut builder, config)?;
    startup::mark(moment::DEVICES);
    let vcpu_opts = VcpuOptions {
        affinity: config.cpu_affinity.clone(),
        ..VcpuOptions::default()
    };
    let built = builder
        .build(&vcpu_opts)
        .map_err(|e| kernel_error(e, config))?;
    let parts = HostParts {
        serial,
        socket_files,
        balloon,
        hotplug_ram,
    };
    let (mut launched, vcpus) = LaunchedVm::new(built, config, parts);
    launched.pmem = pmem_area;
    launched.open_stats(&vcpus)?;
    launched.started = Instant::now();
    launched.running = Some(launched.vm.start_ahead(threads_ahead, vcpus)?);
    startup::mark(moment::THREADS);
    // The devices thread starts when first needed (a device that waited for it at set-up
    // started it already): console input, a call that waits for it, or the guest activating
    // a virtio device (the vCPU's work waits in its queue and wakes the main thread, which
    // starts it: `attend`). A guest that never drives a device never has it. The console's
    // partial lines are the main thread's.
    if opts.stdin_to_serial && console::stdin_may_have_input() {
        attach_stdin(&launched.event_loop, launched.serial.clone());
    }
    launched.idle_flush = attach_idle_flush(&launched.serial);
    start_up_memory::release_freed_heap();
    Ok(launched)
}

/// What the builder makes of `config`: the kernel, memory and vCPU limits a VM is made with
/// (a boot's and a restore's alike; a restore then holds the saved state to them).
pub(crate) fn vm_spec(config: &VmConfig) -> VmSpec {
    VmSpec {
        kernel: KernelImage::File(config.kernel.clone()),
        initrd: config.initrd.clone(),
        cmdline: config.cmdline.clone(),
        memory: config.memory.bytes(),
        memory_backing: config.memory_backing(),
        cpus: config.cpus,
        max_cpus: config.max_vcpus.unwrap_or(config.cpus).max(config.cpus),
        irqchip: config.irqchip,
    }
}

/// KVM, and the head start's empty VM if `main` began one (the first launch only), else
/// KVM opened here.
fn kvm_and_head_start() -> Result<(kvm_ioctls::Kvm, Option<CreatedVm>), LaunchError> {
    Ok(match head_start::take_vm() {
        Some(head) => (head.kvm, Some(head.vm)),
        None => (kvm::open()?, None),
    })
}

/// The disks, the entropy source, the network cards and the socket device the config asks
/// for, on PCI; returns the socket files to remove at the end.
fn add_virtio_devices(
    builder: &mut VmBuilder,
    config: &VmConfig,
) -> Result<Vec<(String, SocketFile)>, LaunchError> {
    for (i, disk) in config.disks.iter().enumerate() {
        let name = device_name(disk.id.as_deref(), "virtio-blk", i);
        let handle = builder.event_loop();
        let model = vhost_user_devices::disk_model(&name, disk, builder.devices(), handle)?;
        builder.add_virtio(&name, model, Notify::Ioeventfd)?;
    }
    if config.rng {
        builder.add_virtio("virtio-rng", Box::new(Rng::new()), Notify::Ioeventfd)?;
    }
    for (i, net) in config.nets.iter().enumerate() {
        let name = device_name(net.id.as_deref(), "virtio-net", i);
        builder.add_virtio(&name, Box::new(Net::open(net)?), Notify::Ioeventfd)?;
    }
    for (i, fs) in config.fs.iter().enumerate() {
        let name = device_name(fs.id.as_deref(), "virtio-fs", i);
        let dev = connect_fs(&name, fs)?;
        let listener = dev.memory_listener(&name, builder.event_loop());
        builder.add_virtio(&name, Box::new(dev), Notify::Ioeventfd)?;
        builder.devices().add_memory_listener(Box::new(listener));
    }
    for (i, g) in config.generic_vhost_user.iter().enumerate() {
        let name = device_name(g.id.as_deref(), "vhost-user", i);
        let handle = builder.event_loop();
        let model = vhost_user_devices::generic_model(&name, g, builder.devices(), handle)?;
        builder.add_virtio(&name, model, Notify::Ioeventfd)?;
    }
    let mut files = Vec::new();
    if let Some(vsock) = &config.vsock {
        let (dev, file) = Vsock::new(vsock)?;
        let name = vsock.id.clone().unwrap_or_else(|| "virtio-vsock".into());
        builder.add_virtio(&name, Box::new(dev), Notify::Ioeventfd)?;
        files.push((name, file));
    }
    Ok(files)
}

/// The virtio-pmem devices the config asks for, their files mapped into guest memory; returns
/// where the next one goes (`vm.add-pmem`).
fn add_pmem_devices(
    builder: &mut VmBuilder,
    config: &VmConfig,
) -> Result<pmem::PmemArea, LaunchError> {
    let mut area = pmem::PmemArea::new(config);
    for (i, p) in config.pmem.iter().enumerate() {
        let name = device_name(p.id.as_deref(), "virtio-pmem", i);
        let fd = builder.vm().fd.clone();
        let dev = area.attach(&fd, p)?;
        builder.add_virtio(&name, Box::new(dev), Notify::Ioeventfd)?;
    }
    Ok(area)
}

/// A device's name in the profile and `vm.counters`: its API id, else kind and index.
pub(crate) fn device_name(id: Option<&str>, kind: &str, index: usize) -> String {
    id.map_or_else(|| format!("{kind}{index}"), str::to_string)
}

/// The virtio-fs device `name`, connected to its back end (one line says so).
pub(crate) fn connect_fs(name: &str, fs: &crate::config::FsConfig) -> Result<Fs, LaunchError> {
    let dev = Fs::connect(fs).map_err(|error| LaunchError::Fs {
        name: name.to_string(),
        error,
    })?;
    {
        let f = dev.frontend();
        eprintln!(
            "exitless: {name}: vhost-user back end at {} connected (virtio features {:#x}, protocol features {:#x})",
            fs.socket.display(),
            f.offered_features(),
            f.protocol_features().bits()
        );
    }
    Ok(dev)
}

/// The disk's image, opened as its config says.
pub(crate) fn open_disk(disk: &DiskConfig) -> Result<Block, LaunchError> {
    Ok(Block::open(disk)?)
}

/// An image that does not fit in guest memory is said in the user's terms.
fn kernel_error(e: BuildError, config: &VmConfig) -> LaunchError {
    match e {
        BuildError::Boot(b) if kernel_outside_memory(&b) => LaunchError::KernelTooBig {
            path: config.kernel.clone(),
            memory: config.memory.to_string(),
        },
        other => LaunchError::Build(other),
    }
}

/// Whether linux-loader failed because the image reaches past guest RAM (the loaders report a
/// failed copy into guest memory this way).
fn kernel_outside_memory(e: &BootError) -> bool {
    use linux_loader::loader::{bzimage, elf, Error as LoaderError};
    matches!(
        e,
        BootError::KernelLoad {
            source: LoaderError::Elf(elf::Error::ReadKernelImage)
                | LoaderError::Bzimage(bzimage::Error::ReadBzImageCompressedKernel),
            ..
        }
    )
}

impl LaunchedVm {
    /// Opens KVM's stats fds (VM and each vCPU) and reads their starting values.
    fn open_stats(&mut self, vcpus: &[Vcpu]) -> Result<(), LaunchError> {
        // The VM's stats fd, opened with the VM, becomes the baseline's: not a second one.
        if let Some(fd) = self.vm.stats.take() {
            if let Ok(start) = fd.read() {
                self.stats.push(StatsBaseline {
                    scope: "vm".into(),
                    fd,
                    start,
                });
            }
        }
        for vcpu in vcpus {
            self.open_vcpu_stats(vcpu);
        }
        Ok(())
    }

    /// Starts the devices thread now if a device may need it, for a main thread that is about
    /// to take its seccomp filter (which does not let it start threads): `exitless run`,
    /// where no device is added later. A VM without virtio devices still never has it.
    pub fn start_devices_before_filter(&self) -> Result<(), LaunchError> {
        if !self.devices.virtio_devices().is_empty() {
            self.event_loop.run().map_err(BuildError::from)?;
        }
        Ok(())
    }

    /// What the main thread does each time it wakes: starts the devices thread if work was
    /// fired at it (a vCPU activating a device), flushes a partial console line that has
    /// waited long enough. Returns how long until a waiting line is due, to sleep at most that.
    pub fn attend(&mut self) -> Option<Duration> {
        if !self.event_loop.is_running() {
            if let Err(e) = self.event_loop.run_if_wanted() {
                eprintln!("exitless: {e}; devices are not served");
            }
            if self.event_loop.is_running() {
                startup::mark(moment::DEVICES_THREAD);
            }
        }
        self.idle_flush.as_mut()?.attend(Instant::now())
    }

    fn open_vcpu_stats(&mut self, vcpu: &Vcpu) {
        let Ok(fd) = StatsFd::open(vcpu.fd()) else {
            return;
        };
        if let Ok(start) = fd.read() {
            self.stats.push(StatsBaseline {
                scope: format!("vcpu{}", vcpu.id),
                fd,
                start,
            });
        }
    }

    /// Stops every vCPU (returns at once; [`LaunchedVm::wait`] then collects them).
    pub fn stop(&self) {
        if let Some(r) = &self.running {
            r.stop();
        }
    }

    /// Waits for the VM to end, stopping it once `timeout` passes. `on_wake` is called on
    /// every wake-up of the main thread (a signal, a vCPU thread ending, the guest ejecting a
    /// device or a CPU, which is completed here first: [`crate::wake`]) and at least every
    /// `every` if given (it returns true to stop the VM); between them the thread sleeps.
    /// Collects every vCPU thread.
    pub fn wait(
        &mut self,
        timeout: Option<Duration>,
        every: Option<Duration>,
        mut on_wake: impl FnMut(&LaunchedVm) -> bool,
    ) -> Result<LaunchEnd, LaunchError> {
        let start = Instant::now();
        let mut end = None;
        loop {
            let seen = wake::generation();
            let running = self.running.as_ref().ok_or(LaunchError::NotRunning)?;
            if running.is_done() {
                break;
            }
            let left = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                end = Some(LaunchEnd::TimedOut);
                break;
            }
            self.complete_ejects_unattended();
            if on_wake(self) {
                end = Some(LaunchEnd::StopRequested);
                break;
            }
            let next = [left, every, self.attend()].into_iter().flatten().min();
            wake::sleep_until_changed(seen, next);
        }
        let running = self.running.take().ok_or(LaunchError::NotRunning)?;
        let outcomes = Self::collect(running)?;
        self.stop_devices();
        if let Ok(mut s) = self.serial.lock() {
            s.flush_output();
        }
        let guest_end = outcomes.map_or(VmEnd::Stopped, |o| vm::vm_end(&o));
        Ok(end.unwrap_or(LaunchEnd::Guest(guest_end)))
    }

    /// Stops the vCPUs and joins them. A vCPU that does not leave KVM_RUN within
    /// [`crate::vm::STOP_GRACE`] (seen on hosts whose KVM emulates long guest stretches without checking
    /// for signals) is left behind: `None`, and the caller is expected to exit the process.
    fn collect(running: RunningVm) -> Result<Option<Vec<VcpuOutcome>>, LaunchError> {
        match running.stop_and_join() {
            Ok(outcomes) => Ok(Some(outcomes)),
            Err(VmError::StuckVcpus(ids)) => {
                eprintln!("exitless: vCPU(s) {ids:?} did not leave KVM_RUN after being stopped; not waiting for them");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Resets the devices that ask for it before the VM goes (vhost-user back ends stop their
    /// queues), on the event loop; once the vCPUs are stopped.
    fn stop_devices(&self) {
        for d in self.virtio().filter(|d| d.resets_on_stop()) {
            d.shut_down();
        }
    }

    /// The virtio devices on the VM now.
    fn virtio(&self) -> impl Iterator<Item = &Arc<VirtioPciDevice>> {
        self.devices.virtio_devices().iter().map(|p| &p.device)
    }

    fn running(&self) -> Result<&RunningVm, LaunchError> {
        self.running.as_ref().ok_or(LaunchError::NotRunning)
    }

    /// Parks every vCPU (devices keep serving what is in flight).
    pub fn pause(&self) -> Result<(), LaunchError> {
        Ok(self.running()?.pause()?)
    }

    /// Lets the vCPUs run again after [`LaunchedVm::pause`].
    pub fn resume(&self) -> Result<(), LaunchError> {
        self.running()?.resume();
        startup::mark(startup::restore_moment::RESUMED);
        Ok(())
    }

    /// The ids of the vCPUs running now.
    pub fn vcpu_ids(&self) -> Vec<usize> {
        self.running
            .as_ref()
            .map(|r| r.vcpu_ids())
            .unwrap_or_default()
    }

    /// Creates vCPU `id` and starts its thread (`vcpuN`), or lets a retired one run again; it
    /// waits for the guest's INIT/SIPI.
    pub fn add_vcpu(&mut self, id: u8) -> Result<(), LaunchError> {
        if let Some(running) = self.running.as_mut() {
            if running.has_vcpu(usize::from(id)) {
                return Ok(running.unretire(usize::from(id))?);
            }
        }
        let template = self.template.as_ref().ok_or(LaunchError::NotRunning)?;
        let (vcpu, profile) = template.create_hotplugged(&self.vm, id)?;
        self.open_vcpu_stats(&vcpu);
        let running = self.running.as_mut().ok_or(LaunchError::NotRunning)?;
        running.add(vcpu)?;
        self.profiles.push(profile);
        Ok(())
    }

    /// Parks vCPU `id` (the guest ejected its CPU) until it is added again.
    pub fn remove_vcpu(&mut self, id: usize) -> Result<(), LaunchError> {
        let running = self.running.as_mut().ok_or(LaunchError::NotRunning)?;
        Ok(running.retire(id)?)
    }

    /// How the guest ended the VM, once it has (without waiting): the vCPUs are then
    /// collected.
    pub fn guest_end(&mut self) -> Option<VmEnd> {
        if !self.running.as_ref()?.is_done() {
            return None;
        }
        let running = self.running.take()?;
        let outcomes = Self::collect(running).ok().flatten();
        Some(outcomes.map_or(VmEnd::Stopped, |o| vm::vm_end(&o)))
    }

    /// Stops the vCPUs (if they still run) and collects them; the console is flushed.
    pub fn shut_down(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = Self::collect(running);
        }
        self.stop_devices();
        if let Ok(mut s) = self.serial.lock() {
            s.flush_output();
        }
    }

    /// Each virtio device's counters by the device's name (`vm.counters`).
    pub fn device_counters(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>> {
        self.virtio()
            .map(|d| {
                let stats = VirtioStats::read(d.name(), &d.counters(), d.device_counters());
                (d.name().to_string(), stats.counter_map())
            })
            .collect()
    }

    pub fn snapshots(&self) -> Vec<VcpuProfileSnapshot> {
        self.profiles.iter().map(|p| p.snapshot()).collect()
    }

    /// Time since the vCPUs started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The profile since launch, with KVM statistics deltas.
    pub fn report(&self) -> ProfileReport {
        let mut deltas = Vec::new();
        for s in &self.stats {
            let Ok(now) = s.fd.read() else { continue };
            deltas.extend(KvmStatDelta::scoped(
                &s.scope,
                s.fd.schema().deltas(&s.start, &now),
            ));
        }
        let virtio = self
            .virtio()
            .map(|d| VirtioStats::read(d.name(), &d.counters(), d.device_counters()))
            .collect();
        self.build_report(self.snapshots(), deltas, self.elapsed())
            .with_virtio(virtio)
    }

    /// The profile of the window since `earlier` (snapshots taken `window` ago), without
    /// KVM statistics and virtio counters (the full report has both).
    pub fn report_since(&self, earlier: &[VcpuProfileSnapshot], window: Duration) -> ProfileReport {
        let now = self.snapshots();
        let vcpus = now.iter().zip(earlier).map(|(n, e)| n.delta(e)).collect();
        self.build_report(vcpus, Vec::new(), window)
    }

    fn build_report(
        &self,
        vcpus: Vec<VcpuProfileSnapshot>,
        kvm_stats: Vec<KvmStatDelta>,
        wall: Duration,
    ) -> ProfileReport {
        let console = self.serial.lock().map_or_else(
            |poisoned| poisoned.get_ref().output().loss(),
            |serial| serial.output().loss(),
        );
        ProfileReport::new(
            vcpus,
            self.io_names.clone(),
            Vec::new(),
            kvm_stats,
            self.tsc_khz,
            wall.as_secs_f64(),
        )
        .with_console(console)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_kernel_fails_before_kvm() {
        let config = VmConfig::new("/nonexistent/exitless-kernel");
        let err = launch(&config, LaunchOptions::default()).err().unwrap();
        assert!(matches!(err, LaunchError::KernelFile { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/exitless-kernel"));
    }
}
