//! The host's side of the bench guest's `net=1` rounds: its frames on the tap echoed back,
//! and its vsock connections to host port 1234 echoed (held on demand).

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm::devices::virtio::net::private_net::{PacketSocket, PrivateNet};

/// The ethertype of the guest's frames.
const ETHERTYPE: u16 = 0x88b5;
/// The MAC the tests give the guest's card (`52:54:00:aa:bb:cd`).
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcd];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Stops a helper thread when dropped.
pub struct Stop(Arc<AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The host's end of tap `tap` in `net`: every frame of the guest's (ethertype 0x88b5, from
/// [`GUEST_MAC`]) echoed back to it; counts them.
pub fn echo_frames(net: &PrivateNet, tap: &str) -> (Stop, Arc<AtomicU64>) {
    let sock = net.run(|| PacketSocket::bind(tap, ETHERTYPE)).unwrap();
    let sock = sock.unwrap();
    let (stop, echoed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (done, count) = (stop.clone(), echoed.clone());
    std::thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            let Ok(f) = sock.recv(Duration::from_millis(100)) else {
                continue;
            };
            if f.len() < 14 || f[6..12] != GUEST_MAC {
                continue;
            }
            let mut back = GUEST_MAC.to_vec();
            back.extend_from_slice(&HOST_MAC);
            back.extend_from_slice(&f[12..]);
            if sock.send(&back).is_ok() {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (Stop(stop), echoed)
}

/// The host program on vsock port 1234 (`SOCKET_1234`): each connection's bytes echoed back,
/// but while `hold` is set the bytes are read and held (counted in `held`) until it is not.
#[derive(Clone, Default)]
pub struct VsockEcho {
    pub accepted: Arc<AtomicU64>,
    pub hold: Arc<AtomicBool>,
    pub held: Arc<AtomicU64>,
}

impl VsockEcho {
    pub fn start(socket: &Path) -> VsockEcho {
        let listener = UnixListener::bind(format!("{}_1234", socket.display())).unwrap();
        let echo = VsockEcho::default();
        let shared = echo.clone();
        std::thread::spawn(move || {
            for c in listener.incoming().map_while(Result::ok) {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                let each = shared.clone();
                std::thread::spawn(move || each.serve(c));
            }
        });
        echo
    }

    fn serve(&self, mut c: std::os::unix::net::UnixStream) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = c.read(&mut buf) {
            if n > 0 && self.hold.load(Ordering::Relaxed) {
                self.held.fetch_add(1, Ordering::Relaxed);
                while self.hold.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            if n == 0 || c.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }

    pub fn wait_held(&self) {
        let start = Instant::now();
        while self.held.load(Ordering::Relaxed) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no connection held"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
