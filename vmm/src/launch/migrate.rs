//! A running VM sent by live migration ([`Outgoing`], the sender's [`Source`]) and a VM made
//! from one received ([`Incoming`], the receiver's [`Destination`]). The state is what a
//! snapshot captures (`launch/snapshot.rs`), carried in memory instead of files; the VM is
//! made as a restore makes it (`launch/restore.rs`). See docs/migration.md.

use std::os::fd::{BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    MemoryRegionAddress,
};

use super::{premade_vm, restore_premade, LaunchError, LaunchedVm, PremadeVm, RestoreOptions};
use crate::config::VmConfig;
use crate::devices::virtio::dirty_log::shared::SharedLog;
use crate::devices::virtio::BackendLog;
use crate::kvm::{dirty_log, state};
use crate::memory;
use crate::memory::hotplug::HotplugRam;
use crate::memory::huge_fill::HugeFill;
use crate::migration::protocol::{MemoryRange, MigrationConfig, RegionLayout};
use crate::migration::receiver::Destination;
use crate::migration::sender::Source;
use crate::migration::MigrationError;
use crate::snapshot::format::{
    MemorySection, RegionSource, RegionState, SnapshotState, VcpuState, Version, VmSection,
};
use crate::snapshot::{cpu_features, device_data, DeviceEntry, SnapshotError};

/// The destination's moment State's payload is parsed and checked (`-v`).
const PARSED: &str = "migration: State parsed (state.json checked, the devices' data taken)";

const VCPU_TIME: std::time::Duration = std::time::Duration::from_secs(5);

fn launch_error(e: LaunchError) -> MigrationError {
    match e {
        LaunchError::Snapshot(s) => MigrationError::Snapshot(s),
        other => MigrationError::Destination(other.to_string()),
    }
}

/// Device kinds whose writes to guest memory the device dirty log covers: exitless's own
/// virtio devices, whose every completion goes through it (see
/// `devices/virtio/dirty_log.rs`).
const LOGGED_DEVICES: &[&str] = &[
    "virtio-blk",
    "virtio-net",
    "virtio-vsock",
    "virtio-rng",
    "virtio-balloon",
];

/// A virtio device whose driver set it up and whose writes to guest memory the device dirty
/// log does not see (a kind exitless does not serve on its own devices thread, unless its
/// back end logs them: `logging`, virtio-fs on virtiofsd) is refused by name rather than
/// sent with pages missing.
fn check_no_device_writes(
    devices: &std::collections::BTreeMap<String, DeviceEntry>,
    logging: &[String],
) -> Result<(), MigrationError> {
    for (id, d) in devices {
        let untouched = d.state.get("untouched").and_then(|u| u.as_bool()) == Some(true);
        let logged = LOGGED_DEVICES.contains(&d.kind.as_str()) || logging.contains(id);
        if d.kind.starts_with("virtio") && !untouched && !logged {
            return Err(MigrationError::Unsupported(format!(
                "device {id} ({}) was set up by its driver and its back end writes guest \
                 memory outside exitless, which no dirty log sees: a VM with it running \
                 cannot be migrated",
                d.kind
            )));
        }
    }
    Ok(())
}

impl LaunchedVm {
    /// What a migration refuses, checked before a byte is sent: what a snapshot refuses
    /// (the same lines), and devices that write guest memory where no log sees it.
    pub fn check_migratable(&mut self) -> Result<(), MigrationError> {
        self.check_snapshottable().map_err(launch_error)?;
        let logging = backends_logging(self, BackendLog::Check)?;
        let devices = self.devices.snapshot_devices();
        self.devices.snapshot_ended();
        check_no_device_writes(&devices?, &logging)
    }
}

/// The devices whose vhost-user back ends log their writes to guest memory (or would:
/// `Check`), after `log` was asked of each; a back end that cannot is refused by name.
fn backends_logging(vm: &LaunchedVm, log: BackendLog) -> Result<Vec<String>, MigrationError> {
    vm.devices.backend_logs(log).map_err(|e| {
        MigrationError::Unsupported(format!("{e}: a VM with it running cannot be migrated"))
    })
}

/// The sending side of a migration of `vm`, whose config in Cloud Hypervisor's schema is
/// `config` (what `vm.info` shows).
pub struct Outgoing<'a> {
    pub vm: &'a mut LaunchedVm,
    pub config: serde_json::Value,
    /// Where the state's capture went, once captured (`-v`).
    pub captured: CaptureSteps,
}

