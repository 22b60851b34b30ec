//! Saving a paused VM to a directory (`vm.snapshot`): its devices, each vCPU (read on the
//! vCPU's own thread), the irqchip, PIT and clock, and guest memory, sparse. See
//! docs/snapshot.md.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use super::{LaunchError, LaunchedVm};
use crate::config::{IrqchipMode, MemoryZoneConfig};
use crate::kvm::state::{self, StateProbe, VcpuKvmState};
use crate::memory::hotplug::HotplugRam;
use crate::snapshot::format::{
    MemorySection, RegionSource, RegionState, SnapshotState, VcpuState, Version, VmSection,
};
use crate::snapshot::memory_file::{self, SaveRegion, Scan, Written};
use crate::snapshot::{cpu_features, write_file, SnapshotError, MEMORY_FILE, STATE_FILE};

/// How long the vCPUs have to hand over their state.
const VCPU_STATE_TIME: Duration = Duration::from_secs(5);

/// What a snapshot wrote.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotSummary {
    /// Guest memory looked at and written, in bytes.
    pub memory: Written,
    /// The memory file's length (its allocated blocks are about `memory.written`).
    pub file_size: u64,
    pub elapsed: Duration,
}

fn unsupported(why: &str) -> LaunchError {
    SnapshotError::Unsupported(why.to_string()).into()
}

impl LaunchedVm {
    /// Writes this VM, paused, to `dir`: `config` (its config in Cloud Hypervisor's schema)
    /// as config.json, guest memory as the sparse memory file, state.json last (a snapshot is
    /// complete once it is there; an older one in `dir` is removed first). Memory in a zone
    /// whose file is mapped shared is not copied: the file holds it (`zones` says which).
    /// With `verbose`, progress goes to stderr.
    pub fn snapshot(
        &mut self,
        dir: &Path,
        config: &serde_json::Value,
        zones: &[MemoryZoneConfig],
        verbose: bool,
    ) -> Result<SnapshotSummary, LaunchError> {
        let saved = self.write_snapshot(dir, config, zones, verbose);
        // Devices that held still (receive queues) go on, whether it was written or not.
        self.devices.snapshot_ended();
        saved
    }

    fn write_snapshot(
        &mut self,
        dir: &Path,
        config: &serde_json::Value,
        zones: &[MemoryZoneConfig],
        verbose: bool,
    ) -> Result<SnapshotSummary, LaunchError> {
        let start = Instant::now();
        crate::snapshot::check_dir(dir)?;
        self.check_snapshottable()?;
        // The vCPUs finish what their last exits left pending first (a run with
        // `immediate_exit`: an I/O or MMIO read's value into its register, writes KVM queued
        // in the coalesced ring dispatched to the devices), so the devices are saved with
        // every access the saved vCPUs made; their state is read after the devices settled,
        // with the interrupts that settling raised.
        let nothing: crate::vcpu::VcpuTask = Arc::new(|_, _| {});
        self.running()?.on_each_vcpu(nothing, VCPU_STATE_TIME)?;
        let devices = self.devices.snapshot_devices()?;
        let vcpus = self.capture_vcpus()?;
        let vm = state::capture_vm(&self.vm.fd).map_err(SnapshotError::Kvm)?;
        let max_vcpus = self.template.as_ref().map_or(1, |t| t.topology_cpus());
        let cpu = cpu_features::features_of(&vcpus[0].1.cpuid);
        remove_old_state(dir)?;
        crate::snapshot::device_data::write_all(dir, &devices)?;
        let (memory, written) = self.save_memory(dir, zones, verbose, start)?;
        let config_text =
            serde_json::to_vec_pretty(config).map_err(|e| SnapshotError::Encode(e.to_string()))?;
        write_file(dir, crate::snapshot::CONFIG_FILE, &config_text)?;
        let mut state = SnapshotState {
            version: Version::current(),
            checksum: String::new(),
            cpu,
            vcpus: vcpus
                .iter()
                .map(|(id, v)| VcpuState::from_kvm(*id, v))
                .collect(),
            vm: VmSection::from_kvm(max_vcpus, &vm),
            memory,
            devices,
        };
        let file_size = state.memory.file_size;
        write_file(dir, STATE_FILE, state.to_json()?.as_bytes())?;
        Ok(SnapshotSummary {
            memory: written,
            file_size,
            elapsed: start.elapsed(),
        })
    }

    /// What a snapshot cannot save yet is refused before anything is written.
    pub(super) fn check_snapshottable(&self) -> Result<(), LaunchError> {
        if self.vm.irqchip != IrqchipMode::Kernel {
            return Err(unsupported(
                "only a VM with the in-kernel irqchip (--irqchip kernel) can be snapshotted",
            ));
        }
        if self.devices.ejects_waiting() {
            return Err(unsupported(
                "the guest ejected a device or CPU whose removal is not done yet; try again",
            ));
        }
        Ok(())
    }

