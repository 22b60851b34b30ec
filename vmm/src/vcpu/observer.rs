//! The narrow hook through which something outside the core (the exit lab) watches a vCPU's
//! exits: a device's write may ask for its exit to be shown ([`DeviceEvent::Observe`]), and an
//! observer may also run on every userspace exit. A vCPU without an observer pays nothing for
//! the first (the exit's action is matched anyway) and one predictable branch for the second.
//!
//! [`DeviceEvent::Observe`]: crate::bus::DeviceEvent::Observe

use kvm_ioctls::VcpuFd;

use super::VcpuError;
use crate::profile::VcpuProfile;

/// What an observer sees of the vCPU at an observed exit.
///
/// Part of the lab's entry point into the exit path ([`ExitObserver`]).
pub struct ObservedVcpu<'a> {
    pub id: usize,
    /// Userspace exits so far, this one included (counted whether or not profiling is on).
    pub user_exits: u64,
    /// The vCPU's exit profile (snapshot it to keep the counters of this moment).
    pub profile: &'a VcpuProfile,
    /// The vCPU itself, e.g. to read KVM's binary stats of it.
    pub fd: &'a VcpuFd,
}

/// Watches the exits of one vCPU, on that vCPU's thread. The vCPU's profile does not count the
/// time spent in [`ExitObserver::observe`]; it counts [`ExitObserver::every_exit`] as the
/// VMM's handling of the exit.
///
/// The lab's entry point into the exit path: the bench watches each exit through it.
pub trait ExitObserver: Send {
    /// A device asked for this exit to be shown, with `value` (what the guest wrote).
    fn observe(&mut self, value: u32, vcpu: &ObservedVcpu<'_>);

    /// Whether [`ExitObserver::every_exit`] is to be called; asked once, when the observer is
    /// set.
    fn wants_every_exit(&self) -> bool {
        false
    }

    /// Runs on every userspace exit, after the exit went to its device; an error ends the vCPU.
    fn every_exit(&mut self, _fd: &VcpuFd) -> Result<(), VcpuError> {
        Ok(())
    }
}
