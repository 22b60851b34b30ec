//! The ablation's turnarounds from one round's trace: per thread, each userspace I/O exit that
//! `kvm_pio` saw at the bench port (its filter lets nothing else through), inside one of the
//! row's batches, paired with the thread's next KVM_RUN inside the same batch.

use std::collections::HashMap;

use crate::compare::turnaround::parse;

/// A row's batch: thread `tid` ran it between TSC counts `start` and `end`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub tid: u32,
    pub start: u64,
    pub end: u64,
    /// The row it counts for.
    pub row: usize,
}

/// Per row: turnarounds in ns, loop exits seen, the first and last loop exit's TSC.
#[derive(Debug, Clone, Default)]
pub struct Paired {
    pub turnarounds_ns: Vec<Vec<f64>>,
    pub exits: Vec<u64>,
    pub span: Vec<(u64, u64)>,
}

#[derive(Default, Clone, Copy)]
struct ThreadState {
    /// kvm_pio at the bench port seen since the thread's last exit.
    marked: bool,
    /// The last loop exit's TSC, waiting for the next KVM_RUN.
    pending: Option<u64>,
}

/// Pairs `trace`'s events of the windows' threads, inside the windows, for `rows` rows.
pub fn pair(trace: &str, windows: &[Window], rows: usize, tsc_khz: u64) -> Paired {
    let ns_per_tick = 1e6 / tsc_khz.max(1) as f64;
    let mut out = Paired {
        turnarounds_ns: vec![Vec::new(); rows],
        exits: vec![0; rows],
        span: vec![(u64::MAX, 0); rows],
    };
    let mut threads: HashMap<u32, ThreadState> = HashMap::new();
    let events = trace
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse);
    for (tid, tsc, event) in events {
        let Some(w) = windows
            .iter()
            .find(|w| w.tid == tid && (w.start..=w.end).contains(&tsc))
        else {
            threads.remove(&tid);
            continue;
        };
        let state = threads.entry(tid).or_default();
        if event.starts_with("kvm_pio") {
            state.marked = true;
        } else if event.starts_with("kvm_userspace_exit") {
            state.pending = None;
            if std::mem::take(&mut state.marked) && event.contains("KVM_EXIT_IO") {
                state.pending = Some(tsc);
                out.exits[w.row] += 1;
                let span = &mut out.span[w.row];
                *span = (span.0.min(tsc), span.1.max(tsc));
            }
        } else if event.starts_with("sys_ioctl") {
            if let Some(exit) = state.pending.take() {
                let ns = tsc.saturating_sub(exit) as f64 * ns_per_tick;
                out.turnarounds_ns[w.row].push(ns);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 GHz: 2 ticks a nanosecond. Thread 100 is row 0 from 1000 to 2000, thread 200 row 1.
    const TRACE: &str = "\
# entries-in-buffer/entries-written: 12/12   #P:2
  ablation00-100   [001] ...1.  1000: kvm_pio: pio_write at 0x7e0 size 4 count 1 val 0x600dcafe
  ablation00-100   [001] d..1.  1010: kvm_userspace_exit: reason KVM_EXIT_IO (2)
  ablation00-100   [001] .....  1610: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
  ablation00-100   [001] d..1.  1700: kvm_userspace_exit: reason KVM_EXIT_IO (2)
  ablation00-100   [001] .....  1710: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
  ablation00-100   [001] ...1.  1800: kvm_pio: pio_write at 0x7e0 size 4 count 1 val 0x600dcafe
  ablation00-100   [001] d..1.  1810: kvm_userspace_exit: reason KVM_EXIT_IO (2)
  ablation00-100   [001] .....  2100: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
  ablation01-200   [000] ...1.  3000: kvm_pio: pio_write at 0x7e0 size 4 count 1 val 0x600dcafe
  ablation01-200   [000] d..1.  3004: kvm_userspace_exit: reason KVM_EXIT_IO (2)
       other-300   [000] .....  3005: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
  ablation01-200   [000] .....  3008: sys_ioctl(fd: 0xc, cmd: 0xae80, arg: 0x0)
";

    #[test]
    fn only_marked_exits_inside_a_batch_pair_with_the_same_threads_next_kvm_run() {
        let windows = [
            Window {
                tid: 100,
                start: 1000,
                end: 2000,
                row: 0,
            },
            Window {
                tid: 200,
                start: 0,
                end: u64::MAX,
                row: 1,
            },
        ];
        let got = pair(TRACE, &windows, 2, 2_000_000);
        assert_eq!(got.turnarounds_ns[0], [300.0], "unmarked exit left out");
        assert_eq!(
            got.exits[0], 2,
            "the batch's last exit counts, its next KVM_RUN is the next batch's"
        );
        assert_eq!(got.span[0], (1010, 1810));
        assert_eq!(
            got.turnarounds_ns[1],
            [2.0],
            "another thread's KVM_RUN is not this one's"
        );
        assert_eq!(got.exits[1], 1);
    }
}
