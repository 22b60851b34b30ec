//! Building and running a Linux VM from a [`VmConfig`]: KVM, memory, irqchip and PIT, the
//! kernel and initrd, COM1 and the i8042, one thread per vCPU, and the exit profile.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_pit_config, Msrs, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::VcpuFd;
use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::boot::{self, cpuid, mptable, msrs, BootError, LinuxBoot};
use crate::bus::{BusBuilder, BusError, SharedBuses, SharedDevice};
use crate::config::{ConfigError, IrqchipMode, VmConfig};
use crate::devices::i8042::{I8042, I8042_BASE, I8042_LEN};
use crate::devices::serial::{self, FlushPolicy, SerialDevice, SerialError, SerialOutput};
use crate::kvm::{self, KvmError, StatsFd, StatsSnapshot};
use crate::profile::{self, KvmStatDelta, ProfileReport, VcpuProfile, VcpuProfileSnapshot};
use crate::vcpu::{Buses, RegsAccess, Vcpu, VcpuError, VcpuOutcome, VmEnd};
use crate::vm::{self, RunningVm, Vm, VmError};

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
    Boot(#[from] BootError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Serial(#[from] SerialError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("Cannot read kernel {}: {error}", path.display())]
    KernelFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Memory too small: kernel {} does not fit in {memory} of guest RAM", path.display())]
    KernelTooBig { path: PathBuf, memory: String },
    #[error("Cannot create eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("Cannot install signal handler: {0}")]
    Signal(vmm_sys_util::errno::Error),
    #[error("The VM is no longer running")]
    NotRunning,
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
    running: Option<RunningVm>,
    profiles: Vec<Arc<VcpuProfile>>,
    stats: Vec<StatsBaseline>,
    io_names: Vec<String>,
    serial: Arc<Mutex<SerialDevice>>,
    tsc_khz: u64,
    started: Instant,
}

/// Builds the VM described by `config` and starts its vCPUs.
pub fn launch(config: &VmConfig, opts: LaunchOptions) -> Result<LaunchedVm, LaunchError> {
    config.validate(usize::from(u8::MAX))?;
    std::fs::metadata(&config.kernel).map_err(|error| LaunchError::KernelFile {
        path: config.kernel.clone(),
        error,
    })?;
    let kvm = kvm::open()?;
    let caps = kvm::Capabilities::probe(&kvm);
    config.validate(caps.max_vcpus)?;
    let vm = Vm::new(kvm, config.memory.bytes(), config.irqchip)?;
    if config.irqchip == IrqchipMode::Kernel {
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        vm.fd
            .create_pit2(pit)
            .map_err(|e| KvmError::Ioctl("KVM_CREATE_PIT2", e))?;
    }
    let boot = load_guest(&vm, config)?;
    let (buses, serial) = build_devices(&vm, config)?;
    let io_names = buses.snapshot().buses().pio.names_by_id();
    let mut launched = LaunchedVm {
        vm,
        running: None,
        profiles: Vec::new(),
        stats: Vec::new(),
        io_names,
        serial,
        tsc_khz: 0,
        started: Instant::now(),
    };
    let vcpus = launched.create_vcpus(config, &boot, &buses)?;
    if opts.stdin_to_serial {
        spawn_stdin_reader(launched.serial.clone());
    }
    launched.started = Instant::now();
    launched.running = Some(launched.vm.start(vcpus)?);
    Ok(launched)
}

