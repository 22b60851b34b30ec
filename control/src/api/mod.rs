//! Cloud Hypervisor's REST API over a Unix socket, so that Kata Containers' clh driver (and
//! `ch-remote`-like tools) drive exitless unchanged. See docs/api.md.
//!
//! The layer is apart from the VM: [`server`]'s thread reads HTTP ([`http`]), turns each
//! request into a typed [`ApiRequest`] ([`route`]: paths, bodies through [`schema`], file
//! descriptors that came with the request), and hands it with a [`Reply`] to the thread that owns the
//! VM ([`crate::control`]); `vmm.ping` is answered by the server itself, at any time.

pub mod client;
pub mod convert;
pub mod http;
pub mod schema;
pub mod server;

use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Receiver, SendError, Sender};
use std::sync::Arc;

use http::{HttpError, Method};
use serde::de::DeserializeOwned;
use vmm_sys_util::eventfd::EventFd;

/// A request for the VMM's owner thread.
#[derive(Debug)]
pub enum ApiRequest {
    VmCreate(Box<schema::VmConfig>),
    VmBoot,
    VmShutdown,
    VmReboot,
    VmDelete,
    VmPause,
    VmResume,
    VmInfo,
    VmCounters,
    /// exitless's own: the exit profile of the running VM, as `--profile-json` writes it.
    VmProfile,
    VmAddDisk(schema::DiskConfig),
    /// A card, with the tap fds received with the request (SCM_RIGHTS).
    VmAddNet(schema::NetConfig, Vec<OwnedFd>),
    VmAddVsock(schema::VsockConfig),
    VmAddFs(schema::FsConfig),
    VmAddGenericVhostUser(schema::GenericVhostUserConfig),
    VmAddPmem(schema::PmemConfig),
    VmRemoveDevice(schema::VmRemoveDevice),
    VmResize(schema::VmResize),
    VmSnapshot(schema::VmSnapshotConfig),
    /// With the tap fds `net_fds` describes (SCM_RIGHTS).
    VmRestore(schema::RestoreConfig, Vec<OwnedFd>),
    /// The ACPI power button.
    VmPowerButton,
    /// An NMI to every vCPU.
    VmNmi,
    VmResizeDisk(schema::VmResizeDisk),
    VmResizeZone(schema::VmResizeZone),
    VmCoredump(schema::VmCoredumpData),
    VmmShutdown,
    /// With the tap fds `net_fds` describes (SCM_RIGHTS).
    VmReceiveMigration(schema::ReceiveMigrationData, Vec<OwnedFd>),
    VmSendMigration(schema::SendMigrationData),
}

/// The owner thread's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiResponse {
    /// 204.
    NoContent,
    /// 200 with this JSON body.
    Json(String),
    Error(ApiError),
}

/// A refused or failed request: its status (>= 400) and why, which is the reply's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

/// A request on its way to the owner thread, with where the answer goes.
pub struct ApiCall {
    pub request: ApiRequest,
    pub reply: Reply,
}

/// Where the owner thread's answer to one request goes: a channel, and the server's wake-up
/// (an eventfd its thread polls beside the connections), written when the answer is sent or
/// the call dropped unanswered, so that the server's one thread never waits on a reply.
pub struct Reply {
    answer: Sender<ApiResponse>,
    ready: Option<Arc<EventFd>>,
}

impl Reply {
    /// A reply channel with nothing to wake: its receiver is waited on.
    pub fn channel() -> (Reply, Receiver<ApiResponse>) {
        let (answer, receiver) = channel();
        (
            Reply {
                answer,
                ready: None,
            },
            receiver,
        )
    }

    /// A reply channel whose answer (or drop) writes `ready`.
    pub fn waking(ready: &Arc<EventFd>) -> (Reply, Receiver<ApiResponse>) {
        let (mut reply, receiver) = Reply::channel();
        reply.ready = Some(Arc::clone(ready));
        (reply, receiver)
    }

    /// Sends the answer (Err: nobody waits for it any more).
    pub fn send(&self, response: ApiResponse) -> Result<(), SendError<ApiResponse>> {
        let sent = self.answer.send(response);
        self.wake();
        sent
    }

    fn wake(&self) {
        if let Some(ready) = &self.ready {
            // Only fails when the counter would overflow, and then the server is awake.
            let _ = ready.write(1);
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // An answer dropped unsent: the server sees its channel closed.
        self.wake();
    }
}

/// Where an HTTP request goes.
#[derive(Debug)]
pub enum Route {
    /// Answered by the server at once.
    Ping,
    Vmm(ApiRequest),
}

/// Cloud Hypervisor endpoints for host devices that exitless refuses, each with why: not
/// implemented, and not provable on the kind of host exitless is developed on (no IOMMU
/// groups, no /dev/vfio, no /dev/vhost-vdpa). docs/api.md says the same.
pub const REFUSED_HOST_DEVICES: &[(&str, &str)] = &[
    (
        "vm.add-device",
        "VFIO device passthrough is not implemented, and this kind of host cannot prove it \
         (no IOMMU groups, no /dev/vfio)",
    ),
    (
        "vm.add-user-device",
        "vfio-user devices are not implemented, and this kind of host cannot prove them (no \
         IOMMU groups, no /dev/vfio to compare a vfio-user server's device against)",
    ),
    (
        "vm.add-vdpa",
        "vDPA devices are not implemented, and this kind of host cannot prove them (no \
         /dev/vhost-vdpa: no vhost-vdpa module, no vDPA device)",
    ),
];

fn body<T: DeserializeOwned>(endpoint: &str, body: &[u8]) -> Result<T, HttpError> {
    serde_json::from_slice(body)
        .map_err(|e| HttpError::new(400, format!("{endpoint}: invalid body: {e}")))
}

/// A body that may be left out (`{}` then).
fn optional<T: DeserializeOwned + Default>(endpoint: &str, b: &[u8]) -> Result<T, HttpError> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    body(endpoint, b)
}

