//! Running one case configuration: a fresh VM set up as the configuration says, the bench
//! guest told which loop to run, and the run checked against the configuration's design.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use kvm_ioctls::IoEventAddress;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::cases::{BenchCase, CaseConfig, Expect, Target};
use super::config_run::{ConfigRun, RunError};
use super::console::LineCapture;
use super::guest;
use super::observer::{self, Marker};
use super::ports::{ExitPort, MarkerPort};
use super::result::{parse_line, GuestLine, GuestResult};
use super::threads::{self, ThreadSampler};
use super::virtio::{self, AttachedVirtio};
use vmm::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
use vmm::device_manager::{BusKind, DeviceManager};
use vmm::devices::serial::SerialOutput;
use vmm::kvm::{self, IoEvent};
use vmm::vcpu::Vcpu;
use vmm::vm::Vm;

const GUEST_MEMORY: u64 = 64 << 20;

struct Prepared {
    io_devices: Vec<String>,
    vm: Vm,
    vcpu: Vcpu,
    serial: LineCapture,
    ioeventfd: Option<EventFd>,
    /// Serves the virtio queues while the VM runs. Dropped (stopped) before the devices' host
    /// sides: a vhost-user back end that ends is then nothing the loop reports.
    _event_loop: vmm::event_loop::EventLoop,
    virtio: Option<AttachedVirtio>,
    /// Samples every thread at the markers (a vhost-user back end's configurations).
    sampler: Option<ThreadSampler>,
}

/// The bench guest's own ports: COM1 (captured, not printed), the exit port and the marker
/// port, added like any device.
pub(super) fn add_bench_ports(
    builder: &mut VmBuilder,
    serial: &LineCapture,
) -> Result<(), RunError> {
    builder.add_console(SerialOutput::new(Box::new(serial.clone())))?;
    let devices = builder.devices();
    devices.add(
        BusKind::Pio,
        "exit-port",
        guest::EXIT_PORT,
        4,
        Arc::new(ExitPort),
    )?;
    devices.add(
        BusKind::Pio,
        "marker",
        guest::MARKER_PORT,
        4,
        Arc::new(MarkerPort),
    )?;
    Ok(())
}

fn prepare(config: &CaseConfig, iterations: u64) -> Result<Prepared, RunError> {
    let spec = VmSpec {
        kernel: KernelImage::Embedded(guest::BENCH_GUEST),
        initrd: None,
        cmdline: format!(
            "case={} iters={iterations}{}",
            config.guest_case,
            config
                .virtio
                .as_ref()
                .map(virtio::guest_args)
                .unwrap_or_default()
        ),
        memory: GUEST_MEMORY,
        memory_backing: vmm::memory::Backing {
            shared: config.virtio.is_some_and(|v| v.shares_memory()),
            ..vmm::memory::Backing::default()
        },
        cpus: 1,
        max_cpus: 1,
        irqchip: config.irqchip,
    };
    let mut builder = VmBuilder::new(kvm::open()?, spec)?;
    if config.guest_case == "hypercall" && !builder.hypercall_rewrite_off() {
        return Err(RunError::Unsupported(
            "KVM cannot disable KVM_X86_QUIRK_FIX_HYPERCALL_INSN; the hypercall loop could livelock",
        ));
    }
    let serial = LineCapture::default();
    add_bench_ports(&mut builder, &serial)?;
    let ioeventfd = setup_target(builder.devices(), config.target)?;
    let virtio = match config.virtio {
        Some(setup) => Some(virtio::attach(&mut builder, setup)?),
        None => None,
    };
    let sampler = match virtio.as_ref().and_then(AttachedVirtio::backend_pid) {
        Some(pid) => Some(ThreadSampler::start(Some(pid)).map_err(RunError::Sampler)?),
        None => None,
    };
    let opts = VcpuOptions {
        regs: config.regs.core(),
        profiling: config.profiling,
        profile_sample: vmm::profile::sample(),
        log_unmapped: false,
        affinity: None,
    };
    let built = builder.build(&opts)?;
    let vcpu = built.vcpus.into_iter().next().ok_or(RunError::NoMarkers)?;
    Ok(Prepared {
        io_devices: built.io_names,
        vm: built.vm,
        vcpu,
        serial,
        ioeventfd,
        virtio,
        sampler,
        _event_loop: built.event_loop,
    })
}

