//! What the lab watches on each vCPU, through the core's [`ExitObserver`] hook: the guest's
//! markers (a write to the marker port brackets a measured loop; the vCPU's counters are kept
//! at each), and the register accesses a VMM without sync regs makes on every exit.

use std::sync::{Arc, Mutex, MutexGuard};

use kvm_ioctls::VcpuFd;
use serde::Serialize;

use super::threads::{ThreadSampler, ThreadsSample};
use vmm::kvm::{StatsFd, StatsSchema, StatsSnapshot};
use vmm::profile::{self, VcpuProfileSnapshot};
use vmm::vcpu::{ExitObserver, ObservedVcpu, RegsAccess, Vcpu, VcpuError};

/// A moment the guest marked (bench begin/end): the vCPU's counters then.
#[derive(Debug, Clone)]
pub struct Marker {
    pub value: u32,
    /// Host TSC when the marker exit was handled.
    pub host_tsc: u64,
    /// Userspace exits so far, the marker's own included.
    pub user_exits: u64,
    pub profile: VcpuProfileSnapshot,
    pub kvm_stats: Option<StatsSnapshot>,
    /// Every thread's CPU time and wake-ups (configurations that ask for it).
    pub threads: Option<ThreadsSample>,
}

/// How the VMM reads guest registers on each userspace exit, including ways exitless itself
/// never does (the regs case compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RegsMode {
    /// Not at all: no sync regs, no ioctl (the floor; a VMM that never needs registers).
    None,
    /// From the kvm_run page (KVM_CAP_SYNC_REGS): no extra ioctl, what exitless does.
    SyncRegs,
    /// KVM_GET_REGS per exit (what a VMM without sync regs pays).
    GetRegs,
    /// KVM_GET_REGS and KVM_SET_REGS per exit.
    GetSetRegs,
}

impl RegsMode {
    /// What the core does itself; the ioctls are the observer's.
    pub fn core(self) -> RegsAccess {
        match self {
            RegsMode::SyncRegs => RegsAccess::SyncRegs,
            RegsMode::None | RegsMode::GetRegs | RegsMode::GetSetRegs => RegsAccess::None,
        }
    }
}

/// The markers one vCPU's observer keeps; clones share them.
#[derive(Debug, Clone, Default)]
pub struct MarkerLog(Arc<Mutex<Vec<Marker>>>);

impl MarkerLog {
    /// The markers so far, in the order the guest made them.
    pub fn markers(&self) -> MutexGuard<'_, Vec<Marker>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The lab's observer of one vCPU.
pub struct BenchObserver {
    log: MarkerLog,
    /// KVM's binary stats of the vCPU, read at each marker (None when KVM has none).
    stats: Option<StatsFd>,
    regs: RegsMode,
    /// Samples every thread at each marker, when set.
    sampler: Option<ThreadSampler>,
}

impl BenchObserver {
    /// An observer of the vCPU `fd`, making the register accesses `regs` says the core does
    /// not.
    pub fn new(fd: &VcpuFd, regs: RegsMode) -> Self {
        BenchObserver {
            log: MarkerLog::default(),
            stats: StatsFd::open(fd).ok(),
            regs,
            sampler: None,
        }
    }

    /// Where its markers go.
    pub fn log(&self) -> MarkerLog {
        self.log.clone()
    }

    /// What the markers' KVM stats mean (None when KVM has no binary stats).
    pub fn schema(&self) -> Option<StatsSchema> {
        self.stats.as_ref().map(|s| s.schema().clone())
    }
}

impl ExitObserver for BenchObserver {
    fn observe(&mut self, value: u32, vcpu: &ObservedVcpu<'_>) {
        let kvm_stats = self.stats.as_ref().and_then(|s| s.read().ok());
        let threads = self.sampler.as_mut().and_then(ThreadSampler::sample);
        let marker = Marker {
            value,
            host_tsc: profile::rdtsc(),
            user_exits: vcpu.user_exits,
            profile: vcpu.profile.snapshot(),
            kvm_stats,
            threads,
        };
        self.log.markers().push(marker);
    }

    fn wants_every_exit(&self) -> bool {
        matches!(self.regs, RegsMode::GetRegs | RegsMode::GetSetRegs)
    }

