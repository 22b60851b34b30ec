//! What the VMM tells its vCPU threads: run, pause or stop. The exit loop reads one word per
//! exit ([`VmControl::state`], a line nobody writes while the VM runs); pausing and stopping
//! write it and then kick the threads out of KVM_RUN. A paused vCPU waits on a condition
//! variable, so a paused VM takes no CPU. A paused vCPU also runs work it is given
//! ([`VmControl::run_task`]) on its own thread, with its own fd: what a snapshot reads.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use kvm_ioctls::VcpuFd;

/// The vCPUs run.
pub const RUN: u8 = 0;
/// The vCPUs park at their next exit until resumed.
pub const PAUSE: u8 = 1;
/// The vCPUs end at their next exit.
pub const STOP: u8 = 2;

/// Work for each parked vCPU, run once on its own thread with its id and fd.
pub type VcpuTask = Arc<dyn Fn(usize, &VcpuFd) + Send + Sync>;

/// Why a parked vCPU stopped waiting.
pub enum Unparked {
    /// The VM runs again.
    Run,
    /// The VM stops.
    Stop,
    /// Run this task (of this generation), then report it done and park again.
    Task(u64, VcpuTask),
}

/// What the parked vCPUs share, under one lock taken only to pause, resume, stop and hand
/// out tasks, never per exit.
#[derive(Default)]
struct Parked {
    count: usize,
    /// The task parked vCPUs are to run, with its generation (one more per task).
    task: Option<(u64, VcpuTask)>,
    generation: u64,
    /// The vCPUs that ran the current task.
    done: Vec<usize>,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked")
            .field("count", &self.count)
            .field("generation", &self.generation)
            .field("done", &self.done)
            .finish()
    }
}

/// State the VM shares with its vCPU threads: read per exit, written only to pause, resume
/// or stop.
#[derive(Debug, Default)]
pub struct VmControl {
    state: CachePadded<AtomicU8>,
    /// vCPUs parked now and their task; its lock is never taken per exit.
    parked: Mutex<Parked>,
    changed: Condvar,
}

impl VmControl {
    /// [`RUN`], [`PAUSE`] or [`STOP`].
    #[inline]
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// Whether the vCPUs were told to stop.
    pub fn stopping(&self) -> bool {
        self.state() == STOP
    }

