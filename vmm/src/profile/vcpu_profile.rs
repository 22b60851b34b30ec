//! Per-vCPU exit profile: written by its vCPU thread, readable by anyone.
//!
//! Every counter uses the single-writer relaxed pattern
//! `x.store(x.load(Relaxed) + v, Relaxed)`: on x86 that is two plain `mov`s,
//! no `lock` prefix, so the record path costs a handful of L1 hits. Only the
//! owning vCPU thread may call the `record_*` methods; readers only load.
//! Every block of counters is 128-byte aligned and padded ([`ExitStats`],
//! the coalesced-write slots and [`VcpuProfile`] are `repr(align(128))`), so
//! two vCPUs' profiles never share a cache line (128 covers the adjacent-line
//! prefetcher pair on x86).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

use super::histogram::{Histogram, HistogramSnapshot};
use super::zeroed_table::{ZeroIsEmpty, ZeroedTable};
use super::ExitReason;

/// Number of host CPUs tracked by the CPU bitmask.
pub const MAX_HOST_CPUS: usize = 256;
const CPU_MASK_WORDS: usize = MAX_HOST_CPUS / 64;

/// `x += value` for a counter with a single writer (no locked instruction).
#[inline]
fn add_single_writer(counter: &AtomicU64, value: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(value), Relaxed);
}

/// Count, total cycles, min/max and latency histogram for one kind of exit. Every exit is
/// counted; only the timed ones (one in N with `--profile-sample N`) add to the cycles and
/// the histogram.
#[repr(align(128))]
#[derive(Default)]
pub struct ExitStats {
    count: AtomicU64,
    timed: AtomicU64,
    total_cycles: AtomicU64,
    histogram: Histogram,
}

// SAFETY: counters and a histogram of atomics, empty when zeroed (the histogram keeps its
// minimum inverted for that); no Drop.
unsafe impl ZeroIsEmpty for ExitStats {}

impl ExitStats {
    /// Records one timed sample of `cycles`. Single writer only.
    #[inline]
    pub fn record(&self, cycles: u64) {
        add_single_writer(&self.count, 1);
        add_single_writer(&self.timed, 1);
        add_single_writer(&self.total_cycles, cycles);
        self.histogram.record(cycles);
    }

    /// Counts one exit that was not timed. Single writer only.
    #[inline]
    pub fn count(&self) {
        add_single_writer(&self.count, 1);
    }

    /// Copies the current values; any thread. The total is the timed exits' scaled to all
    /// of them (see [`scale_to_count`]).
    pub fn snapshot(&self) -> ExitStatsSnapshot {
        // The count first: a reader racing the writer sees at least as many timed exits as
        // the count allows for, and the scale stays at most count / timed.
        let count = self.count.load(Relaxed);
        let timed = self.timed.load(Relaxed).min(count);
        ExitStatsSnapshot {
            count,
            timed,
            total_cycles: scale_to_count(self.total_cycles.load(Relaxed), timed, count),
            histogram: self.histogram.snapshot(),
        }
    }
}

/// `cycles` measured over `timed` of `count` events, scaled to all `count` (the mean of the
/// timed ones times the count); unchanged when every event was timed.
pub fn scale_to_count(cycles: u64, timed: u64, count: u64) -> u64 {
    if timed == 0 || timed >= count {
        return cycles;
    }
    u64::try_from(u128::from(cycles) * u128::from(count) / u128::from(timed)).unwrap_or(u64::MAX)
}

/// Plain-data copy of [`ExitStats`]. Times are in TSC cycles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatsSnapshot {
    /// Number of exits (every one counted).
    pub count: u64,
    /// How many of them were timed (all but with `--profile-sample N` above 1); the
    /// histogram holds these.
    #[serde(default)]
    pub timed: u64,
    /// Sum of all exits' times: the timed ones' sum scaled to `count` when not all were timed.
    pub total_cycles: u64,
    /// Latency distribution (also holds min and max).
    pub histogram: HistogramSnapshot,
}

impl ExitStatsSnapshot {
    /// Smallest sample (0 when empty).
    pub fn min_cycles(&self) -> u64 {
        self.histogram.min
    }