/// The typed request for `req`; `fds` came with it (only `vm.add-net` and `vm.restore` take
/// them; others'
/// are dropped, which closes them).
pub fn route(req: &http::Request, fds: Vec<OwnedFd>) -> Result<Route, HttpError> {
    let path = req.path.split('?').next().unwrap_or("");
    let Some(endpoint) = path.strip_prefix("/api/v1/") else {
        return Err(HttpError::new(404, format!("No endpoint at {path}")));
    };
    let b = &req.body;
    let (method, request) = match endpoint {
        "vmm.ping" => return expect(req.method, Method::Get, endpoint).map(|()| Route::Ping),
        "vmm.shutdown" => (Method::Put, ApiRequest::VmmShutdown),
        "vm.create" => (
            Method::Put,
            ApiRequest::VmCreate(Box::new(body(endpoint, b)?)),
        ),
        "vm.boot" => (Method::Put, ApiRequest::VmBoot),
        "vm.shutdown" => (Method::Put, ApiRequest::VmShutdown),
        "vm.reboot" => (Method::Put, ApiRequest::VmReboot),
        "vm.delete" => (Method::Put, ApiRequest::VmDelete),
        "vm.pause" => (Method::Put, ApiRequest::VmPause),
        "vm.resume" => (Method::Put, ApiRequest::VmResume),
        "vm.info" => (Method::Get, ApiRequest::VmInfo),
        "vm.counters" => (Method::Get, ApiRequest::VmCounters),
        "vm.profile" => (Method::Get, ApiRequest::VmProfile),
        "vm.add-disk" => (Method::Put, ApiRequest::VmAddDisk(body(endpoint, b)?)),
        "vm.add-net" => (Method::Put, ApiRequest::VmAddNet(body(endpoint, b)?, fds)),
        "vm.add-vsock" => (Method::Put, ApiRequest::VmAddVsock(body(endpoint, b)?)),
        "vm.add-fs" => (Method::Put, ApiRequest::VmAddFs(body(endpoint, b)?)),
        "vm.add-pmem" => (Method::Put, ApiRequest::VmAddPmem(body(endpoint, b)?)),
        "vm.add-generic-vhost-user" => (
            Method::Put,
            ApiRequest::VmAddGenericVhostUser(body(endpoint, b)?),
        ),
        "vm.remove-device" => (Method::Put, ApiRequest::VmRemoveDevice(body(endpoint, b)?)),
        "vm.resize" => (Method::Put, ApiRequest::VmResize(optional(endpoint, b)?)),
        "vm.snapshot" => (Method::Put, ApiRequest::VmSnapshot(body(endpoint, b)?)),
        "vm.restore" => (Method::Put, ApiRequest::VmRestore(body(endpoint, b)?, fds)),
        "vm.power-button" => (Method::Put, ApiRequest::VmPowerButton),
        "vm.nmi" => (Method::Put, ApiRequest::VmNmi),
        "vm.resize-disk" => (Method::Put, ApiRequest::VmResizeDisk(body(endpoint, b)?)),
        "vm.resize-zone" => (Method::Put, ApiRequest::VmResizeZone(body(endpoint, b)?)),
        "vm.coredump" => (Method::Put, ApiRequest::VmCoredump(body(endpoint, b)?)),
        "vm.receive-migration" => (
            Method::Put,
            ApiRequest::VmReceiveMigration(body(endpoint, b)?, fds),
        ),
        "vm.send-migration" => (Method::Put, ApiRequest::VmSendMigration(body(endpoint, b)?)),
        e if REFUSED_HOST_DEVICES.iter().any(|(name, _)| *name == e) => {
            let why = REFUSED_HOST_DEVICES
                .iter()
                .find(|(name, _)| *name == e)
                .map_or("", |(_, why)| why);
            return Err(HttpError::new(
                400,
                format!("{e} is not supported by exitless: {why}"),
            ));
        }
        _ => return Err(HttpError::new(404, format!("No endpoint at {path}"))),
    };
    expect(req.method, method, endpoint)?;
    Ok(Route::Vmm(request))
}

fn expect(got: Method, want: Method, endpoint: &str) -> Result<(), HttpError> {
    if got == want {
        return Ok(());
    }
    let name = if want == Method::Get { "GET" } else { "PUT" };
    Err(HttpError::new(405, format!("{endpoint} takes {name}")))
}

#[cfg(test)]
mod tests;
