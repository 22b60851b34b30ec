//! `exitless run` end to end: bad input gives one clear line, and a real kernel (the Debian
//! cloud vmlinux from scripts/fetch-guest.sh) gets as far as printing its banner, command line
//! and the E820 map exitless built.
//!
//! Tests that need /dev/kvm or guest/vmlinux print why they skip when either is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{private_tap, Image, Stream};

const MIB: u64 = 1 << 20;

fn exitless() -> Command {
    run_with(&common::exitless_path())
}

/// `run` of build `bin`.
fn run_with(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("run").stdin(Stdio::null());
    cmd
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn vmlinux() -> PathBuf {
    root().join("guest/vmlinux")
}

fn have_kvm(test: &str) -> bool {
    let ok = Path::new("/dev/kvm").exists();
    if !ok {
        vmm::test_skip::skip(test, "/dev/kvm is missing");
    }
    ok
}

fn have_vmlinux(test: &str) -> bool {
    let ok = vmlinux().exists();
    if !ok {
        vmm::test_skip::skip(
            test,
            "guest/vmlinux is missing (run scripts/fetch-guest.sh)",
        );
    }
    ok
}

/// Runs `exitless run ARGS`; asserts it failed with exit code 1 and one line on stderr that
/// contains every one of `needles`.
fn assert_one_line_error(args: &[&str], needles: &[&str]) {
    let out: Output = exitless().args(args).output().expect("exitless runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: want one line, got: {stderr}");
    assert!(lines[0].starts_with("exitless: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{args:?}: {n:?} not in {stderr}");
    }
}

#[test]
fn missing_kernel_file() {
    assert_one_line_error(
        &["--kernel", "/nonexistent/exitless/vmlinux"],
        &["Cannot read kernel", "/nonexistent/exitless/vmlinux"],
    );
}

#[test]
fn no_kernel_given() {
    assert_one_line_error(&[], &["No kernel given"]);
}

#[test]
fn file_that_is_not_a_kernel() {
    if !have_kvm("file_that_is_not_a_kernel") {
        return;
    }
    let path = std::env::temp_dir().join(format!("exitless-not-a-kernel-{}", std::process::id()));
    std::fs::write(&path, "#!/bin/sh\necho not a kernel\n").unwrap();
    let p = path.to_str().unwrap();
    assert_one_line_error(
        &["--kernel", p],
        &["neither a bzImage nor an ELF vmlinux", p],
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn memory_too_small_for_the_kernel() {
    if !have_kvm("memory_too_small_for_the_kernel") || !have_vmlinux("memory_too_small") {
        return;
    }
    let k = vmlinux();
    let k = k.to_str().unwrap();
    assert_one_line_error(
        &["--kernel", k, "--memory", "16M"],
        &["Memory too small", "16M"],
    );
}

#[test]
fn truncated_kernels_are_called_truncated() {
    if !have_kvm("truncated_kernels") || !have_vmlinux("truncated_kernels") {
        return;
    }
    for (name, keep) in [("vmlinux", 20 << 20), ("bzImage", 5 << 20)] {
        let whole = std::fs::read(root().join("guest").join(name)).unwrap();
        let path = std::env::temp_dir().join(format!("exitless-cut-{name}-{}", std::process::id()));
        std::fs::write(&path, &whole[..keep]).unwrap();
        let p = path.to_str().unwrap();
        for memory in ["512M", "2G"] {
            assert_one_line_error(
                &["--kernel", p, "--memory", memory],
                &["is truncated or invalid", &format!("the file has {keep}")],
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn memory_below_minimum() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--memory", "8M"],
        &["--memory 8M is below the minimum of 16M"],
    );
}

#[test]
fn an_unwritable_profile_path_is_refused_before_the_vm_starts() {
    assert_one_line_error(
        &[
            "--kernel",
            "Cargo.toml",
            "--profile-json",
            "/nonexistent/dir/p.json",
        ],
        &["--profile-json /nonexistent/dir/p.json: cannot write there"],
    );
}

#[test]
fn zero_cpus() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--cpus", "0"],
        &["--cpus must be at least 1"],
    );
}

#[test]
fn more_cpus_than_exitless_allows() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--cpus", "255"],
        &[
            "--cpus 255 is more than the",
            "(254 at most, the xAPIC ID limit",
        ],
    );
}

#[test]
fn more_cpus_than_kvm_allows() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--cpus", "9999"],
        &[
            "--cpus 9999 is more than the",
            "vCPUs possible here (254 at most",
        ],
    );
}

