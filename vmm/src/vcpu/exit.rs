//! Exit dispatch as a pure function: a KVM exit in, what the vCPU loop should do out.

use std::io;

use kvm_ioctls::VcpuExit;

pub use crate::bus::Buses;
use crate::bus::{Bus, DeviceEvent};
use crate::kvm::ring::CoalescedWrite;
use crate::profile::ExitReason;

/// How a guest (or KVM) ended the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum VmEnd {
    /// The guest powered off with a status (exit port or ACPI-style shutdown).
    PowerOff(u32),
    /// The guest asked for a reset (i8042, triple fault reboot request).
    Reset,
    /// KVM_EXIT_SHUTDOWN: a triple fault.
    TripleFault,
    /// KVM_EXIT_SYSTEM_EVENT of the given type.
    SystemEvent(u32),
    /// KVM could not run the guest (internal error or failed entry).
    KvmFailure(u64),
    /// The VMM stopped the vCPU (Ctrl-C, timeout, another vCPU ended the VM).
    Stopped,
}

/// What the vCPU loop does after an exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitAction {
    Resume,
    /// Show the exit to the vCPU's observer, then resume ([`DeviceEvent::Observe`]).
    Observe(u32),
    End(VmEnd),
}

/// One handled exit: its reason, the device that took it (id on its bus), the action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    pub reason: ExitReason,
    pub device: Option<usize>,
    pub action: ExitAction,
    /// An exit exitless does not handle (reason `Other`): counted, the first of each kind
    /// logged by the vCPU, and the VM ended where resuming would only repeat it.
    pub unhandled: Option<UnhandledExit>,
    /// The port or guest-physical address of an I/O or MMIO exit.
    pub addr: u64,
}

/// A KVM exit kind exitless has no handler for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnhandledExit {
    /// A kind kvm-ioctls knows by name.
    Named(&'static str),
    /// An exit reason number kvm-ioctls does not know.
    Code(u32),
}

impl std::fmt::Display for UnhandledExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnhandledExit::Named(name) => write!(f, "{name}"),
            UnhandledExit::Code(code) => write!(f, "KVM exit reason {code}"),
        }
    }
}

impl UnhandledExit {
    /// Whether resuming the guest would only give the same exit again: the instruction did
    /// not complete (an exception or an unknown hardware exit KVM could not handle, a guest
    /// access to memory KVM cannot back), so the VM is ended instead of spinning.
    pub fn repeats(self) -> bool {
        matches!(
            self,
            UnhandledExit::Named("KVM_EXIT_UNKNOWN")
                | UnhandledExit::Named("KVM_EXIT_EXCEPTION")
                | UnhandledExit::Named("KVM_EXIT_MEMORY_FAULT")
                | UnhandledExit::Code(_)
        )
    }

    fn of(exit: &VcpuExit<'_>) -> Self {
        use UnhandledExit::Named;
        match exit {
            VcpuExit::Unknown => Named("KVM_EXIT_UNKNOWN"),
            VcpuExit::Exception => Named("KVM_EXIT_EXCEPTION"),
            VcpuExit::Hypercall(_) => Named("KVM_EXIT_HYPERCALL"),
            VcpuExit::Debug(_) => Named("KVM_EXIT_DEBUG"),
            VcpuExit::SetTpr => Named("KVM_EXIT_SET_TPR"),
            VcpuExit::TprAccess => Named("KVM_EXIT_TPR_ACCESS"),
            VcpuExit::Nmi => Named("KVM_EXIT_NMI"),
            VcpuExit::IoapicEoi(_) => Named("KVM_EXIT_IOAPIC_EOI"),
            VcpuExit::Hyperv => Named("KVM_EXIT_HYPERV"),
            VcpuExit::X86Rdmsr(_) => Named("KVM_EXIT_X86_RDMSR"),
            VcpuExit::X86Wrmsr(_) => Named("KVM_EXIT_X86_WRMSR"),
            VcpuExit::MemoryFault { .. } => Named("KVM_EXIT_MEMORY_FAULT"),
            VcpuExit::Unsupported(code) => UnhandledExit::Code(*code),
            _ => Named("another KVM exit"),
        }
    }
}

