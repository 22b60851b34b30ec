//! The IPI and TLB shootdown family: one VM of 1, 2, 4 ... N vCPUs per point, vCPU 0 sending
//! IPIs through the x2APIC ICR of the in-kernel LAPIC (to one vCPU, to all), or shooting down
//! a mapping as a guest kernel does (PTE change, local invlpg, an IPI to every vCPU that may
//! cache it, wait for every acknowledgement), plainly, with KVM's PV send-IPI hypercall and with
//! KVM's PV TLB flush (no IPI to a vCPU KVM says is preempted). Each point runs with the vCPUs
//! pinned to a few host CPUs and again left to float, and with more vCPUs than host CPUs.
//!
//! Every point is checked: each target acknowledged every operation (or was flushed by KVM),
//! no handler read the old mapping after its invlpg, every vCPU marked the measured span.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use super::console::LineCapture;
use super::guest;
use super::host::{self, HostInfo};
use super::observer::{self, Marker, MarkerLog, RegsMode};
use super::result::{parse_line, GuestLine, GuestResult, ParseError};
use super::runner::add_bench_ports;
use vmm::builder::{BuildError, KernelImage, VcpuOptions, VmBuilder, VmSpec};
use vmm::config::IrqchipMode;
use vmm::kvm::{self, KvmError, StatsSchema};
use vmm::vcpu::affinity;
use vmm::vm::VmError;

/// Value of the `"schema"` key of the IPI family's JSON document.
pub const IPI_SCHEMA: &str = "exitless.ipi/1";
/// The most vCPUs a point may have (the guest has stacks for 16 CPUs; 8 keeps runs short).
pub const MAX_VCPUS: usize = 8;
/// Operations per point unless told otherwise (guest CPL0 is emulated on PVM: keep it small).
pub const DEFAULT_ITERATIONS: u64 = 200;
/// Overcommit bound: at most this many vCPUs per host CPU.
const VCPUS_PER_HOST_CPU: usize = 4;
const GUEST_MEMORY: u64 = 64 << 20;

/// One kind of operation the family measures.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IpiCase {
    /// The guest case (bench-guest/ipi.c) and the family's name for it.
    pub name: &'static str,
    pub what: &'static str,
    /// What one operation is ("IPI" or "shootdown").
    pub op: &'static str,
}

/// The family's operations, in the order they run.
pub const IPI_CASES: &[IpiCase] = &[
    IpiCase {
        name: "ipi_unicast",
        what: "fixed IPI from vCPU 0 to vCPU 1 (to itself when alone) through the x2APIC ICR; the handler EOIs and acknowledges",
        op: "IPI",
    },
    IpiCase {
        name: "ipi_broadcast",
        what: "fixed IPI to all but self (ICR shorthand), waiting for every vCPU's acknowledgement",
        op: "IPI",
    },
    IpiCase {
        name: "tlb_shootdown",
        what: "PTE change, local invlpg, one x2APIC IPI per other vCPU, each invlpg and acknowledges",
        op: "shootdown",
    },
    IpiCase {
        name: "tlb_shootdown_pv_ipi",
        what: "the shootdown with one KVM_HC_SEND_IPI hypercall (a bitmap of targets) instead of one ICR write per target",
        op: "shootdown",
    },
    IpiCase {
        name: "tlb_shootdown_pv_flush",
        what: "the shootdown with KVM's PV TLB flush: a vCPU whose steal-time area says preempted gets KVM_VCPU_FLUSH_TLB instead of an IPI",
        op: "shootdown",
    },
];

/// Errors of the IPI family.
#[derive(Debug, Error)]
pub enum IpiError {
    #[error("Unknown IPI case '{0}'; cases are: {1}")]
    UnknownCase(String, String),
    #[error("The vCPU count must be between 1 and {0}, got {1}")]
    Vcpus(usize, usize),
    #[error("Cannot read the host CPUs this process may use: {0}")]
    Affinity(std::io::Error),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("The guest reported: {0}")]
    Guest(String),
    #[error("The guest printed no result (output: {0:?})")]
    NoResult(String),
    #[error("vCPU {0} did not mark the measured span")]
    NoMarkers(usize),
}

