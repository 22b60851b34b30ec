//! The ablation's row of exitless's own vCPU loop: the bench guest's VM started as `run`
//! starts one (`Vm::start`: its `vcpu0` thread, readied by `vmm::vcpu::prepare_thread` with the
//! seccomp filter, running `Vcpu::run_loop` from the exit path's section with its default
//! options), its batches cut by pausing and resuming the VM. The lab's rows rebuild the loop
//! from exitless's pieces; this one runs the loop itself, as the linker placed it, so that a
//! change of the exit path's code or data layout shows in the ablation as it would in `run`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use vmm::profile::{self, ExitReason, VcpuProfile};
use vmm::vm::RunningVm;

use super::ablation::AblationError;
use super::ablation_loop::{build_vm, Batch, EXITLESS};
use super::console::LineCapture;

/// The row's mask: exitless's ingredients and a bit of its own (no lab loop has it).
pub const REAL_LOOP: u16 = EXITLESS | 1 << 12;
/// A batch's wall time per exit before the first batch measured it (the CPL0 loop's, low).
const FIRST_GUESS_NS: f64 = 1_000.0;
/// Loop exits the guest makes beyond three times the row's (~2 µs each in its empty loop
/// before, at CPL0).
const SPARE_EXITS: u64 = 20_000;
/// The shortest and the longest sleep between two reads of the count: half the time the
/// exits left should take at the last batch's pace, so that a batch reads it a few times.
const POLL_NS: f64 = 20_000.0;
const MAX_SLEEP_NS: f64 = 2_000_000.0;
/// Batches of fewer exits do not set the pace.
const MIN_PACED: u64 = 50;

/// The running VM, its profile (which counts the loop's exits) and what it needs kept.
pub struct RealRow {
    running: Option<RunningVm>,
    profile: Arc<VcpuProfile>,
    /// The `vcpu0` thread's id.
    pub tid: u32,
    tsc_khz: u64,
    /// Wall ns per exit in the last batch: how long to let the next one run.
    per_exit_ns: f64,
    _event_loop: vmm::event_loop::EventLoop,
    _serial: LineCapture,
    _vm: vmm::vm::Vm,
}

impl RealRow {
    /// Builds the VM for `case` with room for `iterations` loop exits and more (a batch
    /// overshoots by what runs while this thread sleeps: on a busy host, hundreds of exits)
    /// and starts it paused.
    pub fn start(case: &str, iterations: u64, tsc_khz: u64) -> Result<Self, AblationError> {
        let (built, serial) = build_vm(EXITLESS, case, iterations * 3 + SPARE_EXITS)?;
        built.vm.control.request_pause();
        let before = vcpu0_threads();
        let running = built.vm.start(built.vcpus).map_err(AblationError::Start)?;
        let tid = vcpu0_threads()
            .difference(&before)
            .copied()
            .next()
            .ok_or(AblationError::ThreadGone)?;
        Ok(RealRow {
            running: Some(running),
            profile: built.profiles[0].clone(),
            tid,
            tsc_khz,
            per_exit_ns: FIRST_GUESS_NS,
            _event_loop: built.event_loop,
            _serial: serial,
            _vm: built.vm,
        })
    }

    /// Port writes to no device the vCPU counted so far: the loop's (the bench port is on no
    /// bus; the console's writes reach their device). One counter's line read.
    fn io_outs(&self) -> u64 {
        self.profile.device_count(ExitReason::IoOut, None)
    }

    /// Runs the VM until about `n` more loop exits were counted, then pauses it. The count
    /// is read a few times a batch (its line then costs the vCPU a miss on its next write),
    /// sleeping in between; the batch overshoots by the exits of the last sleep.
    pub fn batch(&mut self, n: u64) -> Result<Batch, AblationError> {
        let running = self.running.as_ref().ok_or(AblationError::ThreadGone)?;
        let first = self.io_outs();
        let target = first + n;
        let start_tsc = profile::rdtsc();
        running.resume();
        loop {
            let now = self.io_outs();
            if now >= target {
                break;
            }
            if running.is_done() {
                let ended = self.running.take().map(RunningVm::stop_and_join);
                return Err(AblationError::Ended(format!("{ended:?}")));
            }
            let left_ns = (target - now) as f64 * self.per_exit_ns / 2.0;
            let sleep_ns = left_ns.clamp(POLL_NS, MAX_SLEEP_NS);
            std::thread::sleep(Duration::from_nanos(sleep_ns as u64));
        }
        running.pause().map_err(AblationError::Start)?;
        let end_tsc = profile::rdtsc();
        let exits = self.io_outs() - first;
        // The warm-up's one exit waited for the guest's boot: not a loop's pace.
        if exits >= MIN_PACED {
            let ns = end_tsc.wrapping_sub(start_tsc) as f64 * 1e6 / self.tsc_khz.max(1) as f64;
            self.per_exit_ns = ns / exits as f64;
        }
        Ok(Batch {
            start_tsc,
            end_tsc,
            exits,
            other_exits: 0,
            samples: Vec::new(),
        })
    }
}

impl Drop for RealRow {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.stop_and_join();
        }
    }
}

/// Threads of this process named `vcpu0`.
fn vcpu0_threads() -> HashSet<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return HashSet::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "vcpu0")
        })
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect()
}