    /// Largest sample (0 when empty).
    pub fn max_cycles(&self) -> u64 {
        self.histogram.max
    }

    /// Mean sample (0 when empty).
    pub fn avg_cycles(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.total_cycles as f64 / self.count as f64
    }

    /// Percentile `p` (0..=100) from the histogram, in cycles.
    pub fn percentile_cycles(&self, p: f64) -> u64 {
        self.histogram.percentile(p)
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &ExitStatsSnapshot) {
        self.count += other.count;
        self.timed += other.timed;
        self.total_cycles += other.total_cycles;
        self.histogram.merge(&other.histogram);
    }

    /// Samples recorded since `earlier`.
    pub fn delta(&self, earlier: &ExitStatsSnapshot) -> ExitStatsSnapshot {
        let count = self.count.saturating_sub(earlier.count);
        let timed = self.timed.saturating_sub(earlier.timed);
        let total_cycles = self.total_cycles.saturating_sub(earlier.total_cycles);
        let mut histogram = self.histogram.delta(&earlier.histogram);
        // The histogram can only bound a lone sample by its bucket; the total is exact.
        if count == 1 && timed == 1 {
            (histogram.min, histogram.max) = (total_cycles, total_cycles);
        }
        ExitStatsSnapshot {
            count,
            timed,
            total_cycles,
            histogram,
        }
    }
}

/// One coalesced-write counter, padded to its own 128-byte block.
#[repr(align(128))]
#[derive(Default)]
struct CoalescedSlot(AtomicU64);

// SAFETY: one atomic counter, zero when empty; no Drop.
unsafe impl ZeroIsEmpty for CoalescedSlot {}

/// Slot for `device` in a table of `len` slots whose last slot is "unmapped".
#[inline]
fn device_slot(len: usize, device: Option<usize>) -> usize {
    let unmapped = len - 1;
    device.map_or(unmapped, |index| index.min(unmapped))
}

/// Exit profile of one vCPU. See the module documentation for the threading
/// contract.
#[repr(align(128))]
pub struct VcpuProfile {
    vcpu_id: u32,
    kvm_run_count: AtomicU64,
    kvm_run_timed: AtomicU64,
    kvm_run_cycles: AtomicU64,
    host_cpu_mask: [AtomicU64; CPU_MASK_WORDS],
    /// Indexed by `ExitReason as usize`.
    by_reason: ZeroedTable<ExitStats>,
    /// Per device, for `IoIn`, `IoOut`, `MmioRead`, `MmioWrite` (in that
    /// order); each has one slot per bus device plus a last "unmapped" slot.
    by_device: [ZeroedTable<ExitStats>; 4],
    /// Writes delivered from the coalesced ring to the PIO bus: one slot per
    /// bus device plus a last "unmapped" slot.
    coalesced_pio: ZeroedTable<CoalescedSlot>,
    /// The same for the MMIO bus.
    coalesced_mmio: ZeroedTable<CoalescedSlot>,
}

/// Position of `reason` in `VcpuProfile::by_device`, if it has devices.
fn device_table_index(reason: ExitReason) -> Option<usize> {
    match reason {
        ExitReason::IoIn => Some(0),
        ExitReason::IoOut => Some(1),
        ExitReason::MmioRead => Some(2),
        ExitReason::MmioWrite => Some(3),
        _ => None,
    }
}

impl VcpuProfile {
    /// A zeroed profile for vCPU `vcpu_id` on a VM whose PIO bus has
    /// `io_devices` devices and whose MMIO bus has `mmio_devices` devices.
    /// All memory is allocated here; the `record_*` path never allocates.
    pub fn new(vcpu_id: u32, io_devices: usize, mmio_devices: usize) -> Self {
        Self {
            vcpu_id,
            kvm_run_count: AtomicU64::new(0),
            kvm_run_timed: AtomicU64::new(0),
            kvm_run_cycles: AtomicU64::new(0),
            host_cpu_mask: [const { AtomicU64::new(0) }; CPU_MASK_WORDS],
            by_reason: ZeroedTable::new(ExitReason::ALL.len()),
            by_device: [
                ZeroedTable::new(io_devices + 1),
                ZeroedTable::new(io_devices + 1),
                ZeroedTable::new(mmio_devices + 1),
                ZeroedTable::new(mmio_devices + 1),
            ],
            coalesced_pio: ZeroedTable::new(io_devices + 1),
            coalesced_mmio: ZeroedTable::new(mmio_devices + 1),
        }
    }

