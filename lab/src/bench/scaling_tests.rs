use super::*;
use crate::bench::cases::CASES;
use crate::bench::report::tests::run;

fn point_of(vms: usize, pinned: bool, rate: f64) -> ScalingPoint {
    ScalingPoint {
        vms,
        pinned,
        runs: Vec::new(),
        iterations_per_second: rate,
        efficiency: 0.0,
        overlap: 1.0,
    }
}

#[test]
fn vm_counts_outside_the_range_are_rejected() {
    assert!(check_vms(0).is_err());
    assert_eq!(check_vms(1).unwrap(), 1);
    assert_eq!(check_vms(MAX_VMS).unwrap(), MAX_VMS);
    let e = check_vms(MAX_VMS + 1).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "The VM count must be between 1 and {MAX_VMS}, got {}",
            MAX_VMS + 1
        )
    );
}

#[test]
fn overlap_is_the_intersection_over_the_union() {
    assert_eq!(overlap(&[(100, 200)]), 1.0);
    assert_eq!(overlap(&[(100, 200), (150, 250)]), 50.0 / 150.0);
    assert_eq!(overlap(&[(100, 200), (300, 400)]), 0.0);
    assert_eq!(overlap(&[]), 0.0);
}

#[test]
fn efficiency_is_against_one_vm_of_the_same_placement() {
    let points = with_efficiency(vec![
        point_of(1, true, 100.0),
        point_of(2, true, 180.0),
        point_of(1, false, 50.0),
        point_of(2, false, 100.0),
    ]);
    let eff: Vec<f64> = points.iter().map(|p| p.efficiency).collect();
    assert_eq!(eff, [1.0, 0.9, 1.0, 1.0]);
}

#[test]
fn a_point_sums_the_rates_of_its_vms() {
    let case = CASES.iter().position(|c| c.name == "pio_out").unwrap();
    let mut a = run(case, 0, 1000.0, 100);
    a.loop_host_tsc = (0, 100);
    let mut b = run(case, 0, 4000.0, 100);
    b.loop_host_tsc = (50, 150);
    let p = point(2, true, &[a, b]);
    assert_eq!(p.iterations_per_second, 1_000_000.0 + 250_000.0);
    assert_eq!(p.overlap, 50.0 / 150.0);
    assert_eq!(p.runs.len(), 2);
}

#[test]
fn the_table_has_a_row_per_point_and_lists_failures() {
    let report = ScalingReport {
        schema: SCALING_SCHEMA,
        host: crate::bench::report::tests::host(),
        iterations: 100,
        max_vms: 2,
        allowed_cpus: vec![0, 1],
        wall_seconds: 1.0,
        series: vec![ScalingSeries {
            case: "pio_out",
            config: "userspace",
            points: with_efficiency(vec![point_of(1, true, 100.0), point_of(2, true, 150.0)]),
        }],
        failures: vec![BenchFailure {
            case: "pio_out",
            config: "ioeventfd",
            error: "VM 1: broken".into(),
        }],
    };
    let table = render_scaling(&report);
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("pio_out")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[1].contains("pinned") && rows[1].contains("0.75"),
        "{table}"
    );
    assert!(
        table.contains("ERROR: pio_out/ioeventfd: VM 1: broken"),
        "{table}"
    );
    assert!(table.contains("[0,1]"), "{table}");
}
