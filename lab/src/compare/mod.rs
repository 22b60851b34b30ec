//! `exitless compare`: the bench guest under exitless and under each peer VMM found on this
//! host, one case at a time, in rounds that interleave the VMMs (hosts are noisy). Each case
//! runs at two iteration counts so that start-up cancels out of the per-exit figures.

pub mod api_start;
mod console_watch;
pub mod density;
mod figures;
pub mod floor;
pub mod kvm_stats;
pub mod migrate;
mod migrate_run;
pub mod peer;
pub mod process;
pub mod snapshot;
pub mod turnaround;
mod vhost_blk;
pub mod vmm_kind;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use crate::bench::fs::{ScratchShare, Virtiofsd};
use crate::bench::threads;
use kvm_stats::ExitsSource;
use peer::{Device, Launch, Vmm};
use process::{Moment, RunSample};
use turnaround::{Traced, Tracer};
use vmm::devices::virtio::net::private_net::PrivateNet;
use vmm_kind::VmmKind;

/// The tap net cases (and `*_devices` cases) attach, in a network namespace of the
/// comparison's own.
const TAP: &str = "exlcmp0";

#[derive(Debug, Error)]
pub enum CompareError {
    #[error("{vmm}: {path} is not an executable file")]
    NotExecutable { vmm: &'static str, path: PathBuf },
    #[error("Cannot start the VMM: {0}")]
    Spawn(std::io::Error),
    #[error("The VMM's console could not be read")]
    NoConsole,
    #[error("The guest did not finish within {0:?}")]
    Timeout(Duration),
    #[error("The VMM ended before the guest finished ({0})")]
    Ended(String),
    #[error("The guest reported: {0}")]
    Guest(String),
    #[error("The guest finished without a result line for its case")]
    NoResult,
    #[error("Cannot prepare the run's folder: {0}")]
    Workdir(std::io::Error),
    #[error("Stopped before the comparison ended")]
    Stopped,
    #[error("Cannot start virtiofsd: {0}")]
    Backend(String),
    #[error("Cannot start qemu-storage-daemon: {0}")]
    StorageDaemon(String),
    #[error("{0}")]
    Snapshot(String),
    #[error("{0}")]
    Migrate(String),
    #[error("exitless itself failed on case {case}: {source}")]
    Exitless {
        case: String,
        #[source]
        source: Box<CompareError>,
    },
}

/// What to compare.
#[derive(Clone, Debug)]
pub struct Plan {
    /// exitless first, then the peers.
    pub vmms: Vec<Vmm>,
    pub cases: Vec<String>,
    /// The larger of the two iteration counts (the smaller is a fifth of it).
    pub iterations: u64,
    pub rounds: u32,
    pub memory_mib: u64,
    /// Longest a single run may take.
    pub limit: Duration,
    pub guest: PathBuf,
    pub workdir: PathBuf,
}

/// min, median and max over the rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread::default();
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 0 {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        };
        Spread {
            min: v[0],
            median,
            max: v[v.len() - 1],
        }
    }
}

