//! Devices and vCPUs added and removed through the API: ids, the configuration as applied,
//! and the running VM's hotplug. Before boot a device only joins the configuration (it is
//! cold-plugged at boot through the same device manager path); once booted it is hot-plugged.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;

use super::{ControlError, VmSlot, VmState, Vmm};
use crate::api::schema::{self, PciDeviceInfo};
use crate::api::{ApiError, ApiResponse};
use vmm::config::VmConfig;
use vmm::launch::HotplugDevice;

/// The ids of a VM's devices: given by the client or assigned as Cloud Hypervisor does
/// (`_disk0`, `_net1`, ...).
#[derive(Debug, Default)]
pub(super) struct DeviceIds {
    used: BTreeSet<String>,
}

impl DeviceIds {
    /// The ids a config started from the command line has (it names none: they are assigned).
    pub(super) fn from_config(config: &VmConfig) -> Self {
        let mut ids = DeviceIds::default();
        for i in 0..config.disks.len() {
            ids.used.insert(format!("_disk{i}"));
        }
        for i in 0..config.nets.len() {
            ids.used.insert(format!("_net{i}"));
        }
        if config.vsock.is_some() {
            ids.used.insert("_vsock0".into());
        }
        for i in 0..config.fs.len() {
            ids.used.insert(format!("_fs{i}"));
        }
        if config.balloon.is_some() {
            ids.used.insert("_balloon0".into());
        }
        for i in 0..config.generic_vhost_user.len() {
            ids.used.insert(format!("_generic_vhost_user{i}"));
        }
        for i in 0..config.pmem.len() {
            ids.used.insert(format!("_pmem{i}"));
        }
        ids
    }

    /// `wanted` if free, else the first free `{prefix}N`.
    pub(super) fn assign(
        &mut self,
        wanted: Option<String>,
        prefix: &str,
    ) -> Result<String, ControlError> {
        let id = match wanted {
            Some(id) if self.used.contains(&id) => return Err(ControlError::DuplicateId(id)),
            Some(id) if id.is_empty() => {
                return Err(ControlError::Invalid("Empty device id".into()))
            }
            Some(id) => id,
            None => (0..)
                .map(|n| format!("{prefix}{n}"))
                .find(|id| !self.used.contains(id))
                .unwrap_or_default(),
        };
        self.used.insert(id.clone());
        Ok(id)
    }

    pub(super) fn release(&mut self, id: &str) {
        self.used.remove(id);
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.used.contains(id)
    }

    /// Gives every device of a `vm.create` body its id.
    pub(super) fn assign_all(&mut self, api: &mut schema::VmConfig) -> Result<(), ControlError> {
        for d in api.disks.iter_mut().flatten() {
            d.id = Some(self.assign(d.id.take(), "_disk")?);
        }
        for n in api.net.iter_mut().flatten() {
            n.id = Some(self.assign(n.id.take(), "_net")?);
        }
        if let Some(v) = api.vsock.as_mut() {
            v.id = Some(self.assign(v.id.take(), "_vsock")?);
        }
        for f in api.fs.iter_mut().flatten() {
            f.id = Some(self.assign(f.id.take(), "_fs")?);
        }
        if let Some(b) = api.balloon.as_mut() {
            b.id = Some(self.assign(b.id.take(), "_balloon")?);
        }
        for g in api.generic_vhost_user.iter_mut().flatten() {
            g.id = Some(self.assign(g.id.take(), "_generic_vhost_user")?);
        }
        for p in api.pmem.iter_mut().flatten() {
            p.id = Some(self.assign(p.id.take(), "_pmem")?);
        }
        Ok(())
    }
}

/// exitless's own configuration for a `vm.create` body.
pub(super) fn vm_config(api: &schema::VmConfig) -> Result<VmConfig, ControlError> {
    api.to_vm_config()
        .map_err(|e| ControlError::Invalid(e.message))
}

fn invalid(e: ApiError) -> ControlError {
    ControlError::Invalid(e.message)
}

impl From<Result<Option<PciDeviceInfo>, ControlError>> for ApiResponse {
    fn from(r: Result<Option<PciDeviceInfo>, ControlError>) -> Self {
        match r {
            Ok(Some(info)) => super::json(&info),
            Ok(None) => ApiResponse::NoContent,
            Err(e) => e.into(),
        }
    }
}

type Added = Result<Option<PciDeviceInfo>, ControlError>;

/// A device the guest was asked to eject and has not yet: its id, its config list in Cloud
/// Hypervisor's schema (`disks`, `net`, `vsock`, `fs`) and its entry there.
pub(super) struct Removing {
    id: String,
    list: &'static str,
    entry: serde_json::Value,
}

/// A config entry as JSON (an entry the API took always encodes).
fn json_of<T: serde::Serialize>(entry: &T) -> serde_json::Value {
    serde_json::to_value(entry).unwrap_or_default()
}

