//! Cloud Hypervisor's request and reply bodies (its `cloud-hypervisor.yaml`), the parts
//! exitless reads typed. Every other field a client sends is kept as given (`extra`), so
//! `vm.info` shows the config as it came; fields asking for what exitless lacks are refused
//! by [`VmConfig::check`] with the field named (see docs/api.md for the lists).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Fields a client may send that exitless keeps but does not read.
pub type Extra = Map<String, Value>;

fn default_one() -> u8 {
    1
}

/// `cpus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpusConfig {
    #[serde(default = "default_one")]
    pub boot_vcpus: u8,
    #[serde(default = "default_one")]
    pub max_vcpus: u8,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Default for CpusConfig {
    fn default() -> Self {
        CpusConfig {
            boot_vcpus: 1,
            max_vcpus: 1,
            extra: Extra::new(),
        }
    }
}

fn default_memory() -> u64 {
    512 << 20
}

/// `memory`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MemoryConfig {
    #[serde(default = "default_memory")]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_size: Option<u64>,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub hugepages: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<u64>,
    /// Guest RAM in zones (with `size` 0): a VM template's memory in a named file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<MemoryZoneConfig>>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            size: default_memory(),
            hotplug_size: None,
            shared: false,
            hugepages: false,
            hugepage_size: None,
            zones: None,
            extra: Extra::new(),
        }
    }
}

/// `memory.zones[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryZoneConfig {
    pub id: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub hugepages: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<u64>,
    /// How much `vm.resize-zone` may add to the zone (through ACPI memory hotplug).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_size: Option<u64>,
    /// How much `vm.resize-zone` added (set by exitless; refused in `vm.create`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplugged_size: Option<u64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `payload`: what to boot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PayloadConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One disk (`disks[]`, `vm.add-disk`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DiskConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default)]
    pub readonly: bool,
    #[serde(default)]
    pub direct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One network card (`net[]`, `vm.add-net`): a tap by name, or the tap fds sent with it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The hybrid vsock device (`vsock`, `vm.add-vsock`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VsockConfig {
    pub cid: u64,
    pub socket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

fn default_fs_queues() -> u16 {
    1
}

fn default_fs_queue_size() -> u16 {
    1024
}

/// A shared file system (`fs[]`, `vm.add-fs`): virtio-fs served by a vhost-user back end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsConfig {
    pub tag: String,
    pub socket: String,
    #[serde(default = "default_fs_queues")]
    pub num_queues: u16,
    #[serde(default = "default_fs_queue_size")]
    pub queue_size: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Accepted and kept; the device is placed on segment 0 (docs/api.md).
    #[serde(default)]
    pub pci_segment: u16,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The balloon (`balloon`): free page reporting, and memory the host asks back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BalloonConfig {
    /// Bytes the guest is asked to put in the balloon (`vm.resize`'s `desired_balloon`
    /// changes it).
    pub size: u64,
    #[serde(default)]
    pub deflate_on_oom: bool,
    #[serde(default)]
    pub free_page_reporting: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `serial` and `console`: where output goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConsoleConfig {
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `rng`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RngConfig {
    #[serde(default = "default_rng_source")]
    pub src: String,
    #[serde(flatten)]
    pub extra: Extra,
}

fn default_rng_source() -> String {
    "/dev/urandom".into()
}

impl Default for RngConfig {
    fn default() -> Self {
        RngConfig {
            src: default_rng_source(),
            extra: Extra::new(),
        }
    }
}

/// A whole `vm.create` body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmConfig {
    #[serde(default)]
    pub cpus: CpusConfig,
    #[serde(default)]
    pub memory: MemoryConfig,
    #[serde(default)]
    pub payload: PayloadConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<DiskConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<Vec<NetConfig>>,
    #[serde(default)]
    pub rng: RngConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<ConsoleConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<ConsoleConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<Vec<FsConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic_vhost_user: Option<Vec<GenericVhostUserConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pmem: Option<Vec<PmemConfig>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A persistent memory device (`pmem[]`, `vm.add-pmem`): virtio-pmem over a file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PmemConfig {
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default)]
    pub discard_writes: bool,
    #[serde(default)]
    pub pci_segment: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A generic vhost-user device (`generic_vhost_user[]`, `vm.add-generic-vhost-user`, Cloud
/// Hypervisor v52): a virtio device of `device_type` whose queues a vhost-user back end serves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenericVhostUserConfig {
    pub socket: String,
    pub queue_sizes: Vec<u16>,
    pub device_type: u32,
    #[serde(default)]
    pub pci_segment: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `vm.resize-disk`: the disk's id and its new size in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmResizeDisk {
    pub id: String,
    pub desired_size: u64,
}

/// `vm.resize-zone`: the memory zone's id and its new size in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmResizeZone {
    pub id: String,
    pub desired_ram: u64,
}

/// `vm.coredump`: where the ELF core goes (`file:///path`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmCoredumpData {
    pub destination_url: String,
}

/// `vm.snapshot`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmSnapshotConfig {
    #[serde(default)]
    pub destination_url: String,
}