/// One VMM's figures for one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseFigures {
    pub case: String,
    pub first_line_ms: Spread,
    pub done_ms: Spread,
    /// Guest cycles per iteration (the guest's own count).
    pub guest_cycles_per_iter: Spread,
    /// Wall time per iteration from the two iteration counts, each from the guest's first
    /// line to its end (start-up cancels out).
    pub wall_per_iter_us: Spread,
    /// Process CPU (user + system) per iteration, from the two counts; coarse (clock ticks).
    pub cpu_per_iter_us: Spread,
    /// Of the process's CPU, what the kernel counted as guest time, per iteration.
    pub guest_cpu_per_iter_us: Spread,
    pub peak_rss_kib: Spread,
    /// Private dirty memory (`Private_Dirty:` summed over smaps), sampled with peak RSS.
    pub private_dirty_kib: Spread,
    pub rss_beyond_guest_kib: Spread,
    /// This VMM's median wall time per iteration over exitless's, same sitting.
    pub wall_ratio_to_exitless: Option<f64>,
    /// This VMM's median time to the guest's first line over the floor VMM's, same sitting.
    pub first_line_ratio_to_floor: Option<f64>,
    /// This VMM's turnaround per userspace exit over the floor VMM's, same sitting: [min, p50].
    pub turnaround_ratio_to_floor: Option<[f64; 2]>,
    /// Iterations (device cases: requests) per second, from the guest's cycle count.
    pub iters_per_s: Spread,
    /// On-CPU time of all the VMM's threads per iteration (schedstat, ns resolution; the
    /// vCPU thread's includes the guest's own time), from the two counts, each from the
    /// guest's first line to its end.
    pub threads_cpu_per_iter_us: Spread,
    /// On-CPU time of the VMM's vhost-user back end (its own virtiofsd, all threads) per
    /// iteration, measured as the VMM's threads are (fs cases).
    pub backend_cpu_per_iter_us: Option<Spread>,
    /// Userspace exits (`kvm_userspace_exit` on the VMM's threads) per iteration.
    pub userspace_exits_per_iter: Option<Spread>,
    /// Exits KVM handled in the kernel per iteration: its `exits` statistic (debugfs) less
    /// the userspace ones.
    pub kernel_exits_per_iter: Option<Spread>,
    /// Turnaround per userspace exit (tracefs, x86-tsc clock) from the guest's first line to
    /// its end, pooled over the rounds' larger runs, in ns.
    pub turnaround_ns: Option<Turnaround>,
    /// Why a run had no turnaround figures, when tracing worked otherwise.
    pub turnaround_note: Option<String>,
}

/// The VMM's time from a userspace exit to its next KVM_RUN, on the vCPU thread, in ns.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Turnaround {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub samples: usize,
}

/// One VMM's results: its figures, or why it has none.
#[derive(Clone, Debug, Serialize)]
pub struct VmmReport {
    pub vmm: &'static str,
    pub path: PathBuf,
    pub failed: Option<String>,
    /// Cases this VMM cannot run, each with why.
    pub not_run: Vec<String>,
    /// Devices this VMM runs a case without: "CASE without DEVICE: why".
    pub left_out: Vec<String>,
    pub cases: Vec<CaseFigures>,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    pub schema: &'static str,
    pub iterations: [u64; 2],
    pub rounds: u32,
    pub memory_mib: u64,
    /// "measured", or why the turnaround column is empty.
    pub turnaround: String,
    /// The TSC frequency turning trace timestamps and guest cycles into time.
    pub tsc_khz: u64,
    /// Why the in-kernel exit column is empty, if it is.
    pub kernel_exits_note: Option<String>,
    /// Cases not run for any VMM, each with why (e.g. no tap can be made).
    pub not_run: Vec<String>,
    pub vmms: Vec<VmmReport>,
    /// The `snapshot` case's rows, one per VMM that takes part, when it was run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Vec<snapshot::SnapshotRow>>,
    /// The `migrate` case's rows, per VMM that takes part, way and writing rate, when it was
    /// run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migrate: Option<Vec<migrate::MigrateRow>>,
}

/// One run and what its trace said (or why nothing).
#[derive(Clone, Debug)]
struct Run {
    sample: RunSample,
    traced: Result<Traced, String>,
    /// KVM's `exits` statistic at the guest's end, or why none.
    kvm_exits: Result<u64, String>,
    /// The back end's CPU from the guest's first line to its end, ns (fs cases).
    backend_cpu_ns: Option<u64>,
}

/// A (small, large) pair of runs.
type Pair = (Run, Run);

/// What every run of a comparison shares.
struct Setting<'a> {
    plan: &'a Plan,
    counts: [u64; 2],
    tracer: Option<&'a Tracer>,
    net: Option<&'a PrivateNet>,
    /// KVM's debugfs statistics can be read (else each VMM's own channel, device cases only).
    debugfs: bool,
    /// The virtiofsd and shared directory the fs cases use.
    fs: Option<&'a FsHost>,
    /// The qemu-storage-daemon program the vhost_user_blk cases use.
    blk_daemon: Option<&'a std::path::Path>,
}

/// What the fs cases share: the virtiofsd program and the directory every VMM's own
/// virtiofsd serves (the same file for all).
struct FsHost {
    daemon: vmm::devices::virtio::vhost_user::virtiofsd::Daemon,
    share: ScratchShare,
}

