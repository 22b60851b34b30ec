//! The vhost_user_blk case, VMM side: the virtio_blk case's scratch disk exported by
//! qemu-storage-daemon as vhost-user-blk, exitless's vhost-user front end in front of it. The
//! guest's loop and checks are virtio_blk's (bench-guest/virtio_cases.c); the requests never
//! pass through exitless.

use std::sync::Arc;

use super::blk::ScratchDisk;
use super::config_run::RunError;
use vmm::builder::VmBuilder;
use vmm::device_manager::Notify;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::vhost_user_device::storage_daemon::{self, StorageDaemon};
use vmm::devices::virtio::vhost_user_device::{Kind, VhostUserDevice};

/// The scratch disk and the daemon serving it, for one run (dropped in that order: the
/// daemon is killed, then the file removed).
pub struct HostDisk {
    daemon: StorageDaemon,
    _disk: ScratchDisk,
}

impl HostDisk {
    /// The daemon's process (its CPU is the back end's share of each request).
    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

/// Creates the scratch disk, starts qemu-storage-daemon on it and puts a vhost-user-blk
/// device on the VM's PCI bus.
pub fn attach(builder: &mut VmBuilder) -> Result<(Arc<VirtioPciDevice>, HostDisk), RunError> {
    let program = storage_daemon::find()
        .ok_or_else(|| RunError::Unavailable("qemu-storage-daemon is not installed".into()))?;
    let disk = ScratchDisk::create()
        .map_err(|e| RunError::Device(format!("Cannot create the scratch disk: {e}")))?;
    let socket = disk.path().with_extension("sock");
    let daemon =
        StorageDaemon::start(&program, disk.path(), &socket, true).map_err(RunError::Device)?;
    let dev = VhostUserDevice::connect(&socket, Kind::Block)
        .map_err(|e| RunError::Device(e.to_string()))?;
    let device = builder.add_virtio("vhost-user-blk", Box::new(dev), Notify::Ioeventfd)?;
    Ok((
        device,
        HostDisk {
            daemon,
            _disk: disk,
        },
    ))
}
