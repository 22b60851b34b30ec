//! The typed VM configuration, shared by the command line and JSON config files.
//!
//! A JSON file holds a [`VmConfig`] with the field names below (snake_case, e.g.
//! `"serial_log"`); unknown fields are rejected and missing ones take their defaults. Command
//! line flags arrive as [`VmConfigOverrides`] and win over the file in [`VmConfig::merge_cli`].
//! The value types ([`MemorySize`], [`IrqchipMode`], [`CpuAffinity`]) implement `FromStr`, so
//! clap can parse flags straight into them.
//!
//! ```json
//! { "kernel": "guest/vmlinux", "initrd": "guest/initramfs.cpio.gz",
//!   "cpus": 2, "memory": "1G", "irqchip": "split", "cpu_affinity": [2, 3] }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

use crate::memory::MIN_MEMORY;

pub mod balloon;
pub mod disk;
pub mod fs;
pub mod memory;
pub mod net;
pub mod pmem;
pub mod vhost_user;
pub use balloon::BalloonConfig;
pub use disk::DiskConfig;
pub use fs::FsConfig;
pub use memory::{MemoryOption, MemoryZoneConfig};
pub use net::{MacAddr, NetConfig, TapFd, VsockConfig};
pub use pmem::PmemConfig;
pub use vhost_user::GenericVhostUserConfig;

/// Default kernel command line.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=1";
/// Default guest memory: 512 MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
/// Largest guest memory accepted: 1 TiB.
pub const MAX_MEMORY: u64 = 1 << 40;
/// Most vCPUs exitless gives a VM: xAPIC IDs are 8 bits and 0xff is the broadcast ID. The ACPI
/// MADT lists every one of them; the MP table only as many as fit its space (it is written
/// only for VMs it can describe whole, for kernels without ACPI).
pub const MAX_VCPUS: usize = 254;
/// Longest kernel command line, in bytes (x86 COMMAND_LINE_SIZE less the NUL).
pub const MAX_CMDLINE_LEN: usize = 2047;

