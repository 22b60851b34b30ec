//! The virtio cases, VMM side: the device a configuration attaches (a disk, a network card
//! on a tap, a socket device with a host program), the guest's arguments, and the figures
//! and checks of a run.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cases::VirtioSetup;
use super::config_run::{ConfigRun, RunError, VirtioFigures};
use super::result::GuestResult;
use super::{blk, fs, net, vhost_blk, vsock};
use vmm::builder::VmBuilder;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::QueueCounters;

/// A device attached for one run, with what it needs on the host.
pub enum Attached {
    Blk(blk::ScratchDisk),
    Net(net::PrivateTap),
    Vsock(vsock::HostProgram),
    Fs(fs::HostFs),
    VhostBlk(vhost_blk::HostDisk),
}

/// A device on the VM and its host side.
pub struct AttachedVirtio {
    pub device: Arc<VirtioPciDevice>,
    pub setup: VirtioSetup,
    host: Attached,
}

impl AttachedVirtio {
    /// The process of a vhost-user back end serving the device's queues (virtiofsd).
    pub fn backend_pid(&self) -> Option<u32> {
        match &self.host {
            Attached::Fs(fs) => Some(fs.pid()),
            Attached::VhostBlk(disk) => Some(disk.pid()),
            _ => None,
        }
    }
}

/// Puts the configuration's device on the VM's PCI bus, with its host side.
pub fn attach(builder: &mut VmBuilder, setup: VirtioSetup) -> Result<AttachedVirtio, RunError> {
    let (device, host) = match setup {
        VirtioSetup::Blk(s) if s.vhost_user => {
            let (d, disk) = vhost_blk::attach(builder)?;
            (d, Attached::VhostBlk(disk))
        }
        VirtioSetup::Blk(s) => {
            let (d, disk) = blk::attach(builder, &s)?;
            (d, Attached::Blk(disk))
        }
        VirtioSetup::Net(s) => {
            let (d, tap) = net::attach(builder, &s)?;
            (d, Attached::Net(tap))
        }
        VirtioSetup::Vsock(s) => {
            let (d, program) = vsock::attach(builder, &s)?;
            (d, Attached::Vsock(program))
        }
        VirtioSetup::Fs(_) => {
            let (d, fs) = fs::attach(builder)?;
            (d, Attached::Fs(fs))
        }
    };
    Ok(AttachedVirtio {
        device,
        setup,
        host,
    })
}

/// The guest command line's part for `setup` (see bench-guest/virtio_*.c).
pub fn guest_args(setup: &VirtioSetup) -> String {
    let (notify_args, event_idx) = match setup {
        VirtioSetup::Blk(s) => (blk::guest_args(s), s.event_idx),
        VirtioSetup::Net(s) => (net::guest_args(s), s.event_idx),
        VirtioSetup::Vsock(s) => (vsock::guest_args(s), s.event_idx),
        VirtioSetup::Fs(s) => (fs::guest_args(s), s.event_idx),
    };
    if event_idx {
        notify_args
    } else {
        notify_args + " evidx=off"
    }
}

/// Records the run's figures and checks them against the device's design.
pub fn finish(run: &mut ConfigRun, attached: &AttachedVirtio, result: &GuestResult) {
    let counters = attached.device.counters();
    let sum = |f: fn(&QueueCounters) -> u64| -> u64 { counters.iter().map(f).sum() };
    let (unit, bytes) = match attached.setup {
        VirtioSetup::Blk(_) => ("requests", blk::BYTES_PER_REQUEST),
        VirtioSetup::Net(s) => ("frames", u64::from(s.frame)),
        VirtioSetup::Vsock(s) if s.stream => ("packets", vsock::STREAM_BYTES),
        VirtioSetup::Vsock(_) => ("round trips", 2 * vsock::RR_BYTES),
        VirtioSetup::Fs(_) => ("requests", fs::BYTES_PER_REQUEST),
    };
    let per_second = if run.ns_per_iter > 0.0 {
        1e9 / run.ns_per_iter
    } else {
        0.0
    };
    // A vhost-user back end's queues are its own: exitless counts no chain or interrupt of
    // theirs. Its interrupts are KVM's injections (the loop has no other source of them).
    let (interrupts, completed) = match attached.setup {
        s if s.vhost_user() => (kvm_stat(run, "irq_injections"), run.iterations),
        _ => (
            sum(|c| c.interrupts.load(Ordering::Relaxed)),
            sum(|c| c.completed.load(Ordering::Relaxed)),
        ),
    };
    let figures = VirtioFigures {
        per_second,
        unit,
        mb_per_second: per_second * bytes as f64 / 1e6,
        guest_notifies: result.notifies.unwrap_or(0),
        device_notifies: sum(|c| c.notifies.load(Ordering::Relaxed)),
        interrupts,
        completed,
        malformed: sum(|c| c.malformed.load(Ordering::Relaxed)),
        device: attached.device.device_counters(),
    };
    match attached.setup {
        VirtioSetup::Blk(s) => blk::check(run, &s, &figures, result.io_errors),
        VirtioSetup::Net(s) => net::check(run, &s, &figures),
        VirtioSetup::Vsock(s) => vsock::check(run, &s, &figures),
        VirtioSetup::Fs(_) => fs::check(run, &figures, result.io_errors),
    }
    if figures.malformed > 0 {
        run.problems.push(format!(
            "the device found {} malformed chains",
            figures.malformed
        ));
    }
    run.virtio = Some(figures);
}

/// A KVM statistic's change over the run's loop (0 when KVM has none of that name).
fn kvm_stat(run: &ConfigRun, name: &str) -> u64 {
    run.kvm_stats
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, v)| *v)
}
