//! One way to build a VM, used by `exitless run` and `exitless bench`: KVM, guest memory, the
//! irqchip and PIT, devices through the [`DeviceManager`], the kernel, and configured vCPUs.
//!
//! ```text
//! let mut b = VmBuilder::new(kvm, spec)?;      // VM, memory, irqchip, PIT
//! let serial = b.add_console(output)?;         // COM1 (+ irqfd), i8042 with add_i8042
//! b.devices().add(BusKind::Pio, ...)?;         // anything else: the bench's ports, PCI...
//! let built = b.build(&VcpuOptions::default())?; // kernel, boot tables, vCPUs
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::{kvm_pit_config, Msrs, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VcpuFd};
use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::boot::{self, cpuid, mptable, msrs, BootError, LinuxBoot};
use crate::bus::SharedBuses;
use crate::config::{CpuAffinity, IrqchipMode};
use crate::device_manager::{BusKind, DeviceManager, DeviceManagerError, Notify};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::serial::{self, SerialDevice, SerialOutput};
use crate::devices::virtio::transport::VirtioPciDevice;
use crate::devices::virtio::VirtioDevice;
use crate::event_loop::{EventLoop, EventLoopError};
use crate::kvm::ring::CoalescedRing;
use crate::kvm::CreatedVm;
use crate::kvm::{self, KvmError};
use crate::profile::{self, VcpuProfile};
use crate::startup::{self, moment};
use crate::vcpu::{regs, RegsAccess, Vcpu, VcpuError};
use crate::vm::{SetUpTask, Vm, VmError};

mod restore;
pub use restore::VcpusAhead;

