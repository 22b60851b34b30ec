//! Guest memory backings end to end: shared memory (a memfd) carries the bench guest and its
//! virtio disk as private memory does, and huge pages the host lacks are one clear line.

mod common;

use std::process::Stdio;

use common::{exitless, export_guest, guest_pattern, kvm_available, Image};

#[test]
fn the_guest_and_its_disk_run_on_shared_memory() {
    if !kvm_available("shared_memory_virtio_check") {
        return;
    }
    let guest = export_guest("shared-memory");
    let image = Image::new("shared-memory", 16);
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "size=64M,shared=on", "--timeout", "60"])
        .args(["--disk", &image.disk_arg(false), "--rng"])
        .args(["--cmdline", "case=virtio_check iters=8 seed=3"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("EXITLESS VIRTIO blk verified bytes=32768"),
        "{out}"
    );
    assert!(out.contains("EXITLESS VIRTIO rng bytes=64 "), "{out}");
    assert!(!out.contains("EXITLESS ERROR"), "{out}");
    // The device wrote what the guest put in shared memory.
    let data = std::fs::read(&image.0).unwrap();
    let wrong = (0..8 * 4096)
        .filter(|&n| data[n] != guest_pattern(3, (n / 4096) as u64, (n % 4096) as u64))
        .count();
    assert_eq!(wrong, 0);
}

#[test]
fn huge_pages_the_host_lacks_are_one_clear_line() {
    if !kvm_available("huge_pages_lacking") {
        return;
    }
    let free = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    let guest = export_guest("huge-pages");
    let o = exitless()
        .args(["run", "--kernel"])
        .arg(&guest)
        .args(["--memory", "size=64M,hugepages=on", "--timeout", "30"])
        .args(["--cmdline", "case=pio_out iters=100"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    std::fs::remove_file(&guest).ok();
    let err = String::from_utf8_lossy(&o.stderr);
    match free {
        Some(n) if n >= 32 => assert!(o.status.success(), "{n} free pages: {err}"),
        Some(n) => {
            assert_eq!(o.status.code(), Some(1), "{err}");
            let wanted = format!("the guest needs 32, the host has {n} free");
            assert!(err.contains(&wanted), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        None => assert!(err.contains("has no 2M huge pages"), "{err}"),
    }
}

/// Peak RSS (VmHWM) and private dirty memory (Private_Dirty summed over smaps), in kB, of
/// `bin` running the bench guest (512 MiB, 1 vCPU), 0.4 s after the guest's first line: how
/// docs/performance.md ("Lean by default") and `compare` measure a VMM.
fn memory_of_a_vm(bin: &std::path::Path, guest: &std::path::Path) -> (u64, u64) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(bin)
        .args(["run", "--memory", "512M", "--timeout", "60", "--kernel"])
        .arg(guest)
        .args(["--cmdline", "case=pio_out iters=3000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    assert!(first.contains("EXITLESS"), "first line: {first}");
    std::thread::sleep(std::time::Duration::from_millis(400));
    let pid = child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let kb = |line: &str| -> u64 {
        let n = line.split_whitespace().nth(1).unwrap_or("0");
        n.parse().unwrap_or(0)
    };
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .map_or(0, kb);
    let dirty = smaps
        .lines()
        .filter(|l| l.starts_with("Private_Dirty:"))
        .map(kb)
        .sum();
    (hwm, dirty)
}

/// The VMM-only release build's peak RSS and private dirty memory on the bench guest measured
/// 1640 kB (1828-1856 with the binary's page cache as a build leaves it, as here) and 344 kB on
/// 2026-11-28, start-up's functions linked together, then 300 kB private dirty (284-308) once
/// the heap start-up freed went back after launch (docs/performance.md, "Lean by default");
/// the ceilings leave ~10% for noise and for what a change may honestly cost, and no more.
const PEAK_RSS_CEILING_KB: u64 = 2048;
const PRIVATE_DIRTY_CEILING_KB: u64 = 330;

/// The VMM-only release build's memory per VM (the README's and docs/performance.md's claim),
/// guarded with headroom: the ceilings are the measured figures plus ~10%, so that a new
/// thread, table or cache that costs every VM memory fails here instead of going unnoticed.
#[test]
fn the_shipped_vmm_only_build_stays_lean() {
    if !kvm_available("the_shipped_vmm_only_build_stays_lean") {
        return;
    }
    let Some(vmm_only) = std::env::var_os("EXITLESS_VMM_BIN") else {
        vmm::test_skip::skip(
            "the_shipped_vmm_only_build_stays_lean",
            "EXITLESS_VMM_BIN is not set: the ceiling is for the shipped VMM-only release build (scripts/test.sh sets it)",
        );
        return;
    };
    let guest = export_guest("lean");
    // The least of three runs: a sample can only be inflated (a page fault in flight), never
    // below what the VMM needs.
    let runs: Vec<_> = (0..3)
        .map(|_| memory_of_a_vm(std::path::Path::new(&vmm_only), &guest))
        .collect();
    std::fs::remove_file(&guest).ok();
    let hwm = runs.iter().map(|r| r.0).min().unwrap();
    let dirty = runs.iter().map(|r| r.1).min().unwrap();
    assert!(
        hwm <= PEAK_RSS_CEILING_KB,
        "peak RSS {hwm} kB (runs {runs:?}): if the start-up functions' list went stale (a new \
         toolchain or dependency renames them), rerun `scripts/startup-order.py BENCH_ELF \
         VMM_ONLY_BINARY DEFAULT_BINARY > exitless/startup.ld`"
    );
    assert!(
        dirty <= PRIVATE_DIRTY_CEILING_KB,
        "private dirty {dirty} kB (runs {runs:?})"
    );
}
