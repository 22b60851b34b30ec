//! The virtio_net case, VMM side: a tap in a network namespace of its own (the frames the
//! guest sends reach that namespace's kernel and go no further), the card on it, and the
//! checks of a run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::cases::NetSetup;
use super::config_run::{ConfigRun, RunError, VirtioFigures};
use vmm::builder::VmBuilder;
use vmm::devices::virtio::net::private_net::{PacketSocket, PrivateNet};
use vmm::devices::virtio::net::{default_mac, Net};
use vmm::devices::virtio::transport::VirtioPciDevice;

const TAP: &str = "exl-bench0";
/// The ethertype of the frames the host floods the guest with (local experimental).
const ETHERTYPE: u16 = 0x88b5;

/// The namespace the tap lives in, kept until the run ends (the tap goes with it), and the
/// thread flooding the tap for a receive configuration (stopped and joined at the end).
pub struct PrivateTap {
    _net: PrivateNet,
    stop: Arc<AtomicBool>,
    flood: Option<JoinHandle<()>>,
}

impl Drop for PrivateTap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.flood.take() {
            let _ = t.join();
        }
    }
}

/// Sends `frame`-byte frames to everyone on the tap until `stop` (the kernel queues them for
/// the tap's reader, exitless, and drops what does not fit).
fn flood(socket: PacketSocket, frame: u16, stop: Arc<AtomicBool>) {
    let mut f = vec![0xffu8; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f.resize(usize::from(frame).max(60), 0x77);
    while !stop.load(Ordering::Acquire) {
        if socket.send(&f).is_err() {
            std::thread::yield_now();
        }
    }
}

/// The guest command line's part for `setup` but event idx (see bench-guest/virtio_net.c).
pub fn guest_args(setup: &NetSetup) -> String {
    let dir = if setup.rx { " dir=rx" } else { "" };
    format!(" frame={} qd={}{dir}", setup.frame, setup.queue_depth)
}

/// Makes the namespace and the tap, and puts a virtio-net card on it on the VM's PCI bus.
pub fn attach(
    builder: &mut VmBuilder,
    setup: &NetSetup,
) -> Result<(Arc<VirtioPciDevice>, PrivateTap), RunError> {
    let unavailable = |e: std::io::Error| {
        RunError::Unavailable(format!(
            "a tap in a private network namespace needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN): {e}"
        ))
    };
    let net = PrivateNet::create().map_err(unavailable)?;
    let tap = net.add_tap(TAP).map_err(unavailable)?;
    let card = Net::with_tap(tap, default_mac(TAP));
    let device = builder.add_virtio("virtio-net", Box::new(card), setup.notify)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flood = if setup.rx {
        let socket = net
            .run(|| PacketSocket::bind(TAP, ETHERTYPE))
            .and_then(|s| s)
            .map_err(unavailable)?;
        let (frame, flag) = (setup.frame, stop.clone());
        let thread = std::thread::Builder::new()
            .name("net-flood".into())
            .spawn(move || flood(socket, frame, flag))
            .map_err(unavailable)?;
        Some(thread)
    } else {
        None
    };
    let tap = PrivateTap {
        _net: net,
        stop,
        flood,
    };
    Ok((device, tap))
}

/// Checks a run against the design: every frame the guest sent reached the tap, none failed;
/// or, receiving, the device delivered at least the frames the guest counted (what the flood
/// brought beyond the guest's buffers waits in the tap, or the kernel drops it; a frame no
/// buffer could hold is dropped, counted and said).
pub fn check(run: &mut ConfigRun, setup: &NetSetup, f: &VirtioFigures) {
    let n = run.iterations;
    if setup.rx {
        let delivered = f.count("rx_frames");
        if delivered < n {
            run.problems.push(format!(
                "the device delivered {delivered} frames, the guest counted {n}"
            ));
        }
        let dropped = f.count("rx_dropped");
        if dropped > 0 {
            run.observations.push(format!(
                "{dropped} frames fitted no receive buffer (dropped and counted)"
            ));
        }
        return;
    }
    let sent = f.count("tx_frames");
    if sent != n {
        run.problems
            .push(format!("the tap took {sent} frames, the guest sent {n}"));
    }
    let errors = f.count("tx_errors");
    if errors > 0 {
        run.problems
            .push(format!("the tap refused {errors} of {n} frames"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cases::{VirtioSetup, CASES};
    use crate::bench::report::tests::run;

    #[test]
    fn frames_the_tap_did_not_take_are_problems() {
        let case = CASES.iter().position(|c| c.name == "virtio_net").unwrap();
        let mut r = run(case, 0, 1000.0, 0);
        let Some(VirtioSetup::Net(tx)) = CASES[case].configs[0].virtio else {
            panic!("the first virtio_net configuration has a card");
        };
        let mut f = VirtioFigures {
            device: vec![("tx_frames", 100), ("tx_errors", 0)],
            ..VirtioFigures::default()
        };
        check(&mut r, &tx, &f);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        f.device = vec![("tx_frames", 97), ("tx_errors", 3)];
        check(&mut r, &tx, &f);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.problems[0].contains("took 97 frames"));
        // Receiving: fewer frames delivered than counted is a problem; drops are said.
        let rx = NetSetup { rx: true, ..tx };
        let mut r = run(case, 0, 1000.0, 0);
        f.device = vec![("rx_frames", 150), ("rx_dropped", 40)];
        check(&mut r, &rx, &f);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        assert!(r.observations[0].contains("40 frames fitted no receive buffer"));
        f.device = vec![("rx_frames", 99), ("rx_dropped", 0)];
        check(&mut r, &rx, &f);
        assert!(
            r.problems[0].contains("delivered 99 frames"),
            "{:?}",
            r.problems
        );
    }
}
