//! Host micro-benchmark: the cost of false sharing for single-writer counters.
//!
//! Two threads each increment their *own* counter with the profiler's
//! single-writer pattern (`store(load + 1)`, relaxed). In the packed layout
//! both counters sit in one 64-byte cache line, so the line ping-pongs
//! between the cores; in the padded layout each counter is [`CachePadded`].
//! The ratio shows why [`super::VcpuProfile`] is 128-byte aligned.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};

/// Outcome of [`run_false_sharing_benchmark`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FalseSharingResult {
    /// Nanoseconds per increment with both counters in one cache line.
    pub packed_ns_per_inc: f64,
    /// Nanoseconds per increment with the counters on separate lines.
    pub padded_ns_per_inc: f64,
    /// `packed_ns_per_inc / padded_ns_per_inc`.
    pub ratio: f64,
    /// Increments per thread per layout.
    pub iterations: u64,
    /// Host CPUs the two threads were pinned to (empty: not pinned).
    pub cpus: Vec<usize>,
}

impl FalseSharingResult {
    /// One human-readable line.
    pub fn render(&self) -> String {
        let pinning = if self.cpus.is_empty() {
            "unpinned".to_string()
        } else {
            let list: Vec<String> = self.cpus.iter().map(usize::to_string).collect();
            format!("CPUs {}", list.join(","))
        };
        format!(
            "false sharing: packed {:.2} ns/inc, padded {:.2} ns/inc, {:.1}x slower when packed \
             ({} increments per thread, {})",
            self.packed_ns_per_inc, self.padded_ns_per_inc, self.ratio, self.iterations, pinning
        )
    }
}

/// Two counters in the same 64-byte cache line.
#[repr(C, align(64))]
#[derive(Default)]
struct PackedCounters {
    first: AtomicU64,
    second: AtomicU64,
}

/// Two counters on separate cache lines.
#[derive(Default)]
struct PaddedCounters {
    first: CachePadded<AtomicU64>,
    second: CachePadded<AtomicU64>,
}

/// Runs both layouts with `iterations` increments per thread. Threads are
/// pinned to two different host CPUs when at least two are available.
pub fn run_false_sharing_benchmark(iterations: u64) -> FalseSharingResult {
    let cpus = pick_two_cpus();
    let packed = PackedCounters::default();
    let padded = PaddedCounters::default();
    let packed_time = time_two_writers(&packed.first, &packed.second, iterations, &cpus);
    let padded_time = time_two_writers(&padded.first, &padded.second, iterations, &cpus);
    let per_inc = |time: Duration| time.as_nanos() as f64 / iterations.max(1) as f64;
    let packed_ns_per_inc = per_inc(packed_time);
    let padded_ns_per_inc = per_inc(padded_time);
    FalseSharingResult {
        packed_ns_per_inc,
        padded_ns_per_inc,
        ratio: packed_ns_per_inc / padded_ns_per_inc.max(f64::MIN_POSITIVE),
        iterations,
        cpus,
    }
}

/// Increments `counter` `iterations` times with the single-writer pattern.
#[inline(never)]
fn increment_single_writer(counter: &AtomicU64, iterations: u64) {
    let counter = black_box(counter);
    for _ in 0..black_box(iterations) {
        counter.store(counter.load(Relaxed) + 1, Relaxed);
    }
}

/// Runs one writer thread per counter, started together; returns the
/// slower thread's elapsed time.
fn time_two_writers(
    first: &AtomicU64,
    second: &AtomicU64,
    iterations: u64,
    cpus: &[usize],
) -> Duration {
    let start_line = Barrier::new(2);
    std::thread::scope(|scope| {
        let workers: Vec<_> = [first, second]
            .into_iter()
            .enumerate()
            .map(|(index, counter)| {
                let cpu = cpus.get(index).copied();
                let start_line = &start_line;
                scope.spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_current_thread(cpu);
                    }
                    start_line.wait();
                    let start = Instant::now();
                    increment_single_writer(counter, iterations);
                    start.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().unwrap_or_default())
            .max()
            .unwrap_or_default()
    })
}

/// The first two CPUs in this process's affinity mask, or empty if fewer.
fn pick_two_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bitmask for which all-zeroes is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let set_size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable cpu_set_t of `set_size` bytes;
    // pid 0 means the calling thread.
    let result = unsafe { libc::sched_getaffinity(0, set_size, &mut set) };
    if result != 0 {
        return Vec::new();
    }
    let max_cpus = set_size * 8;
    // SAFETY: CPU_ISSET only reads `set`, and `cpu < max_cpus` is in range.
    let allowed = (0..max_cpus).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) });
    let cpus: Vec<usize> = allowed.take(2).collect();
    if cpus.len() == 2 {
        cpus
    } else {
        Vec::new()
    }
}

/// Pins the calling thread to `cpu`; best effort (failure leaves it unpinned).
fn pin_current_thread(cpu: usize) {
    // SAFETY: cpu_set_t is a plain bitmask for which all-zeroes is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= std::mem::size_of::<libc::cpu_set_t>() * 8 {
        return;
    }
    // SAFETY: `cpu` was checked to be within the set's capacity.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread. The return value is ignored: pinning is best effort.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_counters_share_one_line() {
        assert_eq!(std::mem::size_of::<PackedCounters>(), 64);
        assert!(std::mem::size_of::<PaddedCounters>() >= 128);
    }

    #[test]
    fn benchmark_returns_positive_figures() {
        let result = run_false_sharing_benchmark(20_000);
        assert!(result.packed_ns_per_inc > 0.0);
        assert!(result.padded_ns_per_inc > 0.0);
        assert!(result.ratio > 0.0);
        assert_eq!(result.iterations, 20_000);
        assert!(result.render().contains("false sharing"));
    }

    #[test]
    fn increments_reach_the_counter() {
        let counter = AtomicU64::new(0);
        increment_single_writer(&counter, 1234);
        assert_eq!(counter.load(Relaxed), 1234);
    }
}