/// Errors building a VM.
#[derive(Debug, Error)]
pub enum BuildError {
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Devices(#[from] DeviceManagerError),
    #[error("Cannot create eventfd: {0}")]
    EventFd(std::io::Error),
    #[error(transparent)]
    EventLoop(#[from] EventLoopError),
    #[error("Cannot load the embedded guest: {0}")]
    Embedded(linux_loader::loader::Error),
    #[error("The embedded guest has no PVH entry note")]
    NoPvhEntry,
    #[error("vCPU {0} is beyond the VM's maximum of {1}")]
    VcpuLimit(u8, u8),
    #[error("Cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("The thread creating the PIT panicked")]
    PitThread,
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error(
        "vCPU {0} was made before the saved state came, and the saved state has no vCPU {0} \
         (the VM's vCPUs changed meanwhile)"
    )]
    VcpuNotSaved(u8),
}

/// The kernel to boot.
#[derive(Debug, Clone)]
pub enum KernelImage {
    /// A bzImage or ELF vmlinux (PVH) file, with the full Linux boot set-up (ACPI, MP table).
    File(PathBuf),
    /// A PVH ELF held in memory (the bench guest): loaded, command line and PVH start info
    /// with the memory map, nothing else.
    #[cfg(any(test, feature = "embedded"))]
    Embedded(&'static [u8]),
}

/// What the VM is made of.
#[derive(Debug, Clone)]
pub struct VmSpec {
    pub kernel: KernelImage,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    /// Guest RAM in bytes.
    pub memory: u64,
    /// What backs guest RAM (private by default; shared for vhost-user back ends).
    pub memory_backing: crate::memory::Backing,
    /// vCPUs at boot.
    pub cpus: u8,
    /// vCPUs the VM may have once vCPUs are added (`vm.resize`); at least `cpus`. The CPU
    /// topology the guest sees counts these.
    pub max_cpus: u8,
    pub irqchip: IrqchipMode,
}

/// How the vCPUs run.
#[derive(Debug, Clone)]
pub struct VcpuOptions {
    pub regs: RegsAccess,
    /// Per-exit profile (off only to measure the profiler itself).
    pub profiling: bool,
    /// The profile times one exit in this many, counting all
    /// ([`crate::profile::sample`] by default; 1: every exit).
    pub profile_sample: u32,
    /// Log the first access to an unmapped address (the bench pokes one on purpose).
    pub log_unmapped: bool,
    pub affinity: Option<CpuAffinity>,
}

impl Default for VcpuOptions {
    fn default() -> Self {
        VcpuOptions {
            regs: RegsAccess::SyncRegs,
            profiling: true,
            profile_sample: crate::profile::sample(),
            log_unmapped: true,
            affinity: None,
        }
    }
}

/// Where vCPU 0 starts.
enum BootEntry {
    Linux(Box<LinuxBoot>),
    #[cfg_attr(not(any(test, feature = "embedded")), allow(dead_code))]
    Pvh {
        entry: u64,
        start_info: u64,
    },
}

/// A VM being built: devices may still be added.
///
/// The lab's entry point for building VMs (the bench's and the fuzz targets' VMs, with
/// `KernelImage::Embedded` under the `embedded` feature), as it is `launch`'s.
pub struct VmBuilder {
    spec: VmSpec,
    vm: Vm,
    devices: DeviceManager,
    event_loop: EventLoop,
    hypercall_rewrite_off: bool,
    /// The thread creating the in-kernel PIT: KVM_CREATE_PIT2 waits for a kernel thread to be
    /// made (0.1 ms on an idle host, milliseconds on a busy one), so it overlaps device set-up
    /// and loading; only vCPU creation needs it done. It then asks KVM's CPUID entries.
    set_up: Option<SetUpThread>,
}

/// The thread running the set-up tasks (the PIT, then KVM's CPUID entries) beside the main
/// thread: the first vCPU's thread, started ahead and lent until its vCPU is ready
/// ([`crate::vm::VcpuThreadsAhead::lend_for_set_up`]: `launch`), else a short-lived thread of
/// its own (`pit-setup`: the lab's VMs, restores). It runs them until the builder drops
/// `tasks` (one thread, so one stack of private dirty memory, for both).
struct SetUpThread {
    pit_created: std::sync::mpsc::Receiver<Result<(), kvm_ioctls::Error>>,
    tasks: std::sync::mpsc::Sender<SetUpTask>,
    /// The thread of its own, if not lent one.
    own: Option<std::thread::JoinHandle<()>>,
}

/// A built VM, its vCPUs ready to start.
pub struct BuiltVm {
    pub vm: Vm,
    /// Where device work runs (queue processing, console input): never a vCPU thread.
    pub event_loop: EventLoop,
    /// Where devices are added and removed while the VM runs.
    pub devices: DeviceManager,
    /// The virtio devices at boot, for the profile.
    pub virtio: Vec<Arc<VirtioPciDevice>>,
    pub vcpus: Vec<Vcpu>,
    pub profiles: Vec<Arc<VcpuProfile>>,
    pub buses: Arc<SharedBuses>,
    /// Names of the port-I/O devices by id (the profile's device indexes).
    pub io_names: Vec<String>,
    pub tsc_khz: u64,
    /// How to create more vCPUs while the VM runs.
    pub template: Option<VcpuTemplate>,
}

/// Room in each vCPU's per-device MMIO counters for devices added while the VM runs.
const HOTPLUG_MMIO_HEADROOM: usize = 32;

/// What creating a vCPU takes, kept by a built VM so that vCPUs can be added while it runs.
#[derive(Clone)]
pub struct VcpuTemplate {
    buses: Arc<SharedBuses>,
    io_devices: usize,
    mmio_devices: usize,
    /// vCPUs the guest's CPU topology counts (the most the VM may have).
    topology_cpus: u8,
    opts: VcpuOptions,
    coalesced_ring: Option<Arc<CoalescedRing>>,
}

impl VcpuTemplate {
    /// vCPU `id` of `vm`, configured (CPUID, MSRs, LINT pins; the boot vCPU's entry), with
    /// its profile. An AP waits for the INIT/SIPI its guest sends.
    fn create(
        &self,
        vm: &Vm,
        id: u8,
        entry: Option<&BootEntry>,
    ) -> Result<(Vcpu, Arc<VcpuProfile>), BuildError> {
        let fd = create_vcpu_fd(vm, id)?;
        self.finish(vm, fd, id, entry)
    }

    /// Configures vCPU `id`'s `fd` (made by [`create_vcpu_fd`]) and wraps it with its profile.
    fn finish(
        &self,
        vm: &Vm,
        fd: VcpuFd,
        id: u8,
        entry: Option<&BootEntry>,
    ) -> Result<(Vcpu, Arc<VcpuProfile>), BuildError> {
        configure_vcpu(vm, &fd, id, self.topology_cpus, entry)?;
        self.wrap(vm, fd, id)
    }

