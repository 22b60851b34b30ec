//! An idle VM costs its host nothing: once the guest halts for good (the bench guest's idle
//! case), and when its VM is paused, no thread of exitless wakes up, counted as context
//! switches in /proc/PID/task/*/status over two seconds. Kernel threads in the process's
//! thread group (KVM's kvm-nx-lpage-recovery) are KVM's and left out. Through the API (the
//! main loop sleeps until a request, a signal or a vCPU thread ending wakes it) and under
//! `exitless run` (its wait sleeps the same way). Such a VM, whose guest drives no device,
//! has no devices thread either, and a partial console line still reaches a piped console.

mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use common::api_vmm::{kvm_or_skip, ok, Vmm};
use common::{exitless, export_guest, Stream};
use exitless_lab::compare::density::threads::{activity, sample};

const WINDOW: Duration = Duration::from_secs(2);

/// Context switches of `pid`'s own threads over [`WINDOW`], by thread name.
fn wakeups(pid: u32) -> BTreeMap<String, u64> {
    let before = sample(pid);
    std::thread::sleep(WINDOW);
    let a = activity(&before, &sample(pid));
    assert!(!a.by_name.is_empty(), "no threads read for {pid}");
    a.by_name
}

/// `exitless run` of the bench guest with `cmdline`, its console a pipe, stdin /dev/null.
fn run_guest(kernel: &std::path::Path, cmdline: &str) -> (std::process::Child, Stream) {
    let mut child = exitless()
        .args(["run", "--memory", "64M", "--cmdline", cmdline, "--kernel"])
        .arg(kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = Stream::spawn(child.stdout.take().unwrap());
    (child, out)
}

fn assert_asleep(what: &str, by_name: &BTreeMap<String, u64>) {
    let woke: Vec<_> = by_name.iter().filter(|(_, n)| **n > 0).collect();
    assert!(
        woke.is_empty(),
        "{what}: threads woke in 2 s: {woke:?} (all: {by_name:?})"
    );
}

#[test]
fn an_idle_or_paused_vm_s_threads_never_wake_through_the_api() {
    if !kvm_or_skip("idle_api") {
        return;
    }
    let kernel = export_guest("idle-api");
    let vmm = Vmm::start("idle");
    let mut c = vmm.client();
    let body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 64u64 << 20},
        "payload": {"kernel": kernel, "cmdline": "case=idle"},
        "serial": {"mode": "Off"},
    })
    .to_string();
    ok(
        c.request("PUT", "vm.create", Some(&body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    drop(c);
    // The guest's two lines and its halt take milliseconds; the connection closes.
    std::thread::sleep(Duration::from_millis(500));
    let running = wakeups(vmm.pid());
    assert!(running.contains_key("vcpu"), "{running:?}");
    assert!(
        !running.contains_key("devices"),
        "no virtio device, no console: no devices thread: {running:?}"
    );
    assert_asleep("running, guest idle", &running);
    let mut c = vmm.client();
    ok(c.request("PUT", "vm.pause", None).unwrap(), "vm.pause");
    drop(c);
    std::thread::sleep(Duration::from_millis(200));
    assert_asleep("paused", &wakeups(vmm.pid()));
    // Woken by a request, it still answers.
    let mut c = vmm.client();
    ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
    let info = common::api_vmm::json(&ok(c.request("GET", "vm.info", None).unwrap(), "info"));
    assert_eq!(info["state"], "Running", "{info}");
    let _ = std::fs::remove_file(&kernel);
}

#[test]
fn an_idle_vm_s_threads_never_wake_under_run() {
    if !kvm_or_skip("idle_run") {
        return;
    }
    let kernel = export_guest("idle-run");
    let (mut child, mut out) = run_guest(&kernel, "case=idle");
    let idle = out.wait_for(Duration::from_secs(30), |t| t.contains("EXITLESS DONE"));
    if idle {
        std::thread::sleep(Duration::from_millis(500));
    }
    let by_name = idle.then(|| wakeups(child.id()));
    // SAFETY: kill sends SIGTERM to the child this test started; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&kernel);
    assert!(idle, "the guest never went idle: {}", out.text);
    let by_name = by_name.unwrap();
    assert!(
        !by_name.contains_key("devices"),
        "whole lines only, no virtio device: no devices thread: {by_name:?}"
    );
    assert_asleep("run, guest idle", &by_name);
    assert_eq!(
        status.code(),
        Some(130),
        "SIGTERM wakes it and stops the VM"
    );
}

/// A line the guest leaves without its newline (a login prompt) reaches a console that takes
/// whole lines (a pipe) while the VM runs: the main thread flushes it once it has waited, so
/// a VM without devices in use still has no devices thread.
#[test]
fn a_partial_line_reaches_a_piped_console_without_a_devices_thread() {
    if !kvm_or_skip("idle_prompt") {
        return;
    }
    let kernel = export_guest("idle-prompt");
    let (mut child, mut out) = run_guest(&kernel, "case=prompt");
    let shown = out.wait_for(Duration::from_secs(30), |t| t.contains("login: "));
    let names: Vec<String> = sample(child.id()).into_values().map(|t| t.name).collect();
    // SAFETY: kill sends SIGTERM to the child this test started; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&kernel);
    assert!(
        shown,
        "the prompt never reached the console: {:?}",
        out.text
    );
    assert!(names.iter().all(|n| n != "devices"), "{names:?}");
    assert_eq!(status.code(), Some(130));
}
