//! What running one configuration yields: its figures and checks ([`ConfigRun`], with the
//! virtio cases' [`VirtioFigures`]) or why it could not run ([`RunError`]). Shared by the
//! runner and the per-device parts of the virtio cases, which the runner calls.

use serde::Serialize;
use thiserror::Error;

use super::cases::CaseConfig;
use super::result::ParseError;
use super::threads::ThreadsCpu;
use vmm::builder::BuildError;
use vmm::device_manager::DeviceManagerError;
use vmm::kvm::KvmError;
use vmm::profile::VcpuProfileSnapshot;
use vmm::vcpu::VcpuError;
use vmm::vm::VmError;

/// Errors running a configuration.
#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Devices(#[from] DeviceManagerError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("Cannot create eventfd: {0}")]
    EventFd(std::io::Error),
    #[error("Cannot start the thread sampler: {0}")]
    Sampler(std::io::Error),
    #[error("Not run: {0}")]
    Unsupported(&'static str),
    /// This host or user cannot give the configuration what it needs (reported as skipped).
    #[error("Not run: {0}")]
    Unavailable(String),
    #[error("The guest reported: {0}")]
    GuestError(String),
    #[error("The guest skipped the case: {0}")]
    Skipped(String),
    #[error("The guest printed no result (output: {0:?})")]
    NoResult(String),
    #[error("The guest did not mark its measured loop")]
    NoMarkers,
    /// A virtio device or its host side (scratch disk, vsock host program) could not be set up.
    #[error("{0}")]
    Device(String),
}

/// What one configuration measured, with the checks it passed or failed.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigRun {
    pub case: &'static str,
    pub config: CaseConfig,
    pub cpl: u8,
    pub iterations: u64,
    pub cycles_per_iter: f64,
    pub ns_per_iter: f64,
    /// Userspace exits during the loop, counted by exitless from KVM_RUN returns.
    pub user_exits: u64,
    /// Host TSC at the loop's begin and end markers.
    #[serde(skip)]
    pub loop_host_tsc: (u64, u64),
    /// In-kernel exits during the loop: KVM's per-vCPU `exits` stat minus the userspace ones.
    pub kernel_exits: Option<u64>,
    /// Non-zero per-vCPU KVM stat deltas over the loop.
    pub kvm_stats: Vec<(String, u64)>,
    /// Signals counted on the ioeventfd (must equal the iterations).
    pub ioeventfd_signals: Option<u64>,
    /// Host cycles from KVM_RUN returning to the next KVM_RUN, per userspace exit.
    pub vmm_cycles_per_exit: Option<f64>,
    pub ipis: u64,
    pub uds: u64,
    /// Names of the port-I/O devices, by bus index (for the profile).
    pub io_devices: Vec<String>,
    /// The vCPU's exit profile over the loop.
    #[serde(skip)]
    pub profile: VcpuProfileSnapshot,
    /// Everything the guest printed.
    #[serde(skip)]
    pub guest_output: String,
    /// The virtio cases' figures (requests, frames or round trips).
    pub virtio: Option<VirtioFigures>,
    /// CPU time of every thread over the loop, and the devices thread's wake-ups
    /// (configurations with a vhost-user back end, whose process is included).
    pub threads: Option<ThreadsCpu>,
    /// Where the run broke the configuration's design; non-empty means an error.
    pub problems: Vec<String>,
    /// What this host did that a VT-x/SVM host would not.
    pub observations: Vec<String>,
}

impl ConfigRun {
    /// A problem unless the guest reported its failed I/O (`io_errors=`) and it is 0;
    /// `what` names the guest's requests ("requests", "READs").
    pub fn check_io_errors(&mut self, io_errors: Option<u64>, what: &str) {
        let n = self.iterations;
        match io_errors {
            None => self
                .problems
                .push("the guest did not report its I/O errors".into()),
            Some(0) => {}
            Some(e) => self
                .problems
                .push(format!("{e} of {n} {what} failed in the guest")),
        }
    }
}

/// What the device and the guest's driver counted over a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VirtioFigures {
    /// Requests, frames or round trips per second, as `unit` says.
    pub per_second: f64,
    pub unit: &'static str,
    /// Payload bytes per second the guest moved (frame, packet or request data).
    pub mb_per_second: f64,
    /// Queue notifications the guest sent (event idx lets it skip some).
    pub guest_notifies: u64,
    /// Notifications the device took (eventfd reads: several notifies can be read at once).
    pub device_notifies: u64,
    /// Interrupts the device raised (MSI-X through irqfd); a vhost-user back end's: KVM's
    /// interrupt injections.
    pub interrupts: u64,
    /// Chains completed, on every queue (a vhost-user back end's: the guest's requests).
    pub completed: u64,
    pub malformed: u64,
    /// The device's own counters (frames, bytes, connections).
    pub device: Vec<(&'static str, u64)>,
}

impl VirtioFigures {
    /// One of the device's own counters (0 when it has none of that name).
    pub fn count(&self, name: &str) -> u64 {
        self.device
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
}