/// `vm.restore`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreConfig {
    pub source_url: String,
    /// Populate guest memory up front: accepted, without effect (memory is mapped lazily).
    #[serde(default)]
    pub prefault: bool,
    /// Run the VM at once instead of leaving it Paused.
    #[serde(default)]
    pub resume: bool,
    /// Taps sent again with the request (SCM_RIGHTS), for cards whose tap came as fds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_fds: Option<Vec<RestoredNet>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `vm.receive-migration`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReceiveMigrationData {
    /// `unix:PATH` or `tcp:HOST:PORT`, listened on for one connection.
    pub receiver_url: String,
    /// Taps sent with the request (SCM_RIGHTS) for cards whose tap came as fds, as
    /// `vm.restore`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_fds: Option<Vec<RestoredNet>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `vm.send-migration`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SendMigrationData {
    /// `unix:PATH` or `tcp:HOST:PORT`.
    pub destination_url: String,
    /// Memory sent as fds (shared memory only), no bytes copied.
    #[serde(default)]
    pub local: bool,
    /// The downtime precopy aims for.
    #[serde(default = "default_downtime_ms")]
    pub downtime_ms: u64,
    /// How long precopy may take before `timeout_strategy` decides.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    /// `Cancel` (the source goes on) or `Ignore` (pause and finish anyway).
    #[serde(default = "default_timeout_strategy")]
    pub timeout_strategy: String,
    #[serde(flatten)]
    pub extra: Extra,
}

fn default_downtime_ms() -> u64 {
    300
}

fn default_timeout_s() -> u64 {
    3600
}

fn default_timeout_strategy() -> String {
    "Cancel".into()
}

/// `vm.restore`'s `net_fds[]`: the card `id` takes the next `num_fds` fds of the request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoredNet {
    pub id: String,
    pub num_fds: usize,
}

/// `vm.remove-device`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmRemoveDevice {
    #[serde(default)]
    pub id: Option<String>,
}

/// `vm.resize`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VmResize {
    #[serde(default)]
    pub desired_vcpus: Option<u8>,
    #[serde(default)]
    pub desired_ram: Option<u64>,
    #[serde(default)]
    pub desired_balloon: Option<u64>,
}

/// `vm.info`'s answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    pub config: VmConfig,
    pub state: String,
    pub memory_actual_size: u64,
    #[serde(default)]
    pub device_tree: Map<String, Value>,
}

/// A device added while the VM runs: its id and PCI address (`0000:00:DD.0`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDeviceInfo {
    pub id: String,
    pub bdf: String,
}

/// `vmm.ping`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmPingResponse {
    pub build_version: String,
    pub version: String,
    pub pid: i64,
    pub features: Vec<String>,
}

impl VmmPingResponse {
    /// This process.
    pub fn current() -> Self {
        let version = env!("CARGO_PKG_VERSION").to_string();
        VmmPingResponse {
            build_version: format!("exitless v{version}"),
            version,
            pid: i64::from(std::process::id()),
            features: vec!["exit_profile".into()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_kept_and_defaults_filled() {
        let body = r#"{"cpus":{"boot_vcpus":2,"max_vcpus":4,"nested":true},
            "memory":{"size":268435456,"thp":true},"payload":{"kernel":"/k"},
            "platform":{"num_pci_segments":2},"watchdog":false}"#;
        let c: VmConfig = serde_json::from_str(body).unwrap();
        assert_eq!((c.cpus.boot_vcpus, c.cpus.max_vcpus), (2, 4));
        assert_eq!(c.cpus.extra["nested"], true);
        assert_eq!(c.memory.extra["thp"], true);
        assert_eq!(c.extra["platform"]["num_pci_segments"], 2);
        assert_eq!(c.rng.src, "/dev/urandom");
        let again: Value = serde_json::to_value(&c).unwrap();
        assert_eq!(again["platform"]["num_pci_segments"], 2);
        assert_eq!(again["cpus"]["nested"], true);
    }

    #[test]
    fn wrong_types_are_refused() {
        for body in [
            r#"{"cpus":{"boot_vcpus":"two"}}"#,
            r#"{"memory":{"size":-1}}"#,
            r#"{"cpus":{"boot_vcpus":300}}"#,
            r#"{"disks":{"path":"/a"}}"#,
        ] {
            assert!(serde_json::from_str::<VmConfig>(body).is_err(), "{body}");
        }
    }
}
