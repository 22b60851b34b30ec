//! `exitless compare`: the bench guest side by side under exitless and the peer VMMs found on
//! this host (QEMU, Firecracker, Cloud Hypervisor).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use exitless_lab::bench::guest::BENCH_GUEST;
use exitless_lab::compare::peer::Vmm;
use exitless_lab::compare::vmm_kind::VmmKind;
use exitless_lab::compare::{self, CompareReport, Plan, Spread};

use crate::output_file::{ensure_writable, write_json};

/// Cases every VMM can run: no device beyond the console is needed.
const SHARED_CASES: &[&str] = &[
    "pio_out",
    "pio_in",
    "mmio_write",
    "mmio_read",
    "pio_out_cpl0",
    "cpuid",
    "msr_read",
    "msr_write",
    "virtio_blk_qd1",
    "virtio_blk_qd32",
    "virtio_net_qd1",
    "virtio_net_qd32",
    "virtio_fs_qd1",
    "virtio_fs_qd32",
    "vhost_user_blk_qd1",
    "vhost_user_blk_qd32",
    "pio_out_devices",
    "snapshot",
    "migrate",
];

#[derive(Args)]
#[command(
    after_help = "Each VMM boots the bench guest (the PVH ELF that `exitless bench \
--export-guest` writes) with 1 vCPU and the same memory, once per case at two iteration counts \
(N/5 and N), so that start-up cancels out of the per-iteration figures. Rounds interleave the \
VMMs; each figure is min/median/max over the rounds, with the median wall time per iteration \
as a ratio to exitless's. A peer that is missing or cannot boot the guest is reported in one \
line and the others go on. Every VMM is killed once its guest printed its last line; its \
memory is sampled just before: peak RSS (VmHWM) and private dirty memory (Private_Dirty summed \
over /proc/PID/smaps), in kB. Each VMM binary's page cache is written back and dropped before \
the first round, so that its text faults in from disk as after a reboot, whatever wrote the \
file last. For the VMMs' memory with devices attached, add the pio_out_devices case."
)]
pub struct CompareArgs {
    /// The exitless binary to measure, e.g. the VMM-only build that production runs
    /// (`cargo build --release --no-default-features`; see docs/performance.md) [default: this
    /// binary]
    #[arg(long, value_name = "PATH")]
    exitless: Option<PathBuf>,
    /// QEMU's x86-64 system emulator [default: qemu-system-x86_64 on PATH]
    #[arg(long, value_name = "PATH")]
    qemu: Option<PathBuf>,
    /// Firecracker [default: firecracker on PATH]
    #[arg(long, value_name = "PATH")]
    firecracker: Option<PathBuf>,
    /// Cloud Hypervisor [default: cloud-hypervisor on PATH]
    #[arg(long, value_name = "PATH")]
    cloud_hypervisor: Option<PathBuf>,
    /// Comma-separated guest cases (pio_out, pio_in, mmio_write, mmio_read, pio_out_cpl0,
    /// cpuid, msr_read, msr_write; virtio_blk_qd1, virtio_blk_qd32: 4 KiB random requests
    /// at queue depth 1 or 32 to each VMM's virtio-blk-pci, a 16 MiB raw image;
    /// virtio_net_qd1, virtio_net_qd32: 64-byte frames sent to each VMM's virtio-net-pci on a
    /// tap in a network namespace of the comparison's own, needs root; virtio_fs_qd1,
    /// virtio_fs_qd32: 4 KiB FUSE READs through each VMM's virtio-fs (shared memory) to a
    /// virtiofsd of its own on one 16 MiB file, needs root and virtiofsd;
    /// vhost_user_blk_qd1, vhost_user_blk_qd32: virtio_blk's requests to each VMM's
    /// vhost-user disk (`--disk vhost_user=on,socket=...`, shared memory) on a
    /// qemu-storage-daemon of its own exporting the 16 MiB image, the daemon's CPU beside the
    /// VMM's (with virtio_blk_qd*, exitless's own virtio-blk on the image); pio_out_devices:
    /// pio_out with a 16 MiB raw disk, a virtio-net on that tap and vsock (cid 3) attached to
    /// every VMM but not driven, for memory and start-up with devices, needs root; QEMU
    /// gets no vsock: its vhost-vsock-pci needs /dev/vhost-vsock; snapshot: the guest paused
    /// mid-loop, snapshotted and restored in fresh processes through each VMM's API, with
    /// exitless, Firecracker and Cloud Hypervisor (see docs/performance.md); migrate: the
    /// guest live-migrated on this host at rest and while writing, exitless over unix: and
    /// local (shared memory), QEMU over unix: with its bandwidth cap lifted, Cloud
    /// Hypervisor tried (see docs/migration.md))
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pio_out,mmio_write,cpuid"
    )]
    cases: Vec<String>,
    /// Iterations of the larger run of each case (10 to 1000000; the smaller is a fifth)
    #[arg(long, default_value_t = 2000)]
    iterations: u64,
    /// Rounds over all VMMs (1 to 100)
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Guest memory in MiB for every VMM (64 to 65536) [default: 512; 128 with --density]
    #[arg(long, value_name = "MIB")]
    memory: Option<u64>,
    /// Longest one run may take, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    timeout: u64,
    /// Also write the figures as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Also draw them as an SVG chart in FILE (wall time per iteration, start-up, memory)
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Instead of the cases: start-up through the API, as Kata starts a VMM (spawn with
    /// --api-socket, vmm.ping until it answers, vm.create, vm.boot, the guest's first serial
    /// line), exitless beside Cloud Hypervisor, --rounds times
    #[arg(long)]
    api: bool,
    /// Instead of the cases: what many VMs cost. For each count N (e.g. 1,8,32,64), N VMs
    /// of each VMM started at once (exitless and Cloud Hypervisor through their API, as
    /// Kata starts them; the others from their command line), each booting the bench
    /// guest's idle case: time until all N printed their first line, each VM's start, its
    /// private dirty memory, peak RSS and Pss once idle, host CPU and wake-ups per idle VM
    /// per second (over --idle), and the N-th VM against the first. A count whose VMs do
    /// not fit in the host's available memory is not run (said in one line)
    #[arg(long, value_name = "N,N...", value_delimiter = ',')]
    density: Vec<usize>,
    /// With --density: how long the idle VMs are watched, in seconds (1 to 600)
    #[arg(long, value_name = "SECS", default_value_t = 3)]
    idle: u64,
    #[command(flatten)]
    pub log: crate::options::LogOptions,
}

