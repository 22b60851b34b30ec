//! The virtio_vsock case, VMM side: a socket device whose host port 1234 is a program of the
//! bench's own (an echo for round trips, a reader for the stream), and the checks of a run.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::cases::VsockSetup;
use super::config_run::{ConfigRun, RunError, VirtioFigures};
use vmm::builder::VmBuilder;
use vmm::config::VsockConfig;
use vmm::devices::virtio::transport::VirtioPciDevice;
use vmm::devices::virtio::vsock::{SocketFile, Vsock};

/// The host port the guest connects to.
const PORT: u32 = 1234;
/// Bytes per iteration: a 64-byte round trip, or one 4 KiB packet of the stream.
pub const RR_BYTES: u64 = 64;
pub const STREAM_BYTES: u64 = 4096;

/// The host program behind port 1234, stopped and joined when the run ends.
pub struct HostProgram {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    port_path: PathBuf,
    _socket: SocketFile,
}

impl Drop for HostProgram {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.port_path);
    }
}

/// Serves one connection: echoes it (`echo`) or reads it, until EOF or `stop`.
fn serve(listener: UnixListener, echo: bool, stop: Arc<AtomicBool>) {
    let poll = Duration::from_millis(5);
    let mut conn: Option<UnixStream> = None;
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Acquire) {
        let Some(c) = conn.as_mut() else {
            match listener.accept() {
                Ok((c, _)) if c.set_read_timeout(Some(poll)).is_ok() => conn = Some(c),
                _ => std::thread::sleep(poll),
            }
            continue;
        };
        match c.read(&mut buf) {
            Ok(0) => return,
            Ok(n) if echo => {
                if c.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// A socket path of this run's own.
fn socket_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "exitless-bench-vsock-{}-{n}.sock",
        std::process::id()
    ))
}

/// Starts the host program and puts a socket device on the VM's PCI bus.
pub fn attach(
    builder: &mut VmBuilder,
    setup: &VsockSetup,
) -> Result<(Arc<VirtioPciDevice>, HostProgram), RunError> {
    let path = socket_path();
    let port_path = PathBuf::from(format!("{}_{PORT}", path.display()));
    let host_err =
        |e: std::io::Error| RunError::Device(format!("Cannot start the vsock host program: {e}"));
    let _ = std::fs::remove_file(&port_path);
    let listener = UnixListener::bind(&port_path).map_err(host_err)?;
    listener.set_nonblocking(true).map_err(host_err)?;
    let config = VsockConfig {
        cid: 3,
        socket: path,
        id: None,
    };
    let (device, socket) = Vsock::new(&config).map_err(|e| RunError::Device(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (echo, flag) = (!setup.stream, stop.clone());
    let thread = std::thread::Builder::new()
        .name("vsock-host".into())
        .spawn(move || serve(listener, echo, flag))
        .map_err(host_err)?;
    let program = HostProgram {
        stop,
        thread: Some(thread),
        port_path,
        _socket: socket,
    };
    let device = builder.add_virtio("virtio-vsock", Box::new(device), setup.notify)?;
    Ok((device, program))
}

/// The guest command line's part for `setup` but event idx (see bench-guest/virtio_vsock.c).
pub fn guest_args(setup: &VsockSetup) -> String {
    let mode = if setup.stream { "stream" } else { "rr" };
    format!(" port={PORT} mode={mode}")
}

/// Checks a run against the design: every byte of the guest's reached the host program over
/// one connection, nothing was reset or refused.
pub fn check(run: &mut ConfigRun, setup: &VsockSetup, f: &VirtioFigures) {
    let per = if setup.stream { STREAM_BYTES } else { RR_BYTES };
    let want = run.iterations * per;
    let sent = f.count("tx_bytes");
    if sent != want {
        run.problems.push(format!(
            "the device took {sent} bytes from the guest, expected {want}"
        ));
    }
    if !setup.stream && f.count("rx_bytes") != want {
        run.problems.push(format!(
            "the echo returned {} bytes, expected {want}",
            f.count("rx_bytes")
        ));
    }
    for name in ["resets", "refused", "bad_packets", "credit_overruns"] {
        if f.count(name) > 0 {
            run.problems
                .push(format!("{name}: {} (expected none)", f.count(name)));
        }
    }
}