impl FsHost {
    /// The daemon found and the directory made, or why the fs cases cannot run.
    fn make(workdir: &std::path::Path) -> Result<Self, String> {
        let daemon = crate::bench::fs::daemon()?;
        let share = ScratchShare::create(workdir.join("fs-share"))
            .map_err(|e| format!("cannot make the shared directory: {e}"))?;
        Ok(FsHost { daemon, share })
    }

    /// A virtiofsd of `vmm`'s own on `socket`, listening.
    fn start(&self, socket: &std::path::Path) -> Result<Virtiofsd, CompareError> {
        let log = socket.with_extension("log");
        Virtiofsd::start(&self.daemon, &self.share.dir, socket, &log).map_err(CompareError::Backend)
    }
}

fn needs_fs(case: &str) -> bool {
    peer::guest_case(case).2.is_some_and(Device::has_fs)
}

/// The fs cases' host side when the plan has fs cases, and each fs case with why it is not
/// run when there is none.
fn fs_for(plan: &Plan) -> (Option<FsHost>, Vec<String>) {
    if !plan.cases.iter().any(|c| needs_fs(c)) {
        return (None, Vec::new());
    }
    match FsHost::make(&plan.workdir) {
        Ok(host) => (Some(host), Vec::new()),
        Err(why) => {
            let cases = plan.cases.iter().filter(|c| needs_fs(c));
            (None, cases.map(|c| format!("{c}: {why}")).collect())
        }
    }
}

/// A network namespace with the tap net cases attach, or why none can be made.
fn tap_net() -> Result<PrivateNet, String> {
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun".into());
    }
    let net = PrivateNet::create().map_err(|e| format!("no network namespace (root): {e}"))?;
    net.add_tap(TAP)
        .map_err(|e| format!("cannot make a tap: {e}"))?;
    Ok(net)
}

/// Runs the plan; `progress` hears each step, and `stop` is asked before each run (a signal:
/// the comparison ends there, tracing settings restored). A peer that fails is reported and
/// left out of later rounds; exitless failing ends the comparison.
pub fn run(
    plan: &Plan,
    mut progress: impl FnMut(&str),
    stop: impl Fn() -> bool,
) -> Result<CompareReport, CompareError> {
    let counts = [(plan.iterations / 5).max(1), plan.iterations];
    let tracer = Tracer::open();
    if let Err(why) = &tracer {
        progress(&format!("turnaround per exit not measured: {why}"));
    }
    drop_page_caches(plan, &mut progress);
    let net = net_for(plan);
    let (fs, fs_not_run) = fs_for(plan);
    let (blk_daemon, blk_not_run) = vhost_blk::daemon_for(plan);
    let mut not_run = tap_cases_not_run(plan, &net);
    not_run.extend(fs_not_run);
    not_run.extend(blk_not_run);
    not_run
        .iter()
        .for_each(|why| progress(&format!("not run: {why}")));
    let setting = Setting {
        plan,
        counts,
        tracer: tracer.as_ref().ok(),
        net: net.as_ref().and_then(|n| n.as_ref().ok()),
        debugfs: kvm_stats::debugfs_readable().is_ok(),
        fs: fs.as_ref(),
        blk_daemon: blk_daemon.as_deref(),
    };
    let mut snapshots = Snapshots::new(plan);
    let mut migrations = migrate::Migrations::new(plan);
    let mut runs = Runs::new(plan);
    for round in 1..=plan.rounds {
        for (c, case) in plan.cases.iter().enumerate() {
            if case == snapshot::CASE {
                snapshots.round(plan, round, &mut progress, &stop)?;
            } else if case == migrate::CASE {
                migrations.round(plan, round, &mut progress, &stop)?;
            } else if setting.can_run(case) {
                runs.round(&setting, c, round, &mut progress, &stop)?;
            }
        }
    }
    let Runs { pairs, failed } = runs;
    let tsc_khz = tracer.as_ref().map_or_else(
        |_| vmm::profile::estimate_tsc_khz(Duration::from_millis(100)),
        |t| t.tsc_khz(),
    );
    let debugfs = setting.debugfs;
    let mut report = figures::report(plan, counts, pairs, failed, tsc_khz);
    report.turnaround = tracer.map_or_else(|why| why, |_| "measured".to_string());
    report.not_run = not_run;
    report.kernel_exits_note = kernel_exits_note(debugfs);
    report.snapshot = plan
        .cases
        .iter()
        .any(|c| c == snapshot::CASE)
        .then(|| snapshots.rows(plan));
    report.migrate = plan
        .cases
        .iter()
        .any(|c| c == migrate::CASE)
        .then(|| migrations.rows());
    Ok(report)
}

