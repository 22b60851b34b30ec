//! A VM made from a snapshot in a fresh process (`vm.restore`, `exitless run --restore`): the
//! config's devices made anew and given their saved state, guest memory mapped from the
//! snapshot (copy-on-write) or a zone's file, vCPUs, irqchip, PIT and clock set to what was
//! saved. The VM starts paused. See docs/snapshot.md.

use std::fs::File;
use std::path::Path;

use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

use super::console::{attach_idle_flush, attach_stdin, console_output};
use super::{add_virtio_devices, HostParts, LaunchError, LaunchedVm};
use crate::builder::{BuildError, VcpuOptions, VcpusAhead, VmBuilder};
use crate::config::{IrqchipMode, VmConfig, MAX_VCPUS};
use crate::kvm;
use crate::memory::hotplug::HotplugRam;
use crate::memory::{self, Backing};
use crate::snapshot::format::{RegionSource, RegionState, SnapshotState};
use crate::snapshot::memory_file;
use crate::snapshot::{cpu_features, SnapshotError, MEMORY_FILE};
use crate::startup::{mark, restore_moment as moment};
use crate::vm::VcpuThreadsAhead;

/// Restore choices that are not part of the snapshot (the console goes where the config's
/// `serial_output` and `serial_log` say).
#[derive(Debug, Clone, Copy, Default)]
pub struct RestoreOptions {
    /// Feed the VMM's stdin to the guest's COM1.
    pub stdin_to_serial: bool,
}

fn mismatch(why: String) -> LaunchError {
    SnapshotError::Mismatch(why).into()
}

/// Makes the VM saved in `dir` (`state`, already read and checked; `config` from its
/// config.json, as edited since) and starts its vCPUs paused: [`LaunchedVm::resume`] runs
/// it.
pub fn restore(
    config: &VmConfig,
    dir: &Path,
    state: SnapshotState,
    opts: RestoreOptions,
) -> Result<LaunchedVm, LaunchError> {
    restore_onto(config, MemoryFrom::Dir(dir), state, opts)
}

/// What a restore makes before it needs the saved state: the vCPU threads (named, pinned
/// and filtered while the VM is made, as at a boot: see `launch`), the KVM VM on guest
/// memory, its memory slots and irqchip (the PIT on its own thread), and its vCPUs (their
/// fds, and the CPUID this host offers, read through the first). A migration's destination
/// makes it when Config arrives ([`premade_vm`]), so that State only checks and puts state
/// back; a snapshot's restore makes it once its memory is mapped. Dropped, the VM is gone
/// (and the threads end).
pub struct PremadeVm {
    builder: Box<VmBuilder>,
    threads_ahead: VcpuThreadsAhead,
    vcpus: VcpusAhead,
}

/// The moment the pre-made VM's vCPUs are created (`-v`: the restore's timeline).
const VCPUS_AHEAD: &str = "restore: vCPUs created ahead (KVM_CREATE_VCPU, the host's CPUID)";

/// Makes the VM `config` describes on `mem` (laid out as the config says), as far as it
/// goes without the saved state: vCPUs `ids` (ascending, `config.cpus` of them) and their
/// threads (a vCPU the state has beyond them, hot-added since, is made at State; one it
/// lacks refuses the state).
pub fn premade_vm(
    config: &VmConfig,
    ids: &[u8],
    mem: GuestMemoryMmap,
) -> Result<PremadeVm, LaunchError> {
    config.validate(MAX_VCPUS)?;
    premade_with(config, mem, ids)
}

fn premade_with(
    config: &VmConfig,
    mem: GuestMemoryMmap,
    ids: &[u8],
) -> Result<PremadeVm, LaunchError> {
    crate::seccomp::prepare_malloc();
    if config.irqchip != IrqchipMode::Kernel {
        return Err(mismatch("only the in-kernel irqchip is restored".into()));
    }
    let kvm = kvm::open()?;
    mark(moment::KVM_OPEN);
    config.validate(kvm.get_max_vcpus())?;
    let affinity = config.cpu_affinity.as_ref();
    let threads = ids.iter().map(|&id| usize::from(id));
    let threads_ahead =
        VcpuThreadsAhead::spawn(threads.map(|id| (id, affinity.and_then(|a| a.host_cpu(id)))))?;
    mark(moment::THREADS_AHEAD);
    // The config's memory and vCPU limit, which `check_fits` holds to the saved state's.
    let spec = super::vm_spec(config);
    let mut builder = VmBuilder::with_memory(kvm, spec, mem)?;
    mark(moment::VM);
    let vcpus = builder.vcpus_ahead(ids)?;
    mark(VCPUS_AHEAD);
    Ok(PremadeVm {
        builder: Box::new(builder),
        threads_ahead,
        vcpus,
    })
}