    /// The vCPU this profile belongs to.
    pub fn vcpu_id(&self) -> u32 {
        self.vcpu_id
    }

    /// Records one `KVM_RUN` call that lasted `cycles` (guest time plus exits
    /// handled in the kernel). Owning vCPU thread only.
    #[inline]
    pub fn record_in_kvm(&self, cycles: u64) {
        add_single_writer(&self.kvm_run_count, 1);
        add_single_writer(&self.kvm_run_timed, 1);
        add_single_writer(&self.kvm_run_cycles, cycles);
    }

    /// Counts one exit that was not timed (`--profile-sample N` above 1): its `KVM_RUN`
    /// call, its reason and its device, as [`record_in_kvm`](Self::record_in_kvm) and
    /// [`record_exit`](Self::record_exit) would without the times. Owning vCPU thread only.
    #[inline]
    #[link_section = ".text.hot.exitless_exit_path"]
    pub fn count_exit(&self, reason: ExitReason, device: Option<usize>) {
        add_single_writer(&self.kvm_run_count, 1);
        self.by_reason[reason as usize].count();
        if let Some(table) = device_table_index(reason) {
            let devices = &self.by_device[table];
            devices[device_slot(devices.len(), device)].count();
        }
    }

    /// Records one exit handled in userspace for `cycles`. `device` is the
    /// bus index of the device that handled an IO/MMIO exit; `None` or an
    /// out-of-range index counts as "unmapped". It is ignored for other
    /// reasons. Owning vCPU thread only. With the exit path's code, after what every exit
    /// runs: only the timed exits run it (exitless/exit_path.ld).
    #[inline]
    #[link_section = ".text.hot.exitless_exit_path.warm"]
    pub fn record_exit(&self, reason: ExitReason, device: Option<usize>, cycles: u64) {
        self.by_reason[reason as usize].record(cycles);
        if let Some(table) = device_table_index(reason) {
            let devices = &self.by_device[table];
            devices[device_slot(devices.len(), device)].record(cycles);
        }
    }

    /// Records one write delivered from KVM's coalesced ring to bus device
    /// `device` of the PIO bus (`pio`) or the MMIO bus: a write the guest
    /// made without an exit. `None` or an out-of-range index counts as
    /// "unmapped". The ring is shared by the VM's vCPUs, so this counts what
    /// this vCPU delivered, whichever vCPU wrote it. Owning vCPU thread only.
    #[inline]
    #[link_section = ".text.hot.exitless_exit_path.warm"]
    pub fn record_coalesced(&self, pio: bool, device: Option<usize>) {
        let slots = if pio {
            &self.coalesced_pio
        } else {
            &self.coalesced_mmio
        };
        add_single_writer(&slots[device_slot(slots.len(), device)].0, 1);
    }

    /// Notes that this vCPU thread ran on host CPU `cpu` (ignored when
    /// `cpu >= MAX_HOST_CPUS`). Writes only when the bit is new.
    #[inline]
    pub fn record_cpu(&self, cpu: usize) {
        let Some(word) = self.host_cpu_mask.get(cpu / 64) else {
            return;
        };
        let bit = 1u64 << (cpu % 64);
        let current = word.load(Relaxed);
        if current & bit == 0 {
            word.store(current | bit, Relaxed);
        }
    }

    /// Exits of `reason` at `device` (`None`: at no device) counted so far: one counter read,
    /// where [`snapshot`](Self::snapshot) reads them all (the lab's probe of a running vCPU).
    pub fn device_count(&self, reason: ExitReason, device: Option<usize>) -> u64 {
        let Some(table) = device_table_index(reason) else {
            return 0;
        };
        let devices = &self.by_device[table];
        devices[device_slot(devices.len(), device)]
            .count
            .load(Relaxed)
    }

