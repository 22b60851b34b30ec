//! A VMM's turnaround per userspace exit, measured from outside and the same way for every
//! VMM: on each of its threads, the time from KVM's `kvm_userspace_exit` tracepoint to the
//! thread's next `ioctl(KVM_RUN)` entry (`syscalls:sys_enter_ioctl`, filtered on the KVM_RUN
//! command), read from tracefs.
//!
//! The events are enabled in a tracefs instance of this process's own
//! (`instances/exitless-compare-PID`), never in the host's global buffer, with the `x86-tsc`
//! trace clock: its timestamps are TSC counts, which [`Tracer`] turns into nanoseconds with the
//! TSC frequency measured against CLOCK_MONOTONIC (the default clocks print microseconds). The
//! instance is removed when the tracer is dropped, and instances left by killed runs (their
//! process gone) are removed when the next one opens. Needs root; without it or tracefs,
//! [`Tracer::open`] says why in words that go into the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// KVM_RUN's ioctl number.
const KVM_RUN: u32 = 0xae80;
const TRACEFS: &str = "/sys/kernel/tracing";
const EXIT_EVENT: &str = "events/kvm/kvm_userspace_exit";
const IOCTL_EVENT: &str = "events/syscalls/sys_enter_ioctl";
/// The guest's newlines on COM1: the first one ends its first line, where a case's counting
/// starts (the parent reads that line later, by a scheduling delay that varies).
const NEWLINE_EVENT: &str = "events/kvm/kvm_pio";
const NEWLINE_FILTER: &str = "rw == 1 && port == 0x3f8 && val == 0xa";
/// Instances of this program are named this, then the process id.
const INSTANCE_PREFIX: &str = "exitless-compare-";
const TRACE_CLOCK: &str = "x86-tsc";

/// A tracefs instance with the two events enabled (KVM_RUN ioctls only); removed when dropped.
pub struct Tracer {
    dir: PathBuf,
    tsc_khz: u64,
}

/// What one run's trace says about the VMM's threads.
#[derive(Clone, Debug, Default)]
pub struct Traced {
    /// Turnaround per userspace exit, in ns.
    pub turnarounds_ns: Vec<f64>,
    /// Userspace exits seen (paired with a KVM_RUN or not).
    pub userspace_exits: u64,
}

impl Tracer {
    /// Creates this process's instance and enables the two events there, or says why not.
    pub fn open() -> Result<Tracer, String> {
        Self::open_with("", NEWLINE_FILTER)
    }

