//! The exit path's cost, attributed (`exitless bench --ablation`): the bench guest's
//! `pio_out` loop on a bare KVM_RUN loop, then with exitless's exit-path ingredients added one
//! at a time, each alone and cumulatively, beside the floor VMM; every row measured the same
//! way, its batches interleaved round-robin with the other rows' so that the host's noise
//! spreads evenly. Each row runs on a thread of its own (a seccomp filter cannot be removed)
//! with a VM of its own; only one row runs at a time.
//!
//! The turnaround per userspace exit is what `compare` measures: on the row's thread, from
//! KVM's `kvm_userspace_exit` to the next `ioctl(KVM_RUN)` entry, through tracefs with the
//! `x86-tsc` clock, counting only exits that `kvm_pio` saw at the bench port, inside the
//! row's batches. Without tracefs (not root), the TSC from KVM_RUN's return to the next call,
//! read by the loop itself (the kernel's part of the path is then not in the figure); the
//! report says which.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use super::ablation_loop::{Batch, RowVcpu, RowVm};
pub use super::ablation_loop::{
    EXITLESS, INGREDIENTS, PROFILE, PROFILE_EVERY, RAW_RUN, TOUCHED, TOUCH_LINES, TOUCH_PAGES,
};
use super::ablation_real::RealRow;
pub use super::ablation_real::REAL_LOOP;
use super::ablation_trace::{pair, Window};
use super::config_run::RunError;
use crate::compare::turnaround::{percentiles, Tracer};

/// The guest cases the ablation runs: the `pio_out` loop at CPL0 (the default: its exits
/// return to a guest in kernel mode, the kernel's path is short and steady here) or at CPL3
/// (PVM's return to a guest's user mode adds microseconds of noise to every exit).
pub const CASES: [&str; 2] = ["pio_out_cpl0", "pio_out"];

/// Rows beside the ingredients': the profiler timing every exit alone, exitless's exit path
/// timing every exit (`--profile-sample 1`), and as it was before the profile was sampled and
/// KVM_RUN raw (kvm-ioctls' `VcpuFd::run`, every exit timed); the raw loop touching
/// [`TOUCHED`] words on as many lines of one page, then on as many pages (what pages cost, not
/// exitless's); exitless's own vCPU loop (`Vcpu::run_loop` on its `vcpu0` thread).
pub const VARIANTS: [u16; 6] = [
    RAW_RUN | PROFILE | PROFILE_EVERY,
    EXITLESS | PROFILE_EVERY,
    (EXITLESS & !RAW_RUN) | PROFILE_EVERY,
    RAW_RUN | TOUCH_LINES,
    RAW_RUN | TOUCH_PAGES,
    REAL_LOOP,
];

/// Default exits per row, over [`DEFAULT_ROUNDS`] rounds.
pub const DEFAULT_ITERATIONS: u64 = 2000;
pub const DEFAULT_ROUNDS: usize = 5;
/// The default bench's headline: two rows, short.
pub const HEADLINE_ITERATIONS: u64 = 600;
pub const HEADLINE_ROUNDS: usize = 3;
/// kvm_pio's filter marking the loop's exits.
const BENCH_PORT_FILTER: &str = "port == 0x7e0";
/// A floor run longer than this is killed and the row fails.
const FLOOR_LIMIT: Duration = Duration::from_secs(60);