fn setup_target(devices: &mut DeviceManager, target: Target) -> Result<Option<EventFd>, RunError> {
    match target {
        Target::Unclaimed => Ok(None),
        Target::Ioeventfd {
            pio,
            len,
            datamatch,
        } => {
            let evt = EventFd::new(EFD_NONBLOCK).map_err(RunError::EventFd)?;
            let addr = if pio {
                guest::BENCH_PORT
            } else {
                guest::BENCH_MMIO
            };
            let datamatch = datamatch.then_some(u64::from(guest::BENCH_MAGIC));
            let event = IoEvent {
                pio,
                addr,
                len,
                datamatch,
            };
            devices.register_ioeventfd(&evt, &event)?;
            Ok(Some(evt))
        }
        Target::Coalesced { pio } => {
            let addr = if pio {
                IoEventAddress::Pio(guest::BENCH_PORT)
            } else {
                IoEventAddress::Mmio(guest::BENCH_MMIO)
            };
            devices.register_coalesced(addr, 4)?;
            Ok(None)
        }
    }
}

fn guest_result(output: &str, guest_case: &str) -> Result<GuestResult, RunError> {
    for line in output.lines() {
        match parse_line(line)? {
            GuestLine::Result(r) if r.case == guest_case => return Ok(r),
            GuestLine::Error(e) => return Err(RunError::GuestError(e)),
            GuestLine::Skip { reason, .. } => return Err(RunError::Skipped(reason)),
            _ => {}
        }
    }
    Err(RunError::NoResult(output.chars().take(400).collect()))
}

/// Where and when a configuration's VM runs: alone and unpinned by default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    /// The host CPU its vCPU thread is pinned to.
    pub cpu: Option<usize>,
    /// VMs run together wait here once set up, so that their loops overlap. Every VM waits,
    /// including one whose set-up failed, so the others are never left waiting.
    pub start_together: Option<&'a Barrier>,
}

/// Runs `config` of `case` for `iterations` loop iterations, alone.
pub fn run_config(
    case: &'static BenchCase,
    config: &CaseConfig,
    iterations: u64,
    tsc_khz: u64,
) -> Result<ConfigRun, RunError> {
    run_config_placed(case, config, iterations, tsc_khz, Placement::default())
}

/// Runs `config` of `case` as [`run_config`] does, placed as `placement` says.
pub fn run_config_placed(
    case: &'static BenchCase,
    config: &CaseConfig,
    iterations: u64,
    tsc_khz: u64,
    placement: Placement<'_>,
) -> Result<ConfigRun, RunError> {
    let prepared = prepare(config, iterations);
    if let Some(barrier) = placement.start_together {
        barrier.wait();
    }
    let mut p = prepared?;
    if let Some(cpu) = placement.cpu {
        p.vcpu.pin_to(cpu);
    }
    let (markers, schema) = observer::observe_sampled(&mut p.vcpu, config.regs, p.sampler.take());
    let io_devices = p.io_devices.clone();
    let timeout = Duration::from_secs(20) + Duration::from_micros(500) * iterations as u32;
    p.vm.start(vec![p.vcpu])?.wait(Some(timeout))?;
    let output = p.serial.take_lines().join("\n");
    let result = guest_result(&output, config.guest_case)?;
    let markers = markers.markers();
    let (begin, end) = loop_markers(&markers)?;
    let signals = p.ioeventfd.as_ref().map(|e| e.read().unwrap_or(0));
    let mut run = measure(case, config, &result, begin, end, tsc_khz);
    run.ioeventfd_signals = signals;
    run.threads = begin
        .threads
        .as_ref()
        .zip(end.threads.as_ref())
        .map(|(a, b)| threads::between(a, b));
    run.guest_output = output;
    run.io_devices = io_devices;
    if let (Some(schema), Some(a), Some(b)) = (schema, &begin.kvm_stats, &end.kvm_stats) {
        let deltas = schema.deltas(a, b);
        let exits = deltas.iter().find(|(n, _)| n == "exits").map(|(_, v)| *v);
        run.kernel_exits = exits.map(|e| e.saturating_sub(run.user_exits + 1));
        run.kvm_stats = deltas.into_iter().filter(|(_, v)| *v != 0).collect();
    }
    check(&mut run, config);
    if let Some(v) = &p.virtio {
        virtio::finish(&mut run, v, &result);
    }
    Ok(run)
}

