//! One row of the exit-path ablation: the vCPU of a VM running the bench guest's `pio_out`
//! loop, driven by a KVM_RUN loop of the lab's own with exitless's ingredients switched on by a
//! constant mask (each combination is a function of its own: a row pays no branch for an
//! ingredient it does not have). Every ingredient is exitless's real piece: its seccomp filter,
//! its kick arming, its sync-regs setting and read, its profile's records, its bus snapshot and
//! dispatch, its pinning; only the per-exit checks of `Vcpu::run_loop` (stop flag, observer,
//! log-once) are the same branches written here, over the core's types.

use std::sync::Arc;

use kvm_ioctls::{VcpuExit, VcpuFd};
use vmm::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
use vmm::bus::{BusSnapshot, SharedBuses};
use vmm::config::IrqchipMode;
use vmm::profile::{self, ExitReason, VcpuProfile};
use vmm::vcpu::{control, handle_exit, ExitAction, ExitObserver, Handled, RegsAccess, Vcpu};

use super::ablation::AblationError;
use super::console::LineCapture;
use super::guest;

/// exitless's seccomp filter of a vCPU thread, installed on the row's thread.
pub const SECCOMP: u16 = 1 << 0;
/// The kick: the thread's kvm_run registered for the kick signal's handler (which every VM
/// installs for the process), and KVM_RUN's `EINTR` answered as exitless does.
pub const KICK: u16 = 1 << 1;
/// Sync regs: the general registers copied into kvm_run by KVM on every exit, RIP and RAX read
/// from there on every exit (what exitless's `RegsAccess::SyncRegs` did until issue 42's p50
/// work; exitless now reads RIP there only for a message: docs/performance.md).
pub const SYNC_REGS: u16 = 1 << 2;
/// The profiler as exitless runs it by default: every exit counted, one in
/// `vmm::profile::sample()` timed (a TSC read on each side of KVM_RUN and the vCPU profile's
/// three records).
pub const PROFILE: u16 = 1 << 3;
/// The bus: the per-vCPU bus snapshot's generation check and exitless's dispatch.
pub const BUS: u16 = 1 << 4;
/// The per-exit checks: the stop flag before KVM_RUN, the observer, log-once, the action.
pub const OBSERVER: u16 = 1 << 5;
/// The thread pinned to one host CPU (exitless does it with `--cpu-affinity` only).
pub const PIN: u16 = 1 << 6;
/// Not an ingredient: the TSC around KVM_RUN recorded per exit, where tracefs is missing.
pub const TIMED: u16 = 1 << 7;
/// Not an ingredient: with [`PROFILE`], every exit timed (`--profile-sample 1`, exitless's
/// exit path before the profile was sampled).
pub const PROFILE_EVERY: u16 = 1 << 8;
/// KVM_RUN as one `syscall` instruction, the exit read straight from kvm_run
/// (`vmm::kvm::raw_run`, exitless's), instead of kvm-ioctls' `VcpuFd::run`.
pub const RAW_RUN: u16 = 1 << 9;
/// Not exitless's: a read and a write of one word on each of [`TOUCHED`] lines of one page of
/// the row's own, per exit (what touching that much data costs with no new page).
pub const TOUCH_LINES: u16 = 1 << 10;
/// Not exitless's: the same words, each on a page of its own, 2 MiB and a page apart (what a
/// page per word adds when each needs a TLB entry and a page-table line of its own, as
/// scattered heap and mappings do; exitless's exit path touched 6 data pages besides kvm_run
/// and the stack).
pub const TOUCH_PAGES: u16 = 1 << 11;
/// What `exitless run` has on its exit path by default (no pinning).
pub const EXITLESS: u16 = SECCOMP | KICK | SYNC_REGS | PROFILE | BUS | OBSERVER | RAW_RUN;
/// Words the touch rows read and write per exit.
pub const TOUCHED: usize = 6;
/// Bytes between two touched words of [`TOUCH_PAGES`]: 2 MiB, a page and a line, so that no
/// two share a page, a page table's line nor the same line offset within their page.
const PAGE_STRIDE: usize = (2 << 20) + 4096 + 64;