    /// Copies the whole profile; any thread, any time.
    pub fn snapshot(&self) -> VcpuProfileSnapshot {
        let reasons = ExitReason::ALL
            .iter()
            .map(|&reason| self.reason_snapshot(reason))
            .collect();
        let kvm_run_count = self.kvm_run_count.load(Relaxed);
        let kvm_run_timed = self.kvm_run_timed.load(Relaxed).min(kvm_run_count);
        let kvm_run_cycles = self.kvm_run_cycles.load(Relaxed);
        VcpuProfileSnapshot {
            vcpu_id: self.vcpu_id,
            kvm_run_count,
            kvm_run_timed,
            kvm_run_cycles: scale_to_count(kvm_run_cycles, kvm_run_timed, kvm_run_count),
            host_cpus: self.host_cpus(),
            reasons,
            coalesced_pio: coalesced_snapshot(&self.coalesced_pio),
            coalesced_mmio: coalesced_snapshot(&self.coalesced_mmio),
        }
    }

    fn reason_snapshot(&self, reason: ExitReason) -> ReasonSnapshot {
        let stats = self.by_reason[reason as usize].snapshot();
        let Some(table) = device_table_index(reason) else {
            return ReasonSnapshot {
                reason,
                stats,
                devices: Vec::new(),
                unmapped: None,
            };
        };
        let mut devices: Vec<ExitStatsSnapshot> = self.by_device[table]
            .iter()
            .map(ExitStats::snapshot)
            .collect();
        let unmapped = devices.pop();
        ReasonSnapshot {
            reason,
            stats,
            devices,
            unmapped,
        }
    }

    fn host_cpus(&self) -> Vec<usize> {
        let mut cpus = Vec::new();
        for (word_index, word) in self.host_cpu_mask.iter().enumerate() {
            let bits = word.load(Relaxed);
            cpus.extend(
                (0..64)
                    .filter(|bit| bits & (1u64 << bit) != 0)
                    .map(|bit| word_index * 64 + bit),
            );
        }
        cpus
    }
}

fn coalesced_snapshot(slots: &[CoalescedSlot]) -> CoalescedSnapshot {
    let mut devices: Vec<u64> = slots.iter().map(|slot| slot.0.load(Relaxed)).collect();
    let unmapped = devices.pop().unwrap_or(0);
    CoalescedSnapshot { devices, unmapped }
}

/// Plain-data count of the writes one bus received from KVM's coalesced
/// ring: each one a guest write that did not exit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoalescedSnapshot {
    /// Writes per bus device index.
    pub devices: Vec<u64>,
    /// Writes that hit no device.
    pub unmapped: u64,
}

impl CoalescedSnapshot {
    /// All writes, devices and unmapped.
    pub fn total(&self) -> u64 {
        self.devices
            .iter()
            .fold(self.unmapped, |sum, &writes| sum.saturating_add(writes))
    }

    /// Adds `other` into `self` (device lists of unequal length are padded).
    pub fn merge(&mut self, other: &CoalescedSnapshot) {
        if self.devices.len() < other.devices.len() {
            self.devices.resize(other.devices.len(), 0);
        }
        for (mine, theirs) in self.devices.iter_mut().zip(&other.devices) {
            *mine = mine.saturating_add(*theirs);
        }
        self.unmapped = self.unmapped.saturating_add(other.unmapped);
    }

    /// Writes recorded since `earlier`.
    pub fn delta(&self, earlier: &CoalescedSnapshot) -> CoalescedSnapshot {
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, now)| now.saturating_sub(earlier.devices.get(i).copied().unwrap_or(0)))
            .collect();
        CoalescedSnapshot {
            devices,
            unmapped: self.unmapped.saturating_sub(earlier.unmapped),
        }
    }
}

/// Statistics of one exit reason, plus per-device breakdown for IO/MMIO.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonSnapshot {
    /// The exit reason.
    pub reason: ExitReason,
    /// All exits of this reason (userspace handling time).
    pub stats: ExitStatsSnapshot,
    /// Per bus device index (IO/MMIO reasons only; empty otherwise).
    pub devices: Vec<ExitStatsSnapshot>,
    /// Accesses that hit no device (IO/MMIO reasons only).
    pub unmapped: Option<ExitStatsSnapshot>,
}

