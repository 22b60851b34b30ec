//! The bench report: the results table, the derived figures (VMM and profiler overhead) and
//! the JSON document.

use std::fmt::Write as _;

use serde::Serialize;

use super::config_run::ConfigRun;
use super::fs;
use super::host::HostInfo;
use super::threads::ThreadsCpu;
use vmm::profile::{KvmStatDelta, ProfileReport};

/// Schema name of the JSON document.
pub const BENCH_SCHEMA: &str = "exitless.bench/1";

/// A configuration that could not be measured or broke its design.
#[derive(Debug, Clone, Serialize)]
pub struct BenchFailure {
    pub case: &'static str,
    pub config: &'static str,
    pub error: String,
}

/// One measured row with its ratio against the case's baseline.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    #[serde(flatten)]
    pub run: ConfigRun,
    /// ns/iteration of every round, in the order run (the row shows the median).
    pub round_ns: Vec<f64>,
    /// ns/iteration divided by the baseline configuration's (None for the baseline itself).
    pub ratio_to_baseline: Option<f64>,
    pub profile: ProfileReport,
}

/// Figures derived from several rows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Derived {
    /// Host ns from KVM_RUN returning to the next KVM_RUN per userspace exit (pio_out/userspace).
    pub vmm_overhead_ns_per_exit: Option<f64>,
    /// (profiler on - profiler off) / off in percent, median over interleaved paired rounds
    /// of the same userspace-exit loop.
    pub profiler_overhead_percent: Option<f64>,
    /// Smallest and largest paired-round difference: the run-to-run noise band.
    pub profiler_overhead_range_percent: Option<(f64, f64)>,
    /// Host ns the profiler adds per exit, measured directly (rdtsc x2, sched_getcpu, records).
    pub profiler_work_ns_per_exit: f64,
    /// That work as a share of one userspace exit of the profiler-off loop, in percent.
    pub profiler_work_percent_of_exit: Option<f64>,
}

/// Everything `exitless bench` found.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub schema: &'static str,
    pub host: HostInfo,
    pub iterations: u64,
    pub wall_seconds: f64,
    pub rows: Vec<BenchRow>,
    pub failures: Vec<BenchFailure>,
    /// Configurations this host or user cannot run (a tap needs root), with why: not errors.
    #[serde(default)]
    pub skipped: Vec<BenchFailure>,
    pub derived: Derived,
}

/// The exit profile of one run's measured loop.
pub fn run_profile(run: &ConfigRun, tsc_khz: u64) -> ProfileReport {
    let stats = KvmStatDelta::scoped("vcpu0", run.kvm_stats.clone()).collect();
    let seconds = run.ns_per_iter * run.iterations as f64 / 1e9;
    ProfileReport::new(
        vec![run.profile.clone()],
        run.io_devices.clone(),
        Vec::new(),
        stats,
        tsc_khz,
        seconds,
    )
}

/// Ratio of `run` against the baseline run of its case, when that baseline was measured.
pub fn ratio(run: &ConfigRun, baseline: Option<&ConfigRun>) -> Option<f64> {
    let b = baseline?;
    (b.config.name != run.config.name && b.ns_per_iter > 0.0)
        .then(|| run.ns_per_iter / b.ns_per_iter)
}

fn find<'a>(rows: &'a [BenchRow], case: &str, config: &str) -> Option<&'a BenchRow> {
    rows.iter()
        .find(|r| r.run.case == case && r.run.config.name == config)
}

/// Computes the derived figures from the rows that exist.
pub fn derive(rows: &[BenchRow], tsc_khz: u64) -> Derived {
    let to_ns = |cycles: f64| cycles * 1e6 / tsc_khz.max(1) as f64;
    let vmm = find(rows, "pio_out", "userspace")
        .and_then(|r| r.run.vmm_cycles_per_exit)
        .map(to_ns);
    let on = find(rows, "profiler", "profiler-on");
    let off = find(rows, "profiler", "profiler-off");
    let mut diffs: Vec<f64> = on
        .zip(off)
        .map(|(on, off)| {
            on.round_ns
                .iter()
                .zip(&off.round_ns)
                .filter(|(_, b)| **b > 0.0)
                .map(|(a, b)| (a - b) / b * 100.0)
                .collect()
        })
        .unwrap_or_default();
    diffs.sort_by(f64::total_cmp);
    let work = vmm::profile::per_exit_work_ns(1_000_000);
    Derived {
        vmm_overhead_ns_per_exit: vmm,
        profiler_overhead_percent: diffs.get(diffs.len() / 2).copied(),
        profiler_overhead_range_percent: diffs.first().zip(diffs.last()).map(|(a, b)| (*a, *b)),
        profiler_work_ns_per_exit: work,
        profiler_work_percent_of_exit: off
            .filter(|o| o.run.ns_per_iter > 0.0)
            .map(|o| work / o.run.ns_per_iter * 100.0),
    }
}

fn per_iter(count: Option<u64>, iters: u64) -> String {
    match count {
        Some(c) => format!("{:.3}", c as f64 / iters.max(1) as f64),
        None => "-".into(),
    }
}

