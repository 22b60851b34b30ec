//! Per-vCPU VM-exit profiler.
//!
//! The vCPU loop brackets each `KVM_RUN` with [`rdtsc`] and records, per exit:
//!
//! ```ignore
//! let t_exit = rdtsc();                          // KVM_RUN just returned
//! profile.record_in_kvm(t_exit - t_entry);       // guest + in-kernel exits
//! // ... handle the exit, resolving the bus device index ...
//! let t_entry = rdtsc();                         // about to re-enter
//! profile.record_exit(reason, device_index, t_entry - t_exit);
//! if let Some(cpu) = current_cpu() { profile.record_cpu(cpu) }
//! ```
//!
//! Writes drained from KVM's coalesced MMIO/PIO ring (queued without an exit)
//! are counted per bus device with `profile.record_coalesced(pio, device_index)`.
//!
//! * [`VcpuProfile`]: the lock-free, allocation-free, single-writer counters.
//! * [`histogram`]: log-linear latency histograms in cycles.
//! * [`report`]: tables and the `exitless.profile/1` JSON document.
//! * [`false_sharing`]: a host micro-benchmark showing why profiles are padded.
//! * [`record_cost_ns`]: measures the profiler's own cost per exit.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub mod false_sharing;
pub mod histogram;
pub mod report;
mod vcpu_profile;
pub mod virtio;
mod zeroed_table;

pub use false_sharing::{run_false_sharing_benchmark, FalseSharingResult};
pub use histogram::{Histogram, HistogramSnapshot};
pub use report::{KvmStatDelta, ProfileReport, PROFILE_SCHEMA};
pub use vcpu_profile::{
    CoalescedSnapshot, ExitStats, ExitStatsSnapshot, ReasonSnapshot, VcpuProfile,
    VcpuProfileSnapshot, MAX_HOST_CPUS,
};

/// Why `KVM_RUN` returned to userspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExitReason {
    /// `KVM_EXIT_IO`, direction in.
    IoIn,
    /// `KVM_EXIT_IO`, direction out.
    IoOut,
    /// `KVM_EXIT_MMIO`, read.
    MmioRead,
    /// `KVM_EXIT_MMIO`, write.
    MmioWrite,
    /// `KVM_EXIT_HLT`.
    Hlt,
    /// `KVM_EXIT_SHUTDOWN` (triple fault).
    Shutdown,
    /// `KVM_EXIT_SYSTEM_EVENT`.
    SystemEvent,
    /// `KVM_EXIT_INTERNAL_ERROR`.
    InternalError,
    /// `KVM_EXIT_IRQ_WINDOW_OPEN`.
    IrqWindowOpen,
    /// `KVM_EXIT_FAIL_ENTRY`.
    FailEntry,
    /// `KVM_RUN` returned `EINTR`: the thread was kicked by a signal.
    Intr,
    /// `KVM_EXIT_DIRTY_RING_FULL`: the vCPU's dirty ring filled while a migration tracks
    /// dirty pages; the vCPU harvests it and goes on.
    DirtyRingFull,
    /// Anything else.
    Other,
}

impl ExitReason {
    /// Every reason, in declaration order (`ALL[r as usize] == r`).
    pub const ALL: [ExitReason; 13] = [
        ExitReason::IoIn,
        ExitReason::IoOut,
        ExitReason::MmioRead,
        ExitReason::MmioWrite,
        ExitReason::Hlt,
        ExitReason::Shutdown,
        ExitReason::SystemEvent,
        ExitReason::InternalError,
        ExitReason::IrqWindowOpen,
        ExitReason::FailEntry,
        ExitReason::Intr,
        ExitReason::DirtyRingFull,
        ExitReason::Other,
    ];