    /// Wraps vCPU `id`'s configured `fd` with its profile, as the options say.
    fn wrap(&self, vm: &Vm, fd: VcpuFd, id: u8) -> Result<(Vcpu, Arc<VcpuProfile>), BuildError> {
        let profile = Arc::new(VcpuProfile::new(
            u32::from(id),
            self.io_devices,
            self.mmio_devices,
        ));
        let idx = usize::from(id);
        let (buses, control) = (self.buses.clone(), vm.control.clone());
        let mut vcpu = Vcpu::new(idx, fd, buses, control, profile.clone(), self.opts.regs)?;
        vcpu.set_profiling(self.opts.profiling);
        vcpu.set_profile_sample(self.opts.profile_sample);
        vcpu.set_log_unmapped(self.opts.log_unmapped);
        if let Some(cpu) = self.opts.affinity.as_ref().and_then(|a| a.host_cpu(idx)) {
            vcpu.pin_to(cpu);
        }
        if let Some(ring) = &self.coalesced_ring {
            vcpu.set_coalesced_ring(ring.clone());
        }
        if let Some(ring) = vm.dirty.vcpu_ring(&vm.fd, vcpu.fd())? {
            vcpu.set_dirty_ring(ring);
        }
        Ok((vcpu, profile))
    }

    /// vCPUs the guest's CPU topology counts (the most the VM may have).
    pub fn topology_cpus(&self) -> u8 {
        self.topology_cpus
    }

    /// A vCPU added while the VM runs (`vm.resize`): an AP, started by the guest's INIT/SIPI.
    pub fn create_hotplugged(
        &self,
        vm: &Vm,
        id: u8,
    ) -> Result<(Vcpu, Arc<VcpuProfile>), BuildError> {
        if id >= self.topology_cpus {
            return Err(BuildError::VcpuLimit(id, self.topology_cpus));
        }
        self.create(vm, id, None)
    }
}

impl VmBuilder {
    /// Creates the VM: memory, irqchip, and with an in-kernel irqchip the PIT.
    pub fn new(kvm: Kvm, spec: VmSpec) -> Result<Self, BuildError> {
        let event_loop = EventLoop::start()?;
        let (size, irqchip) = (spec.memory, spec.irqchip);
        let vm = Vm::new(kvm, None, size, &spec.memory_backing, irqchip)?;
        Self::around(spec, vm, event_loop, None)
    }

    /// Like [`VmBuilder::new`] for `launch`: on `created` if given (the head start's empty
    /// VM), the set-up tasks on `lent` if given (a thread started ahead: no thread of their
    /// own), and the devices thread not started: the caller starts it
    /// ([`EventLoop::run`] on [`BuiltVm::event_loop`]) once the vCPUs run, unless a device
    /// added before waits for it (which starts it then).
    pub fn new_on(
        kvm: Kvm,
        created: Option<CreatedVm>,
        spec: VmSpec,
        lent: Option<std::sync::mpsc::Sender<SetUpTask>>,
    ) -> Result<Self, BuildError> {
        let event_loop = EventLoop::deferred()?;
        let (size, irqchip) = (spec.memory, spec.irqchip);
        let vm = Vm::new(kvm, created, size, &spec.memory_backing, irqchip)?;
        Self::around(spec, vm, event_loop, lent)
    }

    /// Like [`VmBuilder::new`], with guest memory the caller made (memory zones, a
    /// snapshot's memory); `spec.memory` must be its size.
    pub fn with_memory(
        kvm: Kvm,
        spec: VmSpec,
        mem: vm_memory::GuestMemoryMmap,
    ) -> Result<Self, BuildError> {
        let event_loop = EventLoop::start()?;
        let vm = Vm::with_memory(kvm, mem, spec.irqchip)?;
        Self::around(spec, vm, event_loop, None)
    }

