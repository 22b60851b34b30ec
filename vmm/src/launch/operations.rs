//! Operations on a running VM that Cloud Hypervisor's API offers: the power button
//! (`vm.power-button`: the GED tells the guest, whose ACPI code powers off through the sleep
//! register), an NMI on every vCPU (`vm.nmi`), a disk grown while the VM runs
//! (`vm.resize-disk`). The ELF core (`vm.coredump`) is in [`super::coredump`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;

use super::{LaunchError, LaunchedVm};

/// How long the vCPUs may take to queue the NMI on their own threads.
const NMI_TIME: Duration = Duration::from_secs(2);

/// A refused or failed operation.
#[derive(Debug, Error)]
pub enum OperationError {
    #[error("disk {name} cannot be resized: {why}")]
    ResizeDisk { name: String, why: String },
    #[error("KVM refused the NMI on vCPU {id}: {error}")]
    Nmi { id: usize, error: kvm_ioctls::Error },
    #[error("the VM is not paused (pause it first)")]
    NotPaused,
    #[error("cannot write the core to {path}: {error}")]
    CoreWrite {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("cannot read vCPU {id}'s registers: {error}")]
    CoreRegisters { id: usize, error: kvm_ioctls::Error },
}

impl OperationError {
    /// Whether the request is at fault (the API answers 400), not the host.
    pub fn is_input_fault(&self) -> bool {
        matches!(
            self,
            OperationError::ResizeDisk { .. }
                | OperationError::NotPaused
                | OperationError::CoreWrite { .. }
        )
    }
}

impl LaunchedVm {
    /// Presses the power button: the guest is told through the GED (its `_EVT` notifies
    /// `\_SB_.PWRB`); what it does then is its own (an OS powers off: the VM ends as a
    /// power-off).
    pub fn press_power_button(&self) -> Result<(), LaunchError> {
        self.running()?;
        Ok(self.devices.press_power_button()?)
    }

    /// Queues an NMI on every vCPU (KVM_NMI on each vCPU's own thread, while parked: a
    /// running VM is paused for it and runs on at once; a paused one gets it when it runs).
    /// Returns how many vCPUs got it.
    pub fn inject_nmi(&self) -> Result<usize, LaunchError> {
        let running = self.running()?;
        let was_paused = running.is_paused();
        if !was_paused {
            running.pause()?;
        }
        let failed: Arc<Mutex<Vec<(usize, kvm_ioctls::Error)>>> = Arc::default();
        let into = failed.clone();
        let task: crate::vcpu::VcpuTask = Arc::new(move |id, fd| {
            if let Err(e) = fd.nmi() {
                into.lock().unwrap_or_else(|p| p.into_inner()).push((id, e));
            }
        });
        let ran = running.on_each_vcpu(task, NMI_TIME);
        if !was_paused {
            running.resume();
        }
        ran?;
        let failed = std::mem::take(&mut *failed.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some((id, error)) = failed.into_iter().next() {
            return Err(OperationError::Nmi { id, error }.into());
        }
        Ok(running.vcpu_ids().len())
    }

    /// Grows the disk `name` to `bytes` and tells the guest (a new configuration generation
    /// and the configuration-change interrupt). Ok(false): it has that size already.
    pub fn resize_disk(&self, name: &str, bytes: u64) -> Result<bool, LaunchError> {
        let device = self
            .virtio()
            .find(|d| d.name() == name)
            .ok_or_else(|| LaunchError::NoSuchDevice(name.to_string()))?;
        device.resize(bytes).map_err(|why| {
            OperationError::ResizeDisk {
                name: name.to_string(),
                why,
            }
            .into()
        })
    }
}
