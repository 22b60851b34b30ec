//! `exitless compare`: the bench guest under exitless and under each peer VMM found on this
//! host, one case at a time, in rounds that interleave the VMMs (hosts are noisy). Each case
//! runs at two iteration counts so that start-up cancels out of the per-exit figures.

pub mod api_start;
pub mod peer;
pub mod process;
pub mod turnaround;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use peer::{Launch, Vmm, VmmKind};
use process::RunSample;
use turnaround::Tracer;

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
    /// Wall time per iteration from the two iteration counts (start-up cancels out).
    pub wall_per_iter_us: Spread,
    /// Process CPU (user + system) per iteration, from the two counts; coarse (clock ticks).
    pub cpu_per_iter_us: Spread,
    /// Of the process's CPU, what the kernel counted as guest time, per iteration.
    pub guest_cpu_per_iter_us: Spread,
    pub peak_rss_kib: Spread,
    pub rss_beyond_guest_kib: Spread,
    /// This VMM's median wall time per iteration over exitless's, same sitting.
    pub wall_ratio_to_exitless: Option<f64>,
    /// Turnaround per userspace exit (tracefs), pooled over the rounds' larger runs.
    pub turnaround_us: Option<Turnaround>,
    /// Why a run had no turnaround figures, when tracing worked otherwise.
    pub turnaround_note: Option<String>,
}

/// The VMM's time from a userspace exit to its next KVM_RUN, on the vCPU thread.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Turnaround {
    pub min: f64,
    pub median: f64,
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
    pub vmms: Vec<VmmReport>,
}

/// A (small, large) pair of runs, with the larger run's turnarounds (µs) or why none.
type Pair = (RunSample, RunSample, Result<Vec<f64>, String>);

/// Runs the plan; `progress` hears each step, and `stop` is asked before each run (a signal:
/// the comparison ends there, tracing settings restored). A peer that fails is reported and
/// left out of later rounds; exitless failing ends the comparison.
pub fn run(
    plan: &Plan,
    mut progress: impl FnMut(&str),
    stop: impl Fn() -> bool,
) -> Result<CompareReport, CompareError> {
    let counts = [(plan.iterations / 5).max(1), plan.iterations];
    let mut pairs: Vec<Vec<Vec<Pair>>> = vec![vec![Vec::new(); plan.cases.len()]; plan.vmms.len()];
    let mut failed: Vec<Option<String>> = vec![None; plan.vmms.len()];
    let tracer = Tracer::open();
    if let Err(why) = &tracer {
        progress(&format!("turnaround per exit not measured: {why}"));
    }
    for round in 1..=plan.rounds {
        for (c, case) in plan.cases.iter().enumerate() {
            for (v, vmm) in plan.vmms.iter().enumerate() {
                if failed[v].is_some() || vmm.cannot_run(case).is_some() {
                    continue;
                }
                if stop() {
                    return Err(CompareError::Stopped);
                }
                progress(&format!(
                    "round {round}/{}: {} {case}",
                    plan.rounds,
                    vmm.kind.name()
                ));
                match run_pair(plan, vmm, case, counts, tracer.as_ref().ok()) {
                    Ok(pair) => pairs[v][c].push(pair),
                    Err(e) if vmm.kind == VmmKind::Exitless => {
                        return Err(CompareError::Exitless {
                            case: case.clone(),
                            source: Box::new(e),
                        })
                    }
                    Err(e) => {
                        progress(&format!("{}: {case}: {e}; left out", vmm.kind.name()));
                        failed[v] = Some(format!("{case}: {e}"));
                    }
                }
            }
        }
    }
    let mut report = report(plan, counts, pairs, failed);
    report.turnaround = tracer.map_or_else(|why| why, |_| "measured".to_string());
    Ok(report)
}