/// The first BEGIN marker and the first END after it (a guest may mark in any order; an END
/// without an earlier BEGIN brackets nothing).
fn loop_markers(markers: &[Marker]) -> Result<(&Marker, &Marker), RunError> {
    let at = markers
        .iter()
        .position(|m| m.value == guest::MARKER_BEGIN)
        .ok_or(RunError::NoMarkers)?;
    let begin = &markers[at];
    let end = markers[at..].iter().find(|m| m.value == guest::MARKER_END);
    Ok((begin, end.ok_or(RunError::NoMarkers)?))
}

fn measure(
    case: &'static BenchCase,
    config: &CaseConfig,
    r: &GuestResult,
    begin: &Marker,
    end: &Marker,
    tsc_khz: u64,
) -> ConfigRun {
    let profile = end.profile.delta(&begin.profile);
    // The end marker's own exit is inside the window; the begin marker's is not.
    let user_exits = end
        .user_exits
        .saturating_sub(begin.user_exits)
        .saturating_sub(1);
    let cycles = r.cycles_per_iter();
    let vmm = (user_exits > 0 && profile.exit_count() > 0)
        .then(|| profile.userspace_cycles() as f64 / profile.exit_count() as f64);
    ConfigRun {
        case: case.name,
        config: *config,
        cpl: r.cpl,
        iterations: r.iters,
        cycles_per_iter: cycles,
        ns_per_iter: cycles * 1e6 / tsc_khz.max(1) as f64,
        user_exits,
        loop_host_tsc: (begin.host_tsc, end.host_tsc),
        kernel_exits: None,
        kvm_stats: Vec::new(),
        ioeventfd_signals: None,
        vmm_cycles_per_exit: vmm,
        ipis: r.ipis,
        uds: r.uds,
        profile,
        io_devices: Vec::new(),
        guest_output: String::new(),
        virtio: None,
        threads: None,
        problems: Vec::new(),
        observations: Vec::new(),
    }
}

fn stat(run: &ConfigRun, name: &str) -> u64 {
    run.kvm_stats
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| *v)
}

/// Every write the loop made must have reached its target: the bus, through the coalesced ring
/// or an exit, or the ioeventfd.
fn check_deliveries(run: &mut ConfigRun, config: &CaseConfig) {
    let (n, u) = (run.iterations, run.user_exits);
    if matches!(config.target, Target::Coalesced { .. }) && config.profiling {
        // A write that finds the ring full exits to userspace as a plain write instead.
        let queued = run.profile.coalesced_writes();
        if queued + u != n {
            run.problems.push(format!(
                "{n} writes, but {queued} reached the bus through the ring and {u} by exits"
            ));
        }
    }
    if let Some(s) = run.ioeventfd_signals {
        if s != n {
            run.problems
                .push(format!("ioeventfd signalled {s} times for {n} writes"));
        }
    }
}

