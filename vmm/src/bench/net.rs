//! The virtio_net case, VMM side: a tap in a network namespace of its own (the frames the
//! guest sends reach that namespace's kernel and go no further), the card on it, and the
//! checks of a run.

use std::sync::Arc;

use super::cases::NetSetup;
use super::runner::{ConfigRun, RunError};
use super::virtio::VirtioFigures;
use crate::builder::VmBuilder;
use crate::devices::virtio::net::private_net::PrivateNet;
use crate::devices::virtio::net::{default_mac, Net};
use crate::devices::virtio::transport::VirtioPciDevice;

const TAP: &str = "exl-bench0";

/// The namespace the tap lives in, kept until the run ends (the tap goes with it).
pub struct PrivateTap {
    _net: PrivateNet,
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
    Ok((device, PrivateTap { _net: net }))
}

/// Checks a run against the design: every frame the guest sent reached the tap, none failed.
pub fn check(run: &mut ConfigRun, f: &VirtioFigures) {
    let n = run.iterations;
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
    use crate::bench::cases::CASES;
    use crate::bench::report::tests::run;

    #[test]
    fn frames_the_tap_did_not_take_are_problems() {
        let case = CASES.iter().position(|c| c.name == "virtio_net").unwrap();
        let mut r = run(case, 0, 1000.0, 0);
        let mut f = VirtioFigures {
            device: vec![("tx_frames", 100), ("tx_errors", 0)],
            ..VirtioFigures::default()
        };
        check(&mut r, &f);
        assert!(r.problems.is_empty(), "{:?}", r.problems);
        f.device = vec![("tx_frames", 97), ("tx_errors", 3)];
        check(&mut r, &f);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.problems[0].contains("took 97 frames"));
    }
}
