//! Human tables and the JSON document built from profile snapshots.
//!
//! The JSON document and its schema (`exitless.profile/1`): report/json.rs.
//!
//! All `*_ns` latencies are userspace handling time per exit (from
//! `KVM_RUN` returning to re-entering it). Percentiles come from the
//! log-linear histogram (bucket upper bound, at most 25% high).
//!
//! `coalesced` counts guest writes that KVM queued in its coalesced MMIO/PIO
//! ring instead of exiting, delivered to their device at a vCPU's next
//! userspace exit. They are not part of `exits`. The ring is shared by the
//! VM's vCPUs, so a vCPU's entries count what it delivered, not necessarily
//! what it wrote.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::vcpu_profile::{
    CoalescedSnapshot, ExitStatsSnapshot, ReasonSnapshot, VcpuProfileSnapshot,
};
use super::virtio::VirtioStats;
use super::ExitReason;
use crate::devices::serial::OutputLoss;

mod json;

/// Value of the `"schema"` key of the JSON document.
pub const PROFILE_SCHEMA: &str = "exitless.profile/1";
/// Device name used for IO/MMIO accesses that hit no device.
pub const UNMAPPED_DEVICE: &str = "<unmapped>";

/// Change of one KVM binary-stats counter over the profiled window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvmStatDelta {
    /// `"vm"` or `"vcpuN"`.
    pub scope: String,
    /// KVM statistic name, e.g. `"exits"`.
    pub name: String,
    /// Later value minus earlier value (gauges may go down).
    pub delta: i64,
}

impl KvmStatDelta {
    /// Tags `(name, delta)` pairs from one stats fd (e.g. `StatsSchema::deltas`) with `scope`.
    pub fn scoped<'a>(
        scope: &'a str,
        named: impl IntoIterator<Item = (String, u64)> + 'a,
    ) -> impl Iterator<Item = KvmStatDelta> + 'a {
        named.into_iter().map(move |(name, delta)| KvmStatDelta {
            scope: scope.to_string(),
            name,
            delta: delta as i64,
        })
    }
}

/// Everything needed to print or export a profile.
#[derive(Clone, Debug)]
pub struct ProfileReport {
    /// One snapshot (or window delta) per vCPU.
    pub vcpus: Vec<VcpuProfileSnapshot>,
    /// PIO bus device names, by bus index.
    pub device_names_io: Vec<String>,
    /// MMIO bus device names, by bus index.
    pub device_names_mmio: Vec<String>,
    /// KVM statistics deltas over the same window.
    pub kvm_stats: Vec<KvmStatDelta>,
    /// TSC frequency, for cycles to time conversion (0 is treated as 1 GHz).
    pub tsc_khz: u64,
    /// Wall-clock length of the window in seconds.
    pub wall_seconds: f64,
    /// Guest console output the host could not take (dropped and counted).
    pub console: OutputLoss,
    /// Per-queue work of each virtio device.
    pub virtio: Vec<VirtioStats>,
}

/// Cycles to time conversion.
#[derive(Clone, Copy)]
struct TimeScale {
    tsc_khz: u64,
}

impl TimeScale {
    fn new(tsc_khz: u64) -> Self {
        Self {
            tsc_khz: if tsc_khz == 0 { 1_000_000 } else { tsc_khz },
        }
    }

    fn ns(self, cycles: u64) -> u64 {
        (u128::from(cycles) * 1_000_000 / u128::from(self.tsc_khz)) as u64
    }

    fn ns_f64(self, cycles: f64) -> f64 {
        cycles * 1_000_000.0 / self.tsc_khz as f64
    }

    fn us(self, cycles: f64) -> f64 {
        self.ns_f64(cycles) / 1000.0
    }

    fn seconds(self, cycles: u64) -> f64 {
        self.ns_f64(cycles as f64) / 1e9
    }
}

fn percent(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part * 100.0 / whole
    } else {
        0.0
    }
}

/// One line of the reason table, in cycles and percent.
#[derive(Clone, Debug, PartialEq)]
struct ReasonRow {
    label: String,
    stats: ExitStatsSnapshot,
    samples_percent: f64,
    time_percent: f64,
}

/// One line of the by-device table.
#[derive(Clone, Debug)]
struct DeviceRow {
    device: String,
    index: Option<usize>,
    reason: ExitReason,
    stats: ExitStatsSnapshot,
}

