//! The ablation's structure (no timing assertions): every row present, every row ran its
//! iterations, the exits the trace saw equal them.

use super::ablation::{run_ablation, AblationPlan, EXITLESS, INGREDIENTS, RAW_RUN, REAL_LOOP};

fn kvm_missing(test: &str) -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return false;
    }
    vmm::test_skip::skip(test, "no /dev/kvm");
    true
}

#[test]
fn the_full_plan_has_the_bare_loop_each_ingredient_alone_and_cumulatively() {
    let plan = AblationPlan::full(2000, 5);
    assert_eq!(plan.per_round, 400);
    assert_eq!(plan.masks[0], 0);
    for (bit, _) in INGREDIENTS {
        assert!(plan.masks.contains(&(RAW_RUN | bit)), "{bit:#x} alone");
    }
    assert!(plan.masks.contains(&EXITLESS));
    let all = INGREDIENTS.iter().fold(0, |m, &(b, _)| m | b);
    assert!(plan.masks.contains(&all));
    // 1 bare + 8 alone (on the raw KVM_RUN) + 6 cumulative (the first two are alone rows) + 6
    // variants (exitless's own loop among them).
    assert_eq!(plan.masks.len(), 21);
    assert!(plan.masks.contains(&REAL_LOOP));
    for variant in super::ablation::VARIANTS {
        assert!(plan.masks.contains(&variant), "{variant:#x}");
    }
    assert!(plan.floor);
}

#[test]
fn every_row_runs_its_iterations_and_the_trace_sees_each_exit() {
    if kvm_missing("every_row_runs_its_iterations_and_the_trace_sees_each_exit") {
        return;
    }
    let plan = AblationPlan {
        case: super::ablation::CASES[0],
        masks: vec![
            0,
            INGREDIENTS[1].0,
            EXITLESS,
            EXITLESS | INGREDIENTS[7].0,
            super::ablation::RAW_RUN,
            EXITLESS | super::ablation::PROFILE_EVERY,
            RAW_RUN | super::ablation::TOUCH_PAGES,
            REAL_LOOP,
        ],
        floor: true,
        per_round: 30,
        rounds: 2,
    };
    let tsc_khz = vmm::profile::estimate_tsc_khz(std::time::Duration::from_millis(20));
    let report = run_ablation(&plan, tsc_khz, |_| {}).unwrap();
    // The floor is measured through tracefs only.
    let floor = usize::from(report.tracefs);
    assert_eq!(report.rows.len(), 8 + floor, "{:#?}", report.rows);
    if report.tracefs {
        assert_eq!(report.rows[1].mask, None, "the floor second");
    }
    // exitless's own loop runs until its count reaches a batch's, then is paused: at least as
    // many exits, the trace seeing each, its turnarounds through tracefs only.
    let real = report.row(REAL_LOOP).unwrap();
    assert!(real.exits >= 60, "{real:?}");
    assert_eq!(real.other_exits, 0);
    if report.tracefs {
        assert_eq!(real.exits_traced, Some(real.exits), "{real:?}");
        assert!(real.samples as u64 >= real.exits - 2, "{real:?}");
    }
    for row in report.rows.iter().filter(|r| r.mask != Some(REAL_LOOP)) {
        assert_eq!(row.exits, 60, "{}", row.name);
        assert_eq!(row.other_exits, 0, "{}", row.name);
        if report.tracefs {
            assert_eq!(row.exits_traced, Some(60), "{}", row.name);
        }
        // A row's batch's last exit pairs with the next batch's KVM_RUN: left out. The
        // floor's loop runs whole in one process: its last exit pairs too.
        let samples = if row.mask.is_some() { 58 } else { 60 };
        assert_eq!(row.samples, samples, "{}", row.name);
        assert!(row.min_ns.is_some(), "{}", row.name);
    }
    let table = report.render();
    for row in &report.rows {
        assert!(table.contains(row.name.trim_start_matches("= ")) || row.mask.is_some());
    }
    assert!(report.headline().contains("exitless's exit path"));
}
