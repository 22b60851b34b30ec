//! What a VMM process's threads did over a window, read from /proc: on-CPU time
//! (`schedstat`, ns) and context switches (`status`: a thread that sleeps and is woken makes a
//! voluntary one, a thread preempted an involuntary one), per thread and by thread name.
//! The kernel's threads that live in the process's thread group (KVM's
//! `kvm-nx-lpage-recovery`, a user worker of the process since Linux 6.13) are kept apart:
//! they are KVM's, not the VMM's.

use std::collections::BTreeMap;

/// PF_KTHREAD and PF_USER_WORKER in the flags field of /proc/PID/task/TID/stat: a thread the
/// kernel runs, not the program.
const KERNEL_THREAD: u64 = 0x0020_0000 | 0x0000_4000;

/// One thread at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadSample {
    pub name: String,
    pub kernel: bool,
    pub cpu_ns: u64,
    pub switches: u64,
}

/// Every thread of `pid` now, by thread id.
pub fn sample(pid: u32) -> BTreeMap<u32, ThreadSample> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return BTreeMap::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let tid = t.file_name().to_str()?.parse().ok()?;
            let dir = t.path();
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            let schedstat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
            Some((tid, parse(&status, &schedstat, &stat)))
        })
        .collect()
}

fn parse(status: &str, schedstat: &str, stat: &str) -> ThreadSample {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
    };
    let count = |key: &str| field(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // The fields after the name (which may hold spaces and parentheses) start at field 3.
    let flags = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok())
        .unwrap_or(0);
    ThreadSample {
        name: field("Name:").unwrap_or("?").to_string(),
        kernel: flags & KERNEL_THREAD != 0,
        cpu_ns: schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        switches: count("voluntary_ctxt_switches:") + count("nonvoluntary_ctxt_switches:"),
    }
}

/// The CPU time `pid` has used so far, all its threads summed, those that ended included
/// (its process CPU clock, `clock_getcpuclockid`: utime + stime in ns, where
/// /proc/PID/stat gives them in ticks); `None` once it is gone.
pub fn process_cpu(pid: u32) -> Option<std::time::Duration> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid place for the clock id; the call writes only there.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec the call writes into; the clock id came from the
    // kernel just above.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return None;
    }
    let secs = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    Some(std::time::Duration::new(secs, nanos))
}

/// What a process's threads did between two samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Activity {
    /// On-CPU ns of the VMM's own threads (the vCPU's includes the guest's time).
    pub cpu_ns: u64,
    /// Context switches of the VMM's own threads.
    pub switches: u64,
    /// Context switches of kernel threads in its thread group.
    pub kernel_switches: u64,
    /// Context switches of the VMM's own threads by thread name (digits dropped: `vcpu0`
    /// and `vcpu1` are `vcpu`).
    pub by_name: BTreeMap<String, u64>,
}

/// The change from `before` to `after`; threads that came or went count from zero or not
/// at all.
pub fn activity(
    before: &BTreeMap<u32, ThreadSample>,
    after: &BTreeMap<u32, ThreadSample>,
) -> Activity {
    let mut a = Activity::default();
    for (tid, now) in after {
        let then = before.get(tid).cloned().unwrap_or_default();
        let switches = now.switches.saturating_sub(then.switches);
        if now.kernel {
            a.kernel_switches += switches;
            continue;
        }
        a.cpu_ns += now.cpu_ns.saturating_sub(then.cpu_ns);
        a.switches += switches;
        let name: String = now.name.chars().filter(|c| !c.is_ascii_digit()).collect();
        *a.by_name.entry(name.trim().to_string()).or_default() += switches;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_s_name_cpu_switches_and_kind_are_read() {
        let status = "Name:\tvcpu0\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t7\n\
                      nonvoluntary_ctxt_switches:\t2\n";
        let stat = "42 (vcpu0) S 1 42 42 0 -1 4194624 10 0";
        let t = parse(status, "123456 789 10\n", stat);
        assert_eq!(
            (t.name.as_str(), t.cpu_ns, t.switches, t.kernel),
            ("vcpu0", 123456, 9, false)
        );
        // KVM's NX recovery thread as Linux 6.18 shows it: a user worker (0x404040).
        let worker = "43 (kvm-nx-lpage-re) S 2 0 0 0 -1 4210752 0 0";
        assert!(parse("Name:\tkvm-nx-lpage-re\n", "", worker).kernel);
        let kthread = "44 (kworker/0:1) S 2 0 0 0 -1 2129984 0 0";
        assert!(parse("Name:\tkworker/0:1\n", "", kthread).kernel);
    }

    #[test]
    fn activity_is_the_change_of_own_threads_with_kernel_threads_apart() {
        let t = |name: &str, kernel, cpu_ns, switches| ThreadSample {
            name: name.into(),
            kernel,
            cpu_ns,
            switches,
        };
        let before = BTreeMap::from([
            (1, t("exitless", false, 100, 10)),
            (2, t("vcpu0", false, 50, 3)),
        ]);
        let after = BTreeMap::from([
            (1, t("exitless", false, 150, 14)),
            (2, t("vcpu0", false, 50, 3)),
            (3, t("kvm-nx-lpage-re", true, 9, 5)),
            (4, t("vcpu1", false, 20, 2)),
        ]);
        let a = activity(&before, &after);
        assert_eq!((a.cpu_ns, a.switches, a.kernel_switches), (70, 6, 5));
        assert_eq!(a.by_name["exitless"], 4);
        assert_eq!(a.by_name["vcpu"], 2);
    }

    #[test]
    fn a_process_cpu_clock_counts_a_child_s_work_and_ends_with_it() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut used = std::time::Duration::ZERO;
        for _ in 0..500 {
            used = process_cpu(pid).unwrap();
            if used > std::time::Duration::from_millis(1) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(used > std::time::Duration::from_millis(1), "{used:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(process_cpu(pid), None);
    }

    #[test]
    fn this_process_has_a_thread_that_ran() {
        let now = sample(std::process::id());
        assert!(!now.is_empty());
        assert!(now.values().any(|t| t.cpu_ns > 0 && !t.kernel), "{now:?}");
    }
}