/// How the vCPUs of a point are placed on host CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// vCPU i on host CPU `pinned_cpus[i % len]`.
    Pinned,
    /// Left to the host scheduler.
    Floating,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Pinned => "pinned",
            Placement::Floating => "floating",
        }
    }
}

/// A point measured: one case on `vcpus` vCPUs, placed as said.
#[derive(Debug, Clone, Serialize)]
pub struct IpiPoint {
    pub case: &'static str,
    pub vcpus: usize,
    pub placement: Placement,
    pub iterations: u64,
    /// vCPUs each operation interrupts (or asks KVM to flush).
    pub targets: u64,
    /// Guest TSC cycles per operation on vCPU 0, empty loop subtracted.
    pub cycles_per_op: f64,
    /// Host time per operation between vCPU 0's begin and end markers.
    pub wall_ns_per_op: f64,
    /// Per vCPU: interrupts its handler acknowledged in the loop.
    pub acks: Vec<u64>,
    /// Per vCPU: operations it got no IPI for, KVM flushing it instead (PV TLB flush).
    pub skips: Vec<u64>,
    /// Handler reads through the flushed address that still saw the old page.
    pub stale: u64,
    /// Exits of all vCPUs over the loop per operation, by KVM statistic (non-zero ones).
    pub exits_per_op: BTreeMap<String, f64>,
    /// Exits to the VMM (userspace) of all vCPUs per operation (markers excluded).
    pub user_exits_per_op: f64,
    /// Per vCPU: the host CPUs its thread was seen on at its userspace exits.
    pub host_cpus: Vec<Vec<usize>>,
    /// Where the point broke the family's checks; non-empty means an error.
    pub problems: Vec<String>,
    /// What this host did that a VT-x/SVM host would not, or that explains a figure.
    pub observations: Vec<String>,
}

/// A point this host cannot run, with why.
#[derive(Debug, Clone, Serialize)]
pub struct IpiSkip {
    pub case: &'static str,
    pub vcpus: usize,
    pub placement: Placement,
    pub reason: String,
}

/// A point that failed.
#[derive(Debug, Clone, Serialize)]
pub struct IpiFailure {
    pub case: &'static str,
    pub vcpus: usize,
    pub placement: Placement,
    pub error: String,
}

/// Everything `exitless bench --ipi` found.
#[derive(Debug, Clone, Serialize)]
pub struct IpiReport {
    pub schema: &'static str,
    pub host: HostInfo,
    pub iterations: u64,
    pub vcpu_counts: Vec<usize>,
    /// Host CPUs pinned vCPUs are spread over.
    pub pinned_cpus: Vec<usize>,
    /// What the guest saw: x2APIC, KVM's leaves and PV features (its `EXITLESS IPI` line).
    pub guest_probe: Option<String>,
    pub wall_seconds: f64,
    pub points: Vec<IpiPoint>,
    pub skipped: Vec<IpiSkip>,
    pub failures: Vec<IpiFailure>,
}

/// All case names, comma-separated.
pub fn case_names() -> String {
    IPI_CASES
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves case names (all when empty).
pub fn select(names: &[String]) -> Result<Vec<&'static IpiCase>, IpiError> {
    if names.is_empty() {
        return Ok(IPI_CASES.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            IPI_CASES
                .iter()
                .find(|c| c.name == n.trim())
                .ok_or_else(|| IpiError::UnknownCase(n.clone(), case_names()))
        })
        .collect()
}

/// The largest vCPU count this host allows: [`MAX_VCPUS`] or 4 per host CPU, the smaller.
pub fn max_vcpus(host_cpus: usize) -> usize {
    MAX_VCPUS.min(host_cpus.max(1) * VCPUS_PER_HOST_CPU)
}

/// The vCPU counts measured up to `max`: 1, 2, 4, 8 ... and `max` itself.
pub fn vcpu_counts(max: usize, host_cpus: usize) -> Result<Vec<usize>, IpiError> {
    let limit = max_vcpus(host_cpus);
    if !(1..=limit).contains(&max) {
        return Err(IpiError::Vcpus(limit, max));
    }
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |n| Some(n * 2))
        .take_while(|n| *n < max)
        .collect();
    counts.push(max);
    Ok(counts)
}