    /// The builder of `vm`: quirks, the PIT, the device manager.
    fn around(
        spec: VmSpec,
        vm: Vm,
        event_loop: EventLoop,
        lent: Option<std::sync::mpsc::Sender<SetUpTask>>,
    ) -> Result<Self, BuildError> {
        // A guest's vmcall/vmmcall of the wrong vendor gets #UD instead of being rewritten and
        // re-run: on PVM the rewrite never ends (KVM_RUN would not return). Linux picks the
        // right instruction itself, so it never needs the rewrite. Before the PIT: both take
        // the VM's lock.
        let hypercall_rewrite_off =
            vm.caps.disable_quirks2 && kvm::disable_hypercall_rewrite(&vm.fd);
        let set_up = match spec.irqchip {
            IrqchipMode::Kernel => Some(start_pit_creation(&vm, lent)?),
            _ => None,
        };
        let devices = DeviceManager::new(vm.fd.clone(), spec.irqchip);
        Ok(VmBuilder {
            spec,
            vm,
            devices,
            event_loop,
            hypercall_rewrite_off,
            set_up,
        })
    }

    /// Whether KVM's hypercall-instruction rewrite is off (guest hypercalls cannot livelock).
    pub fn hypercall_rewrite_off(&self) -> bool {
        self.hypercall_rewrite_off
    }

    pub fn vm(&self) -> &Vm {
        &self.vm
    }

    pub fn spec(&self) -> &VmSpec {
        &self.spec
    }

    /// Where devices are added.
    pub fn devices(&mut self) -> &mut DeviceManager {
        &mut self.devices
    }

    /// COM1 writing to `out`, its interrupt on GSI 4 (with an in-kernel irqchip).
    pub fn add_console(
        &mut self,
        out: SerialOutput,
    ) -> Result<Arc<Mutex<SerialDevice>>, BuildError> {
        let evt = EventFd::new(EFD_NONBLOCK).map_err(BuildError::EventFd)?;
        self.devices.connect_legacy_irq(&evt, serial::COM1_IRQ)?;
        let com1 = Arc::new(Mutex::new(SerialDevice::new(evt, out)));
        let (base, len) = (serial::COM1_BASE, serial::COM1_LEN);
        self.devices
            .add(BusKind::Pio, "com1", base, len, com1.clone())?;
        self.devices.register_snapshottable("com1", com1.clone());
        Ok(com1)
    }

    /// The devices event loop (what a device's memory listener runs its work on).
    pub fn event_loop(&self) -> crate::event_loop::EventLoopHandle {
        self.event_loop.handle()
    }

    /// A virtio device on PCI (virtio-pci with MSI-X); `name` is how the profile shows it.
    pub fn add_virtio(
        &mut self,
        name: &str,
        device: Box<dyn VirtioDevice>,
        notify: Notify,
    ) -> Result<Arc<VirtioPciDevice>, BuildError> {
        let handle = self.event_loop.handle();
        Ok(self
            .devices
            .add_virtio(name, device, &self.vm.mem, handle, notify)?)
    }

    /// The ACPI hotplug controllers (devices and vCPUs added while the VM runs, and with
    /// `memory_slots` memory), for a guest booted with ACPI.
    pub fn enable_hotplug(&mut self, memory_slots: usize) -> Result<(), BuildError> {
        let max = self.spec.max_cpus.max(self.spec.cpus);
        Ok(self
            .devices
            .enable_hotplug(self.spec.cpus, max, memory_slots)?)
    }

    /// The i8042, for the guest's reset.
    pub fn add_i8042(&mut self) -> Result<(), BuildError> {
        let dev = Arc::new(Mutex::new(I8042::new()));
        self.devices.register_snapshottable("i8042", dev.clone());
        self.devices
            .add(BusKind::Pio, "i8042", I8042_BASE, I8042_LEN, dev)?;
        Ok(())
    }

