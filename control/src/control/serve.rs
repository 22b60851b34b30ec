//! The VMM's main loop: requests from the API server's channel, handled one at a time by the
//! thread that owns the VM, between them the guest's end and the process's stop signals.
//!
//! Between events the loop sleeps ([`vmm::wake`]): the API server wakes it after queueing a
//! request, a vCPU thread as it ends, the ACPI controllers when the guest ejects a device or a
//! CPU, the signal handlers on SIGINT/SIGTERM. An idle or paused VM's main thread then makes
//! no wake-ups at all (it polled every 10 ms before: 100 wake-ups a second per VMM).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use super::{Vmm, VmmExit};
use crate::api::{ApiCall, ApiError, ApiRequest, ApiResponse};
use vmm::wake;

/// Exit code when a stop signal (SIGINT, SIGTERM) ended the VMM, as `exitless run` gives.
pub const EXIT_SIGNAL: i32 = 130;

/// Serves requests until the VMM should end (`vmm.shutdown`, the guest powered off, the
/// API server gone) or `stop_requested` says so; the VM is stopped before returning (its
/// profile stays readable through [`Vmm::report`]). `stop_requested` is asked on every
/// wake-up, and at `deadline` (a timeout) if one is given. With `verbose`, each request is
/// logged with its answer's status.
pub fn serve(
    vmm: &mut Vmm,
    calls: &Receiver<ApiCall>,
    verbose: bool,
    deadline: Option<Instant>,
    mut stop_requested: impl FnMut(&Vmm) -> bool,
) -> VmmExit {
    vmm.set_verbose(verbose);
    let exit = loop {
        let seen = wake::generation();
        let call = match calls.try_recv() {
            Ok(call) => Some(call),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => break VmmExit(1),
        };
        let handled = call.is_some();
        if let Some(call) = call {
            let what = verbose.then(|| (request_name(&call.request), Instant::now()));
            let response = vmm.handle(call.request);
            if let Some((what, at)) = what {
                let ms = at.elapsed().as_secs_f64() * 1e3;
                eprintln!(
                    "exitless: api: {what} -> {} ({ms:.2} ms)",
                    status(&response)
                );
            }
            // A client gone before its answer only loses the answer.
            let _ = call.reply.send(response);
        }
        let console_due = vmm.poll();
        if let Some(exit) = vmm.exit() {
            break exit;
        }
        if stop_requested(vmm) {
            break VmmExit(EXIT_SIGNAL);
        }
        // More requests may be queued: look again before sleeping.
        if !handled {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let left = [left, console_due].into_iter().flatten().min();
            wake::sleep_until_changed(seen, left);
        }
    };
    vmm.stop();
    refuse_queued(calls);
    exit
}

/// Answers every request still queued when the loop ended (sent while a request that ended
/// the VMM held the owner thread: a `vm.resize` behind a `vm.send-migration` that completed,
/// say) with one line, at once, rather than leaving it to a closed connection.
fn refuse_queued(calls: &Receiver<ApiCall>) {
    while let Ok(call) = calls.try_recv() {
        let what = request_name(&call.request);
        let _ = call.reply.send(ApiResponse::Error(ApiError {
            status: 503,
            message: format!(
                "{what}: not served: the VMM is ending (its VM shut down, or migrated away \
                 while the request waited)"
            ),
        }));
    }
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
        ApiRequest::VmAddGenericVhostUser(_) => "vm.add-generic-vhost-user",
        ApiRequest::VmAddPmem(_) => "vm.add-pmem",
        ApiRequest::VmRemoveDevice(_) => "vm.remove-device",
        ApiRequest::VmResize(_) => "vm.resize",
        ApiRequest::VmSnapshot(_) => "vm.snapshot",
        ApiRequest::VmRestore(..) => "vm.restore",
        ApiRequest::VmPowerButton => "vm.power-button",
        ApiRequest::VmNmi => "vm.nmi",
        ApiRequest::VmResizeDisk(_) => "vm.resize-disk",
        ApiRequest::VmResizeZone(_) => "vm.resize-zone",
        ApiRequest::VmCoredump(_) => "vm.coredump",
        ApiRequest::VmmShutdown => "vmm.shutdown",
        ApiRequest::VmReceiveMigration(..) => "vm.receive-migration",
        ApiRequest::VmSendMigration(_) => "vm.send-migration",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_queued_when_the_loop_ends_are_answered_at_once() {
        let (calls, requests) = std::sync::mpsc::channel();
        let (reply, answer) = crate::api::Reply::channel();
        calls
            .send(ApiCall {
                request: ApiRequest::VmPause,
                reply,
            })
            .unwrap();
        refuse_queued(&requests);
        match answer.try_recv() {
            Ok(ApiResponse::Error(e)) => {
                assert_eq!(e.status, 503);
                assert!(e.message.starts_with("vm.pause: not served"), "{e:?}");
            }
            Ok(_) | Err(_) => panic!("the queued request was not refused"),
        }
    }
}
