//! CPU time and wake-ups of every thread over a bench loop: exitless's own threads (the vCPU,
//! the devices thread, the rest) and a back end's process (virtiofsd), sampled at the guest's
//! begin and end markers.
//!
//! The markers are seen on the vCPU thread, whose seccomp filter allows no `open`: the files
//! are read by a sampler thread of the bench's own (unfiltered, started before the VM runs),
//! which the vCPU thread asks and waits for. The vCPU sleeps while the sample is taken, so its
//! own CPU time is up to date in it, and the guest is stopped: the sample is outside its loop.

use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use serde::Serialize;

/// The sampler thread's name: left out of the samples.
const SAMPLER: &str = "bench-sampler";

/// One thread of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSample {
    pub tid: u32,
    pub name: String,
    /// Time on a CPU (`schedstat`), ns.
    pub cpu_ns: u64,
    /// Times it went to sleep (`voluntary_ctxt_switches`): once per wake-up.
    pub voluntary: u64,
}

/// A back end process: all its threads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessSample {
    /// Each live thread's id and time on a CPU (`schedstat`), ns.
    pub threads: Vec<(u32, u64)>,
    /// utime + stime of the whole process (`stat`, threads that ended included), in ms:
    /// clock-tick resolution.
    pub cpu_ticks_ms: u64,
}

/// This process's threads and the back end's, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadsSample {
    pub own: Vec<TaskSample>,
    pub backend: Option<ProcessSample>,
}

/// What the threads used between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ThreadsCpu {
    /// vCPU threads (`vcpu*`): the guest's own time included.
    pub vcpu_ns: u64,
    /// The devices thread (event loop).
    pub devices_ns: u64,
    /// exitless's other threads (the one waiting for the VM, ...).
    pub other_ns: u64,
    /// Times the devices thread woke (voluntary context switches); None if it was not found.
    pub devices_wakeups: Option<u64>,
    /// The back end's threads.
    pub backend_ns: Option<u64>,
    /// The back end's utime + stime, ms (clock ticks: coarse).
    pub backend_ticks_ms: Option<u64>,
}

/// Reads samples on a thread of its own, when asked.
pub struct ThreadSampler {
    ask: Option<Sender<()>>,
    answers: Receiver<ThreadsSample>,
    thread: Option<JoinHandle<()>>,
}

