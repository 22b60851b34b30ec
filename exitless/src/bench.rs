//! `exitless bench`: the exit lab.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use exitless_lab::bench::{
    self, ablation, dirty, guest::BENCH_GUEST, ipi, ipi_table, report, scaling,
};

use crate::output_file::{ensure_writable, write_json};

/// Measure what each kind of VM exit costs here, and what each exit-avoiding technique saves.
///
/// Every case runs in fresh VMs booted from the embedded bench guest (a PVH ELF), once per
/// configuration; the first configuration of a case is its baseline. Results are checked
/// against each configuration's design (e.g. an ioeventfd case must make no userspace exits)
/// and reported as errors when they disagree.
#[derive(Args)]
pub struct BenchArgs {
    /// Comma-separated cases to run [default: all]. See --list.
    #[arg(long, value_delimiter = ',')]
    cases: Vec<String>,
    /// Loop iterations per configuration (1 to 10000000) [default: 5000; 200 with --ipi].
    #[arg(long)]
    iterations: Option<u64>,
    /// Also write the results, host metadata and per-case exit profiles as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Print the exit profile (perf kvm stat style) of every configuration's measured loop.
    #[arg(long)]
    profile: bool,
    /// Write the embedded bench guest ELF to FILE and exit (boot it with e.g.
    /// `qemu-system-x86_64 -kernel FILE -serial stdio -display none -device
    /// isa-debug-exit,iobase=0xf4,iosize=4`).
    #[arg(long, value_name = "FILE")]
    export_guest: Option<PathBuf>,
    /// Write the floor VMM (the least a KVM VMM must do to run the bench guest, which
    /// `compare` runs beside the others; docs/performance.md, "The floor") into DIR as DIR/floor
    /// and exit. Run it as `floor [--timing] [--small-cpuid] KERNEL CMDLINE MEMORY_MIB`;
    /// --timing prints its steps as `run --timing` does.
    #[arg(long, value_name = "DIR")]
    export_floor: Option<PathBuf>,
    /// List the cases and their configurations, then exit.
    #[arg(long)]
    list: bool,
    /// Run the host-side false-sharing micro-benchmark (counters in one cache line vs padded).
    #[arg(long)]
    false_sharing: bool,
    /// Multi-VM scaling: run each configuration in 1, 2, ... N VMs at once (one vCPU each),
    /// pinned to distinct host CPUs and unpinned, and report how the total rate scales
    /// (1 to 64; --cases defaults to pio_out here).
    #[arg(long, value_name = "N", conflicts_with = "profile")]
    scaling: Option<usize>,
    /// IPIs and TLB shootdowns: run the IPI family (--cases picks among its cases) in VMs of
    /// 1, 2, 4 ... N vCPUs (N at most 8 and 4 per host CPU), pinned to two host CPUs and
    /// floating, and report the cost per IPI and per shootdown, exits per operation and the
    /// host CPUs each vCPU ran on.
    #[arg(long, value_name = "N", conflicts_with_all = ["profile", "scaling"])]
    ipi: Option<usize>,
    /// The exit path's cost, attributed: the bench guest's pio_out loop on a bare KVM_RUN
    /// loop, then with exitless's exit-path ingredients (seccomp filter, kick, sync regs,
    /// profiler, bus, per-exit checks, pinning) each alone and cumulatively, beside the floor
    /// VMM; turnaround per exit through tracefs (root), else the TSC around KVM_RUN.
    /// --iterations is the exits per row (default 2000, over 5 interleaved rounds); --cases
    /// picks the loop: pio_out_cpl0 (default) or pio_out (CPL3).
    #[arg(long, conflicts_with_all = ["profile", "scaling", "ipi"])]
    ablation: bool,
    /// Dirty tracking: what a guest's first write to a page costs with tracking off, with
    /// KVM's bitmap and with KVM's dirty ring (where KVM offers it), in guest cycles per page
    /// over PAGES pages (default 8192) written at CPL3 between harvests, and the ring-full
    /// exits it causes. --iterations is the rounds (2 to 64, default 8; the first faults
    /// the pages in)
    #[arg(long, value_name = "PAGES", num_args = 0..=1, default_missing_value = "8192",
          conflicts_with_all = ["profile", "scaling", "ipi", "ablation"])]
    dirty: Option<u64>,
    #[command(flatten)]
    pub vm: crate::options::VmOptions,
}