const SYSTEM_EVENT_SHUTDOWN: u32 = kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN;
const SYSTEM_EVENT_RESET: u32 = kvm_bindings::KVM_SYSTEM_EVENT_RESET;

fn event_action(event: DeviceEvent) -> ExitAction {
    match event {
        DeviceEvent::None => ExitAction::Resume,
        DeviceEvent::Observe(v) => ExitAction::Observe(v),
        DeviceEvent::Reset => ExitAction::End(VmEnd::Reset),
        DeviceEvent::Shutdown(s) => ExitAction::End(VmEnd::PowerOff(s)),
    }
}

fn write(bus: &Bus, reason: ExitReason, addr: u64, data: &[u8]) -> io::Result<Handled> {
    let (device, action) = match bus.write(addr, data)? {
        Some((i, ev)) => (Some(i), event_action(ev)),
        None => (None, ExitAction::Resume),
    };
    Ok(Handled {
        device,
        addr,
        ..handled(reason, action)
    })
}

fn handled(reason: ExitReason, action: ExitAction) -> Handled {
    Handled {
        reason,
        device: None,
        action,
        unhandled: None,
        addr: 0,
    }
}

fn not_handled(exit: &VcpuExit<'_>) -> Handled {
    let kind = UnhandledExit::of(exit);
    let action = if kind.repeats() {
        ExitAction::End(VmEnd::KvmFailure(0))
    } else {
        ExitAction::Resume
    };
    Handled {
        unhandled: Some(kind),
        ..handled(ExitReason::Other, action)
    }
}

/// Ports guests probe for legacy PC hardware that a microVM does not have: accesses to them
/// are normal and not worth a message (they are still counted in the profile).
pub fn is_known_probe_port(port: u64) -> bool {
    matches!(
        port,
        0x70..=0x71        // CMOS RTC and NMI mask
            | 0x80         // POST code port, Linux's I/O delay
            | 0x87 | 0xed  // other delay ports
            | 0x92         // A20 gate
            | 0xf0..=0xf1  // FPU error
            | 0x2e8..=0x2ef | 0x2f8..=0x2ff | 0x3e8..=0x3ef // COM2-4
            | 0x278..=0x27f | 0x378..=0x37f // parallel ports
            | 0x3b0..=0x3df // VGA
            | 0x4d0..=0x4d1 // ELCR
            | 0xcf8..=0xcff // PCI configuration, when no PCI bus is present
    )
}

/// Dispatches one exit to the buses. `Err` only for host failures (a device could not write its
/// output); everything the guest does wrong is a counted, resumable exit.
///
/// Laid out for the exit path: the port accesses are compared for here, the MMIO accesses in a
/// function of their own beside it, every other exit in a cold one. A `match` over every kind
/// compiles to a jump table, a page of `.rodata` away from this code, which each exit would
/// touch (issue 42, docs/performance.md "The p50 at the floor").
#[link_section = ".text.hot.exitless_exit_path"]
pub fn handle_exit(buses: &Buses, exit: VcpuExit<'_>) -> io::Result<Handled> {
    use ExitReason as R;
    match exit {
        VcpuExit::IoOut(port, data) => write(&buses.pio, R::IoOut, port.into(), data),
        VcpuExit::IoIn(port, data) => Ok(Handled {
            device: buses.pio.read(port.into(), data),
            addr: port.into(),
            ..handled(R::IoIn, ExitAction::Resume)
        }),
        other => handle_mmio(buses, other),
    }
}

