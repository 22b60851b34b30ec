use super::*;
use crate::bench::ipi_table::render_ipi;

const LINE: &str = "EXITLESS RESULT case=tlb_shootdown_pv_flush cpl=0 iters=10 cycles=5000 empty=100 ipis=0 uds=0 cpus=3 targets=2 acks=0,10,7 skips=0,0,3 stale=0 preempted_skips=3 vmmcall=1";

fn guest_run(line: &str) -> GuestRun {
    let GuestLine::Result(r) = parse_line(line).unwrap() else {
        panic!("not a result: {line}");
    };
    GuestRun::parse(line, r).unwrap()
}

fn checked(case: &'static str, line: &str) -> IpiPoint {
    let run = guest_run(line);
    let case = IPI_CASES.iter().find(|c| c.name == case).unwrap();
    let mut point = measure(case, &run, &[], None, 2_000_000).unwrap();
    check(&mut point, &run);
    point
}

#[test]
fn result_lines_give_per_vcpu_acks_and_skips() {
    let run = guest_run(LINE);
    assert_eq!((run.cpus, run.targets), (3, 2));
    assert_eq!(run.acks, [0, 10, 7]);
    assert_eq!(run.skips, [0, 0, 3]);
    assert_eq!((run.stale, run.preempted_skips), (0, 3));
    let broken = LINE.replace("acks=0,10,7", "acks=0,x,7");
    let GuestLine::Result(r) = parse_line(&broken).unwrap() else {
        panic!()
    };
    assert!(matches!(
        GuestRun::parse(&broken, r),
        Err(IpiError::Parse(ParseError::BadValue("acks", _)))
    ));
}

#[test]
fn every_target_must_acknowledge_or_be_flushed_by_kvm() {
    assert!(checked("tlb_shootdown_pv_flush", LINE).problems.is_empty());
    let lost = LINE.replace("acks=0,10,7", "acks=0,9,7");
    let p = checked("tlb_shootdown_pv_flush", &lost);
    assert_eq!(
        p.problems,
        ["vCPU 1 acknowledged 9 and was flushed by KVM 0 times, for 10 operations"]
    );
    let stray = LINE.replace("acks=0,10,7", "acks=1,10,7");
    assert_eq!(checked("tlb_shootdown_pv_flush", &stray).problems.len(), 1);
    let stale = LINE.replace("stale=0", "stale=2");
    let p = checked("tlb_shootdown_pv_flush", &stale);
    assert_eq!(
        p.problems,
        ["2 handler reads saw the old page after invlpg"]
    );
    let short = LINE.replace("skips=0,0,3", "skips=0,3");
    assert_eq!(checked("tlb_shootdown_pv_flush", &short).problems.len(), 1);
}

#[test]
fn a_lone_vcpu_interrupts_itself_in_the_unicast_case_only() {
    let one = "EXITLESS RESULT case=ipi_unicast cpl=0 iters=5 cycles=50 empty=1 ipis=0 uds=0 cpus=1 targets=1 acks=5 skips=0 stale=0 preempted_skips=0 vmmcall=0";
    assert!(checked("ipi_unicast", one).problems.is_empty());
    let two = "EXITLESS RESULT case=ipi_unicast cpl=0 iters=5 cycles=50 empty=1 ipis=0 uds=0 cpus=2 targets=1 acks=0,5 skips=0,0 stale=0 preempted_skips=0 vmmcall=0";
    assert!(checked("ipi_unicast", two).problems.is_empty());
    let shoot = one.replace("ipi_unicast", "tlb_shootdown");
    assert_eq!(
        checked("tlb_shootdown", &shoot).problems.len(),
        1,
        "no target"
    );
}

#[test]
fn vcpu_counts_double_up_to_the_limit_of_four_per_host_cpu() {
    assert_eq!(max_vcpus(2), 8);
    assert_eq!(max_vcpus(1), 4);
    assert_eq!(max_vcpus(64), MAX_VCPUS);
    assert_eq!(vcpu_counts(8, 2).unwrap(), [1, 2, 4, 8]);
    assert_eq!(vcpu_counts(6, 2).unwrap(), [1, 2, 4, 6]);
    assert_eq!(vcpu_counts(1, 2).unwrap(), [1]);
    assert!(vcpu_counts(8, 1).is_err());
    assert!(vcpu_counts(0, 2).is_err());
    assert!(select(&["nope".into()]).is_err());
    assert_eq!(select(&[]).unwrap().len(), IPI_CASES.len());
}

#[test]
fn guest_cases_exist_in_the_guest_source() {
    let src = include_str!("../../../bench-guest/ipi.c");
    for c in IPI_CASES {
        assert!(src.contains(&format!("{{\"{}\",", c.name)), "{}", c.name);
    }
}

fn kvm_missing(test: &str) -> bool {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
        return true;
    }
    false
}

