//! The dirty-tracking family (`exitless bench --dirty`): what a guest's first write to a page
//! costs with tracking off, with KVM's bitmap (each harvest's `KVM_CLEAR_DIRTY_LOG`, or the
//! plain read, write-protected the pages again) and with KVM's dirty ring (each harvest's
//! `KVM_RESET_DIRTY_RINGS` did), and the exits it causes. The bench guest's `dirty_write`
//! case writes one byte per page over `pages` pages at CPL3, `rounds` times, and asks the
//! host to harvest before each round (a write to its dirty port, handled on the vCPU thread
//! as a migration's pass would be on its own): its cycles per page, the pages each harvest
//! found in the written range (each round's `pages`) and the ring-full exits the profiler
//! counted make one row per way.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kvm_ioctls::VmFd;
use serde::Serialize;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::config_run::RunError;
use super::console::LineCapture;
use super::guest;
use super::runner::add_bench_ports;
use vmm::builder::{KernelImage, VcpuOptions, VmBuilder, VmSpec};
use vmm::bus::{BusDevice, DeviceEvent};
use vmm::config::IrqchipMode;
use vmm::device_manager::BusKind;
use vmm::kvm::dirty_tracking::{self, DirtyLogMode, DirtyTracking};
use vmm::kvm::{self, dirty_log, KvmError};
use vmm::profile::ExitReason;

/// Pages written per round by default (32 MiB: twice a 4096-entry ring).
pub const DEFAULT_PAGES: u64 = 8192;
/// Rounds by default (the first faults the pages in and is reported apart).
pub const DEFAULT_ROUNDS: u64 = 8;
const GUEST_MEMORY: u64 = 128 << 20;
/// Where the guest's `dirty_write` writes (bench-guest/dirty.c).
const DIRTY_BASE: u64 = 0x200_0000;
/// The guest's port asking for a harvest (bench-guest/layout.h).
const DIRTY_PORT: u64 = 0x7ec;

/// How the row's VM tracks dirty pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Tracking {
    /// Not at all (what every VM does when not migrating).
    Off,
    /// KVM's bitmap, with manual protect where offered.
    Bitmap,
    /// KVM's dirty ring.
    Ring,
}

impl Tracking {
    pub const ALL: [Tracking; 3] = [Tracking::Off, Tracking::Bitmap, Tracking::Ring];

    pub fn name(self) -> &'static str {
        match self {
            Tracking::Off => "off",
            Tracking::Bitmap => "bitmap",
            Tracking::Ring => "ring",
        }
    }

    fn mode(self) -> DirtyLogMode {
        match self {
            Tracking::Off => DirtyLogMode::Auto,
            Tracking::Bitmap => DirtyLogMode::Bitmap,
            Tracking::Ring => DirtyLogMode::Ring,
        }
    }
}

/// One way's figures.
#[derive(Debug, Clone, Serialize)]
pub struct DirtyRow {
    pub tracking: Tracking,
    /// How the VM tracked, as migration logs it ("ring", "bitmap (manual protect)").
    pub kind: &'static str,
    pub pages: u64,
    pub rounds: u64,
    /// Guest cycles per page: the first round (the pages faulted in), the best and the median
    /// of the later ones.
    pub first_cycles: u64,
    pub min_cycles: u64,
    pub p50_cycles: u64,
    /// Pages of the written range each harvest after a round found (empty when off).
    pub harvested: Vec<u64>,
    /// `KVM_EXIT_DIRTY_RING_FULL` exits over the whole run.
    pub ring_full_exits: u64,
}

/// Reads the VM's log on the guest's request, on the vCPU thread.
struct Harvester {
    vm: Arc<VmFd>,
    tracking: Arc<DirtyTracking>,
    /// (slot, guest address, length) of each memory slot.
    slots: Vec<(u32, u64, u64)>,
    /// The guest-physical range whose dirty pages are counted.
    range: (u64, u64),
}

impl Harvester {
    fn harvest(&self) -> Result<u64, KvmError> {
        self.tracking.harvest(&self.vm)?;
        let mut n = 0;
        for &(slot, gpa, len) in &self.slots {
            let bitmap = self.tracking.take(&self.vm, slot, len)?;
            n += count_in(&bitmap, gpa, self.range);
        }
        Ok(n)
    }
}