    /// Upper-case name as used in tables and JSON, e.g. `"MMIO_WRITE"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ExitReason::IoIn => "IO_IN",
            ExitReason::IoOut => "IO_OUT",
            ExitReason::MmioRead => "MMIO_READ",
            ExitReason::MmioWrite => "MMIO_WRITE",
            ExitReason::Hlt => "HLT",
            ExitReason::Shutdown => "SHUTDOWN",
            ExitReason::SystemEvent => "SYSTEM_EVENT",
            ExitReason::InternalError => "INTERNAL_ERROR",
            ExitReason::IrqWindowOpen => "IRQ_WINDOW_OPEN",
            ExitReason::FailEntry => "FAIL_ENTRY",
            ExitReason::Intr => "INTR",
            ExitReason::DirtyRingFull => "DIRTY_RING_FULL",
            ExitReason::Other => "OTHER",
        }
    }

    /// Whether exits of this reason are attributed to bus devices.
    pub const fn has_devices(self) -> bool {
        matches!(
            self,
            ExitReason::IoIn | ExitReason::IoOut | ExitReason::MmioRead | ExitReason::MmioWrite
        )
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The profile times one exit in this many by default (`--profile-sample N`), counting every
/// one: the two TSC reads and the host CPU's read cost more than the rest of an exit's handling
/// on a nested host (docs/profile.md, "Sampled times").
pub const DEFAULT_SAMPLE: u32 = 16;

static SAMPLE: AtomicU32 = AtomicU32::new(DEFAULT_SAMPLE);

/// Sets how many exits the profile of every vCPU built from now on times one in
/// (`--profile-sample N`, for `run` and the API's VMs alike; 0 is taken as 1).
pub fn set_sample(every: u32) {
    SAMPLE.store(every.max(1), Ordering::Relaxed);
}

/// The profile times one exit in this many ([`set_sample`], else [`DEFAULT_SAMPLE`]).
pub fn sample() -> u32 {
    SAMPLE.load(Ordering::Relaxed)
}

/// Reads the time-stamp counter.
///
/// One of the lab's entry points: the bench's host-side clock.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no memory effects and is available on every x86_64
    // CPU; the intrinsic is only `unsafe` because it is an arch intrinsic.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The host CPU the calling thread is running on, if the kernel says.
#[inline]
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments, touches no caller memory and
    // only returns a CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// Estimates the TSC frequency in kHz by timing `rdtsc` against the
/// monotonic clock for `duration` (prefer `KVM_GET_TSC_KHZ` when available).
///
/// One of the lab's entry points (the bench and compare convert cycles with it).
pub fn estimate_tsc_khz(duration: std::time::Duration) -> u64 {
    let start_instant = Instant::now();
    let start_tsc = rdtsc();
    while start_instant.elapsed() < duration {
        std::hint::spin_loop();
    }
    let cycles = rdtsc().wrapping_sub(start_tsc);
    let nanos = start_instant.elapsed().as_nanos().max(1);
    (u128::from(cycles) * 1_000_000 / nanos) as u64
}

/// Measures what one `record_in_kvm` + `record_exit` + `record_cpu` sequence
/// costs on this host, in nanoseconds (mean over `iterations`). Exit reasons
/// and devices rotate through IO, MMIO and HLT so both the per-reason and the
/// per-device paths are exercised; `rdtsc` itself is not included.
pub fn record_cost_ns(iterations: u64) -> f64 {
    const REASONS: [ExitReason; 4] = [
        ExitReason::IoOut,
        ExitReason::MmioWrite,
        ExitReason::IoIn,
        ExitReason::Hlt,
    ];
    let profile = VcpuProfile::new(0, 4, 2);
    let cpu = current_cpu().unwrap_or(0);
    let start = Instant::now();
    for i in 0..iterations {
        let i = black_box(i);
        let reason = REASONS[(i % 4) as usize];
        profile.record_in_kvm(5000 + (i & 1023));
        profile.record_exit(reason, Some((i % 5) as usize), 200 + (i & 4095));
        profile.record_cpu(cpu);
    }
    let elapsed = start.elapsed();
    black_box(&profile);
    elapsed.as_nanos() as f64 / iterations.max(1) as f64
}

/// Measures everything the vCPU loop adds per exit when profiling is on, in nanoseconds (mean
/// over `iterations`): two `rdtsc`, `sched_getcpu`, and the three record calls.
///
/// One of the lab's entry points (the bench's VMM overhead per exit).
pub fn per_exit_work_ns(iterations: u64) -> f64 {
    let profile = VcpuProfile::new(0, 4, 0);
    let start = Instant::now();
    let mut t_entry = rdtsc();
    for i in 0..iterations {
        let t_exit = rdtsc();
        profile.record_in_kvm(t_exit.wrapping_sub(t_entry));
        let t_done = rdtsc();
        profile.record_exit(
            ExitReason::IoOut,
            Some(black_box(i as usize) % 4),
            t_done - t_exit,
        );
        if let Some(cpu) = current_cpu() {
            profile.record_cpu(cpu);
        }
        t_entry = t_done;
    }
    black_box(&profile);
    start.elapsed().as_nanos() as f64 / iterations.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_exit_work_is_measured() {
        let ns = per_exit_work_ns(10_000);
        assert!(ns > 0.0 && ns.is_finite());
    }

    #[test]
    fn all_is_in_declaration_order() {
        for (index, reason) in ExitReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, index);
        }
    }

    #[test]
    fn serde_name_matches_as_str() {
        for reason in ExitReason::ALL {
            let json = serde_json::to_string(&reason).expect("serialize");
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
            let back: ExitReason = serde_json::from_str(&json).expect("deserialize");
            assert_eq!(back, reason);
        }
    }

    #[test]
    fn rdtsc_advances() {
        let first = rdtsc();
        let second = rdtsc();
        assert!(second >= first);
    }

    #[test]
    fn current_cpu_is_known() {
        assert!(current_cpu().is_some());
    }

    #[test]
    fn record_cost_is_positive() {
        assert!(record_cost_ns(10_000) > 0.0);
    }

    #[test]
    fn tsc_estimate_is_plausible() {
        let khz = estimate_tsc_khz(std::time::Duration::from_millis(20));
        assert!((100_000..20_000_000).contains(&khz), "{khz}");
    }

    /// Prints the host figures quoted in the docs:
    /// `cargo test --release -p vmm profile_figures -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn profile_figures() {
        println!("record cost: {:.2} ns per exit", record_cost_ns(50_000_000));
        let start = Instant::now();
        (0..10_000_000).for_each(|_| {
            black_box(current_cpu());
        });
        let getcpu_ns = start.elapsed().as_nanos() as f64 / 1e7;
        println!("current_cpu (sched_getcpu): {getcpu_ns:.2} ns");
        let start = Instant::now();
        (0..10_000_000).for_each(|_| {
            black_box(rdtsc());
        });
        println!("rdtsc: {:.2} ns", start.elapsed().as_nanos() as f64 / 1e7);
        println!("{}", run_false_sharing_benchmark(50_000_000).render());
        println!(
            "tsc: {} kHz",
            estimate_tsc_khz(std::time::Duration::from_millis(200))
        );
    }
}
