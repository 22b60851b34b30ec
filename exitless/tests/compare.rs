//! `exitless compare` end to end: against QEMU with small iteration counts (skipped with a
//! printed reason where QEMU or /dev/kvm is missing), and bad input refused in one line.

mod common;

use std::path::Path;

use common::{exitless, qemu};
use exitless_lab::compare::peer::Vmm;
use exitless_lab::compare::vmm_kind::VmmKind;

const INSTANCES: &str = "/sys/kernel/tracing/instances";

/// A tracefs instance as a killed run leaves it (its pid never alive: pid_max is at most
/// 2^22), when tracefs can be written here.
fn stale_instance() -> Option<std::path::PathBuf> {
    let stale = Path::new(INSTANCES).join("exitless-compare-4194400");
    match std::fs::create_dir(&stale) {
        Ok(()) => Some(stale),
        Err(e) => {
            let why = format!("cannot create a tracefs instance (root, tracefs): {e}");
            vmm::test_skip::skip("compare_stale_instance", &why);
            None
        }
    }
}

/// Instances named after exitless compare runs whose process is gone.
fn instances_of_gone_runs() -> usize {
    std::fs::read_dir(INSTANCES)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|n| n.strip_prefix("exitless-compare-")?.parse::<u32>().ok())
                .filter(|pid| !Path::new(&format!("/proc/{pid}")).exists())
                .count()
        })
        .unwrap_or(0)
}

fn check_turnarounds(report: &serde_json::Value) {
    let mut all_ns = Vec::new();
    for vmm in &report["vmms"].as_array().unwrap()[..2] {
        let c = &vmm["cases"][0];
        let t = &c["turnaround_ns"];
        assert!(t["samples"].as_u64() >= Some(200), "{vmm}");
        let [min, p50, p99] = ["min", "p50", "p99"].map(|k| t[k].as_f64().unwrap());
        assert!(0.0 < min && min <= p50 && p50 <= p99, "{t}");
        all_ns.extend([min, p50, p99]);
        let exits = c["userspace_exits_per_iter"]["median"].as_f64().unwrap();
        assert!(
            (0.9..1.5).contains(&exits),
            "pio_out exits once a loop: {c}"
        );
    }
    assert!(
        all_ns.iter().any(|ns| ns % 1000.0 != 0.0),
        "ns resolution, not whole µs: {all_ns:?}"
    );
}

fn compare(args: &[&str]) -> std::process::Output {
    exitless()
        .arg("compare")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("exitless runs")
}