/// Compares a run with its configuration's design.
pub fn check(run: &mut ConfigRun, config: &CaseConfig) {
    let n = run.iterations;
    let u = run.user_exits;
    match config.expect {
        Expect::OnePerIteration if u != n => run.problems.push(format!(
            "expected {n} userspace exits (one per iteration), counted {u}"
        )),
        Expect::None if u != 0 => run
            .problems
            .push(format!("expected no userspace exits, counted {u}")),
        Expect::AtMost(f) if u as f64 > f * n as f64 => run.problems.push(format!(
            "expected at most {:.0} userspace exits, counted {u}",
            f * n as f64
        )),
        Expect::Observe => {
            if let Some(note) = config.textbook {
                run.observations.push(format!(
                    "observed {u} userspace exits for {n} iterations; textbook: {note}"
                ));
            }
        }
        _ => {}
    }
    check_deliveries(run, config);
    if config.expect_ipis && run.ipis != n {
        run.problems.push(format!(
            "guest handled {} IPIs for {n} iterations",
            run.ipis
        ));
    }
    if run.uds > 0 {
        let failed = stat(run, "insn_emulation_fail");
        run.observations.push(format!(
            "{} of {n} hypercalls raised #UD in the guest (KVM insn_emulation_fail +{failed}): \
             this host's emulator does not hand vmcall to KVM's hypercall handler, so the figure \
             is #UD delivery and return, not a hypercall",
            run.uds
        ));
    }
    if config.expect_ipis && run.ns_per_iter > 100_000.0 {
        run.observations.push(format!(
            "each self-IPI took {:.0} us to reach the guest: a pending interrupt is injected only \
             when KVM next enters the guest, which a CPL0 guest spinning in the emulator delays \
             (compare hlt/in-kernel-lapic, where hlt lets KVM inject at once)",
            run.ns_per_iter / 1000.0
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cases::CASES;
    use crate::bench::report::tests::run;

    fn marker(value: u32, user_exits: u64) -> Marker {
        Marker {
            value,
            host_tsc: 0,
            user_exits,
            profile: vmm::profile::VcpuProfile::new(0, 1, 0).snapshot(),
            kvm_stats: None,
            threads: None,
        }
    }

    #[test]
    fn markers_out_of_order_bracket_nothing_and_never_panic() {
        let outcome = |values: &[(u32, u64)]| -> Vec<Marker> {
            values.iter().map(|&(v, n)| marker(v, n)).collect()
        };
        let o = outcome(&[(guest::MARKER_END, 5), (guest::MARKER_BEGIN, 9)]);
        assert!(matches!(loop_markers(&o), Err(RunError::NoMarkers)));
        let o = outcome(&[
            (guest::MARKER_END, 1),
            (guest::MARKER_BEGIN, 9),
            (guest::MARKER_END, 20),
        ]);
        let (b, e) = loop_markers(&o).unwrap();
        assert_eq!((b.user_exits, e.user_exits), (9, 20));
        assert!(matches!(
            loop_markers(&outcome(&[])),
            Err(RunError::NoMarkers)
        ));
    }

    #[test]
    fn coalesced_writes_that_never_reach_the_bus_are_a_problem() {
        let case = CASES.iter().position(|c| c.name == "mmio_write").unwrap();
        let cfg = CASES[case]
            .configs
            .iter()
            .position(|c| c.name == "coalesced-mmio")
            .unwrap();
        let profile = vmm::profile::VcpuProfile::new(0, 1, 0);
        let mut r = run(case, cfg, 3000.0, 1);
        r.profile = profile.snapshot();
        check(&mut r, &CASES[case].configs[cfg]);
        let lost = "100 writes, but 0 reached the bus through the ring and 1 by exits";
        assert_eq!(r.problems, [lost]);
        (0..99).for_each(|_| profile.record_coalesced(false, None));
        let mut r = run(case, cfg, 3000.0, 1);
        r.profile = profile.snapshot();
        check(&mut r, &CASES[case].configs[cfg]);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }
}