/// The steps of the state's capture, in the order they run (the source's `-v`).
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureSteps {
    /// The parked vCPUs finish what their last exits left pending (a run with
    /// `immediate_exit`), so the devices are saved with every access they made.
    pub settle: std::time::Duration,
    /// The devices drained and their state saved (on the devices thread).
    pub devices: std::time::Duration,
    /// Each vCPU's state read on its own thread.
    pub vcpus: std::time::Duration,
    /// The irqchip, PIT and clock read.
    pub vm: std::time::Duration,
    /// The state encoded (state.json's text and the devices' data after it).
    pub encode: std::time::Duration,
    /// The State payload's bytes.
    pub bytes: usize,
}

impl<'a> Outgoing<'a> {
    pub fn new(vm: &'a mut LaunchedVm, config: serde_json::Value) -> Self {
        Outgoing {
            vm,
            config,
            captured: CaptureSteps::default(),
        }
    }
}

impl Outgoing<'_> {
    /// How the vCPUs' writes are tracked ("ring", "bitmap (manual protect)", "bitmap").
    pub fn dirty_kind(&self) -> &'static str {
        self.vm.vm.dirty.kind()
    }

    /// Guest memory as it is now (its regions are KVM's slots 0, 1, ...).
    fn mem(&self) -> Arc<GuestMemoryMmap> {
        self.vm.vm.memory().into_inner()
    }

    fn tracking(&self, on: bool) -> Result<(), MigrationError> {
        let vm = &self.vm.vm;
        if on {
            // Before any slot logs: the rings mapped, or the bitmap's manual protect on.
            vm.dirty
                .start(&vm.kvm, &vm.fd, &self.mem())
                .map_err(|e| MigrationError::Destination(format!("dirty log: {e}")))?;
        }
        for (slot, region) in (0u32..).zip(self.mem().iter()) {
            dirty_log::set_logging(&self.vm.vm.fd, slot, region, on)
                .map_err(|e| MigrationError::Destination(format!("dirty log: {e}")))?;
        }
        Ok(())
    }

    /// The VM's state as a snapshot's state.json, memory laid out as one file would be,
    /// with the devices' data after it (`device_data::frame_state`).
    fn state(&mut self) -> Result<Vec<u8>, MigrationError> {
        let mut at = std::time::Instant::now();
        let mut step = move || {
            let now = std::time::Instant::now();
            std::mem::replace(&mut at, now).elapsed()
        };
        let nothing: crate::vcpu::VcpuTask = Arc::new(|_, _| {});
        let running = self.vm.running().map_err(launch_error)?;
        running
            .on_each_vcpu(nothing, VCPU_TIME)
            .map_err(|e| MigrationError::Destination(e.to_string()))?;
        self.captured.settle = step();
        let devices = self.vm.devices.snapshot_devices()?;
        let logging = backends_logging(self.vm, BackendLog::Check)?;
        check_no_device_writes(&devices, &logging)?;
        self.captured.devices = step();
        let vcpus = self.vm.capture_vcpus().map_err(launch_error)?;
        self.captured.vcpus = step();
        let vm = state::capture_vm(&self.vm.vm.fd).map_err(SnapshotError::Kvm)?;
        self.captured.vm = step();
        let mut state = self.saved_state(vcpus, &vm, devices);
        let json = state.to_json()?;
        let framed = device_data::frame_state(json.as_bytes(), &state.devices);
        self.captured.encode = step();
        self.captured.bytes = framed.len();
        Ok(framed)
    }

    /// The state as a snapshot's state.json holds it, memory laid out as one file would be.
    fn saved_state(
        &self,
        vcpus: Vec<(u8, crate::kvm::state::VcpuKvmState)>,
        vm: &state::VmKvmState,
        devices: std::collections::BTreeMap<String, DeviceEntry>,
    ) -> SnapshotState {
        let max_vcpus = self.vm.template.as_ref().map_or(1, |t| t.topology_cpus());
        let mut regions = Vec::new();
        let mut offset = 0;
        for r in self.mem().iter() {
            regions.push(RegionState {
                gpa: r.start_addr().0,
                size: r.len(),
                source: RegionSource::SnapshotFile { offset },
            });
            offset += r.len();
        }
        SnapshotState {
            version: Version::current(),
            checksum: String::new(),
            cpu: cpu_features::features_of(&vcpus[0].1.cpuid),
            vcpus: vcpus
                .iter()
                .map(|(id, v)| VcpuState::from_kvm(*id, v))
                .collect(),
            vm: VmSection::from_kvm(max_vcpus, vm),
            memory: MemorySection {
                size: offset,
                hotplugged: self.vm.hotplug_ram.as_ref().map_or(0, HotplugRam::added),
                file_size: offset,
                regions,
            },
            devices,
        }
    }
}