/// One line of the coalesced-writes table; also its JSON entry.
#[derive(Clone, Debug, Serialize)]
struct CoalescedRow {
    bus: &'static str,
    device: String,
    index: Option<usize>,
    writes: u64,
}

/// Short bus label used in tables, JSON and fallback device names.
const fn bus_label(pio: bool) -> &'static str {
    if pio {
        "io"
    } else {
        "mmio"
    }
}

fn merge_reason(into: &mut ReasonSnapshot, other: &ReasonSnapshot) {
    into.stats.merge(&other.stats);
    if into.devices.len() < other.devices.len() {
        into.devices
            .resize(other.devices.len(), ExitStatsSnapshot::default());
    }
    for (mine, theirs) in into.devices.iter_mut().zip(&other.devices) {
        mine.merge(theirs);
    }
    match (&mut into.unmapped, &other.unmapped) {
        (Some(mine), Some(theirs)) => mine.merge(theirs),
        (mine @ None, Some(theirs)) => *mine = Some(theirs.clone()),
        _ => {}
    }
}

/// Reasons with samples, most frequent first (ties in `ExitReason` order).
fn active_sorted(reasons: &[ReasonSnapshot]) -> Vec<&ReasonSnapshot> {
    let mut active: Vec<&ReasonSnapshot> = reasons.iter().filter(|r| r.stats.count > 0).collect();
    active.sort_by(|a, b| {
        b.stats
            .count
            .cmp(&a.stats.count)
            .then(a.reason.cmp(&b.reason))
    });
    active
}

fn reason_rows(reasons: &[ReasonSnapshot]) -> Vec<ReasonRow> {
    let total_count: u64 = reasons.iter().map(|r| r.stats.count).sum();
    let total_cycles: u64 = reasons.iter().map(|r| r.stats.total_cycles).sum();
    active_sorted(reasons)
        .into_iter()
        .map(|r| ReasonRow {
            label: r.reason.as_str().to_string(),
            stats: r.stats.clone(),
            samples_percent: percent(r.stats.count as f64, total_count as f64),
            time_percent: percent(r.stats.total_cycles as f64, total_cycles as f64),
        })
        .collect()
}

fn total_row(reasons: &[ReasonSnapshot]) -> ReasonRow {
    let mut stats = ExitStatsSnapshot::default();
    reasons.iter().for_each(|r| stats.merge(&r.stats));
    let has_samples = stats.count > 0;
    let full = if has_samples { 100.0 } else { 0.0 };
    ReasonRow {
        label: "Total".to_string(),
        stats,
        samples_percent: full,
        time_percent: full,
    }
}

impl ProfileReport {
    /// Builds a report; host CPU sets are taken from the snapshots.
    pub fn new(
        vcpus: Vec<VcpuProfileSnapshot>,
        device_names_io: Vec<String>,
        device_names_mmio: Vec<String>,
        kvm_stats: Vec<KvmStatDelta>,
        tsc_khz: u64,
        wall_seconds: f64,
    ) -> Self {
        Self {
            vcpus,
            device_names_io,
            device_names_mmio,
            kvm_stats,
            tsc_khz,
            wall_seconds,
            console: OutputLoss::default(),
            virtio: Vec::new(),
        }
    }

    /// Adds the virtio devices' queue counters.
    pub fn with_virtio(mut self, virtio: Vec<VirtioStats>) -> Self {
        self.virtio = virtio;
        self
    }

    /// Adds what the console and serial log could not take.
    pub fn with_console(mut self, console: OutputLoss) -> Self {
        self.console = console;
        self
    }

    /// `(vcpu id, host CPUs it ran on)` for every vCPU.
    pub fn cpu_sets(&self) -> Vec<(u32, Vec<usize>)> {
        self.vcpus
            .iter()
            .map(|v| (v.vcpu_id, v.host_cpus.clone()))
            .collect()
    }

