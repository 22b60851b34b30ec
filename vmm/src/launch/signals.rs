//! The VMM's signals: SIGINT and SIGTERM ask to stop, SIGUSR1 asks for a profile report.
//! The handlers only set flags and wake the main thread.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use super::LaunchError;
use crate::wake;

static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
static REPORT_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(num: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    STOP_SIGNAL.store(num, Ordering::SeqCst);
    wake::wake();
}

extern "C" fn on_report_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    REPORT_REQUESTED.store(true, Ordering::SeqCst);
    wake::wake();
}

/// Installs handlers that only set flags and wake the main thread ([`crate::wake`], both
/// async-signal-safe): SIGINT and SIGTERM ask to stop
/// ([`stop_signal`]), SIGUSR1 asks for a profile report ([`take_report_request`]).
pub fn install_signal_handlers() -> Result<(), LaunchError> {
    use vmm_sys_util::signal::register_signal_handler;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        register_signal_handler(sig, on_stop_signal).map_err(LaunchError::Signal)?;
    }
    register_signal_handler(libc::SIGUSR1, on_report_signal).map_err(LaunchError::Signal)
}

/// The stop signal received, if any.
pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

/// Whether SIGUSR1 arrived since the last call.
pub fn take_report_request() -> bool {
    REPORT_REQUESTED.swap(false, Ordering::SeqCst)
}