/// Errors of the ablation.
#[derive(Debug, Error)]
pub enum AblationError {
    #[error(transparent)]
    Setup(#[from] RunError),
    #[error(transparent)]
    Build(#[from] vmm::builder::BuildError),
    #[error(transparent)]
    Kvm(#[from] vmm::kvm::KvmError),
    #[error(transparent)]
    Vcpu(#[from] vmm::vcpu::VcpuError),
    #[error(transparent)]
    Seccomp(#[from] vmm::seccomp::SeccompError),
    #[error("The built VM has no vCPU")]
    NoVcpu,
    #[error("Cannot pin the row's thread: {0}")]
    Pin(std::io::Error),
    #[error("No loop is compiled for ingredient mask {0:#x}")]
    Mask(u16),
    #[error("The VM was stopped")]
    Stopped,
    #[error("The guest ended the VM ({0})")]
    Ended(String),
    #[error("KVM_RUN failed: {0}")]
    Run(kvm_ioctls::Error),
    #[error("A device failed: {0}")]
    Device(std::io::Error),
    #[error("exitless's vCPU loop: {0}")]
    Start(vmm::vm::VmError),
    #[error("Cannot start a thread: {0}")]
    Thread(std::io::Error),
    #[error("A row's thread ended early")]
    ThreadGone,
    #[error("The floor VMM: {0}")]
    Floor(String),
    #[error("tracefs: {0}")]
    Trace(String),
}

/// What the ablation runs.
#[derive(Debug, Clone)]
pub struct AblationPlan {
    /// The bench guest's case: [`CASES`] (its `pio_out` loop, at CPL0 or CPL3).
    pub case: &'static str,
    /// The ingredient masks, one row each (0: the bare loop).
    pub masks: Vec<u16>,
    /// Also the floor VMM, as a process of its own per round.
    pub floor: bool,
    /// Exits per row per round.
    pub per_round: u64,
    pub rounds: usize,
}

impl AblationPlan {
    /// Every row: the bare loop, each ingredient alone on the raw KVM_RUN, then cumulatively,
    /// the variants, and the floor.
    pub fn full(iterations: u64, rounds: usize) -> Self {
        let mut masks = vec![0];
        masks.extend(INGREDIENTS.iter().map(|&(bit, _)| RAW_RUN | bit));
        let mut sum = 0;
        for &(bit, _) in &INGREDIENTS {
            sum |= bit;
            if !masks.contains(&sum) {
                masks.push(sum);
            }
        }
        masks.extend(VARIANTS);
        AblationPlan {
            case: CASES[0],
            masks,
            floor: true,
            per_round: (iterations / rounds.max(1) as u64).max(2),
            rounds: rounds.max(1),
        }
    }

    /// The default bench's headline: the bare loop and exitless's exit path.
    pub fn headline() -> Self {
        AblationPlan {
            case: CASES[0],
            masks: vec![0, EXITLESS],
            floor: false,
            per_round: HEADLINE_ITERATIONS / HEADLINE_ROUNDS as u64,
            rounds: HEADLINE_ROUNDS,
        }
    }
}

/// One row's figures.
#[derive(Debug, Clone, Serialize)]
pub struct AblationRow {
    pub name: String,
    /// Its ingredients (None: the floor).
    pub mask: Option<u16>,
    pub min_ns: Option<f64>,
    pub p50_ns: Option<f64>,
    pub p90_ns: Option<f64>,
    pub p99_ns: Option<f64>,
    /// Turnarounds measured (an exit whose next KVM_RUN came in the same batch).
    pub samples: usize,
    /// Exits at the bench port the row's loop handled (the floor: the guest's iterations).
    pub exits: u64,
    /// Of them, those the trace saw (tracefs only).
    pub exits_traced: Option<u64>,
    /// Exits elsewhere inside the batches (none expected).
    pub other_exits: u64,
    /// Median over the rounds of a batch's wall time per exit, in ns (guest time included).
    pub wall_ns_per_exit: f64,
}

/// The ablation's result.
#[derive(Debug, Clone, Serialize)]
pub struct AblationReport {
    pub case: &'static str,
    /// How the turnaround was measured.
    pub clock: String,
    pub tracefs: bool,
    pub per_round: u64,
    pub rounds: usize,
    pub rows: Vec<AblationRow>,
}

/// A row's thread and what it gave so far.
struct RowThread {
    mask: u16,
    kind: RowKind,
    tid: u32,
    acc: Accumulated,
}

/// A lab loop's thread, or exitless's own vCPU thread.
enum RowKind {
    Lab {
        commands: mpsc::Sender<Option<Vec<u64>>>,
        results: mpsc::Receiver<Result<Batch, AblationError>>,
        handle: JoinHandle<()>,
        _vm: RowVm,
    },
    Real(RealRow),
}

#[derive(Default)]
struct Accumulated {
    turnarounds: Vec<f64>,
    exits: u64,
    traced: u64,
    other: u64,
    walls: Vec<f64>,
}

/// Runs `plan`, calling `progress` with a line at each step; `tsc_khz` converts cycles.
pub fn run_ablation(
    plan: &AblationPlan,
    tsc_khz: u64,
    mut progress: impl FnMut(&str),
) -> Result<AblationReport, AblationError> {
    let tracer = Tracer::open_with("ablation", BENCH_PORT_FILTER);
    let clock = match &tracer {
        Ok(_) => "tracefs: kvm_userspace_exit -> the thread's next KVM_RUN (x86-tsc)".to_string(),
        Err(why) => format!("TSC from KVM_RUN's return to the next call (no tracefs: {why})"),
    };
    let timed = tracer.is_err();
    let cpu = pin_cpu();
    let mut rows = Vec::new();
    for &mask in &plan.masks {
        // The warm-up's exit, then every round's.
        let iterations = 1 + plan.per_round * plan.rounds as u64;
        rows.push(match mask {
            REAL_LOOP => start_real(plan.case, iterations, tsc_khz)?,
            _ => start_row(mask, (plan.case, iterations), cpu, timed)?,
        });
    }
    progress(&format!("exit ablation: {} rows ready", rows.len()));
    // The guest boots to its loop: one loop exit each, not measured.
    for row in &mut rows {
        batch(row, 1)?;
    }
    let mut sitting = Sitting {
        plan,
        tsc_khz,
        tracer: tracer.ok(),
        // The floor's turnaround is seen only from outside.
        floor: match plan.floor && !timed {
            true => Some(Floor::prepare()?),
            false => None,
        },
        floor_acc: Accumulated::default(),
    };
    for round in 0..plan.rounds {
        sitting.round(round, &mut rows)?;
        progress(&format!(
            "exit ablation: round {}/{}",
            round + 1,
            plan.rounds
        ));
    }
    let mut out: Vec<AblationRow> = Vec::new();
    for row in rows {
        out.push(finish(row_name(row.mask), Some(row.mask), row.acc, !timed));
        if let RowKind::Lab {
            commands, handle, ..
        } = row.kind
        {
            let _ = commands.send(None);
            let _ = handle.join();
        }
    }
    if sitting.floor.is_some() {
        let name = "floor (lab/floor, its own process)".to_string();
        out.insert(1, finish(name, None, sitting.floor_acc, !timed));
    }
    Ok(AblationReport {
        case: plan.case,
        clock,
        tracefs: !timed,
        per_round: plan.per_round,
        rounds: plan.rounds,
        rows: out,
    })
}

/// What the rounds share: the plan, the trace, the floor and its figures.
struct Sitting<'a> {
    plan: &'a AblationPlan,
    tsc_khz: u64,
    tracer: Option<Tracer>,
    floor: Option<Floor>,
    floor_acc: Accumulated,
}

impl Sitting<'_> {
    /// One batch of every row, in an order rotated by `round` (no row always follows the
    /// same one), then the floor; then the round's trace.
    fn round(&mut self, round: usize, rows: &mut [RowThread]) -> Result<(), AblationError> {
        let (plan, timed) = (self.plan, self.tracer.is_none());
        if let Some(t) = &self.tracer {
            t.clear();
        }
        let mut windows = Vec::new();
        let n = rows.len();
        for k in 0..n {
            let i = (k + round) % n;
            let b = batch(&mut rows[i], plan.per_round)?;
            let (tid, start, end) = (rows[i].tid, b.start_tsc, b.end_tsc);
            windows.push(Window {
                tid,
                start,
                end,
                row: i,
            });
            record(&mut rows[i].acc, &b, plan.per_round, self.tsc_khz, timed);
        }
        if let Some(floor) = &self.floor {
            let pid = floor.run(plan.case, plan.per_round)?;
            let (start, end) = (0, u64::MAX);
            windows.push(Window {
                tid: pid,
                start,
                end,
                row: n,
            });
            self.floor_acc.exits += plan.per_round;
        }
        let Some(t) = &self.tracer else {
            return Ok(());
        };
        let text = t.text().map_err(AblationError::Trace)?;
        let paired = pair(&text, &windows, n + 1, self.tsc_khz);
        for (i, row) in rows.iter_mut().enumerate() {
            row.acc.turnarounds.extend(&paired.turnarounds_ns[i]);
            row.acc.traced += paired.exits[i];
        }
        let acc = &mut self.floor_acc;
        acc.turnarounds.extend(&paired.turnarounds_ns[n]);
        acc.traced += paired.exits[n];
        // The floor's wall per exit: its first traced loop exit to its last.
        let ((first, last), exits) = (paired.span[n], paired.exits[n]);
        if exits > 1 {
            let ns = last.saturating_sub(first) as f64 * 1e6 / self.tsc_khz.max(1) as f64;
            acc.walls.push(ns / (exits - 1) as f64);
        }
        Ok(())
    }
}

/// The host CPU a pinned row's thread runs on: the last one this process may use.
fn pin_cpu() -> usize {
    vmm::vcpu::affinity::allowed_cpus()
        .ok()
        .and_then(|c| c.last().copied())
        .unwrap_or(0)
}

/// Builds row `mask`'s VM (the guest running `case` for `iterations`) and starts its thread,
/// readied as the mask says.
fn start_row(
    mask: u16,
    (case, iterations): (&str, u64),
    cpu: usize,
    timed: bool,
) -> Result<RowThread, AblationError> {
    let (mut vcpu, vm) = RowVcpu::build(mask, case, iterations)?;
    let (commands, given) = mpsc::channel::<Option<Vec<u64>>>();
    let (answer, results) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("ablation{mask:03x}"))
        .spawn(move || {
            // SAFETY: gettid has no memory effects.
            let _ = tid_tx.send(unsafe { libc::gettid() } as u32);
            if let Err(e) = vcpu.prepare_thread(cpu) {
                let _ = answer.send(Err(e));
                return;
            }
            while let Ok(Some(samples)) = given.recv() {
                let n = samples.capacity().max(1) as u64;
                let result = vcpu.batch(n, timed, samples);
                let failed = result.is_err();
                if answer.send(result).is_err() || failed {
                    break;
                }
            }
            vcpu.finish_thread();
        })
        .map_err(AblationError::Thread)?;
    let tid = tid_rx.recv().map_err(|_| AblationError::ThreadGone)?;
    Ok(RowThread {
        mask,
        kind: RowKind::Lab {
            commands,
            results,
            handle,
            _vm: vm,
        },
        tid,
        acc: Accumulated::default(),
    })
}

/// exitless's own vCPU loop's row: the VM started paused on its `vcpu0` thread.
fn start_real(case: &str, iterations: u64, tsc_khz: u64) -> Result<RowThread, AblationError> {
    let real = RealRow::start(case, iterations, tsc_khz)?;
    Ok(RowThread {
        mask: REAL_LOOP,
        tid: real.tid,
        kind: RowKind::Real(real),
        acc: Accumulated::default(),
    })
}

/// One batch of `n` loop exits on `row`'s thread (the command's vector has room for `n`
/// samples: its capacity is the batch's length); exitless's own loop runs about `n`.
fn batch(row: &mut RowThread, n: u64) -> Result<Batch, AblationError> {
    match &mut row.kind {
        RowKind::Lab {
            commands, results, ..
        } => {
            commands
                .send(Some(Vec::with_capacity(n as usize)))
                .map_err(|_| AblationError::ThreadGone)?;
            results.recv().map_err(|_| AblationError::ThreadGone)?
        }
        RowKind::Real(real) => real.batch(n),
    }
}

fn record(acc: &mut Accumulated, b: &Batch, n: u64, tsc_khz: u64, timed: bool) {
    let ns_per_tick = 1e6 / tsc_khz.max(1) as f64;
    acc.exits += b.exits;
    acc.other += b.other_exits;
    let wall = b.end_tsc.wrapping_sub(b.start_tsc) as f64 * ns_per_tick;
    acc.walls.push(wall / b.exits.max(1).min(n.max(1)) as f64);
    if timed {
        acc.turnarounds
            .extend(b.samples.iter().map(|&c| c as f64 * ns_per_tick));
    }
}

fn finish(name: String, mask: Option<u16>, mut acc: Accumulated, traced: bool) -> AblationRow {
    let p = percentiles(&mut acc.turnarounds);
    // Sorted by `percentiles`.
    let p90 = p.map(|_| acc.turnarounds[(acc.turnarounds.len() - 1) * 9 / 10]);
    acc.walls.sort_by(f64::total_cmp);
    AblationRow {
        name,
        mask,
        min_ns: p.map(|p| p[0]),
        p50_ns: p.map(|p| p[1]),
        p90_ns: p90,
        p99_ns: p.map(|p| p[2]),
        samples: acc.turnarounds.len(),
        exits: acc.exits,
        exits_traced: traced.then_some(acc.traced),
        other_exits: acc.other,
        wall_ns_per_exit: acc.walls.get(acc.walls.len() / 2).copied().unwrap_or(0.0),
    }
}

/// A row's name from its ingredients.
pub fn row_name(mask: u16) -> String {
    if mask == 0 {
        return "bare loop (kvm-ioctls)".into();
    }
    if mask == EXITLESS {
        return "= exitless's exit path (run's default)".into();
    }
    if mask == PROFILE | PROFILE_EVERY {
        return "+ profiler timing every exit (--profile-sample 1)".into();
    }
    if mask == EXITLESS | PROFILE_EVERY {
        return "exitless's exit path, every exit timed (--profile-sample 1)".into();
    }
    if mask == (EXITLESS & !RAW_RUN) | PROFILE_EVERY {
        return "exitless's exit path before (VcpuFd::run, every exit timed)".into();
    }
    if mask == RAW_RUN | PROFILE | PROFILE_EVERY {
        return "+ profiler timing every exit (--profile-sample 1)".into();
    }
    if mask == RAW_RUN | TOUCH_LINES {
        return format!("raw KVM_RUN + {TOUCHED} lines of one page touched");
    }
    if mask == RAW_RUN | TOUCH_PAGES {
        return format!("raw KVM_RUN + {TOUCHED} pages touched (a line each)");
    }
    if mask == REAL_LOOP {
        return "exitless's own vCPU loop (Vcpu::run_loop, vcpu0)".into();
    }
    // The alone rows are on the raw KVM_RUN: named by what they add to it.
    let shown = if mask != RAW_RUN && (mask & !RAW_RUN).count_ones() == 1 {
        mask & !RAW_RUN
    } else {
        mask
    };
    let names: Vec<&str> = INGREDIENTS
        .iter()
        .filter(|&&(bit, _)| shown & bit != 0)
        .map(|&(_, name)| name)
        .collect();
    if names.len() == 1 {
        return format!("+ {}", names[0]);
    }
    format!("+ {}", names.join(" + "))
}

/// The floor VMM and the bench guest written into a folder of their own.
struct Floor {
    dir: PathBuf,
    floor: PathBuf,
    guest: PathBuf,
}

impl Floor {
    fn prepare() -> Result<Self, AblationError> {
        let dir = std::env::temp_dir().join(format!("exitless-ablation-{}", std::process::id()));
        let fail = |e: std::io::Error| AblationError::Floor(e.to_string());
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let floor = crate::compare::floor::write_into(&dir).map_err(fail)?;
        let guest = dir.join("bench.elf");
        std::fs::write(&guest, super::guest::BENCH_GUEST).map_err(fail)?;
        Ok(Floor { dir, floor, guest })
    }

    /// Runs the guest's loop of `n` exits under the floor; returns its pid (its only thread).
    fn run(&self, case: &str, n: u64) -> Result<u32, AblationError> {
        let started = Instant::now();
        let mut child = Command::new(&self.floor)
            .arg(&self.guest)
            .arg(format!("case={case} iters={n}"))
            .arg("64")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| AblationError::Floor(e.to_string()))?;
        let pid = child.id();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if started.elapsed() > FLOOR_LIMIT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(AblationError::Floor("did not end within 60 s".into()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(AblationError::Floor(e.to_string())),
            }
        }
        Ok(pid)
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl AblationReport {
    /// The row of `mask`.
    pub fn row(&self, mask: u16) -> Option<&AblationRow> {
        self.rows.iter().find(|r| r.mask == Some(mask))
    }

    /// The table: the bare loop and the floor, each ingredient alone, then cumulatively;
    /// `+min`/`+p50` are differences to the bare loop.
    pub fn render(&self) -> String {
        let mut out = format!(
            "exit-path ablation: bench guest {}, {} rounds x {} exits per row, rows \
             interleaved\nturnaround per userspace exit: {}\n",
            self.case, self.rounds, self.per_round, self.clock
        );
        out += &format!(
            "{:<52} {:>7} {:>7} {:>7} {:>8} {:>6} {:>6} {:>11} {:>12} {:>7}\n",
            "row",
            "min ns",
            "p50 ns",
            "p90 ns",
            "p99 ns",
            "+min",
            "+p50",
            "x floor",
            "wall us/exit",
            "exits"
        );
        for r in self.rows.iter().filter(|r| r.mask.is_none_or(|m| m == 0)) {
            out += &self.render_row(&r.name, r);
        }
        let alone: Vec<_> = INGREDIENTS
            .iter()
            .filter_map(|&(bit, _)| self.row(RAW_RUN | bit))
            .collect();
        if !alone.is_empty() {
            out += "each ingredient alone, on the raw KVM_RUN (+min, +p50: over it):\n";
        }
        for r in alone {
            out += &self.render_row(&format!("  {}", r.name), r);
        }
        out += &self.render_cumulative();
        let variants: Vec<_> = VARIANTS.iter().filter_map(|&m| self.row(m)).collect();
        if !variants.is_empty() {
            out += "variants:\n";
        }
        for r in variants {
            out += &self.render_row(&format!("  {}", r.name), r);
        }
        if self.rows.iter().any(|r| r.other_exits > 0) {
            out += "(some batches had exits other than the loop's: see the JSON's other_exits)\n";
        }
        out
    }

    /// The cumulative rows, each named by the ingredient it adds.
    fn render_cumulative(&self) -> String {
        let mut out = String::new();
        let mut sum = 0;
        for &(bit, name) in &INGREDIENTS {
            sum |= bit;
            let Some(r) = self.row(sum).filter(|_| sum != bit) else {
                continue;
            };
            if out.is_empty() {
                out += "cumulatively, from the raw KVM_RUN:\n";
            }
            let label = if sum == EXITLESS {
                format!("  + {name} (= exitless's exit path, run's default)")
            } else {
                format!("  + {name}")
            };
            out += &self.render_row(&label, r);
        }
        out
    }

    /// One row's line: its differences to the raw KVM_RUN's row (the loop exitless has), its
    /// min and p50 as ratios to the floor's.
    fn render_row(&self, label: &str, r: &AblationRow) -> String {
        let bare = self.row(RAW_RUN);
        let floor = self.rows.iter().find(|r| r.mask.is_none());
        let x = |v: Option<f64>, f: Option<f64>| match (v, f) {
            (Some(v), Some(f)) if f > 0.0 => format!("{:.2}", v / f),
            _ => "-".into(),
        };
        let ratios = format!(
            "{}/{}",
            x(r.min_ns, floor.and_then(|f| f.min_ns)),
            x(r.p50_ns, floor.and_then(|f| f.p50_ns))
        );
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let d = |v: Option<f64>, b: Option<f64>| match (v, b) {
            (Some(v), Some(b)) => format!("{:+.0}", v - b),
            _ => "-".into(),
        };
        let exits = match r.exits_traced {
            Some(t) if t != r.exits => format!("{}/{t}", r.exits),
            _ => r.exits.to_string(),
        };
        format!(
            "{label:<52} {:>7} {:>7} {:>7} {:>8} {:>6} {:>6} {:>11} {:>12.2} {:>7}\n",
            f(r.min_ns),
            f(r.p50_ns),
            f(r.p90_ns),
            f(r.p99_ns),
            d(r.min_ns, bare.and_then(|b| b.min_ns)),
            d(r.p50_ns, bare.and_then(|b| b.p50_ns)),
            ratios,
            r.wall_ns_per_exit / 1000.0,
            exits
        )
    }

    /// One line for the default bench: the bare loop against exitless's exit path.
    pub fn headline(&self) -> String {
        let (Some(bare), Some(full)) = (self.row(0), self.row(EXITLESS)) else {
            return "exit path: the ablation's two rows did not both run".into();
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        format!(
            "exit path ({}, {} exits each, {}): bare KVM_RUN loop min {} / p50 {} ns, \
             exitless's exit path {} / {} ns: {} / {} (`bench --ablation` names each ns)",
            self.case,
            bare.exits,
            if self.tracefs {
                "tracefs turnaround"
            } else {
                "TSC around KVM_RUN"
            },
            f(bare.min_ns),
            f(bare.p50_ns),
            f(full.min_ns),
            f(full.p50_ns),
            ratio(full.min_ns, bare.min_ns),
            ratio(full.p50_ns, bare.p50_ns),
        )
    }
}