/// As [`restore`], onto the VM made on guest memory the caller made and filled (a
/// migration's destination: its regions are the saved ones, checked against `state`).
pub fn restore_premade(
    config: &VmConfig,
    vm: PremadeVm,
    state: SnapshotState,
    opts: RestoreOptions,
) -> Result<LaunchedVm, LaunchError> {
    restore_onto(config, MemoryFrom::Made(vm), state, opts)
}

/// Where a restored VM's memory comes from.
enum MemoryFrom<'a> {
    /// The snapshot in this directory.
    Dir(&'a Path),
    /// Made and filled already, the VM made on it.
    Made(PremadeVm),
}

fn restore_onto(
    config: &VmConfig,
    from: MemoryFrom<'_>,
    state: SnapshotState,
    opts: RestoreOptions,
) -> Result<LaunchedVm, LaunchError> {
    crate::seccomp::prepare_malloc();
    // Cloud Hypervisor's schema cannot say "no entropy device" (a VM made through the API
    // always has one): the saved devices say whether this VM had one.
    let mut config = config.clone();
    config.rng = state.devices.values().any(|d| d.kind == "virtio-rng");
    let config = &config;
    config.validate(MAX_VCPUS)?;
    check_fits(config, &state)?;
    let ids: Vec<u8> = state.vcpus.iter().map(|v| v.id).collect();
    let vcpus = state
        .vcpus
        .iter()
        .map(|v| v.to_kvm().map_err(SnapshotError::Corrupt))
        .collect::<Result<Vec<_>, _>>()?;
    let vm_state = state.vm.to_kvm().map_err(SnapshotError::Corrupt)?;
    mark(moment::DECODED);
    // A device's bytes beyond its JSON (virtio-fs's back end state) are files of a
    // snapshot's directory; a migration refuses such devices before it sends anything.
    let (data_dir, premade) = match from {
        MemoryFrom::Dir(dir) => {
            let mem = restore_memory(config, dir, &state)?;
            mark(moment::MEMORY);
            (Some(dir), premade_with(config, mem, &ids)?)
        }
        MemoryFrom::Made(vm) => (None, vm),
    };
    let (mut builder, threads_ahead) = (*premade.builder, premade.threads_ahead);
    let ahead = premade.vcpus;
    check_made_memory(&builder.vm().memory(), &state)?;
    let serial = builder.add_console(console_output(config)?)?;
    builder.add_i8042()?;
    // The same controllers at the same addresses as the saved VM's (its memory hotplug
    // controller only if it had a hotplug area, its slots holding the memory hot-added; the
    // controller's saved state is checked against them).
    let hotplug_ram = restored_hotplug(&mut builder, config, &state)?;
    // Each PCI function where it was (devices added and removed while it ran included).
    builder.devices().restore_places(&state.devices);
    let socket_files = add_virtio_devices(&mut builder, config)?;
    let balloon = super::balloon::add_balloon(&mut builder, config)?;
    mark(moment::DEVICES);
    let vcpu_opts = VcpuOptions {
        affinity: config.cpu_affinity.clone(),
        ..VcpuOptions::default()
    };
    let check_cpu = |seen: &[kvm_bindings::kvm_cpuid_entry2]| check_host(seen, &state);
    let built =
        builder.build_restored_ahead(ahead, &vcpu_opts, &vm_state, &ids, &vcpus, &check_cpu)?;
    mark(moment::VCPUS);
    let mut devices = state.devices;
    if let Some(dir) = data_dir {
        crate::snapshot::device_data::read_all(dir, &mut devices)?;
    }
    built.devices.restore_devices(devices)?;
    mark(moment::DEVICE_STATE);
    let parts = HostParts {
        serial,
        socket_files,
        balloon,
        hotplug_ram,
    };
    let (mut launched, vcpus) = LaunchedVm::new(built, config, parts);
    launched.open_stats(&vcpus)?;
    // Parked before their first KVM_RUN: the VM is Paused until resumed.
    launched.vm.control.request_pause();
    launched.running = Some(launched.vm.start_ahead(threads_ahead, vcpus)?);
    mark(moment::PARKED);
    if opts.stdin_to_serial {
        attach_stdin(&launched.event_loop, launched.serial.clone());
    }
    launched.idle_flush = attach_idle_flush(&launched.serial);
    Ok(launched)
}