/// The MMIO accesses, every other exit passed on to [`handle_rare`].
#[inline(never)]
#[link_section = ".text.hot.exitless_exit_path.warm"]
fn handle_mmio(buses: &Buses, exit: VcpuExit<'_>) -> io::Result<Handled> {
    use ExitReason as R;
    match exit {
        VcpuExit::MmioWrite(addr, data) => write(&buses.mmio, R::MmioWrite, addr, data),
        VcpuExit::MmioRead(addr, data) => Ok(Handled {
            device: buses.mmio.read(addr, data),
            addr,
            ..handled(R::MmioRead, ExitAction::Resume)
        }),
        other => Ok(handle_rare(other)),
    }
}

/// Every exit but an access: a halt, the VM's end, an exit exitless does not handle.
#[cold]
#[inline(never)]
fn handle_rare(exit: VcpuExit<'_>) -> Handled {
    use ExitReason as R;
    match exit {
        VcpuExit::Hlt => handled(R::Hlt, ExitAction::Resume),
        VcpuExit::IrqWindowOpen => handled(R::IrqWindowOpen, ExitAction::Resume),
        VcpuExit::Shutdown => handled(R::Shutdown, ExitAction::End(VmEnd::TripleFault)),
        VcpuExit::SystemEvent(kind, _) => {
            let end = match kind {
                SYSTEM_EVENT_SHUTDOWN => VmEnd::PowerOff(0),
                SYSTEM_EVENT_RESET => VmEnd::Reset,
                other => VmEnd::SystemEvent(other),
            };
            handled(R::SystemEvent, ExitAction::End(end))
        }
        VcpuExit::InternalError => handled(R::InternalError, ExitAction::End(VmEnd::KvmFailure(0))),
        VcpuExit::FailEntry(reason, _) => {
            handled(R::FailEntry, ExitAction::End(VmEnd::KvmFailure(reason)))
        }
        // The vCPU harvests its own ring after the exit (`Vcpu::after_exit`), then resumes.
        VcpuExit::Unsupported(kvm_bindings::KVM_EXIT_DIRTY_RING_FULL) => {
            handled(R::DirtyRingFull, ExitAction::Resume)
        }
        other => not_handled(&other),
    }
}