impl ReasonSnapshot {
    fn delta(&self, earlier: &ReasonSnapshot) -> ReasonSnapshot {
        let devices = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, now)| match earlier.devices.get(i) {
                Some(before) => now.delta(before),
                None => now.clone(),
            })
            .collect();
        let unmapped = match (&self.unmapped, &earlier.unmapped) {
            (Some(now), Some(before)) => Some(now.delta(before)),
            (now, _) => now.clone(),
        };
        ReasonSnapshot {
            reason: self.reason,
            stats: self.stats.delta(&earlier.stats),
            devices,
            unmapped,
        }
    }
}

/// Plain-data copy of a [`VcpuProfile`]. Times are in TSC cycles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VcpuProfileSnapshot {
    /// The vCPU id.
    pub vcpu_id: u32,
    /// Number of `KVM_RUN` calls that returned.
    pub kvm_run_count: u64,
    /// How many of them were timed (all but with `--profile-sample N` above 1).
    #[serde(default)]
    pub kvm_run_timed: u64,
    /// Cycles spent inside `KVM_RUN`: the timed calls' sum scaled to all of them.
    pub kvm_run_cycles: u64,
    /// Host CPUs the vCPU thread was seen on, ascending. Cumulative: a
    /// [`delta`](Self::delta) keeps the later snapshot's set.
    pub host_cpus: Vec<usize>,
    /// One entry per [`ExitReason::ALL`], in that order.
    pub reasons: Vec<ReasonSnapshot>,
    /// Writes delivered from the coalesced ring to PIO bus devices.
    #[serde(default)]
    pub coalesced_pio: CoalescedSnapshot,
    /// Writes delivered from the coalesced ring to MMIO bus devices.
    #[serde(default)]
    pub coalesced_mmio: CoalescedSnapshot,
}

impl VcpuProfileSnapshot {
    /// Statistics of `reason`, if present.
    pub fn reason(&self, reason: ExitReason) -> Option<&ReasonSnapshot> {
        self.reasons.iter().find(|r| r.reason == reason)
    }

    /// Total exits handled in userspace.
    pub fn exit_count(&self) -> u64 {
        self.reasons.iter().map(|r| r.stats.count).sum()
    }

    /// Exits whose handling was timed: all of them, or one in N with `--profile-sample N`.
    pub fn timed_exit_count(&self) -> u64 {
        self.reasons.iter().map(|r| r.stats.timed).sum()
    }

    /// Total cycles spent handling exits in userspace (scaled to every exit when sampled).
    pub fn userspace_cycles(&self) -> u64 {
        self.reasons.iter().map(|r| r.stats.total_cycles).sum()
    }

    /// Writes delivered from the coalesced ring, PIO and MMIO (exits the
    /// guest did not take).
    pub fn coalesced_writes(&self) -> u64 {
        self.coalesced_pio
            .total()
            .saturating_add(self.coalesced_mmio.total())
    }

