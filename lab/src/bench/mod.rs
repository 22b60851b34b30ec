//! The exit lab: `exitless bench` runs each case's configurations in fresh VMs and reports
//! what every exit kind costs and what each exit-avoiding technique saves.

pub mod ablation;
mod ablation_loop;
mod ablation_real;
#[cfg(test)]
mod ablation_tests;
mod ablation_trace;
pub mod blk;
pub mod cases;
pub mod config_run;
pub mod console;
pub mod dirty;
pub mod fs;
/// The bench guest: a crate of its own (`exitless-guest`), which the core's tests boot too.
pub use exitless_guest as guest;
pub mod host;
pub mod ipi;
pub mod ipi_table;
pub mod net;
pub mod observer;
pub mod ports;
pub mod report;
pub mod result;
pub mod runner;
pub mod scaling;
pub mod threads;
pub mod vhost_blk;
pub mod virtio;
pub mod vsock;

#[cfg(test)]
mod coalesced_smp_tests;

use std::time::Instant;

use thiserror::Error;

use cases::{BenchCase, CASES};
use config_run::ConfigRun;
use report::{BenchFailure, BenchReport, BenchRow, Derived, BENCH_SCHEMA};

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
    Kvm(#[from] vmm::kvm::KvmError),
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
        let mut results = CaseRuns::new(case.configs.len());
        for _ in 0..case.rounds {
            for (i, config) in case.configs.iter().enumerate() {
                if results.unavailable[i].is_some() {
                    continue;
                }
                done += 1;
                let label = format!("[{done}/{total}] {}/{}", case.name, config.name);
                progress(&format!("{label} ..."));
                let result = runner::run_config(case, config, iterations, host.tsc_khz);
                if let Some(line) = results.record(i, result) {
                    let label = match results.spread_unavailable(case, i) {
                        None => label,
                        // One line for configurations skipped for one reason.
                        Some(names) => format!("[{done}/{total}] {}/{names}", case.name),
                    };
                    progress(&format!("{label}: {line}"));
                }
            }
        }
        for (config, why) in case.configs.iter().zip(&results.unavailable) {
            if let Some(why) = why {
                skipped.push(failure(case, config.name, why.clone()));
            }
        }
        let (runs, failed) = (results.runs, results.failed);
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

/// What a case's configurations gave over its rounds, by configuration.
struct CaseRuns {
    runs: Vec<Vec<ConfigRun>>,
    failed: Vec<Option<String>>,
    /// Why a configuration cannot run on this host or as this user (not tried again; reported
    /// as skipped, not as an error).
    unavailable: Vec<Option<String>>,
}

impl CaseRuns {
    fn new(configs: usize) -> Self {
        CaseRuns {
            runs: vec![Vec::new(); configs],
            failed: vec![None; configs],
            unavailable: vec![None; configs],
        }
    }

    /// Records configuration `i`'s result; returns what to say about it, if anything.
    fn record(
        &mut self,
        i: usize,
        result: Result<ConfigRun, config_run::RunError>,
    ) -> Option<String> {
        match result {
            Ok(run) if run.problems.is_empty() => {
                let line = format!("{:.0} ns/iteration", run.ns_per_iter);
                self.runs[i].push(run);
                Some(line)
            }
            Ok(run) => {
                self.failed[i] = Some(run.problems.join("; "));
                None
            }
            Err(e @ config_run::RunError::Unavailable(_)) => {
                let why = e.to_string();
                self.unavailable[i] = Some(why.clone());
                Some(format!("skipped: {why}"))
            }
            Err(e) => {
                self.failed[i] = Some(e.to_string());
                None
            }
        }
    }
}

impl CaseRuns {
    /// When configuration `i` turned out unavailable, the configurations of `case` not run yet
    /// that need the same device (the same reason holds for them: no virtiofsd, no root) are
    /// too; returns the names of all of them, or None when `i` is available.
    fn spread_unavailable(&mut self, case: &BenchCase, i: usize) -> Option<String> {
        let why = self.unavailable[i].clone()?;
        let need = |c: &cases::CaseConfig| c.virtio.as_ref().map(std::mem::discriminant);
        let mut names = vec![case.configs[i].name];
        for (j, config) in case.configs.iter().enumerate().skip(i + 1) {
            let untried = self.runs[j].is_empty() && self.failed[j].is_none();
            if need(config).is_some() && need(config) == need(&case.configs[i]) && untried {
                self.unavailable[j] = Some(why.clone());
                names.push(config.name);
            }
        }
        Some(names.join(", "))
    }
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

#[cfg(test)]
mod tests {
    use super::config_run::RunError;
    use super::*;

    #[test]
    fn a_configuration_this_host_cannot_run_is_skipped_with_why_not_failed() {
        let mut c = CaseRuns::new(3);
        let ok = report::tests::run(0, 0, 1000.0, 0);
        let mut broken = ok.clone();
        broken.problems.push("lost an exit".into());
        assert_eq!(c.record(0, Ok(ok)).as_deref(), Some("1000 ns/iteration"));
        assert_eq!(c.record(1, Ok(broken)), None);
        let line = c.record(2, Err(RunError::Unavailable("needs root".into())));
        assert_eq!(line.as_deref(), Some("skipped: Not run: needs root"));
        assert_eq!(c.runs[0].len(), 1);
        assert_eq!(c.failed[1].as_deref(), Some("lost an exit"));
        assert_eq!(c.failed[2], None, "not an error");
        assert_eq!(c.unavailable[2].as_deref(), Some("Not run: needs root"));
        c.record(0, Err(RunError::NoMarkers));
        assert!(c.failed[0].is_some(), "other errors fail the configuration");
    }

    #[test]
    fn configurations_needing_a_missing_device_are_skipped_together_in_one_line() {
        let fs = CASES.iter().find(|c| c.name == "virtio_fs").unwrap();
        let mut c = CaseRuns::new(fs.configs.len());
        let none = Err(RunError::Unavailable("virtiofsd is not installed".into()));
        assert!(c.record(0, none).is_some());
        let names: Vec<&str> = fs.configs.iter().map(|c| c.name).collect();
        assert_eq!(c.spread_unavailable(fs, 0), Some(names.join(", ")));
        assert!(
            c.unavailable.iter().all(Option::is_some),
            "{:?}",
            c.unavailable
        );
        let mut ok = CaseRuns::new(fs.configs.len());
        ok.record(0, Ok(report::tests::run(0, 0, 1000.0, 0)));
        assert_eq!(
            ok.spread_unavailable(fs, 0),
            None,
            "an available one spreads nothing"
        );
    }
}
