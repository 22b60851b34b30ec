//! The JSON document `ProfileReport` serializes to (`--profile-json`, the bench's and the
//! API's counters).
//!
//! # Schema `exitless.profile/1`
//!
//! `ProfileReport` serializes (with `serde`) to:
//!
//! ```text
//! {
//!   "schema": "exitless.profile/1",
//!   "tsc_khz": u64,                 // TSC frequency used for cycles -> ns
//!   "wall_seconds": f64,            // wall-clock length of the window
//!   "vcpus": [ {
//!     "id": u32,
//!     "host_cpus": [usize],         // host CPUs the vCPU thread ran on
//!     "kvm_run": { "count", "timed", "cycles", "ns" },   // time inside KVM_RUN
//!     "userspace": { "exits", "timed", "cycles", "ns" }, // exit handling time
//!     "reasons": [ REASON ],        // only reasons with count > 0, by count desc
//!     "coalesced": [ COALESCED ]    // only writes > 0, by writes desc
//!   } ],
//!   "totals": {                     // all vCPUs merged
//!     "exits", "exits_per_second", "userspace_percent",
//!     "kvm_run": {...}, "userspace": {...}, "reasons": [ REASON ],
//!     "coalesced": [ COALESCED ]
//!   },
//!   "kvm_stats": [ { "scope": "vm" | "vcpuN", "name", "delta" } ],
//!   "console": { "console_bytes", "log_bytes" }, // guest output dropped: stdout, --serial-log
//!   "virtio": [ { "device": name, "queues": [ { "queue", "notifies", "interrupts",
//!                                                "completed", "malformed" } ] } ]
//! }
//! REASON = { "reason": "IO_OUT", "count", "timed", "total_ns", "min_ns", "max_ns",
//!            "avg_ns" (f64), "p50_ns", "p99_ns",
//!            "devices": [ { "device": name | "<unmapped>", "index": usize | null,
//!                           "count", "timed", "total_ns", "min_ns", "max_ns",
//!                           "avg_ns", "p50_ns", "p99_ns" } ] }   // count > 0 only
//! Every exit is counted ("count", "exits"); "timed" of them were timed (one in N with
//! `--profile-sample N`, all with N = 1): min, max and the percentiles are the timed exits',
//! "total_ns", "avg_ns" and the cycles are theirs scaled to "count" (exact when equal).
//! COALESCED = { "bus": "io" | "mmio", "device": name | "<unmapped>",
//!               "index": usize | null, "writes": u64 }
//! ```
//!
use serde::{Serialize, Serializer};

use super::super::vcpu_profile::{ExitStatsSnapshot, ReasonSnapshot, VcpuProfileSnapshot};
use super::super::virtio::VirtioStats;
use super::super::ExitReason;
use super::{active_sorted, CoalescedRow, KvmStatDelta, ProfileReport, TimeScale, PROFILE_SCHEMA};
use crate::devices::serial::OutputLoss;

#[derive(Serialize)]
struct StatsDocument {
    count: u64,
    timed: u64,
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
    avg_ns: f64,
    p50_ns: u64,
    p99_ns: u64,
}

#[derive(Serialize)]
struct DeviceDocument {
    device: String,
    index: Option<usize>,
    #[serde(flatten)]
    stats: StatsDocument,
}

#[derive(Serialize)]
struct ReasonDocument {
    reason: ExitReason,
    #[serde(flatten)]
    stats: StatsDocument,
    devices: Vec<DeviceDocument>,
}

#[derive(Serialize)]
struct KvmRunDocument {
    count: u64,
    timed: u64,
    cycles: u64,
    ns: u64,
}

#[derive(Serialize)]
struct UserspaceDocument {
    exits: u64,
    timed: u64,
    cycles: u64,
    ns: u64,
}

#[derive(Serialize)]
struct VcpuDocument {
    id: u32,
    host_cpus: Vec<usize>,
    kvm_run: KvmRunDocument,
    userspace: UserspaceDocument,
    reasons: Vec<ReasonDocument>,
    coalesced: Vec<CoalescedRow>,
}

