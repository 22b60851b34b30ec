//! The exit lab: `exitless bench` runs each case's configurations in fresh VMs and reports
//! what every exit kind costs and what each exit-avoiding technique saves.

pub mod blk;
pub mod cases;
pub mod guest;
pub mod host;
pub mod net;
pub mod report;
pub mod result;
pub mod runner;
pub mod scaling;
pub mod virtio;
pub mod vsock;

#[cfg(test)]
mod coalesced_smp_tests;

use std::time::Instant;

use thiserror::Error;

use cases::{BenchCase, CASES};
use report::{BenchFailure, BenchReport, BenchRow, Derived, BENCH_SCHEMA};
use runner::ConfigRun;

/// The most iterations `--iterations` accepts (beyond it a run takes hours on some hosts).
pub const MAX_ITERATIONS: u64 = 10_000_000;
/// Default iterations per loop.
pub const DEFAULT_ITERATIONS: u64 = 5000;

/// Errors choosing what to run.
#[derive(Debug, Error)]
pub enum BenchError {
    #[error("Unknown case '{0}'; cases are: {1}")]
    UnknownCase(String, String),
    #[error("Iterations must be between 1 and {MAX_ITERATIONS}, got {0}")]
    Iterations(u64),
    #[error("The VM count must be between 1 and {max}, got {0}", max = scaling::MAX_VMS)]
    Vms(usize),
    #[error("Cannot read the host CPUs this process may use: {0}")]
    Affinity(std::io::Error),
    #[error(transparent)]
    Kvm(#[from] crate::kvm::KvmError),
}

/// All case names, comma-separated.
pub fn case_names() -> String {
    CASES.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
}

/// Resolves `--cases` names (all cases when empty).
pub fn select(names: &[String]) -> Result<Vec<&'static BenchCase>, BenchError> {
    if names.is_empty() {
        return Ok(CASES.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            cases::find(n.trim()).ok_or_else(|| BenchError::UnknownCase(n.clone(), case_names()))
        })
        .collect()
}

/// Checks an iteration count.
pub fn check_iterations(n: u64) -> Result<u64, BenchError> {
    if (1..=MAX_ITERATIONS).contains(&n) {
        Ok(n)
    } else {
        Err(BenchError::Iterations(n))
    }
}

/// Runs `cases`, calling `progress` before and after each configuration.
pub fn run(
    cases: &[&'static BenchCase],
    iterations: u64,
    mut progress: impl FnMut(&str),
) -> Result<BenchReport, BenchError> {
    let host = host::probe()?;
    let start = Instant::now();
    let total: usize = cases.iter().map(|c| c.configs.len() * c.rounds).sum();
    let (mut rows, mut failures, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    let mut done = 0;
    for case in cases {
        let mut runs: Vec<Vec<ConfigRun>> = vec![Vec::new(); case.configs.len()];
        let mut failed: Vec<Option<String>> = vec![None; case.configs.len()];
        let mut unavailable = vec![false; case.configs.len()];
        for _ in 0..case.rounds {
            for (i, config) in case.configs.iter().enumerate() {
                if unavailable[i] {
                    continue;
                }
                done += 1;
                let label = format!("[{done}/{total}] {}/{}", case.name, config.name);
                progress(&format!("{label} ..."));
                match runner::run_config(case, config, iterations, host.tsc_khz) {
                    Ok(run) if run.problems.is_empty() => {
                        progress(&format!("{label}: {:.0} ns/iteration", run.ns_per_iter));
                        runs[i].push(run);
                    }
                    Ok(run) => failed[i] = Some(run.problems.join("; ")),
                    Err(e @ runner::RunError::Unavailable(_)) => {
                        progress(&format!("{label}: skipped: {e}"));
                        unavailable[i] = true;
                        skipped.push(failure(case, config.name, e.to_string()));
                    }
                    Err(e) => failed[i] = Some(e.to_string()),
                }
            }
        }
        collect_case(case, runs, failed, host.tsc_khz, &mut rows, &mut failures);
    }
    let derived: Derived = report::derive(&rows, host.tsc_khz);
    Ok(BenchReport {
        schema: BENCH_SCHEMA,
        host,
        iterations,
        wall_seconds: start.elapsed().as_secs_f64(),
        rows,
        failures,
        skipped,
        derived,
    })
}

/// Keeps each configuration's median run (or its failure) and computes ratios to the baseline.
fn collect_case(
    case: &'static BenchCase,
    runs: Vec<Vec<ConfigRun>>,
    failed: Vec<Option<String>>,
    tsc_khz: u64,
    rows: &mut Vec<BenchRow>,
    failures: &mut Vec<BenchFailure>,
) {
    let rounds: Vec<Vec<f64>> = runs
        .iter()
        .map(|r| r.iter().map(|x| x.ns_per_iter).collect())
        .collect();
    let medians: Vec<Option<ConfigRun>> = runs.into_iter().map(median).collect();
    let baseline = medians[0].clone();
    for (((config, run), error), round_ns) in
        case.configs.iter().zip(medians).zip(failed).zip(rounds)
    {
        match (run, error) {
            (_, Some(e)) => failures.push(failure(case, config.name, e)),
            (Some(run), None) => rows.push(BenchRow {
                round_ns,
                ratio_to_baseline: report::ratio(&run, baseline.as_ref()),
                profile: report::run_profile(&run, tsc_khz),
                run,
            }),
            (None, None) => {}
        }
    }
}

fn median(mut runs: Vec<ConfigRun>) -> Option<ConfigRun> {
    runs.sort_by(|a, b| a.ns_per_iter.total_cmp(&b.ns_per_iter));
    let mid = runs.len() / 2;
    runs.into_iter().nth(mid)
}

fn failure(case: &'static BenchCase, config: &'static str, error: String) -> BenchFailure {
    BenchFailure {
        case: case.name,
        config,
        error,
    }
}