/// Errors parsing, loading or validating a configuration.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("Invalid memory size '{input}': {reason}")]
    MemorySize { input: String, reason: &'static str },
    #[error("Invalid irqchip mode '{0}': expected kernel, split or none")]
    Irqchip(String),
    #[error("Invalid CPU list '{input}': {reason}")]
    CpuList { input: String, reason: &'static str },
    /// The cause is in the message, not a `source`: one line says it once.
    #[error("Cannot read config file {}: {error}", path.display())]
    ReadFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("Invalid config file {} at line {line}, column {column}: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("No kernel given: use --kernel or set \"kernel\" in the config file")]
    NoKernel,
    #[error("--cpus must be at least 1")]
    NoCpus,
    #[error("max_vcpus {max} is below the {cpus} vCPUs at boot")]
    MaxBelowBoot { max: u8, cpus: u8 },
    #[error("--cpus {cpus} is more than the {max} vCPUs possible here ({MAX_VCPUS} at most, the xAPIC ID limit, or fewer if KVM allows fewer)")]
    TooManyCpus { cpus: u64, max: usize },
    #[error("--memory {0} is below the minimum of 16M")]
    MemoryTooSmall(MemorySize),
    #[error("--memory {0} exceeds the maximum of 1T")]
    MemoryTooLarge(MemorySize),
    #[error("--cpu-affinity lists {given} host CPUs for {cpus} vCPUs: one CPU per vCPU (--cpus {given} for this list, or list {cpus} CPUs)")]
    AffinityLength { given: usize, cpus: u8 },
    #[error("Kernel command line is {0} bytes long; the limit is {MAX_CMDLINE_LEN}")]
    CmdlineTooLong(usize),
    #[error("Kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("Invalid --disk '{input}': {reason}")]
    Disk { input: String, reason: String },
    #[error("Invalid --net '{input}': {reason}")]
    Net { input: String, reason: String },
    #[error("Invalid --vsock '{input}': {reason}")]
    Vsock { input: String, reason: String },
    #[error("Invalid --memory '{input}': {reason}")]
    Memory { input: String, reason: String },
    #[error("Invalid --fs '{input}': {reason}")]
    Fs { input: String, reason: String },
    #[error("hugepage_size needs hugepages=on")]
    HugePagesOff,
    #[error("hugepage_size {0} is not supported: use 2M or 1G")]
    HugePageSize(MemorySize),
    #[error("--memory {memory} is not a whole number of {page} huge pages")]
    HugePageFit {
        memory: MemorySize,
        page: MemorySize,
    },
    #[error("Invalid memory zone '{id}': {reason}")]
    MemoryZone { id: String, reason: String },
    #[error("virtio-fs needs shared guest memory (a vhost-user back end maps it): use --memory size=SIZE,shared=on (memory.shared=true in the API)")]
    FsNeedsSharedMemory,
    #[error("Invalid --balloon '{input}': {reason}")]
    Balloon { input: String, reason: String },
    #[error("Invalid --pmem '{input}': {reason}")]
    Pmem { input: String, reason: String },
    #[error("Invalid --generic-vhost-user '{input}': {reason}")]
    GenericVhostUser { input: String, reason: String },
    #[error("{0} needs shared guest memory (a vhost-user back end maps it): use --memory size=SIZE,shared=on (memory.shared=true in the API)")]
    VhostUserNeedsSharedMemory(&'static str),
}

/// A guest memory size in bytes, always a non-zero multiple of 4 KiB.
///
/// Parsed from a number with an optional binary suffix, case-insensitive: `K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`. **A bare number is MiB** (`"2048"` is 2 GiB). In JSON it may also be
/// an integer (MiB). It is written back as a string in the largest exact unit (`"1G"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemorySize(u64);

impl MemorySize {
    const UNITS: [(&'static str, u32); 4] = [("T", 40), ("G", 30), ("M", 20), ("K", 10)];

    /// `mib` MiB (saturating; validation rejects absurd sizes).
    pub const fn from_mib(mib: u64) -> Self {
        Self(mib.saturating_mul(1 << 20))
    }

    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// The size in whole MiB.
    pub const fn mib(self) -> u64 {
        self.0 >> 20
    }
}

impl Default for MemorySize {
    fn default() -> Self {
        Self::from_mib(DEFAULT_MEMORY_MIB)
    }
}

/// Splits "512M" into ("512", shift 20); a bare number is MiB.
fn split_size_suffix(s: &str) -> Option<(&str, u32)> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(digits_end);
    let suffix = suffix.trim_start();
    if suffix.is_empty() {
        return Some((num, 20));
    }
    let unit = suffix.get(..1)?.to_ascii_uppercase();
    let rest = &suffix[1..];
    if !(rest.is_empty() || rest.eq_ignore_ascii_case("iB")) {
        return None;
    }
    let shift = MemorySize::UNITS.iter().find(|(u, _)| *u == unit)?.1;
    Some((num, shift))
}

impl FromStr for MemorySize {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let err = |reason| ConfigError::MemorySize {
            input: input.to_string(),
            reason,
        };
        let garbage =
            "expected a number of MiB, or a number with a K, M, G or T suffix (e.g. 512M, 2G)";
        let (num, shift) = split_size_suffix(input.trim()).ok_or_else(|| err(garbage))?;
        if num.is_empty() {
            return Err(err(garbage));
        }
        let n: u64 = num.parse().map_err(|_| err("too large"))?;
        let bytes = n.checked_mul(1 << shift).ok_or_else(|| err("too large"))?;
        if bytes == 0 {
            return Err(err("must be greater than zero"));
        }
        if bytes % 4096 != 0 {
            return Err(err("must be a multiple of 4K"));
        }
        Ok(Self(bytes))
    }
}

impl fmt::Display for MemorySize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, shift) in Self::UNITS {
            if self.0 != 0 && self.0 % (1 << shift) == 0 {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl Serialize for MemorySize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

struct MemorySizeVisitor;

impl Visitor<'_> for MemorySizeVisitor {
    type Value = MemorySize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a memory size such as \"512M\" or \"1G\", or a number of MiB")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<MemorySize, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<MemorySize, E> {
        v.to_string().parse().map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<MemorySize, E> {
        v.to_string().parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for MemorySize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MemorySizeVisitor)
    }
}

/// Where the interrupt controllers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IrqchipMode {
    /// PIC, IOAPIC and LAPICs all in KVM (plus the in-kernel PIT).
    #[default]
    Kernel,
    /// LAPICs in KVM, PIC/IOAPIC in userspace (KVM_CAP_SPLIT_IRQCHIP).
    Split,
    /// No in-kernel irqchip at all.
    None,
}

impl FromStr for IrqchipMode {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "kernel" => Ok(Self::Kernel),
            "split" => Ok(Self::Split),
            "none" => Ok(Self::None),
            _ => Err(ConfigError::Irqchip(s.to_string())),
        }
    }
}

impl fmt::Display for IrqchipMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kernel => "kernel",
            Self::Split => "split",
            Self::None => "none",
        })
    }
}

