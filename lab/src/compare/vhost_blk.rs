//! The vhost_user_blk compare cases' host side: qemu-storage-daemon exporting the
//! comparison's raw image as vhost-user-blk, one daemon of each VMM's own per run (a daemon
//! serves one front end at a time), always the same program and the same image file.

use std::path::{Path, PathBuf};

use super::peer::{self, Device};
use super::{CompareError, Plan};
use vmm::devices::virtio::vhost_user_device::storage_daemon::{self, StorageDaemon};

/// Whether `case` needs qemu-storage-daemon.
pub(super) fn needs_daemon(case: &str) -> bool {
    peer::guest_case(case).2.is_some_and(Device::has_vhost_blk)
}

/// The daemon's program when the plan has vhost_user_blk cases, and each such case with why
/// it is not run when there is none.
pub(super) fn daemon_for(plan: &Plan) -> (Option<PathBuf>, Vec<String>) {
    if !plan.cases.iter().any(|c| needs_daemon(c)) {
        return (None, Vec::new());
    }
    match storage_daemon::find() {
        Some(program) => (Some(program), Vec::new()),
        None => {
            let why = "qemu-storage-daemon is not installed (apt-get install qemu-system-common, \
                       or name one with EXITLESS_STORAGE_DAEMON)";
            let cases = plan.cases.iter().filter(|c| needs_daemon(c));
            (None, cases.map(|c| format!("{c}: {why}")).collect())
        }
    }
}

/// `program` exporting `image` (writable) on `socket`, listening.
pub(super) fn start(
    program: &Path,
    image: &Path,
    socket: &Path,
) -> Result<StorageDaemon, CompareError> {
    StorageDaemon::start(program, image, socket, true).map_err(CompareError::StorageDaemon)
}
