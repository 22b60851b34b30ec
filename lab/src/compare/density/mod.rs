//! `exitless compare --density N[,N...]`: what a host pays for many VMs of each VMM at once.
//! For each N and each VMM, N VMs are started at once (exitless and Cloud Hypervisor through
//! their API, as Kata Containers starts one VMM per pod; the others from their command line),
//! each booting the bench guest's `case=idle` (its first line, then halted for good), and the
//! run measures: the time until all N printed their first line, each VM's own start (spawn to
//! first line) and the CPU it cost (its process's CPU clock, all threads, at the first line), memory (private dirty, peak RSS, Pss) once all are idle, the host CPU and the
//! wake-ups (context switches) of each idle VM over a window, and the N-th VM against the
//! first. Each VMM's binary is read from disk once before (its page cache dropped, one VM
//! started unmeasured). Every process is killed at the end of its run, whatever happened.

pub mod start;
pub mod threads;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::peer::Vmm;
use super::process::{drop_page_cache, memory_of, Memory};
use super::{CompareError, Spread};
use start::Event;

/// What a VM may need beyond its guest memory (QEMU's process is ~45 MB), for the memory
/// check before a run.
const PER_VM_OVERHEAD_KIB: u64 = 64 << 10;
/// Between the last VM going idle and the idle window (halt polling, API connections ending).
const SETTLE: Duration = Duration::from_millis(500);
/// How often a waiting run looks at the stop signal.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// What to run.
#[derive(Clone, Debug)]
pub struct DensityPlan {
    pub vmms: Vec<Vmm>,
    /// The numbers of VMs started at once.
    pub counts: Vec<usize>,
    pub memory_mib: u64,
    /// How long the idle VMs are watched.
    pub idle: Duration,
    /// Longest all N may take to be up and idle.
    pub limit: Duration,
    pub guest: PathBuf,
    pub workdir: PathBuf,
}

/// Every run of a density comparison.
#[derive(Clone, Debug, Serialize)]
pub struct DensityReport {
    pub schema: &'static str,
    pub memory_mib: u64,
    pub idle_s: f64,
    pub counts: Vec<usize>,
    /// The host's MemAvailable when the comparison began, kB.
    pub mem_available_kib: u64,
    /// Counts not run, each with why (memory).
    pub not_run: Vec<String>,
    pub runs: Vec<DensityRun>,
}

/// N VMs of one VMM.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DensityRun {
    pub vmm: &'static str,
    pub n: usize,
    /// "api" (spawned with --api-socket, vmm.ping, vm.create, vm.boot) or "command line".
    pub started_through: &'static str,
    pub failed: Option<String>,
    /// From the first spawn to the last VM's first console line, ms.
    pub all_started_ms: f64,
    /// Per VM in spawn order: from its own spawn to its first console line, ms.
    pub start_ms: Vec<f64>,
    /// Per VM in spawn order: the CPU its VMM's process used from its spawn to its first
    /// console line, all threads summed (those that ended too), ms.
    pub start_cpu_ms: Vec<f64>,
    /// Per VM in spawn order, sampled once all were idle, kB.
    pub private_dirty_kib: Vec<u64>,
    pub peak_rss_kib: Vec<u64>,
    pub pss_kib: Vec<u64>,
    /// Per idle VM: on-CPU time of all its VMM's threads, µs per second.
    pub idle_cpu_us_per_s: Vec<f64>,
    /// Per idle VM: context switches of its VMM's own threads per second (each a wake-up
    /// or a preemption).
    pub idle_wakeups_per_s: Vec<f64>,
    /// The same summed over the VMs, by thread name (digits dropped).
    pub wakeups_per_s_by_thread: BTreeMap<String, f64>,
    /// Context switches per second of the kernel threads in the VMs' thread groups (KVM's),
    /// summed over the VMs.
    pub kernel_thread_wakeups_per_s: f64,
    /// The host's MemAvailable drop from before the first spawn to all idle, per VM, kB (the
    /// whole host: other work on it shows too).
    pub host_kib_per_vm: f64,
    pub summary: Summary,
}

/// Medians and spreads of a run's per-VM figures, and the N-th VM against the first.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub start_ms: Spread,
    pub start_cpu_ms: Spread,
    pub private_dirty_kib: Spread,
    pub peak_rss_kib: Spread,
    pub pss_kib: Spread,
    pub idle_cpu_us_per_s: Spread,
    pub idle_wakeups_per_s: Spread,
    /// The last VM spawned over the first, per figure.
    pub nth_over_first: NthOverFirst,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct NthOverFirst {
    pub start: Option<f64>,
    pub private_dirty: Option<f64>,
    pub peak_rss: Option<f64>,
    pub pss: Option<f64>,
}