fn case(name: &str) -> &'static IpiCase {
    IPI_CASES.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn a_shootdown_on_two_vcpus_is_acknowledged_every_time() {
    if kvm_missing("ipi_shootdown") {
        return;
    }
    let (outcome, probe) = run_point(case("tlb_shootdown"), 2, None, 5).unwrap();
    let PointOutcome::Measured(p) = outcome else {
        panic!("skipped: {outcome:?}");
    };
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    assert_eq!((p.acks.clone(), p.targets), (vec![0, 5], 1));
    assert_eq!(p.host_cpus.len(), 2, "both vCPUs marked the span");
    assert!(probe.unwrap().contains("x2apic=1"));
}

#[test]
fn pv_variants_run_or_say_why_not() {
    if kvm_missing("ipi_pv_variants") {
        return;
    }
    for name in ["tlb_shootdown_pv_ipi", "tlb_shootdown_pv_flush"] {
        let (outcome, _) = run_point(case(name), 2, Some(&[0]), 3).unwrap();
        match outcome {
            PointOutcome::Measured(p) => assert!(p.problems.is_empty(), "{name}: {:?}", p.problems),
            PointOutcome::Skipped(why) => assert!(!why.is_empty(), "{name}"),
        }
    }
}

fn report_with(points: Vec<IpiPoint>) -> IpiReport {
    IpiReport {
        schema: IPI_SCHEMA,
        host: crate::bench::report::tests::host(),
        iterations: 10,
        vcpu_counts: vec![1, 2],
        pinned_cpus: vec![0, 1],
        guest_probe: Some("x2apic=1".into()),
        wall_seconds: 1.0,
        points,
        skipped: vec![IpiSkip {
            case: "tlb_shootdown_pv_ipi",
            vcpus: 2,
            placement: Placement::Pinned,
            reason: "vmcall-and-vmmcall-at-CPL0-raise-#UD-here".into(),
        }],
        failures: vec![IpiFailure {
            case: "ipi_broadcast",
            vcpus: 2,
            placement: Placement::Floating,
            error: "vCPU 1 acknowledged 9".into(),
        }],
    }
}

#[test]
fn a_pv_flush_that_skipped_nothing_says_why() {
    let mut p = checked("tlb_shootdown_pv_flush", LINE);
    p.exits_per_op.insert("preemption_other".into(), 2.0);
    let run = guest_run(
        &LINE
            .replace("skips=0,0,3", "skips=0,0,0")
            .replace("preempted_skips=3", "preempted_skips=0"),
    );
    observe(&mut p, &run);
    assert_eq!(p.observations.len(), 1, "{:?}", p.observations);
    assert!(
        p.observations[0].contains("preemption_other"),
        "{:?}",
        p.observations
    );
    let mut q = checked("tlb_shootdown_pv_flush", LINE);
    observe(&mut q, &guest_run(LINE));
    assert!(q.observations.is_empty(), "it skipped 3 IPIs");
}

#[test]
fn the_table_has_a_row_per_point_and_lists_skips_and_failures() {
    let one = LINE
        .replace(
            "cpus=3 targets=2 acks=0,10,7 skips=0,0,3",
            "cpus=1 targets=0 acks=0 skips=0",
        )
        .replace("preempted_skips=3", "preempted_skips=0");
    let mut a = checked(
        "tlb_shootdown",
        &one.replace("tlb_shootdown_pv_flush", "tlb_shootdown"),
    );
    a.wall_ns_per_op = 1000.0;
    let two = LINE
        .replace("acks=0,10,7 skips=0,0,3", "acks=0,10,10 skips=0,0,0")
        .replace("preempted_skips=3", "preempted_skips=0");
    let mut b = checked(
        "tlb_shootdown",
        &two.replace("tlb_shootdown_pv_flush", "tlb_shootdown"),
    );
    b.wall_ns_per_op = 4000.0;
    b.host_cpus = vec![vec![0], vec![1], vec![0, 1]];
    assert!(
        a.problems.is_empty() && b.problems.is_empty(),
        "{:?} {:?}",
        a.problems,
        b.problems
    );
    let report = report_with(vec![a, b]);
    let table = render_ipi(&report);
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("tlb_shootdown "))
        .collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[1].contains("4.0x") && rows[1].ends_with("0 | 1 | 0,1"),
        "{table}"
    );
    assert!(
        table.contains(
            "skipped: tlb_shootdown_pv_ipi/2 vCPUs/pinned: vmcall-and-vmmcall-at-CPL0-raise-#UD-here"
        ),
        "{table}"
    );
    assert!(
        table.contains("ERROR: ipi_broadcast/2 vCPUs/floating: vCPU 1 acknowledged 9"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["schema"], IPI_SCHEMA);
    assert_eq!(json["points"][1]["placement"], "floating");
    assert_eq!(json["points"][1]["acks"][2], 10);
    assert_eq!(
        json["skipped"][0]["reason"],
        "vmcall-and-vmmcall-at-CPL0-raise-#UD-here"
    );
}