/// Handles one return from KVM_RUN in the guest's program order: the writes it queued in
/// coalesced zones before this exit reach their devices first, oldest first, then the exit
/// itself (`None`: KVM_RUN was interrupted by a kick). `delivered` sees each queued write with
/// the index of the device that took it. A queued write that ends the VM (a power-off or reset
/// register behind a coalesced zone) decides the action, since the guest made it first. The
/// vCPU loop calls it whenever a ring is mapped.
///
/// One of the lab's entry points: the fuzz targets drive the exit dispatch with it.
#[link_section = ".text.hot.exitless_exit_path.warm"]
pub fn dispatch(
    buses: &Buses,
    queued: impl Iterator<Item = CoalescedWrite>,
    exit: Option<VcpuExit<'_>>,
    mut delivered: impl FnMut(&CoalescedWrite, Option<usize>),
) -> io::Result<Handled> {
    let mut ended = None;
    for write in queued {
        let bus = if write.pio { &buses.pio } else { &buses.mmio };
        let taken = bus.write(write.addr, write.data())?;
        delivered(&write, taken.map(|(index, _)| index));
        if let Some(ExitAction::End(end)) = taken.map(|(_, event)| event_action(event)) {
            ended.get_or_insert(end);
        }
    }
    let mut handled = match exit {
        Some(exit) => handle_exit(buses, exit)?,
        None => handled(ExitReason::Intr, ExitAction::Resume),
    };
    if let Some(end) = ended {
        handled.action = ExitAction::End(end);
    }
    Ok(handled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::{BusBuilder, BusDevice, MutBusDevice};
    use std::sync::{Arc, Mutex};

    /// A fake device: reads return its offset, writes of 0xff ask for shutdown, 0xee to be
    /// observed.
    struct Fake;

    impl BusDevice for Fake {
        fn read(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8 + 1);
        }
        fn write(&self, _offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
            Ok(match data[0] {
                0xff => DeviceEvent::Shutdown(7),
                0xee => DeviceEvent::Observe(2),
                0xdd => return Err(io::Error::other("sink closed")),
                _ => DeviceEvent::None,
            })
        }
    }

    fn buses() -> Buses {
        let mut pio = BusBuilder::new();
        pio.insert("fake", 0x3f8, 8, Arc::new(Fake)).unwrap();
        let mut mmio = BusBuilder::new();
        mmio.insert("fake-mmio", 0xd000_0000, 0x1000, Arc::new(Fake))
            .unwrap();
        Buses {
            pio: pio.freeze(),
            mmio: mmio.freeze(),
        }
    }

    #[test]
    fn pio_write_reaches_device_and_maps_events() {
        let b = buses();
        let h = handle_exit(&b, VcpuExit::IoOut(0x3f8, &[1])).unwrap();
        assert_eq!(
            (h.reason, h.device, h.action, h.unhandled),
            (ExitReason::IoOut, Some(0), ExitAction::Resume, None)
        );
        let h = handle_exit(&b, VcpuExit::IoOut(0x3f9, &[0xff])).unwrap();
        assert_eq!(h.action, ExitAction::End(VmEnd::PowerOff(7)));
        let h = handle_exit(&b, VcpuExit::IoOut(0x3f9, &[0xee])).unwrap();
        assert_eq!(h.action, ExitAction::Observe(2));
    }

    #[test]
    fn unmapped_accesses_resume_with_no_device_and_read_all_ones() {
        let b = buses();
        let h = handle_exit(&b, VcpuExit::IoOut(0x80, &[1])).unwrap();
        assert_eq!((h.device, h.action), (None, ExitAction::Resume));
        let mut data = [0u8; 4];
        let h = handle_exit(&b, VcpuExit::MmioRead(0xc000_0000, &mut data)).unwrap();
        assert_eq!((h.reason, h.device), (ExitReason::MmioRead, None));
        assert_eq!(data, [0xff; 4]);
    }

    #[test]
    fn reads_are_filled_by_the_device() {
        let b = buses();
        let mut data = [0u8; 1];
        let h = handle_exit(&b, VcpuExit::IoIn(0x3fd, &mut data)).unwrap();
        assert_eq!(
            (h.reason, h.device, data[0]),
            (ExitReason::IoIn, Some(0), 6)
        );
        let mut data = [0u8; 2];
        handle_exit(&b, VcpuExit::MmioRead(0xd000_0010, &mut data)).unwrap();
        assert_eq!(data, [0x11, 0x11]);
    }

    #[test]
    fn unhandled_exits_are_named_and_end_the_vm_only_where_resuming_would_repeat_them() {
        let b = buses();
        let h = handle_exit(&b, VcpuExit::IoapicEoi(0x30)).unwrap();
        assert_eq!(
            (h.reason, h.action),
            (ExitReason::Other, ExitAction::Resume)
        );
        assert_eq!(
            h.unhandled,
            Some(UnhandledExit::Named("KVM_EXIT_IOAPIC_EOI"))
        );
        for spins in [
            VcpuExit::Exception,
            VcpuExit::Unknown,
            VcpuExit::Unsupported(77),
        ] {
            let h = handle_exit(&b, spins).unwrap();
            assert_eq!(h.action, ExitAction::End(VmEnd::KvmFailure(0)), "{h:?}");
        }
        let h = handle_exit(&b, VcpuExit::Unsupported(77)).unwrap();
        assert_eq!(h.unhandled.unwrap().to_string(), "KVM exit reason 77");
    }

    #[test]
    fn exits_carry_their_port_or_address() {
        let b = buses();
        assert_eq!(
            handle_exit(&b, VcpuExit::IoOut(0x80, &[1])).unwrap().addr,
            0x80
        );
        let mut d = [0u8; 4];
        let h = handle_exit(&b, VcpuExit::MmioRead(0xfed0_0000, &mut d)).unwrap();
        assert_eq!((h.addr, h.device), (0xfed0_0000, None));
        assert!(is_known_probe_port(0x80) && is_known_probe_port(0x71));
        assert!(!is_known_probe_port(0x7e0) && !is_known_probe_port(0x3f8));
    }

    #[test]
    fn host_failures_are_errors() {
        assert!(handle_exit(&buses(), VcpuExit::IoOut(0x3f8, &[0xdd])).is_err());
    }

    #[test]
    fn terminal_exits_end_the_vm() {
        let b = buses();
        let end = |e| handle_exit(&b, e).unwrap().action;
        assert_eq!(end(VcpuExit::Shutdown), ExitAction::End(VmEnd::TripleFault));
        assert_eq!(end(VcpuExit::Hlt), ExitAction::Resume);
        assert_eq!(
            end(VcpuExit::SystemEvent(SYSTEM_EVENT_RESET, &[])),
            ExitAction::End(VmEnd::Reset)
        );
        assert_eq!(
            end(VcpuExit::FailEntry(5, 0)),
            ExitAction::End(VmEnd::KvmFailure(5))
        );
    }

    type Log = Arc<Mutex<Vec<(&'static str, u64, u8)>>>;

    /// Logs every access as `(bus, offset, first byte)`; writes of 0xff ask for shutdown.
    struct Recorder(&'static str, Log);

    impl MutBusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            self.1.lock().unwrap().push((self.0, offset, 0));
            data.fill(0);
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<DeviceEvent> {
            self.1.lock().unwrap().push((self.0, offset, data[0]));
            Ok(match data[0] {
                0xff => DeviceEvent::Shutdown(3),
                _ => DeviceEvent::None,
            })
        }
    }

    fn recording_buses() -> (Buses, Log) {
        let log = Log::default();
        let mut pio = BusBuilder::new();
        let device = Recorder("pio", log.clone());
        pio.insert("pio", 0x3f8, 8, Arc::new(Mutex::new(device)))
            .unwrap();
        let mut mmio = BusBuilder::new();
        let device = Recorder("mmio", log.clone());
        mmio.insert("mmio", 0xd000_0000, 0x1000, Arc::new(Mutex::new(device)))
            .unwrap();
        let buses = Buses {
            pio: pio.freeze(),
            mmio: mmio.freeze(),
        };
        (buses, log)
    }

    #[test]
    fn queued_coalesced_writes_reach_devices_before_the_exit() {
        let (b, log) = recording_buses();
        let queued = [
            CoalescedWrite::new(false, 0xd000_0010, &[0x11, 0, 0, 0]),
            CoalescedWrite::new(true, 0x3f8, &[0x22]),
            CoalescedWrite::new(true, 0x80, &[0x44]),
        ];
        let mut seen = Vec::new();
        let h = dispatch(
            &b,
            queued.into_iter(),
            Some(VcpuExit::IoOut(0x3f9, &[0x33])),
            |w, device| seen.push((w.pio, device)),
        )
        .unwrap();
        assert_eq!((h.reason, h.device), (ExitReason::IoOut, Some(0)));
        let order = [("mmio", 0x10, 0x11), ("pio", 0, 0x22), ("pio", 1, 0x33)];
        assert_eq!(*log.lock().unwrap(), order);
        assert_eq!(seen, [(false, Some(0)), (true, Some(0)), (true, None)]);
    }

    #[test]
    fn an_interrupted_run_still_delivers_queued_writes() {
        let (b, log) = recording_buses();
        let queued = [CoalescedWrite::new(true, 0x3f8, &[0x22])];
        let h = dispatch(&b, queued.into_iter(), None, |_, _| {}).unwrap();
        assert_eq!((h.reason, h.action), (ExitReason::Intr, ExitAction::Resume));
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_queued_write_that_ends_the_vm_wins_over_the_later_exit() {
        let (b, _) = recording_buses();
        let queued = [CoalescedWrite::new(true, 0x3f8, &[0xff])];
        let exit = Some(VcpuExit::IoOut(0x3f9, &[0x33]));
        let h = dispatch(&b, queued.into_iter(), exit, |_, _| {}).unwrap();
        assert_eq!(h.action, ExitAction::End(VmEnd::PowerOff(3)));
    }
}