pub fn main(args: BenchArgs) -> anyhow::Result<i32> {
    if let Some(path) = &args.export_guest {
        std::fs::write(path, BENCH_GUEST)
            .with_context(|| format!("Cannot write {}", path.display()))?;
        eprintln!(
            "exitless: wrote the bench guest ({} bytes) to {}",
            BENCH_GUEST.len(),
            path.display()
        );
        return Ok(0);
    }
    if let Some(dir) = &args.export_floor {
        let path = exitless_lab::compare::floor::write_into(dir)
            .with_context(|| format!("Cannot write the floor VMM into {}", dir.display()))?;
        eprintln!("exitless: wrote the floor VMM to {}", path.display());
        return Ok(0);
    }
    if args.list {
        print_cases();
        return Ok(0);
    }
    if args.false_sharing {
        let r = vmm::profile::run_false_sharing_benchmark(50_000_000);
        println!("{}", r.render());
        return Ok(0);
    }
    if let Some(path) = &args.json {
        ensure_writable("--json", path)?;
    }
    if let Some(vms) = args.scaling {
        return scaling(&args, vms);
    }
    if let Some(vcpus) = args.ipi {
        return ipi_family(&args, vcpus);
    }
    if args.ablation {
        return exit_ablation(&args);
    }
    if let Some(pages) = args.dirty {
        return dirty_family(&args, pages);
    }
    let cases = bench::select(&args.cases)?;
    let iterations = bench::check_iterations(args.iterations.unwrap_or(bench::DEFAULT_ITERATIONS))?;
    let report = bench::run(&cases, iterations, |line| eprintln!("{line}"))?;
    print!("{}", report::render_table(&report));
    if args.cases.is_empty() {
        // The default run's guard on the exit path: its headline, short.
        let plan = ablation::AblationPlan::headline();
        match ablation::run_ablation(&plan, report.host.tsc_khz, |_| {}) {
            Ok(a) => println!("{}", a.headline()),
            Err(e) => println!("exit path: the ablation's headline did not run: {e}"),
        }
    }
    if args.profile {
        for row in &report.rows {
            println!("\n== {}/{} ==", row.run.case, row.run.config.name);
            print!("{}", row.profile.render_table(false));
        }
    }
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(if report.failures.is_empty() { 0 } else { 2 })
}

fn exit_ablation(args: &BenchArgs) -> anyhow::Result<i32> {
    let iterations = args.iterations.unwrap_or(ablation::DEFAULT_ITERATIONS);
    let iterations = bench::check_iterations(iterations)?;
    let mut plan = ablation::AblationPlan::full(iterations, ablation::DEFAULT_ROUNDS);
    match args.cases.as_slice() {
        [] => {}
        [case] => {
            plan.case = ablation::CASES
                .into_iter()
                .find(|c| c == case)
                .with_context(|| format!("--ablation runs one of {}", ablation::CASES.join(", ")))?
        }
        _ => anyhow::bail!("--ablation runs one case: {}", ablation::CASES.join(", ")),
    }
    let tsc_khz = vmm::profile::estimate_tsc_khz(std::time::Duration::from_millis(100));
    let report = ablation::run_ablation(&plan, tsc_khz, |line| eprintln!("{line}"))?;
    print!("{}", report.render());
    println!("{}", report.headline());
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(0)
}

fn scaling(args: &BenchArgs, vms: usize) -> anyhow::Result<i32> {
    let vms = scaling::check_vms(vms)?;
    let names = if args.cases.is_empty() {
        vec!["pio_out".to_string()]
    } else {
        args.cases.clone()
    };
    let cases = bench::select(&names)?;
    let iterations = bench::check_iterations(args.iterations.unwrap_or(bench::DEFAULT_ITERATIONS))?;
    let report = scaling::run_scaling(&cases, iterations, vms, |line| eprintln!("{line}"))?;
    print!("{}", scaling::render_scaling(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(if report.failures.is_empty() { 0 } else { 2 })
}

fn ipi_family(args: &BenchArgs, vcpus: usize) -> anyhow::Result<i32> {
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let counts = ipi::vcpu_counts(vcpus, host_cpus)?;
    let cases = ipi::select(&args.cases)?;
    let iterations = bench::check_iterations(args.iterations.unwrap_or(ipi::DEFAULT_ITERATIONS))?;
    let report = ipi::run_ipi(&cases, iterations, &counts, |line| eprintln!("{line}"))?;
    print!("{}", ipi_table::render_ipi(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(if report.failures.is_empty() { 0 } else { 2 })
}

fn dirty_family(args: &BenchArgs, pages: u64) -> anyhow::Result<i32> {
    let rounds = args.iterations.unwrap_or(dirty::DEFAULT_ROUNDS);
    if !(2..=64).contains(&rounds) || !(1..=16384).contains(&pages) {
        anyhow::bail!("--dirty takes 1 to 16384 pages and --iterations 2 to 64 rounds");
    }
    let ways = dirty::ways_here()?;
    let rows = dirty::run_dirty(&ways, (pages, rounds), |line| eprintln!("{line}"))?;
    print!("{}", dirty::render_dirty(&rows));
    if let Some(path) = &args.json {
        write_json(path, &rows)?;
    }
    Ok(0)
}

fn print_cases() {
    for case in exitless_lab::bench::cases::CASES {
        let configs: Vec<&str> = case.configs.iter().map(|c| c.name).collect();
        println!(
            "{:<11} {}\n{:<11} configs: {}",
            case.name,
            case.what,
            "",
            configs.join(", ")
        );
    }
    for case in ipi::IPI_CASES {
        println!("{:<22} {}\n{:<22} (with --ipi N)", case.name, case.what, "");
    }
}