impl Vmm {
    pub(super) fn add_disk(&mut self, mut disk: schema::DiskConfig) -> Added {
        let slot = self.slot()?;
        let id = slot.ids.assign(disk.id.take(), "_disk")?;
        disk.id = Some(id.clone());
        let shared = slot.config.shared_memory;
        let added = disk.to_disk_config().map_err(invalid).and_then(|internal| {
            if internal.vhost_user && !shared {
                return Err(ControlError::Invalid(
                    "A vhost-user disk needs memory.shared=true: the back end maps guest memory"
                        .into(),
                ));
            }
            let bdf = slot.plug(&id, HotplugDevice::Disk(&internal))?;
            slot.config.disks.push(internal);
            slot.api.disks.get_or_insert_with(Vec::new).push(disk);
            Ok(bdf)
        });
        slot.added(id, added)
    }

    pub(super) fn add_net(&mut self, mut net: schema::NetConfig, fds: Vec<OwnedFd>) -> Added {
        let slot = self.slot()?;
        let id = slot.ids.assign(net.id.take(), "_net")?;
        net.id = Some(id.clone());
        let added = net
            .to_net_config(fds)
            .map_err(invalid)
            .and_then(|internal| {
                let bdf = slot.plug(&id, HotplugDevice::Net(&internal))?;
                slot.config.nets.push(internal);
                slot.api.net.get_or_insert_with(Vec::new).push(net);
                Ok(bdf)
            });
        slot.added(id, added)
    }

    pub(super) fn add_vsock(&mut self, mut vsock: schema::VsockConfig) -> Added {
        let slot = self.slot()?;
        if slot.config.vsock.is_some() {
            return Err(ControlError::Invalid(
                "The VM already has a vsock device".into(),
            ));
        }
        let id = slot.ids.assign(vsock.id.take(), "_vsock")?;
        vsock.id = Some(id.clone());
        let added = vsock
            .to_vsock_config()
            .map_err(invalid)
            .and_then(|internal| {
                let bdf = slot.plug(&id, HotplugDevice::Vsock(&internal))?;
                slot.config.vsock = Some(internal);
                slot.api.vsock = Some(vsock);
                Ok(bdf)
            });
        slot.added(id, added)
    }

    /// A virtio-fs device on the vhost-user back end at `fs.socket` (the VM's memory must be
    /// shared): joins the config before boot, hot-plugged once booted.
    pub(super) fn add_fs(&mut self, mut fs: schema::FsConfig) -> Added {
        let slot = self.slot()?;
        fs.check(slot.config.shared_memory, slot.api.pci_segments())
            .map_err(invalid)?;
        let id = slot.ids.assign(fs.id.take(), "_fs")?;
        fs.id = Some(id.clone());
        let internal = fs.to_fs_config();
        let added = slot.plug(&id, HotplugDevice::Fs(&internal));
        if added.is_ok() {
            slot.config.fs.push(internal);
            slot.api.fs.get_or_insert_with(Vec::new).push(fs);
        }
        slot.added(id, added)
    }

    /// A generic vhost-user device on the back end at `g.socket` (the VM's memory must be
    /// shared): joins the config before boot, hot-plugged once booted.
    pub(super) fn add_generic_vhost_user(
        &mut self,
        mut g: schema::GenericVhostUserConfig,
    ) -> Added {
        let slot = self.slot()?;
        g.check(slot.config.shared_memory, slot.api.pci_segments())
            .map_err(invalid)?;
        let id = slot.ids.assign(g.id.take(), "_generic_vhost_user")?;
        g.id = Some(id.clone());
        let internal = g.to_config();
        let added = slot.plug(&id, HotplugDevice::GenericVhostUser(&internal));
        if added.is_ok() {
            slot.config.generic_vhost_user.push(internal);
            slot.api
                .generic_vhost_user
                .get_or_insert_with(Vec::new)
                .push(g);
        }
        slot.added(id, added)
    }

    /// A virtio-pmem device over `p.file`: joins the config before boot, hot-plugged (its
    /// file mapped into guest memory) once booted.
    pub(super) fn add_pmem(&mut self, mut p: schema::PmemConfig) -> Added {
        let slot = self.slot()?;
        p.check(slot.api.pci_segments()).map_err(invalid)?;
        let id = slot.ids.assign(p.id.take(), "_pmem")?;
        p.id = Some(id.clone());
        let internal = p.to_config();
        let added = slot.plug(&id, HotplugDevice::Pmem(&internal));
        if added.is_ok() {
            slot.config.pmem.push(internal);
            slot.api.pmem.get_or_insert_with(Vec::new).push(p);
        }
        slot.added(id, added)
    }