/// vCPU pinning: vCPU `i` runs on host CPU `cpus()[i]`.
///
/// Parsed from a comma-separated list (`"2,3"`); in JSON an array (`[2, 3]`) or such a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "AffinityRepr", into = "Vec<usize>")]
pub struct CpuAffinity(Vec<usize>);

#[derive(Deserialize)]
#[serde(untagged)]
enum AffinityRepr {
    List(Vec<usize>),
    Text(String),
}

impl TryFrom<AffinityRepr> for CpuAffinity {
    type Error = ConfigError;

    fn try_from(r: AffinityRepr) -> Result<Self, ConfigError> {
        match r {
            AffinityRepr::List(v) => Self::new(v),
            AffinityRepr::Text(s) => s.parse(),
        }
    }
}

impl From<CpuAffinity> for Vec<usize> {
    fn from(a: CpuAffinity) -> Self {
        a.0
    }
}

impl CpuAffinity {
    /// An affinity from host CPU numbers; the list must not be empty.
    pub fn new(cpus: Vec<usize>) -> Result<Self, ConfigError> {
        if cpus.is_empty() {
            return Err(ConfigError::CpuList {
                input: String::new(),
                reason: "the list is empty",
            });
        }
        Ok(Self(cpus))
    }

    /// Host CPU of each vCPU, by vCPU index.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// Host CPU for vCPU `vcpu`, if listed.
    pub fn host_cpu(&self, vcpu: usize) -> Option<usize> {
        self.0.get(vcpu).copied()
    }
}

impl FromStr for CpuAffinity {
    type Err = ConfigError;

    fn from_str(input: &str) -> Result<Self, ConfigError> {
        let err = |reason| ConfigError::CpuList {
            input: input.to_string(),
            reason,
        };
        if input.trim().is_empty() {
            return Err(err("the list is empty"));
        }
        input
            .split(',')
            .map(|c| c.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
            .map_err(|_| err("expected comma-separated host CPU numbers such as 0,1"))
    }
}

impl fmt::Display for CpuAffinity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// The whole VM configuration. See the module docs for the JSON form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmConfig {
    /// Kernel image (ELF vmlinux or bzImage). Empty until given (checked by `validate`).
    pub kernel: PathBuf,
    /// Initial ramdisk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: String,
    /// Number of vCPUs at boot.
    pub cpus: u8,
    /// Most vCPUs the VM may have once vCPUs are added while it runs (`vm.resize`); none:
    /// `cpus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<u8>,
    /// Guest memory size.
    pub memory: MemorySize,
    /// Guest memory is shared (a memfd), so that vhost-user back ends can map it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_memory: bool,
    /// Guest memory on huge pages (of `hugepage_size`, 2M by default).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hugepages: bool,
    /// The huge page size: 2M or 1G.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<MemorySize>,
    /// Guest RAM in zones, in order (the API's `memory.zones`); `memory` is then their sum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_zones: Vec<MemoryZoneConfig>,
    /// How much memory may be added while the VM runs (`vm.resize`, through ACPI memory
    /// hotplug; see [`crate::memory::hotplug`]); none: no memory hotplug.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotplug_memory: Option<MemorySize>,
    /// File that also receives everything the guest writes to the serial console.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial_log: Option<PathBuf>,
    /// Where the serial console's output goes (the API's `serial.mode`); the command line
    /// always uses stdout.
    #[serde(skip)]
    pub serial_output: SerialOutputMode,
    /// Interrupt controller placement.
    pub irqchip: IrqchipMode,
    /// vCPU to host CPU pinning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_affinity: Option<CpuAffinity>,
    /// Raw disk images, each a virtio-blk device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskConfig>,
    /// A virtio-rng device fed from the host's random source.
    #[serde(default)]
    pub rng: bool,
    /// Network cards, each a virtio-net device on a tap.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<NetConfig>,
    /// A virtio-vsock device joined to Unix sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsock: Option<VsockConfig>,
    /// Shared file systems, each a virtio-fs device served by a vhost-user back end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fs: Vec<FsConfig>,
    /// A virtio-balloon device (free page reporting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balloon: Option<BalloonConfig>,
    /// Generic vhost-user devices (Cloud Hypervisor's `generic_vhost_user`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generic_vhost_user: Vec<GenericVhostUserConfig>,
    /// Persistent memory devices (virtio-pmem), each a file mapped into guest memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<PmemConfig>,
}