#[test]
fn unparsable_memory_size() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--memory", "abc"],
        &["Invalid memory size 'abc'"],
    );
}

#[test]
fn unparsable_timeout() {
    assert_one_line_error(
        &["--kernel", "Cargo.toml", "--timeout", "0"],
        &["--timeout must be a positive number of seconds"],
    );
}

#[test]
fn config_file_values_are_validated() {
    let path = std::env::temp_dir().join(format!("exitless-config-{}.json", std::process::id()));
    // A Cloud Hypervisor VmConfig, as vm.create takes it.
    let body =
        r#"{"payload": {"kernel": "Cargo.toml"}, "cpus": {"boot_vcpus": 0, "max_vcpus": 1}}"#;
    std::fs::write(&path, body).unwrap();
    let p = path.to_str().unwrap();
    assert_one_line_error(&["--config", p], &["--cpus must be at least 1"]);
    // The command line overrides the file.
    assert_one_line_error(
        &["--config", p, "--cpus", "1", "--memory", "abc"],
        &["Invalid memory size 'abc'"],
    );
    // exitless's own config (vmm::config::VmConfig) is not what --config takes.
    std::fs::write(&path, r#"{"kernel": "Cargo.toml", "cpus": 0}"#).unwrap();
    assert_one_line_error(&["--config", p], &["not a Cloud Hypervisor VmConfig"]);
    let _ = std::fs::remove_file(&path);
    assert_one_line_error(&["--config", p], &["Cannot read config file", p]);
    let out = exitless().args(["--config", p]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("No such file").count(), 1, "{stderr}");
}

#[test]
fn timeout_stops_the_vm_with_code_124_and_writes_the_profile() {
    if !have_kvm("timeout_stops_the_vm") || !have_vmlinux("timeout_stops_the_vm") {
        return;
    }
    let json = std::env::temp_dir().join(format!("exitless-timeout-{}.json", std::process::id()));
    let start = Instant::now();
    let out = exitless()
        .arg("--kernel")
        .arg(vmlinux())
        .args(["--memory", "256M", "--timeout", "2", "--profile-json"])
        .arg(&json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("timeout reached"), "{stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let text = std::fs::read_to_string(&json).expect("profile JSON written");
    let _ = std::fs::remove_file(&json);
    let profile: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(profile["schema"], "exitless.profile/1");
}

#[test]
fn help_states_every_default() {
    let out = common::exitless().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--kernel",
        "--initrd",
        "--cmdline",
        "--cpus",
        "--memory",
        "--config",
        "--serial-log",
        "--irqchip",
        "--cpu-affinity",
        "--profile",
        "--profile-json",
        "--profile-per-vcpu",
        "--profile-interval",
        "--timeout",
        "--fs",
    ] {
        let at = help
            .match_indices(opt)
            .map(|(at, _)| at)
            .find(|&at| {
                let next = help[at + opt.len()..].chars().next();
                !matches!(next, Some(c) if c == '-' || c.is_alphanumeric())
            })
            .unwrap_or_else(|| panic!("{opt} not in {help}"));
        let rest = &help[at..];
        let end = rest[2..].find("\n  -").map_or(rest.len(), |e| e + 2);
        assert!(rest[..end].contains("[default:"), "{opt}: {}", &rest[..end]);
    }
}

/// Reads the child's stdout until every one of `wanted` has appeared (returns the time that
/// took) or `limit` passes (panics with what was seen). The caller keeps `stdout` and reads it
/// to its end after stopping the child.
fn wait_for_lines(stdout: &mut Stream, wanted: &[String], limit: Duration) -> Duration {
    let start = Instant::now();
    if !stdout.wait_for(limit, |text| {
        wanted.iter().all(|w| text.contains(w.as_str()))
    }) {
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|w| !stdout.text.contains(w.as_str()))
            .collect();
        panic!(
            "after {:?}, still missing {missing:#?}\nconsole:\n{}",
            start.elapsed(),
            stdout.text
        );
    }
    start.elapsed()
}