/// Host CPUs for pinned points: the first two this process may use (a small set, so that
/// vCPUs beyond two share them).
fn pinned_set(allowed: &[usize]) -> Vec<usize> {
    allowed.iter().copied().take(2).collect()
}

/// Runs `cases` at every count of `counts`, pinned then floating.
pub fn run_ipi(
    cases: &[&'static IpiCase],
    iterations: u64,
    counts: &[usize],
    mut progress: impl FnMut(&str),
) -> Result<IpiReport, IpiError> {
    let host = host::probe()?;
    let allowed = affinity::allowed_cpus().map_err(IpiError::Affinity)?;
    let pinned = pinned_set(&allowed);
    let start = Instant::now();
    let mut report = IpiReport {
        schema: IPI_SCHEMA,
        host,
        iterations,
        vcpu_counts: counts.to_vec(),
        pinned_cpus: pinned.clone(),
        guest_probe: None,
        wall_seconds: 0.0,
        points: Vec::new(),
        skipped: Vec::new(),
        failures: Vec::new(),
    };
    for case in cases {
        for placement in [Placement::Pinned, Placement::Floating] {
            for &vcpus in counts {
                let label = format!("{}/{vcpus} vCPUs/{}", case.name, placement.name());
                progress(&format!("{label} ..."));
                let cpus = (placement == Placement::Pinned).then_some(pinned.as_slice());
                let line = match run_point(case, vcpus, cpus, iterations) {
                    Ok((outcome, probe)) => {
                        report.guest_probe = report.guest_probe.take().or(probe);
                        record(&mut report, case, vcpus, placement, outcome)
                    }
                    Err(e) => {
                        report
                            .failures
                            .push(failure(case, vcpus, placement, e.to_string()));
                        format!("error: {e}")
                    }
                };
                progress(&format!("{label}: {line}"));
            }
        }
    }
    report.wall_seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

fn failure(case: &IpiCase, vcpus: usize, placement: Placement, error: String) -> IpiFailure {
    IpiFailure {
        case: case.name,
        vcpus,
        placement,
        error,
    }
}

/// Files a point's outcome; returns what to say about it.
fn record(
    report: &mut IpiReport,
    case: &'static IpiCase,
    vcpus: usize,
    placement: Placement,
    outcome: PointOutcome,
) -> String {
    match outcome {
        PointOutcome::Skipped(reason) => {
            let line = format!("skipped: {reason}");
            report.skipped.push(IpiSkip {
                case: case.name,
                vcpus,
                placement,
                reason,
            });
            line
        }
        PointOutcome::Measured(mut point) => {
            point.placement = placement;
            let line = format!(
                "{:.0} ns per {} ({:.0} guest cycles)",
                point.wall_ns_per_op, case.op, point.cycles_per_op
            );
            if point.problems.is_empty() {
                report.points.push(*point);
                line
            } else {
                let error = point.problems.join("; ");
                report
                    .failures
                    .push(failure(case, vcpus, placement, error.clone()));
                format!("error: {error}")
            }
        }
    }
}

/// What one point's VM gave.
#[derive(Debug)]
pub enum PointOutcome {
    Measured(Box<IpiPoint>),
    /// The guest or this VMM found the operation unavailable here, with why.
    Skipped(String),
}

/// Runs `case` once on `vcpus` vCPUs (vCPU i pinned to `cpus[i % len]` when given); returns
/// the outcome and the guest's probe line.
pub fn run_point(
    case: &'static IpiCase,
    vcpus: usize,
    cpus: Option<&[usize]>,
    iterations: u64,
) -> Result<(PointOutcome, Option<String>), IpiError> {
    let n = u8::try_from(vcpus).map_err(|_| IpiError::Vcpus(MAX_VCPUS, vcpus))?;
    let spec = VmSpec {
        kernel: KernelImage::Embedded(guest::BENCH_GUEST),
        initrd: None,
        cmdline: format!("case={} iters={iterations} smp={vcpus}", case.name),
        memory: GUEST_MEMORY,
        memory_backing: vmm::memory::Backing::default(),
        cpus: n,
        max_cpus: n,
        irqchip: IrqchipMode::Kernel,
    };
    let mut builder = VmBuilder::new(kvm::open()?, spec)?;
    if case.name == "tlb_shootdown_pv_ipi" && !builder.hypercall_rewrite_off() {
        let why = "KVM cannot disable KVM_X86_QUIRK_FIX_HYPERCALL_INSN: a hypercall could livelock";
        return Ok((PointOutcome::Skipped(why.into()), None));
    }
    let serial = LineCapture::default();
    add_bench_ports(&mut builder, &serial).map_err(|e| IpiError::Guest(e.to_string()))?;
    let opts = VcpuOptions {
        log_unmapped: false,
        ..VcpuOptions::default()
    };
    let mut built = builder.build(&opts)?;
    let (mut schema, mut logs) = (None, Vec::new());
    for (i, vcpu) in built.vcpus.iter_mut().enumerate() {
        if let Some(cpus) = cpus.filter(|c| !c.is_empty()) {
            vcpu.pin_to(cpus[i % cpus.len()]);
        }
        let (log, stats) = observer::observe(vcpu, RegsMode::SyncRegs);
        logs.push(log);
        schema = stats;
    }
    let timeout = Duration::from_secs(60) + Duration::from_millis(25 * iterations * vcpus as u64);
    let ran_on = run_sampled(built.vm.start(built.vcpus)?, vcpus, cpus, timeout)?;
    let output = serial.take_lines().join("\n");
    let probe = output
        .lines()
        .find_map(|l| l.strip_prefix("EXITLESS IPI "))
        .map(str::to_string);
    let outcome = match guest_result(&output, case.name)? {
        Err(reason) => PointOutcome::Skipped(reason),
        Ok(result) => {
            let run = GuestRun::parse(&output, result)?;
            let mut point = measure(case, &run, &logs, schema.as_ref(), built.tsc_khz)?;
            for (seen, sampled) in point.host_cpus.iter_mut().zip(ran_on) {
                seen.extend(sampled);
                seen.sort_unstable();
                seen.dedup();
            }
            check(&mut point, &run);
            observe(&mut point, &run);
            PointOutcome::Measured(Box::new(point))
        }
    };
    Ok((outcome, probe))
}

/// Waits for the VM's end (at most `timeout`), sampling the host CPU of each of its `vcpus`
/// vCPU threads meanwhile; returns the CPUs each was seen on. A thread to be
/// pinned (vCPU i to `pinned[i % len]`) is sampled only once it is: it starts where its parent
/// ran.
fn run_sampled(
    running: vmm::vm::RunningVm,
    vcpus: usize,
    pinned: Option<&[usize]>,
    timeout: Duration,
) -> Result<Vec<BTreeSet<usize>>, IpiError> {
    let mut ran_on = vec![BTreeSet::new(); vcpus];
    let mut threads: Vec<VcpuThread> = vcpu_threads()
        .into_iter()
        .filter(|t| t.id < vcpus)
        .map(|mut t| {
            t.settled = pinned.is_none_or(|c| c.is_empty());
            t
        })
        .collect();
    let started = Instant::now();
    while !running.is_done() && started.elapsed() < timeout {
        for t in &mut threads {
            if !t.settled {
                let want = pinned.map(|c| vec![c[t.id % c.len()]]);
                t.settled = affinity::allowed_cpus_of(t.tid).ok() == want;
            }
            if t.settled {
                ran_on[t.id].extend(processor(&t.stat));
            }
        }
        thread::sleep(SAMPLE_PERIOD);
    }
    running.wait(Some(timeout.saturating_sub(started.elapsed())))?;
    Ok(ran_on)
}

/// A vCPU thread of this process, as the sampler sees it.
struct VcpuThread {
    id: usize,
    tid: libc::pid_t,
    stat: PathBuf,
    /// Placed as it should be (pinned, when it is to be), so its samples count.
    settled: bool,
}

/// How often the host CPU of each vCPU thread is sampled while a point runs.
const SAMPLE_PERIOD: Duration = Duration::from_millis(1);

/// This process's vCPU threads (named `vcpuN`). The family runs one VM at a time, so they are
/// that VM's.
fn vcpu_threads() -> Vec<VcpuThread> {
    let Ok(dir) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let id = comm.trim().strip_prefix("vcpu")?.parse().ok()?;
            let tid = e.file_name().to_str()?.parse().ok()?;
            Some(VcpuThread {
                id,
                tid,
                stat: e.path().join("stat"),
                settled: false,
            })
        })
        .collect()
}

