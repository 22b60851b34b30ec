//! Kicking a vCPU out of KVM_RUN: a real-time signal whose handler sets `immediate_exit` in the
//! vCPU's own kvm_run page, so a kick that lands just before KVM_RUN is not lost.

use std::cell::Cell;
use std::ptr;

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use super::KvmError;

thread_local! {
    /// The kvm_run page of the vCPU owned by this thread (null when none).
    static RUN_PAGE: Cell<*mut kvm_run> = const { Cell::new(ptr::null_mut()) };
}

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let page = RUN_PAGE.with(|p| p.get());
    if !page.is_null() {
        // SAFETY: `page` is this thread's mapped kvm_run, registered by `arm` and cleared by
        // `disarm` before the VcpuFd (and its mapping) is dropped; a single byte store is
        // async-signal-safe.
        unsafe { ptr::write_volatile(ptr::addr_of_mut!((*page).immediate_exit), 1) };
    }
}

/// Installs the kick handler (once per process; later calls are harmless).
pub fn install_handler() -> Result<(), KvmError> {
    register_signal_handler(kick_signal(), on_kick)
        .map_err(|e| KvmError::Signal(std::io::Error::from_raw_os_error(e.errno())))
}

/// Registers `fd`'s kvm_run page for this thread's kick handler.
pub fn arm(fd: &mut VcpuFd) {
    let page: *mut kvm_run = fd.get_kvm_run();
    RUN_PAGE.with(|p| p.set(page));
}

/// Forgets this thread's kvm_run page (call before dropping the VcpuFd).
pub fn disarm() {
    RUN_PAGE.with(|p| p.set(ptr::null_mut()));
}
