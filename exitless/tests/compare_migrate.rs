//! `exitless compare --cases migrate` end to end: the bench guest's `case=migrate` migrated
//! at rest and while writing, exitless over unix: and local, QEMU beside it (skipped with a
//! printed reason where /dev/kvm or QEMU is missing), Cloud Hypervisor's error (or figures)
//! in its row. Structure only: no timing is asserted.

mod common;

use common::{exitless, qemu};
use exitless_lab::compare::peer::Vmm;
use exitless_lab::compare::vmm_kind::VmmKind;

#[test]
fn migrate_has_a_row_per_vmm_way_and_rate_and_every_exitless_migration_ends_on_the_destination() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("compare_migrate", "/dev/kvm is missing on this host");
        return;
    }
    let Some(qemu) = qemu("compare_migrate") else {
        return;
    };
    let qemu =
        Vmm::on_path(VmmKind::Qemu).map_or(qemu.to_string(), |v| v.path.display().to_string());
    // Cloud Hypervisor from PATH, else a program that is not one: its rows then hold the
    // error that stopped it, as they do where it cannot migrate.
    let ch = Vmm::on_path(VmmKind::CloudHypervisor)
        .map_or("/bin/false".to_string(), |v| v.path.display().to_string());
    let json =
        std::env::temp_dir().join(format!("exitless-compare-mig-{}.json", std::process::id()));
    let o = exitless()
        .arg("compare")
        .args([
            "--qemu",
            &qemu,
            "--firecracker",
            "/bin/false",
            "--cloud-hypervisor",
            &ch,
        ])
        .args(["--cases", "migrate", "--rounds", "1", "--json"])
        .arg(&json)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("exitless runs");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let rows = report["migrate"].as_array().expect("migrate rows");
    let keys: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {} {}",
                r["vmm"].as_str().unwrap(),
                r["way"].as_str().unwrap(),
                r["write_mib_s"]
            )
        })
        .collect();
    let want: Vec<String> = [0, 64]
        .iter()
        .flat_map(|rate| {
            [
                "exitless unix",
                "exitless local",
                "qemu unix",
                "cloud-hypervisor unix",
            ]
            .map(|k| format!("{k} {rate}"))
        })
        .collect();
    assert_eq!(keys, want, "{report:#}");
    for row in rows.iter().filter(|r| r["vmm"] != "cloud-hypervisor") {
        assert!(row["failed"].is_null(), "{row:#}");
        let round = &row["rounds"][0];
        assert_eq!(row["rounds"].as_array().map(Vec::len), Some(1), "{row:#}");
        assert_eq!(
            round["done_line"], true,
            "the destination printed the guest's lines: {row:#}"
        );
        assert_eq!(round["source_ended"], true, "the source is gone: {row:#}");
        assert!(round["guest_downtime_ms"].as_f64() > Some(0.0), "{row:#}");
        let writing = row["write_mib_s"] != 0;
        assert_eq!(round["written_mib"].as_u64() > Some(0), writing, "{row:#}");
        let local = row["way"] == "local";
        assert_eq!(
            round["sent_mib"].as_f64() == Some(0.0),
            local,
            "memory as fds: {row:#}"
        );
        assert!(
            row["reported_downtime_ms"]["median"].as_f64().is_some(),
            "{row:#}"
        );
    }
    for row in rows.iter().filter(|r| r["vmm"] == "cloud-hypervisor") {
        match row["failed"].as_str() {
            Some(why) => assert!(
                out.contains(&format!("cannot migrate here: {why}")) && !why.contains('\n'),
                "one line in its row: {out}"
            ),
            None => assert_eq!(row["rounds"][0]["done_line"], true, "{row:#}"),
        }
    }
    assert!(
        out.contains("guest downtime ms") && out.contains("x qemu"),
        "{out}"
    );
    let vmms = report["vmms"].as_array().unwrap();
    let fc = vmms.iter().find(|v| v["vmm"] == "firecracker").unwrap();
    assert!(
        fc["not_run"]
            .to_string()
            .contains("migrate: it cannot migrate"),
        "{fc}"
    );
}