/// The host CPU a thread last ran on (field 39 of its `stat`).
fn processor(stat: &Path) -> Option<usize> {
    let text = fs::read_to_string(stat).ok()?;
    text.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(36)?
        .parse()
        .ok()
}

/// The case's result line, or (as Err) the reason it skipped.
fn guest_result(output: &str, name: &str) -> Result<Result<GuestResult, String>, IpiError> {
    for line in output.lines() {
        match parse_line(line)? {
            GuestLine::Result(r) if r.case == name => return Ok(Ok(r)),
            GuestLine::Skip { reason, .. } => return Ok(Err(reason)),
            GuestLine::Error(e) => return Err(IpiError::Guest(e)),
            _ => {}
        }
    }
    Err(IpiError::NoResult(output.chars().take(400).collect()))
}

/// The IPI fields of a result line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRun {
    pub result: GuestResult,
    pub cpus: usize,
    pub targets: u64,
    pub acks: Vec<u64>,
    pub skips: Vec<u64>,
    pub stale: u64,
    pub preempted_skips: u64,
    /// Sum of the steal-time areas' version fields (PV TLB flush only): 0 = KVM never wrote
    /// them.
    pub steal_version: Option<u64>,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

impl GuestRun {
    /// Reads the IPI fields of the result line for `result` in `output`.
    pub fn parse(output: &str, result: GuestResult) -> Result<GuestRun, IpiError> {
        let line = output
            .lines()
            .find(|l| l.starts_with("EXITLESS RESULT") && field(l, "case") == Some(&result.case))
            .unwrap_or("");
        let bad = |key: &'static str| ParseError::Missing(key, line.to_string());
        let number = |key: &'static str| -> Result<u64, ParseError> {
            field(line, key)
                .ok_or_else(|| bad(key))?
                .parse()
                .map_err(|_| ParseError::BadValue(key, line.to_string()))
        };
        let list = |key: &'static str| -> Result<Vec<u64>, ParseError> {
            field(line, key)
                .ok_or_else(|| bad(key))?
                .split(',')
                .map(|v| {
                    v.parse()
                        .map_err(|_| ParseError::BadValue(key, line.to_string()))
                })
                .collect()
        };
        Ok(GuestRun {
            cpus: number("cpus")? as usize,
            targets: number("targets")?,
            acks: list("acks")?,
            skips: list("skips")?,
            stale: number("stale")?,
            preempted_skips: number("preempted_skips")?,
            steal_version: number("steal_version").ok(),
            result,
        })
    }

    /// The vCPUs each operation targets.
    fn is_target(&self, case: &str, vcpu: usize) -> bool {
        match case {
            "ipi_unicast" => vcpu == usize::from(self.cpus > 1),
            _ => vcpu > 0,
        }
    }
}

