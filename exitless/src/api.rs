//! `exitless --api-socket PATH`: an empty VMM serving Cloud Hypervisor's REST API, the way
//! Kata Containers starts Cloud Hypervisor. It ends on `vmm.shutdown`, when the guest powers
//! off, or on SIGINT/SIGTERM; the socket file is removed.

use std::path::Path;

use exitless_control::api::server::ApiServer;
use exitless_control::control::{serve, Vmm};
use vmm::launch;

pub fn main(socket: &Path, verbose: bool) -> anyhow::Result<i32> {
    launch::install_signal_handlers()?;
    let (calls, requests) = std::sync::mpsc::channel();
    // The server's errors name the socket and say why: one line.
    let server = ApiServer::start(socket, calls).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut vmm = Vmm::new();
    let exit = serve::serve(&mut vmm, &requests, verbose, None, |_| {
        launch::stop_signal().is_some()
    });
    drop(server);
    Ok(exit.0)
}
