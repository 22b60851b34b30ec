//! The VMM's control side: one VM's lifecycle as a state machine driven by API requests.
//!
//! ```text
//!   (none) --create--> Created --boot--> Running <--pause/resume--> Paused
//!                         ^                 |                          |
//!                         |              shutdown                  shutdown
//!                       delete              v                          v
//!                                       Shutdown --boot--> Running ...
//! ```
//!
//! Only the thread that owns [`Vmm`] touches the VM: the API's thread parses and validates
//! requests and takes each answer from its own channel ([`serve`]). A request in the wrong
//! state is refused with the state named; nothing is left half done.

mod devices;
mod memory;
mod migration;
mod operations;
pub mod serve;
mod snapshot;

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

use crate::api::schema;
use crate::api::{ApiError, ApiRequest, ApiResponse};
use devices::DeviceIds;
use vmm::config::{ConfigError, VmConfig};
use vmm::launch::{self, LaunchError, LaunchOptions, LaunchedVm};
use vmm::vcpu::VmEnd;

/// The VM's state as `vm.info` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum VmState {
    Created,
    Running,
    Paused,
    Shutdown,
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Why a request was refused.
#[derive(Debug, Error)]
pub enum ControlError {
    #[error("No VM is created (vm.create first)")]
    NotCreated,
    #[error("A VM is already created (vm.delete first)")]
    AlreadyCreated,
    #[error("The VM is {state}: {action} needs it {needs}")]
    WrongState {
        state: VmState,
        action: &'static str,
        needs: &'static str,
    },
    #[error("Invalid VM config: {0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Invalid(String),
    #[error("No device has id '{0}'")]
    UnknownDevice(String),
    #[error("Device id '{0}' is already in use")]
    DuplicateId(String),
    #[error("A vCPU removal is still pending; try again")]
    ResizePending,
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Launch(#[from] LaunchError),
    /// A snapshot or restore that failed: the request's name, then why.
    #[error("{0}: {1}")]
    Snapshot(&'static str, LaunchError),
    /// A migration that failed: the request's name, then why.
    #[error("{0}: {1}")]
    Migration(&'static str, vmm::migration::MigrationError),
}

impl ControlError {
    /// The HTTP status: Cloud Hypervisor's where it has one (404 for a missing VM or device,
    /// 400 for a bad config, 409 for a duplicate id, 429 for a pending resize), 405 for a
    /// request the VM's state does not allow; 400 when a file, tap or socket the client named
    /// cannot be used, 500 when the host failed.
    pub fn status(&self) -> u16 {
        match self {
            ControlError::NotCreated | ControlError::UnknownDevice(_) => 404,
            ControlError::Config(_) | ControlError::Invalid(_) | ControlError::Unsupported(_) => {
                400
            }
            ControlError::AlreadyCreated | ControlError::WrongState { .. } => 405,
            ControlError::DuplicateId(_) => 409,
            ControlError::ResizePending => 429,
            ControlError::Launch(e) | ControlError::Snapshot(_, e) if e.is_input_fault() => 400,
            ControlError::Launch(_) | ControlError::Snapshot(..) => 500,
            ControlError::Migration(_, e) if e.is_input_fault() => 400,
            ControlError::Migration(..) => 500,
        }
    }
}

impl From<ControlError> for ApiResponse {
    fn from(e: ControlError) -> Self {
        ApiResponse::Error(ApiError {
            status: e.status(),
            message: e.to_string(),
        })
    }
}

/// A created VM: its configuration as the API sees it and as exitless runs it, and the
/// running VM once booted.
struct VmSlot {
    api: schema::VmConfig,
    config: VmConfig,
    state: VmState,
    ids: DeviceIds,
    booted: Option<LaunchedVm>,
    /// vCPUs the guest was asked to eject and has not yet.
    pending_removal: Vec<u8>,
    /// Devices the guest was asked to eject and has not yet: out of the config, but still
    /// the VM's (a snapshot's config.json has them), as (id, config list, entry).
    removing: Vec<devices::Removing>,
    /// The exit profile of the VM that ran last (kept once it stops).
    last_report: Option<vmm::profile::ProfileReport>,
}

/// Why the VMM's serve loop should end, with the process's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmExit(pub i32);

/// The VMM: at most one VM, driven by requests.
#[derive(Default)]
pub struct Vmm {
    slot: Option<VmSlot>,
    exit: Option<VmmExit>,
    /// Reboots the guest asked for (a reset).
    reboots: u64,
    /// Progress of long work (a snapshot's memory) on stderr.
    verbose: bool,
}

fn json<T: serde::Serialize>(value: &T) -> ApiResponse {
    match serde_json::to_string(value) {
        Ok(body) => ApiResponse::Json(body),
        Err(e) => ApiResponse::Error(ApiError {
            status: 500,
            message: format!("Cannot encode the reply: {e}"),
        }),
    }
}

fn done(r: Result<(), ControlError>) -> ApiResponse {
    r.map_or_else(ApiResponse::from, |()| ApiResponse::NoContent)
}

impl Vmm {
    pub fn new() -> Self {
        Self::default()
    }

    /// A VMM whose VM was started from the command line (`exitless run --api-socket`).
    pub fn with_running(api: schema::VmConfig, config: VmConfig, vm: LaunchedVm) -> Self {
        Self::with_vm(api, config, vm, false)
    }

    /// A VMM whose VM was started or restored from the command line, Paused if `paused`
    /// (`exitless run --restore DIR --paused --api-socket`).
    pub fn with_vm(api: schema::VmConfig, config: VmConfig, vm: LaunchedVm, paused: bool) -> Self {
        let ids = DeviceIds::from_config(&config);
        let state = match paused {
            true => VmState::Paused,
            false => VmState::Running,
        };
        Vmm {
            slot: Some(VmSlot {
                api,
                config,
                state,
                ids,
                booted: Some(vm),
                pending_removal: Vec::new(),
                removing: Vec::new(),
                last_report: None,
            }),
            exit: None,
            reboots: 0,
            verbose: false,
        }
    }

    /// Says how long work progresses, on stderr (`-v`).
    pub fn set_verbose(&mut self, verbose: bool) {
        self.verbose = verbose;
    }

    /// Set once the VMM should end (vmm.shutdown, or the guest powered off).
    pub fn exit(&self) -> Option<VmmExit> {
        self.exit
    }

    /// How many times the guest reset the VM (each a reboot).
    pub fn reboots(&self) -> u64 {
        self.reboots
    }

    /// The exit profile of the running VM, or of the last one that ran.
    pub fn report(&self) -> Option<vmm::profile::ProfileReport> {
        let slot = self.slot.as_ref()?;
        match &slot.booted {
            Some(vm) => Some(vm.report()),
            None => slot.last_report.clone(),
        }
    }

    /// Carries out one request. The running VM is attended first, as [`Vmm::poll`] does (its
    /// devices thread started if a device asked for it): a caller that drives the VMM with
    /// requests alone still gets its devices served.
    pub fn handle(&mut self, request: ApiRequest) -> ApiResponse {
        if let Some(vm) = self.slot.as_mut().and_then(|s| s.booted.as_mut()) {
            vm.attend();
        }
        match request {
            ApiRequest::VmCreate(config) => done(self.create(*config)),
            ApiRequest::VmBoot => done(self.boot()),
            ApiRequest::VmShutdown => done(self.shutdown_vm()),
            ApiRequest::VmReboot => done(self.reboot()),
            ApiRequest::VmDelete => done(self.delete()),
            ApiRequest::VmPause => done(self.pause()),
            ApiRequest::VmResume => done(self.resume()),
            ApiRequest::VmInfo => self.info().map_or_else(ApiResponse::from, |i| json(&i)),
            ApiRequest::VmCounters => self.counters().map_or_else(ApiResponse::from, |c| json(&c)),
            ApiRequest::VmProfile => self.profile(),
            ApiRequest::VmAddDisk(disk) => self.add_disk(disk).into(),
            ApiRequest::VmAddNet(net, fds) => self.add_net(net, fds).into(),
            ApiRequest::VmAddVsock(vsock) => self.add_vsock(vsock).into(),
            ApiRequest::VmAddFs(fs) => self.add_fs(fs).into(),
            ApiRequest::VmAddGenericVhostUser(g) => self.add_generic_vhost_user(g).into(),
            ApiRequest::VmAddPmem(p) => self.add_pmem(p).into(),
            ApiRequest::VmRemoveDevice(r) => done(self.remove_device(r)),
            ApiRequest::VmResize(r) => done(self.resize(r)),
            ApiRequest::VmSnapshot(s) => done(self.snapshot(&s.destination_url)),
            ApiRequest::VmRestore(r, fds) => done(self.restore(r, fds)),
            ApiRequest::VmPowerButton => done(self.power_button()),
            ApiRequest::VmNmi => done(self.nmi()),
            ApiRequest::VmResizeDisk(r) => done(self.resize_disk(r)),
            ApiRequest::VmResizeZone(r) => done(self.resize_zone(r)),
            ApiRequest::VmCoredump(c) => done(self.coredump(&c.destination_url)),
            ApiRequest::VmReceiveMigration(r, fds) => done(self.receive_migration(r, fds)),
            ApiRequest::VmSendMigration(s) => done(self.send_migration(s)),
            ApiRequest::VmmShutdown => {
                let r = self.delete();
                self.exit = Some(VmmExit(0));
                done(r)
            }
        }
    }

    fn slot(&mut self) -> Result<&mut VmSlot, ControlError> {
        self.slot.as_mut().ok_or(ControlError::NotCreated)
    }

    fn create(&mut self, api: schema::VmConfig) -> Result<(), ControlError> {
        if self.slot.is_some() {
            return Err(ControlError::AlreadyCreated);
        }
        let mut api = api;
        let mut ids = DeviceIds::default();
        ids.assign_all(&mut api)?;
        let config = devices::vm_config(&api)?;
        self.slot = Some(VmSlot {
            api,
            config,
            state: VmState::Created,
            ids,
            booted: None,
            pending_removal: Vec::new(),
            removing: Vec::new(),
            last_report: None,
        });
        Ok(())
    }

    fn boot(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if !matches!(slot.state, VmState::Created | VmState::Shutdown) {
            return Err(slot.wrong("vm.boot", "Created or Shutdown"));
        }
        let opts = LaunchOptions {
            stdin_to_serial: false,
        };
        let vm = launch::launch(&slot.config, opts)?;
        launch::release_unused_stack();
        slot.booted = Some(vm);
        slot.state = VmState::Running;
        slot.pending_removal.clear();
        Ok(())
    }

    fn shutdown_vm(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.booted.is_none() {
            return Err(slot.wrong("vm.shutdown", "Running or Paused"));
        }
        slot.stop();
        Ok(())
    }

    fn reboot(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.booted.is_none() {
            return Err(slot.wrong("vm.reboot", "Running or Paused"));
        }
        slot.stop();
        self.boot()
    }

    fn delete(&mut self) -> Result<(), ControlError> {
        if let Some(mut slot) = self.slot.take() {
            slot.stop();
        }
        Ok(())
    }

    fn pause(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.state != VmState::Running {
            return Err(slot.wrong("vm.pause", "Running"));
        }
        slot.running()?.pause()?;
        slot.state = VmState::Paused;
        Ok(())
    }

    fn resume(&mut self) -> Result<(), ControlError> {
        let slot = self.slot()?;
        if slot.state != VmState::Paused {
            return Err(slot.wrong("vm.resume", "Paused"));
        }
        slot.running()?.resume()?;
        slot.state = VmState::Running;
        Ok(())
    }

    fn info(&mut self) -> Result<schema::VmInfo, ControlError> {
        let slot = self.slot()?;
        // What the guest can use: its memory less what it put in the balloon.
        let ballooned = slot
            .booted
            .as_ref()
            .and_then(|vm| vm.balloon_actual_bytes());
        Ok(schema::VmInfo {
            config: slot.api.clone(),
            state: slot.state.to_string(),
            memory_actual_size: slot
                .booted
                .as_ref()
                .map_or(slot.config.memory.bytes(), |vm| vm.memory_size())
                .saturating_sub(ballooned.unwrap_or(0)),
            device_tree: Default::default(),
        })
    }

    fn counters(&mut self) -> Result<BTreeMap<String, BTreeMap<String, u64>>, ControlError> {
        let slot = self.slot()?;
        Ok(slot
            .booted
            .as_ref()
            .map(|vm| vm.device_counters())
            .unwrap_or_default())
    }

    fn profile(&mut self) -> ApiResponse {
        let slot = match self.slot() {
            Ok(s) => s,
            Err(e) => return e.into(),
        };
        match &slot.booted {
            Some(vm) => json(&vm.report()),
            None => slot.wrong("vm.profile", "Running or Paused").into(),
        }
    }

    /// Work that does not come from a request: a guest that ended its VM (power-off ends the
    /// VMM, as Cloud Hypervisor does; a reset reboots it), vCPUs the guest ejected, a partial
    /// console line due, the devices thread a device asked for (a vCPU may not start it).
    /// Returns how long the main thread may sleep before looking again (`None`: until it is
    /// woken). [`serve`] calls it each time it wakes; a caller of its own must too.
    pub fn poll(&mut self) -> Option<Duration> {
        let slot = self.slot.as_mut()?;
        let console_due = slot.booted.as_mut().and_then(|vm| vm.attend());
        slot.complete_ejects();
        let Some(end) = slot.booted.as_mut().and_then(|vm| vm.guest_end()) else {
            return console_due;
        };
        slot.stop();
        match end {
            VmEnd::Reset => {
                self.reboots += 1;
                if let Err(e) = self.boot() {
                    eprintln!("exitless: the guest rebooted and the VM could not start again: {e}");
                    self.exit = Some(VmmExit(1));
                }
            }
            VmEnd::PowerOff(_) | VmEnd::Stopped => self.exit = Some(VmmExit(0)),
            other => {
                eprintln!("exitless: the VM ended: {other:?}");
                self.exit = Some(VmmExit(exit_code(other)));
            }
        }
        None
    }

    /// Stops the VM, if one runs (the VMM is ending).
    pub fn stop(&mut self) {
        if let Some(slot) = self.slot.as_mut() {
            slot.stop();
        }
    }
}

/// The exit code `exitless run` gives the same end (see its --help).
fn exit_code(end: VmEnd) -> i32 {
    match end {
        VmEnd::PowerOff(_) | VmEnd::Reset | VmEnd::Stopped => 0,
        VmEnd::TripleFault => 3,
        VmEnd::KvmFailure(_) => 4,
        VmEnd::SystemEvent(_) => 5,
    }
}

impl VmSlot {
    fn wrong(&self, action: &'static str, needs: &'static str) -> ControlError {
        ControlError::WrongState {
            state: self.state,
            action,
            needs,
        }
    }

    fn running(&mut self) -> Result<&mut LaunchedVm, ControlError> {
        let state = self.state;
        self.booted.as_mut().ok_or(ControlError::WrongState {
            state,
            action: "this request",
            needs: "Running or Paused",
        })
    }

    /// Stops a booted VM and collects its threads; the config stays (state Shutdown).
    fn stop(&mut self) {
        if let Some(mut vm) = self.booted.take() {
            vm.shut_down();
            self.last_report = Some(vm.report());
            self.state = VmState::Shutdown;
        }
    }
}

#[cfg(test)]
mod tests;