    fn set(&self, state: u8) {
        let _parked = self.lock();
        self.state.store(state, Ordering::Release);
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the vCPUs to stop (also a paused one). The caller kicks them.
    pub fn request_stop(&self) {
        self.set(STOP);
    }

    /// Tells the vCPUs to park at their next exit, unless they are stopping. The caller kicks
    /// them and waits with [`VmControl::wait_parked`].
    pub fn request_pause(&self) {
        if !self.stopping() {
            self.set(PAUSE);
        }
    }

    /// Lets parked vCPUs run again, unless they are stopping.
    pub fn resume(&self) {
        if !self.stopping() {
            self.set(RUN);
        }
    }

    /// Called by a vCPU thread that found [`PAUSE`]: waits until the VM runs again, stops, or
    /// has a task newer than generation `seen` for it.
    pub fn park(&self, seen: u64) -> Unparked {
        let mut parked = self.lock();
        parked.count += 1;
        self.changed.notify_all();
        loop {
            if let Some((generation, task)) = parked.task.as_ref().filter(|t| t.0 > seen) {
                let given = Unparked::Task(*generation, task.clone());
                parked.count -= 1;
                return given;
            }
            if self.state() != PAUSE {
                break;
            }
            parked = self.changed.wait(parked).unwrap_or_else(|e| e.into_inner());
        }
        parked.count -= 1;
        match self.state() {
            STOP => Unparked::Stop,
            _ => Unparked::Run,
        }
    }

    /// Called by vCPU `id` once it ran the task of `generation`.
    pub fn task_done(&self, id: usize, generation: u64) {
        let mut parked = self.lock();
        if parked.generation == generation {
            parked.done.push(id);
        }
        self.changed.notify_all();
    }

    /// Has each parked vCPU of `ids` run `task` on its own thread; waits up to `timeout`.
    /// Returns the ids that did not run it in time (none: all did). The VM must be paused;
    /// a vCPU that is not parked never takes the task.
    pub fn run_task(&self, task: VcpuTask, ids: &[usize], timeout: Duration) -> Vec<usize> {
        let start = Instant::now();
        let mut parked = self.lock();
        parked.generation += 1;
        parked.task = Some((parked.generation, task));
        parked.done.clear();
        self.changed.notify_all();
        let missing = |p: &Parked| -> Vec<usize> {
            let left = ids.iter().filter(|id| !p.done.contains(id));
            left.copied().collect()
        };
        while !missing(&parked).is_empty() && self.state() == PAUSE {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            parked = self
                .changed
                .wait_timeout(parked, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        parked.task = None;
        missing(&parked)
    }

    /// Called by a vCPU thread kicked while `retired` is set (the guest ejected its CPU):
    /// waits until the CPU is added again (true) or the VM stops (false). Counted as parked.
    pub fn park_retired(&self, retired: &AtomicBool) -> bool {
        let mut parked = self.lock();
        parked.count += 1;
        self.changed.notify_all();
        while retired.load(Ordering::Acquire) && self.state() != STOP {
            parked = self.changed.wait(parked).unwrap_or_else(|e| e.into_inner());
        }
        parked.count -= 1;
        self.state() != STOP
    }

    /// Wakes retired vCPUs to check their flag again (one was added back).
    pub fn wake_retired(&self) {
        let _parked = self.lock();
        self.changed.notify_all();
    }

    /// Waits up to `timeout` until `count` vCPUs are parked; true if they are. `kick` is
    /// called every 20 ms meanwhile (a kick can be lost on some hosts).
    pub fn wait_parked(&self, count: usize, timeout: Duration, mut kick: impl FnMut()) -> bool {
        let start = Instant::now();
        let mut parked = self.lock();
        while parked.count < count {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() || self.state() != PAUSE {
                return false;
            }
            let step = left.min(Duration::from_millis(20));
            parked = self
                .changed
                .wait_timeout(parked, step)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            drop(parked);
            kick();
            parked = self.lock();
        }
        true
    }

    /// vCPUs parked now.
    pub fn parked(&self) -> usize {
        self.lock().count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn paused_threads_park_until_resumed_and_stop_ends_them() {
        let control = Arc::new(VmControl::default());
        control.request_pause();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let c = control.clone();
                thread::spawn(move || {
                    let mut rounds = 0;
                    loop {
                        match c.state() {
                            RUN => rounds += 1,
                            PAUSE if matches!(c.park(0), Unparked::Run) => {}
                            _ => return rounds,
                        }
                        if rounds == 5 {
                            c.request_pause();
                        }
                        thread::yield_now();
                    }
                })
            })
            .collect();
        assert!(control.wait_parked(3, Duration::from_secs(10), || {}));
        assert_eq!(control.parked(), 3);
        control.resume();
        // The first thread to run 5 rounds pauses the VM again: all park once more.
        while control.state() != PAUSE {
            thread::yield_now();
        }
        assert!(control.wait_parked(3, Duration::from_secs(10), || {}));
        control.request_stop();
        let rounds: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(rounds >= 5, "{rounds} rounds");
        assert_eq!(control.parked(), 0);
        control.resume();
        assert!(control.stopping(), "a stopped VM does not run again");
    }

    /// Threads standing in for vCPU threads: each owns a real vCPU fd and parks as the exit
    /// loop does, running the tasks it is given.
    #[test]
    fn parked_vcpus_run_a_task_each_on_their_own_thread() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            crate::test_skip::skip("parked_vcpus_run_a_task", "/dev/kvm is missing");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let control = Arc::new(VmControl::default());
        control.request_pause();
        let threads: Vec<_> = (0..2u64)
            .map(|id| {
                let (c, fd) = (control.clone(), vm.create_vcpu(id).unwrap());
                thread::spawn(move || {
                    let mut seen = 0;
                    loop {
                        match c.park(seen) {
                            Unparked::Task(generation, task) => {
                                task(id as usize, &fd);
                                seen = generation;
                                c.task_done(id as usize, generation);
                            }
                            Unparked::Run => thread::yield_now(),
                            Unparked::Stop => return thread::current().id(),
                        }
                    }
                })
            })
            .collect();
        assert!(control.wait_parked(2, Duration::from_secs(10), || {}));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let into = ran.clone();
        let task: VcpuTask = Arc::new(move |id, fd: &VcpuFd| {
            let rip = fd.get_regs().map(|r| r.rip).unwrap_or(1);
            into.lock().unwrap().push((id, thread::current().id(), rip));
        });
        assert!(control
            .run_task(task.clone(), &[0, 1], Duration::from_secs(10))
            .is_empty());
        // Once each, each on its own thread; again for the next task.
        assert!(control
            .run_task(task, &[0, 1], Duration::from_secs(10))
            .is_empty());
        // A vCPU that is not there never takes the task: named, after the timeout.
        let idle: VcpuTask = Arc::new(|_, _| {});
        assert_eq!(
            control.run_task(idle, &[0, 7], Duration::from_millis(100)),
            vec![7]
        );
        control.request_stop();
        let ids: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut ran = ran.lock().unwrap().clone();
        ran.sort_by_key(|r| r.0);
        assert_eq!(ran.len(), 4);
        let thread_of = |vcpu: usize| ids[vcpu];
        assert!(ran
            .iter()
            .all(|(id, t, rip)| *t == thread_of(*id) && *rip == 0xfff0));
    }

    #[test]
    fn waiting_for_parked_vcpus_gives_up_after_the_timeout() {
        let control = VmControl::default();
        control.request_pause();
        let mut kicks = 0;
        assert!(!control.wait_parked(1, Duration::from_millis(100), || kicks += 1));
        assert!(kicks >= 2, "kicked {kicks} times");
    }
}