/// Runs compare with `args` (which name `json`), checks it succeeded, and returns the JSON
/// report it wrote (the file removed) with its stdout and stderr.
fn report_of(args: &[&str], json: &Path) -> (serde_json::Value, String, String) {
    let o = compare(args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let report = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    std::fs::remove_file(json).ok();
    (report, out.into_owned(), err.into_owned())
}

/// Exit code 1 and one stderr line holding `needle`.
fn refused(args: &[&str], needle: &str) {
    let o = compare(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

#[test]
fn bad_input_is_one_clear_line() {
    refused(&["--rounds", "0"], "--rounds must be 1 to 100, got 0");
    let plain = std::env::temp_dir().join(format!("exitless-not-a-vmm-{}", std::process::id()));
    std::fs::write(&plain, "not a program").unwrap();
    let plain_arg = plain.to_str().unwrap();
    refused(
        &["--qemu", plain_arg],
        &format!("qemu: {plain_arg} is not an executable file"),
    );
    std::fs::remove_file(&plain).ok();
    refused(
        &["--cases", "virtio_check"],
        "unknown case \"virtio_check\"",
    );
    refused(&["--iterations", "5"], "--iterations must be 10 to 1000000");
    let o = compare(&["--no-such-peer", "x"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    // clap's whole message: what is wrong first, then the usage line.
    assert!(
        err.starts_with("exitless: unexpected argument '--no-such-peer'"),
        "{err}"
    );
    assert!(err.contains("Usage: exitless compare"), "{err}");
}

#[test]
fn exitless_and_qemu_give_figures_for_every_case_and_the_json_has_them() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("compare_qemu", "/dev/kvm is missing on this host");
        return;
    }
    let Some(qemu) = qemu("compare_qemu") else {
        return;
    };
    let json = std::env::temp_dir().join(format!("exitless-compare-{}.json", std::process::id()));
    let svg = json.with_extension("svg");
    let font = Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists();
    let qemu_path = Vmm::on_path(VmmKind::Qemu)
        .map(|v| v.path.display().to_string())
        .unwrap_or_else(|| qemu.to_string());
    let mut args = vec![
        "--qemu",
        &qemu_path,
        "--firecracker",
        "/bin/false",
        "--cases",
        "pio_out,cpuid,virtio_blk_qd1,virtio_blk_qd32",
        "--iterations",
        "200",
        "--rounds",
        "1",
        "--json",
        json.to_str().unwrap(),
    ];
    if font {
        args.extend(["--chart", svg.to_str().unwrap()]);
    } else {
        vmm::test_skip::skip(
            "compare_chart",
            "no DejaVu font (apt-get install fonts-dejavu-core)",
        );
    }
    let stale = stale_instance();
    let (report, out, err) = report_of(&args, &json);
    assert_eq!(report["schema"], "exitless.compare/2");
    assert_eq!(report["iterations"], serde_json::json!([40, 200]));
    let names: Vec<&str> = report["vmms"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["vmm"].as_str())
        .collect();
    assert_eq!(names[..2], ["exitless", "qemu"], "{report:#}");
    // A peer that cannot boot the guest (here /bin/false) is left out with its reason.
    let firecracker = &report["vmms"][2];
    assert_eq!(firecracker["vmm"], "firecracker");
    assert!(
        firecracker["failed"]
            .as_str()
            .is_some_and(|r| r.contains("ended")),
        "{firecracker}"
    );
    for vmm in &report["vmms"].as_array().unwrap()[..2] {
        assert!(vmm["failed"].is_null(), "{vmm}");
        let cases: Vec<&str> = vmm["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["case"].as_str())
            .collect();
        assert_eq!(
            cases,
            ["pio_out", "cpuid", "virtio_blk_qd1", "virtio_blk_qd32"],
            "{vmm}"
        );
        for c in vmm["cases"].as_array().unwrap() {
            for key in [
                "first_line_ms",
                "done_ms",
                "guest_cycles_per_iter",
                "peak_rss_kib",
            ] {
                assert!(c[key]["median"].as_f64() > Some(0.0), "{key}: {c}");
            }
            // With so few iterations start-up noise can exceed the loop; only the shape here.
            assert!(c["wall_per_iter_us"]["median"].is_f64(), "{c}");
            assert!(c.get("wall_ratio_to_exitless").is_some(), "{c}");
            assert!(c["iters_per_s"]["median"].as_f64() > Some(0.0), "{c}");
            assert!(c["threads_cpu_per_iter_us"]["median"].is_f64(), "{c}");
            for key in ["userspace_exits_per_iter", "kernel_exits_per_iter"] {
                assert!(c.get(key).is_some(), "{key}: {c}");
            }
        }
    }
    // The turnaround column: every loop exit of pio_out is a userspace exit, each paired
    // with the next KVM_RUN on its thread, in ns (the x86-tsc trace clock, not µs).
    if report["turnaround"] == "measured" {
        check_turnarounds(&report);
        assert!(report["tsc_khz"].as_u64() > Some(0), "{report}");
    } else {
        let why = report["turnaround"].as_str().unwrap_or("?");
        vmm::test_skip::skip("compare_turnaround", why);
    }
    if let Some(stale) = stale {
        assert!(!stale.exists(), "a killed run's instance is removed");
        assert_eq!(
            instances_of_gone_runs(),
            0,
            "the run's own instance is removed"
        );
    }
    assert!(
        out.contains("requests/s") && out.contains("virtio_blk_qd32"),
        "{out}"
    );
    assert!(out.contains("pio_out") && out.contains("qemu"), "{out}");
    if font {
        let drawn = std::fs::read_to_string(&svg).expect("the chart is written");
        std::fs::remove_file(&svg).ok();
        assert!(
            drawn.starts_with("<svg") || drawn.contains("<svg"),
            "not an SVG"
        );
        for label in ["exitless", "qemu", "pio_out", "wall µs per iteration"] {
            assert!(drawn.contains(label), "the chart lacks {label:?}");
        }
    }
    assert!(
        err.contains("[compare] round 1/1"),
        "progress on stderr: {err}"
    );
}

/// Why the devices case cannot run here (said as a skip), if it cannot.
fn devices_case_missing() -> Option<&'static str> {
    // SAFETY: geteuid reads the caller's id; no memory is involved.
    let root = unsafe { libc::geteuid() } == 0;
    if std::fs::metadata("/dev/kvm").is_err() {
        Some("/dev/kvm is missing on this host")
    } else if !root {
        Some("the devices case's tap in a network namespace needs root")
    } else if !Path::new("/dev/net/tun").exists() {
        Some("/dev/net/tun is missing on this host")
    } else {
        None
    }
}

/// exitless always; Firecracker beside it where it is installed (its half is reported skipped
/// where it is not: it is built from its public source, as its README says).
#[test]
fn the_devices_case_runs_exitless_and_firecracker_and_gives_private_dirty_memory() {
    if let Some(why) = devices_case_missing() {
        vmm::test_skip::skip("compare_devices", why);
        return;
    }
    let firecracker = Vmm::on_path(VmmKind::Firecracker).map(|v| v.path.display().to_string());
    if firecracker.is_none() {
        vmm::test_skip::skip(
            "compare_devices_firecracker",
            "firecracker is not on PATH (build it from its public source, as its README says); exitless's half ran",
        );
    }
    let json =
        std::env::temp_dir().join(format!("exitless-compare-dev-{}.json", std::process::id()));
    // The other peers are named as programs that cannot boot anything, so they are left out
    // after one attempt.
    let (report, out, err) = report_of(
        &[
            "--qemu",
            "/bin/false",
            "--cloud-hypervisor",
            "/bin/false",
            "--firecracker",
            firecracker.as_deref().unwrap_or("/bin/false"),
            "--cases",
            "pio_out,pio_out_devices",
            "--iterations",
            "50",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &json,
    );
    assert_eq!(report["not_run"], serde_json::json!([]), "{report:#}");
    let names: &[&str] = if firecracker.is_some() {
        &["exitless", "firecracker"]
    } else {
        &["exitless"]
    };
    for name in names {
        let vmm = report["vmms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["vmm"] == *name)
            .unwrap_or_else(|| panic!("{name} in {report:#}"));
        assert!(vmm["failed"].is_null(), "{vmm}");
        assert_eq!(vmm["left_out"], serde_json::json!([]), "{vmm}");
        let cases = vmm["cases"].as_array().unwrap();
        let names: Vec<&str> = cases.iter().filter_map(|c| c["case"].as_str()).collect();
        assert_eq!(names, ["pio_out", "pio_out_devices"], "{vmm}");
        for c in cases {
            let peak = c["peak_rss_kib"]["median"].as_f64().unwrap();
            let dirty = c["private_dirty_kib"]["median"].as_f64().unwrap();
            assert!(0.0 < dirty && dirty <= peak, "{name}: {c}");
            assert!(c["first_line_ms"]["median"].as_f64() > Some(0.0), "{c}");
        }
    }
    assert!(out.contains("priv dirty kB"), "{out}");
    assert!(
        !out.contains("requests/s"),
        "attached devices are not driven: {out}"
    );
    if firecracker.is_some() {
        assert!(
            !err.contains("firecracker: pio_out"),
            "firecracker is not left out: {err}"
        );
    }
}

/// Every case the floor VMM can run (no devices) gives the guest the same exits as under
/// exitless, and every VMM's first line is a ratio to the floor's.
#[test]
fn the_floor_runs_every_case_it_can_with_exitless_s_exits_per_loop() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("compare_floor", "/dev/kvm is missing on this host");
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-floor-{}.json", std::process::id()));
    let cases = "pio_out,pio_in,mmio_write,mmio_read,pio_out_cpl0,cpuid,msr_read,msr_write";
    let (report, out, _) = report_of(
        &[
            "--qemu",
            "/bin/false",
            "--firecracker",
            "/bin/false",
            "--cloud-hypervisor",
            "/bin/false",
            "--cases",
            cases,
            "--iterations",
            "100",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &json,
    );
    let vmm = |name: &str| {
        let all = report["vmms"].as_array().unwrap();
        all.iter().find(|v| v["vmm"] == name).unwrap().clone()
    };
    let (exitless, floor) = (vmm("exitless"), vmm("floor"));
    assert!(floor["failed"].is_null(), "{floor}");
    assert_eq!(floor["cases"].as_array().unwrap().len(), 8, "{floor}");
    assert!(out.contains("x floor"), "{out}");
    let traced = report["turnaround"] == "measured";
    if !traced {
        let why = report["turnaround"].as_str().unwrap_or("?");
        vmm::test_skip::skip("compare_floor_exits", why);
    }
    for (e, f) in exitless["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(floor["cases"].as_array().unwrap())
    {
        assert_eq!(e["case"], f["case"]);
        assert_eq!(f["first_line_ratio_to_floor"], 1.0, "{f}");
        assert!(e["first_line_ratio_to_floor"].as_f64() > Some(0.0), "{e}");
        assert!(f["peak_rss_kib"]["median"].as_f64() > Some(0.0), "{f}");
        if traced {
            let ratio = &f["turnaround_ratio_to_floor"];
            assert_eq!(ratio, &serde_json::json!([1.0, 1.0]), "{f}");
            assert!(
                e["turnaround_ratio_to_floor"][0].as_f64() > Some(0.0),
                "{e}"
            );
            let exits = |c: &serde_json::Value| c["userspace_exits_per_iter"]["median"].as_f64();
            let (ee, fe) = (exits(e).unwrap(), exits(f).unwrap());
            assert!(
                (ee - fe).abs() < 0.05,
                "{}: exitless {ee}, floor {fe}",
                e["case"]
            );
        }
    }
}

/// `--density 2` with exitless and the floor (the peers named as programs that cannot boot
/// anything are said to have failed): every field there and sane, every process and file
/// gone afterwards. No timing is asserted.
#[test]
fn density_starts_n_vms_of_each_vmm_and_gives_every_figure() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("compare_density", "/dev/kvm is missing on this host");
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-density-{}.json", std::process::id()));
    let child = exitless()
        .args(["compare", "--density", "2", "--idle", "1", "--memory", "64"])
        .args(["--qemu", "/bin/false", "--firecracker", "/bin/false"])
        .args(["--cloud-hypervisor", "/bin/false", "--json"])
        .arg(&json)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let workdir = format!("/tmp/exitless-compare-{}", child.id());
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    assert_eq!(report["schema"], "exitless.density/1");
    assert_eq!(report["memory_mib"], 64);
    let run = |name: &str| {
        let runs = report["runs"].as_array().unwrap();
        runs.iter().find(|r| r["vmm"] == name).unwrap().clone()
    };
    for (name, via) in [("exitless", "api"), ("floor", "command line")] {
        let r = run(name);
        assert!(r["failed"].is_null(), "{r}");
        assert_eq!(
            (r["n"].as_u64(), r["started_through"].as_str()),
            (Some(2), Some(via))
        );
        assert!(r["all_started_ms"].as_f64() > Some(0.0), "{r}");
        for key in [
            "start_ms",
            "start_cpu_ms",
            "private_dirty_kib",
            "peak_rss_kib",
            "pss_kib",
        ] {
            let v: Vec<f64> = r[key]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|x| x.as_f64())
                .collect();
            assert!(v.len() == 2 && v.iter().all(|x| *x > 0.0), "{key}: {r}");
        }
        for key in ["idle_cpu_us_per_s", "idle_wakeups_per_s"] {
            let v: Vec<f64> = r[key]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|x| x.as_f64())
                .collect();
            assert!(v.len() == 2 && v.iter().all(|x| *x >= 0.0), "{key}: {r}");
        }
        let s = &r["summary"];
        assert!(s["private_dirty_kib"]["median"].as_f64() <= s["peak_rss_kib"]["median"].as_f64());
        assert!(
            s["nth_over_first"]["private_dirty"].as_f64() > Some(0.0),
            "{s}"
        );
    }
    let qemu = run("qemu");
    assert!(qemu["failed"].as_str().is_some(), "{qemu}");
    assert!(
        out.contains("goals (exitless)") && out.contains("all up ms"),
        "{out}"
    );
    assert!(!Path::new(&workdir).exists(), "{workdir} removed");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|p| std::fs::read(p.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&workdir))
        .collect();
    assert!(left.is_empty(), "processes left running: {left:?}");
}

/// The virtio-fs cases: exitless and Cloud Hypervisor (when installed) each read through a
/// virtiofsd of their own on shared memory; every figure is there, virtiofsd's CPU per
/// request included, and a request makes no userspace exit under exitless.
#[test]
fn the_fs_cases_give_each_vmm_its_own_virtiofsd_and_count_its_cpu() {
    if let Err(why) = exitless_lab::bench::fs::daemon() {
        vmm::test_skip::skip("compare_fs", &why);
        return;
    }
    let Some(out) = back_end_cases("compare_fs", ["virtio_fs_qd1", "virtio_fs_qd32"]) else {
        return;
    };
    assert!(
        out.contains("firecracker: not run: virtio_fs_qd1"),
        "Firecracker has no virtio-fs: {out}"
    );
}

/// The vhost-user-blk cases: exitless and Cloud Hypervisor (when installed) each drive a
/// vhost-user disk on a qemu-storage-daemon of their own exporting the same image; the
/// daemon's CPU per request is there, and a request makes no userspace exit under exitless
/// (counted: the guest's console lines are the only ones).
#[test]
fn the_vhost_user_blk_cases_give_each_vmm_its_own_daemon_and_count_its_cpu() {
    if vmm::devices::virtio::vhost_user_device::storage_daemon::find().is_none() {
        let why = "qemu-storage-daemon is not installed (apt-get install qemu-system-common)";
        vmm::test_skip::skip("compare_vhost_user_blk", why);
        return;
    }
    let cases = ["vhost_user_blk_qd1", "vhost_user_blk_qd32"];
    let Some(out) = back_end_cases("compare_vhost_user_blk", cases) else {
        return;
    };
    assert!(
        out.contains("firecracker: not run: vhost_user_blk_qd1"),
        "Firecracker's vhost-user-blk is virtio-mmio only: {out}"
    );
}

/// Runs `cases` (each with a vhost-user back end of the VMM's own) for exitless and Cloud
/// Hypervisor when it is on PATH, and checks every VMM's figures: requests per second, the
/// back end's CPU, no userspace exit per request under exitless. Returns the printed table
/// (None without /dev/kvm: the test skipped).
fn back_end_cases(test: &str, cases: [&str; 2]) -> Option<String> {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
        return None;
    }
    let ch = Vmm::on_path(VmmKind::CloudHypervisor).map(|v| v.path.display().to_string());
    if ch.is_none() {
        let skip = format!("{test}_cloud_hypervisor");
        vmm::test_skip::skip(
            &skip,
            "cloud-hypervisor is not on PATH; exitless's half ran",
        );
    }
    let json = std::env::temp_dir().join(format!("exitless-{test}-{}.json", std::process::id()));
    let (report, out, _) = report_of(
        &[
            "--qemu",
            "/bin/false",
            "--firecracker",
            "/bin/false",
            "--cloud-hypervisor",
            ch.as_deref().unwrap_or("/bin/false"),
            "--cases",
            &cases.join(","),
            "--iterations",
            "500",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &json,
    );
    assert_eq!(report["not_run"], serde_json::json!([]), "{report:#}");
    let names: &[&str] = match ch {
        Some(_) => &["exitless", "cloud-hypervisor"],
        None => &["exitless"],
    };
    for name in names {
        let vmm = report["vmms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["vmm"] == *name)
            .unwrap_or_else(|| panic!("{name} in {report:#}"));
        assert!(vmm["failed"].is_null(), "{vmm}");
        let figures = vmm["cases"].as_array().unwrap();
        let found: Vec<&str> = figures.iter().filter_map(|c| c["case"].as_str()).collect();
        assert_eq!(found, cases, "{vmm}");
        for c in figures {
            assert!(c["iters_per_s"]["median"].as_f64() > Some(0.0), "{c}");
            // Measured for each VMM's own back end. Not its sign: with 500 iterations in one
            // round, a difference of two runs' CPU is within a loaded host's noise (one run
            // here gave -2.6 us while the first run's virtiofsd start cost more).
            let backend = c["backend_cpu_per_iter_us"]["median"].as_f64();
            assert!(
                backend.is_some_and(f64::is_finite),
                "the back end's CPU measured: {c}"
            );
            // The guest's console lines are the only userspace exits: far below 1 a request.
            let exits = c["userspace_exits_per_iter"]["median"].as_f64();
            if *name == "exitless" && exits.is_some() {
                assert!(exits < Some(0.1), "{c}");
            }
        }
    }
    assert!(out.contains("back end us/req"), "{out}");
    Some(out)
}

/// The snapshot case: exitless, Firecracker and Cloud Hypervisor each boot the guest through
/// their API, pause, snapshot and restore it in fresh processes; a VMM that cannot snapshot
/// here keeps its row with the error it answered (Cloud Hypervisor on a PVM host), QEMU and
/// the floor say why they sit it out.
#[test]
fn the_snapshot_case_has_a_row_per_vmm_that_snapshots_and_a_peer_s_error_in_its_row() {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip("compare_snapshot", "/dev/kvm is missing on this host");
        return;
    }
    let on_path = |kind| Vmm::on_path(kind).map(|v| v.path.display().to_string());
    let (Some(firecracker), Some(cloud_hypervisor)) = (
        on_path(VmmKind::Firecracker),
        on_path(VmmKind::CloudHypervisor),
    ) else {
        let why = "firecracker or cloud-hypervisor is not on PATH (build them from their public sources, as their READMEs say)";
        vmm::test_skip::skip("compare_snapshot", why);
        return;
    };
    let json =
        std::env::temp_dir().join(format!("exitless-compare-snap-{}.json", std::process::id()));
    let (report, out, _) = report_of(
        &[
            "--qemu",
            "/bin/false",
            "--firecracker",
            &firecracker,
            "--cloud-hypervisor",
            &cloud_hypervisor,
            "--cases",
            "snapshot",
            "--rounds",
            "1",
            "--json",
            json.to_str().unwrap(),
        ],
        &json,
    );
    let rows = report["snapshot"].as_array().expect("snapshot rows");
    let names: Vec<&str> = rows.iter().filter_map(|r| r["vmm"].as_str()).collect();
    assert_eq!(
        names,
        ["exitless", "firecracker", "cloud-hypervisor"],
        "{report:#}"
    );
    let bytes = |r: &serde_json::Value| r["snapshot_bytes"]["median"].as_f64().unwrap();
    for row in &rows[..2] {
        assert!(row["failed"].is_null(), "{row}");
        assert_eq!(row["rounds"].as_array().map(Vec::len), Some(1), "{row}");
        for figure in ["create_ms", "restore_resume_ms", "spawn_to_line_ms"] {
            assert!(
                row[figure]["median"].as_f64() > Some(0.0),
                "{figure}: {row}"
            );
        }
        let clones = &row["rounds"][0]["clone_private_dirty_kib"];
        assert_eq!(clones.as_array().map(Vec::len), Some(3), "{row}");
        assert!(
            row["private_dirty_kib"]["min"].as_f64() > Some(0.0),
            "{row}"
        );
    }
    // exitless writes the pages the guest touched, Firecracker's Full snapshot all of RAM.
    assert!(bytes(&rows[0]) < 64.0 * 1048576.0, "{:#}", rows[0]);
    assert!(bytes(&rows[1]) >= 512.0 * 1048576.0, "{:#}", rows[1]);
    let ch = &rows[2];
    match ch["failed"].as_str() {
        Some(error) => {
            assert!(error.starts_with("vm."), "the request that failed: {error}");
            assert!(
                out.contains(&format!("cannot snapshot here: {error}")),
                "{out}"
            );
            if Path::new("/sys/module/kvm_pvm").exists() {
                assert!(error.contains("GetNestedState"), "{error}");
            }
        }
        None => assert!(
            ch["restore_resume_ms"]["median"].as_f64() > Some(0.0),
            "{ch}"
        ),
    }
    let not_run = |name: &str| {
        let vmms = report["vmms"].as_array().unwrap();
        let v = vmms.iter().find(|v| v["vmm"] == name).unwrap();
        v["not_run"].to_string()
    };
    assert!(not_run("qemu").contains("snapshot: "), "{report:#}");
    assert!(
        not_run("floor").contains("snapshot: it has no snapshot"),
        "{report:#}"
    );
}
