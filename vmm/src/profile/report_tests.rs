use serde_json::Value;

use super::*;
use crate::profile::VcpuProfile;

/// 1 GHz: one cycle is one nanosecond, 1000 cycles are 1.00 µs.
const TSC_KHZ: u64 = 1_000_000;

/// Two vCPUs; totals: IO_OUT 5 x 1000, HLT 3 x 1000, IO_IN 1 x 2000
/// (unmapped), MMIO_WRITE 1 x 4000 => 10 exits, 14000 cycles in userspace;
/// 100000 cycles in KVM_RUN.
fn sample_snapshots() -> Vec<VcpuProfileSnapshot> {
    let vcpu0 = VcpuProfile::new(0, 2, 1);
    (0..3).for_each(|_| vcpu0.record_exit(ExitReason::IoOut, Some(0), 1000));
    vcpu0.record_exit(ExitReason::IoIn, None, 2000);
    vcpu0.record_exit(ExitReason::MmioWrite, Some(0), 4000);
    (0..5).for_each(|_| vcpu0.record_in_kvm(10_000));
    vcpu0.record_cpu(1);
    vcpu0.record_cpu(0);
    let vcpu1 = VcpuProfile::new(1, 2, 1);
    (0..2).for_each(|_| vcpu1.record_exit(ExitReason::IoOut, Some(0), 1000));
    (0..3).for_each(|_| vcpu1.record_exit(ExitReason::Hlt, None, 1000));
    (0..5).for_each(|_| vcpu1.record_in_kvm(10_000));
    vcpu1.record_cpu(1);
    vec![vcpu0.snapshot(), vcpu1.snapshot()]
}

fn stat(scope: &str, name: &str, delta: i64) -> KvmStatDelta {
    KvmStatDelta {
        scope: scope.to_string(),
        name: name.to_string(),
        delta,
    }
}

fn sample_report() -> ProfileReport {
    ProfileReport::new(
        sample_snapshots(),
        vec!["serial".to_string(), "rtc".to_string()],
        vec!["virtio-blk".to_string()],
        vec![
            stat("vm", "remote_tlb_flush", 0),
            stat("vcpu0", "exits", 1234),
            stat("vcpu1", "halt_exits", 3),
        ],
        TSC_KHZ,
        2.0,
    )
}

/// `sample_report` plus coalesced writes. vcpu0: serial 120, unmapped MMIO
/// 30, virtio-blk 4; vcpu1: serial 80 and, on a longer PIO list, the unnamed
/// device 2 (`io#2`) 7. Totals: serial 200, <unmapped> 30, io#2 7,
/// virtio-blk 4 => 241.
fn coalesced_snapshots() -> Vec<VcpuProfileSnapshot> {
    let vcpu0 = VcpuProfile::new(0, 2, 1);
    (0..120).for_each(|_| vcpu0.record_coalesced(true, Some(0)));
    (0..30).for_each(|_| vcpu0.record_coalesced(false, None));
    (0..4).for_each(|_| vcpu0.record_coalesced(false, Some(0)));
    let vcpu1 = VcpuProfile::new(1, 2, 1);
    (0..80).for_each(|_| vcpu1.record_coalesced(true, Some(0)));
    let mut snapshots = sample_snapshots();
    for (into, from) in snapshots.iter_mut().zip([vcpu0, vcpu1]) {
        let from = from.snapshot();
        into.coalesced_pio = from.coalesced_pio;
        into.coalesced_mmio = from.coalesced_mmio;
    }
    snapshots[1].coalesced_pio.devices.push(7);
    snapshots
}

fn coalesced_report() -> ProfileReport {
    ProfileReport {
        vcpus: coalesced_snapshots(),
        ..sample_report()
    }
}

/// The text from `heading` up to the next blank line.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in\n{text}"));
    let rest = &text[start..];
    &rest[..rest.find("\n\n").unwrap_or(rest.len())]
}

fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in\n{text}"))
}

fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[test]
fn reason_table_rows_and_columns() {
    let table = sample_report().render_table(false);
    let header = columns(line_starting(&table, "Reason"));
    assert_eq!(
        header,
        ["Reason", "Samples", "Samples%", "Time%", "Min", "Max", "Avg", "p50", "p99"]
    );
    let io_out = columns(line_starting(&table, "IO_OUT"));
    assert_eq!(
        io_out,
        ["IO_OUT", "5", "50.00%", "35.71%", "1.00", "1.00", "1.00", "1.00", "1.00"]
    );
    let hlt = columns(line_starting(&table, "HLT"));
    assert_eq!(&hlt[..4], ["HLT", "3", "30.00%", "21.43%"]);
    let mmio = columns(line_starting(&table, "MMIO_WRITE"));
    assert_eq!(&mmio[..5], ["MMIO_WRITE", "1", "10.00%", "28.57%", "4.00"]);
    let total = columns(line_starting(&table, "Total"));
    assert_eq!(
        &total[..6],
        ["Total", "10", "100.00%", "100.00%", "1.00", "4.00"]
    );
    assert_eq!(total[6], "1.40");
    assert!(
        !table.contains("SHUTDOWN"),
        "zero-sample reasons are hidden"
    );
}

#[test]
fn reason_rows_are_sorted_by_samples() {
    let table = sample_report().render_table(false);
    let position = |name: &str| table.find(&format!("\n{name} ")).expect(name);
    assert!(position("IO_OUT") < position("HLT"));
    assert!(position("HLT") < position("IO_IN"));
    assert!(
        position("IO_IN") < position("MMIO_WRITE"),
        "ties keep enum order"
    );
}

#[test]
fn percent_columns_sum_to_hundred() {
    let report = sample_report();
    let rows = reason_rows(&report.merged_reasons());
    let samples: f64 = rows.iter().map(|row| row.samples_percent).sum();
    let time: f64 = rows.iter().map(|row| row.time_percent).sum();
    assert!((samples - 100.0).abs() < 1e-9, "{samples}");
    assert!((time - 100.0).abs() < 1e-9, "{time}");
}

#[test]
fn device_section() {
    let table = sample_report().render_table(false);
    let section = &table[table.find("By device").expect("device section")..];
    assert_eq!(
        columns(line_starting(section, "Device")),
        ["Device", "Reason", "Samples", "Avg", "p99"]
    );
    assert_eq!(
        columns(line_starting(section, "serial")),
        ["serial", "IO_OUT", "5", "1.00", "1.00"]
    );
    assert_eq!(
        columns(line_starting(section, "<unmapped>")),
        ["<unmapped>", "IO_IN", "1", "2.00", "2.00"]
    );
    assert_eq!(
        columns(line_starting(section, "virtio-blk")),
        ["virtio-blk", "MMIO_WRITE", "1", "4.00", "4.00"]
    );
    assert!(
        !section.contains("rtc"),
        "devices without samples are hidden"
    );
}

#[test]
fn time_split_kvm_stats_and_cpus() {
    let table = sample_report().render_table(false);
    let kvm = columns(line_starting(&table, "  time in KVM_RUN"));
    assert_eq!(&kvm[3..6], ["0.000100", "s", "87.72%"]);
    assert!(table.contains("(10 KVM_RUN calls)"));
    let user = columns(line_starting(&table, "  time in userspace handling"));
    assert_eq!(&user[4..7], ["0.000014", "s", "12.28%"]);
    assert_eq!(
        columns(line_starting(&table, "  vcpu0 ")),
        ["vcpu0", "exits", "1234"]
    );
    assert!(table.contains("halt_exits"));
    assert!(
        !table.contains("remote_tlb_flush"),
        "zero deltas are hidden"
    );
    assert!(table.contains("vcpu0 ran on host CPUs 0,1"));
    assert!(table.contains("vcpu1 ran on host CPUs 1"));
}

