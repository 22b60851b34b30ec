//! A VMM's turnaround per userspace exit, measured from outside and the same way for every
//! VMM: on each of its threads, the time from KVM's `kvm_userspace_exit` tracepoint to the
//! thread's next `ioctl(KVM_RUN)` entry (`syscalls:sys_enter_ioctl`, filtered on the KVM_RUN
//! command), read from tracefs. Needs root and tracefs; without them, [`Tracer::open`] says
//! why in words that go into the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// KVM_RUN's ioctl number.
const KVM_RUN: u32 = 0xae80;
const TRACEFS: &str = "/sys/kernel/tracing";
const EXIT_EVENT: &str = "events/kvm/kvm_userspace_exit";
const IOCTL_EVENT: &str = "events/syscalls/sys_enter_ioctl";

/// tracefs set up for the two events; restores what it changed when dropped.
pub struct Tracer {
    root: PathBuf,
    saved: Vec<(PathBuf, String)>,
}

impl Tracer {
    /// Enables the two events (KVM_RUN ioctls only), or says why it cannot.
    pub fn open() -> Result<Tracer, String> {
        // SAFETY: geteuid has no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (tracefs)".into());
        }
        let root = Path::new(TRACEFS);
        if !root.join(EXIT_EVENT).exists() {
            let _ = std::process::Command::new("mount")
                .args(["-t", "tracefs", "nodev", TRACEFS])
                .output();
        }
        for event in [EXIT_EVENT, IOCTL_EVENT] {
            if !root.join(event).exists() {
                return Err(format!("tracefs has no {event} here"));
            }
        }
        let mut tracer = Tracer {
            root: root.to_path_buf(),
            saved: Vec::new(),
        };
        tracer.set("buffer_size_kb", "8192")?;
        tracer.set(
            &format!("{IOCTL_EVENT}/filter"),
            &format!("cmd == {KVM_RUN:#x}"),
        )?;
        tracer.set(&format!("{IOCTL_EVENT}/enable"), "1")?;
        tracer.set(&format!("{EXIT_EVENT}/enable"), "1")?;
        tracer.set("tracing_on", "1")?;
        Ok(tracer)
    }

    fn set(&mut self, file: &str, value: &str) -> Result<(), String> {
        let path = self.root.join(file);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        std::fs::write(&path, value)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let old = match file {
            f if f.ends_with("/filter") && old.trim() == "none" => "0".to_string(),
            "buffer_size_kb" => old.split_whitespace().next().unwrap_or("1408").to_string(),
            _ => old.trim().to_string(),
        };
        self.saved.push((path, old));
        Ok(())
    }

    /// Empties the trace buffer before a run.
    pub fn clear(&self) {
        let _ = std::fs::write(self.root.join("trace"), "");
    }

    /// The turnarounds (µs) of the threads of process `pid` since [`Tracer::clear`]; an error
    /// says why there are none (e.g. the buffer overflowed).
    pub fn turnarounds(&self, pid: u32) -> Result<Vec<f64>, String> {
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| format!("cannot list the VMM's threads: {e}"))?
            .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let trace = std::fs::read_to_string(self.root.join("trace"))
            .map_err(|e| format!("cannot read the trace: {e}"))?;
        if let Some(lost) = lost_entries(&trace) {
            return Err(format!("the trace buffer lost {lost} events"));
        }
        Ok(turnarounds(&trace, &tids))
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        for (path, old) in self.saved.drain(..).rev() {
            let _ = std::fs::write(path, old);
        }
    }
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

/// Pairs, per thread of `tids`, each userspace exit with the thread's next KVM_RUN.
fn turnarounds(trace: &str, tids: &[u32]) -> Vec<f64> {
    let mut pending: HashMap<u32, f64> = HashMap::new();
    let mut out = Vec::new();
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let Some((tid, time, event)) = parse(line) else {
            continue;
        };
        if !tids.contains(&tid) {
            continue;
        }
        if event.starts_with("kvm_userspace_exit") {
            pending.insert(tid, time);
        } else if event.starts_with("sys_ioctl") {
            if let Some(exit) = pending.remove(&tid) {
                out.push((time - exit) * 1e6);
            }
        }
    }
    out
}

/// `  comm-1234  [001] d..1.  567.000123: event: ...` -> (1234, 567.000123, "event: ...").
fn parse(line: &str) -> Option<(u32, f64, &str)> {
    let bracket = line.find(" [")?;
    let tid = line[..bracket].trim().rsplit('-').next()?.parse().ok()?;
    let rest = &line[bracket..];
    let colon = rest.find(": ")?;
    let time = rest[..colon].split_whitespace().last()?.parse().ok()?;
    Some((tid, time, &rest[colon + 2..]))
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

    const TRACE: &str = "\
# entries-in-buffer/entries-written: 6/6   #P:2
            vcpu0-100   [001] d..1.  10.000010: kvm_userspace_exit: reason KVM_EXIT_IO (2)
           other-200    [000] d..1.  10.000011: kvm_userspace_exit: reason KVM_EXIT_IO (2)
            vcpu0-100   [001] .....  10.000013: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
           other-200    [000] .....  10.000111: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
 qemu-system-x86-101    [001] d..1.  10.000020: kvm_userspace_exit: reason KVM_EXIT_MMIO (6)
 qemu-system-x86-101    [001] .....  10.000025: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
";

    #[test]
    fn each_exit_pairs_with_the_same_threads_next_kvm_run() {
        let mut got = turnarounds(TRACE, &[100, 101]);
        got.iter_mut().for_each(|v| *v = v.round());
        assert_eq!(got, [3.0, 5.0], "the other process's thread is left out");
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
}