impl ThreadSampler {
    /// Starts the sampler of this process's threads and of process `backend`'s, if given.
    pub fn start(backend: Option<u32>) -> std::io::Result<Self> {
        let (ask, asked) = channel::<()>();
        let (answer, answers) = channel();
        let thread = std::thread::Builder::new()
            .name(SAMPLER.into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    if answer.send(sample(backend)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(ThreadSampler {
            ask: Some(ask),
            answers,
            thread: Some(thread),
        })
    }

    /// A sample taken now (waits for the sampler thread); None if it has gone.
    pub fn sample(&mut self) -> Option<ThreadsSample> {
        self.ask.as_ref()?.send(()).ok()?;
        self.answers.recv().ok()
    }
}

impl Drop for ThreadSampler {
    fn drop(&mut self) {
        self.ask = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This process's threads (the sampler left out) and `backend`'s.
fn sample(backend: Option<u32>) -> ThreadsSample {
    let own = std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| task_sample(&t.ok()?.path()))
                .filter(|t| t.name != SAMPLER)
                .collect()
        })
        .unwrap_or_default();
    ThreadsSample {
        own,
        backend: backend.map(process_sample),
    }
}

fn task_sample(dir: &Path) -> Option<TaskSample> {
    let tid = dir.file_name()?.to_str()?.parse().ok()?;
    let name = std::fs::read_to_string(dir.join("comm")).ok()?;
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    Some(TaskSample {
        tid,
        name: name.trim().to_string(),
        cpu_ns: schedstat_ns(dir)?,
        voluntary: status_field(&status, "voluntary_ctxt_switches:")?,
    })
}

/// The first field of `DIR/schedstat`: ns on a CPU.
fn schedstat_ns(dir: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(dir.join("schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .parse()
        .ok()
}

/// Process `pid`'s CPU time now: its live threads' (ns) and the whole process's (ticks).
pub fn process_sample(pid: u32) -> ProcessSample {
    let root = format!("/proc/{pid}");
    let threads = std::fs::read_dir(format!("{root}/task"))
        .map(|tasks| {
            tasks
                .filter_map(|t| {
                    let dir = t.ok()?.path();
                    let tid = dir.file_name()?.to_str()?.parse().ok()?;
                    Some((tid, schedstat_ns(&dir)?))
                })
                .collect()
        })
        .unwrap_or_default();
    let stat = std::fs::read_to_string(format!("{root}/stat")).unwrap_or_default();
    ProcessSample {
        threads,
        cpu_ticks_ms: stat_cpu_ms(&stat),
    }
}

impl ProcessSample {
    /// CPU time used since `earlier`, ns: summed over threads alive at both moments, so a
    /// thread that ends in between takes its whole time out of neither sample.
    pub fn ns_since(&self, earlier: &ProcessSample) -> u64 {
        self.threads
            .iter()
            .filter_map(|(tid, ns)| {
                let (_, then) = earlier.threads.iter().find(|(t, _)| t == tid)?;
                Some(ns.saturating_sub(*then))
            })
            .sum()
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in ms.
fn stat_cpu_ms(stat: &str) -> u64 {
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    (field(14) + field(15)) * 1000 / hz
}

/// What each kind of thread used from `a` to `b`: threads present in both only (one that
/// started or ended in between has no span to measure).
pub fn between(a: &ThreadsSample, b: &ThreadsSample) -> ThreadsCpu {
    let mut cpu = ThreadsCpu::default();
    for end in &b.own {
        let Some(start) = a.own.iter().find(|t| t.tid == end.tid) else {
            continue;
        };
        let ns = end.cpu_ns.saturating_sub(start.cpu_ns);
        if end.name.starts_with("vcpu") {
            cpu.vcpu_ns += ns;
        } else if end.name == "devices" {
            cpu.devices_ns += ns;
            let woke = end.voluntary.saturating_sub(start.voluntary);
            cpu.devices_wakeups = Some(cpu.devices_wakeups.unwrap_or(0) + woke);
        } else {
            cpu.other_ns += ns;
        }
    }
    if let (Some(x), Some(y)) = (&a.backend, &b.backend) {
        cpu.backend_ns = Some(y.ns_since(x));
        cpu.backend_ticks_ms = Some(y.cpu_ticks_ms.saturating_sub(x.cpu_ticks_ms));
    }
    cpu
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tid: u32, name: &str, cpu_ns: u64, voluntary: u64) -> TaskSample {
        TaskSample {
            tid,
            name: name.into(),
            cpu_ns,
            voluntary,
        }
    }

    #[test]
    fn the_span_is_split_by_thread_kind_and_counts_devices_wakeups() {
        let a = ThreadsSample {
            own: vec![
                task(1, "exitless", 100, 5),
                task(2, "vcpu0", 1000, 1),
                task(3, "devices", 50, 10),
                task(4, "gone", 7, 0),
            ],
            backend: Some(ProcessSample {
                // Thread 8 ends before the second sample: its time must not count as -200.
                threads: vec![(7, 300), (8, 200)],
                cpu_ticks_ms: 10,
            }),
        };
        let b = ThreadsSample {
            own: vec![
                task(1, "exitless", 130, 6),
                task(2, "vcpu0", 9000, 1),
                task(3, "devices", 50, 10),
                task(5, "new", 999, 0),
            ],
            backend: Some(ProcessSample {
                threads: vec![(7, 4300), (9, 999)],
                cpu_ticks_ms: 20,
            }),
        };
        let cpu = between(&a, &b);
        assert_eq!((cpu.vcpu_ns, cpu.devices_ns, cpu.other_ns), (8000, 0, 30));
        assert_eq!(cpu.devices_wakeups, Some(0));
        assert_eq!(
            (cpu.backend_ns, cpu.backend_ticks_ms),
            (Some(4000), Some(10))
        );
        let mut woken = b.clone();
        woken.own[2].voluntary = 13;
        assert_eq!(between(&a, &woken).devices_wakeups, Some(3));
        let no_devices = ThreadsSample::default();
        assert_eq!(between(&no_devices, &b).devices_wakeups, None);
    }

    #[test]
    fn the_sampler_sees_this_process_and_a_back_end_but_not_itself() {
        let mut s = ThreadSampler::start(Some(std::process::id())).unwrap();
        let first = s.sample().unwrap();
        assert!(!first.own.is_empty());
        assert!(first.own.iter().all(|t| t.name != SAMPLER));
        assert!(first.own.iter().any(|t| t.tid == std::process::id()));
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {
            std::hint::black_box(0);
        }
        let second = s.sample().unwrap();
        let cpu = between(&first, &second);
        let backend = cpu.backend_ns.unwrap();
        assert!(
            backend > 0,
            "this process as the back end used CPU: {cpu:?}"
        );
        drop(s);
    }

    #[test]
    fn stat_lines_with_spaces_in_the_name_parse() {
        // SAFETY: sysconf takes a constant and touches no memory of ours.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        let line = "42 (a b) S 1 1 1 0 -1 0 0 0 0 0 30 20 0 0";
        assert_eq!(stat_cpu_ms(line), 50 * 1000 / hz);
        assert_eq!(stat_cpu_ms("garbage"), 0);
    }
}