/// Each ingredient's bit and name, in the order they are added (the raw KVM_RUN first: the
/// cumulative rows start from the loop exitless has).
pub const INGREDIENTS: [(u16, &str); 8] = [
    (RAW_RUN, "raw KVM_RUN"),
    (SECCOMP, "seccomp filter"),
    (KICK, "kick signal armed"),
    (SYNC_REGS, "sync regs"),
    (PROFILE, "profiler (timestamps sampled)"),
    (BUS, "bus snapshot + dispatch"),
    (OBSERVER, "observer/stop-flag checks"),
    (PIN, "CPU pinning"),
];

const GUEST_MEMORY: u64 = 64 << 20;
/// COM1's line status register: transmitter empty. Its interrupt identification: none.
const COM1_LSR: u16 = 0x3fd;
const COM1_IIR: u16 = 0x3fa;

/// What one batch of a row did.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// TSC before the batch's first KVM_RUN and after its last exit was handled.
    pub start_tsc: u64,
    pub end_tsc: u64,
    /// Exits at the bench port (the loop's), and any others.
    pub exits: u64,
    pub other_exits: u64,
    /// With [`TIMED`]: TSC cycles from each KVM_RUN's return to the next call.
    pub samples: Vec<u64>,
}

/// A row's VM and what its loop reaches, owned by the row's thread.
pub struct RowVcpu {
    mask: u16,
    vcpu: Vcpu,
    shared: Arc<SharedBuses>,
    snapshot: BusSnapshot,
    profile: Arc<VcpuProfile>,
    control: Arc<control::VmControl>,
    observer: Option<Box<dyn ExitObserver>>,
    observe_every_exit: bool,
    /// exitless's vCPU logs the first unmapped access once; this loop starts past it.
    warned_unmapped: bool,
    /// The profile times one exit in this many (exitless's default).
    sample: u32,
    /// The touch rows' words: [`TOUCHED`] pages and lines (zero-sized for other rows).
    touched: Vec<u64>,
}

/// What of a row's VM stays with the thread that built it (dropped after the row's thread).
pub struct RowVm {
    _vm: vmm::vm::Vm,
    _event_loop: vmm::event_loop::EventLoop,
    _serial: LineCapture,
}

impl RowVcpu {
    /// Builds the bench guest's VM (1 vCPU, in-kernel irqchip, 64 MiB) running `case` (a
    /// `pio_out` loop) for a row with `mask`, its vCPU reading registers through sync regs only
    /// where the mask says so.
    ///
    /// The guest loops `iterations` times: as many as the row will run, no more, since its
    /// empty loop of as many iterations runs first, emulated at CPL0 (~2 µs an iteration
    /// here). The row stops before the guest's loop ends.
    pub fn build(mask: u16, case: &str, iterations: u64) -> Result<(Self, RowVm), AblationError> {
        let (built, serial) = build_vm(mask, case, iterations)?;
        let vcpu = built
            .vcpus
            .into_iter()
            .next()
            .ok_or(AblationError::NoVcpu)?;
        let profile = built.profiles[0].clone();
        // A page more than the words span, so that they can start on a page boundary.
        let words = match mask & (TOUCH_LINES | TOUCH_PAGES) {
            0 => 0,
            _ => (TOUCHED * PAGE_STRIDE + 4096) / 8,
        };
        let row = RowVcpu {
            mask,
            vcpu,
            snapshot: built.buses.snapshot(),
            shared: built.buses,
            profile,
            control: built.vm.control.clone(),
            observer: None,
            observe_every_exit: false,
            warned_unmapped: true,
            sample: vmm::profile::sample(),
            touched: vec![0; words],
        };
        let vm = RowVm {
            _vm: built.vm,
            _event_loop: built.event_loop,
            _serial: serial,
        };
        Ok((row, vm))
    }

