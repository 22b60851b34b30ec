//! `vm.receive-migration` and `vm.send-migration` (Cloud Hypervisor's live migration, see
//! docs/migration.md). Both hold the VMM's owner thread until the migration ends, as Cloud
//! Hypervisor's do (`vmm.ping` is still answered). A receiver makes its VM from what comes
//! and runs it once Complete arrives; on any failure it has no VM and waits for requests
//! again. A sender whose migration completed stops its VM and ends the VMM (exit code 0);
//! on any failure its VM goes on as before (resumed if the migration paused it).

use std::os::fd::OwnedFd;
use std::time::Duration;

use super::devices::DeviceIds;
use super::snapshot::{restored_config, restored_taps};
use super::{ControlError, VmSlot, VmState, Vmm, VmmExit};
use crate::api::schema;
use vmm::launch::migrate::{Incoming, Outgoing};
use vmm::migration::sender::{self, SendOptions, TimeoutStrategy};
use vmm::migration::transport::MigrationUrl;
use vmm::migration::{receiver, MigrationError};

const RECEIVE: &str = "vm.receive-migration";
const SEND: &str = "vm.send-migration";

/// The API config, its ids and exitless's config of a received VM.
type Converted = (schema::VmConfig, DeviceIds, vmm::config::VmConfig);

fn failed(what: &'static str, e: MigrationError) -> ControlError {
    let e = ControlError::Migration(what, e);
    eprintln!("exitless: {e}");
    e
}

/// Cloud Hypervisor's config as the source sent it, made exitless's (taps on `fds`).
fn convert(
    value: &serde_json::Value,
    r: &schema::RestoreConfig,
    fds: Vec<OwnedFd>,
) -> Result<Converted, String> {
    let mut api: schema::VmConfig =
        serde_json::from_value(value.clone()).map_err(|e| format!("the VM config: {e}"))?;
    let mut ids = DeviceIds::default();
    ids.assign_all(&mut api).map_err(|e| e.to_string())?;
    let taps = restored_taps(&api, r, fds).map_err(|e| e.to_string())?;
    let config = restored_config(&api, taps).map_err(|e| e.to_string())?;
    Ok((api, ids, config))
}

/// Cloud Hypervisor's fields for what exitless does not do, refused by name when asked for
/// (`ch-remote` sends each at its default).
fn refuse_extras(what: &str, extra: &schema::Extra) -> Result<(), ControlError> {
    let asked = |key: &str, default: &[serde_json::Value]| {
        extra.get(key).is_some_and(|v| !default.contains(v))
    };
    let null = serde_json::Value::Null;
    let refused = [
        ("preserve_source", asked("preserve_source", &[false.into()])),
        ("connections", asked("connections", &[1.into()])),
        ("tls_dir", asked("tls_dir", std::slice::from_ref(&null))),
        ("memory_mode", asked("memory_mode", &["Precopy".into()])),
        (
            "vfio_fds",
            asked("vfio_fds", &[null.clone(), serde_json::json!([])]),
        ),
    ];
    match refused.iter().find(|r| r.1) {
        Some((key, _)) => Err(ControlError::Unsupported(format!(
            "{what}: {key} is not supported by exitless (precopy over one connection)"
        ))),
        None => Ok(()),
    }
}

impl Vmm {
    /// Listens on `r.receiver_url`, receives one migration and runs the VM it made.
    pub(super) fn receive_migration(
        &mut self,
        r: schema::ReceiveMigrationData,
        fds: Vec<OwnedFd>,
    ) -> Result<(), ControlError> {
        if self.slot.is_some() {
            return Err(ControlError::AlreadyCreated);
        }
        refuse_extras(RECEIVE, &r.extra)?;
        let url = MigrationUrl::parse(&r.receiver_url).map_err(|e| failed(RECEIVE, e))?;
        if self.verbose {
            // The restore's moments at State (where the destination's share of the
            // downtime goes), logged once the VM runs.
            vmm::startup::enable();
        }
        let like_restore = schema::RestoreConfig {
            net_fds: r.net_fds.clone(),
            ..Default::default()
        };
        let mut fds = Some(fds);
        let mut converted: Option<Converted> = None;
        let (vm, received) = {
            let mut make = |v: &serde_json::Value| {
                let c = convert(v, &like_restore, fds.take().unwrap_or_default())?;
                let config = c.2.clone();
                converted = Some(c);
                Ok(config)
            };
            let mut incoming = Incoming::new(&mut make);
            let stop = || vmm::launch::stop_signal().is_some();
            let mut stream = url.accept(&stop).map_err(|e| failed(RECEIVE, e))?;
            let received =
                receiver::receive(&mut stream, &mut incoming).map_err(|e| failed(RECEIVE, e))?;
            (incoming.into_vm(), received)
        };
        let (Some(vm), Some((api, ids, config))) = (vm, converted) else {
            let why = MigrationError::Protocol("complete without a VM".into());
            return Err(failed(RECEIVE, why));
        };
        if self.verbose {
            eprintln!(
                "exitless: {RECEIVE}: {} MiB of memory in {} requests, {}",
                received.memory_bytes >> 20,
                received.memory_requests,
                if received.resumed {
                    "running"
                } else {
                    "paused"
                }
            );
            if let Some(t) = vmm::startup::timeline() {
                eprint!("exitless: {RECEIVE}: State {}", t.render());
            }
        }
        let mut slot = VmSlot {
            api,
            config,
            state: match received.resumed {
                true => VmState::Running,
                false => VmState::Paused,
            },
            ids,
            booted: Some(vm),
            pending_removal: Vec::new(),
            removing: Vec::new(),
            last_report: None,
        };
        // What the source's guest had been asked to give back is asked of it again, as a
        // restore does (the config sent lists it: `config_as_it_is`).
        slot.removals_restored();
        self.slot = Some(slot);
        Ok(())
    }