#[test]
fn per_vcpu_tables() {
    let report = sample_report();
    assert!(!report.render_table(false).contains("vcpu1 (times"));
    let table = report.render_table(true);
    let vcpu1 = &table[table.find("vcpu1 (times").expect("vcpu1 table")..];
    assert_eq!(
        &columns(line_starting(vcpu1, "HLT"))[..4],
        ["HLT", "3", "60.00%", "60.00%"]
    );
    assert_eq!(&columns(line_starting(vcpu1, "Total"))[..2], ["Total", "5"]);
    assert!(table.contains("vcpu0 (times"));
}

#[test]
fn summary_line() {
    let summary = sample_report().render_summary();
    assert_eq!(
        summary,
        "5 exits/s (10 in 2.00 s), top IO_OUT 50.0%, userspace 12.3% of vCPU time"
    );
    assert!(!summary.contains('\n'));
}

#[test]
fn empty_report_renders() {
    let report = ProfileReport::new(vec![], vec![], vec![], vec![], 0, 0.0);
    let table = report.render_table(true);
    assert!(line_starting(&table, "Total").contains("0.00%"));
    assert!(!table.contains("By device"));
    assert_eq!(
        report.render_summary(),
        "0 exits/s (0 in 0.00 s): no userspace exits in this interval"
    );
    let json = serde_json::to_value(&report).expect("serialize");
    assert_eq!(json["totals"]["exits"], 0);
}

#[test]
fn json_schema_keys() {
    let json = serde_json::to_value(sample_report()).expect("serialize");
    let keys = [
        "schema",
        "tsc_khz",
        "wall_seconds",
        "vcpus",
        "totals",
        "kvm_stats",
        "console",
    ];
    for key in keys {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["schema"], PROFILE_SCHEMA);
    assert_eq!(json["tsc_khz"], TSC_KHZ);
    assert_eq!(json["wall_seconds"], 2.0);
    let vcpu = &json["vcpus"][0];
    for key in [
        "id",
        "host_cpus",
        "kvm_run",
        "userspace",
        "reasons",
        "coalesced",
    ] {
        assert!(vcpu.get(key).is_some(), "missing vcpus[0].{key}");
    }
    let reason = &vcpu["reasons"][0];
    let reason_keys = [
        "reason", "count", "total_ns", "min_ns", "max_ns", "avg_ns", "p50_ns", "p99_ns", "devices",
    ];
    for key in reason_keys {
        assert!(reason.get(key).is_some(), "missing reason.{key}");
    }
    for key in [
        "exits",
        "exits_per_second",
        "userspace_percent",
        "kvm_run",
        "reasons",
        "coalesced",
    ] {
        assert!(json["totals"].get(key).is_some(), "missing totals.{key}");
    }
}

#[test]
fn json_values() {
    let json = serde_json::to_value(sample_report()).expect("serialize");
    let vcpu0 = &json["vcpus"][0];
    assert_eq!(vcpu0["id"], 0);
    assert_eq!(vcpu0["host_cpus"], serde_json::json!([0, 1]));
    assert_eq!(
        vcpu0["kvm_run"],
        serde_json::json!({"count": 5, "timed": 5, "cycles": 50000, "ns": 50000})
    );
    assert_eq!(vcpu0["userspace"]["cycles"], 9000);
    let io_out = &vcpu0["reasons"][0];
    assert_eq!(io_out["reason"], "IO_OUT");
    assert_eq!(io_out["count"], 3);
    assert_eq!(io_out["total_ns"], 3000);
    assert_eq!(io_out["avg_ns"], 1000.0);
    assert_eq!(
        (io_out["p50_ns"].clone(), io_out["p99_ns"].clone()),
        (1000.into(), 1000.into())
    );
    assert_eq!(io_out["devices"][0]["device"], "serial");
    assert_eq!(io_out["devices"][0]["index"], 0);
    let io_in = &vcpu0["reasons"][1];
    assert_eq!(io_in["devices"][0]["device"], UNMAPPED_DEVICE);
    assert_eq!(io_in["devices"][0]["index"], Value::Null);
    assert_eq!(vcpu0["reasons"].as_array().map(Vec::len), Some(3));
    let totals = &json["totals"];
    assert_eq!(totals["exits"], 10);
    assert_eq!(totals["exits_per_second"], 5.0);
    assert_eq!(totals["reasons"][0]["count"], 5);
    assert_eq!(totals["reasons"][1]["reason"], "HLT");
    assert_eq!(totals["reasons"][1]["devices"], serde_json::json!([]));
    assert_eq!(
        json["kvm_stats"][1],
        serde_json::json!({"scope": "vcpu0", "name": "exits", "delta": 1234})
    );
}