    /// Like [`Tracer::open`], in an instance whose name ends in `tag` (one process may hold
    /// one per tag), with `kvm_pio` filtered on `pio_filter` instead of the guest's newlines
    /// (the exit-path ablation marks the bench port's exits with it).
    pub fn open_with(tag: &str, pio_filter: &str) -> Result<Tracer, String> {
        // SAFETY: geteuid has no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (tracefs)".into());
        }
        let root = Path::new(TRACEFS);
        if !root.join("instances").exists() {
            let _ = std::process::Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .output();
        }
        for event in [EXIT_EVENT, IOCTL_EVENT] {
            if !root.join(event).exists() {
                return Err(format!("tracefs has no {event} here"));
            }
        }
        let clocks = std::fs::read_to_string(root.join("trace_clock")).unwrap_or_default();
        if !clocks
            .split_whitespace()
            .any(|c| c.trim_matches(['[', ']']) == TRACE_CLOCK)
        {
            return Err(format!("tracefs has no {TRACE_CLOCK} trace clock here"));
        }
        remove_stale_instances(&root.join("instances"));
        let dir = instance_dir(&root.join("instances"), std::process::id()).with_extension(tag);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let tracer = Tracer {
            dir,
            tsc_khz: vmm::profile::estimate_tsc_khz(std::time::Duration::from_millis(100)),
        };
        tracer.set("tracing_on", "0")?;
        tracer.set("trace_clock", TRACE_CLOCK)?;
        tracer.set("buffer_size_kb", "8192")?;
        tracer.set(
            &format!("{IOCTL_EVENT}/filter"),
            &format!("cmd == {KVM_RUN:#x}"),
        )?;
        tracer.set(&format!("{IOCTL_EVENT}/enable"), "1")?;
        tracer.set(&format!("{EXIT_EVENT}/enable"), "1")?;
        // Without it, counting starts where the parent read the first line.
        if tracer
            .set(&format!("{NEWLINE_EVENT}/filter"), pio_filter)
            .is_ok()
        {
            let _ = tracer.set(&format!("{NEWLINE_EVENT}/enable"), "1");
        }
        tracer.set("tracing_on", "1")?;
        Ok(tracer)
    }

    /// The instance's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The TSC frequency the trace's timestamps are converted with.
    pub fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }

    fn set(&self, file: &str, value: &str) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Empties the instance's buffer before a run.
    pub fn clear(&self) {
        let _ = std::fs::write(self.dir.join("trace"), "");
    }

    /// The trace's text since [`Tracer::clear`], or why not (e.g. the buffer overflowed).
    pub fn text(&self) -> Result<String, String> {
        let trace = std::fs::read_to_string(self.dir.join("trace"))
            .map_err(|e| format!("cannot read the trace: {e}"))?;
        if let Some(lost) = lost_entries(&trace) {
            return Err(format!("the trace buffer lost {lost} events"));
        }
        Ok(trace)
    }

    /// What the trace holds for the threads of process `pid` since [`Tracer::clear`], from the
    /// guest's first newline on COM1 on, or where the trace has none from TSC count `since` on
    /// (a userspace `rdtsc`: the trace clock is the same counter); an error says why nothing
    /// (e.g. the buffer overflowed).
    pub fn read(&self, pid: u32, since: u64) -> Result<Traced, String> {
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| format!("cannot list the VMM's threads: {e}"))?
            .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        Ok(traced(&self.text()?, &tids, since, self.tsc_khz))
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.set("tracing_on", "0");
        let _ = self.set(&format!("{EXIT_EVENT}/enable"), "0");
        let _ = self.set(&format!("{IOCTL_EVENT}/enable"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn instance_dir(instances: &Path, pid: u32) -> PathBuf {
    instances.join(format!("{INSTANCE_PREFIX}{pid}"))
}

/// Removes the instances of this program whose process is gone (a killed run's); returns
/// how many. An instance of a live exitless process is left alone.
pub fn remove_stale_instances(instances: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(instances) else {
        return 0;
    };
    let stale = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let pid = name
                .strip_prefix(INSTANCE_PREFIX)?
                .split('.')
                .next()?
                .parse()
                .ok()?;
            Some((name, pid))
        })
        .filter(|&(_, pid)| pid != std::process::id() && !is_exitless(pid))
        .collect::<Vec<(String, u32)>>();
    stale
        .into_iter()
        .filter(|(name, _)| std::fs::remove_dir(instances.join(name)).is_ok())
        .count()
}

/// Whether process `pid` lives and is an exitless binary (its pid not reused by another).
fn is_exitless(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
        exe.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("exitless"))
    })
}

/// `# entries-in-buffer/entries-written: 10/12` says 2 were lost.
fn lost_entries(trace: &str) -> Option<u64> {
    let key = "entries-in-buffer/entries-written:";
    let line = trace
        .lines()
        .find_map(|l| l.split_once(key).map(|(_, rest)| rest))?;
    let (kept, written) = line.split_whitespace().next()?.split_once('/')?;
    let (kept, written): (u64, u64) = (kept.parse().ok()?, written.parse().ok()?);
    (written > kept).then_some(written - kept)
}

/// Pairs, per thread of `tids`, each userspace exit from the first guest newline (or where
/// there is none, from TSC count `since`) on with the thread's next KVM_RUN; TSC timestamps
/// turned into ns at `tsc_khz`.
fn traced(trace: &str, tids: &[u32], since: u64, tsc_khz: u64) -> Traced {
    let ns_per_tick = 1e6 / tsc_khz.max(1) as f64;
    let events = || {
        trace
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(parse)
            .filter(|(tid, ..)| tids.contains(tid))
    };
    let since = events()
        .find(|(.., event)| event.starts_with("kvm_pio"))
        .map_or(since, |(_, tsc, _)| tsc);
    let mut pending: HashMap<u32, u64> = HashMap::new();
    let mut out = Traced::default();
    for (tid, tsc, event) in events().filter(|&(_, tsc, _)| tsc >= since) {
        if event.starts_with("kvm_userspace_exit") {
            out.userspace_exits += 1;
            pending.insert(tid, tsc);
        } else if event.starts_with("sys_ioctl") {
            if let Some(exit) = pending.remove(&tid) {
                out.turnarounds_ns
                    .push(tsc.saturating_sub(exit) as f64 * ns_per_tick);
            }
        }
    }
    out
}