/// Each VMM's pairs of runs per case of the plan, and the error that left a peer out.
struct Runs {
    pairs: Vec<Vec<Vec<Pair>>>,
    failed: Vec<Option<String>>,
}

impl Runs {
    fn new(plan: &Plan) -> Self {
        Runs {
            pairs: vec![vec![Vec::new(); plan.cases.len()]; plan.vmms.len()],
            failed: vec![None; plan.vmms.len()],
        }
    }

    /// Round `round` of the plan's case `c` for every VMM still in: a peer that fails is
    /// left out from then on; exitless failing ends the comparison.
    fn round(
        &mut self,
        setting: &Setting,
        c: usize,
        round: u32,
        progress: &mut impl FnMut(&str),
        stop: &impl Fn() -> bool,
    ) -> Result<(), CompareError> {
        let plan = setting.plan;
        let case = &plan.cases[c];
        for (v, vmm) in plan.vmms.iter().enumerate() {
            if self.failed[v].is_some() || vmm.cannot_run(case).is_some() {
                continue;
            }
            if stop() {
                return Err(CompareError::Stopped);
            }
            let name = vmm.kind.name();
            progress(&format!("round {round}/{}: {name} {case}", plan.rounds));
            match run_pair(setting, vmm, case) {
                Ok(pair) => self.pairs[v][c].push(pair),
                Err(e) if vmm.kind == VmmKind::Exitless => {
                    return Err(CompareError::Exitless {
                        case: case.clone(),
                        source: Box::new(e),
                    })
                }
                Err(e) => {
                    progress(&format!("{name}: {case}: {e}; left out"));
                    self.failed[v] = Some(format!("{case}: {e}"));
                }
            }
        }
        Ok(())
    }
}

impl Setting<'_> {
    /// Whether what `case` needs of the host (a tap, virtiofsd, a vhost-user-blk daemon) is
    /// here (a case without it was said "not run" once).
    fn can_run(&self, case: &str) -> bool {
        !((needs_tap(case) && self.net.is_none())
            || (needs_fs(case) && self.fs.is_none())
            || (vhost_blk::needs_daemon(case) && self.blk_daemon.is_none()))
    }
}

/// The `snapshot` case's rounds so far, per VMM of the plan, and the error that stopped a
/// VMM (a peer's is its row's; exitless's ends the comparison).
struct Snapshots(Vec<(Vec<snapshot::SnapshotRound>, Option<String>)>);

impl Snapshots {
    fn new(plan: &Plan) -> Self {
        Snapshots(vec![(Vec::new(), None); plan.vmms.len()])
    }

    fn round(
        &mut self,
        plan: &Plan,
        round: u32,
        progress: &mut impl FnMut(&str),
        stop: &impl Fn() -> bool,
    ) -> Result<(), CompareError> {
        let taking_part = plan.vmms.iter().zip(self.0.iter_mut());
        for (vmm, (rounds, failed)) in taking_part.filter(|(v, _)| snapshot::takes_part(v.kind)) {
            if failed.is_some() {
                continue;
            }
            if stop() {
                return Err(CompareError::Stopped);
            }
            let name = vmm.kind.name();
            progress(&format!("round {round}/{}: {name} snapshot", plan.rounds));
            let setting = snapshot::RoundSetting {
                guest: &plan.guest,
                memory_mib: plan.memory_mib,
                dir: plan.workdir.join(format!("snapshot-{name}")),
                limit: plan.limit,
            };
            match snapshot::round(vmm, &setting) {
                Ok(r) => rounds.push(r),
                Err(e) if vmm.kind == VmmKind::Exitless => {
                    return Err(CompareError::Exitless {
                        case: snapshot::CASE.into(),
                        source: Box::new(CompareError::Snapshot(e)),
                    })
                }
                Err(e) => {
                    progress(&format!("{name}: snapshot: {e}; left out"));
                    *failed = Some(e);
                }
            }
        }
        Ok(())
    }