    /// What happened between `earlier` and `self` (snapshots of the same
    /// vCPU), e.g. for a `--profile-interval` window.
    pub fn delta(&self, earlier: &VcpuProfileSnapshot) -> VcpuProfileSnapshot {
        let reasons = self
            .reasons
            .iter()
            .map(|now| match earlier.reason(now.reason) {
                Some(before) => now.delta(before),
                None => now.clone(),
            })
            .collect();
        VcpuProfileSnapshot {
            vcpu_id: self.vcpu_id,
            kvm_run_count: self.kvm_run_count.saturating_sub(earlier.kvm_run_count),
            kvm_run_timed: self.kvm_run_timed.saturating_sub(earlier.kvm_run_timed),
            kvm_run_cycles: self.kvm_run_cycles.saturating_sub(earlier.kvm_run_cycles),
            host_cpus: self.host_cpus.clone(),
            reasons,
            coalesced_pio: self.coalesced_pio.delta(&earlier.coalesced_pio),
            coalesced_mmio: self.coalesced_mmio.delta(&earlier.coalesced_mmio),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_is_cache_line_isolated() {
        assert_eq!(std::mem::align_of::<VcpuProfile>(), 128);
        assert_eq!(std::mem::align_of::<ExitStats>(), 128);
        assert_eq!(std::mem::size_of::<ExitStats>() % 128, 0);
        assert_eq!(std::mem::align_of::<CoalescedSlot>(), 128);
        assert_eq!(std::mem::size_of::<CoalescedSlot>() % 128, 0);
        let profile = VcpuProfile::new(0, 2, 1);
        let address = profile.by_device[0].as_ptr() as usize;
        assert_eq!(address % 128, 0);
        for table in [&profile.coalesced_pio, &profile.coalesced_mmio] {
            assert_eq!(table.as_ptr() as usize % 128, 0);
        }
    }

    #[test]
    fn records_coalesced_writes() {
        let profile = VcpuProfile::new(0, 2, 1);
        (0..3).for_each(|_| profile.record_coalesced(true, Some(1)));
        profile.record_coalesced(true, None);
        profile.record_coalesced(true, Some(2));
        profile.record_coalesced(false, Some(0));
        profile.record_coalesced(false, Some(0));
        profile.record_coalesced(false, Some(7));
        let snapshot = profile.snapshot();
        let pio = &snapshot.coalesced_pio;
        assert_eq!((pio.devices.as_slice(), pio.unmapped), (&[0, 3][..], 2));
        let mmio = &snapshot.coalesced_mmio;
        assert_eq!((mmio.devices.as_slice(), mmio.unmapped), (&[2][..], 1));
        assert_eq!((pio.total(), mmio.total()), (5, 3));
        assert_eq!(snapshot.coalesced_writes(), 8);
        assert_eq!(snapshot.exit_count(), 0, "coalesced writes are not exits");
    }

    #[test]
    fn coalesced_delta_covers_only_the_window() {
        let profile = VcpuProfile::new(0, 1, 1);
        profile.record_coalesced(true, Some(0));
        profile.record_coalesced(false, None);
        let earlier = profile.snapshot();
        (0..4).for_each(|_| profile.record_coalesced(true, Some(0)));
        profile.record_coalesced(false, Some(0));
        let window = profile.snapshot().delta(&earlier);
        assert_eq!(window.coalesced_pio.devices, vec![4]);
        assert_eq!(window.coalesced_pio.unmapped, 0);
        assert_eq!(window.coalesced_mmio.devices, vec![1]);
        assert_eq!(window.coalesced_mmio.unmapped, 0);
        assert_eq!(window.coalesced_writes(), 5);
        let backwards = earlier.delta(&profile.snapshot());
        assert_eq!(backwards.coalesced_writes(), 0, "saturating");
    }

    #[test]
    fn coalesced_snapshot_merges_unequal_lengths() {
        let mut into = CoalescedSnapshot {
            devices: vec![1],
            unmapped: 2,
        };
        into.merge(&CoalescedSnapshot {
            devices: vec![10, 20],
            unmapped: 5,
        });
        assert_eq!(into.devices, vec![11, 20]);
        assert_eq!((into.unmapped, into.total()), (7, 38));
    }

    #[test]
    fn snapshot_without_coalesced_fields_deserializes() {
        let mut json = serde_json::to_value(VcpuProfile::new(0, 1, 1).snapshot()).expect("json");
        let object = json.as_object_mut().expect("object");
        assert!(object.remove("coalesced_pio").is_some());
        assert!(object.remove("coalesced_mmio").is_some());
        let back: VcpuProfileSnapshot = serde_json::from_value(json).expect("deserialize");
        assert_eq!(back.coalesced_pio, CoalescedSnapshot::default());
        assert_eq!(back.coalesced_writes(), 0);
    }

    #[test]
    fn records_reasons_and_devices() {
        let profile = VcpuProfile::new(3, 2, 1);
        profile.record_exit(ExitReason::IoOut, Some(1), 100);
        profile.record_exit(ExitReason::IoOut, Some(1), 300);
        profile.record_exit(ExitReason::IoOut, None, 50);
        profile.record_exit(ExitReason::MmioWrite, Some(9), 70);
        profile.record_exit(ExitReason::Hlt, Some(0), 10);
        let snapshot = profile.snapshot();
        assert_eq!(snapshot.vcpu_id, 3);
        assert_eq!(snapshot.reasons.len(), ExitReason::ALL.len());
        let io_out = snapshot.reason(ExitReason::IoOut).expect("IO_OUT present");
        assert_eq!(io_out.stats.count, 3);
        assert_eq!(io_out.stats.total_cycles, 450);
        assert_eq!(
            (io_out.stats.min_cycles(), io_out.stats.max_cycles()),
            (50, 300)
        );
        assert_eq!(io_out.devices.len(), 2);
        assert_eq!(io_out.devices[0].count, 0);
        assert_eq!(io_out.devices[1].count, 2);
        assert_eq!(io_out.unmapped.as_ref().map(|u| u.count), Some(1));
        let mmio = snapshot.reason(ExitReason::MmioWrite).expect("MMIO_WRITE");
        assert_eq!(mmio.unmapped.as_ref().map(|u| u.total_cycles), Some(70));
        let hlt = snapshot.reason(ExitReason::Hlt).expect("HLT");
        assert!(hlt.devices.is_empty() && hlt.unmapped.is_none());
        assert_eq!(snapshot.exit_count(), 5);
        assert_eq!(snapshot.userspace_cycles(), 530);
    }

    #[test]
    fn records_kvm_run_and_cpus() {
        let profile = VcpuProfile::new(0, 0, 0);
        profile.record_in_kvm(1000);
        profile.record_in_kvm(500);
        for cpu in [1, 0, 1, 255, 256, 100_000] {
            profile.record_cpu(cpu);
        }
        let snapshot = profile.snapshot();
        assert_eq!((snapshot.kvm_run_count, snapshot.kvm_run_cycles), (2, 1500));
        assert_eq!(snapshot.host_cpus, vec![0, 1, 255]);
    }

    #[test]
    fn delta_covers_only_the_window() {
        let profile = VcpuProfile::new(0, 1, 0);
        profile.record_in_kvm(1000);
        profile.record_exit(ExitReason::IoIn, Some(0), 40);
        let earlier = profile.snapshot();
        profile.record_in_kvm(10);
        profile.record_exit(ExitReason::IoIn, Some(0), 20);
        profile.record_exit(ExitReason::Hlt, None, 5);
        let window = profile.snapshot().delta(&earlier);
        assert_eq!((window.kvm_run_count, window.kvm_run_cycles), (1, 10));
        let io_in = window.reason(ExitReason::IoIn).expect("IO_IN");
        assert_eq!((io_in.stats.count, io_in.stats.total_cycles), (1, 20));
        assert_eq!(io_in.devices[0].count, 1);
        assert_eq!(io_in.stats.min_cycles(), 20);
        assert_eq!(window.exit_count(), 2);
    }

    #[test]
    fn a_window_with_one_sample_has_that_sample_as_min_and_max() {
        let profile = VcpuProfile::new(0, 1, 0);
        // An earlier, lower sample: the window's one sample sets no new extreme, so its
        // histogram alone could only bound it by its bucket.
        profile.record_exit(ExitReason::IoOut, Some(0), 100);
        profile.record_exit(ExitReason::IoOut, Some(0), 5000);
        let earlier = profile.snapshot();
        profile.record_exit(ExitReason::IoOut, Some(0), 1234);
        let window = profile.snapshot().delta(&earlier);
        let out = window.reason(ExitReason::IoOut).expect("IO_OUT");
        assert_eq!(out.stats.count, 1);
        assert_eq!(
            (out.stats.min_cycles(), out.stats.max_cycles()),
            (1234, 1234)
        );
        assert_eq!(
            (out.devices[0].min_cycles(), out.devices[0].max_cycles()),
            (1234, 1234)
        );
    }

    #[test]
    fn reader_thread_sees_writer_progress() {
        let profile = VcpuProfile::new(0, 0, 0);
        std::thread::scope(|scope| {
            scope.spawn(|| (0..10_000).for_each(|_| profile.record_exit(ExitReason::Hlt, None, 3)));
            scope.spawn(|| {
                let mut last = 0;
                for _ in 0..100 {
                    let count = profile.snapshot().exit_count();
                    assert!(count >= last);
                    last = count;
                }
            });
        });
        assert_eq!(profile.snapshot().exit_count(), 10_000);
    }
}