/// The set bits of `bitmap` (a slot's, from `gpa`) whose page lies in `range`.
fn count_in(bitmap: &[u64], gpa: u64, range: (u64, u64)) -> u64 {
    dirty_log::runs(bitmap)
        .into_iter()
        .map(|(p, n)| {
            let (a, b) = (gpa + p * dirty_log::PAGE, gpa + (p + n) * dirty_log::PAGE);
            (b.min(range.1).saturating_sub(a.max(range.0))) / dirty_log::PAGE
        })
        .sum()
}

/// The port the guest writes before each round: a harvest, its count kept.
#[derive(Default)]
struct HarvestPort {
    harvester: OnceLock<Harvester>,
    counts: Mutex<Vec<u64>>,
}

impl BusDevice for HarvestPort {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> std::io::Result<DeviceEvent> {
        if let Some(h) = self.harvester.get() {
            let n = h.harvest().map_err(std::io::Error::other)?;
            self.counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(n);
        }
        Ok(DeviceEvent::None)
    }
}

/// The ways this host has: the ring only where KVM offers it.
pub fn ways_here() -> Result<Vec<Tracking>, RunError> {
    let ring = kvm::dirty_ring::offered(&kvm::open()?).is_some();
    let ways = Tracking::ALL.into_iter();
    Ok(ways.filter(|&t| t != Tracking::Ring || ring).collect())
}

/// Runs each of `ways` in turn, `pages` pages over `rounds` rounds each, calling `progress`
/// after each.
pub fn run_dirty(
    ways: &[Tracking],
    (pages, rounds): (u64, u64),
    mut progress: impl FnMut(&str),
) -> Result<Vec<DirtyRow>, RunError> {
    let before = dirty_tracking::preferred();
    let mut rows = Vec::new();
    for &t in ways {
        let row = run_one(t, pages, rounds);
        match &row {
            Ok(r) => progress(&format!("dirty/{}: {} cycles/page", t.name(), r.p50_cycles)),
            Err(e) => progress(&format!("dirty/{}: {e}", t.name())),
        }
        rows.push(row);
    }
    dirty_tracking::prefer(before);
    rows.into_iter().collect()
}

/// One way's run in a fresh VM.
pub fn run_one(t: Tracking, pages: u64, rounds: u64) -> Result<DirtyRow, RunError> {
    dirty_tracking::prefer(t.mode());
    let spec = VmSpec {
        kernel: KernelImage::Embedded(guest::BENCH_GUEST),
        initrd: None,
        cmdline: format!("case=dirty_write iters=1 pages={pages} rounds={rounds}"),
        memory: GUEST_MEMORY,
        memory_backing: vmm::memory::Backing::default(),
        cpus: 1,
        max_cpus: 1,
        irqchip: IrqchipMode::Kernel,
    };
    let mut builder = VmBuilder::new(kvm::open()?, spec)?;
    let serial = LineCapture::default();
    add_bench_ports(&mut builder, &serial)?;
    let port = Arc::new(HarvestPort::default());
    let device = port.clone();
    builder
        .devices()
        .add(BusKind::Pio, "dirty-harvest", DIRTY_PORT, 4, device)?;
    let opts = VcpuOptions {
        log_unmapped: false,
        ..VcpuOptions::default()
    };
    let built = builder.build(&opts)?;
    let (vm, _event_loop) = (built.vm, built.event_loop);
    let profile = built.profiles[0].clone();
    if t != Tracking::Off {
        let h = track(&vm, (DIRTY_BASE, DIRTY_BASE + pages * dirty_log::PAGE))?;
        let _ = port.harvester.set(h);
    }
    vm.start(built.vcpus)?
        .wait(Some(Duration::from_secs(300)))?;
    let [pages, rounds, first, min, p50] = guest_figures(&serial)?;
    let counts = port.counts.lock().unwrap_or_else(|e| e.into_inner());
    let snapshot = profile.snapshot();
    let ring_full = snapshot.reason(ExitReason::DirtyRingFull);
    Ok(DirtyRow {
        tracking: t,
        kind: if t == Tracking::Off {
            "-"
        } else {
            vm.dirty.kind()
        },
        pages,
        rounds,
        first_cycles: first,
        min_cycles: min,
        p50_cycles: p50,
        // The harvest before the first round counts what came before it.
        harvested: counts.iter().skip(1).copied().collect(),
        ring_full_exits: ring_full.map_or(0, |r| r.stats.count),
    })
}

