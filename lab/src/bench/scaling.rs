//! The multi-VM scaling bench: one configuration run in 1, 2, ... N VMs at once (one vCPU
//! each), with every vCPU pinned to its own host CPU and again left to the scheduler. A VMM
//! whose exit path shares nothing between VMs scales linearly until the host CPUs run out;
//! pinning keeps each VM, and the TLB shootdowns it causes, on the CPUs it was given.

use std::fmt::Write as _;
use std::sync::Barrier;
use std::thread;
use std::time::Instant;

use serde::Serialize;

use super::cases::{BenchCase, CaseConfig};
use super::config_run::ConfigRun;
use super::host::{self, HostInfo};
use super::report::BenchFailure;
use super::runner::{run_config_placed, Placement};
use super::BenchError;
use vmm::vcpu::affinity;

/// Value of the `"schema"` key of the scaling JSON document.
pub const SCALING_SCHEMA: &str = "exitless.scaling/1";
/// The most VMs `--scaling` accepts.
pub const MAX_VMS: usize = 64;
/// Rounds per point; the round with the median total rate is kept.
const ROUNDS: usize = 3;

/// One VM of a point.
#[derive(Debug, Clone, Serialize)]
pub struct VmRun {
    pub ns_per_iter: f64,
    /// Host CPUs its vCPU thread ran on.
    pub host_cpus: Vec<usize>,
}

/// `vms` VMs running the same loop at once.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingPoint {
    pub vms: usize,
    /// Whether VM i's vCPU was pinned to allowed host CPU i (modulo their number).
    pub pinned: bool,
    pub runs: Vec<VmRun>,
    /// Loop iterations per second of all VMs together (the sum of their rates).
    pub iterations_per_second: f64,
    /// The total rate over `vms` times the one-VM rate of the same placement (1.0 = linear).
    pub efficiency: f64,
    /// Share of the loops' combined span (host time) during which all of them ran.
    pub overlap: f64,
}

/// One configuration's points, pinned then unpinned, by VM count.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingSeries {
    pub case: &'static str,
    pub config: &'static str,
    pub points: Vec<ScalingPoint>,
}

/// Everything `exitless bench --scaling` measured.
#[derive(Debug, Serialize)]
pub struct ScalingReport {
    pub schema: &'static str,
    pub host: HostInfo,
    pub iterations: u64,
    pub max_vms: usize,
    /// Host CPUs pinned vCPUs were spread over.
    pub allowed_cpus: Vec<usize>,
    pub wall_seconds: f64,
    pub series: Vec<ScalingSeries>,
    pub failures: Vec<BenchFailure>,
}

/// Checks a `--scaling` VM count.
pub fn check_vms(n: usize) -> Result<usize, BenchError> {
    if (1..=MAX_VMS).contains(&n) {
        Ok(n)
    } else {
        Err(BenchError::Vms(n))
    }
}

/// Runs every configuration of `cases` in 1..=`max_vms` VMs, pinned and unpinned.
pub fn run_scaling(
    cases: &[&'static BenchCase],
    iterations: u64,
    max_vms: usize,
    mut progress: impl FnMut(&str),
) -> Result<ScalingReport, BenchError> {
    let host = host::probe()?;
    let allowed = affinity::allowed_cpus().map_err(BenchError::Affinity)?;
    let start = Instant::now();
    let (mut series, mut failures) = (Vec::new(), Vec::new());
    for case in cases {
        for config in case.configs {
            let mut points = Vec::new();
            let measured = [true, false].into_iter().try_for_each(|pinned| {
                let cpus = pinned.then_some(allowed.as_slice());
                for vms in 1..=max_vms {
                    let label = format!(
                        "{}/{} x{vms} {}",
                        case.name,
                        config.name,
                        placement_name(pinned)
                    );
                    progress(&format!("{label} ..."));
                    let job = PointJob {
                        case,
                        config,
                        iterations,
                        tsc_khz: host.tsc_khz,
                        vms,
                        cpus,
                    };
                    let runs = job.median_round()?;
                    let point = point(vms, pinned, &runs);
                    progress(&format!(
                        "{label}: {:.0} iterations/s",
                        point.iterations_per_second
                    ));
                    points.push(point);
                }
                Ok(())
            });
            match measured {
                Ok(()) => series.push(ScalingSeries {
                    case: case.name,
                    config: config.name,
                    points: with_efficiency(points),
                }),
                Err(error) => failures.push(BenchFailure {
                    case: case.name,
                    config: config.name,
                    error,
                }),
            }
        }
    }
    Ok(ScalingReport {
        schema: SCALING_SCHEMA,
        host,
        iterations,
        max_vms,
        allowed_cpus: allowed,
        wall_seconds: start.elapsed().as_secs_f64(),
        series,
        failures,
    })
}

fn placement_name(pinned: bool) -> &'static str {
    if pinned {
        "pinned"
    } else {
        "unpinned"
    }
}

/// One point to measure: `vms` VMs running `config` of `case` at once, VM i pinned to
/// `cpus[i % len]` when given.
struct PointJob<'a> {
    case: &'static BenchCase,
    config: &'a CaseConfig,
    iterations: u64,
    tsc_khz: u64,
    vms: usize,
    cpus: Option<&'a [usize]>,
}