/// Guest memory when --memory is not given: the cases', and --density's (many VMs).
const MEMORY_MIB: u64 = 512;
const DENSITY_MEMORY_MIB: u64 = 128;

pub fn main(args: CompareArgs) -> anyhow::Result<i32> {
    check(&args)?;
    if let Some(path) = &args.json {
        ensure_writable("--json", path)?;
    }
    let chart = match &args.chart {
        Some(path) => {
            ensure_writable("--chart", path)?;
            Some((chart_program()?, path.as_path()))
        }
        None => None,
    };
    let (plan, missing) = plan_of(&args)?;
    vmm::launch::install_signal_handlers()?;
    if !args.density.is_empty() {
        return density_main(&args, &plan, chart);
    }
    if args.api {
        let reports = crate::compare_api::run(
            &plan.vmms,
            &plan.guest,
            &plan.workdir,
            plan.memory_mib,
            args.rounds,
        );
        let _ = std::fs::remove_dir_all(&plan.workdir);
        crate::compare_api::print(&reports);
        if let Some(path) = &args.json {
            write_json(path, &reports)?;
        }
        return Ok(0);
    }
    let report = compare::run(
        &plan,
        |step| eprintln!("[compare] {step}"),
        || vmm::launch::stop_signal().is_some(),
    );
    let _ = std::fs::remove_dir_all(&plan.workdir);
    let mut report = report?;
    report.not_run.extend(missing);
    print_table(&report);
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some((program, path)) = chart {
        draw_chart(&program, path, &report)?;
    }
    Ok(0)
}