impl Source for Outgoing<'_> {
    fn config(&self) -> Result<MigrationConfig, MigrationError> {
        let regions = (0u32..)
            .zip(self.mem().iter())
            .map(|(slot, r)| RegionLayout {
                slot,
                gpa: r.start_addr().0,
                size: r.len(),
                fd_offset: memory::shared_file(r).map_or(0, |f| f.1),
            })
            .collect();
        let vcpus = self.vm.vcpu_ids().into_iter().flat_map(u8::try_from);
        Ok(MigrationConfig {
            config: self.config.clone(),
            regions,
            vcpus: Some(vcpus.collect()),
        })
    }

    fn memory_fds(&self) -> Result<Vec<(u32, RawFd)>, MigrationError> {
        let mut fds = Vec::new();
        for (slot, r) in (0u32..).zip(self.mem().iter()) {
            let Some((fd, _)) = memory::shared_file(r) else {
                return Err(MigrationError::Unsupported(format!(
                    "local migration sends shared memory as fds, and the guest memory at \
                     {:#x} is private: give the VM memory shared=on (or shared zones)",
                    r.start_addr().0
                )));
            };
            fds.push((slot, fd));
        }
        Ok(fds)
    }

    fn start_tracking(&mut self) -> Result<(), MigrationError> {
        self.tracking(true)?;
        self.vm.devices.device_log().start();
        let end = self.mem().last_addr().0 + 1;
        let shared =
            SharedLog::new(end).map_err(|e| MigrationError::Io("the back ends' log", e))?;
        let shared = Arc::new(shared);
        self.vm.devices.device_log().share(Some(shared.clone()));
        if let Err(e) = backends_logging(self.vm, BackendLog::Start(shared)) {
            self.stop_tracking();
            return Err(e);
        }
        // Clears whatever a log read would report from before.
        self.dirty().map(drop)
    }

    fn stop_tracking(&mut self) {
        self.vm.devices.device_log().stop();
        if let Err(e) = self.vm.devices.backend_logs(BackendLog::Stop) {
            eprintln!("exitless: a back end did not stop logging after the migration: {e}");
        }
        self.vm.devices.device_log().share(None);
        let _ = self.tracking(false);
    }

    fn touched(&mut self) -> Result<Vec<MemoryRange>, MigrationError> {
        let mut out = Vec::new();
        for r in self.mem().iter() {
            let backing = r.file_offset().map(|f| (f.file(), f.start()));
            let pages = touched_pages(r.as_ptr(), r.len(), backing)
                .map_err(|e| MigrationError::Io("finding touched pages", e))?;
            out.extend(ranges_of(r.start_addr().0, &pages, |p| !zero_page(r, p)));
        }
        Ok(out)
    }

    /// KVM's log of the vCPUs' writes (the rings or the bitmap), ORed with the devices' log
    /// of theirs.
    fn dirty(&mut self) -> Result<Vec<MemoryRange>, MigrationError> {
        let mem = self.mem();
        let devices = self.vm.devices.device_log().take(&mem);
        let (tracking, fd) = (&self.vm.vm.dirty, &self.vm.vm.fd);
        let failed = |e| MigrationError::Destination(format!("dirty log: {e}"));
        tracking.harvest(fd).map_err(failed)?;
        let mut out = Vec::new();
        for (slot, r) in (0u32..).zip(mem.iter()) {
            let mut bitmap = tracking.take(fd, slot, r.len()).map_err(failed)?;
            let gpa = r.start_addr().0;
            add_pages(&mut bitmap, gpa / dirty_log::PAGE, &devices);
            out.extend(
                dirty_log::runs(&bitmap)
                    .into_iter()
                    .map(|(p, n)| MemoryRange {
                        gpa: gpa + p * dirty_log::PAGE,
                        length: n * dirty_log::PAGE,
                    }),
            );
        }
        Ok(out)
    }

    fn send(&self, gpa: u64, len: u64, to: BorrowedFd<'_>) -> Result<(), MigrationError> {
        let mut to = to;
        self.mem()
            .write_all_volatile_to(GuestAddress(gpa), &mut to, len as usize)
            .map_err(|e| MigrationError::Protocol(format!("sending guest memory: {e}")))
    }

    fn pause(&mut self) -> Result<(), MigrationError> {
        self.vm.pause().map_err(launch_error)
    }

    fn resume(&mut self) {
        let _ = self.vm.resume();
    }

    fn capture(&mut self) -> Result<Vec<u8>, MigrationError> {
        self.state()
    }

    fn end_capture(&mut self) {
        self.vm.devices.snapshot_ended();
    }

    fn release_files(&mut self) -> Result<(), MigrationError> {
        self.vm
            .devices
            .image_locks(false)
            .map_err(MigrationError::Destination)
    }

    fn retake_files(&mut self) {
        if let Err(e) = self.vm.devices.image_locks(true) {
            eprintln!("exitless: a disk's lock not taken back after the failed migration: {e}");
        }
    }
}

