//! Cloud Hypervisor's operations on a booted VM: `vm.power-button`, `vm.nmi`,
//! `vm.resize-disk`, `vm.resize-zone` and `vm.coredump`, checked here against the VM's state
//! and configuration and done by the core (`LaunchedVm`'s methods).

use std::path::PathBuf;

use super::{ControlError, VmState, Vmm};
use crate::api::schema;
use vmm::launch::LaunchError;

/// The file a `file:///path` URL names: an absolute path, nothing else.
pub(super) fn core_path(url: &str) -> Result<PathBuf, ControlError> {
    let path = url.strip_prefix("file://").unwrap_or_default();
    if !path.starts_with('/') || path.contains('\0') || path.ends_with('/') {
        return Err(ControlError::Invalid(format!(
            "vm.coredump: destination_url must be file:///path/to/file, not '{url}'"
        )));
    }
    Ok(PathBuf::from(path))
}

/// A refusal the core made about what was asked is the request's fault, named.
fn refused(what: &'static str, e: LaunchError) -> ControlError {
    match e {
        LaunchError::Operation(op) if op.is_input_fault() => {
            ControlError::Invalid(format!("{what}: {op}"))
        }
        other => other.into(),
    }
}

impl Vmm {
    pub(super) fn power_button(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.state != VmState::Running {
            return Err(slot.wrong("vm.power-button", "Running"));
        }
        slot.running()?.press_power_button()?;
        Ok(())
    }

    pub(super) fn nmi(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.booted.is_none() {
            return Err(slot.wrong("vm.nmi", "Running or Paused"));
        }
        slot.running()?.inject_nmi()?;
        Ok(())
    }

    pub(super) fn resize_disk(&mut self, r: schema::VmResizeDisk) -> Result<(), ControlError> {
        let slot = self.slot()?;
        let disks = slot.api.disks.as_deref().unwrap_or_default();
        if !disks.iter().any(|d| d.id.as_deref() == Some(r.id.as_str())) {
            return Err(match slot.ids.contains(&r.id) {
                true => ControlError::Invalid(format!("vm.resize-disk: '{}' is not a disk", r.id)),
                false => ControlError::UnknownDevice(r.id),
            });
        }
        if slot.booted.is_none() {
            return Err(slot.wrong("vm.resize-disk", "Running or Paused"));
        }
        let vm = slot.running()?;
        vm.resize_disk(&r.id, r.desired_size)
            .map_err(|e| refused("vm.resize-disk", e))?;
        Ok(())
    }

    pub(super) fn resize_zone(&mut self, r: schema::VmResizeZone) -> Result<(), ControlError> {
        let slot = self.slot()?;
        slot.resize_zone(&r.id, r.desired_ram)
    }

    pub(super) fn coredump(&mut self, url: &str) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.state != VmState::Paused {
            return Err(slot.wrong("vm.coredump", "Paused"));
        }
        let path = core_path(url)?;
        slot.running()?
            .coredump(&path)
            .map_err(|e| refused("vm.coredump", e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApiRequest as R, ApiResponse};

    fn refused(vmm: &mut Vmm, r: R) -> (u16, String) {
        match vmm.handle(r) {
            ApiResponse::Error(e) => (e.status, e.message),
            other => panic!("{other:?}"),
        }
    }

    /// Before boot every operation is refused with the state named; unknown disks and zones
    /// are 404, a zone without hotplug_size 400, whatever the state.
    #[test]
    fn operations_on_a_vm_not_booted_are_refused_by_state_or_name() {
        let mut vmm = Vmm::new();
        assert_eq!(refused(&mut vmm, R::VmNmi).0, 404, "no VM");
        let body = serde_json::json!({
            "payload": {"kernel": "/k"},
            "memory": {"size": 0, "zones": [
                {"id": "z0", "size": 64u64 << 20, "hotplug_size": 256u64 << 20},
                {"id": "z1", "size": 64u64 << 20}]},
            "disks": [{"path": "/d.img"}],
        });
        let create = R::VmCreate(Box::new(serde_json::from_value(body).unwrap()));
        assert!(matches!(vmm.handle(create), ApiResponse::NoContent));
        let disk = |id: &str| {
            R::VmResizeDisk(schema::VmResizeDisk {
                id: id.into(),
                desired_size: 1 << 30,
            })
        };
        let zone = |id: &str, bytes: u64| {
            R::VmResizeZone(schema::VmResizeZone {
                id: id.into(),
                desired_ram: bytes,
            })
        };
        let core = R::VmCoredump(schema::VmCoredumpData {
            destination_url: "file:///tmp/c".into(),
        });
        for (r, state) in [
            (R::VmPowerButton, "vm.power-button needs it Running"),
            (R::VmNmi, "vm.nmi needs it Running or Paused"),
            (disk("_disk0"), "vm.resize-disk needs it Running or Paused"),
            (
                zone("z0", 128 << 20),
                "vm.resize-zone needs it Running or Paused",
            ),
            (core, "vm.coredump needs it Paused"),
        ] {
            let (code, message) = refused(&mut vmm, r);
            assert_eq!(code, 405, "{message}");
            assert!(
                message.contains("Created") && message.contains(state),
                "{message}"
            );
        }
        assert_eq!(refused(&mut vmm, disk("_disk9")).0, 404);
        assert_eq!(refused(&mut vmm, zone("nothing", 1 << 30)).0, 404);
        let (code, message) = refused(&mut vmm, zone("z1", 128 << 20));
        assert!(
            code == 400 && message.contains("z1 has no hotplug_size"),
            "{message}"
        );
        let (code, message) = refused(&mut vmm, zone("z0", 512 << 20));
        assert!(
            code == 400 && message.contains("limit of 335544320"),
            "{message}"
        );
    }

    #[test]
    fn a_core_goes_to_an_absolute_file_url_only() {
        assert_eq!(
            core_path("file:///tmp/vm.core").unwrap(),
            PathBuf::from("/tmp/vm.core")
        );
        for bad in [
            "/tmp/vm.core",
            "file://tmp/x",
            "file:///tmp/",
            "http://x/y",
            "",
        ] {
            let e = core_path(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
            assert!(e.to_string().contains("file:///"), "{e}");
        }
    }
}
