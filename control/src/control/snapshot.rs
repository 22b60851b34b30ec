//! `vm.snapshot` and `vm.restore`: a paused VM written to a directory, and a VM made from one
//! in a VMM that has none (no `vm.create`), Paused until `vm.resume` (Kata's templates), its
//! fd-passed taps sent again with the request (`net_fds`). See docs/snapshot.md.

use std::os::fd::OwnedFd;

use super::devices::DeviceIds;
use super::{ControlError, VmSlot, VmState, Vmm};
use crate::api::schema;
use vmm::launch::{self, LaunchError, RestoreOptions};
use vmm::snapshot::{self, SnapshotError};

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
        let config = slot
            .config_as_it_is()
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
    pub(super) fn restore(
        &mut self,
        r: schema::RestoreConfig,
        fds: Vec<OwnedFd>,
    ) -> Result<(), ControlError> {
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
            vmm::startup::enable();
        }
        let dir = snapshot::dir_from_url(&r.source_url).map_err(restore_error)?;
        let (config, state) = snapshot::read(&dir).map_err(restore_error)?;
        let mut api: schema::VmConfig = serde_json::from_value(config)
            .map_err(|e| restore_error(SnapshotError::Config(e.to_string())))?;
        let mut ids = DeviceIds::default();
        ids.assign_all(&mut api)?;
        let taps = restored_taps(&api, &r, fds)?;
        let config = restored_config(&api, taps)?;
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
            removing: Vec::new(),
            last_report: None,
        };
        slot.removals_restored();
        if r.resume {
            slot.running()?.resume()?;
            slot.state = VmState::Running;
        }
        self.slot = Some(slot);
        if let Some(t) = vmm::startup::timeline().filter(|_| self.verbose) {
            eprint!("exitless: vm.restore {}", t.render());
        }
        Ok(())
    }
}

/// The tap fds a restore brought, by card index in config.json (Cloud Hypervisor's
/// `net_fds`: `[{"id", "num_fds"}]`, the fds on the request in that order; a card uses its
/// first, one queue pair, as `vm.add-net` does). A card whose tap came as fds has no name in
/// config.json to open again: without fds for it the restore is refused naming it, before
/// anything is made.
pub(super) fn restored_taps(
    api: &schema::VmConfig,
    r: &schema::RestoreConfig,
    fds: Vec<OwnedFd>,
) -> Result<Vec<(usize, OwnedFd)>, ControlError> {
    let invalid = |why: String| ControlError::Invalid(format!("vm.restore: {why}"));
    let wanted = r.net_fds.as_deref().unwrap_or(&[]);
    let total: usize = wanted.iter().map(|n| n.num_fds).sum();
    if total != fds.len() {
        return Err(invalid(format!(
            "net_fds names {total} file descriptors, the request brought {}",
            fds.len()
        )));
    }
    let nets = api.net.as_deref().unwrap_or(&[]);
    let (mut fds, mut taps) = (fds.into_iter(), Vec::new());
    for w in wanted {
        let card = nets
            .iter()
            .position(|n| n.id.as_deref() == Some(w.id.as_str()));
        let card = card.ok_or_else(|| {
            invalid(format!(
                "net_fds names {}, which config.json has no network card for",
                w.id
            ))
        })?;
        let mut own = fds.by_ref().take(w.num_fds);
        let fd = own
            .next()
            .ok_or_else(|| invalid(format!("net_fds gives {} no fds", w.id)))?;
        own.for_each(drop);
        taps.push((card, fd));
    }
    let nameless = nets.iter().enumerate().find(|(i, n)| {
        n.tap.as_deref().unwrap_or("").is_empty() && !taps.iter().any(|t| t.0 == *i)
    });
    if let Some((_, n)) = nameless {
        let id = n.id.as_deref().unwrap_or("?");
        return Err(invalid(format!(
            "device {id} (virtio-net) had its tap sent as file descriptors, which config.json \
             cannot name: send the tap again with the request (net_fds: \
             [{{\"id\": \"{id}\", \"num_fds\": 1}}])"
        )));
    }
    Ok(taps)
}

/// exitless's config for the restored VM: `api`'s, its cards in `taps` on those fds.
pub(super) fn restored_config(
    api: &schema::VmConfig,
    taps: Vec<(usize, OwnedFd)>,
) -> Result<vmm::config::VmConfig, ControlError> {
    let config_error = |message| restore_error(SnapshotError::Config(message));
    // A card on an fd has no tap name; the conversion wants one, and the fd replaces it.
    let mut named = api.clone();
    let nets = named.net.as_mut().map_or(&mut [][..], |n| &mut n[..]);
    for (card, _) in &taps {
        nets[*card].tap = Some("fd".into());
    }
    let mut config = named.to_vm_config().map_err(|e| config_error(e.message))?;
    let cards = api.net.as_deref().unwrap_or(&[]);
    for (card, fd) in taps {
        let on_fd = cards[card].to_net_config(vec![fd]);
        config.nets[card] = on_fd.map_err(|e| config_error(e.message))?;
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(nets: serde_json::Value) -> schema::VmConfig {
        let body = serde_json::json!({"payload": {"kernel": "/k"}, "net": nets});
        serde_json::from_value(body).unwrap()
    }

    fn restore(net_fds: serde_json::Value) -> schema::RestoreConfig {
        let body = serde_json::json!({"source_url": "file:///s", "net_fds": net_fds});
        serde_json::from_value(body).unwrap()
    }

    fn fds(n: usize) -> Vec<OwnedFd> {
        let null = || std::fs::File::open("/dev/null").unwrap().into();
        (0..n).map(|_| null()).collect()
    }

    fn refusal(api: &schema::VmConfig, r: &schema::RestoreConfig, n: usize) -> String {
        let e = restored_taps(api, r, fds(n)).unwrap_err();
        assert_eq!(e.status(), 400);
        e.to_string()
    }

    /// `net_fds` maps each card's fds by id; a card on fds without new ones, an unknown id
    /// or a count that is not what the request brought is one line naming it.
    #[test]
    fn restored_taps_come_by_card_id_and_a_nameless_card_needs_them() {
        let cards = api(serde_json::json!([
            {"tap": "tap0", "id": "_net0"},
            {"id": "_net1"},
        ]));
        let e = refusal(&cards, &restore(serde_json::json!([])), 0);
        assert!(
            e.contains("device _net1 (virtio-net)") && e.contains("net_fds"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let two = restore(serde_json::json!([{"id": "_net1", "num_fds": 2}]));
        let taps = restored_taps(&cards, &two, fds(2)).unwrap();
        assert_eq!(taps.iter().map(|t| t.0).collect::<Vec<_>>(), [1]);
        let e = refusal(&cards, &two, 1);
        assert!(
            e.contains("names 2 file descriptors, the request brought 1"),
            "{e}"
        );
        let unknown = restore(serde_json::json!([{"id": "_net7", "num_fds": 1}]));
        let e = refusal(&cards, &unknown, 1);
        assert!(
            e.contains("_net7, which config.json has no network card for"),
            "{e}"
        );
        let none = restore(serde_json::json!([{"id": "_net1", "num_fds": 0}]));
        assert!(refusal(&cards, &none, 0).contains("gives _net1 no fds"));
    }
}
