//! The bench cases and the configurations each runs in.

use serde::Serialize;

use super::observer::RegsMode;
use vmm::config::IrqchipMode;
use vmm::device_manager::Notify;

/// What KVM is told about the bench target (port 0x7e0 / MMIO 0xd0000000) before the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Target {
    /// Nothing: accesses exit to userspace (the VMM's bus has no device there).
    Unclaimed,
    /// An ioeventfd of `len` bytes (0 = any length, "fast MMIO"), optionally with datamatch.
    Ioeventfd {
        pio: bool,
        len: u32,
        datamatch: bool,
    },
    /// A coalesced PIO or MMIO zone: writes are queued in a ring, drained on userspace exits.
    Coalesced { pio: bool },
}

/// The userspace exits a configuration must produce per iteration, checked after the run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Expect {
    /// Exactly one userspace exit per iteration.
    OnePerIteration,
    /// No userspace exit at all during the loop.
    None,
    /// At most this fraction of iterations exit to userspace (coalesced ring drains).
    AtMost(f64),
    /// Whatever this host does is reported, not judged (the textbook answer is in the note).
    Observe,
}

/// How a virtio_blk configuration drives its disk: the guest's choices (queue depth, MSI-X
/// or polling, event idx) and the VMM's (how a queue notification reaches the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlkSetup {
    pub queue_depth: u16,
    pub notify: Notify,
    /// Completions interrupt the guest through MSI-X (irqfd); else the guest polls the ring.
    pub msix: bool,
    pub event_idx: bool,
    /// The driver accepts FLUSH (writes cached, as before); else every write is write-through.
    pub flush: bool,
    /// The image is opened O_DIRECT (`direct=on`).
    pub direct: bool,
    /// Write-through by RWF_DSYNC on each write instead of group commit (to compare).
    pub dsync: bool,
    /// The disk served by qemu-storage-daemon through vhost-user-blk instead of exitless's
    /// own virtio-blk (guest memory shared with it).
    pub vhost_user: bool,
}

/// How a virtio_net configuration drives its card: frames to a tap in a private network
/// namespace, `queue_depth` queued at once, or (`rx`) frames the host floods the tap with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NetSetup {
    /// Bytes of each Ethernet frame (without the virtio-net header).
    pub frame: u16,
    /// The guest receives (the host floods the tap) instead of sending.
    pub rx: bool,
    pub queue_depth: u16,
    pub notify: Notify,
    pub event_idx: bool,
}

/// How a virtio_vsock configuration uses its one stream: 64-byte round trips with a host echo
/// program, or 4 KiB packets streamed to a host program that reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VsockSetup {
    pub stream: bool,
    pub notify: Notify,
    pub event_idx: bool,
}

/// How a virtio_fs configuration reads its shared file: 4 KiB FUSE READs at `queue_depth`
/// through virtio-fs served by virtiofsd (a vhost-user back end: the queues are its own, the
/// notifies reach it through KVM's ioeventfd and its interrupts the guest through an irqfd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FsSetup {
    pub queue_depth: u16,
    /// Completions interrupt the guest through MSI-X (irqfd); else the guest polls the ring.
    pub msix: bool,
    pub event_idx: bool,
}

/// The virtio device a configuration's guest drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum VirtioSetup {
    Blk(BlkSetup),
    Net(NetSetup),
    Vsock(VsockSetup),
    Fs(FsSetup),
}

impl VirtioSetup {
    /// Whether guest memory must be shared with another process (a vhost-user back end).
    pub fn shares_memory(&self) -> bool {
        matches!(self, VirtioSetup::Fs(_)) || matches!(self, VirtioSetup::Blk(b) if b.vhost_user)
    }

    /// Whether a vhost-user back end serves the queues (exitless counts none of their
    /// chains or interrupts).
    pub fn vhost_user(&self) -> bool {
        self.shares_memory()
    }
}