fn run_pair(
    plan: &Plan,
    vmm: &Vmm,
    case: &str,
    counts: [u64; 2],
    tracer: Option<&Tracer>,
) -> Result<Pair, CompareError> {
    let one = |iters: u64, at_done: &mut dyn FnMut(u32)| {
        // `hold`: the guest halts after its last line instead of ending the VM, so that
        // every VMM is still there to be measured (QEMU would exit at once).
        let disk_case = peer::DISK_CASES.contains(&case);
        let queue = if disk_case { " qd=32" } else { "" };
        let cmdline = format!("case={case} iters={iters}{queue} hold");
        let disk = plan.workdir.join("disk.img");
        if disk_case {
            let image = std::fs::File::create(&disk).map_err(CompareError::Workdir)?;
            image.set_len(16 << 20).map_err(CompareError::Workdir)?;
        }
        let launch = Launch {
            guest: &plan.guest,
            cmdline: &cmdline,
            memory_mib: plan.memory_mib,
            workdir: &plan.workdir,
            disk: disk_case.then_some(disk.as_path()),
        };
        process::run(vmm.command(&launch)?, case, plan.limit, at_done)
    };
    let small = one(counts[0], &mut |_| {})?;
    let mut turnarounds = Err("not traced".to_string());
    if let Some(t) = tracer {
        t.clear();
    }
    let large = one(counts[1], &mut |pid| {
        if let Some(t) = tracer {
            turnarounds = t.turnarounds(pid);
        }
    })?;
    Ok((small, large, turnarounds))
}

fn report(
    plan: &Plan,
    counts: [u64; 2],
    pairs: Vec<Vec<Vec<Pair>>>,
    failed: Vec<Option<String>>,
) -> CompareReport {
    let extra = (counts[1] - counts[0]).max(1) as f64;
    let mut vmms: Vec<VmmReport> = plan
        .vmms
        .iter()
        .zip(pairs)
        .zip(failed)
        .map(|((vmm, per_case), failed)| VmmReport {
            vmm: vmm.kind.name(),
            path: vmm.path.clone(),
            failed,
            not_run: plan
                .cases
                .iter()
                .filter_map(|c| vmm.cannot_run(c).map(|why| format!("{c}: {why}")))
                .collect(),
            cases: plan
                .cases
                .iter()
                .zip(per_case)
                .filter(|(_, p)| !p.is_empty())
                .map(|(case, p)| figures(case, &p, extra))
                .collect(),
        })
        .collect();
    let base: Vec<(String, f64)> = vmms
        .first()
        .map(|e| {
            e.cases
                .iter()
                .map(|c| (c.case.clone(), c.wall_per_iter_us.median))
                .collect()
        })
        .unwrap_or_default();
    for c in vmms.iter_mut().flat_map(|v| v.cases.iter_mut()) {
        c.wall_ratio_to_exitless = base
            .iter()
            .find(|(case, _)| *case == c.case)
            .filter(|(_, b)| *b > 0.0)
            .map(|(_, b)| c.wall_per_iter_us.median / b);
    }
    CompareReport {
        schema: "exitless.compare/1",
        iterations: counts,
        rounds: plan.rounds,
        memory_mib: plan.memory_mib,
        turnaround: String::new(),
        vmms,
    }
}

fn figures(case: &str, pairs: &[Pair], extra: f64) -> CaseFigures {
    let over = |f: &dyn Fn(&Pair) -> f64| Spread::of(&pairs.iter().map(f).collect::<Vec<_>>());
    let cpu = |s: &RunSample| s.cpu.user_ms + s.cpu.system_ms;
    let mut pooled: Vec<f64> = pairs
        .iter()
        .flat_map(|(_, _, t)| t.iter().flatten())
        .copied()
        .collect();
    let samples = pooled.len();
    let turnaround_note = pairs
        .iter()
        .find_map(|(_, _, t)| t.as_ref().err())
        .filter(|_| samples == 0)
        .cloned();
    let turnaround_us = turnaround::percentiles(&mut pooled).map(|[min, median, p99]| Turnaround {
        min,
        median,
        p99,
        samples,
    });
    CaseFigures {
        case: case.to_string(),
        first_line_ms: over(&|(a, b, _)| a.first_line_ms.min(b.first_line_ms)),
        done_ms: over(&|(_, b, _)| b.done_ms),
        guest_cycles_per_iter: over(&|(_, b, _)| {
            b.result.cycles as f64 / b.result.iters.max(1) as f64
        }),
        wall_per_iter_us: over(&|(a, b, _)| (b.done_ms - a.done_ms) * 1e3 / extra),
        cpu_per_iter_us: over(&|(a, b, _)| (cpu(b) - cpu(a)) * 1e3 / extra),
        guest_cpu_per_iter_us: over(&|(a, b, _)| (b.cpu.guest_ms - a.cpu.guest_ms) * 1e3 / extra),
        peak_rss_kib: over(&|(_, b, _)| b.peak_rss_kib as f64),
        rss_beyond_guest_kib: over(&|(_, b, _)| b.rss_beyond_guest_kib as f64),
        wall_ratio_to_exitless: None,
        turnaround_us,
        turnaround_note,
    }
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