    fn every_exit(&mut self, fd: &VcpuFd) -> Result<(), VcpuError> {
        let regs = fd
            .get_regs()
            .map_err(|e| VcpuError::Ioctl("KVM_GET_REGS", e))?;
        if self.regs == RegsMode::GetSetRegs {
            fd.set_regs(&regs)
                .map_err(|e| VcpuError::Ioctl("KVM_SET_REGS", e))?;
        }
        // The values are unused; reading them is what the regs case measures.
        std::hint::black_box((regs.rip, regs.rax));
        Ok(())
    }
}

/// Shows `vcpu`'s exits to a new [`BenchObserver`]; returns where its markers go and what
/// their KVM stats mean.
pub fn observe(vcpu: &mut Vcpu, regs: RegsMode) -> (MarkerLog, Option<StatsSchema>) {
    observe_sampled(vcpu, regs, None)
}

/// [`observe`], each marker also sampling every thread with `sampler` (when given).
pub fn observe_sampled(
    vcpu: &mut Vcpu,
    regs: RegsMode,
    sampler: Option<ThreadSampler>,
) -> (MarkerLog, Option<StatsSchema>) {
    let mut observer = BenchObserver::new(vcpu.fd(), regs);
    observer.sampler = sampler;
    let found = (observer.log(), observer.schema());
    vcpu.set_observer(Box::new(observer));
    found
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::bench::console::LineCapture;
    use crate::bench::guest;
    use crate::bench::ports::ExitPort;
    use vmm::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
    use vmm::bus::{BusDevice, DeviceEvent};
    use vmm::config::IrqchipMode;
    use vmm::device_manager::BusKind;
    use vmm::devices::serial::SerialOutput;
    use vmm::kvm;

    /// Values the guest wrote to it, each emitted as an event to observe.
    #[derive(Default)]
    struct ObservePort(Mutex<Vec<u32>>);

    impl BusDevice for ObservePort {
        fn read(&self, _offset: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
            let value = u32::from(data[0]);
            self.0.lock().unwrap().push(value);
            Ok(DeviceEvent::Observe(value))
        }
    }

    /// Keeps `(value, user exits so far)` of each observed exit and counts every exit.
    #[derive(Clone, Default)]
    struct Recording {
        seen: Arc<Mutex<Vec<(u32, u64)>>>,
        every: Arc<AtomicU64>,
    }

    impl ExitObserver for Recording {
        fn observe(&mut self, value: u32, vcpu: &ObservedVcpu<'_>) {
            self.seen.lock().unwrap().push((value, vcpu.user_exits));
        }
        fn wants_every_exit(&self) -> bool {
            true
        }
        fn every_exit(&mut self, _fd: &VcpuFd) -> Result<(), VcpuError> {
            self.every.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn an_observer_sees_only_the_exits_devices_ask_for_and_hooks_every_exit() {
        const ITERS: u64 = 50;
        if std::fs::metadata("/dev/kvm").is_err() {
            vmm::test_skip::skip("observer_hook", "/dev/kvm is missing on this host");
            return;
        }
        let spec = VmSpec {
            kernel: KernelImage::Embedded(guest::BENCH_GUEST),
            initrd: None,
            cmdline: format!("case=pio_out iters={ITERS}"),
            memory: 64 << 20,
            memory_backing: vmm::memory::Backing::default(),
            cpus: 1,
            max_cpus: 1,
            irqchip: IrqchipMode::Kernel,
        };
        let mut builder = VmBuilder::new(kvm::open().unwrap(), spec).unwrap();
        let console = LineCapture::default();
        builder
            .add_console(SerialOutput::new(Box::new(console.clone())))
            .unwrap();
        let port = Arc::new(ObservePort::default());
        let devices = builder.devices();
        let exit = Arc::new(ExitPort);
        devices
            .add(BusKind::Pio, "exit", guest::EXIT_PORT, 4, exit)
            .unwrap();
        devices
            .add(BusKind::Pio, "observe", guest::MARKER_PORT, 4, port.clone())
            .unwrap();
        let opts = VcpuOptions {
            log_unmapped: false,
            ..VcpuOptions::default()
        };
        let mut built = builder.build(&opts).unwrap();
        let recording = Recording::default();
        built.vcpus[0].set_observer(Box::new(recording.clone()));
        let running = built.vm.start(built.vcpus).unwrap();
        running.wait(Some(Duration::from_secs(60))).unwrap();
        let lines = console.take_lines().join("\n");
        let seen = recording.seen.lock().unwrap().clone();
        let emitted = port.0.lock().unwrap().clone();
        let values: Vec<u32> = seen.iter().map(|s| s.0).collect();
        assert_eq!(values, emitted, "{lines}");
        let (begin, end) = (guest::MARKER_BEGIN, guest::MARKER_END);
        assert_eq!(emitted, [begin, end], "{lines}");
        // The loop's exits (one per iteration, to an unclaimed port) were not shown to it.
        assert_eq!(seen[1].1 - seen[0].1, ITERS + 1, "{seen:?}");
        let exits = built.profiles[0].snapshot().exit_count();
        assert_eq!(recording.every.load(Ordering::Relaxed), exits);
        assert!(exits > ITERS + 2, "{exits} exits");
    }
}