fn load_guest(vm: &Vm, config: &VmConfig) -> Result<LinuxBoot, LaunchError> {
    let boot = boot::configure_linux_boot(
        &vm.mem,
        &config.kernel,
        config.initrd.as_deref(),
        &config.cmdline,
        usize::from(config.cpus),
    )
    .map_err(|e| {
        if kernel_outside_memory(&e) {
            LaunchError::KernelTooBig {
                path: config.kernel.clone(),
                memory: config.memory.to_string(),
            }
        } else {
            LaunchError::Boot(e)
        }
    })?;
    // The ACPI tables (for kernels without MP table support) are written by
    // `configure_linux_boot`; the MP table stays for kernels that parse it.
    mptable::setup_mptable(&vm.mem, usize::from(config.cpus))?;
    Ok(boot)
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

fn build_devices(
    vm: &Vm,
    config: &VmConfig,
) -> Result<(Arc<SharedBuses>, Arc<Mutex<SerialDevice>>), LaunchError> {
    let evt = EventFd::new(EFD_NONBLOCK).map_err(LaunchError::EventFd)?;
    if vm.irqchip == IrqchipMode::Kernel {
        vm.fd
            .register_irqfd(&evt, serial::COM1_IRQ)
            .map_err(|e| KvmError::Ioctl("KVM_IRQFD", e))?;
    }
    // An interactive console needs every byte at once; a pipe or file gets whole lines, which
    // saves a write syscall on most console exits.
    let policy = if std::io::stdout().is_terminal() {
        FlushPolicy::EveryWrite
    } else {
        FlushPolicy::Newline
    };
    let mut out = SerialOutput::stdout().with_flush_policy(policy);
    if let Some(path) = &config.serial_log {
        out = out.with_log_file(path)?;
    }
    let serial = Arc::new(Mutex::new(SerialDevice::new(evt, out)));
    let mut pio = BusBuilder::new();
    let com1: SharedDevice = serial.clone();
    pio.insert("com1", serial::COM1_BASE, serial::COM1_LEN, com1)?;
    pio.insert(
        "i8042",
        I8042_BASE,
        I8042_LEN,
        Arc::new(Mutex::new(I8042::new())),
    )?;
    let buses = Arc::new(SharedBuses::new(Buses {
        pio: pio.freeze(),
        mmio: BusBuilder::new().freeze(),
    }));
    Ok((buses, serial))
}

/// Reads stdin and queues it for the guest until stdin ends (the VM keeps running).
fn spawn_stdin_reader(serial: Arc<Mutex<SerialDevice>>) {
    let reader = move || {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                let taken = match serial.lock() {
                    Ok(mut s) => s.enqueue_input(rest).unwrap_or(0),
                    Err(_) => return,
                };
                rest = &rest[taken..];
                if taken == 0 {
                    thread::sleep(Duration::from_millis(5));
                }
            }
        }
    };
    // A reader that cannot start only means no console input; the VM still runs.
    if let Err(e) = thread::Builder::new().name("stdin".into()).spawn(reader) {
        eprintln!("exitless: no console input: cannot start stdin thread: {e}");
    }
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

fn configure_vcpu(
    vm: &Vm,
    fd: &VcpuFd,
    id: u8,
    cpus: u8,
    boot: &LinuxBoot,
) -> Result<(), KvmError> {
    let mut cpuid = vm
        .kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| KvmError::Ioctl("KVM_GET_SUPPORTED_CPUID", e))?;
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
        return Err(KvmError::Ioctl(
            "KVM_SET_MSRS",
            kvm_ioctls::Error::new(libc::EINVAL),
        ));
    }
    if vm.irqchip == IrqchipMode::Kernel {
        setup_lint(fd)?;
    }
    if id == 0 {
        let mut sregs = fd
            .get_sregs()
            .map_err(|e| KvmError::Ioctl("KVM_GET_SREGS", e))?;
        boot.sregs.apply_to(&mut sregs);
        fd.set_sregs(&sregs)
            .map_err(|e| KvmError::Ioctl("KVM_SET_SREGS", e))?;
        fd.set_regs(&boot.regs.to_kvm_regs())
            .map_err(|e| KvmError::Ioctl("KVM_SET_REGS", e))?;
    }
    Ok(())
}