/// Runs the plan; `progress` hears each step, `stop` is asked while waiting (a signal).
pub fn run(
    plan: &DensityPlan,
    mut progress: impl FnMut(&str),
    stop: impl Fn() -> bool,
) -> Result<DensityReport, CompareError> {
    let mut report = DensityReport {
        schema: "exitless.density/1",
        memory_mib: plan.memory_mib,
        idle_s: plan.idle.as_secs_f64(),
        counts: plan.counts.clone(),
        mem_available_kib: mem_available_kib(),
        not_run: Vec::new(),
        runs: Vec::new(),
    };
    for vmm in &plan.vmms {
        if let Err(e) = drop_page_cache(&vmm.path) {
            progress(&format!("{}: page cache as found: {e}", vmm.kind.name()));
        }
        warm_up(plan, vmm, &stop);
    }
    for &n in &plan.counts {
        if let Some(why) = too_big(n, plan.memory_mib, mem_available_kib()) {
            progress(&format!("density N={n} not run: {why}"));
            report.not_run.push(format!("N={n}: {why}"));
            continue;
        }
        for vmm in &plan.vmms {
            if stop() {
                return Err(CompareError::Stopped);
            }
            progress(&format!("density N={n}: {}", vmm.kind.name()));
            let run = run_one(plan, vmm, n, &stop);
            if let Some(why) = &run.failed {
                progress(&format!("{} N={n}: {why}", vmm.kind.name()));
            }
            report.runs.push(run);
        }
    }
    Ok(report)
}

/// One VM started and stopped, unmeasured: the VMM's binary, its page cache just dropped,
/// is read from disk once (as after a reboot: its text then faults in as in any run), so
/// that the first measured run does not include the disk.
fn warm_up(plan: &DensityPlan, vmm: &Vmm, stop: &dyn Fn() -> bool) {
    let fleet = Fleet::default();
    if let Ok((_, _, workers)) = start_all(plan, vmm, 1, &fleet, stop) {
        drop(fleet);
        for w in workers {
            let _ = w.join();
        }
    }
    remove_files(plan, vmm, 1);
}

/// Why N VMs of `memory_mib` cannot be run with `available_kib` of host memory, if so.
fn too_big(n: usize, memory_mib: u64, available_kib: u64) -> Option<String> {
    let needs = n as u64 * ((memory_mib << 10) + PER_VM_OVERHEAD_KIB);
    (needs > available_kib / 10 * 9).then(|| {
        format!(
            "{n} x ({memory_mib} MiB + 64 MiB) is more than 90% of the host's {} MiB available",
            available_kib >> 10
        )
    })
}

/// The host's MemAvailable, kB.
fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The VMM processes of a run, by VM index; each is killed and collected when dropped.
#[derive(Default)]
struct Fleet(Arc<Mutex<Vec<(usize, Child)>>>);

impl Fleet {
    fn pids(&self) -> Vec<(usize, u32)> {
        let mut pids: Vec<(usize, u32)> = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(i, c)| (*i, c.id()))
            .collect();
        pids.sort_unstable();
        pids
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let mut children = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (_, child) in children.iter_mut() {
            let _ = child.kill();
        }
        for (_, child) in children.iter_mut() {
            let _ = child.wait();
        }
    }
}

/// What the VMs' starters said.
struct Started {
    spawned: Vec<Option<Instant>>,
    first_line: Vec<Option<Instant>>,
    start_cpu: Vec<Option<Duration>>,
    failed: Option<String>,
}