/// The results table, one row per configuration, plus notes, failures and derived figures.
pub fn render_table(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:<20} {:>3} {:>12} {:>11} {:>10} {:>10} {:>8}",
        "case", "config", "cpl", "cycles/iter", "ns/iter", "user/iter", "kern/iter", "ratio"
    );
    for row in &report.rows {
        let r = &row.run;
        let ratio = row
            .ratio_to_baseline
            .map_or("base".into(), |x| format!("{x:.2}x"));
        let _ = writeln!(
            out,
            "{:<12} {:<20} {:>3} {:>12.0} {:>11.0} {:>10} {:>10} {:>8}",
            r.case,
            r.config.name,
            r.cpl,
            r.cycles_per_iter,
            r.ns_per_iter,
            per_iter(Some(r.user_exits), r.iterations),
            per_iter(r.kernel_exits, r.iterations),
            ratio
        );
    }
    render_notes(report, &mut out);
    out
}

fn render_notes(report: &BenchReport, out: &mut String) {
    for row in &report.rows {
        if let Some(v) = &row.run.virtio {
            let n = row.run.iterations.max(1) as f64;
            let _ = writeln!(
                out,
                "{}/{}: {:.0} {}/s ({:.1} MB/s); per {} {:.3} guest notifies, {:.3} interrupts",
                row.run.case,
                row.run.config.name,
                v.per_second,
                v.unit,
                v.mb_per_second,
                v.unit.trim_end_matches('s'),
                v.guest_notifies as f64 / n,
                v.interrupts as f64 / n
            );
        }
    }
    for row in &report.rows {
        if let Some(t) = &row.run.threads {
            render_threads(out, &row.run, t);
        }
    }
    render_design_checks(report, out);
    for row in &report.rows {
        for o in &row.run.observations {
            let _ = writeln!(out, "note: {}/{}: {o}", row.run.case, row.run.config.name);
        }
    }
    render_derived(&report.derived, out);
    render_skipped_and_failed(report, out);
}

/// The figures derived across rows: the VMM's overhead per exit, the profiler's cost.
fn render_derived(d: &Derived, out: &mut String) {
    if let Some(ns) = d.vmm_overhead_ns_per_exit {
        let _ = writeln!(
            out,
            "VMM overhead per userspace exit (KVM_RUN return to next KVM_RUN): {ns:.0} ns"
        );
    }
    if let (Some(p), Some((lo, hi))) = (
        d.profiler_overhead_percent,
        d.profiler_overhead_range_percent,
    ) {
        let _ = writeln!(
            out,
            "Exit profiler on vs off, userspace-exit loop: {p:+.2}% (median of paired rounds; \
             rounds ranged {lo:+.2}% to {hi:+.2}%)"
        );
    }
    if let Some(share) = d.profiler_work_percent_of_exit {
        let _ = writeln!(
            out,
            "Exit profiler work per exit, measured on the host: {:.0} ns = {share:.3}% of that exit",
            d.profiler_work_ns_per_exit
        );
    }
}

/// What did not run: skipped configurations (one line per reason) and failures.
fn render_skipped_and_failed(report: &BenchReport, out: &mut String) {
    // Configurations of a case skipped for one reason share a line.
    let mut skipped: Vec<(&str, Vec<&str>, &str)> = Vec::new();
    for f in &report.skipped {
        match skipped.last_mut() {
            Some((case, configs, why)) if *case == f.case && *why == f.error => {
                configs.push(f.config)
            }
            _ => skipped.push((f.case, vec![f.config], &f.error)),
        }
    }
    for (case, configs, why) in skipped {
        let _ = writeln!(out, "skipped: {case}/{}: {why}", configs.join(", "));
    }
    for f in &report.failures {
        let _ = writeln!(out, "ERROR: {}/{}: {}", f.case, f.config, f.error);
    }
}

/// Per request: userspace exits, devices-thread wake-ups and every thread's CPU time.
fn render_threads(out: &mut String, r: &ConfigRun, t: &ThreadsCpu) {
    let n = r.iterations.max(1) as f64;
    let us = |ns: u64| format!("{:.2}", ns as f64 / n / 1e3);
    let backend = t.backend_ns.map_or("-".into(), us);
    let wakeups = t
        .devices_wakeups
        .map_or("-".into(), |w| format!("{:.3}", w as f64 / n));
    let _ = writeln!(
        out,
        "{}/{}: per request {:.3} userspace exits, {wakeups} devices-thread wake-ups; CPU µs: \
         vCPU {} (guest included), devices {}, other exitless {}, back end {backend}",
        r.case,
        r.config.name,
        r.user_exits as f64 / n,
        us(t.vcpu_ns),
        us(t.devices_ns),
        us(t.other_ns),
    );
}

