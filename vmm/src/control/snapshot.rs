//! `vm.snapshot` and `vm.restore`: a paused VM written to a directory, and a VM made from one
//! in a VMM that has none (no `vm.create`), Paused until `vm.resume` (Kata's templates). See
//! docs/snapshot.md.

use super::devices::DeviceIds;
use super::{ControlError, VmSlot, VmState, Vmm};
use crate::api::schema;
use crate::launch::{self, LaunchError, RestoreOptions};
use crate::snapshot::{self, SnapshotError};

fn snapshot_error(e: impl Into<LaunchError>) -> ControlError {
    ControlError::Snapshot("vm.snapshot", e.into())
}

fn restore_error(e: impl Into<LaunchError>) -> ControlError {
    ControlError::Snapshot("vm.restore", e.into())
}

impl Vmm {
    /// Writes the paused VM to the directory `url` names (`file://DIR`).
    pub(super) fn snapshot(&mut self, url: &str) -> Result<(), ControlError> {
        let verbose = self.verbose;
        let slot = self.slot()?;
        if slot.state != VmState::Paused {
            return Err(slot.wrong("vm.snapshot", "Paused"));
        }
        let dir = snapshot::dir_from_url(url).map_err(snapshot_error)?;
        let config = serde_json::to_value(&slot.api)
            .map_err(|e| snapshot_error(SnapshotError::Encode(e.to_string())))?;
        let zones = slot.config.memory_zones.clone();
        let vm = slot.running()?;
        let done = vm
            .snapshot(&dir, &config, &zones, verbose)
            .map_err(snapshot_error)?;
        if verbose {
            eprintln!(
                "exitless: vm.snapshot: {} in {:.1} ms, {} MiB of memory written ({} MiB scanned)",
                dir.display(),
                done.elapsed.as_secs_f64() * 1e3,
                done.memory.written >> 20,
                done.memory.scanned >> 20
            );
        }
        Ok(())
    }

    /// Makes the VM saved in the directory `r.source_url` names; it is Paused afterwards (or
    /// Running with `resume`).
    pub(super) fn restore(&mut self, r: schema::RestoreConfig) -> Result<(), ControlError> {
        if self.slot.is_some() {
            return Err(ControlError::AlreadyCreated);
        }
        let zone_updates = r.extra.get("zone_updates");
        if zone_updates.is_some_and(|z| z.as_array().is_some_and(|a| !a.is_empty())) {
            return Err(ControlError::Unsupported(
                "vm.restore: zone_updates is not supported by exitless".into(),
            ));
        }
        if self.verbose {
            crate::startup::enable();
        }
        let dir = snapshot::dir_from_url(&r.source_url).map_err(restore_error)?;
        let (config, state) = snapshot::read(&dir).map_err(restore_error)?;
        let mut api: schema::VmConfig = serde_json::from_value(config)
            .map_err(|e| restore_error(SnapshotError::Config(e.to_string())))?;
        let mut ids = DeviceIds::default();
        ids.assign_all(&mut api)?;
        let config = api
            .to_vm_config()
            .map_err(|e| restore_error(SnapshotError::Config(e.message)))?;
        let opts = RestoreOptions::default();
        let vm = launch::restore(&config, &dir, state, opts).map_err(restore_error)?;
        launch::release_unused_stack();
        let mut slot = VmSlot {
            api,
            config,
            state: VmState::Paused,
            ids,
            booted: Some(vm),
            pending_removal: Vec::new(),
            last_report: None,
        };
        if r.resume {
            slot.running()?.resume()?;
            slot.state = VmState::Running;
        }
        self.slot = Some(slot);
        if let Some(t) = crate::startup::timeline().filter(|_| self.verbose) {
            eprint!("exitless: vm.restore {}", t.render());
        }
        Ok(())
    }
}