#[derive(Serialize)]
struct TotalsDocument {
    exits: u64,
    exits_per_second: f64,
    userspace_percent: f64,
    kvm_run: KvmRunDocument,
    userspace: UserspaceDocument,
    reasons: Vec<ReasonDocument>,
    coalesced: Vec<CoalescedRow>,
}

#[derive(Serialize)]
struct ProfileDocument<'a> {
    schema: &'static str,
    tsc_khz: u64,
    wall_seconds: f64,
    vcpus: Vec<VcpuDocument>,
    totals: TotalsDocument,
    kvm_stats: &'a [KvmStatDelta],
    console: OutputLoss,
    virtio: &'a [VirtioStats],
}

impl StatsDocument {
    fn new(stats: &ExitStatsSnapshot, scale: TimeScale) -> Self {
        Self {
            count: stats.count,
            timed: stats.timed,
            total_ns: scale.ns(stats.total_cycles),
            min_ns: scale.ns(stats.min_cycles()),
            max_ns: scale.ns(stats.max_cycles()),
            avg_ns: scale.ns_f64(stats.avg_cycles()),
            p50_ns: scale.ns(stats.percentile_cycles(50.0)),
            p99_ns: scale.ns(stats.percentile_cycles(99.0)),
        }
    }
}

impl ProfileReport {
    fn reason_documents(&self, reasons: &[ReasonSnapshot]) -> Vec<ReasonDocument> {
        let scale = self.scale();
        active_sorted(reasons)
            .into_iter()
            .map(|reason| ReasonDocument {
                reason: reason.reason,
                stats: StatsDocument::new(&reason.stats, scale),
                devices: self
                    .device_rows(std::slice::from_ref(reason))
                    .into_iter()
                    .map(|row| DeviceDocument {
                        device: row.device,
                        index: row.index,
                        stats: StatsDocument::new(&row.stats, scale),
                    })
                    .collect(),
            })
            .collect()
    }

    fn vcpu_document(&self, vcpu: &VcpuProfileSnapshot) -> VcpuDocument {
        let scale = self.scale();
        VcpuDocument {
            id: vcpu.vcpu_id,
            host_cpus: vcpu.host_cpus.clone(),
            kvm_run: KvmRunDocument {
                count: vcpu.kvm_run_count,
                timed: vcpu.kvm_run_timed,
                cycles: vcpu.kvm_run_cycles,
                ns: scale.ns(vcpu.kvm_run_cycles),
            },
            userspace: UserspaceDocument {
                exits: vcpu.exit_count(),
                timed: vcpu.timed_exit_count(),
                cycles: vcpu.userspace_cycles(),
                ns: scale.ns(vcpu.userspace_cycles()),
            },
            reasons: self.reason_documents(&vcpu.reasons),
            coalesced: self.coalesced_rows(&vcpu.coalesced_pio, &vcpu.coalesced_mmio),
        }
    }

    fn totals_document(&self) -> TotalsDocument {
        let scale = self.scale();
        let (pio, mmio) = self.merged_coalesced();
        TotalsDocument {
            exits: self.exit_count(),
            exits_per_second: self.exits_per_second(),
            userspace_percent: self.userspace_percent(),
            kvm_run: KvmRunDocument {
                count: self.kvm_run_count(),
                timed: self.vcpus.iter().map(|v| v.kvm_run_timed).sum(),
                cycles: self.kvm_run_cycles(),
                ns: scale.ns(self.kvm_run_cycles()),
            },
            userspace: UserspaceDocument {
                exits: self.exit_count(),
                timed: self.timed_exit_count(),
                cycles: self.userspace_cycles(),
                ns: scale.ns(self.userspace_cycles()),
            },
            reasons: self.reason_documents(&self.merged_reasons()),
            coalesced: self.coalesced_rows(&pio, &mmio),
        }
    }

    fn document(&self) -> ProfileDocument<'_> {
        ProfileDocument {
            schema: PROFILE_SCHEMA,
            tsc_khz: self.tsc_khz,
            wall_seconds: self.wall_seconds,
            vcpus: self.vcpus.iter().map(|v| self.vcpu_document(v)).collect(),
            totals: self.totals_document(),
            kvm_stats: &self.kvm_stats,
            console: self.console,
            virtio: &self.virtio,
        }
    }
}

impl Serialize for ProfileReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.document().serialize(serializer)
    }
}