/// Waits for the child to end by itself; returns its exit code (panics after `limit`).
fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("exitless did not end within {limit:?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Sends SIGTERM (a clean stop) and waits for the child; returns its exit code. The caller
/// keeps draining the child's output meanwhile (a [`Stream`] does).
fn stop(child: &mut Child) -> Option<i32> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    wait_for_exit(child, Duration::from_secs(30))
}

fn expected_console(cmdline: &str) -> Vec<String> {
    let mut lines = vec![
        "Linux version".to_string(),
        format!("Command line: {cmdline}"),
    ];
    lines.extend(
        vmm::boot::e820_map(256 * MIB)
            .iter()
            .map(vmm::boot::e820::linux_log_line),
    );
    lines
}

/// Boots guest/vmlinux with `cpus` vCPUs until the kernel printed its banner, command line
/// and E820 map, then stops it and returns the profile JSON.
fn boot_until_e820(test: &str, cpus: &str) -> Option<serde_json::Value> {
    boot_until(test, cpus, &[])
}

/// Like [`boot_until_e820`], also waiting for lines containing each of `extra`.
fn boot_until(test: &str, cpus: &str, extra: &[&str]) -> Option<serde_json::Value> {
    boot_with(test, cpus, &[], extra)
}

/// Like [`boot_until`], with `args` added to the exitless command line (devices).
fn boot_with(test: &str, cpus: &str, args: &[String], extra: &[&str]) -> Option<serde_json::Value> {
    boot_with_build(&common::exitless_path(), test, cpus, args, extra)
}

/// [`boot_with`] with build `bin`.
fn boot_with_build(
    bin: &Path,
    test: &str,
    cpus: &str,
    args: &[String],
    extra: &[&str],
) -> Option<serde_json::Value> {
    if !have_kvm(test) || !have_vmlinux(test) {
        return None;
    }
    let cmdline = format!(
        "exitless-{test}-{} console=ttyS0 earlyprintk=serial,ttyS0 panic=-1",
        std::process::id()
    );
    let json = std::env::temp_dir().join(format!("exitless-{test}-{}.json", std::process::id()));
    let initrd = root().join("guest/initramfs.cpio.gz");
    let mut cmd = run_with(bin);
    cmd.arg("--kernel").arg(vmlinux());
    if initrd.exists() {
        cmd.arg("--initrd").arg(&initrd);
    }
    cmd.args(["--memory", "256M", "--cpus", cpus, "--cmdline", &cmdline])
        // Generous: a loaded 2-core host stretches the emulated early boot several times over;
        // a passing run takes its own time, not this.
        .args(["--timeout", "300", "--profile-json"])
        .arg(&json)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("exitless starts");
    let mut errs = Stream::spawn(child.stderr.take().unwrap());
    let mut console = Stream::spawn(child.stdout.take().unwrap());
    let mut wanted = expected_console(&cmdline);
    wanted.extend(extra.iter().map(|line| line.to_string()));
    let took = wait_for_lines(&mut console, &wanted, Duration::from_secs(90));
    eprintln!("{test}: banner, command line, E820 map and {extra:?} after {took:?}");
    // The exit code this host must give: a PVM host cannot run the kernel past early boot
    // (its emulator fails on kernel code: KVM failure, 4, said in the PVM's terms); a real KVM
    // host runs on until SIGTERM stops it cleanly (130).
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    let code = if pvm {
        wait_for_exit(&mut child, Duration::from_secs(330))
    } else {
        stop(&mut child)
    };
    console.read_to_end(Duration::from_secs(30));
    errs.read_to_end(Duration::from_secs(30));
    let stderr = errs.text;
    if pvm {
        assert_eq!(code, Some(4), "{stderr}");
        assert!(stderr.contains("this host's KVM is PVM"), "{stderr}");
    } else {
        assert_eq!(code, Some(130), "{stderr}");
    }
    let text = std::fs::read_to_string(&json).expect("profile JSON written");
    let _ = std::fs::remove_file(&json);
    Some(serde_json::from_str(&text).expect("profile JSON parses"))
}