fn run_one(plan: &DensityPlan, vmm: &Vmm, n: usize, stop: &dyn Fn() -> bool) -> DensityRun {
    let mut run = DensityRun {
        vmm: vmm.kind.name(),
        n,
        started_through: match super::api_start::speaks_api(vmm.kind) {
            true => "api",
            false => "command line",
        },
        ..DensityRun::default()
    };
    let fleet = Fleet::default();
    let before_kib = mem_available_kib();
    let (started, t0, workers) = match start_all(plan, vmm, n, &fleet, stop) {
        Ok(s) => s,
        Err(why) => {
            run.failed = Some(why);
            return run;
        }
    };
    if let Some(why) = started.failed {
        run.failed = Some(why);
    } else {
        let last = started.first_line.iter().flatten().max().copied();
        run.all_started_ms = last.map_or(0.0, |l| ms(l - t0));
        run.start_ms = started
            .spawned
            .iter()
            .zip(&started.first_line)
            .map(|(s, f)| match (s, f) {
                (Some(s), Some(f)) => ms(f.saturating_duration_since(*s)),
                _ => f64::NAN,
            })
            .collect();
        run.start_cpu_ms = (started.start_cpu.iter())
            .map(|c| c.map_or(f64::NAN, ms))
            .collect();
        watch_idle(plan, &fleet, &mut run, stop);
        run.host_kib_per_vm = before_kib.saturating_sub(mem_available_kib()) as f64 / n as f64;
        run.summary = summary(&run);
    }
    drop(fleet);
    for w in workers {
        let _ = w.join();
    }
    remove_files(plan, vmm, n);
    run
}

/// Starts N VMs at once, one thread each, and waits until every guest is idle (or one
/// failed, or the plan's limit passed). Returns what they said, when the first started, and
/// the threads (they end once their VMM is killed).
fn start_all(
    plan: &DensityPlan,
    vmm: &Vmm,
    n: usize,
    fleet: &Fleet,
    stop: &dyn Fn() -> bool,
) -> Result<(Started, Instant, Vec<std::thread::JoinHandle<()>>), String> {
    let mut starters = Vec::with_capacity(n);
    for i in 0..n {
        let s = start::starter(vmm, i, (&plan.guest, plan.memory_mib), &plan.workdir)?;
        let err = std::fs::File::create(error_file(plan, vmm, i))
            .map_err(|e| format!("cannot create a console error file: {e}"))?;
        starters.push((s, err));
    }
    let (tx, events) = channel();
    let t0 = Instant::now();
    let mut workers = Vec::with_capacity(n);
    for (starter, err) in starters {
        let (table, tx) = (fleet.0.clone(), tx.clone());
        let index = starter.index;
        let put = move |child| {
            let mut t = table.lock().unwrap_or_else(|e| e.into_inner());
            t.push((index, child));
        };
        let spawned = std::thread::Builder::new()
            .name(format!("density-{index}"))
            .spawn(move || starter.run(err, put, &tx));
        match spawned {
            Ok(w) => workers.push(w),
            Err(e) => return Err(format!("cannot start a thread: {e}")),
        }
    }
    drop(tx);
    let mut s = Started {
        spawned: vec![None; n],
        first_line: vec![None; n],
        start_cpu: vec![None; n],
        failed: None,
    };
    let (mut idle, deadline) = (0, t0 + plan.limit);
    while idle < n && s.failed.is_none() {
        if stop() {
            s.failed = Some("stopped".into());
            break;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left.min(LOOK_EVERY)) {
            Ok((i, Event::Spawned(at))) => s.spawned[i] = Some(at),
            Ok((i, Event::FirstLine(at))) => s.first_line[i] = Some(at),
            Ok((i, Event::StartCpu(cpu))) => s.start_cpu[i] = Some(cpu),
            Ok((_, Event::Idle)) => idle += 1,
            Ok((i, Event::Failed(why))) => s.failed = Some(failure(plan, vmm, i, &why)),
            Err(RecvTimeoutError::Timeout) if left.is_zero() => {
                s.failed = Some(format!("{idle} of {n} idle within {:?}", plan.limit));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                s.failed = Some(format!("only {idle} of {n} came up"));
            }
        }
    }
    Ok((s, t0, workers))
}

/// VM `i`'s failure, with the last line its VMM wrote on stderr.
fn failure(plan: &DensityPlan, vmm: &Vmm, i: usize, why: &str) -> String {
    let said = std::fs::read_to_string(error_file(plan, vmm, i)).unwrap_or_default();
    match said.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!("VM {i}: {why}: {}", line.trim()),
        None => format!("VM {i}: {why}"),
    }
}

fn error_file(plan: &DensityPlan, vmm: &Vmm, i: usize) -> PathBuf {
    plan.workdir
        .join(format!("density-{}-{i}.err", vmm.kind.name()))
}

/// The run's files: error files and API sockets (a VMM killed leaves its socket).
fn remove_files(plan: &DensityPlan, vmm: &Vmm, n: usize) {
    for i in 0..n {
        let _ = std::fs::remove_file(error_file(plan, vmm, i));
        let socket = format!("density-{}-{i}.sock", vmm.kind.name());
        let _ = std::fs::remove_file(plan.workdir.join(socket));
    }
}