/// The first BEGIN marker and the first END after it, of vCPU `id`.
fn span(id: usize, markers: &[Marker]) -> Result<(&Marker, &Marker), IpiError> {
    let at = markers
        .iter()
        .position(|m| m.value == guest::MARKER_BEGIN)
        .ok_or(IpiError::NoMarkers(id))?;
    let end = markers[at..]
        .iter()
        .find(|m| m.value == guest::MARKER_END)
        .ok_or(IpiError::NoMarkers(id))?;
    Ok((&markers[at], end))
}

fn measure(
    case: &'static IpiCase,
    run: &GuestRun,
    // One per vCPU, by id.
    logs: &[MarkerLog],
    schema: Option<&StatsSchema>,
    tsc_khz: u64,
) -> Result<IpiPoint, IpiError> {
    let n = run.result.iters.max(1) as f64;
    let mut stats: Vec<(String, u64)> = Vec::new();
    let (mut user_exits, mut host_cpus, mut wall_cycles) = (0, Vec::new(), 0);
    for (id, log) in logs.iter().enumerate() {
        let markers = log.markers();
        let (begin, end) = span(id, &markers)?;
        if id == 0 {
            wall_cycles = end.host_tsc.saturating_sub(begin.host_tsc);
        }
        // The end marker's own exit is inside the span; the begin marker's is not.
        user_exits += end.user_exits.saturating_sub(begin.user_exits + 1);
        host_cpus.push(end.profile.host_cpus.clone());
        if let (Some(schema), Some(a), Some(b)) = (schema, &begin.kvm_stats, &end.kvm_stats) {
            for (name, v) in schema.deltas(a, b) {
                match stats.iter_mut().find(|(s, _)| *s == name) {
                    Some(entry) => entry.1 += v,
                    None => stats.push((name, v)),
                }
            }
        }
    }
    Ok(IpiPoint {
        case: case.name,
        vcpus: run.cpus,
        placement: Placement::Floating,
        iterations: run.result.iters,
        targets: run.targets,
        cycles_per_op: run.result.cycles_per_iter(),
        wall_ns_per_op: wall_cycles as f64 * 1e6 / tsc_khz.max(1) as f64 / n,
        acks: run.acks.clone(),
        skips: run.skips.clone(),
        stale: run.stale,
        exits_per_op: stats
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(name, v)| (name, v as f64 / n))
            .collect(),
        user_exits_per_op: user_exits as f64 / n,
        host_cpus,
        problems: Vec::new(),
        observations: Vec::new(),
    })
}

