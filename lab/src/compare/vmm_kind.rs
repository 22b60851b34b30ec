//! The VMMs `compare` knows: their names on reports and the programs looked up for them.

use serde::Serialize;

/// A VMM that can boot the bench guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmmKind {
    Exitless,
    Qemu,
    Firecracker,
    CloudHypervisor,
    /// The floor VMM (lab/floor/floor.c, embedded): the least a KVM VMM must do to run the
    /// bench guest, the physical-limit row.
    Floor,
}

impl VmmKind {
    pub const PEERS: [VmmKind; 3] = [
        VmmKind::Qemu,
        VmmKind::Firecracker,
        VmmKind::CloudHypervisor,
    ];

    /// The name on reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            VmmKind::Exitless => "exitless",
            VmmKind::Qemu => "qemu",
            VmmKind::Firecracker => "firecracker",
            VmmKind::CloudHypervisor => "cloud-hypervisor",
            VmmKind::Floor => "floor",
        }
    }

    /// The executable looked up on PATH when no path is given.
    pub fn program(self) -> &'static str {
        match self {
            VmmKind::Exitless => "exitless",
            VmmKind::Qemu => "qemu-system-x86_64",
            VmmKind::Firecracker => "firecracker",
            VmmKind::CloudHypervisor => "cloud-hypervisor",
            VmmKind::Floor => "floor",
        }
    }
}
