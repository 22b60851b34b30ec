//! One run of one VMM: started, its console read line by line with the time each line came,
//! measured from /proc once the guest printed `EXITLESS DONE`, then killed (no VMM is left
//! running, whatever it would do after the guest's last line: reset, reboot, hang).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::CompareError;
use crate::bench::result::{parse_line, GuestLine, GuestResult};
use vmm::devices::virtio::net::private_net::PrivateNet;

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunSample {
    /// From spawning the process to the guest's first console line.
    pub first_line_ms: f64,
    /// From spawning the process to `EXITLESS DONE`.
    pub done_ms: f64,
    /// The guest's result line for its case.
    #[serde(skip)]
    pub result: GuestResult,
    /// Peak RSS (VmHWM) when the guest was done.
    pub peak_rss_kib: u64,
    /// Private dirty memory when the guest was done: the sum of `Private_Dirty:` over
    /// `/proc/PID/smaps` (smaps_rollup is not used: it misreports a static binary's text).
    pub private_dirty_kib: u64,
    /// RSS beyond the guest RAM mapping (the largest mapping's RSS left out).
    pub rss_beyond_guest_kib: u64,
    /// Process CPU time until the guest was done (user, system, of which guest).
    pub cpu: CpuTimes,
    /// On-CPU time of all the VMM's threads until the guest was done, in ns (schedstat:
    /// nanoseconds, where /proc/PID/stat counts clock ticks); vCPU threads include the
    /// time they ran the guest.
    pub threads_cpu_ns: u64,
    /// The same when the guest's first console line came (firmware and start-up behind).
    pub threads_cpu_at_first_line_ns: u64,
}

/// When a run tells its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The guest's first console line came (firmware and start-up behind).
    FirstLine,
    /// The guest printed its last line; the VMM still runs.
    Done,
}

/// CPU time from /proc/PID/stat, in ms.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuTimes {
    pub user_ms: f64,
    pub system_ms: f64,
    pub guest_ms: f64,
}

/// Starts `cmd` (inside `net` when given) and waits up to `limit` for the guest to finish its
/// case; `tell` hears the guest's first line and its last (the VMM still running), with the
/// process id.
pub fn run(
    mut cmd: Command,
    net: Option<&PrivateNet>,
    case: &str,
    limit: Duration,
    tell: &mut dyn FnMut(Moment, u32),
) -> Result<RunSample, CompareError> {
    let started = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match net {
        Some(net) => net.run(|| cmd.spawn()).and_then(|spawned| spawned),
        None => cmd.spawn(),
    }
    .map_err(CompareError::Spawn)?;
    let last_error = last_line_of(child.stderr.take());
    let outcome = read_until_done(&mut child, case, started, limit, tell);
    let _ = child.kill();
    let _ = child.wait();
    outcome.map_err(|e| match e {
        CompareError::Ended(status) => match last_error.join().ok().flatten() {
            Some(line) => CompareError::Ended(format!("{status}: {line}")),
            None => CompareError::Ended(status),
        },
        other => other,
    })
}