/// Memory made by the caller must be laid out as the saved regions.
fn check_made_memory(mem: &GuestMemoryMmap, state: &SnapshotState) -> Result<(), LaunchError> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let made: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
    let saved: Vec<(u64, u64)> = state
        .memory
        .regions
        .iter()
        .map(|r| (r.gpa, r.size))
        .collect();
    if made != saved {
        return Err(mismatch(format!(
            "guest memory has regions {made:x?}, the saved state {saved:x?}"
        )));
    }
    Ok(())
}

/// The config (as Kata may have edited it) must describe the VM that was saved.
fn check_fits(config: &VmConfig, state: &SnapshotState) -> Result<(), LaunchError> {
    if usize::from(config.cpus) != state.vcpus.len() {
        return Err(mismatch(format!(
            "config.json has {} vCPUs, state.json {}",
            config.cpus,
            state.vcpus.len()
        )));
    }
    let max = config.max_vcpus.unwrap_or(config.cpus).max(config.cpus);
    if max != state.vm.max_vcpus {
        return Err(mismatch(format!(
            "config.json allows {max} vCPUs, the guest's topology {}",
            state.vm.max_vcpus
        )));
    }
    if config.memory.bytes() != state.memory.size {
        return Err(mismatch(format!(
            "config.json has {} bytes of memory, state.json {}",
            config.memory.bytes(),
            state.memory.size
        )));
    }
    if config.irqchip != IrqchipMode::Kernel {
        return Err(mismatch("only the in-kernel irqchip is restored".into()));
    }
    Ok(())
}

/// The hotplug area as the saved VM had it: laid out for the RAM it booted with, its slots
/// holding the memory hot-added since (mapped with the rest of guest memory), in order. The
/// memory controller is made with as many slots, each filled again.
fn restored_hotplug(
    builder: &mut VmBuilder,
    config: &VmConfig,
    state: &SnapshotState,
) -> Result<Option<HotplugRam>, LaunchError> {
    let boot = state.memory.size - state.memory.hotplugged;
    let hugepage = config.memory_backing().hugepage_size;
    let ram = config
        .hotplug_memory
        .and_then(|h| HotplugRam::new(boot, h.bytes(), hugepage));
    builder.enable_hotplug(ram.as_ref().map_or(0, HotplugRam::slots))?;
    let Some(mut ram) = ram else {
        if state.memory.hotplugged > 0 {
            return Err(mismatch(
                "state.json has memory hot-added, config.json no memory.hotplug_size".into(),
            ));
        }
        return Ok(None);
    };
    let area = ram.base().0;
    let added = state.memory.regions.iter().filter(|r| r.gpa >= area);
    for r in added {
        let region = ram.plan(ram.current() + r.size).ok().flatten();
        let region = region.filter(|p| p.start.0 == r.gpa && p.len == r.size);
        let Some(region) = region else {
            return Err(mismatch(format!(
                "state.json has {:#x} bytes hot-added at {:#x}, which the hotplug area of \
                 config.json does not place there",
                r.size, r.gpa
            )));
        };
        builder
            .devices()
            .memory_restored(region.slot, r.gpa, r.size)?;
        ram.commit(&region);
    }
    if ram.added() != state.memory.hotplugged {
        return Err(mismatch(format!(
            "state.json says {} bytes were hot-added, its regions in the hotplug area hold {}",
            state.memory.hotplugged,
            ram.added()
        )));
    }
    Ok(Some(ram))
}

