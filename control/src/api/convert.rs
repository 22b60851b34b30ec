//! From Cloud Hypervisor's bodies to exitless's own configuration, and back for `vm.info`.
//! A field asking for what exitless lacks is refused with its name (400); fields without
//! effect here are accepted and kept (listed in docs/api.md).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::schema::{
    BalloonConfig, ConsoleConfig, CpusConfig, DiskConfig, Extra, FsConfig, GenericVhostUserConfig,
    MemoryConfig, MemoryZoneConfig, NetConfig, PayloadConfig, PmemConfig, VmConfig, VsockConfig,
};
use super::ApiError;
use vmm::config::{self, MemorySize, SerialOutputMode, TapFd};

mod pmem;
mod vhost_user;

fn refuse(message: String) -> ApiError {
    ApiError {
        status: 400,
        message,
    }
}

/// Whether a JSON value asks for something: not null, false, 0, "", [] or {}.
fn asks(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Refuses the first of `fields` that `extra` (at `at`) sets.
fn refuse_set(extra: &Extra, at: &str, fields: &[&str]) -> Result<(), ApiError> {
    for f in fields {
        if extra.get(*f).is_some_and(asks) {
            return Err(refuse(format!("{at}{f} is not supported by exitless")));
        }
    }
    Ok(())
}

/// `devices` (VFIO), `user_devices` (vfio-user) and `vdpa`, refused with why (as their
/// endpoints are).
fn refuse_host_devices(extra: &Extra) -> Result<(), ApiError> {
    let fields = [
        ("devices", "vm.add-device"),
        ("user_devices", "vm.add-user-device"),
        ("vdpa", "vm.add-vdpa"),
    ];
    for (field, endpoint) in fields {
        if extra.get(field).is_some_and(asks) {
            let why = super::REFUSED_HOST_DEVICES
                .iter()
                .find(|(e, _)| *e == endpoint)
                .map_or("", |(_, why)| why);
            return Err(refuse(format!(
                "{field} is not supported by exitless: {why}"
            )));
        }
    }
    Ok(())
}

/// Top-level fields for devices and features exitless does not have.
const UNSUPPORTED: &[&str] = &[
    "devices",
    "user_devices",
    "vdpa",
    "sgx_epc",
    "numa",
    "tpm",
    "iommu",
    "watchdog",
    "pvpanic",
    "ivshmem",
    "landlock_enable",
    "pci_segments",
];

impl VmConfig {
    /// Refuses what exitless cannot honour, naming the field.
    pub fn check(&self) -> Result<(), ApiError> {
        refuse_host_devices(&self.extra)?;
        refuse_set(&self.extra, "", UNSUPPORTED)?;
        let platform = self.extra.get("platform").and_then(Value::as_object);
        if let Some(p) = platform {
            refuse_set(p, "platform.", &["tdx", "sev_snp", "iommu_segments"])?;
        }
        refuse_set(&self.cpus.extra, "cpus.", &["kvm_hyperv", "affinity"])?;
        refuse_set(&self.memory.extra, "memory.", &["reserve"])?;
        for z in self.memory.zones.iter().flatten() {
            refuse_set(&z.extra, "memory.zones[].", &["host_numa_node", "reserve"])?;
            if z.hotplugged_size.is_some_and(|s| s > 0) {
                return Err(refuse(
                    "memory.zones[].hotplugged_size is not supported by exitless (a zone grows \
                     through vm.resize-zone once booted)"
                        .into(),
                ));
            }
        }
        refuse_set(
            &self.payload.extra,
            "payload.",
            &["firmware", "igvm", "host_data"],
        )?;
        for d in self.disks.iter().flatten() {
            d.check()?;
        }
        for n in self.net.iter().flatten() {
            n.check()?;
        }
        let segments = self.pci_segments();
        for f in self.fs.iter().flatten() {
            f.check(self.memory.shared, segments)?;
        }
        for g in self.generic_vhost_user.iter().flatten() {
            g.check(self.memory.shared, segments)?;
        }
        for p in self.pmem.iter().flatten() {
            p.check(segments)?;
        }
        Ok(())
    }

    /// `platform.num_pci_segments` (1 when not given).
    pub fn pci_segments(&self) -> u64 {
        let platform = self.extra.get("platform");
        platform
            .and_then(|p| p.get("num_pci_segments"))
            .and_then(Value::as_u64)
            .unwrap_or(1)
    }

    /// exitless's configuration for this body (checked first).
    pub fn to_vm_config(&self) -> Result<config::VmConfig, ApiError> {
        self.check()?;
        let kernel = self.payload.kernel.as_deref().ok_or_else(|| {
            refuse("payload.kernel is required (exitless boots a kernel, not firmware)".into())
        })?;
        let mut c = config::VmConfig::new(kernel);
        c.initrd = self.payload.initramfs.as_ref().map(PathBuf::from);
        if let Some(cmdline) = &self.payload.cmdline {
            c.cmdline = cmdline.clone();
        }
        c.cpus = self.cpus.boot_vcpus;
        c.max_vcpus = Some(self.cpus.max_vcpus);
        (c.memory, c.memory_zones) = memory_zones(&self.memory)?;
        c.shared_memory = self.memory.shared;
        c.hugepages = self.memory.hugepages;
        c.hugepage_size = self.memory.hugepage_size.map(hugepage_size).transpose()?;
        c.hotplug_memory = hotplug_memory(&self.memory)?.or(zones_hotplug(&self.memory)?);
        c.serial_output = serial_output(self.serial.as_ref())?;
        // Cloud Hypervisor always has an entropy device; so does a VM made through the API.
        c.rng = true;
        for d in self.disks.iter().flatten() {
            c.disks.push(d.to_disk_config()?);
        }
        for n in self.net.iter().flatten() {
            if n.tap.is_none() {
                return Err(refuse(
                    "net[].tap is required in vm.create (tap fds come only with vm.add-net)".into(),
                ));
            }
            c.nets.push(n.to_net_config(Vec::new())?);
        }
        if let Some(v) = &self.vsock {
            c.vsock = Some(v.to_vsock_config()?);
        }
        for f in self.fs.iter().flatten() {
            c.fs.push(f.to_fs_config());
        }
        for g in self.generic_vhost_user.iter().flatten() {
            c.generic_vhost_user.push(g.to_config());
        }
        for p in self.pmem.iter().flatten() {
            c.pmem.push(p.to_config());
        }
        if let Some(b) = &self.balloon {
            c.balloon = Some(b.to_balloon_config(c.memory.bytes())?);
        }
        c.validate(config::MAX_VCPUS)
            .map_err(|e| refuse(e.to_string()))?;
        Ok(c)
    }

    /// The body that describes a VM started from the command line (`run --api-socket`).
    pub fn from_vm_config(c: &config::VmConfig) -> Self {
        let mut named = c.clone();
        name_devices_as_the_api_does(&mut named);
        let c = &named;
        VmConfig {
            cpus: CpusConfig {
                boot_vcpus: c.cpus,
                max_vcpus: c.max_vcpus.unwrap_or(c.cpus),
                ..CpusConfig::default()
            },
            memory: memory_body(c),
            payload: PayloadConfig {
                kernel: Some(path_text(&c.kernel)),
                cmdline: Some(c.cmdline.clone()),
                initramfs: c.initrd.as_deref().map(path_text),
                ..PayloadConfig::default()
            },
            disks: Some(c.disks.iter().map(disk_body).collect()),
            net: Some(c.nets.iter().map(net_body).collect()),
            vsock: c.vsock.as_ref().map(|v| VsockConfig {
                cid: u64::from(v.cid),
                socket: path_text(&v.socket),
                id: v.id.clone(),
                ..VsockConfig::default()
            }),
            fs: (!c.fs.is_empty()).then(|| c.fs.iter().map(fs_body).collect()),
            generic_vhost_user: (!c.generic_vhost_user.is_empty()).then(|| {
                let body = GenericVhostUserConfig::from_config;
                c.generic_vhost_user.iter().map(body).collect()
            }),
            pmem: (!c.pmem.is_empty())
                .then(|| c.pmem.iter().map(PmemConfig::from_config).collect()),
            serial: Some(serial_body(&c.serial_output)),
            balloon: c.balloon.as_ref().map(|b| BalloonConfig {
                size: b.size,
                deflate_on_oom: b.deflate_on_oom,
                free_page_reporting: b.free_page_reporting,
                id: b.id.clone(),
                ..BalloonConfig::default()
            }),
            ..VmConfig::default()
        }
    }
}

/// A host path as the API's bodies carry it.
fn path_text(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// The memory part of a command-line VM's body: its size, or its zones.
fn memory_body(c: &config::VmConfig) -> MemoryConfig {
    MemoryConfig {
        size: match c.memory_zones.is_empty() {
            true => c.memory.bytes(),
            false => 0,
        },
        shared: c.shared_memory,
        hugepages: c.hugepages,
        hugepage_size: c.hugepage_size.map(MemorySize::bytes),
        zones: (!c.memory_zones.is_empty()).then(|| c.memory_zones.iter().map(zone_body).collect()),
        hotplug_size: c.hotplug_memory.map(MemorySize::bytes),
        ..MemoryConfig::default()
    }
}

fn disk_body(d: &config::DiskConfig) -> DiskConfig {
    DiskConfig {
        path: (!d.vhost_user).then(|| path_text(&d.path)),
        readonly: d.readonly,
        direct: d.direct,
        id: d.id.clone(),
        extra: vhost_user_fields(d),
    }
}

fn net_body(n: &config::NetConfig) -> NetConfig {
    NetConfig {
        tap: Some(n.tap.clone()),
        mac: n.mac.map(|m| m.to_string()),
        id: n.id.clone(),
        ..NetConfig::default()
    }
}

fn fs_body(f: &config::FsConfig) -> FsConfig {
    FsConfig {
        tag: f.tag.clone(),
        socket: path_text(&f.socket),
        num_queues: f.num_queues,
        queue_size: f.queue_size,
        id: f.id.clone(),
        pci_segment: 0,
        extra: Extra::new(),
    }
}

/// Gives the devices of a VM described on the command line the ids the API shows for them
/// (`_disk0`, `_net0`, `_vsock0`, `_fs0`, `_balloon0`, Cloud Hypervisor's names), where they
/// have none: `run --api-socket` launches them so named, and `vm.info`, `vm.remove-device`
/// and a snapshot's config.json then name each device as it runs.
pub fn name_devices_as_the_api_does(c: &mut config::VmConfig) {
    let name = |id: &mut Option<String>, kind: &str, i: usize| {
        id.get_or_insert_with(|| format!("_{kind}{i}"));
    };
    for (i, d) in c.disks.iter_mut().enumerate() {
        name(&mut d.id, "disk", i);
    }
    for (i, n) in c.nets.iter_mut().enumerate() {
        name(&mut n.id, "net", i);
    }
    if let Some(v) = &mut c.vsock {
        name(&mut v.id, "vsock", 0);
    }
    for (i, f) in c.fs.iter_mut().enumerate() {
        name(&mut f.id, "fs", i);
    }
    if let Some(b) = &mut c.balloon {
        name(&mut b.id, "balloon", 0);
    }
    for (i, g) in c.generic_vhost_user.iter_mut().enumerate() {
        name(&mut g.id, "generic_vhost_user", i);
    }
    for (i, p) in c.pmem.iter_mut().enumerate() {
        name(&mut p.id, "pmem", i);
    }
}

/// A vhost-user disk's `vhost_user` and `vhost_socket`, as Cloud Hypervisor names them.
fn vhost_user_fields(d: &config::DiskConfig) -> Extra {
    let mut extra = Extra::new();
    if let (true, Some(socket)) = (d.vhost_user, &d.vhost_socket) {
        extra.insert("vhost_user".into(), Value::Bool(true));
        extra.insert(
            "vhost_socket".into(),
            Value::String(socket.display().to_string()),
        );
    }
    extra
}

fn memory_size(bytes: u64) -> Result<MemorySize, ApiError> {
    if bytes % (1 << 20) != 0 {
        return Err(refuse(format!(
            "memory.size {bytes} is not a whole number of MiB"
        )));
    }
    Ok(MemorySize::from_mib(bytes >> 20))
}

/// The memory size and zones: `size`, or (Cloud Hypervisor's rule) `size` 0 and zones that
/// add up to the guest's RAM.
fn memory_zones(m: &MemoryConfig) -> Result<(MemorySize, Vec<config::MemoryZoneConfig>), ApiError> {
    let zones = m.zones.as_deref().unwrap_or_default();
    match (m.size, zones.is_empty()) {
        (0, true) => {
            return Err(refuse(
                "memory.size 0 needs memory.zones (the zones then make up guest RAM)".into(),
            ))
        }
        (_, true) => return Ok((memory_size(m.size)?, Vec::new())),
        (0, false) => {}
        (size, false) => {
            return Err(refuse(format!(
                "memory.size must be 0 when memory.zones are given (it is {size})"
            )))
        }
    }
    let mut total = 0;
    let mut parsed = Vec::new();
    for z in zones {
        let size = memory_size(z.size)?;
        total += size.bytes();
        parsed.push(config::MemoryZoneConfig {
            id: z.id.clone(),
            size,
            file: z.file.as_ref().map(PathBuf::from),
            shared: z.shared,
            hugepages: z.hugepages,
            hugepage_size: z.hugepage_size.map(hugepage_size).transpose()?,
        });
    }
    Ok((memory_size(total)?, parsed))
}

/// The zones' `hotplug_size`s, which make up the VM's hotplug area (`vm.resize-zone` grows
/// a zone within its own); with zones, `memory.hotplug_size` is refused (give each zone its
/// own, as Cloud Hypervisor asks).
fn zones_hotplug(m: &MemoryConfig) -> Result<Option<MemorySize>, ApiError> {
    let zones = m.zones.as_deref().unwrap_or_default();
    if zones.is_empty() {
        return Ok(None);
    }
    if m.hotplug_size.is_some_and(|s| s > 0) {
        return Err(refuse(
            "memory.hotplug_size is not supported with memory.zones: give each zone its \
             hotplug_size"
                .into(),
        ));
    }
    let mut total = 0u64;
    for z in zones {
        let bytes = z.hotplug_size.unwrap_or(0);
        if bytes % (1 << 20) != 0 {
            return Err(refuse(format!(
                "memory.zones[].hotplug_size {bytes} of zone {} is not a whole number of MiB",
                z.id
            )));
        }
        total = total.saturating_add(bytes);
    }
    Ok((total > 0).then(|| MemorySize::from_mib(total >> 20)))
}

/// A zone as the API shows it.
fn zone_body(z: &config::MemoryZoneConfig) -> MemoryZoneConfig {
    MemoryZoneConfig {
        id: z.id.clone(),
        size: z.size.bytes(),
        file: z.file.as_ref().map(|p| p.display().to_string()),
        shared: z.shared,
        hugepages: z.hugepages,
        hugepage_size: z.hugepage_size.map(MemorySize::bytes),
        extra: Extra::new(),
        ..MemoryZoneConfig::default()
    }
}

/// `memory.hotplug_size` (0 or absent: no memory hotplug), added through ACPI:
/// `hotplug_method` `Acpi` (Cloud Hypervisor's default); `VirtioMem` is refused.
fn hotplug_memory(memory: &MemoryConfig) -> Result<Option<MemorySize>, ApiError> {
    let size = memory.hotplug_size.filter(|&s| s > 0);
    match memory.extra.get("hotplug_method").and_then(Value::as_str) {
        None | Some("Acpi") => {}
        Some("VirtioMem") if size.is_none() => {}
        Some("VirtioMem") => {
            return Err(refuse(
                "memory.hotplug_method VirtioMem is not supported by exitless: use Acpi".into(),
            ))
        }
        Some(other) => {
            return Err(refuse(format!(
                "memory.hotplug_method {other} is unknown (Acpi or VirtioMem)"
            )))
        }
    }
    let Some(bytes) = size else {
        return Ok(None);
    };
    if bytes % (1 << 20) != 0 {
        return Err(refuse(format!(
            "memory.hotplug_size {bytes} is not a whole number of MiB"
        )));
    }
    Ok(Some(MemorySize::from_mib(bytes >> 20)))
}

fn hugepage_size(bytes: u64) -> Result<MemorySize, ApiError> {
    if bytes != vmm::memory::HUGEPAGE_2M && bytes != vmm::memory::HUGEPAGE_1G {
        return Err(refuse(format!(
            "memory.hugepage_size {bytes} is not supported: use 2097152 (2M) or 1073741824 (1G)"
        )));
    }
    Ok(MemorySize::from_mib(bytes >> 20))
}

fn serial_output(serial: Option<&ConsoleConfig>) -> Result<SerialOutputMode, ApiError> {
    let Some(s) = serial else {
        // Cloud Hypervisor's default serial mode is Null.
        return Ok(SerialOutputMode::Discard);
    };
    match s.mode.as_str() {
        "Off" | "Null" => Ok(SerialOutputMode::Discard),
        "Tty" => Ok(SerialOutputMode::Stdout),
        "File" => s
            .file
            .as_ref()
            .map(|f| SerialOutputMode::File(PathBuf::from(f)))
            .ok_or_else(|| refuse("serial.file is required with mode File".into())),
        other => Err(refuse(format!(
            "serial.mode {other} is not supported by exitless (Off, Null, Tty or File)"
        ))),
    }
}

/// The `serial` section that says where the console goes, so that a snapshot's config.json (and
/// `vm.info`) restores a VM with its console as it ran: a terminal or stdout is `Tty`.
fn serial_body(mode: &SerialOutputMode) -> ConsoleConfig {
    let (mode, file) = match mode {
        SerialOutputMode::Stdout => ("Tty", None),
        SerialOutputMode::Discard => ("Null", None),
        SerialOutputMode::File(path) => ("File", Some(path.display().to_string())),
    };
    ConsoleConfig {
        mode: mode.into(),
        file,
        extra: Extra::new(),
    }
}

impl DiskConfig {
    fn check(&self) -> Result<(), ApiError> {
        refuse_set(&self.extra, "disks[].", &["backing_files"])?;
        match self.extra.get("image_type").and_then(Value::as_str) {
            None | Some("Raw" | "Unknown") => Ok(()),
            Some(other) => Err(refuse(format!(
                "disks[].image_type {other} is not supported by exitless (Raw, or Unknown \
                 for a raw image it checks)"
            ))),
        }
    }

    /// exitless's disk for this body; more queues than one are served by one.
    pub fn to_disk_config(&self) -> Result<config::DiskConfig, ApiError> {
        self.check()?;
        if self.vhost_user() {
            return self.to_vhost_user_disk();
        }
        refuse_set(&self.extra, "disks[].", &["vhost_socket"])
            .map_err(|_| refuse("disks[].vhost_socket needs disks[].vhost_user=true".into()))?;
        let path = self
            .path
            .as_ref()
            .ok_or_else(|| refuse("disks[].path is required".into()))?;
        let image_type = self.extra.get("image_type").and_then(Value::as_str);
        Ok(config::DiskConfig {
            path: PathBuf::from(path),
            readonly: self.readonly,
            direct: self.direct,
            // exitless's own: `"lock": false` shares the image with another writer on purpose.
            lock: self
                .extra
                .get("lock")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            probe_format: image_type == Some("Unknown"),
            id: self.id.clone(),
            ..config::DiskConfig::default()
        })
    }
}

impl NetConfig {
    fn check(&self) -> Result<(), ApiError> {
        refuse_set(&self.extra, "net[].", &["vhost_user", "vhost_socket"])
    }

    /// exitless's card for this body: the tap `fds` sent with it (one per queue pair: the
    /// first is used, one pair is served), or the tap named.
    pub fn to_net_config(&self, fds: Vec<OwnedFd>) -> Result<config::NetConfig, ApiError> {
        self.check()?;
        let mac = self
            .mac
            .as_deref()
            .map(|m| {
                m.parse()
                    .map_err(|e: String| refuse(format!("net[].mac: {e}")))
            })
            .transpose()?;
        let tap_fd = fds.into_iter().next().map(|fd| TapFd(Arc::new(fd)));
        let tap = match (&self.tap, &tap_fd) {
            (_, Some(_)) => self.tap.clone().unwrap_or_default(),
            (Some(name), None) => name.clone(),
            (None, None) => {
                return Err(refuse(
                    "net[].tap or the tap's file descriptors (SCM_RIGHTS) are required".into(),
                ))
            }
        };
        Ok(config::NetConfig {
            tap,
            mac,
            tap_fd,
            id: self.id.clone(),
        })
    }
}

impl FsConfig {
    /// The device needs shared memory; its segment must be one the platform has; its tag and
    /// queues ones virtio allows.
    pub fn check(&self, shared_memory: bool, segments: u64) -> Result<(), ApiError> {
        if !shared_memory {
            return Err(refuse(
                "fs needs memory.shared=true: the vhost-user back end (virtiofsd) maps guest memory"
                    .into(),
            ));
        }
        if u64::from(self.pci_segment) >= segments {
            return Err(refuse(format!(
                "fs[].pci_segment {} is not below platform.num_pci_segments {segments}",
                self.pci_segment
            )));
        }
        refuse_set(&self.extra, "fs[].", &["pci_segments"])?;
        self.to_fs_config()
            .check()
            .map_err(|e| refuse(format!("fs: {e}")))
    }

    /// exitless's file system for this body (checked by [`FsConfig::check`]).
    pub fn to_fs_config(&self) -> config::FsConfig {
        config::FsConfig {
            tag: self.tag.clone(),
            socket: PathBuf::from(&self.socket),
            num_queues: self.num_queues,
            queue_size: self.queue_size,
            id: self.id.clone(),
        }
    }
}

impl VsockConfig {
    pub fn to_vsock_config(&self) -> Result<config::VsockConfig, ApiError> {
        let cid = u32::try_from(self.cid)
            .map_err(|_| refuse(format!("vsock.cid {} is out of range", self.cid)))?;
        let v = config::VsockConfig {
            cid,
            socket: PathBuf::from(&self.socket),
            id: self.id.clone(),
        };
        v.check().map_err(|e| refuse(format!("vsock: {e}")))?;
        Ok(v)
    }
}

impl BalloonConfig {
    /// exitless's balloon for this body, whose target must fit in `memory` bytes.
    pub fn to_balloon_config(&self, memory: u64) -> Result<config::BalloonConfig, ApiError> {
        let b = config::BalloonConfig {
            size: self.size,
            deflate_on_oom: self.deflate_on_oom,
            free_page_reporting: self.free_page_reporting,
            id: self.id.clone(),
        };
        b.check(memory)
            .map_err(|e| refuse(format!("balloon.{e}")))?;
        Ok(b)
    }
}

#[cfg(test)]
mod tests;