    /// Per-reason statistics of all vCPUs merged, in `ExitReason::ALL` order.
    pub fn merged_reasons(&self) -> Vec<ReasonSnapshot> {
        let mut merged: Vec<ReasonSnapshot> = ExitReason::ALL
            .iter()
            .map(|&reason| ReasonSnapshot {
                reason,
                stats: ExitStatsSnapshot::default(),
                devices: Vec::new(),
                unmapped: None,
            })
            .collect();
        for reason in self.vcpus.iter().flat_map(|v| &v.reasons) {
            merge_reason(&mut merged[reason.reason as usize], reason);
        }
        merged
    }

    /// Coalesced-ring writes of all vCPUs merged, as `(pio, mmio)`.
    pub fn merged_coalesced(&self) -> (CoalescedSnapshot, CoalescedSnapshot) {
        let mut pio = CoalescedSnapshot::default();
        let mut mmio = CoalescedSnapshot::default();
        for vcpu in &self.vcpus {
            pio.merge(&vcpu.coalesced_pio);
            mmio.merge(&vcpu.coalesced_mmio);
        }
        (pio, mmio)
    }

    /// Writes delivered from the coalesced ring over all vCPUs.
    pub fn coalesced_writes(&self) -> u64 {
        self.vcpus
            .iter()
            .map(VcpuProfileSnapshot::coalesced_writes)
            .fold(0, u64::saturating_add)
    }

    /// Total userspace-handled exits over all vCPUs.
    pub fn exit_count(&self) -> u64 {
        self.vcpus.iter().map(VcpuProfileSnapshot::exit_count).sum()
    }

    fn kvm_run_cycles(&self) -> u64 {
        self.vcpus.iter().map(|v| v.kvm_run_cycles).sum()
    }

    fn kvm_run_count(&self) -> u64 {
        self.vcpus.iter().map(|v| v.kvm_run_count).sum()
    }

    fn userspace_cycles(&self) -> u64 {
        self.vcpus
            .iter()
            .map(VcpuProfileSnapshot::userspace_cycles)
            .sum()
    }

    fn scale(&self) -> TimeScale {
        TimeScale::new(self.tsc_khz)
    }

    fn device_name(&self, reason: ExitReason, index: usize) -> String {
        let pio = matches!(reason, ExitReason::IoIn | ExitReason::IoOut);
        self.bus_device_name(pio, index)
    }

    /// Name of device `index` on the PIO (`pio`) or MMIO bus, `io#N` /
    /// `mmio#N` when unnamed.
    fn bus_device_name(&self, pio: bool, index: usize) -> String {
        let names = if pio {
            &self.device_names_io
        } else {
            &self.device_names_mmio
        };
        names
            .get(index)
            .cloned()
            .unwrap_or_else(|| format!("{}#{index}", bus_label(pio)))
    }

    /// Devices that received coalesced writes, most writes first (ties: PIO
    /// before MMIO, then by index, unmapped last).
    fn coalesced_rows(
        &self,
        pio: &CoalescedSnapshot,
        mmio: &CoalescedSnapshot,
    ) -> Vec<CoalescedRow> {
        let mut rows = Vec::new();
        for (is_pio, bus) in [(true, pio), (false, mmio)] {
            let indexed = bus.devices.iter().enumerate().map(|(i, &w)| (Some(i), w));
            for (index, writes) in indexed.chain([(None, bus.unmapped)]) {
                if writes == 0 {
                    continue;
                }
                let device = match index {
                    Some(index) => self.bus_device_name(is_pio, index),
                    None => UNMAPPED_DEVICE.to_string(),
                };
                rows.push(CoalescedRow {
                    bus: bus_label(is_pio),
                    device,
                    index,
                    writes,
                });
            }
        }
        rows.sort_by_key(|row| std::cmp::Reverse(row.writes));
        rows
    }

    /// Devices with samples for every IO/MMIO reason, most samples first.
    fn device_rows(&self, reasons: &[ReasonSnapshot]) -> Vec<DeviceRow> {
        let mut rows = Vec::new();
        for reason in reasons.iter().filter(|r| r.reason.has_devices()) {
            for (index, stats) in reason.devices.iter().enumerate() {
                rows.push(DeviceRow {
                    device: self.device_name(reason.reason, index),
                    index: Some(index),
                    reason: reason.reason,
                    stats: stats.clone(),
                });
            }
            if let Some(stats) = &reason.unmapped {
                rows.push(DeviceRow {
                    device: UNMAPPED_DEVICE.to_string(),
                    index: None,
                    reason: reason.reason,
                    stats: stats.clone(),
                });
            }
        }
        rows.retain(|row| row.stats.count > 0);
        rows.sort_by(|a, b| {
            b.stats
                .count
                .cmp(&a.stats.count)
                .then(a.reason.cmp(&b.reason))
        });
        rows
    }