    /// Loads the kernel, writes the boot tables, freezes the devices and creates the vCPUs.
    pub fn build(self, opts: &VcpuOptions) -> Result<BuiltVm, BuildError> {
        let VmBuilder {
            spec,
            vm,
            devices,
            event_loop,
            set_up,
            ..
        } = self;
        // Asked on the set-up thread, after the PIT, while this one writes the ACPI tables and
        // loads the kernel: main to first line 3.45 -> 3.01 ms. (Without a PIT, asked here.)
        if let (Some(set_up), Some(task)) = (&set_up, vm.supported_cpuid.fetch_task(&vm.kvm)) {
            // A thread that ended already drops the task: `get` then asks here.
            let _ = set_up.tasks.send(Box::new(task));
        }
        let entry = load_kernel(&vm, &spec, &devices.acpi_platform())?;
        startup::mark(moment::LOADED);
        // Made while the set-up thread asks KVM's CPUID entries (configuring them needs those):
        // KVM_CREATE_VCPU is the other long step of a vCPU (~0.25 ms here).
        let fds = (0..spec.cpus)
            .map(|id| create_vcpu_fd(&vm, id))
            .collect::<Result<Vec<_>, _>>()?;
        startup::mark(moment::VCPU_FDS);
        vm.supported_cpuid.get(&vm.kvm)?;
        join_set_up(set_up)?;
        startup::mark(moment::CPUID_READY);
        let (mut built, template) = assemble(vm, event_loop, devices, &spec, opts)?;
        for (id, fd) in (0..spec.cpus).zip(fds) {
            let boot = (id == 0).then_some(&entry);
            configure_vcpu(&built.vm, &fd, id, template.topology_cpus, boot)?;
            built.add_vcpu(&template, fd, id)?;
        }
        startup::mark(moment::VCPUS_CREATED);
        if spec.max_cpus <= spec.cpus {
            built.vm.supported_cpuid.forget();
        }
        built.finish(template)
    }
}

/// Waits for the set-up thread: the PIT is created once it returns.
fn join_set_up(set_up: Option<SetUpThread>) -> Result<(), BuildError> {
    if let Some(SetUpThread {
        pit_created,
        tasks,
        own,
    }) = set_up
    {
        drop(tasks);
        let created = pit_created.recv().map_err(|_| BuildError::PitThread)?;
        if let Some(own) = own {
            own.join().map_err(|_| BuildError::PitThread)?;
        }
        created.map_err(|e| KvmError::Ioctl("KVM_CREATE_PIT2", e))?;
    }
    Ok(())
}

/// Freezes the devices and makes the built VM (without vCPUs yet) and the template its
/// vCPUs are made from.
fn assemble(
    vm: Vm,
    event_loop: EventLoop,
    mut devices: DeviceManager,
    spec: &VmSpec,
    opts: &VcpuOptions,
) -> Result<(BuiltVm, VcpuTemplate), BuildError> {
    let virtio = devices
        .virtio_devices()
        .iter()
        .map(|p| p.device.clone())
        .collect();
    let buses = devices.finish()?;
    let layout = buses.snapshot();
    let io_names = layout.buses().pio.names_by_id();
    let mmio_count = layout.buses().mmio.names_by_id().len();
    let template = VcpuTemplate {
        buses: buses.clone(),
        io_devices: io_names.len(),
        mmio_devices: mmio_count + HOTPLUG_MMIO_HEADROOM,
        topology_cpus: spec.max_cpus.max(spec.cpus),
        opts: opts.clone(),
        coalesced_ring: None,
    };
    let built = BuiltVm {
        vm,
        event_loop,
        devices,
        virtio,
        vcpus: Vec::new(),
        profiles: Vec::new(),
        buses,
        io_names,
        tsc_khz: 0,
        template: None,
    };
    Ok((built, template))
}

impl BuiltVm {
    /// Wraps configured vCPU `fd` as vCPU `id` with its profile.
    fn add_vcpu(&mut self, template: &VcpuTemplate, fd: VcpuFd, id: u8) -> Result<(), BuildError> {
        let (vcpu, profile) = template.wrap(&self.vm, fd, id)?;
        if id == 0 {
            self.tsc_khz = vcpu.fd().get_tsc_khz().map(u64::from).unwrap_or(0);
        }
        self.profiles.push(profile);
        self.vcpus.push(vcpu);
        Ok(())
    }