/// Sets in `bitmap` (one bit a page, from guest page `first`) the guest pages of `pages`
/// (sorted) that it covers.
fn add_pages(bitmap: &mut [u64], first: u64, pages: &[u64]) {
    let end = first + bitmap.len() as u64 * 64;
    let from = pages.partition_point(|&p| p < first);
    for &p in pages[from..].iter().take_while(|&&p| p < end) {
        let i = p - first;
        bitmap[(i / 64) as usize] |= 1 << (i % 64);
    }
}

/// Whether page `p` of region `r` is all zeros, read in place a word at a time up to the
/// first one that is not (as the guest may be writing it: a page it writes later is in the
/// dirty log).
fn zero_page(r: &vm_memory::GuestRegionMmap, p: u64) -> bool {
    let Ok(page) = r.get_slice(MemoryRegionAddress(p * 4096), 4096) else {
        return false;
    };
    let words = page.ptr_guard().as_ptr() as *const u64;
    // SAFETY: the slice is 4096 bytes of mapped guest memory that lives as long as the
    // region, page-aligned (u64 reads are aligned); volatile reads, as the guest may write.
    (0..512).all(|i| unsafe { std::ptr::read_volatile(words.add(i)) } == 0)
}

/// The guest-physical ranges of the pages of `touched` (one bool a page) that `keep`.
fn ranges_of(gpa: u64, touched: &[bool], keep: impl Fn(u64) -> bool) -> Vec<MemoryRange> {
    let mut out: Vec<MemoryRange> = Vec::new();
    for (p, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
        let p = p as u64;
        if !keep(p) {
            continue;
        }
        let at = gpa + p * 4096;
        match out.last_mut() {
            Some(r) if r.gpa + r.length == at => r.length += 4096,
            _ => out.push(MemoryRange {
                gpa: at,
                length: 4096,
            }),
        }
    }
    out
}

/// Which pages of the mapping at `host` (`len` bytes) the guest touched: present or swapped
/// in `/proc/self/pagemap`, and for a file-backed region also the file's data extents.
fn touched_pages(
    host: *const u8,
    len: u64,
    backing: Option<(&std::fs::File, u64)>,
) -> std::io::Result<Vec<bool>> {
    use std::os::unix::fs::FileExt;
    let pages = (len / 4096) as usize;
    let pagemap = std::fs::File::open("/proc/self/pagemap")?;
    let mut touched = vec![false; pages];
    let mut raw = vec![0u8; 8 << 15];
    for (chunk, t) in touched.chunks_mut(1 << 15).enumerate() {
        let first = host as u64 / 4096 + (chunk as u64) * (1 << 15);
        let raw = &mut raw[..t.len() * 8];
        pagemap.read_exact_at(raw, first * 8)?;
        for (i, e) in raw.chunks_exact(8).enumerate() {
            t[i] = e[7] & 0xc0 != 0;
        }
    }
    if let Some((file, offset)) = backing {
        for (at, n) in crate::snapshot::memory_file::data_extents(file, offset, len)? {
            let end = (at + n).div_ceil(4096).min(pages as u64);
            for p in at / 4096..end {
                touched[p as usize] = true;
            }
        }
    }
    Ok(touched)
}

