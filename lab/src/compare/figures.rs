//! From the runs to the report: each case's figures (medians and spreads of the difference
//! between a run of more iterations and one of fewer), and their ratios across VMMs.

use super::process::RunSample;
use super::turnaround;
use super::vmm_kind::VmmKind;
use super::{CaseFigures, CompareReport, Pair, Plan, Spread, Turnaround, VmmReport};

/// The report of a run's pairs: each VMM's figures per case, with their ratios to exitless and
/// to the floor; the caller adds the notes and the snapshot case.
pub(super) fn report(
    plan: &Plan,
    counts: [u64; 2],
    pairs: Vec<Vec<Vec<Pair>>>,
    failed: Vec<Option<String>>,
    tsc_khz: u64,
) -> CompareReport {
    let extra = (counts[1] - counts[0]).max(1) as f64;
    let mut vmms: Vec<VmmReport> = plan
        .vmms
        .iter()
        .zip(pairs)
        .zip(failed)
        .map(|((vmm, per_case), failed)| vmm_report(plan, vmm, per_case, failed, (extra, tsc_khz)))
        .collect();
    add_ratios(&mut vmms);
    CompareReport {
        schema: "exitless.compare/2",
        iterations: counts,
        rounds: plan.rounds,
        memory_mib: plan.memory_mib,
        turnaround: String::new(),
        tsc_khz,
        kernel_exits_note: None,
        not_run: Vec::new(),
        vmms,
        snapshot: None,
        migrate: None,
    }
}

/// One VMM's figures per case (`scale`: the extra iterations of a pair's longer run, and the
/// TSC's kHz), with what it could not run or ran without.
fn vmm_report(
    plan: &Plan,
    vmm: &super::Vmm,
    per_case: Vec<Vec<Pair>>,
    failed: Option<String>,
    scale: (f64, u64),
) -> VmmReport {
    let (extra, tsc_khz) = scale;
    VmmReport {
        vmm: vmm.kind.name(),
        path: vmm.path.clone(),
        failed,
        not_run: plan
            .cases
            .iter()
            .filter_map(|c| vmm.cannot_run(c).map(|why| format!("{c}: {why}")))
            .collect(),
        left_out: plan
            .cases
            .iter()
            .filter_map(|c| vmm.left_out(c).map(|why| format!("{c} without {why}")))
            .collect(),
        cases: plan
            .cases
            .iter()
            .zip(per_case)
            .filter(|(_, p)| !p.is_empty())
            .map(|(case, p)| figures(case, &p, extra, tsc_khz))
            .collect(),
    }
}

/// Each case's ratios: wall time to exitless's, first line and turnaround to the floor's.
fn add_ratios(vmms: &mut [VmmReport]) {
    let per_case = |vmm: Option<&VmmReport>, value: fn(&CaseFigures) -> f64| {
        vmm.map(|v| v.cases.iter().map(|c| (c.case.clone(), value(c))).collect())
            .unwrap_or_default()
    };
    let floor_report = vmms.iter().find(|v| v.vmm == VmmKind::Floor.name());
    let base: Vec<(String, f64)> = per_case(vmms.first(), |c| c.wall_per_iter_us.median);
    let floor: Vec<(String, f64)> = per_case(floor_report, |c| c.first_line_ms.median);
    let floor_turnaround: Vec<(String, Turnaround)> = floor_report
        .map(|f| {
            f.cases
                .iter()
                .filter_map(|c| Some((c.case.clone(), c.turnaround_ns?)))
                .collect()
        })
        .unwrap_or_default();
    let ratio = |to: &[(String, f64)], case: &str, value: f64| {
        to.iter()
            .find(|(c, _)| c == case)
            .filter(|(_, b)| *b > 0.0)
            .map(|(_, b)| value / b)
    };
    for c in vmms.iter_mut().flat_map(|v| v.cases.iter_mut()) {
        c.wall_ratio_to_exitless = ratio(&base, &c.case, c.wall_per_iter_us.median);
        c.first_line_ratio_to_floor = ratio(&floor, &c.case, c.first_line_ms.median);
        c.turnaround_ratio_to_floor = turnaround_ratio(&floor_turnaround, c);
    }
}

/// A case's turnaround (min, p50) over the floor's for the same case.
fn turnaround_ratio(floor: &[(String, Turnaround)], c: &CaseFigures) -> Option<[f64; 2]> {
    let t = c.turnaround_ns?;
    let (_, f) = floor.iter().find(|(case, _)| *case == c.case)?;
    (f.min > 0.0 && f.p50 > 0.0).then(|| [t.min / f.min, t.p50 / f.p50])
}