/// The comparison's plan: exitless, the peers found (and the lines of those missing), the
/// floor last; the bench guest and the floor written into a work directory of this run's.
fn plan_of(args: &CompareArgs) -> anyhow::Result<(Plan, Vec<String>)> {
    let exitless = match &args.exitless {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("Cannot find the exitless binary")?,
    };
    let mut vmms = vec![Vmm::named(VmmKind::Exitless, &exitless)?];
    let (found, missing) = peers(args)?;
    vmms.extend(found);
    let workdir = std::env::temp_dir().join(format!("exitless-compare-{}", std::process::id()));
    std::fs::create_dir_all(&workdir)
        .with_context(|| format!("Cannot create {}", workdir.display()))?;
    let guest = workdir.join("bench-guest.elf");
    std::fs::write(&guest, BENCH_GUEST)
        .with_context(|| format!("Cannot write {}", guest.display()))?;
    // The physical-limit row, last: every VMM's start-up is also a ratio to it.
    let floor = compare::floor::write_into(&workdir)
        .with_context(|| format!("Cannot write the floor VMM into {}", workdir.display()))?;
    vmms.push(Vmm::named(VmmKind::Floor, &floor)?);
    let plan = Plan {
        vmms,
        cases: args.cases.clone(),
        iterations: args.iterations,
        rounds: args.rounds,
        memory_mib: memory_mib(args),
        limit: Duration::from_secs(args.timeout),
        guest,
        workdir,
    };
    Ok((plan, missing))
}

/// `--density`: N VMs of each VMM at once, for each N.
fn density_main(
    args: &CompareArgs,
    plan: &Plan,
    chart: Option<(PathBuf, &Path)>,
) -> anyhow::Result<i32> {
    let density = crate::compare_density::plan(plan, &args.density, args.idle);
    let report = crate::compare_density::run(&density);
    let _ = std::fs::remove_dir_all(&plan.workdir);
    let report = report?;
    crate::compare_density::print(&report);
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some((program, path)) = chart {
        draw_chart(&program, path, &report)?;
    }
    Ok(0)
}

/// `exitless-chart` next to this binary, checked able to draw (a font is there).
fn chart_program() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("Cannot find the exitless binary")?;
    let program = exe.with_file_name("exitless-chart");
    let check = std::process::Command::new(&program).arg("--check").output();
    match check {
        Ok(o) if o.status.success() => Ok(program),
        Ok(o) => bail!("--chart: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => bail!(
            "--chart needs {} (cargo build --release builds it next to exitless): {e}",
            program.display()
        ),
    }
}

fn memory_mib(args: &CompareArgs) -> u64 {
    args.memory.unwrap_or(match args.density.is_empty() {
        true => MEMORY_MIB,
        false => DENSITY_MEMORY_MIB,
    })
}

