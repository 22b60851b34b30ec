//! Where start-up time goes (`exitless run --timing`): the moments a VM passes on its way to
//! the guest's first serial line, each recorded once, relative to the start of `main`.
//!
//! Off by default: then [`mark`] is one relaxed load. On, it takes a lock once per moment,
//! never on the exit path (the vCPU marks only its first `KVM_RUN`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static ENABLED: AtomicBool = AtomicBool::new(false);
static TIMELINE: Mutex<Option<Timeline>> = Mutex::new(None);
static MAIN_STARTED: OnceLock<(Instant, Option<Duration>)> = OnceLock::new();

/// Moments since `main`, in the order they happened.
#[derive(Debug, Clone)]
pub struct Timeline {
    origin: Instant,
    /// CPU time the process had used when `main` began: exec, the dynamic loader, the runtime.
    before_main: Option<Duration>,
    marks: Vec<(&'static str, Instant)>,
}

impl Timeline {
    fn new(origin: Instant, before_main: Option<Duration>) -> Self {
        Timeline {
            origin,
            before_main,
            marks: Vec::new(),
        }
    }

    /// Records `what` at `at` unless it was recorded before (the first vCPU's first run, the
    /// first line).
    fn record(&mut self, what: &'static str, at: Instant) {
        if self.marks.iter().all(|(name, _)| *name != what) {
            self.marks.push((what, at));
        }
    }

    /// One line per moment: its time since `main` and since the moment before.
    pub fn render(&self) -> String {
        let mut out = String::from("start-up (ms since main; step):\n");
        if let Some(cpu) = self.before_main {
            let _ = writeln!(
                out,
                "  {:>8}           CPU time when main began: {:.2} ms (the launcher's fork, exec, runtime)",
                "",
                ms(cpu)
            );
        }
        let mut marks = self.marks.clone();
        marks.sort_by_key(|(_, at)| *at);
        let mut last = self.origin;
        for (what, at) in marks {
            let since = at.saturating_duration_since(self.origin);
            let step = at.saturating_duration_since(last);
            let _ = writeln!(out, "  {:>8.2}  {:>+8.2}  {what}", ms(since), ms(step));
            last = at;
        }
        out
    }

    /// The moment named `what`, as time since `main`.
    pub fn since_main(&self, what: &str) -> Option<Duration> {
        self.marks
            .iter()
            .find(|(name, _)| *name == what)
            .map(|(_, at)| at.saturating_duration_since(self.origin))
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Notes that `main` begins: the origin of every moment. Call it first thing in `main`.
pub fn main_started() {
    MAIN_STARTED.get_or_init(|| (Instant::now(), process_cpu_time()));
}

/// Starts recording moments (since `main`, or since now if [`main_started`] was not called).
pub fn enable() {
    let (origin, before_main) = *MAIN_STARTED.get_or_init(|| (Instant::now(), None));
    let timeline = Timeline::new(origin, before_main);
    *TIMELINE.lock().unwrap_or_else(|e| e.into_inner()) = Some(timeline);
    ENABLED.store(true, Ordering::Release);
}

/// Whether moments are being recorded.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Records that start-up reached `what` (only the first time it does).
pub fn mark(what: &'static str) {
    if !enabled() {
        return;
    }
    let now = Instant::now();
    if let Some(t) = TIMELINE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        t.record(what, now);
    }
}

/// What was recorded so far, if recording is on.
pub fn timeline() -> Option<Timeline> {
    TIMELINE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// CPU time this process has used.
fn process_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Names of the moments, shared by whoever records and whoever reads them.
pub mod moment {
    pub const KVM_OPEN: &str = "/dev/kvm opened";
    pub const VM_CREATED: &str =
        "vCPU threads started ahead, VM, memory, irqchip (PIT on vCPU 0's thread)";
    pub const DEVICES: &str = "devices added";
    pub const LOADED: &str = "kernel loaded, ACPI tables written";
    pub const VCPU_FDS: &str = "KVM_CREATE_VCPU (while vCPU 0's thread asks CPUID)";
    pub const CPUID_READY: &str = "KVM's CPUID entries in hand, PIT created";
    pub const VCPUS_CREATED: &str = "vCPUs configured (CPUID, MSRs, LAPIC, entry registers)";
    pub const THREADS: &str = "vCPUs handed to their threads (started ahead, filters on)";
    pub const DEVICES_THREAD: &str = "devices thread started (first needed)";
    pub const MAIN_SECCOMP: &str = "main thread's seccomp filter";
    pub const FIRST_RUN: &str = "first KVM_RUN";
    pub const FIRST_LINE: &str = "guest's first serial line written";
}

/// The moments of a restore (`run --restore --timing`, `vm.restore` with `-v`).
pub mod restore_moment {
    pub const ASKED: &str = "restore: asked (the snapshot's folder given)";
    pub const READ: &str = "restore: state.json and config.json read and checked";
    pub const KVM_OPEN: &str = "restore: /dev/kvm opened";
    /// A migration's destination: the VM was made at Config (`KVM_OPEN`, `VM` before this).
    pub const STATE: &str = "migration: State received, its VM made at Config";
    pub const THREADS_AHEAD: &str = "restore: vCPU threads started ahead";
    pub const DECODED: &str = "restore: saved KVM state decoded";
    pub const MEMORY: &str = "restore: guest memory mapped";
    pub const VM: &str = "restore: VM, memory slots, irqchip (PIT on its own thread)";
    pub const DEVICES: &str = "restore: devices added";
    pub const VCPUS: &str = "restore: vCPUs created, host CPU checked, VM and vCPU state set";
    pub const DEVICE_STATE: &str = "restore: device state put back";
    pub const PARKED: &str = "restore: vCPUs handed to their threads, parked";
    pub const RESUMED: &str = "resume: vCPUs let go";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_recorded_once_and_rendered_in_order() {
        let origin = Instant::now();
        let mut t = Timeline::new(origin, Some(Duration::from_micros(1500)));
        let later = origin + Duration::from_millis(3);
        t.record("second", later);
        t.record("first", origin + Duration::from_millis(1));
        t.record("second", origin + Duration::from_millis(9));
        assert_eq!(t.since_main("second"), Some(Duration::from_millis(3)));
        let text = t.render();
        let first = text.find("first").unwrap();
        let second = text.find("second").unwrap();
        assert!(first < second, "{text}");
        assert!(text.contains("began: 1.50 ms"), "{text}");
        assert!(text.contains("    3.00     +2.00  second"), "{text}");
    }
}