/// A run's time from the guest's first line to its end: firmware and process start-up (a
/// QEMU run's SeaBIOS varies by a second) left out.
fn loop_ms(s: &RunSample) -> f64 {
    s.done_ms - s.first_line_ms
}

/// All the VMM's threads' CPU from the guest's first line to its end, in ns.
fn loop_cpu_ns(s: &RunSample) -> f64 {
    s.threads_cpu_ns as f64 - s.threads_cpu_at_first_line_ns as f64
}

fn figures(case: &str, pairs: &[Pair], extra: f64, tsc_khz: u64) -> CaseFigures {
    let over = |f: &dyn Fn(&RunSample, &RunSample) -> f64| {
        Spread::of(
            &pairs
                .iter()
                .map(|(a, b)| f(&a.sample, &b.sample))
                .collect::<Vec<_>>(),
        )
    };
    let cpu = |s: &RunSample| s.cpu.user_ms + s.cpu.system_ms;
    let mut pooled: Vec<f64> = pairs
        .iter()
        .filter_map(|(_, b)| b.traced.as_ref().ok())
        .flat_map(|t| t.turnarounds_ns.iter().copied())
        .collect();
    let samples = pooled.len();
    let turnaround_note = pairs
        .iter()
        .find_map(|(a, b)| a.traced.as_ref().and(b.traced.as_ref()).err())
        .filter(|_| samples == 0)
        .cloned();
    let turnaround_ns = turnaround::percentiles(&mut pooled).map(|[min, p50, p99]| Turnaround {
        min,
        p50,
        p99,
        samples,
    });
    let user_exits = |(a, b): &Pair| -> Option<f64> {
        let (a, b) = (a.traced.as_ref().ok()?, b.traced.as_ref().ok()?);
        Some((b.userspace_exits as f64 - a.userspace_exits as f64) / extra)
    };
    let kvm_exits = |(a, b): &Pair| -> Option<f64> {
        let (a, b) = (*a.kvm_exits.as_ref().ok()?, *b.kvm_exits.as_ref().ok()?);
        Some((b as f64 - a as f64) / extra)
    };
    let per_pair = |f: &dyn Fn(&Pair) -> Option<f64>| -> Option<Spread> {
        let v: Option<Vec<f64>> = pairs.iter().map(f).collect();
        v.filter(|v| !v.is_empty()).map(|v| Spread::of(&v))
    };
    let hz = tsc_khz as f64 * 1e3;
    CaseFigures {
        case: case.to_string(),
        first_line_ms: over(&|a, b| a.first_line_ms.min(b.first_line_ms)),
        done_ms: over(&|_, b| b.done_ms),
        guest_cycles_per_iter: over(&|_, b| b.result.cycles as f64 / b.result.iters.max(1) as f64),
        wall_per_iter_us: over(&|a, b| (loop_ms(b) - loop_ms(a)) * 1e3 / extra),
        cpu_per_iter_us: over(&|a, b| (cpu(b) - cpu(a)) * 1e3 / extra),
        guest_cpu_per_iter_us: over(&|a, b| (b.cpu.guest_ms - a.cpu.guest_ms) * 1e3 / extra),
        peak_rss_kib: over(&|_, b| b.peak_rss_kib as f64),
        private_dirty_kib: over(&|_, b| b.private_dirty_kib as f64),
        rss_beyond_guest_kib: over(&|_, b| b.rss_beyond_guest_kib as f64),
        wall_ratio_to_exitless: None,
        first_line_ratio_to_floor: None,
        turnaround_ratio_to_floor: None,
        iters_per_s: over(&|_, b| hz * b.result.iters as f64 / b.result.cycles.max(1) as f64),
        threads_cpu_per_iter_us: over(&|a, b| (loop_cpu_ns(b) - loop_cpu_ns(a)) / 1e3 / extra),
        backend_cpu_per_iter_us: per_pair(&|(a, b)| {
            let (a, b) = (a.backend_cpu_ns?, b.backend_cpu_ns?);
            Some((b as f64 - a as f64) / 1e3 / extra)
        }),
        userspace_exits_per_iter: per_pair(&user_exits),
        kernel_exits_per_iter: per_pair(&|p| Some(kvm_exits(p)? - user_exits(p)?)),
        turnaround_ns,
        turnaround_note,
    }
}