    /// Each live vCPU's state with its id (ascending; vCPUs added or removed while the VM
    /// ran leave gaps), read on its own thread while parked.
    pub(super) fn capture_vcpus(&self) -> Result<Vec<(u8, VcpuKvmState)>, LaunchError> {
        let probe = StateProbe::new(&self.vm.kvm, &self.vm.fd).map_err(SnapshotError::Kvm)?;
        let running = self.running()?;
        let mut ids = running.vcpu_ids();
        ids.sort_unstable();
        let results: Arc<Mutex<BTreeMap<usize, Captured>>> = Arc::default();
        let into = results.clone();
        let task: crate::vcpu::VcpuTask = Arc::new(move |id, fd| {
            let captured = state::capture_vcpu(fd, &probe);
            lock(&into).insert(id, captured);
        });
        running.on_each_vcpu(task, VCPU_STATE_TIME)?;
        let mut taken = std::mem::take(&mut *lock(&results));
        let mut vcpus = Vec::with_capacity(ids.len());
        for id in ids {
            let captured = taken.remove(&id);
            let id8 = u8::try_from(id).map_err(|_| SnapshotError::Vcpus(vec![id]))?;
            match captured {
                Some(r) => vcpus.push((id8, r.map_err(SnapshotError::Kvm)?)),
                None => return Err(SnapshotError::Vcpus(vec![id]).into()),
            }
        }
        if vcpus.is_empty() {
            return Err(SnapshotError::Vcpus(Vec::new()).into());
        }
        Ok(vcpus)
    }

    /// Writes the memory file (through a temporary name) and says where each region is.
    fn save_memory(
        &self,
        dir: &Path,
        zones: &[MemoryZoneConfig],
        verbose: bool,
        start: Instant,
    ) -> Result<(MemorySection, Written), LaunchError> {
        let shared_zones = shared_zone_files(zones);
        let mut regions = Vec::new();
        let mut to_save = Vec::new();
        let mut cursor = 0u64;
        let mem = self.vm.memory();
        for region in mem.iter() {
            let (gpa, len) = (region.start_addr().0, region.len());
            let file = region
                .file_offset()
                .filter(|_| region.flags() & libc::MAP_SHARED != 0);
            let zone =
                file.and_then(|f| zone_of(f.file(), &shared_zones).map(|id| (id, f.start())));
            let source = match zone {
                Some((zone, offset)) => RegionSource::Zone { zone, offset },
                None => {
                    to_save.push(SaveRegion {
                        host: region.as_ptr(),
                        len,
                        file_offset: cursor,
                        backing: region.file_offset().map(|f| (f.file(), f.start())),
                    });
                    cursor += len;
                    RegionSource::SnapshotFile {
                        offset: cursor - len,
                    }
                }
            };
            regions.push(RegionState {
                gpa,
                size: len,
                source,
            });
        }
        let total = mem.iter().map(|r| r.len()).sum();
        let written = write_memory_file(dir, cursor, &to_save, verbose, start)?;
        let memory = MemorySection {
            size: total,
            hotplugged: self.hotplug_ram.as_ref().map_or(0, HotplugRam::added),
            file_size: cursor,
            regions,
        };
        Ok((memory, written))
    }
}

/// A vCPU's state as its thread read it.
type Captured = Result<VcpuKvmState, crate::kvm::KvmError>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new snapshot in `dir` first removes the old one's state.json: until the new one is
/// complete, `dir` holds no snapshot that looks valid.
fn remove_old_state(dir: &Path) -> Result<(), SnapshotError> {
    match std::fs::remove_file(dir.join(STATE_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SnapshotError::Write {
            path: dir.join(STATE_FILE),
            error: e,
        }),
        _ => Ok(()),
    }
}

/// (device, inode) of each zone's file that is mapped shared, with the zone's id.
fn shared_zone_files(zones: &[MemoryZoneConfig]) -> Vec<((u64, u64), String)> {
    zones
        .iter()
        .filter(|z| z.shared)
        .filter_map(|z| {
            let m = std::fs::metadata(z.file.as_ref()?).ok()?;
            Some(((m.dev(), m.ino()), z.id.clone()))
        })
        .collect()
}

/// The zone whose named file `file` is (still linked: its bytes outlive the VM).
fn zone_of(file: &File, zones: &[((u64, u64), String)]) -> Option<String> {
    let m = file.metadata().ok()?;
    let key = (m.dev(), m.ino());
    let found = zones.iter().find(|(k, _)| *k == key)?;
    (m.nlink() > 0).then(|| found.1.clone())
}

/// Writes `regions` to the memory file through a temporary name (none needed: a stale file
/// is removed).
fn write_memory_file(
    dir: &Path,
    len: u64,
    regions: &[SaveRegion<'_>],
    verbose: bool,
    start: Instant,
) -> Result<Written, SnapshotError> {
    let path = dir.join(MEMORY_FILE);
    if regions.is_empty() {
        let _ = std::fs::remove_file(&path);
        return Ok(Written::default());
    }
    let tmp = dir.join(format!(".{MEMORY_FILE}.tmp"));
    let write_error = |error| SnapshotError::Write {
        path: path.clone(),
        error,
    };
    let file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(write_error)?;
    let mut progress = |w: &Written| {
        if verbose {
            eprintln!(
                "exitless: vm.snapshot: memory {}/{} MiB scanned, {} MiB written ({:.0} ms)",
                w.scanned >> 20,
                len >> 20,
                w.written >> 20,
                memory_file::ms_since(start)
            );
        }
    };
    let saved = memory_file::save(&file, len, regions, Scan::Pagemap, &mut progress)
        .and_then(|w| std::fs::rename(&tmp, &path).map(|()| w));
    saved.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        write_error(e)
    })
}