/// Draws `report` into `path` with `exitless-chart` (the plotting stays out of this binary).
fn draw_chart(program: &Path, path: &Path, report: &impl serde::Serialize) -> anyhow::Result<()> {
    let json = path.with_extension("json.tmp");
    write_json(&json, report)?;
    let drawn = std::process::Command::new(program)
        .arg(&json)
        .arg(path)
        .output();
    let _ = std::fs::remove_file(&json);
    let o = drawn.with_context(|| format!("Cannot run {}", program.display()))?;
    if !o.status.success() {
        bail!("{}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

fn check(args: &CompareArgs) -> anyhow::Result<()> {
    if let Some(bad) = args
        .cases
        .iter()
        .find(|c| !SHARED_CASES.contains(&c.as_str()))
    {
        bail!(
            "--cases: unknown case {bad:?}; cases every VMM can run: {}",
            SHARED_CASES.join(", ")
        );
    }
    if !(10..=1_000_000).contains(&args.iterations) {
        bail!(
            "--iterations must be 10 to 1000000, got {}",
            args.iterations
        );
    }
    if !(1..=100).contains(&args.rounds) {
        bail!("--rounds must be 1 to 100, got {}", args.rounds);
    }
    if let Some(memory) = args.memory.filter(|m| !(64..=65536).contains(m)) {
        bail!("--memory must be 64 to 65536 MiB, got {memory}");
    }
    if args.density.iter().any(|n| !(1..=1024).contains(n)) {
        bail!("--density: each count must be 1 to 1024");
    }
    if !args.density.is_empty() && args.api {
        bail!("--density and --api are two different comparisons: give one");
    }
    if !(1..=600).contains(&args.idle) {
        bail!("--idle must be 1 to 600 seconds, got {}", args.idle);
    }
    if args.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    Ok(())
}

/// The peers named or found on PATH, and a line for each missing one (said on stderr now,
/// and among the report's "not run" lines).
fn peers(args: &CompareArgs) -> anyhow::Result<(Vec<Vmm>, Vec<String>)> {
    let named = [&args.qemu, &args.firecracker, &args.cloud_hypervisor];
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for (kind, path) in VmmKind::PEERS.into_iter().zip(named) {
        match path {
            Some(p) => found.push(Vmm::named(kind, p)?),
            None => match Vmm::on_path(kind) {
                Some(vmm) => found.push(vmm),
                None => {
                    let name = kind.name();
                    let why = format!("{name}: not on PATH (name it with --{name})");
                    eprintln!("[compare] {why}; left out");
                    missing.push(why);
                }
            },
        }
    }
    Ok((found, missing))
}

fn print_table(report: &CompareReport) {
    let [small, large] = report.iterations;
    println!(
        "{} rounds, {small} and {large} iterations, {} MiB, 1 vCPU: median (min-max)",
        report.rounds, report.memory_mib
    );
    print_left_out(report);
    let cases = report
        .vmms
        .first()
        .map(|v| v.cases.clone())
        .unwrap_or_default();
    if !cases.is_empty() {
        print_case_header();
    }
    for case in cases.iter().map(|c| &c.case) {
        for v in &report.vmms {
            let Some(c) = v.cases.iter().find(|c| &c.case == case) else {
                continue;
            };
            let ratio = c
                .wall_ratio_to_exitless
                .map_or("-".into(), |r| format!("{r:.2}x"));
            let x_floor = c
                .first_line_ratio_to_floor
                .map_or("-".into(), |r| format!("{r:.2}x"));
            let turn_x_floor = c
                .turnaround_ratio_to_floor
                .map_or("-".into(), |[min, p50]| format!("{min:.2}/{p50:.2}x"));
            println!(
                "{:<19} {:<17} {:>18} {:>8} {:>18} {:>12.0} {:>20} {:>12.1} {:>11.0} {:>13.0} {:>10.0} {:>7} {:>24} {:>13}",
                case,
                v.vmm,
                spread(&c.first_line_ms, 1),
                x_floor,
                spread(&c.done_ms, 1),
                c.guest_cycles_per_iter.median,
                spread(&c.wall_per_iter_us, 2),
                c.cpu_per_iter_us.median,
                c.peak_rss_kib.median,
                c.private_dirty_kib.median,
                c.rss_beyond_guest_kib.median,
                ratio,
                c.turnaround_ns.map_or("-".into(), |t| format!(
                    "{:.0}/{:.0}/{:.0}",
                    t.min, t.p50, t.p99
                )),
                turn_x_floor
            );
        }
    }
    print_device_table(report, &cases);
    print_backend_table(report, &cases);
    if let Some(rows) = &report.snapshot {
        crate::compare_snapshot::print(rows);
    }
    if let Some(rows) = &report.migrate {
        crate::compare_migrate::print(rows);
    }
    if let Some(note) = noise_note(report) {
        println!("{note}");
    }
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        println!(
            "note: this host's KVM is PVM: the kernel counts guest CPL3 time partly as the VMM's \
             user time, so cpu us/iter does not isolate a VMM's own work (guest time is in --json)"
        );
    }
}

fn print_case_header() {
    println!(
        "{:<19} {:<17} {:>18} {:>8} {:>18} {:>12} {:>20} {:>12} {:>11} {:>13} {:>10} {:>7} {:>24} {:>13}",
        "case",
        "vmm",
        "first line ms",
        "x floor",
        "done ms",
        "cycles/iter",
        "wall us/iter",
        "cpu us/iter",
        "peak RSS kB",
        "priv dirty kB",
        "beyond kB",
        "ratio",
        "turnaround ns min/p50/p99",
        "turn x floor"
    );
}

/// What was not measured, or not as asked: one line each.
fn print_left_out(report: &CompareReport) {
    if report.turnaround != "measured" {
        println!("turnaround per exit: not measured ({})", report.turnaround);
    }
    for why in &report.not_run {
        println!("not run: {why}");
    }
    for v in report.vmms.iter().filter(|v| v.failed.is_some()) {
        println!("{}: left out: {}", v.vmm, v.failed.as_deref().unwrap_or(""));
    }
    for v in &report.vmms {
        for why in &v.not_run {
            println!("{}: not run: {why}", v.vmm);
        }
        for why in &v.left_out {
            println!("{}: {why}", v.vmm);
        }
    }
}

/// Per request of the device cases: rate, exits, and the CPU all of a VMM's threads used.
fn print_device_table(report: &CompareReport, cases: &[compare::CaseFigures]) {
    let device_cases: Vec<&str> = cases
        .iter()
        .map(|c| c.case.as_str())
        .filter(|c| compare::peer::guest_case(c).2.is_some_and(|d| d.driven()))
        .collect();
    if device_cases.is_empty() {
        return;
    }
    println!("\nper request: median (min-max); userspace exits from tracefs, in-kernel exits: KVM's exits statistic less those");
    if let Some(why) = &report.kernel_exits_note {
        println!("kernel exits/req: {why}");
    }
    println!(
        "{:<19} {:<17} {:>26} {:>16} {:>16} {:>22}",
        "case", "vmm", "requests/s", "user exits/req", "kernel exits/req", "threads cpu us/req"
    );
    let opt = |s: &Option<Spread>| {
        s.as_ref()
            .map_or("-".to_string(), |s| format!("{:.3}", s.median))
    };
    for case in device_cases {
        for v in &report.vmms {
            let Some(c) = v.cases.iter().find(|c| c.case == case) else {
                continue;
            };
            println!(
                "{:<19} {:<17} {:>26} {:>16} {:>16} {:>22}",
                case,
                v.vmm,
                spread(&c.iters_per_s, 0),
                opt(&c.userspace_exits_per_iter),
                opt(&c.kernel_exits_per_iter),
                spread(&c.threads_cpu_per_iter_us, 2),
            );
        }
    }
}

/// Per request of the cases with a vhost-user back end: the VMM's threads, its back end's
/// (virtiofsd, qemu-storage-daemon), and both (what a request costs the host).
fn print_backend_table(report: &CompareReport, cases: &[compare::CaseFigures]) {
    let with_backend: Vec<&str> = cases
        .iter()
        .filter(|c| c.backend_cpu_per_iter_us.is_some())
        .map(|c| c.case.as_str())
        .collect();
    if with_backend.is_empty() {
        return;
    }
    println!(
        "\nCPU per request with the back end: median (min-max), each VMM's own virtiofsd \
         (fs) or qemu-storage-daemon (vhost_user_blk)"
    );
    println!(
        "{:<19} {:<17} {:>22} {:>22} {:>14}",
        "case", "vmm", "VMM threads us/req", "back end us/req", "sum of medians"
    );
    for case in with_backend {
        for v in &report.vmms {
            let Some(c) = v.cases.iter().find(|c| c.case == case) else {
                continue;
            };
            let Some(backend) = &c.backend_cpu_per_iter_us else {
                continue;
            };
            println!(
                "{:<19} {:<17} {:>22} {:>22} {:>14.2}",
                case,
                v.vmm,
                spread(&c.threads_cpu_per_iter_us, 2),
                spread(backend, 2),
                c.threads_cpu_per_iter_us.median + backend.median,
            );
        }
    }
}

/// Said under the table when start-up noise exceeded a loop's own time.
fn noise_note(report: &CompareReport) -> Option<String> {
    let noisy = report
        .vmms
        .iter()
        .flat_map(|v| v.cases.iter().map(move |c| (v.vmm, c)))
        .filter(|(_, c)| c.wall_per_iter_us.min <= 0.0)
        .map(|(vmm, c)| format!("{vmm}/{}", c.case))
        .collect::<Vec<_>>();
    (!noisy.is_empty()).then(|| {
        format!(
            "note: start-up varied more than the loop took ({}): raise --iterations for wall time per iteration",
            noisy.join(", ")
        )
    })
}

fn spread(s: &Spread, decimals: usize) -> String {
    format!(
        "{:.d$} ({:.d$}-{:.d$})",
        s.median,
        s.min,
        s.max,
        d = decimals
    )
}