    fn rows(self, plan: &Plan) -> Vec<snapshot::SnapshotRow> {
        let taking_part = plan.vmms.iter().zip(self.0);
        taking_part
            .filter(|(v, _)| snapshot::takes_part(v.kind))
            .map(|(v, (rounds, failed))| snapshot::SnapshotRow::of(v.kind.name(), rounds, failed))
            .collect()
    }
}

/// Each VMM binary's page cache dropped, to be faulted in from disk (see
/// [`process::drop_page_cache`]); one that cannot be is said and measured as found.
fn drop_page_caches(plan: &Plan, progress: &mut impl FnMut(&str)) {
    for vmm in &plan.vmms {
        if let Err(e) = process::drop_page_cache(&vmm.path) {
            let name = vmm.kind.name();
            progress(&format!(
                "{name}: page cache as found (cannot drop it: {e})"
            ));
        }
    }
}

/// The cases with a tap, each with why it is not run, when no tap could be made.
fn tap_cases_not_run(plan: &Plan, net: &Option<Result<PrivateNet, String>>) -> Vec<String> {
    let Some(Err(why)) = net else {
        return Vec::new();
    };
    plan.cases
        .iter()
        .filter(|c| needs_tap(c))
        .map(|case| format!("{case}: {why}"))
        .collect()
}

fn needs_tap(case: &str) -> bool {
    peer::guest_case(case).2.is_some_and(Device::has_tap)
}

/// The tap's namespace when the plan has cases with a tap: made, or why not.
fn net_for(plan: &Plan) -> Option<Result<PrivateNet, String>> {
    plan.cases.iter().any(|c| needs_tap(c)).then(tap_net)
}

/// What the report says of the in-kernel exit column when debugfs cannot be read.
fn kernel_exits_note(debugfs: bool) -> Option<String> {
    if debugfs {
        return None;
    }
    kvm_stats::debugfs_readable()
        .err()
        .map(|why| format!("{why}; device cases read exitless's profile and QEMU's QMP"))
}

/// The files a run's devices use, in the comparison's folder (removed with it).
struct DeviceFiles {
    disk: PathBuf,
    vsock: PathBuf,
}

impl DeviceFiles {
    fn in_folder(workdir: &std::path::Path) -> Self {
        DeviceFiles {
            disk: workdir.join("disk.img"),
            vsock: workdir.join("vsock.sock"),
        }
    }

    /// A fresh 16 MiB raw image when `device` needs one, and no socket left by the last run
    /// (each VMM makes the socket it listens on and refuses one that is there).
    fn prepare(&self, device: Option<Device>) -> Result<(), CompareError> {
        if device.is_some_and(Device::needs_image) {
            let image = std::fs::File::create(&self.disk).map_err(CompareError::Workdir)?;
            image.set_len(16 << 20).map_err(CompareError::Workdir)?;
        }
        match std::fs::remove_file(&self.vsock) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CompareError::Workdir(e)),
            _ => Ok(()),
        }
    }

    /// What `vmm` boots for `case`.
    fn launch<'a>(
        &'a self,
        plan: &'a Plan,
        (vmm, case): (&Vmm, &str),
        cmdline: &'a str,
        exits: &'a ExitsSource,
    ) -> Launch<'a> {
        let has = |f: fn(Device) -> bool| peer::guest_case(case).2.is_some_and(f);
        Launch {
            guest: &plan.guest,
            cmdline,
            memory_mib: plan.memory_mib,
            workdir: &plan.workdir,
            disk: has(Device::has_disk).then_some(self.disk.as_path()),
            tap: has(Device::has_tap).then_some(TAP),
            vsock: (has(Device::has_vsock) && vmm.left_out(case).is_none())
                .then_some(self.vsock.as_path()),
            fs: None,
            vhost_blk: None,
            exits,
        }
    }
}