    /// Readies the calling thread as the mask says: pinned to `cpu`, exitless's vCPU filter,
    /// the kick armed. Once per thread (a filter cannot be removed).
    pub fn prepare_thread(&mut self, cpu: usize) -> Result<(), AblationError> {
        if self.mask & PIN != 0 {
            vmm::vcpu::pin_current_thread(cpu).map_err(AblationError::Pin)?;
        }
        if self.mask & SECCOMP != 0 {
            vmm::seccomp::apply(vmm::seccomp::ThreadKind::Vcpu)?;
        }
        if self.mask & KICK != 0 {
            vmm::kvm::kick::arm(self.vcpu.fd_mut());
        }
        Ok(())
    }

    /// Forgets the kick's kvm_run (before the vCPU is dropped).
    pub fn finish_thread(&mut self) {
        if self.mask & KICK != 0 {
            vmm::kvm::kick::disarm();
        }
    }

    /// Runs the guest until `n` exits at the bench port were handled; `samples` (with room for
    /// `n`) gets the TSC per exit when `timed`.
    pub fn batch(
        &mut self,
        n: u64,
        timed: bool,
        samples: Vec<u64>,
    ) -> Result<Batch, AblationError> {
        let mask = (self.mask & !(SECCOMP | PIN)) | if timed { TIMED } else { 0 };
        macro_rules! by_mask {
            ($($m:expr),* $(,)?) => {
                match mask {
                    $(m if m == $m => run_batch::<{ $m }>(self, n, samples),
                      m if m == $m | TIMED => run_batch::<{ $m | TIMED }>(self, n, samples),)*
                    other => Err(AblationError::Mask(other)),
                }
            };
        }
        by_mask!(
            0,
            RAW_RUN,
            RAW_RUN | KICK,
            RAW_RUN | SYNC_REGS,
            RAW_RUN | PROFILE,
            RAW_RUN | BUS,
            RAW_RUN | OBSERVER,
            RAW_RUN | KICK | SYNC_REGS,
            RAW_RUN | KICK | SYNC_REGS | PROFILE,
            RAW_RUN | KICK | SYNC_REGS | PROFILE | BUS,
            KICK | SYNC_REGS | PROFILE | BUS | OBSERVER | RAW_RUN,
            RAW_RUN | PROFILE | PROFILE_EVERY,
            KICK | SYNC_REGS | PROFILE | PROFILE_EVERY | BUS | OBSERVER | RAW_RUN,
            KICK | SYNC_REGS | PROFILE | PROFILE_EVERY | BUS | OBSERVER,
            RAW_RUN | TOUCH_LINES,
            RAW_RUN | TOUCH_PAGES,
        )
    }
}

/// The bench guest's VM (1 vCPU, in-kernel irqchip, 64 MiB) running `case` for `iterations`,
/// its vCPU with the options of a row with `mask`, and the console it writes to.
pub fn build_vm(
    mask: u16,
    case: &str,
    iterations: u64,
) -> Result<(vmm::builder::BuiltVm, LineCapture), AblationError> {
    let spec = VmSpec {
        kernel: KernelImage::Embedded(guest::BENCH_GUEST),
        initrd: None,
        cmdline: format!("case={case} iters={iterations}"),
        memory: GUEST_MEMORY,
        memory_backing: vmm::memory::Backing::default(),
        cpus: 1,
        max_cpus: 1,
        irqchip: IrqchipMode::Kernel,
    };
    let mut builder = VmBuilder::new(vmm::kvm::open()?, spec)?;
    let serial = LineCapture::default();
    super::runner::add_bench_ports(&mut builder, &serial)?;
    let regs = if mask & SYNC_REGS != 0 {
        RegsAccess::SyncRegs
    } else {
        RegsAccess::None
    };
    let opts = VcpuOptions {
        regs,
        profiling: mask & PROFILE != 0,
        profile_sample: vmm::profile::sample(),
        log_unmapped: false,
        affinity: None,
    };
    let built = builder.build(&opts)?;
    Ok((built, serial))
}

