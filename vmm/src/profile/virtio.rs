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

/// One of a device's own counters (frames, drops, connections).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceCount {
    pub name: &'static str,
    pub value: u64,
}

/// One virtio device's queues.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VirtioStats {
    pub device: String,
    pub queues: Vec<QueueStats>,
    /// What the device counts beyond its queues (empty for most).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<DeviceCount>,
}

impl VirtioStats {
    /// Reads a device's counters now: per queue, and its own (`device_counters`).
    pub fn read(
        device: &str,
        counters: &[QueueCounters],
        device_counters: Vec<(&'static str, u64)>,
    ) -> Self {
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
            counters: device_counters
                .into_iter()
                .map(|(name, value)| DeviceCount { name, value })
                .collect(),
        }
    }

    /// Every counter by name, flat: per queue `queueN_notifies` etc., then the device's own
    /// (`vm.counters` in the API).
    pub fn counter_map(&self) -> std::collections::BTreeMap<String, u64> {
        let mut map = std::collections::BTreeMap::new();
        for q in &self.queues {
            let n = q.queue;
            map.insert(format!("queue{n}_notifies"), q.notifies);
            map.insert(format!("queue{n}_interrupts"), q.interrupts);
            map.insert(format!("queue{n}_completed"), q.completed);
            map.insert(format!("queue{n}_malformed"), q.malformed);
        }
        for c in &self.counters {
            map.insert(c.name.to_string(), c.value);
        }
        map
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
        let counters = self
            .counters
            .iter()
            .map(|c| {
                let before = earlier.counters.iter().find(|e| e.name == c.name);
                DeviceCount {
                    name: c.name,
                    value: c.value.saturating_sub(before.map_or(0, |e| e.value)),
                }
            })
            .collect();
        VirtioStats {
            device: self.device.clone(),
            queues,
            counters,
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
    for d in devices.iter().filter(|d| !d.counters.is_empty()) {
        let list: Vec<String> = d
            .counters
            .iter()
            .map(|c| format!("{}={}", c.name, c.value))
            .collect();
        let _ = writeln!(out, "{:<20} {}", d.device, list.join(" "));
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
        let before = VirtioStats::read("virtio-blk0", &counters, vec![("rx_frames", 5)]);
        QueueCounters::add(&counters[1].completed, 8);
        let now = VirtioStats::read("virtio-blk0", &counters, vec![("rx_frames", 7)]);
        assert_eq!(now.queues[1].completed, 40);
        let d = now.delta(&before);
        assert_eq!((d.queues[1].completed, d.queues[1].interrupts), (8, 0));
        assert_eq!(
            d.counters,
            [DeviceCount {
                name: "rx_frames",
                value: 2
            }]
        );
        let mut out = String::new();
        write_table(&mut out, &[now]);
        assert!(out.contains("virtio-blk0"), "{out}");
        assert!(
            out.lines()
                .any(|l| l.contains("virtio-blk0") && l.contains(" 40 ")),
            "{out}"
        );
        assert!(out.contains("virtio-blk0          rx_frames=7"), "{out}");
        let mut empty = String::new();
        write_table(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
