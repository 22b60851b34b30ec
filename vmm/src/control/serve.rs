//! The VMM's main loop: requests from the API server's channel, handled one at a time by the
//! thread that owns the VM, between them the guest's end and the process's stop signals.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use super::{Vmm, VmmExit};
use crate::api::ApiCall;

/// How often the loop looks at the guest and at signals when no request comes.
const POLL: Duration = Duration::from_millis(10);

/// Exit code when a stop signal (SIGINT, SIGTERM) ended the VMM, as `exitless run` gives.
pub const EXIT_SIGNAL: i32 = 130;

/// Serves requests until the VMM should end (`vmm.shutdown`, the guest powered off, the
/// API server gone) or `stop_requested` says so; the VM is stopped before returning.
pub fn serve(
    vmm: &mut Vmm,
    calls: &Receiver<ApiCall>,
    mut stop_requested: impl FnMut(&Vmm) -> bool,
) -> VmmExit {
    let exit = loop {
        match calls.recv_timeout(POLL) {
            Ok(call) => {
                let response = vmm.handle(call.request);
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