/// The receiving side: makes guest memory and the KVM VM on it (its slots and irqchip) at
/// Config, fills the memory from Memory requests, and puts the saved state back (as a
/// restore: vCPUs, devices) at State. `convert` turns the Config's VM config (Cloud
/// Hypervisor's schema) into exitless's.
pub struct Incoming<'a> {
    convert: &'a mut dyn FnMut(&serde_json::Value) -> Result<VmConfig, String>,
    config: Option<VmConfig>,
    mem: Option<GuestMemoryMmap>,
    /// The VM made on `mem` at Config, what does not need the saved state.
    premade: Option<PremadeVm>,
    /// Huge pages asked for where whole 2 MiB chunks are filled (see `memory::huge_fill`).
    huge: HugeFill,
    vm: Option<LaunchedVm>,
}

impl<'a> Incoming<'a> {
    pub fn new(convert: &'a mut dyn FnMut(&serde_json::Value) -> Result<VmConfig, String>) -> Self {
        Incoming {
            convert,
            config: None,
            mem: None,
            premade: None,
            huge: HugeFill::default(),
            vm: None,
        }
    }

    /// The VM made, once the migration completed.
    pub fn into_vm(mut self) -> Option<LaunchedVm> {
        self.vm.take()
    }
}

/// A migration that failed after the VM was made ends that VM.
impl Drop for Incoming<'_> {
    fn drop(&mut self) {
        if let Some(mut vm) = self.vm.take() {
            vm.shut_down();
        }
    }
}

fn destination(why: impl std::fmt::Display) -> MigrationError {
    MigrationError::Destination(why.to_string())
}

/// Guest memory on the fds a `local` migration sent, by slot.
fn memory_on_fds(
    layout: &[RegionLayout],
    mut fds: Vec<(u32, OwnedFd)>,
) -> Result<GuestMemoryMmap, MigrationError> {
    let mut regions = Vec::new();
    for r in layout {
        let i = fds
            .iter()
            .position(|f| f.0 == r.slot)
            .ok_or_else(|| MigrationError::Protocol(format!("no memory fd for slot {}", r.slot)))?;
        let file = std::fs::File::from(fds.swap_remove(i).1);
        let path = std::path::Path::new("(memory fd from the source)");
        let region =
            memory::create_file_region(GuestAddress(r.gpa), r.size, file, r.fd_offset, true, path)
                .map_err(|e| MigrationError::Protocol(e.to_string()))?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| MigrationError::Protocol(e.to_string()))
}