/// The loop, one copy per mask `F`: what is not in `F` is not compiled in.
#[inline(never)]
fn run_batch<const F: u16>(
    row: &mut RowVcpu,
    n: u64,
    mut samples: Vec<u64>,
) -> Result<Batch, AblationError> {
    let start_tsc = profile::rdtsc();
    let (mut exits, mut other_exits) = (0u64, 0u64);
    let mut t_entry = if F & PROFILE != 0 { start_tsc } else { 0 };
    let mut t_returned = 0u64;
    // As exitless's vCPU: exits left before the next timed one.
    let every = if F & PROFILE_EVERY != 0 {
        1
    } else {
        row.sample
    };
    let mut untimed_left = 0u32;
    while exits < n {
        if F & OBSERVER != 0 && row.control.state() != control::RUN {
            return Err(AblationError::Stopped);
        }
        if F & TIMED != 0 && t_returned != 0 && samples.len() < samples.capacity() {
            samples.push(profile::rdtsc().wrapping_sub(t_returned));
        }
        let result = run_once::<F>(row.vcpu.fd_mut());
        if F & TIMED != 0 {
            t_returned = profile::rdtsc();
        }
        let timed = F & PROFILE != 0 && untimed_left == 0;
        let t_exit = if timed { profile::rdtsc() } else { 0 };
        let handled = match result {
            Ok(exit) if F & BUS != 0 => handle_exit(row.snapshot.current(&row.shared), exit)
                .map_err(AblationError::Device)?,
            Ok(exit) => bare(exit),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                if F & KICK != 0 {
                    row.vcpu.fd_mut().set_kvm_immediate_exit(0);
                }
                intr()
            }
            Err(e) => return Err(AblationError::Run(e)),
        };
        if F & SYNC_REGS != 0 {
            let (rip, rax) = vmm::kvm::sync_rip_rax(row.vcpu.fd_mut());
            std::hint::black_box((rip, rax));
        }
        if F & OBSERVER != 0 {
            per_exit_checks(row, &handled)?;
        }
        if F & (TOUCH_LINES | TOUCH_PAGES) != 0 {
            touch::<F>(&mut row.touched);
        }
        if F & PROFILE != 0 {
            let times = (t_entry, t_exit);
            (t_entry, untimed_left) = account(&row.profile, &handled, timed, times, untimed_left);
            if timed {
                untimed_left = every - 1;
            }
        }
        if let ExitAction::End(end) = handled.action {
            return Err(AblationError::Ended(format!("{end:?}")));
        }
        if handled.reason == ExitReason::IoOut && handled.addr == guest::BENCH_PORT {
            exits += 1;
        } else {
            other_exits += 1;
        }
    }
    Ok(Batch {
        start_tsc,
        end_tsc: profile::rdtsc(),
        exits,
        other_exits,
        samples,
    })
}

/// The touch rows' per-exit work: a read and a write of [`TOUCHED`] words, from the first page
/// boundary in `words`, a line apart ([`TOUCH_LINES`]) or a page and a line ([`TOUCH_PAGES`]).
#[inline(always)]
fn touch<const F: u16>(words: &mut [u64]) {
    let stride = if F & TOUCH_PAGES != 0 {
        PAGE_STRIDE / 8
    } else {
        64 / 8
    };
    let first = (4096 - words.as_ptr() as usize % 4096) % 4096 / 8;
    for k in 0..TOUCHED {
        if let Some(w) = words.get_mut(first + k * stride) {
            *w = std::hint::black_box(*w).wrapping_add(1);
        }
    }
}

/// One KVM_RUN: raw (exitless's) or through kvm-ioctls, as `F` says.
#[inline(always)]
fn run_once<const F: u16>(fd: &mut VcpuFd) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
    if F & RAW_RUN != 0 {
        vmm::kvm::raw_run::run(fd)
    } else {
        fd.run()
    }
}

