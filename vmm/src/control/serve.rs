//! The VMM's main loop: requests from the API server's channel, handled one at a time by the
//! thread that owns the VM, between them the guest's end and the process's stop signals.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::{Vmm, VmmExit};
use crate::api::{ApiCall, ApiRequest, ApiResponse};

/// How often the loop looks at the guest and at signals when no request comes.
const POLL: Duration = Duration::from_millis(10);

/// Exit code when a stop signal (SIGINT, SIGTERM) ended the VMM, as `exitless run` gives.
pub const EXIT_SIGNAL: i32 = 130;

/// Serves requests until the VMM should end (`vmm.shutdown`, the guest powered off, the
/// API server gone) or `stop_requested` says so; the VM is stopped before returning (its
/// profile stays readable through [`Vmm::report`]). With `verbose`, each request is logged
/// with its answer's status.
pub fn serve(
    vmm: &mut Vmm,
    calls: &Receiver<ApiCall>,
    verbose: bool,
    mut stop_requested: impl FnMut(&Vmm) -> bool,
) -> VmmExit {
    let exit = loop {
        match calls.recv_timeout(POLL) {
            Ok(call) => {
                let what = verbose.then(|| request_name(&call.request));
                let response = vmm.handle(call.request);
                if let Some(what) = what {
                    eprintln!("exitless: api: {what} -> {}", status(&response));
                }
                // A client gone before its answer only loses the answer.
                let _ = call.reply.send(response);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break VmmExit(1),
        }
        vmm.poll();
        if let Some(exit) = vmm.exit() {
            break exit;
        }
        if stop_requested(vmm) {
            break VmmExit(EXIT_SIGNAL);
        }
    };
    vmm.stop();
    exit
}

/// The endpoint a request came from, for the log.
fn request_name(r: &ApiRequest) -> &'static str {
    match r {
        ApiRequest::VmCreate(_) => "vm.create",
        ApiRequest::VmBoot => "vm.boot",
        ApiRequest::VmShutdown => "vm.shutdown",
        ApiRequest::VmReboot => "vm.reboot",
        ApiRequest::VmDelete => "vm.delete",
        ApiRequest::VmPause => "vm.pause",
        ApiRequest::VmResume => "vm.resume",
        ApiRequest::VmInfo => "vm.info",
        ApiRequest::VmCounters => "vm.counters",
        ApiRequest::VmProfile => "vm.profile",
        ApiRequest::VmAddDisk(_) => "vm.add-disk",
        ApiRequest::VmAddNet(..) => "vm.add-net",
        ApiRequest::VmAddVsock(_) => "vm.add-vsock",
        ApiRequest::VmAddFs(_) => "vm.add-fs",
        ApiRequest::VmRemoveDevice(_) => "vm.remove-device",
        ApiRequest::VmResize(_) => "vm.resize",
        ApiRequest::VmmShutdown => "vmm.shutdown",
    }
}

/// The HTTP status an answer gets.
pub fn status(r: &ApiResponse) -> u16 {
    match r {
        ApiResponse::NoContent => 204,
        ApiResponse::Json(_) => 200,
        ApiResponse::Error(e) => e.status,
    }
}
