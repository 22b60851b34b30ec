//! Devices served whole by a vhost-user back end (vhost-user-blk disks, generic vhost-user
//! devices), connected at boot and on hot-add, each with its memory listener (memory hotplug
//! reaches its back end as it reaches virtio-fs's).

use std::path::Path;

use super::{open_disk, LaunchError};
use crate::config::{DiskConfig, GenericVhostUserConfig};
use crate::device_manager::DeviceManager;
use crate::devices::virtio::vhost_user_device::{Kind, VhostUserDevice};
use crate::devices::virtio::VirtioDevice;
use crate::event_loop::EventLoopHandle;

/// Device `name` on the back end at `socket`, connected (one line says so), its memory
/// listener registered with `devices`.
fn connect(
    name: &str,
    socket: &Path,
    kind: Kind,
    devices: &mut DeviceManager,
    event_loop: EventLoopHandle,
) -> Result<VhostUserDevice, LaunchError> {
    let dev = VhostUserDevice::connect(socket, kind).map_err(|error| LaunchError::VhostUser {
        name: name.to_string(),
        error,
    })?;
    {
        let f = dev.frontend();
        eprintln!(
            "exitless: {name}: vhost-user back end at {} connected (virtio features {:#x}, protocol features {:#x})",
            socket.display(),
            f.offered_features(),
            f.protocol_features().bits()
        );
    }
    let listener = dev.memory_listener(name, event_loop);
    devices.add_memory_listener(Box::new(listener));
    Ok(dev)
}

/// Disk `name`'s model: its image opened here, or its vhost-user-blk back end connected.
pub(crate) fn disk_model(
    name: &str,
    disk: &DiskConfig,
    devices: &mut DeviceManager,
    event_loop: EventLoopHandle,
) -> Result<Box<dyn VirtioDevice>, LaunchError> {
    match (disk.vhost_user, &disk.vhost_socket) {
        (true, Some(socket)) => Ok(Box::new(connect(
            name,
            socket,
            Kind::Block,
            devices,
            event_loop,
        )?)),
        _ => Ok(Box::new(open_disk(disk)?)),
    }
}

/// Generic vhost-user device `name`, connected.
pub(crate) fn generic_model(
    name: &str,
    g: &GenericVhostUserConfig,
    devices: &mut DeviceManager,
    event_loop: EventLoopHandle,
) -> Result<Box<dyn VirtioDevice>, LaunchError> {
    let kind = Kind::Generic {
        device_type: g.device_type,
        queue_sizes: g.queue_sizes.clone(),
    };
    Ok(Box::new(connect(
        name, &g.socket, kind, devices, event_loop,
    )?))
}
