//! The balloon's queue work, on the device event loop: inflated PFNs and reported ranges given
//! back to the host, deflated PFNs counted. Every chain is checked whole before anything is
//! discarded; a malformed one is completed empty and counted (QueueCounters.malformed).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use virtio_queue::{DescriptorChain, Queue};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::discard::{discard_range, RangeOutcome, PAGE_SIZE};
use super::{role_of, BalloonStats, Role, Shared};
use crate::devices::virtio::{
    serve_available, signal_used, Activation, DeviceDirtyLog, DeviceHealth, MemoryView,
    QueueCounters, VirtioInterrupt,
};

/// Most PFNs taken from one inflate or deflate chain (4 GiB of pages; Linux sends 256).
pub const MAX_PFNS_PER_CHAIN: u64 = 1 << 20;
/// PFNs read from guest memory at a time.
const PFN_BATCH: usize = 256;

/// One queue being served.
struct ServedQueue {
    role: Role,
    index: u16,
    queue: Queue,
    notify: Arc<EventFd>,
}

/// The balloon's queues and what serving them needs.
pub(super) struct BalloonWorker {
    queues: Vec<ServedQueue>,
    /// Guest memory, hot-added regions included (refreshed before each round of work).
    mem: MemoryView,
    interrupt: Arc<dyn VirtioInterrupt>,
    counters: Arc<[QueueCounters]>,
    health: Arc<DeviceHealth>,
    dirty: Arc<DeviceDirtyLog>,
    shared: Arc<Shared>,
}

impl BalloonWorker {
    /// The enabled queues that have a role under the negotiated features (others are left
    /// alone).
    pub(super) fn new(a: Activation, counters: Arc<[QueueCounters]>, shared: Arc<Shared>) -> Self {
        let queues = a
            .queues
            .into_iter()
            .filter(|q| usize::from(q.index) < counters.len())
            .filter_map(|q| {
                let role = role_of(q.index, a.features)?;
                Some(ServedQueue {
                    role,
                    index: q.index,
                    queue: q.queue,
                    notify: q.notify,
                })
            })
            .collect();
        BalloonWorker {
            queues,
            mem: MemoryView::new(a.mem),
            interrupt: a.interrupt,
            counters,
            health: a.health,
            dirty: a.dirty,
            shared,
        }
    }

    /// Serves every chain available on queue `i` (of `self.queues`), then raises its
    /// interrupt if the driver asked for one.
    fn serve(&mut self, i: usize) {
        self.mem.refresh();
        let q = &mut self.queues[i];
        let counter = &self.counters[usize::from(q.index)];
        let (role, index, mem) = (q.role, q.index, self.mem.get());
        let work = Work {
            mem,
            health: &self.health,
            stats: &self.shared.stats,
        };
        let served = serve_available(
            (&mut q.queue, index),
            mem,
            (counter, &self.health, &self.dirty),
            |c| work.chain(role, c),
        );
        if served {
            signal_used(&mut q.queue, mem, self.interrupt.as_ref(), index, counter);
        }
    }
}

/// Takes one chain off queue role `role` as the device does (what the fuzz target drives):
/// the pages it names given back, counted in `stats`; None for a malformed chain.
pub fn take_chain(
    role: Role,
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    health: &DeviceHealth,
    stats: &BalloonStats,
) -> Option<u32> {
    Work { mem, health, stats }.chain(role, chain)
}

/// What one chain's handling reads and counts.
struct Work<'a> {
    mem: &'a GuestMemoryMmap,
    health: &'a DeviceHealth,
    stats: &'a BalloonStats,
}

