//! The IPI family's table: one row per point with its growth against the fewest vCPUs, the
//! exits per operation and the host CPUs each vCPU ran on, then skips and failures.

use std::fmt::Write as _;

use super::ipi::{stat_per_op, IpiPoint, IpiReport};

fn cpu_sets(sets: &[Vec<usize>]) -> String {
    sets.iter()
        .map(|s| s.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The top exits per operation, largest first, as `name=x.xx`.
fn top_exits(point: &IpiPoint, count: usize) -> String {
    let mut exits: Vec<(&String, &f64)> = point
        .exits_per_op
        .iter()
        .filter(|(n, _)| *n != "exits")
        .collect();
    exits.sort_by(|a, b| b.1.total_cmp(a.1));
    exits
        .iter()
        .take(count)
        .map(|(n, v)| format!("{n}={v:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn exits_total(point: &IpiPoint) -> f64 {
    stat_per_op(point, "exits")
}

/// One line on the emulated CPL0 code, when the points show it (PVM).
fn emulation_note(out: &mut String, report: &IpiReport) {
    let emulated: Vec<f64> = report
        .points
        .iter()
        .map(|p| stat_per_op(p, "insn_emulation"))
        .filter(|n| *n > 0.0)
        .collect();
    let lo = emulated.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = emulated.iter().copied().fold(0.0, f64::max);
    if hi > 100.0 {
        let _ = writeln!(
            out,
            "note: {lo:.0} to {hi:.0} instructions emulated per operation (insn_emulation): the \
             initiator's loop and waits and the handlers run at guest CPL0, which this host's KVM \
             (PVM) emulates one instruction at a time; an interrupt for a vCPU spinning there \
             waits for its next guest entry"
        );
    }
}

/// The IPI table: one row per point, growth against one vCPU, then skips and failures.
pub fn render_ipi(report: &IpiReport) -> String {
    let mut out = String::new();
    let pinned: Vec<String> = report.pinned_cpus.iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "IPIs and TLB shootdowns: {} operations per point, vCPU 0 initiating; pinned = vCPU i on \
         host CPU i of [{}] (modulo); host has {} CPUs; x1 = the same case's 1-vCPU (or smallest) \
         point of the same placement",
        report.iterations,
        pinned.join(","),
        report.host.host_cpus
    );
    if let Some(probe) = &report.guest_probe {
        let _ = writeln!(
            out,
            "guest sees: {probe}; host KVM PV features: {}",
            report.host.pv_features.join(" ")
        );
    }
    let _ = writeln!(
        out,
        "{:<23} {:>5} {:<8} {:>7} {:>11} {:>11} {:>6} {:>9} {:>8}  ran on (per vCPU) / exits per op",
        "case", "vcpus", "place", "targets", "ns/op", "cycles/op", "x1", "exits/op", "skipped"
    );
    for p in &report.points {
        write_point(&mut out, report, p);
    }
    emulation_note(&mut out, report);
    for p in &report.points {
        for o in &p.observations {
            let _ = writeln!(
                out,
                "note: {}/{} vCPUs/{}: {o}",
                p.case,
                p.vcpus,
                p.placement.name()
            );
        }
    }
    for s in &report.skipped {
        let _ = writeln!(
            out,
            "skipped: {}/{} vCPUs/{}: {}",
            s.case,
            s.vcpus,
            s.placement.name(),
            s.reason
        );
    }
    for f in &report.failures {
        let _ = writeln!(
            out,
            "ERROR: {}/{} vCPUs/{}: {}",
            f.case,
            f.vcpus,
            f.placement.name(),
            f.error
        );
    }
    out
}

fn write_point(out: &mut String, report: &IpiReport, p: &IpiPoint) {
    let base = report
        .points
        .iter()
        .filter(|q| q.case == p.case && q.placement == p.placement)
        .min_by_key(|q| q.vcpus)
        .map_or(0.0, |q| q.wall_ns_per_op);
    let growth = if base > 0.0 {
        format!("{:.1}x", p.wall_ns_per_op / base)
    } else {
        "-".into()
    };
    let _ = writeln!(
        out,
        "{:<23} {:>5} {:<8} {:>7} {:>11.0} {:>11.0} {:>6} {:>9.2} {:>8}  {}",
        p.case,
        p.vcpus,
        p.placement.name(),
        p.targets,
        p.wall_ns_per_op,
        p.cycles_per_op,
        growth,
        exits_total(p),
        p.skips.iter().sum::<u64>(),
        cpu_sets(&p.host_cpus)
    );
    let _ = writeln!(
        out,
        "{:<23} {:>5} {:<8} user={:.2} {}",
        "",
        "",
        "",
        p.user_exits_per_op,
        top_exits(p, 5)
    );
}