/// Once every VM is idle: their threads over the plan's idle window, then their memory.
fn watch_idle(plan: &DensityPlan, fleet: &Fleet, run: &mut DensityRun, stop: &dyn Fn() -> bool) {
    let pids = fleet.pids();
    sleep_unless_stopped(SETTLE, stop);
    let (before, from) = (sample_all(&pids), Instant::now());
    sleep_unless_stopped(plan.idle, stop);
    let (after, to) = (sample_all(&pids), Instant::now());
    let secs = (to - from).as_secs_f64().max(1e-3);
    for (b, a) in before.iter().zip(&after) {
        let act = threads::activity(b, a);
        run.idle_cpu_us_per_s.push(act.cpu_ns as f64 / 1e3 / secs);
        run.idle_wakeups_per_s.push(act.switches as f64 / secs);
        run.kernel_thread_wakeups_per_s += act.kernel_switches as f64 / secs;
        for (name, count) in act.by_name {
            *run.wakeups_per_s_by_thread.entry(name).or_default() += count as f64 / secs;
        }
    }
    for (_, pid) in &pids {
        let Memory {
            peak_rss_kib,
            private_dirty_kib,
            pss_kib,
        } = memory_of(*pid);
        run.peak_rss_kib.push(peak_rss_kib);
        run.private_dirty_kib.push(private_dirty_kib);
        run.pss_kib.push(pss_kib);
    }
}

fn sample_all(pids: &[(usize, u32)]) -> Vec<BTreeMap<u32, threads::ThreadSample>> {
    pids.iter().map(|(_, pid)| threads::sample(*pid)).collect()
}

fn sleep_unless_stopped(d: Duration, stop: &dyn Fn() -> bool) {
    let until = Instant::now() + d;
    while !stop() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(LOOK_EVERY));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summary(run: &DensityRun) -> Summary {
    let spread_u = |v: &[u64]| Spread::of(&v.iter().map(|x| *x as f64).collect::<Vec<_>>());
    let nth_over_first = |v: &[f64]| match (v.first(), v.last()) {
        (Some(first), Some(last)) if *first > 0.0 && last.is_finite() => Some(last / first),
        _ => None,
    };
    let floats = |v: &[u64]| v.iter().map(|x| *x as f64).collect::<Vec<_>>();
    Summary {
        start_ms: Spread::of(&run.start_ms),
        start_cpu_ms: Spread::of(&run.start_cpu_ms),
        private_dirty_kib: spread_u(&run.private_dirty_kib),
        peak_rss_kib: spread_u(&run.peak_rss_kib),
        pss_kib: spread_u(&run.pss_kib),
        idle_cpu_us_per_s: Spread::of(&run.idle_cpu_us_per_s),
        idle_wakeups_per_s: Spread::of(&run.idle_wakeups_per_s),
        nth_over_first: NthOverFirst {
            start: nth_over_first(&run.start_ms),
            private_dirty: nth_over_first(&floats(&run.private_dirty_kib)),
            peak_rss: nth_over_first(&floats(&run.peak_rss_kib)),
            pss: nth_over_first(&floats(&run.pss_kib)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_whose_guests_do_not_fit_in_memory_is_not_run() {
        let gib = 1 << 20;
        assert!(too_big(64, 128, 20 * gib).is_none());
        let why = too_big(64, 512, 20 * gib).unwrap();
        assert!(why.contains("64 x (512 MiB + 64 MiB)"), "{why}");
        assert!(too_big(1, 128, 0).is_some());
    }

    #[test]
    fn the_summary_holds_medians_and_the_nth_vm_over_the_first() {
        let run = DensityRun {
            n: 3,
            start_ms: vec![2.0, 3.0, 8.0],
            private_dirty_kib: vec![300, 320, 330],
            peak_rss_kib: vec![2000, 2000, 2100],
            pss_kib: vec![900, 800, 700],
            idle_cpu_us_per_s: vec![0.0, 0.0, 1.0],
            idle_wakeups_per_s: vec![0.0, 0.0, 0.5],
            ..DensityRun::default()
        };
        let s = summary(&run);
        assert_eq!(s.start_ms.median, 3.0);
        assert_eq!(s.private_dirty_kib.median, 320.0);
        assert_eq!(s.nth_over_first.start, Some(4.0));
        assert_eq!(s.nth_over_first.private_dirty, Some(1.1));
        assert_eq!(s.idle_wakeups_per_s.max, 0.5);
    }
}