    /// A `perf kvm stat report`-like text report. With `per_vcpu`, the
    /// reason table is repeated for every vCPU.
    pub fn render_table(&self, per_vcpu: bool) -> String {
        let mut out = String::new();
        let merged = self.merged_reasons();
        let _ = writeln!(
            out,
            "VM-exit profile: {} vCPU(s), {:.2} s wall, TSC {} kHz, {} exits ({:.0}/s)",
            self.vcpus.len(),
            self.wall_seconds,
            self.tsc_khz,
            self.exit_count(),
            self.exits_per_second()
        );
        self.write_sampling(&mut out);
        out.push_str("\nUserspace exit handling, all vCPUs (times in µs):\n");
        self.write_reason_table(&mut out, &merged);
        if per_vcpu {
            for vcpu in &self.vcpus {
                let _ = writeln!(out, "\nvcpu{} (times in µs):", vcpu.vcpu_id);
                self.write_reason_table(&mut out, &vcpu.reasons);
            }
        }
        self.write_device_table(&mut out, &merged);
        self.write_coalesced_table(&mut out);
        self.write_time_split(&mut out);
        self.write_kvm_stats(&mut out);
        self.write_host_cpus(&mut out);
        super::virtio::write_table(&mut out, &self.virtio);
        self.write_console_loss(&mut out);
        out
    }

    /// Says which exits the times come from when not every exit was timed.
    fn write_sampling(&self, out: &mut String) {
        let (timed, count) = (self.timed_exit_count(), self.exit_count());
        if timed >= count {
            return;
        }
        let every = count.checked_div(timed).unwrap_or(0);
        let _ = writeln!(
            out,
            "Times sampled: {timed} of {count} exits timed (one in ~{every}, --profile-sample); \
             Samples are every exit; Min, Max, p50 and p99 are the timed exits'; Avg, Time% and \
             the time totals are theirs scaled to every exit"
        );
    }

    /// Exits whose handling was timed, over all vCPUs.
    pub fn timed_exit_count(&self) -> u64 {
        self.vcpus
            .iter()
            .map(VcpuProfileSnapshot::timed_exit_count)
            .sum()
    }

    fn write_console_loss(&self, out: &mut String) {
        let OutputLoss {
            console_bytes,
            log_bytes,
        } = self.console;
        if console_bytes > 0 {
            let _ = writeln!(
                out,
                "\nConsole: {console_bytes} bytes of guest output dropped (stdout did not take them)"
            );
        }
        if log_bytes > 0 {
            let _ = writeln!(
                out,
                "\nSerial log: {log_bytes} bytes of guest output dropped (the file did not take them)"
            );
        }
    }