/// Where a run's KVM exit count comes from. A VMM's own channel may cost it time per exit
/// (exitless's profile) and memory: driven device cases only.
fn exits_source(setting: &Setting, vmm: &Vmm, device: Option<Device>) -> ExitsSource {
    match (setting.debugfs, device) {
        (true, _) => ExitsSource::Debugfs,
        (false, Some(d)) if d.driven() => ExitsSource::own_channel(vmm.kind, &setting.plan.workdir),
        (false, _) => ExitsSource::Unavailable("KVM's debugfs statistics cannot be read"),
    }
}

fn run_pair(setting: &Setting, vmm: &Vmm, case: &str) -> Result<Pair, CompareError> {
    let plan = setting.plan;
    let (guest_case, qd, device) = peer::guest_case(case);
    let files = DeviceFiles::in_folder(&plan.workdir);
    let exits = exits_source(setting, vmm, device);
    // Each VMM's own virtiofsd, on a socket of its own (virtiofsd serves one front end and
    // ends with it: one per run).
    let fs_socket = plan
        .workdir
        .join(format!("virtiofsd-{}.sock", vmm.kind.name()));
    let fs_host = setting.fs.filter(|_| device.is_some_and(Device::has_fs));
    // Likewise its own qemu-storage-daemon on the run's fresh image.
    let blk_socket = plan.workdir.join(format!("vublk-{}.sock", vmm.kind.name()));
    let blk_daemon = setting
        .blk_daemon
        .filter(|_| device.is_some_and(Device::has_vhost_blk));
    let one = |iters: u64| -> Result<Run, CompareError> {
        // `hold`: the guest halts after its last line instead of ending the VM, so that
        // every VMM is still there to be measured (QEMU would exit at once).
        let queue = qd.map(|q| format!(" qd={q}")).unwrap_or_default();
        let cmdline = format!("case={guest_case} iters={iters}{queue} hold");
        files.prepare(device)?;
        let mut launch = files.launch(plan, (vmm, case), &cmdline, &exits);
        let backend = fs_host.map(|h| h.start(&fs_socket)).transpose()?;
        launch.fs = backend.as_ref().map(|_| fs_socket.as_path());
        let blk = blk_daemon
            .map(|p| vhost_blk::start(p, &files.disk, &blk_socket))
            .transpose()?;
        launch.vhost_blk = blk.as_ref().map(|d| d.socket.as_path());
        let backend_pid = backend.as_ref().map(Virtiofsd::pid);
        let backend_pid = backend_pid.or(blk.as_ref().map(|d| d.pid()));
        let backend_cpu = || backend_pid.map(threads::process_sample);
        let mut backend_cpu_ns = (None, None);
        let mut traced = Err("not traced".to_string());
        let mut kvm_exits = Err("not read".to_string());
        let mut first_line_tsc = 0;
        if let Some(t) = setting.tracer {
            t.clear();
        }
        let net = setting.net.filter(|_| device.is_some_and(Device::has_tap));
        let sample = process::run(
            vmm.command(&launch)?,
            net,
            guest_case,
            plan.limit,
            &mut |moment, pid| match moment {
                // Counted from the guest's first line: firmware exits (QEMU's SeaBIOS makes
                // thousands) stay out of the turnarounds (the trace clock is the TSC).
                Moment::FirstLine => {
                    first_line_tsc = vmm::profile::rdtsc();
                    backend_cpu_ns.0 = backend_cpu();
                }
                Moment::Done => {
                    backend_cpu_ns.1 = backend_cpu();
                    if let Some(t) = setting.tracer {
                        traced = t.read(pid, first_line_tsc);
                    }
                    kvm_exits = exits.read(pid);
                }
            },
        )?;
        Ok(Run {
            sample,
            traced,
            kvm_exits,
            backend_cpu_ns: backend_cpu_ns
                .0
                .zip(backend_cpu_ns.1)
                .map(|(a, b)| b.ns_since(&a)),
        })
    };
    Ok((one(setting.counts[0])?, one(setting.counts[1])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_min_median_max_of_finite_values() {
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Spread {
                min: 1.0,
                median: 2.0,
                max: 3.0
            }
        );
        assert_eq!(Spread::of(&[4.0, 1.0, f64::NAN, 2.0, 3.0]).median, 2.5);
        assert_eq!(Spread::of(&[]), Spread::default());
    }
}