impl Work<'_> {
    /// Handles one chain; None for a malformed one (completed empty and counted).
    fn chain(&self, role: Role, chain: DescriptorChain<&GuestMemoryMmap>) -> Option<u32> {
        let head = chain.head_index();
        let buffers = match role {
            Role::Reporting => Some(chain.map(|d| (d.addr().0, u64::from(d.len()))).collect()),
            Role::Inflate | Role::Deflate => pfn_buffers(chain, self.mem),
        };
        let Some(buffers) = buffers.filter(|b: &Vec<_>| !b.is_empty()) else {
            return self.malformed(role, head);
        };
        match role {
            Role::Reporting => {
                for (addr, len) in buffers {
                    self.give_back(addr, len, &self.stats.reported_pages);
                }
            }
            Role::Inflate => {
                let mut run = Run::default();
                let pages = &self.stats.inflated_pages;
                self.for_each_pfn(&buffers, |pfn| {
                    if let Some((first, count)) = run.push(pfn) {
                        self.give_back(first * PAGE_SIZE, count * PAGE_SIZE, pages);
                    }
                });
                if let Some((first, count)) = run.take() {
                    self.give_back(first * PAGE_SIZE, count * PAGE_SIZE, pages);
                }
            }
            Role::Deflate => {
                let mut n = 0;
                self.for_each_pfn(&buffers, |_| n += 1);
                add(&self.stats.deflated_pages, n);
            }
        }
        Some(0)
    }

    /// Calls `f` with each PFN of `buffers` (checked to be in guest memory), in order, read
    /// [`PFN_BATCH`] at a time: the host holds no more of a guest's array than that.
    fn for_each_pfn(&self, buffers: &[(u64, u64)], mut f: impl FnMut(u64)) {
        let mut raw = [0u8; PFN_BATCH * 4];
        for &(addr, len) in buffers {
            let mut done = 0;
            while done < len {
                let take = (len - done).min(raw.len() as u64) as usize;
                // Checked by `pfn_buffers`: the array lies in guest memory.
                if self
                    .mem
                    .read_slice(&mut raw[..take], GuestAddress(addr + done))
                    .is_err()
                {
                    return;
                }
                for c in raw[..take].chunks_exact(4) {
                    f(u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                }
                done += take as u64;
            }
        }
    }

    /// Gives `[addr, addr + len)` back to the host; counts its pages in `pages` and what was
    /// refused, clipped or failed.
    fn give_back(&self, addr: u64, len: u64, pages: &AtomicU64) {
        let stats = self.stats;
        let name = self.health.name();
        match discard_range(self.mem, addr, len) {
            Ok(RangeOutcome::Discarded { pages: n }) => add(pages, n),
            Ok(RangeOutcome::Clipped { pages: n }) => {
                add(pages, n);
                add(&stats.clipped_ranges, 1);
                self.health.log.log(|| {
                    format!(
                        "{name}: guest range {addr:#x}+{len:#x} runs outside guest RAM; clipped"
                    )
                });
            }
            Ok(RangeOutcome::Refused) => {
                add(&stats.refused_ranges, 1);
                self.health.log.log(|| {
                    format!("{name}: guest range {addr:#x}+{len:#x} is unaligned or not guest RAM; refused")
                });
            }
            Err(e) => {
                add(&stats.discard_errors, 1);
                self.health.log.log(|| format!("{name}: {e}"));
            }
        }
    }

    /// Logs (rate-limited) a malformed chain; None, so that it is completed empty and counted.
    fn malformed<T>(&self, role: Role, head: u16) -> Option<T> {
        let name = self.health.name();
        self.health.log.log(|| {
            format!("{name}: a malformed chain on the {role:?} queue (chain {head}); ignored")
        });
        None
    }
}

/// The (address, length) of each buffer of an inflate or deflate chain: device-readable, in
/// guest memory, whole le32 PFNs, at least one and at most [`MAX_PFNS_PER_CHAIN`] in all;
/// None otherwise.
fn pfn_buffers(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Option<Vec<(u64, u64)>> {
    let mut total = 0u64;
    let mut buffers = Vec::new();
    for d in chain {
        let len = u64::from(d.len());
        total += len / 4;
        let inside = mem.get_slice(d.addr(), len as usize).is_ok();
        if d.is_write_only() || len % 4 != 0 || total > MAX_PFNS_PER_CHAIN || !inside {
            return None;
        }
        buffers.push((d.addr().0, len));
    }
    (total > 0).then_some(buffers)
}

/// A run of consecutive PFNs being gathered: (first, count).
#[derive(Debug, Default)]
struct Run(Option<(u64, u64)>);

impl Run {
    /// Adds `pfn`; returns the run it ended, if it does not follow the current one.
    fn push(&mut self, pfn: u64) -> Option<(u64, u64)> {
        match &mut self.0 {
            Some((first, count)) if *first + *count == pfn => {
                *count += 1;
                None
            }
            _ => self.0.replace((pfn, 1)),
        }
    }

    /// The run gathered last.
    fn take(&mut self) -> Option<(u64, u64)> {
        self.0.take()
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

impl MutEventSubscriber for BalloonWorker {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let fd = events.fd();
        let Some(i) = self.queues.iter().position(|q| q.notify.as_raw_fd() == fd) else {
            return;
        };
        if self.queues[i].notify.read().is_ok() {
            let index = usize::from(self.queues[i].index);
            QueueCounters::add(&self.counters[index].notifies, 1);
        }
        self.serve(i);
    }

    fn init(&mut self, ops: &mut EventOps) {
        for q in &self.queues {
            if let Err(e) = ops.add(Events::new(q.notify.as_ref(), EventSet::IN)) {
                eprintln!("exitless: virtio-balloon cannot watch queue notifications: {e}");
            }
        }
        // Work the driver queued before activation is served now.
        for i in 0..self.queues.len() {
            self.serve(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Run;

    #[test]
    fn consecutive_pfns_make_one_run() {
        let mut run = Run::default();
        let mut done: Vec<_> = [5, 6, 7, 9, 10, 3, 3]
            .into_iter()
            .filter_map(|p| run.push(p))
            .collect();
        done.extend(run.take());
        assert_eq!(done, vec![(5, 3), (9, 2), (3, 1), (3, 1)]);
        assert_eq!(run.take(), None);
    }
}