#[test]
fn json_counts_sum_to_total() {
    let json = serde_json::to_value(sample_report()).expect("serialize");
    let reasons = json["totals"]["reasons"].as_array().expect("array");
    let sum: u64 = reasons.iter().filter_map(|r| r["count"].as_u64()).sum();
    assert_eq!(sum, 10);
}

#[test]
fn tsc_frequency_scales_times() {
    let mut report = sample_report();
    report.tsc_khz = 2 * TSC_KHZ;
    let json = serde_json::to_value(&report).expect("serialize");
    assert_eq!(json["vcpus"][0]["reasons"][0]["total_ns"], 1500);
    let table = report.render_table(false);
    assert_eq!(columns(line_starting(&table, "IO_OUT"))[4], "0.50");
}

#[test]
fn cpu_sets_come_from_snapshots() {
    assert_eq!(
        sample_report().cpu_sets(),
        vec![(0, vec![0, 1]), (1, vec![1])]
    );
}

#[test]
fn coalesced_section_only_with_writes() {
    let plain = sample_report().render_table(true);
    assert!(!plain.contains("Coalesced"), "{plain}");
    let table = coalesced_report().render_table(false);
    let coalesced = section(&table, "Coalesced writes");
    assert!(table.find("By device") < table.find("Coalesced writes"));
    let lines: Vec<Vec<&str>> = coalesced.lines().skip(1).map(columns).collect();
    assert_eq!(
        lines,
        [
            vec!["Device", "Bus", "Writes"],
            vec!["serial", "io", "200"],
            vec!["<unmapped>", "mmio", "30"],
            vec!["io#2", "io", "7"],
            vec!["virtio-blk", "mmio", "4"],
        ]
    );
    assert!(
        !coalesced.contains("rtc"),
        "devices without writes are hidden"
    );
}

#[test]
fn coalesced_merge_pads_unequal_lengths() {
    let mut report = coalesced_report();
    let expected = (
        CoalescedSnapshot {
            devices: vec![200, 0, 7],
            unmapped: 0,
        },
        CoalescedSnapshot {
            devices: vec![4],
            unmapped: 30,
        },
    );
    assert_eq!(report.merged_coalesced(), expected);
    report.vcpus.reverse();
    assert_eq!(report.merged_coalesced(), expected, "longer list first");
    assert_eq!(report.coalesced_writes(), 241);
    assert_eq!(report.exit_count(), 10, "coalesced writes are not exits");
}

#[test]
fn coalesced_summary_suffix() {
    assert_eq!(
        coalesced_report().render_summary(),
        "5 exits/s (10 in 2.00 s), top IO_OUT 50.0%, userspace 12.3% of vCPU time, \
         241 coalesced writes"
    );
    assert!(!sample_report().render_summary().contains("coalesced"));
}

