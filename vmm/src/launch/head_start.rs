//! The head start: a thread begun at the top of `main` when the command line boots a VM
//! (`run`), which readies what does not depend on the VM's description while the main thread
//! parses the command line: /dev/kvm opened, an empty VM created and KVM's capabilities
//! probed (the DSDT's PCI slots, which it built too, are built when exitless is compiled
//! since 2026-11-29). KVM's CPUID entries are left to the
//! builder's set-up thread (vCPU 0's, lent before it takes its vCPU): asked here, first, they
//! kept the main thread waiting 0.15 ms for the VM (2026-11-27). Part of the launch, which
//! stands on both KVM and the devices: the KVM layer holds only the VM it creates
//! ([`CreatedVm`]).
//!
//! The API server has none since 2026-11-29: it waits for `vm.create` and `vm.boot` anyway,
//! and its head start (which asked the CPUID entries too) cost ~0.3 ms of CPU per start for
//! no gain in time to the first line (docs/performance.md).
//!
//! Only speculation: the first launch takes the VM ([`take_vm`]); a step that fails on the
//! thread is left to the launch, which takes it as without a head start (so with the same
//! errors), and a VM nobody takes is closed with the process.

use std::io;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Mutex;

use kvm_ioctls::Kvm;

use crate::kvm::{self, CreatedVm};

/// What the head start hands the first launch.
pub struct HeadStart {
    pub kvm: Kvm,
    pub vm: CreatedVm,
}

/// Where the head start's VM waits for the first launch.
static READY: Mutex<Option<Receiver<HeadStart>>> = Mutex::new(None);

/// Starts the head start's thread (it ends once its work is done).
pub fn begin() -> io::Result<()> {
    // Room for the VM: the thread ends once it is made, taken or not.
    let (ready, taken) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("head-start".into())
        .stack_size(256 * 1024)
        .spawn(move || run(ready))?;
    *lock() = Some(taken);
    Ok(())
}

fn run(ready: SyncSender<HeadStart>) {
    if let Ok(kvm) = kvm::open() {
        if let Ok(vm) = CreatedVm::create(&kvm) {
            let _ = ready.send(HeadStart { kvm, vm });
        }
    }
    // The launch waits no longer: it goes on alone if nothing was sent.
}

/// The head start's KVM and VM, once the thread has them: for the first launch of the
/// process; `None` without a head start, if a step failed on it, or once taken.
pub fn take_vm() -> Option<HeadStart> {
    let taken = lock().take()?;
    taken.recv().ok()
}

fn lock() -> std::sync::MutexGuard<'static, Option<Receiver<HeadStart>>> {
    READY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
