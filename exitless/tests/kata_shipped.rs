//! Kata Containers as shipped (configuration-clh.toml: `shared_fs = "virtio-fs"`,
//! `reclaim_guest_freed_memory = true`, containers with memory limits): the request sequence
//! of control/src/api/fixtures/kata_clh_virtiofs.json against the release builds, with a real
//! virtiofsd where Kata puts it. The guest (the bench guest's FUSE driver, case fs_check)
//! reads a file the host wrote through the `kataShared` tag and writes one back, while Kata's
//! requests grow its memory, hot-add a disk and vCPUs, pause and resume it.

mod common;

use std::time::{Duration, Instant};

use common::api_vmm::kvm_or_skip;
use common::export_guest;
use common::kata::{tap, walk, Sandbox};
use common::virtiofsd::{pattern, Virtiofsd};

#[test]
fn kata_with_its_shipped_configuration_starts_a_sandbox_and_uses_virtio_fs() {
    if !kvm_or_skip("kata_shipped") {
        return;
    }
    let Some((_ns, tap_fd)) = tap("kata_shipped") else {
        return;
    };
    let kernel = export_guest("kata-shipped");
    let data: Vec<u8> = (0..65536).map(pattern).collect();
    for bin in common::builds() {
        // Kata starts virtiofsd before vm.create, one per sandbox (it exits when its
        // client goes).
        let Some(daemon) = Virtiofsd::start("kata_shipped") else {
            return;
        };
        std::fs::write(daemon.shared().join("in.bin"), &data).unwrap();
        // The pod lives until the guest's file went through virtio-fs to the host's shared
        // folder; then Kata stops it.
        let written = daemon.shared().join("out.bin");
        let guest_wrote = || {
            let start = Instant::now();
            while std::fs::read(&written).ok().as_ref() != Some(&data) {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "out.bin never held the pattern; virtiofsd: {}",
                    daemon.log_text()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let sandbox = Sandbox {
            fixture: include_str!("../../control/src/api/fixtures/kata_clh_virtiofs.json"),
            dir: &daemon.dir,
            kernel: &kernel,
            before_stop: Some(&guest_wrote),
        };
        let stderr = walk(&bin, &sandbox, &tap_fd);
        assert!(stderr.contains("api: vm.resize -> 204"), "{stderr}");
        assert!(daemon.wait_disconnected(), "{}", daemon.log_text());
    }
    let _ = std::fs::remove_file(&kernel);
}