    /// The coalesced ring shared by the vCPUs, the template kept for vCPUs added later, the
    /// TSC rate.
    fn finish(mut self, mut template: VcpuTemplate) -> Result<BuiltVm, BuildError> {
        if self.devices.has_coalesced_zones() {
            template.coalesced_ring = share_coalesced_ring(&mut self.vcpus)?;
        }
        self.template = Some(template);
        if self.tsc_khz == 0 {
            self.tsc_khz = profile::estimate_tsc_khz(Duration::from_millis(50));
        }
        Ok(self)
    }
}

/// KVM's vCPU `id` of `vm`, not yet configured.
fn create_vcpu_fd(vm: &Vm, id: u8) -> Result<VcpuFd, BuildError> {
    let fd = vm.fd.create_vcpu(u64::from(id));
    Ok(fd.map_err(|e| KvmError::Ioctl("KVM_CREATE_VCPU", e))?)
}

/// Starts creating the in-kernel PIT on the `lent` thread, else on a short-lived thread of
/// its own, which then runs the set-up tasks it is sent until the builder drops its end. A
/// lent thread that ended already (its filter failed) leaves the PIT to this thread.
fn start_pit_creation(
    vm: &Vm,
    lent: Option<std::sync::mpsc::Sender<SetUpTask>>,
) -> Result<SetUpThread, BuildError> {
    let fd = vm.fd.clone();
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    let (created, pit_created) = std::sync::mpsc::sync_channel(1);
    let create: SetUpTask = Box::new(move || {
        let _ = created.send(fd.create_pit2(pit));
    });
    let (tasks, own) = match lent {
        Some(tasks) => (tasks, None),
        None => {
            let (tasks, given) = std::sync::mpsc::channel::<SetUpTask>();
            let own = std::thread::Builder::new()
                .name("pit-setup".into())
                .stack_size(64 * 1024)
                .spawn(move || {
                    for task in given {
                        task();
                    }
                })
                .map_err(BuildError::Thread)?;
            (tasks, Some(own))
        }
    };
    if let Err(std::sync::mpsc::SendError(create)) = tasks.send(create) {
        create();
    }
    Ok(SetUpThread {
        pit_created,
        tasks,
        own,
    })
}

/// Maps KVM's coalesced ring (one per VM) once and gives it to every vCPU; returns it for
/// vCPUs added later.
fn share_coalesced_ring(vcpus: &mut [Vcpu]) -> Result<Option<Arc<CoalescedRing>>, BuildError> {
    let Some(first) = vcpus.first() else {
        return Ok(None);
    };
    let ring = Arc::new(CoalescedRing::map(first.fd())?);
    for vcpu in vcpus {
        vcpu.set_coalesced_ring(ring.clone());
    }
    Ok(Some(ring))
}

/// Loads the kernel and everything it reads at boot.
fn load_kernel(
    vm: &Vm,
    spec: &VmSpec,
    platform: &boot::acpi::AcpiPlatform,
) -> Result<BootEntry, BuildError> {
    let mem = vm.memory();
    match &spec.kernel {
        KernelImage::File(path) => {
            let cpus = usize::from(spec.cpus);
            let boot = boot::configure_linux_boot(
                &mem,
                path,
                spec.initrd.as_deref(),
                &spec.cmdline,
                cpus,
                platform,
            )?;
            // The ACPI tables (the MADT lists every vCPU) are written by
            // `configure_linux_boot`; the MP table, for kernels without ACPI, only where it
            // can list them all (an MP table that left vCPUs out would cap them silently).
            if cpus <= mptable::MAX_MPTABLE_VCPUS {
                mptable::setup_mptable(&mem, cpus)?;
            }
            Ok(BootEntry::Linux(Box::new(boot)))
        }
        #[cfg(any(test, feature = "embedded"))]
        KernelImage::Embedded(image) => load_embedded(&mem, spec, image),
    }
}

/// Loads a PVH ELF held in memory (the bench guest): command line and PVH start info with
/// the memory map, nothing else.
#[cfg(any(test, feature = "embedded"))]
fn load_embedded(
    mem: &vm_memory::GuestMemoryMmap,
    spec: &VmSpec,
    image: &[u8],
) -> Result<BootEntry, BuildError> {
    use crate::boot::kernel::CMDLINE_MAX_SIZE;
    use crate::boot::linux::write_cmdline;
    use crate::boot::params::write_pvh_start_info;
    use linux_loader::loader::elf::{Elf, PvhBootCapability};
    use linux_loader::loader::KernelLoader;

    let loaded = Elf::load(mem, None, &mut std::io::Cursor::new(image), None)
        .map_err(BuildError::Embedded)?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(BuildError::NoPvhEntry);
    };
    write_cmdline(mem, &spec.cmdline, CMDLINE_MAX_SIZE)?;
    let e820 = boot::e820_map(spec.memory);
    let start_info = write_pvh_start_info(mem, None, &e820, None)?;
    Ok(BootEntry::Pvh {
        entry: entry.0,
        start_info: start_info.0,
    })
}

fn lapic_set_delivery_mode(regs: &mut [std::os::raw::c_char; 1024], offset: usize, mode: u32) {
    let mut bytes = [0u8; 4];
    for (b, r) in bytes.iter_mut().zip(&regs[offset..offset + 4]) {
        *b = *r as u8;
    }
    let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
    for (r, b) in regs[offset..offset + 4].iter_mut().zip(value.to_le_bytes()) {
        *r = b as std::os::raw::c_char;
    }
}

/// LINT0 as ExtINT (the PIC's output) and LINT1 as NMI, as a BIOS leaves them.
fn setup_lint(fd: &VcpuFd) -> Result<(), KvmError> {
    const APIC_LVT0: usize = 0x350;
    const APIC_LVT1: usize = 0x360;
    const APIC_MODE_NMI: u32 = 0x4;
    const APIC_MODE_EXTINT: u32 = 0x7;
    let mut lapic = fd
        .get_lapic()
        .map_err(|e| KvmError::Ioctl("KVM_GET_LAPIC", e))?;
    lapic_set_delivery_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
    lapic_set_delivery_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
    fd.set_lapic(&lapic)
        .map_err(|e| KvmError::Ioctl("KVM_SET_LAPIC", e))
}

/// CPUID, boot MSRs, LINT pins, and for the boot vCPU its entry registers.
fn configure_vcpu(
    vm: &Vm,
    fd: &VcpuFd,
    id: u8,
    cpus: u8,
    entry: Option<&BootEntry>,
) -> Result<(), BuildError> {
    let mut cpuid = vm.supported_cpuid.get(&vm.kvm)?;
    cpuid::fixup_cpuid(&mut cpuid, id, cpus);
    fd.set_cpuid2(&cpuid)
        .map_err(|e| KvmError::Ioctl("KVM_SET_CPUID2", e))?;
    let entries = msrs::boot_msr_entries();
    let msrs = Msrs::from_entries(&entries)
        .map_err(|_| KvmError::MissingCap("MSR list (too many boot MSRs)"))?;
    let set = fd
        .set_msrs(&msrs)
        .map_err(|e| KvmError::Ioctl("KVM_SET_MSRS", e))?;
    if set != entries.len() {
        let einval = kvm_ioctls::Error::new(libc::EINVAL);
        return Err(KvmError::Ioctl("KVM_SET_MSRS", einval).into());
    }
    if vm.irqchip == IrqchipMode::Kernel {
        setup_lint(fd)?;
    }
    match entry {
        Some(BootEntry::Linux(boot)) => set_linux_entry(fd, boot)?,
        Some(BootEntry::Pvh { entry, start_info }) => regs::set_pvh_entry(fd, *entry, *start_info)?,
        None => {}
    }
    Ok(())
}

fn set_linux_entry(fd: &VcpuFd, boot: &LinuxBoot) -> Result<(), KvmError> {
    let mut sregs = fd
        .get_sregs()
        .map_err(|e| KvmError::Ioctl("KVM_GET_SREGS", e))?;
    boot.sregs.apply_to(&mut sregs);
    fd.set_sregs(&sregs)
        .map_err(|e| KvmError::Ioctl("KVM_SET_SREGS", e))?;
    fd.set_regs(&boot.regs.to_kvm_regs())
        .map_err(|e| KvmError::Ioctl("KVM_SET_REGS", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lint_delivery_modes_keep_other_bits() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        regs[0x352] = 1; // mask bit 16
        regs[0x351] = 0x05u8 as std::os::raw::c_char;
        lapic_set_delivery_mode(&mut regs, 0x350, 7);
        assert_eq!(regs[0x351] as u8, 0x07);
        assert_eq!(regs[0x352], 1);
        lapic_set_delivery_mode(&mut regs, 0x360, 4);
        assert_eq!(regs[0x361] as u8, 0x04);
    }
}