    /// Removes a device from the configuration at once; a running VM's guest is asked to
    /// eject it, and its resources go when the guest has (Cloud Hypervisor's way).
    pub(super) fn remove_device(&mut self, r: schema::VmRemoveDevice) -> Result<(), ControlError> {
        let slot = self.slot()?;
        let id = r.id.unwrap_or_default();
        if !slot.ids.contains(&id) {
            return Err(ControlError::UnknownDevice(id));
        }
        if slot
            .api
            .balloon
            .as_ref()
            .is_some_and(|b| b.id.as_deref() == Some(&id))
        {
            return Err(ControlError::Unsupported(format!(
                "Device {id} is the balloon, which cannot be removed"
            )));
        }
        if let Some(vm) = slot.booted.as_mut() {
            vm.request_removal(&id)?;
        }
        slot.forget(&id);
        Ok(())
    }

    /// `vm.resize`: vCPUs added up to `max_vcpus` (hotplug) or removed (the guest ejects
    /// them), memory added (ACPI memory hotplug, see `memory`), the balloon's target
    /// (`desired_balloon`).
    pub(super) fn resize(&mut self, r: schema::VmResize) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if let Some(wanted) = r.desired_vcpus {
            let max = slot.config.max_vcpus.unwrap_or(slot.config.cpus);
            if wanted == 0 || wanted > max {
                return Err(ControlError::Invalid(format!(
                    "vm.resize: desired_vcpus {wanted} is outside 1..={max} (max_vcpus)"
                )));
            }
            slot.resize_vcpus(wanted)?;
            slot.api.cpus.boot_vcpus = wanted;
            slot.config.cpus = wanted;
        }
        if let Some(ram) = r.desired_ram {
            slot.resize_memory(ram)?;
        }
        if let Some(bytes) = r.desired_balloon {
            slot.resize_balloon(bytes)?;
        }
        Ok(())
    }
}

impl VmSlot {
    /// Hot-plugs a device into the running VM (its bdf), or nothing before boot.
    fn plug(
        &mut self,
        id: &str,
        device: HotplugDevice<'_>,
    ) -> Result<Option<PciDeviceInfo>, ControlError> {
        let Some(vm) = self.booted.as_mut() else {
            return Ok(None);
        };
        let bdf = vm.hot_add(id, device)?;
        Ok(Some(PciDeviceInfo {
            id: id.to_string(),
            bdf,
        }))
    }

    /// Keeps the id of a device that was added, frees it if adding failed.
    fn added(&mut self, id: String, r: Added) -> Added {
        if r.is_err() {
            self.ids.release(&id);
        }
        r
    }

    /// Takes device `id` out of the configuration (both views); a running VM's device is
    /// kept aside until the guest has ejected it.
    pub(super) fn forget(&mut self, id: &str) {
        let is = |d: &Option<String>| d.as_deref() == Some(id);
        let mut gone = None;
        if let Some(disks) = self.api.disks.as_mut() {
            if let Some(i) = disks.iter().position(|d| is(&d.id)) {
                gone = Some(("disks", json_of(&disks.remove(i))));
                self.config.disks.remove(i);
            }
        }
        if let Some(nets) = self.api.net.as_mut() {
            if let Some(i) = nets.iter().position(|n| is(&n.id)) {
                gone = Some(("net", json_of(&nets.remove(i))));
                self.config.nets.remove(i);
            }
        }
        if self.api.vsock.as_ref().is_some_and(|v| is(&v.id)) {
            gone = self.api.vsock.take().map(|v| ("vsock", json_of(&v)));
            self.config.vsock = None;
        }
        if let Some(fs) = self.api.fs.as_mut() {
            if let Some(i) = fs.iter().position(|f| is(&f.id)) {
                gone = Some(("fs", json_of(&fs.remove(i))));
                self.config.fs.remove(i);
            }
        }
        if let Some(gs) = self.api.generic_vhost_user.as_mut() {
            if let Some(i) = gs.iter().position(|g| is(&g.id)) {
                gs.remove(i);
                self.config.generic_vhost_user.remove(i);
            }
        }
        if let Some(ps) = self.api.pmem.as_mut() {
            if let Some(i) = ps.iter().position(|p| is(&p.id)) {
                ps.remove(i);
                self.config.pmem.remove(i);
            }
        }
        // A running VM's device keeps its id until the guest has ejected it.
        match (self.booted.is_some(), gone) {
            (true, Some((list, entry))) => self.removing.push(Removing {
                id: id.to_string(),
                list,
                entry,
            }),
            (true, None) => {}
            (false, _) => self.ids.release(id),
        }
    }