/// The design checks of the cases that state one (virtio_fs): PASS for each measured row,
/// FAIL with the reason for each configuration that broke it.
fn render_design_checks(report: &BenchReport, out: &mut String) {
    let checked = |case: &str| case == "virtio_fs";
    for row in report.rows.iter().filter(|r| checked(r.run.case)) {
        let (case, config) = (row.run.case, row.run.config.name);
        let _ = writeln!(out, "check: {case}/{config}: {}: PASS", fs::DESIGN);
    }
    for f in report.failures.iter().filter(|f| checked(f.case)) {
        let _ = writeln!(
            out,
            "check: {}/{}: {}: FAIL ({})",
            f.case,
            f.config,
            fs::DESIGN,
            f.error
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::cases::CASES;

    /// A plausible run of configuration `cfg` of case `case_idx` (100 iterations).
    pub(crate) fn run(case_idx: usize, cfg: usize, ns: f64, user: u64) -> ConfigRun {
        let case = &CASES[case_idx];
        ConfigRun {
            case: case.name,
            config: case.configs[cfg],
            cpl: 3,
            iterations: 100,
            cycles_per_iter: ns * 2.0,
            ns_per_iter: ns,
            user_exits: user,
            loop_host_tsc: (0, 0),
            kernel_exits: Some(0),
            kvm_stats: vec![("exits".into(), user)],
            ioeventfd_signals: None,
            vmm_cycles_per_exit: Some(2000.0),
            ipis: 0,
            uds: 0,
            io_devices: vec!["com1".into()],
            profile: vmm::profile::VcpuProfile::new(0, 1, 0).snapshot(),
            guest_output: String::new(),
            virtio: None,
            threads: None,
            problems: vec![],
            observations: vec![],
        }
    }

    fn row(r: ConfigRun, base: Option<&ConfigRun>) -> BenchRow {
        BenchRow {
            round_ns: vec![r.ns_per_iter],
            ratio_to_baseline: ratio(&r, base),
            profile: run_profile(&r, 2_000_000),
            run: r,
        }
    }

    fn pio_index() -> usize {
        CASES.iter().position(|c| c.name == "pio_out").unwrap()
    }

    #[test]
    fn ratio_is_against_the_baseline_and_none_for_it() {
        let p = pio_index();
        let base = run(p, 0, 30000.0, 100);
        let fast = run(p, 1, 3000.0, 0);
        assert_eq!(ratio(&base, Some(&base)), None);
        assert_eq!(ratio(&fast, Some(&base)), Some(0.1));
        assert_eq!(ratio(&fast, None), None);
    }

    #[test]
    fn table_has_a_row_per_run_with_exits_per_iteration_and_ratio() {
        let p = pio_index();
        let base = run(p, 0, 30000.0, 100);
        let fast = run(p, 1, 3000.0, 0);
        let rows = vec![row(base.clone(), Some(&base)), row(fast, Some(&base))];
        let report = BenchReport {
            schema: BENCH_SCHEMA,
            host: crate::bench::report::tests::host(),
            iterations: 100,
            wall_seconds: 1.0,
            derived: derive(&rows, 2_000_000),
            rows,
            failures: vec![BenchFailure {
                case: "cpuid",
                config: "in-kernel",
                error: "boom".into(),
            }],
            skipped: vec![],
        };
        let t = render_table(&report);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("case"));
        assert!(
            lines[1].contains("pio_out")
                && lines[1].contains("userspace")
                && lines[1].contains("1.000")
                && lines[1].ends_with("base")
        );
        assert!(
            lines[2].contains("ioeventfd")
                && lines[2].contains("0.000")
                && lines[2].ends_with("0.10x")
        );
        assert!(
            t.contains("VMM overhead per userspace exit (KVM_RUN return to next KVM_RUN): 1000 ns")
        );
        assert!(t.contains("ERROR: cpuid/in-kernel: boom"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["schema"], BENCH_SCHEMA);
        assert_eq!(json["rows"][1]["config"]["name"], "ioeventfd");
        assert_eq!(json["rows"][1]["user_exits"], 0);
        assert_eq!(json["rows"][0]["profile"]["schema"], "exitless.profile/1");
        assert_eq!(json["derived"]["vmm_overhead_ns_per_exit"], 1000.0);
    }

    pub(crate) fn host() -> HostInfo {
        HostInfo {
            hostname: "h".into(),
            kernel: "k".into(),
            cpu_model: "c".into(),
            host_cpus: 2,
            tsc_khz: 2_000_000,
            kvm_flavour: "kvm",
            capabilities: serde_json::from_str::<serde_json::Value>("{}")
                .map(|_| caps())
                .unwrap(),
            pv_features: vec![],
        }
    }

    fn caps() -> vmm::kvm::Capabilities {
        vmm::kvm::Capabilities {
            sync_regs: 7,
            ioeventfd: true,
            ioeventfd_any_length: true,
            coalesced_mmio: true,
            coalesced_pio: true,
            irqchip: true,
            split_irqchip: true,
            immediate_exit: true,
            binary_stats_fd: true,
            disable_quirks2: true,
            x86_disable_exits: 0,
            max_vcpus: 8,
        }
    }
}