/// The family's structural checks: every target acknowledged (or was flushed by KVM) every
/// operation, no other vCPU was interrupted, no handler saw the old page.
pub fn check(point: &mut IpiPoint, run: &GuestRun) {
    let n = run.result.iters;
    if run.acks.len() != run.cpus || run.skips.len() != run.cpus {
        point.problems.push(format!(
            "{} vCPUs, but {} ack and {} skip counts",
            run.cpus,
            run.acks.len(),
            run.skips.len()
        ));
        return;
    }
    for (vcpu, (acks, skips)) in run.acks.iter().zip(&run.skips).enumerate() {
        let want = if run.is_target(point.case, vcpu) {
            n
        } else {
            0
        };
        if acks + skips != want {
            point.problems.push(format!(
                "vCPU {vcpu} acknowledged {acks} and was flushed by KVM {skips} times, for {want} operations"
            ));
        }
    }
    if run.skips.iter().sum::<u64>() != run.preempted_skips {
        point.problems.push(format!(
            "{} preempted skips counted, {} by vCPU",
            run.preempted_skips,
            run.skips.iter().sum::<u64>()
        ));
    }
    if run.stale != 0 {
        point.problems.push(format!(
            "{} handler reads saw the old page after invlpg",
            run.stale
        ));
    }
}

pub(super) fn stat_per_op(point: &IpiPoint, name: &str) -> f64 {
    point.exits_per_op.get(name).copied().unwrap_or(0.0)
}

/// Notes on what explains a point's figures on this host.
fn observe(point: &mut IpiPoint, run: &GuestRun) {
    let (other, reported) = (
        stat_per_op(point, "preemption_other"),
        stat_per_op(point, "preemption_reported"),
    );
    if point.case == "tlb_shootdown_pv_flush" && run.preempted_skips == 0 && point.vcpus > 1 {
        let why = match run.steal_version {
            Some(0) => "KVM never wrote the steal-time areas".to_string(),
            _ if other > 0.0 && reported == 0.0 => format!(
                "KVM saw vCPUs preempted {other:.2} times per shootdown but flagged none in \
                 steal time (its preemption_other stat: preempted away from an instruction \
                 boundary, which KVM does not report)"
            ),
            _ => format!("no target was flagged preempted ({reported:.2} reported per shootdown)"),
        };
        point.observations.push(format!(
            "the PV TLB flush skipped no IPI: {why}; the figure is the plain shootdown's"
        ));
    }
}

#[cfg(test)]
#[path = "ipi_tests.rs"]
mod tests;
