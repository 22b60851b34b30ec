//! What each virtio device did, per queue: notifications taken from the eventfd (an
//! ioeventfd: no userspace exit), interrupts raised, requests completed, malformed chains.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::devices::virtio::QueueCounters;

/// One queue's counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    pub queue: u16,
    pub notifies: u64,
    pub interrupts: u64,
    pub completed: u64,
    pub malformed: u64,
}

/// One virtio device's queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VirtioStats {
    pub device: String,
    pub queues: Vec<QueueStats>,
}

impl VirtioStats {
    /// Reads a device's counters now.
    pub fn read(device: &str, counters: &[QueueCounters]) -> Self {
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        VirtioStats {
            device: device.to_string(),
            queues: counters
                .iter()
                .enumerate()
                .map(|(i, c)| QueueStats {
                    queue: i as u16,
                    notifies: load(&c.notifies),
                    interrupts: load(&c.interrupts),
                    completed: load(&c.completed),
                    malformed: load(&c.malformed),
                })
                .collect(),
        }
    }

    /// Change since `earlier` (the same device read before).
    pub fn delta(&self, earlier: &VirtioStats) -> VirtioStats {
        let queues = self
            .queues
            .iter()
            .zip(&earlier.queues)
            .map(|(n, e)| QueueStats {
                queue: n.queue,
                notifies: n.notifies.saturating_sub(e.notifies),
                interrupts: n.interrupts.saturating_sub(e.interrupts),
                completed: n.completed.saturating_sub(e.completed),
                malformed: n.malformed.saturating_sub(e.malformed),
            })
            .collect();
        VirtioStats {
            device: self.device.clone(),
            queues,
        }
    }
}

/// The table of the human profile (nothing when there are no virtio devices).
pub fn write_table(out: &mut String, devices: &[VirtioStats]) {
    if devices.is_empty() {
        return;
    }
    out.push_str("\nvirtio queues (served on the device event loop, not on vCPU threads):\n");
    let _ = writeln!(
        out,
        "{:<20} {:>5} {:>10} {:>11} {:>10} {:>10}",
        "Device", "Queue", "Notifies", "Interrupts", "Completed", "Malformed"
    );
    for d in devices {
        for q in &d.queues {
            let _ = writeln!(
                out,
                "{:<20} {:>5} {:>10} {:>11} {:>10} {:>10}",
                d.device, q.queue, q.notifies, q.interrupts, q.completed, q.malformed
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_per_queue_and_tabled() {
        let counters: Vec<QueueCounters> = (0..2).map(|_| QueueCounters::default()).collect();
        QueueCounters::add(&counters[1].completed, 32);
        QueueCounters::add(&counters[1].interrupts, 3);
        let before = VirtioStats::read("virtio-blk0", &counters);
        QueueCounters::add(&counters[1].completed, 8);
        let now = VirtioStats::read("virtio-blk0", &counters);
        assert_eq!(now.queues[1].completed, 40);
        let d = now.delta(&before);
        assert_eq!((d.queues[1].completed, d.queues[1].interrupts), (8, 0));
        let mut out = String::new();
        write_table(&mut out, &[now]);
        assert!(out.contains("virtio-blk0"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.contains("virtio-blk0") && l.contains(" 40 ")),
            "{out}"
        );
        let mut empty = String::new();
        write_table(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