    /// The config a snapshot writes: the VM as it is, with the devices and vCPUs the guest
    /// was asked to give back and still has (a restore asks for them again).
    pub(super) fn config_as_it_is(&self) -> Result<serde_json::Value, serde_json::Error> {
        let mut config = serde_json::to_value(&self.api)?;
        for r in &self.removing {
            if let Some(serde_json::Value::Array(list)) = config.get_mut(r.list) {
                list.push(r.entry.clone());
            } else if r.list == "vsock" {
                config[r.list] = r.entry.clone();
            } else {
                config[r.list] = serde_json::json!([r.entry]);
            }
        }
        if let Some(vm) = self.booted.as_ref() {
            config["cpus"]["boot_vcpus"] = vm.vcpu_ids().len().into();
        }
        Ok(config)
    }

    /// After a restore: what the saved VM's guest had been asked to give back is asked of it
    /// again (out of the config, as `vm.remove-device` and `vm.resize` left it).
    pub(super) fn removals_restored(&mut self) {
        let Some(vm) = self.booted.as_ref() else {
            return;
        };
        let (cpus, devices) = vm.pending_removals();
        for name in devices {
            self.forget(&name);
        }
        for id in cpus {
            if !self.pending_removal.contains(&id) && self.config.cpus > 1 {
                self.pending_removal.push(id);
                self.config.cpus -= 1;
                self.api.cpus.boot_vcpus = self.config.cpus;
            }
        }
    }

    /// Sets the balloon's target (the guest is told at once if it runs).
    fn resize_balloon(&mut self, bytes: u64) -> Result<(), ControlError> {
        let (Some(api), Some(config)) = (self.api.balloon.as_mut(), self.config.balloon.as_mut())
        else {
            return Err(ControlError::Invalid(
                "vm.resize: desired_balloon needs a balloon device (balloon in vm.create)".into(),
            ));
        };
        let memory = self.config.memory.bytes();
        if bytes > memory {
            return Err(ControlError::Invalid(format!(
                "vm.resize: desired_balloon {bytes} is more than the guest's {memory} bytes of memory"
            )));
        }
        if let Some(vm) = self.booted.as_ref() {
            vm.set_balloon_target(bytes)?;
        }
        api.size = bytes;
        config.size = bytes;
        Ok(())
    }

    fn resize_vcpus(&mut self, wanted: u8) -> Result<(), ControlError> {
        if !self.pending_removal.is_empty() {
            return Err(ControlError::ResizePending);
        }
        let Some(vm) = self.booted.as_mut() else {
            return Ok(()); // before boot only the config changes
        };
        let present: Vec<u8> = vm.vcpu_ids().into_iter().flat_map(u8::try_from).collect();
        let (add, remove) = vcpu_changes(&present, wanted);
        for id in add {
            vm.add_vcpu(id)?;
            vm.cpu_added(id)?;
        }
        for id in remove {
            vm.request_cpu_removal(id)?;
            self.pending_removal.push(id);
        }
        Ok(())
    }

    /// Completes what the guest ejected: a device is forgotten as `vm.remove-device` forgets
    /// it (out of the configuration, so it does not come back at reboot, and its id free for
    /// another), the vCPUs of its CPUs retired.
    pub(super) fn complete_ejects(&mut self) {
        let Some(vm) = self.booted.as_mut() else {
            return;
        };
        let (cpus, devices) = vm.complete_ejects();
        for id in cpus {
            let asked = self.pending_removal.contains(&id);
            self.pending_removal.retain(|p| *p != id);
            match vm.remove_vcpu(usize::from(id)) {
                // A CPU the guest gave back on its own: the config says one fewer (a
                // vm.resize that asked for it said so already).
                Ok(()) if !asked && self.config.cpus > 1 => {
                    self.config.cpus -= 1;
                    self.api.cpus.boot_vcpus = self.config.cpus;
                }
                Ok(()) => {}
                Err(e) => {
                    eprintln!("exitless: vCPU {id} ejected by the guest but not stopped: {e}")
                }
            }
        }
        for name in devices {
            self.forget(&name);
            self.removing.retain(|r| r.id != name);
            self.ids.release(&name);
        }
        if self.state == VmState::Shutdown {
            self.pending_removal.clear();
        }
    }
}

/// Which vCPU ids to add and which to remove (highest first) to go from `present` to
/// `wanted` vCPUs: the lowest absent ids are added, the highest present removed. The ids need
/// not be contiguous: the guest may eject any CPU on its own (ACPI `_EJ0`), which leaves a
/// hole that the next growth fills.
pub(super) fn vcpu_changes(present: &[u8], wanted: u8) -> (Vec<u8>, Vec<u8>) {
    let have = present.len();
    let wanted = usize::from(wanted);
    if wanted >= have {
        let free = (0..=u8::MAX).filter(|id| !present.contains(id));
        (free.take(wanted - have).collect(), Vec::new())
    } else {
        let mut ids = present.to_vec();
        ids.sort_unstable();
        (Vec::new(), ids[wanted..].iter().rev().copied().collect())
    }
}