/// The profile's part of one exit, as exitless's vCPU does it: recorded with its times when
/// `timed`, else counted; returns the next KVM_RUN's start (read when the next exit is the
/// timed one) and the exits left before the next timed one (the caller resets it once timed).
#[inline(always)]
fn account(p: &VcpuProfile, h: &Handled, timed: bool, times: (u64, u64), left: u32) -> (u64, u32) {
    if timed {
        return (record_profile(p, h, times.0, times.1), left);
    }
    p.count_exit(h.reason, h.device);
    let left = left - 1;
    let t_entry = if left == 0 { profile::rdtsc() } else { 0 };
    (t_entry, left)
}

/// The profile's records of one exit, as exitless's vCPU makes them; returns `t_done`, the
/// next KVM_RUN's start.
#[inline(always)]
fn record_profile(profile: &VcpuProfile, h: &Handled, t_entry: u64, t_exit: u64) -> u64 {
    let t_done = profile::rdtsc();
    profile.record_in_kvm(t_exit.wrapping_sub(t_entry));
    profile.record_exit(h.reason, h.device, t_done.wrapping_sub(t_exit));
    if let Some(cpu) = profile::current_cpu() {
        profile.record_cpu(cpu);
    }
    t_done
}

/// exitless's per-exit branches besides the bus: the observer's every-exit hook, the
/// log-once checks, an observed exit.
#[inline(always)]
fn per_exit_checks(row: &mut RowVcpu, h: &Handled) -> Result<(), AblationError> {
    if row.observe_every_exit {
        if let Some(observer) = row.observer.as_mut() {
            observer.every_exit(row.vcpu.fd())?;
        }
    }
    let io = matches!(
        h.reason,
        ExitReason::IoIn | ExitReason::IoOut | ExitReason::MmioRead | ExitReason::MmioWrite
    );
    if h.unhandled.is_some() || (io && h.device.is_none() && !row.warned_unmapped) {
        unexpected(row);
    }
    if let ExitAction::Observe(value) = h.action {
        observed(row, value);
    }
    Ok(())
}

#[cold]
fn unexpected(row: &mut RowVcpu) {
    row.warned_unmapped = true;
}

#[cold]
fn observed(row: &mut RowVcpu, value: u32) {
    std::hint::black_box((&row.observer, value));
}

/// The floor's handling (lab/floor/floor.c): COM1's status reads say "transmitter empty" and
/// "no interrupt", every other read finds nothing (all ones), writes are dropped, the exit
/// port and the ends KVM reports end the row.
#[inline(always)]
fn bare(exit: VcpuExit<'_>) -> Handled {
    let (reason, addr, action) = match exit {
        VcpuExit::IoOut(port, data) => {
            let action = if u64::from(port) == guest::EXIT_PORT {
                let status = data.first().copied().unwrap_or(0);
                ExitAction::End(vmm::vcpu::VmEnd::PowerOff(status.into()))
            } else {
                ExitAction::Resume
            };
            (ExitReason::IoOut, u64::from(port), action)
        }
        VcpuExit::IoIn(port, data) => {
            let value = match port {
                COM1_LSR => 0x60,
                COM1_IIR => 0x01,
                _ => 0xff,
            };
            data.fill(value);
            (ExitReason::IoIn, u64::from(port), ExitAction::Resume)
        }
        VcpuExit::MmioRead(addr, data) => {
            data.fill(0xff);
            (ExitReason::MmioRead, addr, ExitAction::Resume)
        }
        VcpuExit::MmioWrite(addr, _) => (ExitReason::MmioWrite, addr, ExitAction::Resume),
        VcpuExit::Hlt => (ExitReason::Hlt, 0, ExitAction::Resume),
        _ => (
            ExitReason::Other,
            0,
            ExitAction::End(vmm::vcpu::VmEnd::KvmFailure(0)),
        ),
    };
    Handled {
        reason,
        device: None,
        action,
        unhandled: None,
        addr,
    }
}

/// A kicked KVM_RUN, as exitless's dispatch reports it.
fn intr() -> Handled {
    Handled {
        reason: ExitReason::Intr,
        device: None,
        action: ExitAction::Resume,
        unhandled: None,
        addr: 0,
    }
}