    /// Sends the VM to `s.destination_url`; once complete, the VM stops here and the VMM
    /// ends.
    pub(super) fn send_migration(
        &mut self,
        s: schema::SendMigrationData,
    ) -> Result<(), ControlError> {
        let verbose = self.verbose;
        let slot = self.slot()?;
        if !matches!(slot.state, VmState::Running | VmState::Paused) {
            return Err(slot.wrong(SEND, "Running or Paused"));
        }
        refuse_extras(SEND, &s.extra)?;
        let strategy = match s.timeout_strategy.to_ascii_lowercase().as_str() {
            "cancel" => TimeoutStrategy::Cancel,
            "ignore" => TimeoutStrategy::Ignore,
            other => {
                return Err(ControlError::Invalid(format!(
                    "{SEND}: timeout_strategy is Cancel or Ignore, not {other}"
                )))
            }
        };
        let opts = SendOptions {
            local: s.local,
            downtime: Duration::from_millis(s.downtime_ms),
            timeout: Duration::from_secs(s.timeout_s),
            strategy,
            running: slot.state == VmState::Running,
        };
        let url = MigrationUrl::parse(&s.destination_url).map_err(|e| failed(SEND, e))?;
        let config = slot
            .config_as_it_is()
            .map_err(|e| failed(SEND, MigrationError::Destination(e.to_string())))?;
        let vm = slot.running()?;
        vm.check_migratable().map_err(|e| failed(SEND, e))?;
        let mut stream = url.connect().map_err(|e| failed(SEND, e))?;
        let mut out = Outgoing::new(vm, config);
        let done = sender::send(&mut stream, &mut out, opts).map_err(|e| {
            let e = ControlError::Migration(SEND, e);
            eprintln!("exitless: {e} (the VM goes on here)");
            e
        })?;
        // The guest runs on the destination now: stopping this VM and the process's end
        // yield the CPU to it (and to everything else) on a host both share.
        sender::step_aside();
        if verbose {
            eprintln!(
                "exitless: {SEND}: complete in {:.1} ms, downtime {:.1} ms, {} MiB of memory \
                 in {} passes (last {} kB), dirty pages by the {}",
                done.total.as_secs_f64() * 1e3,
                done.downtime.as_secs_f64() * 1e3,
                done.memory_bytes >> 20,
                done.passes,
                done.last_pass_bytes >> 10,
                out.dirty_kind()
            );
            eprintln!("exitless: {SEND}: steps: {}", steps_line(&done.steps));
            eprintln!("exitless: {SEND}: {}", capture_line(&out.captured));
        }
        slot.stop();
        self.exit = Some(VmmExit(0));
        Ok(())
    }
}

/// The sender's steps in ms, in order (`-v`: where a migration's time went).
fn steps_line(t: &vmm::migration::sender::SendSteps) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "setup {:.1} ms (Start {:.1}, Config {:.1}: the destination makes guest memory and the \
         VM), precopy {:.1} ms (dirty logs on {:.1}, first table {:.1}, then the passes), then \
         the downtime: pause {:.1} ms, state captured {:.1} ms, last pass {:.1} ms, State {:.1} ms \
         (the destination puts the state back), Complete {:.1} ms (it resumes the VM)",
        ms(t.setup),
        ms(t.start),
        ms(t.config),
        ms(t.precopy),
        ms(t.tracking),
        ms(t.first_table),
        ms(t.pause),
        ms(t.capture),
        ms(t.last_pass),
        ms(t.state),
        ms(t.complete)
    )
}

/// The state capture's steps in ms (`-v`: the source's share of the downtime before the last
/// pass).
fn capture_line(c: &vmm::launch::migrate::CaptureSteps) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "state captured: vCPUs settled {:.2} ms, devices saved {:.2} ms, vCPUs read {:.2} ms, \
         irqchip/PIT/clock read {:.2} ms, encoded {:.2} ms ({} bytes)",
        ms(c.settle),
        ms(c.devices),
        ms(c.vcpus),
        ms(c.vm),
        ms(c.encode),
        c.bytes
    )
}