    fn write_reason_table(&self, out: &mut String, reasons: &[ReasonSnapshot]) {
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>9} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "Reason", "Samples", "Samples%", "Time%", "Min", "Max", "Avg", "p50", "p99"
        );
        let rows = reason_rows(reasons);
        for row in rows.iter().chain(std::iter::once(&total_row(reasons))) {
            self.write_reason_row(out, row);
        }
    }

    fn write_reason_row(&self, out: &mut String, row: &ReasonRow) {
        let scale = self.scale();
        let us = |cycles: u64| scale.us(cycles as f64);
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>8.2}% {:>7.2}% {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            row.label,
            row.stats.count,
            row.samples_percent,
            row.time_percent,
            us(row.stats.min_cycles()),
            us(row.stats.max_cycles()),
            scale.us(row.stats.avg_cycles()),
            us(row.stats.percentile_cycles(50.0)),
            us(row.stats.percentile_cycles(99.0)),
        );
    }

    fn write_device_table(&self, out: &mut String, merged: &[ReasonSnapshot]) {
        let rows = self.device_rows(merged);
        if rows.is_empty() {
            return;
        }
        let scale = self.scale();
        out.push_str("\nBy device (times in µs):\n");
        let _ = writeln!(
            out,
            "{:<20} {:<16} {:>10} {:>10} {:>10}",
            "Device", "Reason", "Samples", "Avg", "p99"
        );
        for row in rows {
            let _ = writeln!(
                out,
                "{:<20} {:<16} {:>10} {:>10.2} {:>10.2}",
                row.device,
                row.reason.as_str(),
                row.stats.count,
                scale.us(row.stats.avg_cycles()),
                scale.us(row.stats.percentile_cycles(99.0) as f64),
            );
        }
    }

    fn write_coalesced_table(&self, out: &mut String) {
        let (pio, mmio) = self.merged_coalesced();
        let rows = self.coalesced_rows(&pio, &mmio);
        if rows.is_empty() {
            return;
        }
        out.push_str(
            "\nCoalesced writes (queued by KVM without an exit, delivered at the next exit):\n",
        );
        let _ = writeln!(out, "{:<20} {:<6} {:>10}", "Device", "Bus", "Writes");
        for row in rows {
            let _ = writeln!(out, "{:<20} {:<6} {:>10}", row.device, row.bus, row.writes);
        }
    }

    fn write_time_split(&self, out: &mut String) {
        let scale = self.scale();
        let kvm = self.kvm_run_cycles();
        let user = self.userspace_cycles();
        let whole = (kvm + user) as f64;
        out.push_str("\nvCPU thread time:\n");
        let _ = writeln!(
            out,
            "  time in KVM_RUN:            {:>12.6} s {:>7.2}%  ({} KVM_RUN calls)",
            scale.seconds(kvm),
            percent(kvm as f64, whole),
            self.kvm_run_count()
        );
        let _ = writeln!(
            out,
            "  time in userspace handling: {:>12.6} s {:>7.2}%  ({} exits)",
            scale.seconds(user),
            percent(user as f64, whole),
            self.exit_count()
        );
    }

    fn write_kvm_stats(&self, out: &mut String) {
        let changed: Vec<&KvmStatDelta> = self.kvm_stats.iter().filter(|s| s.delta != 0).collect();
        if changed.is_empty() {
            return;
        }
        out.push_str("\nKVM stats (delta):\n");
        for stat in changed {
            let _ = writeln!(
                out,
                "  {:<8} {:<32} {:>14}",
                stat.scope, stat.name, stat.delta
            );
        }
    }

    fn write_host_cpus(&self, out: &mut String) {
        out.push_str("\nHost CPUs:\n");
        for (vcpu_id, cpus) in self.cpu_sets() {
            let list = if cpus.is_empty() {
                "(unknown)".to_string()
            } else {
                let names: Vec<String> = cpus.iter().map(usize::to_string).collect();
                names.join(",")
            };
            let _ = writeln!(out, "  vcpu{vcpu_id} ran on host CPUs {list}");
        }
    }

    /// Exits handled in userspace per wall-clock second.
    pub fn exits_per_second(&self) -> f64 {
        if self.wall_seconds > 0.0 {
            self.exit_count() as f64 / self.wall_seconds
        } else {
            0.0
        }
    }

    /// Share of vCPU thread time spent handling exits in userspace.
    pub fn userspace_percent(&self) -> f64 {
        let user = self.userspace_cycles() as f64;
        percent(user, user + self.kvm_run_cycles() as f64)
    }

    /// One line for a live `--profile-interval` display.
    pub fn render_summary(&self) -> String {
        let merged = self.merged_reasons();
        let total = self.exit_count();
        if total == 0 {
            // Said, not left out: a quiet interval is a figure too (the guest idles, or
            // its exits all stay in the kernel).
            return format!(
                "0 exits/s (0 in {:.2} s): no userspace exits in this interval",
                self.wall_seconds
            );
        }
        let top = match active_sorted(&merged).first() {
            Some(top) => format!(
                "{} {:.1}%",
                top.reason.as_str(),
                percent(top.stats.count as f64, total as f64)
            ),
            None => "-".to_string(),
        };
        let mut line = format!(
            "{:.0} exits/s ({} in {:.2} s), top {}, userspace {:.1}% of vCPU time",
            self.exits_per_second(),
            total,
            self.wall_seconds,
            top,
            self.userspace_percent()
        );
        let coalesced = self.coalesced_writes();
        if coalesced > 0 {
            let _ = write!(line, ", {coalesced} coalesced writes");
        }
        line
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