/// The guest's result line's pages, rounds, first, min and p50.
fn guest_figures(serial: &LineCapture) -> Result<[u64; 5], RunError> {
    let output = serial.take_lines().join("\n");
    let line = output
        .lines()
        .find(|l| l.starts_with("EXITLESS RESULT case=dirty_write"))
        .ok_or_else(|| RunError::NoResult(output.chars().take(400).collect()))?;
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse::<u64>().ok())
            .ok_or_else(|| RunError::GuestError(format!("no {k} in {line}")))
    };
    Ok([
        field("pages")?,
        field("rounds")?,
        field("first")?,
        field("min")?,
        field("p50")?,
    ])
}

/// Turns tracking on for every slot of `vm`, as a migration does, and clears what was logged
/// before; returns the harvester of `range`.
fn track(vm: &vmm::vm::Vm, range: (u64, u64)) -> Result<Harvester, RunError> {
    let mem = vm.memory().into_inner();
    vm.dirty.start(&vm.kvm, &vm.fd, &mem)?;
    let mut slots = Vec::new();
    for (slot, r) in (0u32..).zip(mem.iter()) {
        dirty_log::set_logging(&vm.fd, slot, r, true)?;
        slots.push((slot, r.start_addr().0, r.len()));
    }
    let h = Harvester {
        vm: vm.fd.clone(),
        tracking: vm.dirty.clone(),
        slots,
        range,
    };
    h.harvest()?;
    Ok(h)
}

/// The family's table.
pub fn render_dirty(rows: &[DirtyRow]) -> String {
    let mut out = String::from(
        "dirty tracking: a guest's first write to a page (guest cycles per page, CPL3)\n",
    );
    out += &format!(
        "{:<8} {:<24} {:>6} {:>7} {:>7} {:>7} {:>10} {}\n",
        "way", "kind", "pages", "first", "min", "p50", "ring-full", "pages harvested per round"
    );
    for r in rows {
        let harvested: Vec<String> = r.harvested.iter().map(u64::to_string).collect();
        out += &format!(
            "{:<8} {:<24} {:>6} {:>7} {:>7} {:>7} {:>10} {}\n",
            r.tracking.name(),
            r.kind,
            r.pages,
            r.first_cycles,
            r.min_cycles,
            r.p50_cycles,
            r.ring_full_exits,
            if harvested.is_empty() {
                "-".to_string()
            } else {
                harvested.join(",")
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pages_in_the_range_are_counted() {
        // Pages 0-3 and 64 of a slot at 0x10000; the range is pages 2-64 of the slot.
        let bitmap = [0b1111, 1];
        let range = (0x10000 + 2 * 4096, 0x10000 + 65 * 4096);
        assert_eq!(count_in(&bitmap, 0x10000, range), 3);
        assert_eq!(count_in(&bitmap, 0x10000, (0, 0x10000)), 0);
    }

    /// The family's structure, not its timing: a row per way, every round's pages harvested
    /// by the tracked ones, ring-full exits counted where a round outgrows the ring.
    #[test]
    fn every_way_has_its_row_and_each_harvest_finds_the_round_s_pages() {
        let Ok(ways) = ways_here() else {
            vmm::test_skip::skip("every_way_has_its_row", "no /dev/kvm");
            return;
        };
        let ring = ways.contains(&Tracking::Ring);
        let pages = 4608; // more than a 4096-entry ring holds
        let rows = run_dirty(&ways, (pages, 3), |_| {}).expect("the family runs");
        let got: Vec<Tracking> = rows.iter().map(|r| r.tracking).collect();
        assert_eq!(got, ways);
        assert!(rows[0].harvested.is_empty() && rows[0].ring_full_exits == 0);
        for r in &rows[1..] {
            assert_eq!((r.pages, r.rounds), (pages, 3), "{r:?}");
            assert_eq!(r.harvested, [pages; 3], "{r:?}");
        }
        assert_eq!(rows[1].ring_full_exits, 0, "the bitmap has no ring");
        if ring {
            assert_eq!(rows[2].kind, "ring");
            assert!(rows[2].ring_full_exits >= 3, "{:?}", rows[2]);
        }
    }
}