/// Drops `program`'s page cache (written back first), so that its first run faults its text
/// in from disk, as after a reboot. How a file's cache was filled shapes the text a process
/// maps: a binary just copied by `cp` mapped ~130 kB more of its text per VM (peak RSS) than
/// the same bytes faulted in from disk (and ~60 kB more when read through `read`), and text
/// whose cache is still dirty counts as private dirty. Done once per VMM before the first
/// round: that round's first line includes reading the binary.
pub fn drop_page_cache(program: &std::path::Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(program)?;
    file.sync_data()?;
    // SAFETY: advice on a file descriptor this function owns; no memory is involved.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    match advised {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Reads a child's stderr to its end on a thread of its own; gives its last non-empty line.
fn last_line_of(
    stderr: Option<std::process::ChildStderr>,
) -> std::thread::JoinHandle<Option<String>> {
    std::thread::spawn(move || {
        let mut last = None;
        for line in BufReader::new(stderr?).lines().map_while(Result::ok) {
            if !line.trim().is_empty() {
                last = Some(line.trim().chars().take(200).collect());
            }
        }
        last
    })
}

fn read_until_done(
    child: &mut Child,
    case: &str,
    started: Instant,
    limit: Duration,
    tell: &mut dyn FnMut(Moment, u32),
) -> Result<RunSample, CompareError> {
    let stdout = child.stdout.take().ok_or(CompareError::NoConsole)?;
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    let mut first_line = None;
    let mut cpu_at_first_line = 0;
    let mut result = None;
    loop {
        let left = limit.saturating_sub(started.elapsed());
        let (at, line) = match lines.recv_timeout(left) {
            Ok(got) => got,
            Err(RecvTimeoutError::Timeout) => return Err(CompareError::Timeout(limit)),
            Err(RecvTimeoutError::Disconnected) => {
                return Err(CompareError::Ended(exit_status(child)))
            }
        };
        if first_line.is_none() {
            first_line = Some(at);
            cpu_at_first_line = threads_cpu_ns(child.id());
            tell(Moment::FirstLine, child.id());
        }
        match parse_line(line.trim_end_matches('\r')) {
            Ok(GuestLine::Result(r)) if r.case == case => result = Some(r),
            Ok(GuestLine::Error(e)) => return Err(CompareError::Guest(e)),
            Ok(GuestLine::Skip { reason, .. }) => return Err(CompareError::Guest(reason)),
            Ok(GuestLine::Done) => {
                let result = result.ok_or(CompareError::NoResult)?;
                let mut sample = sample(child.id(), started, first_line, at, result);
                sample.threads_cpu_at_first_line_ns = cpu_at_first_line;
                tell(Moment::Done, child.id());
                return Ok(sample);
            }
            _ => {}
        }
    }
}

fn sample(
    pid: u32,
    started: Instant,
    first: Option<Instant>,
    done: Instant,
    result: GuestResult,
) -> RunSample {
    let ms = |t: Instant| t.duration_since(started).as_secs_f64() * 1e3;
    let peak_rss_kib = status_kib(pid, "VmHWM:");
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    RunSample {
        first_line_ms: ms(first.unwrap_or(done)),
        done_ms: ms(done),
        result,
        peak_rss_kib,
        private_dirty_kib: private_dirty_kib(&smaps),
        rss_beyond_guest_kib: rss_beyond_largest_mapping(&smaps),
        cpu: cpu_times(pid),
        threads_cpu_ns: threads_cpu_ns(pid),
        threads_cpu_at_first_line_ns: 0,
    }
}

/// The sum of `/proc/PID/task/*/schedstat`'s first field: ns on a CPU, per thread.
fn threads_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn exit_status(child: &mut Child) -> String {
    match child.wait() {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A process's memory now, kB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// VmHWM.
    pub peak_rss_kib: u64,
    /// `Private_Dirty:` summed over /proc/PID/smaps.
    pub private_dirty_kib: u64,
    /// `Pss:` summed the same way: its share of what it maps, shared pages split between
    /// the processes that map them (a VMM binary's text between every VM it runs).
    pub pss_kib: u64,
}

/// Process `pid`'s memory now (zero where /proc cannot be read).
pub fn memory_of(pid: u32) -> Memory {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    Memory {
        peak_rss_kib: status_kib(pid, "VmHWM:"),
        private_dirty_kib: private_dirty_kib(&smaps),
        pss_kib: sum_of(&smaps, "Pss:"),
    }
}

/// The kB figure of an smaps field's value (` 1234 kB`).
fn smaps_kib(value: &str) -> u64 {
    value
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The sum of every mapping's `Private_Dirty:` in an smaps text, in kB.
fn private_dirty_kib(smaps: &str) -> u64 {
    sum_of(smaps, "Private_Dirty:")
}

/// The sum of every mapping's `field` (e.g. `Pss:`) in an smaps text, in kB.
fn sum_of(smaps: &str, field: &str) -> u64 {
    smaps
        .lines()
        .filter_map(|l| l.strip_prefix(field))
        .map(smaps_kib)
        .sum()
}

/// Total RSS less the RSS of the largest mapping (guest RAM, for every VMM here), from an
/// smaps text.
fn rss_beyond_largest_mapping(smaps: &str) -> u64 {
    let (mut total, mut largest, mut size, mut guest_rss) = (0u64, 0u64, 0u64, 0u64);
    for line in smaps.lines() {
        if let Some(rss) = line.strip_prefix("Rss:") {
            let kib = smaps_kib(rss);
            total += kib;
            if size > largest {
                (largest, guest_rss) = (size, kib);
            }
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((lo, hi)) = range.split_once('-') {
                if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
                {
                    size = hi - lo;
                }
            }
        }
    }
    total.saturating_sub(guest_rss)
}

/// utime, stime and guest_time (fields 14, 15 and 43 of /proc/PID/stat), in ms.
fn cpu_times(pid: u32) -> CpuTimes {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return CpuTimes::default();
    };
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    CpuTimes {
        user_ms: field(14) * 1e3 / ticks,
        system_ms: field(15) * 1e3 / ticks,
        guest_ms: field(43) * 1e3 / ticks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn a_run_ends_at_done_with_its_result_and_the_process_is_killed() {
        let script = "echo 'EXITLESS START version=1'; \
            echo 'EXITLESS RESULT case=pio_out cpl=3 iters=10 cycles=1000 empty=10 ipis=0 uds=0'; \
            echo 'EXITLESS DONE'; sleep 30";
        let started = Instant::now();
        let mut pid = None;
        let mut heard = Vec::new();
        let s = run(
            sh(script),
            None,
            "pio_out",
            Duration::from_secs(10),
            &mut |m, p| {
                heard.push(m);
                pid = Some(p);
            },
        )
        .unwrap();
        assert_eq!(heard, [Moment::FirstLine, Moment::Done]);
        assert!(pid.is_some(), "told the pid at DONE");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed, not waited for"
        );
        assert_eq!((s.result.iters, s.result.cycles), (10, 1000));
        assert!(s.first_line_ms <= s.done_ms);
        assert!(s.peak_rss_kib > 0);
        assert!(
            0 < s.private_dirty_kib && s.private_dirty_kib <= s.peak_rss_kib,
            "{s:?}"
        );
        assert!(s.threads_cpu_ns > 0, "schedstat read");
        assert!(s.threads_cpu_at_first_line_ns <= s.threads_cpu_ns);
    }

    #[test]
    fn a_program_s_page_cache_is_dropped_and_its_bytes_stay() {
        let path = std::env::temp_dir().join(format!("exitless-cache-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 300 << 10]).unwrap();
        let dropped = drop_page_cache(&path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        dropped.unwrap();
        assert!(bytes.len() == 300 << 10 && bytes.iter().all(|b| *b == 7));
        assert!(
            drop_page_cache(&path).is_err(),
            "a missing program is an error"
        );
    }

    #[test]
    fn a_guest_that_never_finishes_or_fails_is_one_clear_error() {
        let e = run(
            sh("echo 'EXITLESS START'; sleep 30"),
            None,
            "pio_out",
            Duration::from_millis(300),
            &mut |_, _| {},
        );
        assert!(matches!(e, Err(CompareError::Timeout(_))), "{e:?}");
        let e = run(
            sh("echo 'EXITLESS START'; exit 3"),
            None,
            "pio_out",
            Duration::from_secs(10),
            &mut |_, _| {},
        );
        assert!(e.unwrap_err().to_string().contains("exit status: 3"));
        let e = run(
            sh("echo 'EXITLESS ERROR exception vector=8'; sleep 30"),
            None,
            "pio_out",
            Duration::from_secs(10),
            &mut |_, _| {},
        );
        assert!(e.unwrap_err().to_string().contains("vector=8"));
        let e = run(
            sh("echo 'EXITLESS DONE'"),
            None,
            "pio_out",
            Duration::from_secs(10),
            &mut |_, _| {},
        );
        assert!(matches!(e, Err(CompareError::NoResult)), "{e:?}");
    }

    /// Two mappings of a real smaps, cut short: text (clean), and guest RAM (the largest).
    const SMAPS: &str = "\
00400000-00632000 r-xp 00000000 fe:01 1234   /usr/local/bin/exitless
Size:               2248 kB
Rss:                1620 kB
Shared_Dirty:          0 kB
Private_Clean:      1600 kB
Private_Dirty:        20 kB
7f0000000000-7f0020000000 rw-p 00000000 00:00 0
Size:             524288 kB
Rss:                 104 kB
Private_Dirty:       104 kB
Private_Hugetlb:       0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0    [stack]
Size:                132 kB
Rss:                  44 kB
Private_Dirty:        44 kB
VmFlags: rd wr mr mw me gd ac
";

    #[test]
    fn private_dirty_sums_every_mapping_and_beyond_leaves_the_largest_out() {
        assert_eq!(private_dirty_kib(SMAPS), 20 + 104 + 44);
        assert_eq!(rss_beyond_largest_mapping(SMAPS), 1620 + 44);
        assert_eq!(private_dirty_kib(""), 0);
        assert_eq!(sum_of(SMAPS, "Private_Clean:"), 1600);
        assert_eq!(private_dirty_kib("Private_Dirty: x kB\n"), 0);
    }
}