/// One way of running a case.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CaseConfig {
    pub name: &'static str,
    /// The guest loop (bench-guest/bench.c) this configuration runs.
    pub guest_case: &'static str,
    pub irqchip: IrqchipMode,
    pub target: Target,
    pub regs: RegsMode,
    pub expect: Expect,
    /// Every guest interrupt handler must run once per iteration (self-IPI cases).
    pub expect_ipis: bool,
    /// What a VT-x/SVM host would do, reported when this host differs.
    pub textbook: Option<&'static str>,
    /// Whether the exit profiler records every exit (off only to measure its own cost).
    pub profiling: bool,
    /// A virtio device for the guest's driver (the virtio cases).
    pub virtio: Option<VirtioSetup>,
}

/// A case: an exit kind and its configurations; the first configuration is the baseline.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BenchCase {
    pub name: &'static str,
    pub what: &'static str,
    pub configs: &'static [CaseConfig],
    /// Rounds over all configurations, interleaved; the median run of each is kept (more than
    /// one where configurations differ by less than run-to-run noise).
    pub rounds: usize,
}

const fn cfg(
    name: &'static str,
    guest_case: &'static str,
    target: Target,
    expect: Expect,
) -> CaseConfig {
    CaseConfig {
        name,
        guest_case,
        irqchip: IrqchipMode::Kernel,
        target,
        regs: RegsMode::SyncRegs,
        expect,
        expect_ipis: false,
        textbook: None,
        profiling: true,
        virtio: None,
    }
}

const fn blk(
    name: &'static str,
    queue_depth: u16,
    notify: Notify,
    msix: bool,
    event_idx: bool,
    expect: Expect,
) -> CaseConfig {
    let mut c = cfg(name, "virtio_blk", Target::Unclaimed, expect);
    c.virtio = Some(VirtioSetup::Blk(BlkSetup {
        queue_depth,
        notify,
        msix,
        event_idx,
        flush: true,
        direct: false,
        dsync: false,
        vhost_user: false,
    }));
    c
}

/// A virtio_blk configuration on qemu-storage-daemon's vhost-user-blk.
const fn blk_vhost_user(name: &'static str, queue_depth: u16) -> CaseConfig {
    let mut c = blk(
        name,
        queue_depth,
        Notify::Ioeventfd,
        true,
        true,
        Expect::None,
    );
    if let Some(VirtioSetup::Blk(mut s)) = c.virtio {
        s.vhost_user = true;
        c.virtio = Some(VirtioSetup::Blk(s));
    }
    c
}

/// A virtio_blk configuration with its durability: FLUSH accepted or not, O_DIRECT or not.
const fn blk_durable(
    name: &'static str,
    queue_depth: u16,
    flush: bool,
    direct: bool,
    dsync: bool,
) -> CaseConfig {
    let mut c = blk(
        name,
        queue_depth,
        Notify::Ioeventfd,
        true,
        true,
        Expect::None,
    );
    c.virtio = Some(VirtioSetup::Blk(BlkSetup {
        queue_depth,
        notify: Notify::Ioeventfd,
        msix: true,
        event_idx: true,
        flush,
        direct,
        dsync,
        vhost_user: false,
    }));
    c
}

const fn net(
    name: &'static str,
    frame: u16,
    queue_depth: u16,
    notify: Notify,
    event_idx: bool,
    expect: Expect,
) -> CaseConfig {
    let mut c = cfg(name, "virtio_net", Target::Unclaimed, expect);
    c.virtio = Some(VirtioSetup::Net(NetSetup {
        frame,
        rx: false,
        queue_depth,
        notify,
        event_idx,
    }));
    c
}

const fn net_rx(name: &'static str, frame: u16, event_idx: bool) -> CaseConfig {
    let mut c = net(name, frame, 1, Notify::Ioeventfd, event_idx, Expect::None);
    if let Some(VirtioSetup::Net(ref mut s)) = c.virtio {
        s.rx = true;
    }
    c
}

const fn vsock(
    name: &'static str,
    stream: bool,
    notify: Notify,
    event_idx: bool,
    expect: Expect,
) -> CaseConfig {
    let mut c = cfg(name, "virtio_vsock", Target::Unclaimed, expect);
    c.virtio = Some(VirtioSetup::Vsock(VsockSetup {
        stream,
        notify,
        event_idx,
    }));
    c
}