impl Destination for Incoming<'_> {
    fn configure(
        &mut self,
        c: MigrationConfig,
        fds: Vec<(u32, OwnedFd)>,
    ) -> Result<(), MigrationError> {
        let config = (self.convert)(&c.config).map_err(MigrationError::Protocol)?;
        let mem = match fds.is_empty() {
            false => memory_on_fds(&c.regions, fds)?,
            true => match config.zones() {
                Some(zones) => memory::create_zoned_memory(&zones),
                None => {
                    memory::create_guest_memory(config.memory.bytes(), &config.memory_backing())
                }
            }
            .map_err(destination)?,
        };
        let made: Vec<(u64, u64)> = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
        let sent: Vec<(u64, u64)> = c.regions.iter().map(|r| (r.gpa, r.size)).collect();
        if made != sent {
            return Err(MigrationError::Protocol(format!(
                "memory regions {sent:x?} where the config makes {made:x?}"
            )));
        }
        // What needs no saved state is made now, not in the downtime (State): the VM and
        // its vCPUs, those the source has (all the config counts).
        let ids = c.vcpus.unwrap_or_else(|| (0..config.cpus).collect());
        if ids.len() != usize::from(config.cpus) {
            return Err(MigrationError::Protocol(format!(
                "vCPUs {ids:?} where the config has {}",
                config.cpus
            )));
        }
        let premade = premade_vm(&config, &ids, mem.clone()).map_err(launch_error)?;
        self.premade = Some(premade);
        self.config = Some(config);
        self.mem = Some(mem);
        Ok(())
    }

    fn regions(&self) -> Vec<(u64, u64)> {
        self.mem
            .iter()
            .flat_map(|m| m.iter().map(|r| (r.start_addr().0, r.len())))
            .collect()
    }

    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]) -> Result<(), MigrationError> {
        let r = self.mem.as_ref().and_then(|m| m.iter().nth(region));
        let r = r.ok_or_else(|| destination("memory before the config"))?;
        r.write_slice(bytes, MemoryRegionAddress(offset))
            .map_err(destination)
    }

    fn fill(
        &mut self,
        region: usize,
        offset: u64,
        len: u64,
        from: BorrowedFd<'_>,
    ) -> Result<(), MigrationError> {
        let r = self.mem.as_ref().and_then(|m| m.iter().nth(region));
        let r = r.ok_or_else(|| destination("memory before the config"))?;
        if r.is_hugetlbfs() != Some(true) {
            // Checked by the caller: the range lies inside the region.
            self.huge
                .cover(r.as_ptr() as usize + offset as usize, len as usize);
        }
        let mut from = from;
        r.read_exact_volatile_from(MemoryRegionAddress(offset), &mut from, len as usize)
            .map_err(|e| MigrationError::Protocol(format!("reading guest memory: {e}")))
    }

    fn state(&mut self, bytes: &[u8]) -> Result<(), MigrationError> {
        crate::startup::mark(crate::startup::restore_moment::STATE);
        let (json, data) = device_data::unframe_state(bytes).map_err(MigrationError::Protocol)?;
        let mut state = SnapshotState::parse(json)?;
        device_data::take_all(data, &mut state.devices)?;
        crate::startup::mark(PARSED);
        let (Some(config), Some(premade)) = (self.config.as_ref(), self.premade.take()) else {
            return Err(destination("state before the config"));
        };
        self.mem = None;
        self.huge.end();
        let vm = restore_premade(config, premade, state, RestoreOptions::default())
            .map_err(launch_error)?;
        self.vm = Some(vm);
        Ok(())
    }

    fn complete(&mut self, resume: bool) -> Result<(), MigrationError> {
        let vm = self
            .vm
            .as_ref()
            .ok_or_else(|| destination("complete before the state"))?;
        if resume {
            vm.resume().map_err(launch_error)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pages_join_the_bitmap_of_their_region_only() {
        let mut bitmap = vec![0u64; 2];
        add_pages(
            &mut bitmap,
            0x100,
            &[0x10, 0x100, 0x13f, 0x17f, 0x180, 0x1000],
        );
        assert_eq!(bitmap, [1 | 1 << 63, 1 << 63]);
    }

    fn entry(kind: &str, untouched: bool) -> DeviceEntry {
        let state = serde_json::json!({ "untouched": untouched });
        serde_json::from_value(serde_json::json!({ "kind": kind, "state": state })).unwrap()
    }

    #[test]
    fn only_devices_writing_outside_exitless_are_refused() {
        let mut devices = std::collections::BTreeMap::new();
        for kind in LOGGED_DEVICES {
            devices.insert(format!("{kind}0"), entry(kind, false));
        }
        devices.insert("fs0".into(), entry("virtio-fs", true));
        devices.insert("serial".into(), entry("serial", false));
        check_no_device_writes(&devices, &[]).unwrap();
        devices.insert("fs0".into(), entry("virtio-fs", false));
        let e = check_no_device_writes(&devices, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("fs0 (virtio-fs)"), "{e}");
        // Its back end logs its writes.
        check_no_device_writes(&devices, &["fs0".into()]).unwrap();
        devices.remove("fs0");
        devices.insert("pmem0".into(), entry("virtio", false));
        assert!(check_no_device_writes(&devices, &[]).is_err());
    }

    #[test]
    fn touched_pages_become_ranges_of_runs() {
        let t = [true, true, false, true, true, true];
        let r = ranges_of(0x1000, &t, |p| p != 4);
        assert_eq!(
            r,
            [
                MemoryRange {
                    gpa: 0x1000,
                    length: 0x2000
                },
                MemoryRange {
                    gpa: 0x4000,
                    length: 0x1000
                },
                MemoryRange {
                    gpa: 0x6000,
                    length: 0x1000
                },
            ]
        );
    }
}