#[test]
fn coalesced_json_entries() {
    let json = serde_json::to_value(coalesced_report()).expect("serialize");
    assert_eq!(
        json["vcpus"][0]["coalesced"],
        serde_json::json!([
            {"bus": "io", "device": "serial", "index": 0, "writes": 120},
            {"bus": "mmio", "device": "<unmapped>", "index": null, "writes": 30},
            {"bus": "mmio", "device": "virtio-blk", "index": 0, "writes": 4},
        ])
    );
    assert_eq!(
        json["vcpus"][1]["coalesced"],
        serde_json::json!([
            {"bus": "io", "device": "serial", "index": 0, "writes": 80},
            {"bus": "io", "device": "io#2", "index": 2, "writes": 7},
        ])
    );
    let totals = json["totals"]["coalesced"].as_array().expect("array");
    let summary: Vec<(&str, &str, u64)> = totals
        .iter()
        .map(|row| {
            let text = |key: &str| row[key].as_str().unwrap_or("?");
            (
                text("bus"),
                text("device"),
                row["writes"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("io", "serial", 200),
            ("mmio", "<unmapped>", 30),
            ("io", "io#2", 7),
            ("mmio", "virtio-blk", 4),
        ]
    );
    assert_eq!(json["totals"]["exits"], 10);
}

#[test]
fn json_coalesced_empty_without_writes() {
    let json = serde_json::to_value(sample_report()).expect("serialize");
    assert_eq!(json["totals"]["coalesced"], serde_json::json!([]));
    for vcpu in json["vcpus"].as_array().expect("array") {
        assert_eq!(vcpu["coalesced"], serde_json::json!([]));
    }
}

#[test]
fn dropped_console_output_is_reported_only_when_there_is_some() {
    use crate::devices::serial::OutputLoss;
    let quiet = sample_report();
    assert!(!quiet.render_table(false).contains("dropped"));
    let json = serde_json::to_value(&quiet).unwrap();
    assert_eq!(json["console"]["console_bytes"], 0);
    let lossy = sample_report().with_console(OutputLoss {
        console_bytes: 1234,
        log_bytes: 5,
    });
    let table = lossy.render_table(false);
    assert!(
        table.contains("Console: 1234 bytes of guest output dropped"),
        "{table}"
    );
    assert!(table.contains("Serial log: 5 bytes"), "{table}");
    let json = serde_json::to_value(&lossy).unwrap();
    assert_eq!(json["console"]["console_bytes"], 1234);
    assert_eq!(json["console"]["log_bytes"], 5);
}

/// One exit in four timed: the counts are exact, the times the timed exit's scaled to all four,
/// and the report says so.
#[test]
fn a_sampled_profile_counts_every_exit_scales_its_times_and_says_so() {
    let profile = VcpuProfile::new(0, 2, 0);
    profile.record_in_kvm(1000);
    profile.record_exit(ExitReason::IoOut, Some(1), 100);
    (0..3).for_each(|_| profile.count_exit(ExitReason::IoOut, Some(1)));
    let snapshot = profile.snapshot();
    assert_eq!(
        (
            snapshot.kvm_run_count,
            snapshot.kvm_run_timed,
            snapshot.kvm_run_cycles
        ),
        (4, 1, 4000)
    );
    let io = snapshot.reason(ExitReason::IoOut).unwrap();
    assert_eq!((io.stats.count, io.stats.timed), (4, 1));
    assert_eq!((io.stats.total_cycles, io.stats.avg_cycles()), (400, 100.0));
    assert_eq!((io.devices[1].count, io.devices[1].timed), (4, 1));
    assert_eq!((snapshot.exit_count(), snapshot.timed_exit_count()), (4, 1));
    // One counter read, as the lab's probe of a running vCPU reads it; beyond the table's
    // devices is "unmapped"; a reason without devices has none.
    profile.count_exit(ExitReason::IoOut, None);
    assert_eq!(profile.device_count(ExitReason::IoOut, Some(1)), 4);
    assert_eq!(profile.device_count(ExitReason::IoOut, None), 1);
    assert_eq!(profile.device_count(ExitReason::IoOut, Some(9)), 1);
    assert_eq!(profile.device_count(ExitReason::Hlt, None), 0);
    let report = ProfileReport::new(vec![snapshot], vec![], vec![], vec![], TSC_KHZ, 1.0);
    let text = report.render_table(false);
    assert!(
        text.contains("Times sampled: 1 of 4 exits timed (one in ~4"),
        "{text}"
    );
    let json = serde_json::to_value(&report).expect("serialize");
    assert_eq!(json["totals"]["userspace"]["timed"], 1);
    assert_eq!(json["totals"]["reasons"][0]["timed"], 1);
    // Every exit timed: no such line.
    assert!(!sample_report()
        .render_table(false)
        .contains("Times sampled"));
}