const fn fs(name: &'static str, queue_depth: u16, msix: bool) -> CaseConfig {
    let mut c = cfg(name, "virtio_fs", Target::Unclaimed, Expect::None);
    c.virtio = Some(VirtioSetup::Fs(FsSetup {
        queue_depth,
        msix,
        event_idx: true,
    }));
    c
}

const fn with_irqchip(mut c: CaseConfig, irqchip: IrqchipMode) -> CaseConfig {
    c.irqchip = irqchip;
    c
}

const fn with_regs(mut c: CaseConfig, regs: RegsMode) -> CaseConfig {
    c.regs = regs;
    c
}

const fn with_ipis(mut c: CaseConfig) -> CaseConfig {
    c.expect_ipis = true;
    c
}

const fn without_profiling(mut c: CaseConfig) -> CaseConfig {
    c.profiling = false;
    c
}

const fn with_textbook(mut c: CaseConfig, note: &'static str) -> CaseConfig {
    c.textbook = Some(note);
    c
}

use Expect::{AtMost, None as NoExit, Observe, OnePerIteration as One};
use Target::{Coalesced, Ioeventfd, Unclaimed};

const RING_FRACTION: f64 = 0.05;

/// Every case, in the order they run.
pub const CASES: &[BenchCase] = &[
    BenchCase {
        name: "cpuid",
        what: "cpuid leaf 0 at CPL0, answered inside KVM (CPL3 cpuid never reaches KVM on PVM)",
        rounds: 1,
        configs: &[cfg("in-kernel", "cpuid", Unclaimed, NoExit)],
    },
    BenchCase {
        name: "hypercall",
        what: "vmcall KVM_HC_VAPIC_POLL_IRQ at CPL0, with KVM_X86_QUIRK_FIX_HYPERCALL_INSN disabled",
        rounds: 1,
        configs: &[cfg("in-kernel", "hypercall", Unclaimed, NoExit)],
    },
    BenchCase {
        name: "msr_read",
        what: "rdmsr MSR_KERNEL_GS_BASE at CPL0, handled inside KVM",
        rounds: 1,
        configs: &[cfg("in-kernel", "msr_read", Unclaimed, NoExit)],
    },
    BenchCase {
        name: "msr_write",
        what: "wrmsr MSR_KERNEL_GS_BASE at CPL0, handled inside KVM",
        rounds: 1,
        configs: &[cfg("in-kernel", "msr_write", Unclaimed, NoExit)],
    },
    BenchCase {
        name: "pio_out",
        what: "4-byte OUT to port 0x7e0 at CPL3 (TSS I/O bitmap)",
        rounds: 1,
        configs: &[
            cfg("userspace", "pio_out", Unclaimed, One),
            cfg("ioeventfd", "pio_out", Ioeventfd { pio: true, len: 4, datamatch: false }, NoExit),
            cfg("ioeventfd-datamatch", "pio_out", Ioeventfd { pio: true, len: 4, datamatch: true }, NoExit),
            cfg("coalesced-pio", "pio_out", Coalesced { pio: true }, AtMost(RING_FRACTION)),
        ],
    },
    BenchCase {
        name: "pio_in",
        what: "4-byte IN from port 0x7e0 at CPL3: reads always reach the device model",
        rounds: 1,
        configs: &[cfg("userspace", "pio_in", Unclaimed, One)],
    },
    BenchCase {
        name: "mmio_write",
        what: "4-byte store to 0xd0000000 (no memory slot) at CPL3",
        rounds: 1,
        configs: &[
            cfg("userspace", "mmio_write", Unclaimed, One),
            cfg("ioeventfd", "mmio_write", Ioeventfd { pio: false, len: 4, datamatch: false }, NoExit),
            cfg("ioeventfd-datamatch", "mmio_write", Ioeventfd { pio: false, len: 4, datamatch: true }, NoExit),
            cfg("fast-mmio", "mmio_write", Ioeventfd { pio: false, len: 0, datamatch: false }, NoExit),
            cfg("coalesced-mmio", "mmio_write", Coalesced { pio: false }, AtMost(RING_FRACTION)),
        ],
    },
    BenchCase {
        name: "mmio_read",
        what: "4-byte load from 0xd0000000 at CPL3: reads always reach the device model",
        rounds: 1,
        configs: &[cfg("userspace", "mmio_read", Unclaimed, One)],
    },
    BenchCase {
        name: "cr8",
        what: "mov to CR8 (TPR), alternating 1 and 0, at CPL0",
        rounds: 1,
        configs: &[
            cfg("in-kernel-lapic", "cr8", Unclaimed, NoExit),
            with_textbook(
                with_irqchip(cfg("no-irqchip", "cr8", Unclaimed, Observe), IrqchipMode::None),
                "VT-x/SVM with a userspace LAPIC exit to userspace (KVM_EXIT_SET_TPR) when the TPR drops below the threshold",
            ),
        ],
    },
    BenchCase {
        name: "hlt",
        what: "hlt at CPL0: to userspace without an irqchip; woken at once in the kernel by a pending self-IPI with one",
        rounds: 1,
        configs: &[
            with_irqchip(cfg("no-irqchip", "hlt", Unclaimed, One), IrqchipMode::None),
            with_ipis(cfg("in-kernel-lapic", "hlt_ipi", Unclaimed, NoExit)),
        ],
    },
    BenchCase {
        name: "self_ipi",
        what: "self-IPI through the xAPIC ICR, handler and EOI, at CPL0 (in-kernel LAPIC)",
        rounds: 1,
        configs: &[with_ipis(cfg("in-kernel-lapic", "self_ipi", Unclaimed, NoExit))],
    },
    BenchCase {
        name: "virtio_blk",
        what: "4 KiB random reads and writes (half each) through the guest's own virtio-pci driver at CPL3, to a disk file in the host page cache (write-through: the driver does not accept FLUSH, each write durable; direct: the file opened O_DIRECT)",
        rounds: 3,
        configs: &[
            blk("qd1", 1, Notify::Ioeventfd, true, true, NoExit),
            blk("qd32", 32, Notify::Ioeventfd, true, true, NoExit),
            blk("qd32-no-event-idx", 32, Notify::Ioeventfd, true, false, NoExit),
            blk("qd32-polled", 32, Notify::Ioeventfd, false, true, NoExit),
            blk("qd1-notify-exits", 1, Notify::MmioExit, true, true, One),
            blk("qd32-notify-exits", 32, Notify::MmioExit, true, true, AtMost(1.0)),
            blk_durable("qd1-write-through", 1, false, false, false),
            blk_durable("qd32-write-through", 32, false, false, false),
            blk_durable("qd32-write-through-dsync", 32, false, false, true),
            blk_durable("qd32-direct", 32, true, true, false),
            blk_durable("qd32-direct-write-through", 32, false, true, false),
            blk_durable("qd32-direct-write-through-dsync", 32, false, true, true),
        ],
    },
    BenchCase {
        name: "virtio_net",
        what: "Ethernet frames sent by the guest's own virtio-pci driver at CPL3 to a tap in a private network namespace (the host kernel takes and drops them), 32 queued at once unless said; -rx: frames a host thread floods the tap with, received by the guest into 64 buffers",
        rounds: 3,
        configs: &[
            net("64B", 64, 32, Notify::Ioeventfd, true, NoExit),
            net("1500B", 1500, 32, Notify::Ioeventfd, true, NoExit),
            net("64B-qd1", 64, 1, Notify::Ioeventfd, true, NoExit),
            net("64B-no-event-idx", 64, 32, Notify::Ioeventfd, false, NoExit),
            net("64B-notify-exits", 64, 32, Notify::MmioExit, true, AtMost(1.0)),
            net_rx("64B-rx", 64, true),
            net_rx("1500B-rx", 1500, true),
            net_rx("64B-rx-no-event-idx", 64, false),
        ],
    },
    BenchCase {
        name: "virtio_vsock",
        what: "One vsock stream from the guest's own driver at CPL3 to a host program on a Unix socket (hybrid vsock): 64-byte round trips with an echo, or 4 KiB packets streamed to a reader",
        rounds: 3,
        configs: &[
            vsock("rr-64B", false, Notify::Ioeventfd, true, NoExit),
            vsock("stream-4KiB", true, Notify::Ioeventfd, true, NoExit),
            vsock("rr-64B-no-event-idx", false, Notify::Ioeventfd, false, NoExit),
            vsock("rr-64B-notify-exits", false, Notify::MmioExit, true, AtMost(2.0)),
        ],
    },
    BenchCase {
        name: "vhost_user_blk",
        what: "the virtio_blk loop (4 KiB random reads and writes, the guest's own virtio-blk driver at CPL3) on qemu-storage-daemon's vhost-user-blk export of a 16 MiB file (shared guest memory): kick through KVM's ioeventfd to the daemon, its completion through an irqfd, no exit to exitless (needs qemu-storage-daemon)",
        rounds: 3,
        configs: &[blk_vhost_user("qd1", 1), blk_vhost_user("qd32", 32)],
    },
    BenchCase {
        name: "virtio_fs",
        what: "4 KiB FUSE READs at random offsets of a 16 MiB file, through the guest's own virtio-fs driver at CPL3 to virtiofsd (vhost-user, shared guest memory): the notify reaches virtiofsd through KVM's ioeventfd and its completion the guest through an irqfd, so neither a vCPU exit nor exitless's devices thread is on the path (needs root and virtiofsd)",
        rounds: 3,
        configs: &[
            fs("qd1", 1, true),
            fs("qd32", 32, true),
            fs("qd32-polled", 32, false),
        ],
    },
    BenchCase {
        name: "regs",
        what: "OUT to an unclaimed port at CPL0; the VMM reads RIP/RAX on every exit (or not at all)",
        rounds: 5,
        configs: &[
            with_regs(cfg("no-regs", "pio_out_cpl0", Unclaimed, One), RegsMode::None),
            cfg("sync-regs", "pio_out_cpl0", Unclaimed, One),
            with_regs(cfg("get-regs", "pio_out_cpl0", Unclaimed, One), RegsMode::GetRegs),
            with_regs(cfg("get-set-regs", "pio_out_cpl0", Unclaimed, One), RegsMode::GetSetRegs),
        ],
    },
    BenchCase {
        name: "profiler",
        what: "OUT to an unclaimed port at CPL3 with the exit profiler recording every exit vs off",
        rounds: 15,
        configs: &[
            cfg("profiler-on", "pio_out", Unclaimed, One),
            without_profiling(cfg("profiler-off", "pio_out", Unclaimed, One)),
        ],
    },
];

/// Finds a case by name.
pub fn find(name: &str) -> Option<&'static BenchCase> {
    CASES.iter().find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_are_unique_and_every_case_has_a_baseline() {
        for (i, c) in CASES.iter().enumerate() {
            assert!(!c.configs.is_empty(), "{} has no configuration", c.name);
            assert!(CASES[i + 1..].iter().all(|d| d.name != c.name));
        }
    }

    #[test]
    fn receive_configurations_say_so() {
        let net = find("virtio_net").unwrap();
        for c in net.configs {
            let Some(VirtioSetup::Net(s)) = c.virtio else {
                panic!("{} has a card", c.name);
            };
            assert_eq!(s.rx, c.name.contains("-rx"), "{}", c.name);
        }
    }

    #[test]
    fn guest_cases_exist_in_the_guest_source() {
        let src = include_str!("../../../bench-guest/bench.c");
        for c in CASES.iter().flat_map(|c| c.configs) {
            assert!(
                src.contains(&format!("{{\"{}\",", c.guest_case)),
                "{}",
                c.guest_case
            );
        }
    }
}