impl Default for VmConfig {
    fn default() -> Self {
        Self {
            kernel: PathBuf::new(),
            initrd: None,
            cmdline: DEFAULT_CMDLINE.to_string(),
            cpus: 1,
            max_vcpus: None,
            memory: MemorySize::default(),
            shared_memory: false,
            hugepages: false,
            hugepage_size: None,
            memory_zones: Vec::new(),
            hotplug_memory: None,
            serial_log: None,
            serial_output: SerialOutputMode::default(),
            irqchip: IrqchipMode::default(),
            cpu_affinity: None,
            disks: Vec::new(),
            rng: false,
            nets: Vec::new(),
            vsock: None,
            fs: Vec::new(),
            balloon: None,
            generic_vhost_user: Vec::new(),
            pmem: Vec::new(),
        }
    }
}

/// Where the guest's serial output goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SerialOutputMode {
    /// This process's stdout.
    #[default]
    Stdout,
    /// Nowhere (Cloud Hypervisor's `Off` and `Null`).
    Discard,
    /// This file, created or truncated.
    File(PathBuf),
}

/// Command line values; each `Some` overrides the config file (clap fills this in).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmConfigOverrides {
    pub kernel: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
    pub cmdline: Option<String>,
    pub cpus: Option<u8>,
    /// `--memory`: a size, and what backs it.
    pub memory: Option<MemoryOption>,
    pub serial_log: Option<PathBuf>,
    pub irqchip: Option<IrqchipMode>,
    pub cpu_affinity: Option<CpuAffinity>,
    /// Disks given on the command line replace the file's list.
    pub disks: Vec<DiskConfig>,
    /// `--rng` turns the device on (it cannot turn the file's off).
    pub rng: bool,
    /// Network cards given on the command line replace the file's list.
    pub nets: Vec<NetConfig>,
    pub vsock: Option<VsockConfig>,
    /// File systems given on the command line replace the file's list.
    pub fs: Vec<FsConfig>,
    pub balloon: Option<BalloonConfig>,
    /// Generic vhost-user devices given on the command line replace the file's list.
    pub generic_vhost_user: Vec<GenericVhostUserConfig>,
    /// Persistent memory devices given on the command line replace the file's list.
    pub pmem: Vec<PmemConfig>,
}

impl VmConfig {
    /// The defaults with `kernel` set.
    pub fn new(kernel: impl Into<PathBuf>) -> Self {
        Self {
            kernel: kernel.into(),
            ..Self::default()
        }
    }

    /// Parses a JSON config (`path` only names it in errors).
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, ConfigError> {
        serde_json::from_str(text).map_err(|e| json_error(path, &e))
    }