fn reason_count(vcpu: &serde_json::Value, reason: &str) -> u64 {
    vcpu["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["reason"] == reason)
        .and_then(|r| r["count"].as_u64())
        .unwrap_or(0)
}

#[test]
fn boots_linux_to_its_e820_map_and_profiles_the_console() {
    for bin in common::builds() {
        let Some(profile) = boot_with_build(&bin, "boot1", "1", &[], &[]) else {
            return;
        };
        assert_eq!(profile["schema"], "exitless.profile/1");
        let vcpu0 = &profile["vcpus"][0];
        assert_eq!(vcpu0["id"], 0);
        assert!(reason_count(vcpu0, "IO_OUT") > 0, "{vcpu0:#}");
    }
}

/// Only that a two-vCPU VM starts and its boot vCPU gets as far: the kernel brings up the
/// APs much later than this host can run it.
#[test]
fn two_vcpus_boot_to_the_e820_map() {
    let Some(profile) = boot_until_e820("boot2", "2") else {
        return;
    };
    assert_eq!(profile["vcpus"].as_array().map(Vec::len), Some(2));
    assert!(reason_count(&profile["vcpus"][0], "IO_OUT") > 0);
}

/// The kernel (built without MP table support) finds both vCPUs in the ACPI MADT. Only the
/// boot vCPU's view: the APs come up later than this host can run the kernel.
#[test]
fn two_vcpus_are_listed_by_the_acpi_madt() {
    let found = boot_until(
        "acpi2",
        "2",
        &[
            "ACPI: RSDP 0x00000000000E0000",
            "ACPI: XSDT ",
            "ACPI: APIC ",
            "ACPI: Using ACPI (MADT) for SMP configuration information",
            "smpboot: Allowing 2 CPUs",
        ],
    );
    if let Some(profile) = found {
        assert_eq!(profile["vcpus"].as_array().map(Vec::len), Some(2));
    }
}

/// With a disk and an rng attached, the kernel finds the PCI platform exitless describes: the
/// DSDT with the host bridge, the MCFG table, and the ECAM window reserved in its memory map.
/// (Early boot gets this far on a PVM host too.)
#[test]
fn with_devices_the_kernel_finds_the_dsdt_mcfg_and_the_reserved_ecam() {
    let image = Image::new("acpi-pci", 16);
    let args = [
        "--disk".to_string(),
        image.disk_arg(false),
        "--rng".to_string(),
    ];
    boot_with(
        "acpi_pci",
        "1",
        &args,
        &[
            "ACPI: DSDT ",
            "ACPI: MCFG ",
            "BIOS-e820: [mem 0x00000000e0000000-0x00000000e00fffff] reserved",
        ],
    );
}

/// Debian's kernel loads virtio-pci, virtio-blk and virtio-rng from the initramfs and its
/// /init reports the disk and the hwrng it found. Needs a host whose KVM runs a full boot.
#[test]
fn linux_sees_the_virtio_disk_hwrng_network_card_and_vsock() {
    let test = "linux_virtio_devices";
    if !have_kvm(test) || !have_vmlinux(test) {
        return;
    }
    if Path::new("/sys/module/kvm_pvm").exists() {
        vmm::test_skip::skip(
            test,
            "this host's KVM is PVM: a stock Linux stops in early boot, before it loads modules",
        );
        return;
    }
    let initrd = root().join("guest/initramfs.cpio.gz");
    if !initrd.exists() {
        vmm::test_skip::skip(
            test,
            "guest/initramfs.cpio.gz is missing (run scripts/fetch-guest.sh)",
        );
        return;
    }
    let image = Image::new(test, 16);
    let vsock = std::env::temp_dir().join(format!("{test}-{}.sock", std::process::id()));
    let mut cmd = exitless();
    cmd.arg("--kernel")
        .arg(vmlinux())
        .arg("--initrd")
        .arg(&initrd)
        .args(["--memory", "512M", "--cmdline", "console=ttyS0 panic=-1"])
        .args([
            "--disk",
            &image.disk_arg(false),
            "--rng",
            "--timeout",
            "300",
        ])
        .arg("--vsock")
        .arg(format!("cid=3,socket={}", vsock.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The network card needs a tap: in a network namespace of the test's own, as root.
    let net = private_tap(&format!("{test} (network card)"), "exl0");
    let mut child = match &net {
        Some(net) => {
            cmd.args(["--net", "tap=exl0,mac=52:54:00:aa:bb:cc"]);
            net.run(|| cmd.spawn()).unwrap()
        }
        None => cmd.spawn(),
    }
    .expect("exitless starts");
    let mut errs = Stream::spawn(child.stderr.take().unwrap());
    let mut console = Stream::spawn(child.stdout.take().unwrap());
    let wanted = [
        format!("exitless disk /dev/vda {} sectors ro=0", 16 * MIB / 512),
        "exitless hwrng virtio_rng".to_string(),
        "bound, /dev/vsock".to_string(),
        "exitless guest up".to_string(),
    ];
    let mut wanted = wanted.to_vec();
    if net.is_some() {
        wanted.push("exitless net eth0 mac=52:54:00:aa:bb:cc".into());
    }
    let took = wait_for_lines(&mut console, &wanted, Duration::from_secs(300));
    eprintln!("{test}: /dev/vda, the hwrng, eth0 and /dev/vsock after {took:?}");
    let code = stop(&mut child);
    errs.read_to_end(Duration::from_secs(30));
    assert_eq!(code, Some(130), "{}", errs.text);
}

#[test]
fn timing_lists_every_start_up_moment_in_order_up_to_the_first_line() {
    if !have_kvm("timing_lists_every_start_up_moment") {
        return;
    }
    let elf = common::export_guest("timing");
    let out = exitless()
        .arg("--kernel")
        .arg(&elf)
        .args([
            "--cmdline",
            "case=pio_out iters=100",
            "--timing",
            "--timeout",
            "30",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&elf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let table: Vec<&str> = stderr
        .lines()
        .skip_while(|l| !l.starts_with("start-up"))
        .collect();
    use vmm::startup::moment;
    let moments = [
        moment::KVM_OPEN,
        moment::VM_CREATED,
        moment::DEVICES,
        moment::LOADED,
        moment::VCPU_FDS,
        moment::CPUID_READY,
        moment::VCPUS_CREATED,
        moment::THREADS,
        moment::MAIN_SECCOMP,
        moment::FIRST_RUN,
        moment::FIRST_LINE,
    ];
    let mut last = 0.0;
    for what in moments {
        let line = table.iter().find(|l| l.ends_with(what));
        let line = line.unwrap_or_else(|| panic!("no {what:?} in {stderr}"));
        let since: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
        assert!(since >= 0.0, "{line}");
        last = f64::max(last, since);
    }
    // The first line comes after the vCPU first ran: the table is sorted by time.
    let pos = |what: &str| table.iter().position(|l| l.ends_with(what)).unwrap();
    assert!(pos(moment::FIRST_RUN) < pos(moment::FIRST_LINE), "{stderr}");
    assert!(
        pos(moment::KVM_OPEN) < pos(moment::VCPUS_CREATED),
        "{stderr}"
    );
    assert!(
        pos(moment::VCPU_FDS) < pos(moment::VCPUS_CREATED),
        "{stderr}"
    );
    assert!(last > 0.0, "{stderr}");
}

#[test]
fn an_access_to_nothing_is_said_once_with_the_guest_s_rip() {
    if !have_kvm("an_access_to_nothing_is_said_once") {
        return;
    }
    // The bench guest's port loop writes to ports no device claims, thousands of times: one
    // line says so, with the RIP read from the synced registers at that exit (not per exit).
    let elf = common::export_guest("unmapped");
    let out = exitless()
        .arg("--kernel")
        .arg(&elf)
        .args([
            "--cmdline",
            "case=pio_out_cpl0 iters=2000",
            "--timeout",
            "30",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&elf);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("where this VM has no device"))
        .collect();
    assert_eq!(said.len(), 1, "{stderr}");
    let rip = said[0]
        .split("(rip 0x")
        .nth(1)
        .and_then(|r| r.split(')').next());
    let rip = rip.and_then(|r| u64::from_str_radix(r, 16).ok());
    assert!(
        rip.is_some_and(|r| r >= 0x10_0000),
        "the guest's code is above 1 MiB: {stderr}"
    );
}
