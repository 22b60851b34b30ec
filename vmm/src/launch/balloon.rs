//! A running VM's balloon: the host's target set while the VM runs (`vm.resize
//! {"desired_balloon"}`: the new `num_pages`, then a configuration-change interrupt), and
//! what the guest says it gave.

use std::sync::Arc;

use super::{LaunchError, LaunchedVm};
use crate::builder::VmBuilder;
use crate::config::VmConfig;
use crate::device_manager::Notify;
use crate::devices::virtio::balloon::{Balloon, BalloonHandle};
use crate::devices::virtio::transport::VirtioPciDevice;
use crate::devices::virtio::VirtioInterrupt;

/// The balloon of a VM: its target and the PCI function that tells the guest.
pub(super) struct BalloonControl {
    handle: BalloonHandle,
    device: Arc<VirtioPciDevice>,
}

/// The balloon the config asks for, on PCI.
pub(super) fn add_balloon(
    builder: &mut VmBuilder,
    config: &VmConfig,
) -> Result<Option<BalloonControl>, LaunchError> {
    let Some(b) = &config.balloon else {
        return Ok(None);
    };
    let balloon = Balloon::new(b);
    let handle = balloon.handle();
    let name = b.id.as_deref().unwrap_or("virtio-balloon");
    let device = builder.add_virtio(name, Box::new(balloon), Notify::Ioeventfd)?;
    Ok(Some(BalloonControl { handle, device }))
}

impl LaunchedVm {
    /// Asks the guest to hold `bytes` in its balloon (whole 4 KiB pages): the device's
    /// `num_pages` changes and the guest gets a configuration-change interrupt.
    pub fn set_balloon_target(&self, bytes: u64) -> Result<(), LaunchError> {
        let b = self.balloon.as_ref().ok_or(LaunchError::NoBalloon)?;
        if b.handle.set_target_bytes(bytes) {
            b.device
                .interrupt()
                .signal_config()
                .map_err(LaunchError::BalloonNotice)?;
        }
        Ok(())
    }

    /// What the guest says its balloon holds, in bytes (None without a balloon).
    pub fn balloon_actual_bytes(&self) -> Option<u64> {
        self.balloon.as_ref().map(|b| b.handle.actual_bytes())
    }
}
