//! `exitless bench` from the command line: bad input gets one clear line and a non-zero exit;
//! a small run reports sane structure.

mod common;

use std::process::{Command, Output};

fn exitless(args: &[&str]) -> Output {
    common::exitless()
        .args(args)
        .output()
        .expect("exitless runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_case_is_one_clear_line() {
    let o = exitless(&["bench", "--cases", "pio_out,nope"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("Unknown case 'nope'") && e.contains("pio_out"),
        "{e}"
    );
}

#[test]
fn an_unwritable_json_path_is_refused_before_anything_runs() {
    for args in [
        &["bench", "--json", "/nonexistent/dir/out.json"][..],
        &[
            "bench",
            "--scaling",
            "2",
            "--json",
            "/nonexistent/dir/out.json",
        ][..],
    ] {
        let o = exitless(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains("--json /nonexistent/dir/out.json: cannot write there"),
            "{e}"
        );
        assert!(o.stdout.is_empty(), "nothing was measured");
    }
}

#[test]
fn zero_and_absurd_iterations_are_rejected() {
    for n in ["0", "99999999999"] {
        let o = exitless(&["bench", "--iterations", n]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains("Iterations must be between 1 and 10000000"),
            "{e}"
        );
    }
}

#[test]
fn non_numeric_iterations_are_rejected_by_the_parser() {
    let o = exitless(&["bench", "--iterations", "many"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("invalid value 'many'"));
}

#[test]
fn missing_kvm_device_is_one_clear_line() {
    let o = common::exitless()
        .args(["bench", "--cases", "cpuid"])
        .env("EXITLESS_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("does not exist"), "{e}");
}

#[test]
fn non_kvm_device_is_one_clear_line() {
    let o = common::exitless()
        .args(["bench", "--cases", "cpuid"])
        .env("EXITLESS_KVM_DEVICE", "/dev/null")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("is this a KVM device?"), "{e}");
}

#[test]
fn export_guest_writes_a_pvh_elf() {
    let path = std::env::temp_dir().join(format!("exitless-guest-{}.elf", std::process::id()));
    let o = exitless(&["bench", "--export-guest", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let elf = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(&elf[..4], b"\x7fELF");
    // The PVH note: name "Xen", type 18 (XEN_ELFNOTE_PHYS32_ENTRY).
    let note = [4u8, 0, 0, 0, 4, 0, 0, 0, 18, 0, 0, 0, b'X', b'e', b'n', 0];
    assert!(elf.windows(note.len()).any(|w| w == note));
}

#[test]
fn export_floor_writes_the_floor_vmm_that_runs() {
    let dir = std::env::temp_dir().join(format!("exitless-floor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = exitless(&["bench", "--export-floor", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let usage = std::process::Command::new(dir.join("floor"))
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(usage.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("KERNEL CMDLINE MEMORY_MIB"));
}

#[test]
fn small_run_reports_exits_that_match_iterations() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("bench_cli", "/dev/kvm is missing on this host");
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-bench-{}.json", std::process::id()));
    let o = exitless(&[
        "bench",
        "--cases",
        "pio_out,cr8",
        "--iterations",
        "300",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.starts_with("case"), "{table}");
    assert!(
        stderr(&o).contains("[1/6] pio_out/userspace"),
        "progress on stderr"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    assert_eq!(v["schema"], "exitless.bench/1");
    assert!(v["host"]["tsc_khz"].as_u64().unwrap() > 0);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    let user = |cfg: &str| {
        rows.iter()
            .find(|r| r["case"] == "pio_out" && r["config"]["name"] == cfg)
            .unwrap()["user_exits"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(user("userspace"), 300);
    assert_eq!(user("ioeventfd"), 0);
    assert!(v["failures"].as_array().unwrap().is_empty());
}

#[test]
fn kvm_without_permission_is_one_clear_line() {
    // Only root can drop to another user here; /dev/kvm must exist and be closed to others.
    let closed = std::fs::metadata("/dev/kvm")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 == 0)
        .unwrap_or(false);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !(closed && root && setpriv) {
        vmm::test_skip::skip(
            "kvm_without_permission",
            "needs root, setpriv and a /dev/kvm closed to other users",
        );
        return;
    }
    let unprivileged = || {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
        c
    };
    // The one limit of the environment: a build directory other users cannot reach. Anything
    // else that fails below is exitless's to fix, "Permission denied" included.
    let bin = common::exitless_path();
    let reachable = unprivileged()
        .args(["test", "-x"])
        .arg(&bin)
        .status()
        .is_ok_and(|s| s.success());
    if !reachable {
        vmm::test_skip::skip(
            "kvm_without_permission",
            &format!(
                "{} is not executable by an unprivileged user (a closed directory)",
                bin.display()
            ),
        );
        return;
    }
    let o = unprivileged()
        .arg(bin)
        .args(["bench", "--cases", "cpuid"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("Permission denied opening /dev/kvm"), "{e}");
}

#[test]
fn scaling_vm_counts_outside_the_range_are_one_clear_line() {
    for n in ["0", "65"] {
        let o = exitless(&["bench", "--scaling", n]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("The VM count must be between 1 and 64"), "{e}");
    }
}

#[test]
fn scaling_runs_a_row_per_placement_and_vm_count() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("bench_cli", "/dev/kvm is missing on this host");
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-scaling-{}.json", std::process::id()));
    let o = common::exitless()
        .args([
            "bench",
            "--scaling",
            "2",
            "--cases",
            "pio_out",
            "--iterations",
            "200",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    let rows = table.lines().filter(|l| l.starts_with("pio_out ")).count();
    // 4 configurations x (pinned, unpinned) x (1, 2 VMs).
    assert_eq!(rows, 16, "{table}");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).ok();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["schema"], "exitless.scaling/1");
    assert_eq!(doc["series"].as_array().unwrap().len(), 4);
}

#[test]
fn ipi_vcpu_counts_beyond_the_host_and_unknown_ipi_cases_are_one_clear_line() {
    let o = exitless(&["bench", "--ipi", "99"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("The vCPU count must be between 1 and"), "{e}");
    let o = exitless(&["bench", "--ipi", "1", "--cases", "pio_out"]);
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("Unknown IPI case 'pio_out'") && e.contains("tlb_shootdown"),
        "{e}"
    );
}

#[test]
fn the_ablation_takes_one_pio_out_case_only() {
    for cases in ["cpuid", "pio_out,pio_out_cpl0"] {
        let o = exitless(&["bench", "--ablation", "--cases", cases]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("--ablation runs one"), "{e}");
    }
}

#[test]
fn the_ablation_has_a_row_per_ingredient_each_with_its_exits() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("bench_cli", "/dev/kvm is missing on this host");
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-ablation-{}.json", std::process::id()));
    let o = common::exitless()
        .args(["bench", "--ablation", "--iterations", "100", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    for row in [
        "bare loop",
        "seccomp filter",
        "sync regs",
        "CPU pinning",
        "= exitless",
    ] {
        assert!(table.contains(row), "{row}: {table}");
    }
    assert!(table.contains("exit path (pio_out_cpl0"), "{table}");
    let text = std::fs::read_to_string(&json).unwrap();
    std::fs::remove_file(&json).ok();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    // The bare loop, 8 ingredients alone (on the raw KVM_RUN), 6 more cumulatively, 6
    // variants; the floor with tracefs.
    let floor = usize::from(doc["tracefs"] == true);
    assert_eq!(rows.len(), 21 + floor, "{doc}");
    for row in rows {
        // exitless's own vCPU loop is paused once its count reached a batch's: at least as many.
        let own_loop = row["name"]
            .as_str()
            .unwrap()
            .starts_with("exitless's own vCPU loop");
        let exits = row["exits"].as_u64().unwrap();
        assert!(exits == 100 || own_loop && exits >= 100, "{row}");
        assert_eq!(row["other_exits"], 0, "{row}");
        if floor == 1 {
            assert_eq!(row["exits_traced"], exits, "{row}");
            assert!(row["min_ns"].as_f64() > Some(0.0), "{row}");
            assert!(row["p90_ns"].as_f64() >= row["p50_ns"].as_f64(), "{row}");
        } else if !own_loop {
            assert!(row["min_ns"].as_f64() > Some(0.0), "{row}");
        }
    }
}