/// `  comm-1234  [001] d..1. 1234567890: event: ...` -> (1234, 1234567890, "event: ...").
pub(crate) fn parse(line: &str) -> Option<(u32, u64, &str)> {
    let bracket = line.find(" [")?;
    let tid = line[..bracket].trim().rsplit('-').next()?.parse().ok()?;
    let rest = &line[bracket..];
    let colon = rest.find(": ")?;
    let tsc = rest[..colon].split_whitespace().last()?.parse().ok()?;
    Some((tid, tsc, &rest[colon + 2..]))
}

/// min, median and p99 of a set of turnarounds.
pub fn percentiles(values: &mut [f64]) -> Option<[f64; 3]> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    Some([values[0], at(0.5), at(0.99)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 GHz: 2 ticks a nanosecond.
    const TRACE: &str = "\
# entries-in-buffer/entries-written: 6/6   #P:2
            vcpu0-100   [001] d..1.  20000000: kvm_userspace_exit: reason KVM_EXIT_IO (2)
           other-200    [000] d..1.  20000011: kvm_userspace_exit: reason KVM_EXIT_IO (2)
            vcpu0-100   [001] .....  20001601: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
           other-200    [000] .....  20009111: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
 qemu-system-x86-101    [001] d..1.  20020000: kvm_userspace_exit: reason KVM_EXIT_MMIO (6)
 qemu-system-x86-101    [001] .....  20029999: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
";

    #[test]
    fn each_exit_pairs_with_the_same_threads_next_kvm_run_in_ns() {
        let got = traced(TRACE, &[100, 101], 0, 2_000_000);
        assert_eq!(got.turnarounds_ns, [800.5, 4999.5], "other pid left out");
        assert_eq!(got.userspace_exits, 2);
        let later = traced(TRACE, &[100, 101], 20_010_000, 2_000_000);
        assert_eq!(
            later.turnarounds_ns,
            [4999.5],
            "exits before `since` left out"
        );
        let marked = format!(
            "{TRACE}{}",
            "            vcpu0-100   [001] ...1.  20040000: kvm_pio: pio_write at 0x3f8 size 1 count 1 val 0xa
            vcpu0-100   [001] d..1.  20040010: kvm_userspace_exit: reason KVM_EXIT_IO (2)
            vcpu0-100   [001] .....  20040030: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
"
        );
        let from_newline = traced(&marked, &[100, 101], 0, 2_000_000);
        assert_eq!(
            (from_newline.turnarounds_ns, from_newline.userspace_exits),
            (vec![10.0], 1),
            "counted from the guest's first newline, wherever the parent saw it"
        );
        assert_eq!(lost_entries(TRACE), None);
        assert_eq!(
            lost_entries("# entries-in-buffer/entries-written: 10/12   #P:2"),
            Some(2)
        );
    }

    #[test]
    fn percentiles_are_min_median_p99() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut v), Some([1.0, 51.0, 99.0]));
        assert_eq!(percentiles(&mut []), None);
    }

    #[test]
    fn only_instances_of_gone_processes_are_removed() {
        let dir = std::env::temp_dir().join(format!("exitless-instances-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // pid_max is at most 2^22: this pid is never alive.
        let gone = instance_dir(&dir, 4_194_400);
        let mine = instance_dir(&dir, std::process::id());
        let other = dir.join("someone-else");
        let gone_tagged = gone.with_extension("ablation");
        let mine_tagged = mine.with_extension("ablation");
        for d in [&gone, &mine, &other, &gone_tagged, &mine_tagged] {
            std::fs::create_dir_all(d).unwrap();
        }
        assert_eq!(remove_stale_instances(&dir), 2);
        assert!(!gone.exists() && mine.exists() && other.exists());
        assert!(!gone_tagged.exists() && mine_tagged.exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
