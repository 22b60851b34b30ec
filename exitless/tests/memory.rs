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