    /// Reads and parses a JSON config file.
    pub fn from_json_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::ReadFile {
            path: path.to_path_buf(),
            error,
        })?;
        Self::from_json_str(&text, path)
    }

    /// The config as pretty-printed JSON (readable back by [`VmConfig::from_json_str`]).
    pub fn to_json(&self) -> String {
        // Serializing plain strings, numbers and paths cannot fail; fall back to an empty
        // object rather than panicking should a non-UTF-8 path ever be rejected.
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }

    /// The file config (or the defaults) with every `Some` of `cli` applied on top.
    /// Fails if no kernel was given by either.
    pub fn merge_cli(
        file: Option<VmConfig>,
        cli: VmConfigOverrides,
    ) -> Result<VmConfig, ConfigError> {
        let mut c = file.unwrap_or_default();
        let o = cli;
        if let Some(v) = o.kernel {
            c.kernel = v;
        }
        c.initrd = o.initrd.or(c.initrd);
        if let Some(v) = o.cmdline {
            c.cmdline = v;
        }
        c.cpus = o.cpus.unwrap_or(c.cpus);
        if let Some(m) = o.memory {
            m.apply(&mut c);
        }
        c.serial_log = o.serial_log.or(c.serial_log);
        c.irqchip = o.irqchip.unwrap_or(c.irqchip);
        c.cpu_affinity = o.cpu_affinity.or(c.cpu_affinity);
        if !o.disks.is_empty() {
            c.disks = o.disks;
        }
        c.rng |= o.rng;
        if !o.nets.is_empty() {
            c.nets = o.nets;
        }
        c.vsock = o.vsock.or(c.vsock);
        if !o.fs.is_empty() {
            c.fs = o.fs;
        }
        c.balloon = o.balloon.or(c.balloon);
        if !o.generic_vhost_user.is_empty() {
            c.generic_vhost_user = o.generic_vhost_user;
        }
        if !o.pmem.is_empty() {
            c.pmem = o.pmem;
        }
        if c.kernel.as_os_str().is_empty() {
            return Err(ConfigError::NoKernel);
        }
        Ok(c)
    }

    /// Checks the values against each other and against `max_vcpus` (KVM_CAP_MAX_VCPUS).
    /// Files are not opened here: the loaders report missing ones.
    /// Checks the values; `max_vcpus` is KVM's limit (the effective one is at most
    /// [`MAX_VCPUS`]).
    pub fn validate(&self, max_vcpus: usize) -> Result<(), ConfigError> {
        if self.kernel.as_os_str().is_empty() {
            return Err(ConfigError::NoKernel);
        }
        if self.cpus == 0 {
            return Err(ConfigError::NoCpus);
        }
        let max = max_vcpus.min(MAX_VCPUS);
        let most = self.max_vcpus.unwrap_or(self.cpus).max(self.cpus);
        if usize::from(most) > max {
            return Err(ConfigError::TooManyCpus {
                cpus: u64::from(most),
                max,
            });
        }
        if self.max_vcpus.is_some_and(|m| m < self.cpus) {
            return Err(ConfigError::MaxBelowBoot {
                max: self.max_vcpus.unwrap_or(0),
                cpus: self.cpus,
            });
        }
        if self.memory.bytes() < MIN_MEMORY {
            return Err(ConfigError::MemoryTooSmall(self.memory));
        }
        if self.memory.bytes() > MAX_MEMORY {
            return Err(ConfigError::MemoryTooLarge(self.memory));
        }
        if let Some(a) = &self.cpu_affinity {
            if a.cpus().len() != usize::from(self.cpus) {
                return Err(ConfigError::AffinityLength {
                    given: a.cpus().len(),
                    cpus: self.cpus,
                });
            }
        }
        if self.cmdline.len() > MAX_CMDLINE_LEN {
            return Err(ConfigError::CmdlineTooLong(self.cmdline.len()));
        }
        if self.cmdline.contains('\0') {
            return Err(ConfigError::CmdlineNul);
        }
        self.validate_memory_backing()?;
        self.validate_devices()
    }

    /// The checks the command line's parsers make, for what came from a config file.
    fn validate_devices(&self) -> Result<(), ConfigError> {
        for n in &self.nets {
            if n.tap_fd.is_none() {
                net::check_tap_name(&n.tap)?;
            }
        }
        if let Some(v) = &self.vsock {
            v.check().map_err(|reason| ConfigError::Vsock {
                input: format!("cid={},socket={}", v.cid, v.socket.display()),
                reason,
            })?;
        }
        for f in &self.fs {
            f.check().map_err(|reason| ConfigError::Fs {
                input: format!("tag={},socket={}", f.tag, f.socket.display()),
                reason,
            })?;
        }
        self.validate_vhost_user()?;
        if let Some(b) = &self.balloon {
            b.check(self.memory.bytes())
                .map_err(|reason| ConfigError::Balloon {
                    input: format!("size={}", MemorySize(b.size)),
                    reason,
                })?;
        }
        Ok(())
    }
}

impl VmConfig {
    /// vhost-user disks and generic vhost-user devices: each valid, on shared memory.
    fn validate_vhost_user(&self) -> Result<(), ConfigError> {
        for d in &self.disks {
            d.check().map_err(|reason| ConfigError::Disk {
                input: match &d.vhost_socket {
                    Some(s) => format!("socket={}", s.display()),
                    None => format!("path={}", d.path.display()),
                },
                reason,
            })?;
        }
        for p in &self.pmem {
            p.check().map_err(|reason| ConfigError::Pmem {
                input: format!("file={}", p.file.display()),
                reason,
            })?;
        }
        for g in &self.generic_vhost_user {
            g.check().map_err(|reason| ConfigError::GenericVhostUser {
                input: format!("socket={}", g.socket.display()),
                reason,
            })?;
        }
        if !self.shared_memory {
            if self.disks.iter().any(|d| d.vhost_user) {
                return Err(ConfigError::VhostUserNeedsSharedMemory("A vhost-user disk"));
            }
            if !self.generic_vhost_user.is_empty() {
                return Err(ConfigError::VhostUserNeedsSharedMemory(
                    "A generic vhost-user device",
                ));
            }
        }
        Ok(())
    }
}

fn json_error(path: &Path, e: &serde_json::Error) -> ConfigError {
    let (line, column) = (e.line(), e.column());
    let full = e.to_string();
    let message = full
        .strip_suffix(&format!(" at line {line} column {column}"))
        .unwrap_or(&full)
        .to_string();
    ConfigError::Json {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

#[cfg(test)]
mod tests;