/// This host must offer the CPU the guest saw: the same vendor and every feature (`seen`:
/// what a guest booted here sees).
fn check_host(
    seen: &[kvm_bindings::kvm_cpuid_entry2],
    state: &SnapshotState,
) -> Result<(), BuildError> {
    let host = cpu_features::features_of(seen);
    match cpu_features::missing(&state.cpu, &host) {
        Some(why) => Err(SnapshotError::Host(why).into()),
        None => Ok(()),
    }
}

/// Guest memory laid out as saved: each region from the snapshot's memory file (mapped
/// private, or copied onto new memory where the config wants it shared or on huge pages) or
/// from its zone's file.
fn restore_memory(
    config: &VmConfig,
    dir: &Path,
    state: &SnapshotState,
) -> Result<GuestMemoryMmap, LaunchError> {
    let path = dir.join(MEMORY_FILE);
    let in_file = |r: &&RegionState| matches!(r.source, RegionSource::SnapshotFile { .. });
    let file = match state.memory.regions.iter().any(|r| in_file(&r)) {
        true => Some(open_memory_file(&path, state.memory.file_size)?),
        false => None,
    };
    let backing = config.memory_backing();
    let regions = state
        .memory
        .regions
        .iter()
        .map(|r| match (&r.source, &file) {
            (RegionSource::SnapshotFile { offset }, Some(f)) => {
                file_region(r, f, *offset, &backing, &path)
            }
            (RegionSource::Zone { zone, offset }, _) => zone_region(config, r, zone, *offset),
            (RegionSource::SnapshotFile { .. }, None) => unreachable!("opened above"),
        })
        .collect::<Result<Vec<_>, _>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(|e| memory::MemoryError::Regions(e).into())
}

/// The memory file, which must be as long as state.json says (a truncated copy is refused).
fn open_memory_file(path: &Path, len: u64) -> Result<File, LaunchError> {
    let file = File::open(path).map_err(|error| SnapshotError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let found = file.metadata().map(|m| m.len()).unwrap_or(0);
    if found != len {
        return Err(SnapshotError::Corrupt(format!(
            "{} is {found} bytes, the snapshot wrote {len}",
            path.display()
        ))
        .into());
    }
    Ok(file)
}

/// A region whose bytes are in the memory file: mapped from it, private, unless the config
/// backs memory otherwise (then new memory with the file's data copied in).
fn file_region(
    r: &RegionState,
    file: &File,
    offset: u64,
    backing: &Backing,
    path: &Path,
) -> Result<GuestRegionMmap, LaunchError> {
    let start = GuestAddress(r.gpa);
    if *backing == Backing::default() {
        let dup = file.try_clone().map_err(|error| SnapshotError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        return Ok(memory::create_file_region(
            start, r.size, dup, offset, false, path,
        )?);
    }
    let region = memory::create_region(start, r.size, backing)?;
    // SAFETY: `region` was just mapped with `r.size` bytes and nothing else uses it yet.
    unsafe { memory_file::load(file, offset, r.size, region.as_ptr()) }.map_err(|error| {
        SnapshotError::Read {
            path: path.to_path_buf(),
            error,
        }
    })?;
    Ok(region)
}

/// A region whose bytes are in memory zone `zone`'s file, mapped as config.json says now
/// (Kata turns `shared` off for the VMs it makes from a template: copy-on-write).
fn zone_region(
    config: &VmConfig,
    r: &RegionState,
    zone: &str,
    offset: u64,
) -> Result<GuestRegionMmap, LaunchError> {
    let z = config.memory_zones.iter().find(|z| z.id == zone);
    let Some((z, path)) = z.and_then(|z| Some((z, z.file.as_ref()?))) else {
        return Err(mismatch(format!(
            "the guest's memory is in the file of memory zone {zone}, which config.json \
             does not have"
        )));
    };
    let file = memory::open_memory_file(path, z.shared)?;
    let start = GuestAddress(r.gpa);
    Ok(memory::create_file_region(
        start, r.size, file, offset, z.shared, path,
    )?)
}