impl PointJob<'_> {
    /// Runs the point [`ROUNDS`] times and keeps the round with the median total rate.
    fn median_round(&self) -> Result<Vec<ConfigRun>, String> {
        let mut rounds = (0..ROUNDS)
            .map(|_| self.run_together())
            .collect::<Result<Vec<_>, _>>()?;
        rounds.sort_by(|a, b| total_rate(a).total_cmp(&total_rate(b)));
        Ok(rounds.swap_remove(ROUNDS / 2))
    }

    /// Runs the VMs once, together. Any VM that fails, or breaks its configuration's design,
    /// fails the whole point.
    fn run_together(&self) -> Result<Vec<ConfigRun>, String> {
        let PointJob {
            case,
            config,
            iterations,
            tsc_khz,
            vms,
            cpus,
        } = *self;
        let barrier = Barrier::new(vms);
        let results = thread::scope(|scope| {
            let handles: Vec<_> = (0..vms)
                .map(|i| {
                    let placement = Placement {
                        cpu: cpus.map(|c| c[i % c.len()]),
                        start_together: Some(&barrier),
                    };
                    scope.spawn(move || {
                        run_config_placed(case, config, iterations, tsc_khz, placement)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(thread::ScopedJoinHandle::join)
                .collect::<Vec<_>>()
        });
        let mut runs = Vec::with_capacity(vms);
        for (i, result) in results.into_iter().enumerate() {
            match result {
                Ok(Ok(run)) if run.problems.is_empty() => runs.push(run),
                Ok(Ok(run)) => return Err(format!("VM {i}: {}", run.problems.join("; "))),
                Ok(Err(e)) => return Err(format!("VM {i}: {e}")),
                Err(_) => return Err(format!("VM {i}: its thread panicked")),
            }
        }
        Ok(runs)
    }
}

fn rate(ns_per_iter: f64) -> f64 {
    if ns_per_iter > 0.0 {
        1e9 / ns_per_iter
    } else {
        0.0
    }
}

fn total_rate(runs: &[ConfigRun]) -> f64 {
    runs.iter().map(|r| rate(r.ns_per_iter)).sum()
}

/// Share of the union of `spans` covered by their intersection (1.0 for a single span).
fn overlap(spans: &[(u64, u64)]) -> f64 {
    let first_begin = spans.iter().map(|s| s.0).min().unwrap_or(0);
    let last_begin = spans.iter().map(|s| s.0).max().unwrap_or(0);
    let first_end = spans.iter().map(|s| s.1).min().unwrap_or(0);
    let last_end = spans.iter().map(|s| s.1).max().unwrap_or(0);
    let union = last_end.saturating_sub(first_begin);
    if union == 0 {
        return 0.0;
    }
    first_end.saturating_sub(last_begin) as f64 / union as f64
}

fn point(vms: usize, pinned: bool, runs: &[ConfigRun]) -> ScalingPoint {
    let spans: Vec<(u64, u64)> = runs.iter().map(|r| r.loop_host_tsc).collect();
    ScalingPoint {
        vms,
        pinned,
        runs: runs
            .iter()
            .map(|r| VmRun {
                ns_per_iter: r.ns_per_iter,
                host_cpus: r.profile.host_cpus.clone(),
            })
            .collect(),
        iterations_per_second: total_rate(runs),
        efficiency: 0.0,
        overlap: overlap(&spans),
    }
}

/// Fills in each point's efficiency against the one-VM point of the same placement.
fn with_efficiency(mut points: Vec<ScalingPoint>) -> Vec<ScalingPoint> {
    let single = |pinned: bool, points: &[ScalingPoint]| {
        points
            .iter()
            .find(|p| p.pinned == pinned && p.vms == 1)
            .map(|p| p.iterations_per_second)
    };
    let singles = [single(false, &points), single(true, &points)];
    for p in &mut points {
        if let Some(one) = singles[usize::from(p.pinned)].filter(|one| *one > 0.0) {
            p.efficiency = p.iterations_per_second / (p.vms as f64 * one);
        }
    }
    points
}

/// The scaling table, one row per point, then failures.
pub fn render_scaling(report: &ScalingReport) -> String {
    let mut out = String::new();
    let cpus: Vec<String> = report.allowed_cpus.iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "Multi-VM scaling: one vCPU per VM, {} iterations each; pinned = VM i on host CPU i of \
         [{}] (modulo); efficiency = all VMs' rate / (VMs x one VM's rate)",
        report.iterations,
        cpus.join(",")
    );
    let _ = writeln!(
        out,
        "{:<11} {:<20} {:<9} {:>3} {:>11} {:>11} {:>12} {:>10} {:>8}  host CPUs",
        "case", "config", "placement", "vms", "ns/iter", "worst", "iter/s", "efficiency", "overlap"
    );
    for s in &report.series {
        for p in &s.points {
            write_point(&mut out, s, p);
        }
    }
    for f in &report.failures {
        let _ = writeln!(out, "ERROR: {}/{}: {}", f.case, f.config, f.error);
    }
    out
}

fn write_point(out: &mut String, s: &ScalingSeries, p: &ScalingPoint) {
    let ns: Vec<f64> = p.runs.iter().map(|r| r.ns_per_iter).collect();
    let mean = ns.iter().sum::<f64>() / ns.len().max(1) as f64;
    let worst = ns.iter().copied().fold(0.0, f64::max);
    let cpus: Vec<String> = p
        .runs
        .iter()
        .map(|r| {
            let list: Vec<String> = r.host_cpus.iter().map(usize::to_string).collect();
            list.join(",")
        })
        .collect();
    let _ = writeln!(
        out,
        "{:<11} {:<20} {:<9} {:>3} {:>11.0} {:>11.0} {:>12.0} {:>10.2} {:>7.0}%  {}",
        s.case,
        s.config,
        placement_name(p.pinned),
        p.vms,
        mean,
        worst,
        p.iterations_per_second,
        p.efficiency,
        p.overlap * 100.0,
        cpus.join(" | ")
    );
}

#[cfg(test)]
#[path = "scaling_tests.rs"]
mod tests;
