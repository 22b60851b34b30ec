//! The virtio_blk case, VMM side: a scratch disk file in the page cache, the device attached
//! as the configuration says, and the checks of a run.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cases::BlkSetup;
use super::config_run::{ConfigRun, RunError, VirtioFigures};
use vmm::builder::VmBuilder;
use vmm::config::DiskConfig;
use vmm::device_manager::Notify;
use vmm::devices::virtio::blk::{Block, WriteThrough};
use vmm::devices::virtio::transport::VirtioPciDevice;

/// Data bytes of each request the guest makes.
pub const BYTES_PER_REQUEST: u64 = 4096;
/// Size of the scratch disk: 4096 blocks of 4 KiB for the guest's random offsets.
const SCRATCH_BYTES: usize = 16 << 20;

/// A disk image that exists for one run and is removed after it.
pub struct ScratchDisk {
    path: PathBuf,
}

impl ScratchDisk {
    /// A file of `SCRATCH_BYTES` written in full, so that its pages are in the page cache.
    pub(super) fn create() -> std::io::Result<Self> {
        use std::sync::atomic::AtomicU64;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("exitless-bench-disk-{}-{n}.img", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, vec![0x5a; SCRATCH_BYTES])?;
        Ok(ScratchDisk { path })
    }
}

impl ScratchDisk {
    /// The image file.
    pub(super) fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ScratchDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Creates the scratch disk and puts a virtio-blk device for it on the VM's PCI bus.
pub fn attach(
    builder: &mut VmBuilder,
    setup: &BlkSetup,
) -> Result<(Arc<VirtioPciDevice>, ScratchDisk), RunError> {
    let disk = ScratchDisk::create()
        .map_err(|e| RunError::Device(format!("Cannot create the scratch disk: {e}")))?;
    let config = DiskConfig {
        path: disk.path.clone(),
        direct: setup.direct,
        ..DiskConfig::default()
    };
    let how = if setup.dsync {
        WriteThrough::Dsync
    } else {
        WriteThrough::GroupSync
    };
    let block = Block::open(&config)
        .map_err(|e| RunError::Device(e.to_string()))?
        .with_write_through(how);
    let device = builder.add_virtio("virtio-blk", Box::new(block), setup.notify)?;
    Ok((device, disk))
}

/// The guest command line's part for `setup` but event idx (see bench-guest/virtio_cases.c).
pub fn guest_args(setup: &BlkSetup) -> String {
    let mut args = format!(" qd={}", setup.queue_depth);
    if !setup.msix {
        args.push_str(" irq=poll");
    }
    if !setup.flush {
        args.push_str(" flush=off");
    }
    args
}

/// Checks a run against the design: every request completed without error, and at a queue
/// depth above one with ioeventfd notifies, batching: fewer guest notifies than requests (event
/// idx), and with writes cached, fewer in-kernel exits than requests (batched completions too).
/// Not in-kernel exits where the host syncs writes (write-through, RWF_DSYNC): the in-kernel
/// exits of the guest's wait on the used ring grow with the sync time (~250 µs a write here,
/// more on a loaded host: 201 for 200 requests once in CI), not with requests.
pub fn check(run: &mut ConfigRun, setup: &BlkSetup, f: &VirtioFigures, io_errors: Option<u64>) {
    let n = run.iterations;
    if f.completed != n {
        run.problems.push(format!(
            "the device completed {} requests, the guest made {n}",
            f.completed
        ));
    }
    run.check_io_errors(io_errors, "requests");
    let qd = setup.queue_depth;
    if qd <= 1 || setup.notify != Notify::Ioeventfd {
        return;
    }
    if f.guest_notifies >= n {
        run.problems.push(format!(
            "expected fewer notifies than requests at queue depth {qd}, counted {} for {n}",
            f.guest_notifies
        ));
    }
    let synced = !setup.flush || setup.dsync;
    if let (false, Some(k)) = (synced, run.kernel_exits) {
        if k >= n {
            run.problems.push(format!(
                "expected fewer in-kernel exits than requests at queue depth {qd}, counted {k} for {n}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cases::{VirtioSetup, CASES};
    use crate::bench::report::tests::run;

    fn blk_run(
        config: &str,
        completed: u64,
        kernel_exits: u64,
    ) -> (ConfigRun, BlkSetup, VirtioFigures) {
        let case = CASES.iter().position(|c| c.name == "virtio_blk").unwrap();
        let cfg = CASES[case]
            .configs
            .iter()
            .position(|c| c.name == config)
            .unwrap();
        let mut r = run(case, cfg, 50_000.0, 0);
        r.kernel_exits = Some(kernel_exits);
        let f = VirtioFigures {
            completed,
            ..VirtioFigures::default()
        };
        let Some(VirtioSetup::Blk(setup)) = CASES[case].configs[cfg].virtio else {
            panic!("{config} has a disk");
        };
        (r, setup, f)
    }

    #[test]
    fn guest_arguments_say_what_differs_from_the_driver_defaults() {
        use crate::bench::virtio::guest_args;
        let (_, qd32, _) = blk_run("qd32", 0, 0);
        assert_eq!(guest_args(&VirtioSetup::Blk(qd32)), " qd=32");
        let (_, polled, _) = blk_run("qd32-polled", 0, 0);
        assert_eq!(guest_args(&VirtioSetup::Blk(polled)), " qd=32 irq=poll");
        let (_, no_idx, _) = blk_run("qd32-no-event-idx", 0, 0);
        assert_eq!(guest_args(&VirtioSetup::Blk(no_idx)), " qd=32 evidx=off");
        let (_, wt, _) = blk_run("qd32-direct-write-through", 0, 0);
        assert!(wt.direct);
        assert_eq!(guest_args(&VirtioSetup::Blk(wt)), " qd=32 flush=off");
    }

    #[test]
    fn lost_requests_errors_and_unbatched_exits_are_problems() {
        let (mut r, s, f) = blk_run("qd32", 100, 40);
        check(&mut r, &s, &f, Some(0));
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        let (mut r, s, f) = blk_run("qd32", 99, 100);
        check(&mut r, &s, &f, Some(2));
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(r.problems[0].contains("completed 99 requests"));
        assert!(r.problems[1].contains("2 of 100 requests failed"));
        assert!(r.problems[2].contains("fewer in-kernel exits"));
        // Notifies through the vCPU thread are not held to the batching target; where the
        // host syncs writes only the notifies are (the guest's waits grow with sync time).
        for config in [
            "qd32-notify-exits",
            "qd32-write-through",
            "qd32-write-through-dsync",
        ] {
            let (mut r, s, f) = blk_run(config, 100, 300);
            check(&mut r, &s, &f, Some(0));
            assert!(r.problems.is_empty(), "{config}: {:?}", r.problems);
        }
        // A notify for every request is unbatched whatever the writes cost.
        let (mut r, s, mut f) = blk_run("qd32-write-through", 100, 300);
        f.guest_notifies = 100;
        check(&mut r, &s, &f, Some(0));
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(r.problems[0].contains("fewer notifies"), "{:?}", r.problems);
    }
}