impl LaunchedVm {
    fn create_vcpus(
        &mut self,
        config: &VmConfig,
        boot: &LinuxBoot,
        shared: &Arc<SharedBuses>,
    ) -> Result<Vec<Vcpu>, LaunchError> {
        let layout = shared.snapshot();
        let buses = layout.buses();
        if let Some(stats) = &self.vm.stats {
            if let Ok(start) = stats.read() {
                let fd = StatsFd::open(&self.vm.fd)?;
                self.stats.push(StatsBaseline {
                    scope: "vm".into(),
                    fd,
                    start,
                });
            }
        }
        let mut vcpus = Vec::new();
        for id in 0..config.cpus {
            let fd = self
                .vm
                .fd
                .create_vcpu(u64::from(id))
                .map_err(|e| KvmError::Ioctl("KVM_CREATE_VCPU", e))?;
            configure_vcpu(&self.vm, &fd, id, config.cpus, boot)?;
            if id == 0 {
                self.tsc_khz = fd.get_tsc_khz().map(u64::from).unwrap_or(0);
            }
            let profile = Arc::new(VcpuProfile::new(
                u32::from(id),
                buses.pio.names_by_id().len(),
                buses.mmio.names_by_id().len(),
            ));
            self.profiles.push(profile.clone());
            let (control, idx) = (self.vm.control.clone(), usize::from(id));
            let mut vcpu = Vcpu::new(
                idx,
                fd,
                shared.clone(),
                control,
                profile,
                RegsAccess::SyncRegs,
            )?;
            if let Some(cpu) = config.cpu_affinity.as_ref().and_then(|a| a.host_cpu(idx)) {
                vcpu.pin_to(cpu);
            }
            self.open_vcpu_stats(&vcpu);
            vcpus.push(vcpu);
        }
        if self.tsc_khz == 0 {
            self.tsc_khz = profile::estimate_tsc_khz(Duration::from_millis(50));
        }
        Ok(vcpus)
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

    /// Waits for the VM to end, calling `on_poll` every `poll` (it returns true to stop the
    /// VM), and stopping the VM once `timeout` passes. Collects every vCPU thread.
    pub fn wait(
        &mut self,
        timeout: Option<Duration>,
        poll: Duration,
        mut on_poll: impl FnMut(&LaunchedVm) -> bool,
    ) -> Result<LaunchEnd, LaunchError> {
        let start = Instant::now();
        let mut end = None;
        loop {
            let running = self.running.as_ref().ok_or(LaunchError::NotRunning)?;
            if running.is_done() {
                break;
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                end = Some(LaunchEnd::TimedOut);
                break;
            }
            if on_poll(self) {
                end = Some(LaunchEnd::StopRequested);
                break;
            }
            thread::sleep(
                poll.min(Duration::from_millis(20))
                    .max(Duration::from_millis(1)),
            );
        }
        let running = self.running.take().ok_or(LaunchError::NotRunning)?;
        let outcomes = Self::collect(running)?;
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
        self.build_report(self.snapshots(), deltas, self.elapsed())
    }

    /// The profile of the window since `earlier` (snapshots taken `window` ago), without
    /// KVM statistics.
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

static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
static REPORT_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(num: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP_SIGNAL.store(num, Ordering::SeqCst);
}

extern "C" fn on_report_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    REPORT_REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs handlers that only set flags: SIGINT and SIGTERM ask to stop
/// ([`stop_signal`]), SIGUSR1 asks for a profile report ([`take_report_request`]).
pub fn install_signal_handlers() -> Result<(), LaunchError> {
    use vmm_sys_util::signal::register_signal_handler;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        register_signal_handler(sig, on_stop_signal).map_err(LaunchError::Signal)?;
    }
    register_signal_handler(libc::SIGUSR1, on_report_signal).map_err(LaunchError::Signal)
}

/// The stop signal received, if any.
pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

/// Whether SIGUSR1 arrived since the last call.
pub fn take_report_request() -> bool {
    REPORT_REQUESTED.swap(false, Ordering::SeqCst)
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

    #[test]
    fn missing_kernel_fails_before_kvm() {
        let config = VmConfig::new("/nonexistent/exitless-kernel");
        let err = launch(&config, LaunchOptions::default()).err().unwrap();
        assert!(matches!(err, LaunchError::KernelFile { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/exitless-kernel"));
    }
}
