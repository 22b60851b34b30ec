//! `exitless compare --density N[,N...]`: many VMs of each VMM at once (see
//! exitless_lab::compare::density), the table and how the figures stand against exitless's goals.

use std::time::Duration;

use exitless_lab::compare::density::{self, DensityPlan, DensityReport, DensityRun};
use exitless_lab::compare::{CompareError, Plan};

/// The density plan for the VMMs, guest and folder of `plan`.
pub fn plan(plan: &Plan, counts: &[usize], idle_secs: u64) -> DensityPlan {
    DensityPlan {
        vmms: plan.vmms.clone(),
        counts: counts.to_vec(),
        memory_mib: plan.memory_mib,
        idle: Duration::from_secs(idle_secs),
        limit: plan.limit,
        guest: plan.guest.clone(),
        workdir: plan.workdir.clone(),
    }
}

pub fn run(plan: &DensityPlan) -> Result<DensityReport, CompareError> {
    density::run(
        plan,
        |step| eprintln!("[compare] {step}"),
        || vmm::launch::stop_signal().is_some(),
    )
}

/// The table, one row per VMM and N, then the goals.
pub fn print(report: &DensityReport) {
    println!(
        "density: N VMs of each VMM started at once, the bench guest's idle case, {} MiB and \
         1 vCPU each; idle watched {:.0} s; per-VM medians, (the N-th VM spawned / the first)",
        report.memory_mib, report.idle_s
    );
    for why in &report.not_run {
        println!("not run: {why}");
    }
    println!(
        "{:<17} {:>4} {:<12} {:>12} {:>18} {:>13} {:>22} {:>12} {:>9} {:>11} {:>14} {:>12}",
        "vmm",
        "N",
        "started by",
        "all up ms",
        "start ms",
        "start cpu ms",
        "priv dirty kB",
        "peak RSS kB",
        "Pss kB",
        "host kB/VM",
        "idle cpu us/s",
        "wake-ups/s"
    );
    for r in &report.runs {
        if let Some(why) = &r.failed {
            println!("{:<17} {:>4} failed: {why}", r.vmm, r.n);
            continue;
        }
        let s = &r.summary;
        let nth = |v: Option<f64>| v.map_or(String::new(), |x| format!(" ({x:.2}x)"));
        println!(
            "{:<17} {:>4} {:<12} {:>12.1} {:>18} {:>13.2} {:>22} {:>12.0} {:>9.0} {:>11.0} {:>14.1} \
             {:>12.2}",
            r.vmm,
            r.n,
            r.started_through,
            r.all_started_ms,
            format!("{:.2}{}", s.start_ms.median, nth(s.nth_over_first.start)),
            s.start_cpu_ms.median,
            format!(
                "{:.0}{}",
                s.private_dirty_kib.median,
                nth(s.nth_over_first.private_dirty)
            ),
            s.peak_rss_kib.median,
            s.pss_kib.median,
            r.host_kib_per_vm,
            s.idle_cpu_us_per_s.median,
            s.idle_wakeups_per_s.median,
        );
    }
    print_wakers(report);
    for line in goals(report) {
        println!("{line}");
    }
}

/// Which threads woke, where any did.
fn print_wakers(report: &DensityReport) {
    for r in report.runs.iter().filter(|r| r.failed.is_none()) {
        let wakers: Vec<String> = r
            .wakeups_per_s_by_thread
            .iter()
            .filter(|(_, per_s)| **per_s > 0.0)
            .map(|(name, per_s)| format!("{name} {:.1}", per_s / r.n as f64))
            .collect();
        if !wakers.is_empty() {
            println!(
                "wake-ups/s per VM by thread, {} N={}: {}",
                r.vmm,
                r.n,
                wakers.join(", ")
            );
        }
    }
}

fn run_of<'a>(report: &'a DensityReport, vmm: &str, n: usize) -> Option<&'a DensityRun> {
    report
        .runs
        .iter()
        .find(|r| r.vmm == vmm && r.n == n && r.failed.is_none())
}

/// exitless against the density goals: private dirty at most 0.8x Firecracker's at every N,
/// all started in at most 0.5x Cloud Hypervisor's time at N=64 (the largest N run) and 1.3x
/// the floor's at N=32, each start at most 1.1x the floor's (the CPU it cost beside), idle
/// VMs 0 wake-ups per second of exitless's own threads.
fn goals(report: &DensityReport) -> Vec<String> {
    let ratio = |peer: &str, n: usize, f: fn(&DensityRun) -> f64| {
        let (e, p) = (run_of(report, "exitless", n)?, run_of(report, peer, n)?);
        Some(f(e) / f(p)).filter(|r| r.is_finite())
    };
    let per_n = |peer: &str, f: fn(&DensityRun) -> f64| -> String {
        let shown: Vec<String> = report
            .counts
            .iter()
            .filter_map(|&n| ratio(peer, n, f).map(|r| format!("{r:.2}x at N={n}")))
            .collect();
        match shown.is_empty() {
            true => format!("no {peer} runs to compare with"),
            false => shown.join(", "),
        }
    };
    let dirty = |r: &DensityRun| r.summary.private_dirty_kib.median;
    let all_up = |r: &DensityRun| r.all_started_ms;
    let start = |r: &DensityRun| r.summary.start_ms.median;
    let start_cpu = |r: &DensityRun| r.summary.start_cpu_ms.median;
    let wakeups: Vec<String> = report
        .runs
        .iter()
        .filter(|r| r.vmm == "exitless" && r.failed.is_none())
        .map(|r| format!("{:.2} at N={}", r.summary.idle_wakeups_per_s.max, r.n))
        .collect();
    vec![
        "goals (exitless):".to_string(),
        format!(
            "  private dirty per VM vs firecracker (<= 0.8x): {}",
            per_n("firecracker", dirty)
        ),
        format!(
            "  all N up vs cloud-hypervisor (<= 0.5x at N=64): {}",
            per_n("cloud-hypervisor", all_up)
        ),
        format!(
            "  all N up vs the floor (<= 1.3x at N=32): {}",
            per_n("floor", all_up)
        ),
        format!(
            "  spawn to first line vs the floor (<= 1.1x, medians): {}",
            per_n("floor", start)
        ),
        format!(
            "  CPU per start vs the floor (medians): {}",
            per_n("floor", start_cpu)
        ),
        format!(
            "  wake-ups per second of an idle VM's own threads, most of any VM (0): {}",
            match wakeups.is_empty() {
                true => "no exitless runs".to_string(),
                false => wakeups.join(", "),
            }
        ),
    ]
}
