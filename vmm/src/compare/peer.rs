//! The VMMs `exitless compare` runs, and how each starts the bench guest (a direct-boot PVH
//! ELF, 1 vCPU): as each one's own documentation starts a kernel.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::kvm_stats::ExitsSource;
use super::CompareError;

/// A VMM that can boot the bench guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VmmKind {
    Exitless,
    Qemu,
    Firecracker,
    CloudHypervisor,
}

impl VmmKind {
    pub const PEERS: [VmmKind; 3] = [
        VmmKind::Qemu,
        VmmKind::Firecracker,
        VmmKind::CloudHypervisor,
    ];

    /// The name on reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            VmmKind::Exitless => "exitless",
            VmmKind::Qemu => "qemu",
            VmmKind::Firecracker => "firecracker",
            VmmKind::CloudHypervisor => "cloud-hypervisor",
        }
    }

    /// The executable looked up on PATH when no path is given.
    pub fn program(self) -> &'static str {
        match self {
            VmmKind::Exitless => "exitless",
            VmmKind::Qemu => "qemu-system-x86_64",
            VmmKind::Firecracker => "firecracker",
            VmmKind::CloudHypervisor => "cloud-hypervisor",
        }
    }
}

/// A VMM found on this host: its kind and executable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Vmm {
    pub kind: VmmKind,
    pub path: PathBuf,
}

/// What one run boots.
#[derive(Clone, Debug)]
pub struct Launch<'a> {
    pub guest: &'a Path,
    pub cmdline: &'a str,
    pub memory_mib: u64,
    /// A folder of the run's own (Firecracker's config file goes there).
    pub workdir: &'a Path,
    /// A raw image attached as the VMM's virtio-blk-pci device (disk cases).
    pub disk: Option<&'a Path>,
    /// A tap (made beforehand, up) attached as the VMM's virtio-net-pci device (net cases).
    pub tap: Option<&'a str>,
    /// Where KVM's exit count is read (a VMM's own channel is switched on for it).
    pub exits: &'a ExitsSource,
}

/// The device a compare case drives through the guest's own virtio-pci driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Disk,
    Net,
}

/// Compare cases that drive a device: the guest case at a queue depth.
pub const DEVICE_CASES: &[&str] = &[
    "virtio_blk_qd1",
    "virtio_blk_qd32",
    "virtio_net_qd1",
    "virtio_net_qd32",
];

fn peer_device(case: &str) -> Option<Device> {
    guest_case(case).2
}

/// A compare case's guest case, queue depth (device cases) and device:
/// `virtio_blk_qd32` is the guest's `virtio_blk` at `qd=32` on a disk.
pub fn guest_case(case: &str) -> (&str, Option<u32>, Option<Device>) {
    let (name, qd) = match case.rsplit_once("_qd") {
        Some((name, qd)) if qd.parse::<u32>().is_ok() => (name, qd.parse().ok()),
        _ => (case, None),
    };
    let device = match name {
        "virtio_blk" => Some(Device::Disk),
        "virtio_net" => Some(Device::Net),
        _ => None,
    };
    (name, qd, device)
}

impl Vmm {
    /// The peer named by the user (`--qemu PATH`): it must be an executable file.
    pub fn named(kind: VmmKind, path: &Path) -> Result<Self, CompareError> {
        if !is_executable(path) {
            return Err(CompareError::NotExecutable {
                vmm: kind.name(),
                path: path.to_path_buf(),
            });
        }
        Ok(Vmm {
            kind,
            path: path.to_path_buf(),
        })
    }

    /// The peer on PATH, if any.
    pub fn on_path(kind: VmmKind) -> Option<Self> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join(kind.program()))
            .find(|p| is_executable(p))
            .map(|path| Vmm { kind, path })
    }

    /// Why this VMM cannot run `case`, if it cannot.
    pub fn cannot_run(&self, case: &str) -> Option<&'static str> {
        let device = peer_device(case)?;
        match (self.kind, device) {
            (VmmKind::Firecracker, _) => Some(
                "its devices are virtio-mmio by default, and with --enable-pci its BARs cannot \
                 be moved (no BAR relocation: src/vmm/src/pci/configuration.rs) while the bench \
                 guest's virtio-pci driver places BARs itself",
            ),
            (VmmKind::CloudHypervisor, Device::Net) => Some(
                "it refuses to move its virtio-net BAR into the bench guest's window (\"failed \
                 allocating new MMIO range\") and keeps it above 4 GiB, which the guest does \
                 not map",
            ),
            _ => None,
        }
    }

    /// The command that boots `launch` with 1 vCPU, console on stdout.
    pub fn command(&self, launch: &Launch) -> Result<Command, CompareError> {
        let mut cmd = Command::new(&self.path);
        match self.kind {
            VmmKind::Exitless => exitless_args(&mut cmd, launch),
            VmmKind::Qemu => qemu_args(&mut cmd, launch),
            VmmKind::Firecracker => firecracker_args(&mut cmd, launch)?,
            VmmKind::CloudHypervisor => cloud_hypervisor_args(&mut cmd, launch),
        }
        Ok(cmd)
    }
}

fn exitless_args(cmd: &mut Command, launch: &Launch) {
    cmd.arg("run")
        .arg("--kernel")
        .arg(launch.guest)
        .args([
            "--memory",
            &format!("{}M", launch.memory_mib),
            "--cpus",
            "1",
        ])
        .args(["--cmdline", launch.cmdline]);
    if let Some(disk) = launch.disk {
        cmd.arg("--disk").arg(format!("path={}", disk.display()));
    }
    if let Some(tap) = launch.tap {
        cmd.arg("--net").arg(format!("tap={tap}"));
    }
    if let ExitsSource::ExitlessProfile(path) = launch.exits {
        cmd.arg("--profile-json").arg(path);
    }
}

fn qemu_args(cmd: &mut Command, launch: &Launch) {
    // microvm has PCI only through ECAM; the guest's driver uses 0xCF8: a device case runs
    // on the pc machine.
    let machine = if launch.disk.is_some() || launch.tap.is_some() {
        "pc"
    } else {
        "microvm"
    };
    let mem = launch.memory_mib.to_string();
    cmd.args(["-accel", "kvm", "-M", machine, "-m", &mem, "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-kernel"])
        .arg(launch.guest)
        .args(["-append", launch.cmdline])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"]);
    if let Some(disk) = launch.disk {
        cmd.args([
            "-device",
            "virtio-blk-pci,disable-legacy=on,drive=d",
            "-drive",
        ])
        .arg(format!("file={},if=none,id=d,format=raw", disk.display()));
    }
    if let Some(tap) = launch.tap {
        cmd.args(["-netdev"])
            .arg(format!("tap,id=n,ifname={tap},script=no,downscript=no"))
            .args(["-device", "virtio-net-pci,disable-legacy=on,netdev=n"]);
    }
    if let ExitsSource::Qmp(path) = launch.exits {
        cmd.arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", path.display()));
    }
}

fn firecracker_args(cmd: &mut Command, launch: &Launch) -> Result<(), CompareError> {
    let config = launch.workdir.join("firecracker.json");
    let json = serde_json::json!({
        "boot-source": {
            "kernel_image_path": launch.guest,
            "boot_args": launch.cmdline,
        },
        "machine-config": {"vcpu_count": 1, "mem_size_mib": launch.memory_mib},
        "drives": [],
    });
    std::fs::write(&config, json.to_string()).map_err(CompareError::Workdir)?;
    cmd.args(["--no-api", "--level", "Error", "--config-file"])
        .arg(config);
    Ok(())
}

fn cloud_hypervisor_args(cmd: &mut Command, launch: &Launch) {
    cmd.arg("--kernel")
        .arg(launch.guest)
        .args(["--cmdline", launch.cmdline, "--cpus", "boot=1"])
        .args(["--memory", &format!("size={}M", launch.memory_mib)])
        .args(["--serial", "tty", "--console", "off"]);
    if let Some(disk) = launch.disk {
        cmd.arg("--disk")
            .arg(format!("path={},image_type=raw", disk.display()));
    }
    if let Some(tap) = launch.tap {
        cmd.arg("--net").arg(format!("tap={tap}"));
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn each_vmm_boots_the_guest_with_one_vcpu_and_the_same_memory() {
        let dir = std::env::temp_dir().join(format!("exitless-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let launch = Launch {
            guest: Path::new("/g.elf"),
            cmdline: "case=pio_out iters=10",
            memory_mib: 512,
            workdir: &dir,
            disk: None,
            tap: None,
            exits: &ExitsSource::Debugfs,
        };
        let cmd = |kind| {
            let vmm = Vmm {
                kind,
                path: PathBuf::from("/bin/true"),
            };
            args(&vmm.command(&launch).unwrap()).join(" ")
        };
        let exitless = cmd(VmmKind::Exitless);
        assert!(exitless.contains("--memory 512M --cpus 1"), "{exitless}");
        assert!(exitless.contains("--cmdline case=pio_out iters=10"));
        let qemu = cmd(VmmKind::Qemu);
        assert!(qemu.contains("-m 512 -smp 1") && qemu.contains("-kernel /g.elf"));
        let ch = cmd(VmmKind::CloudHypervisor);
        assert!(ch.contains("--cpus boot=1 --memory size=512M"), "{ch}");
        let fc = cmd(VmmKind::Firecracker);
        assert!(fc.contains("--no-api"), "{fc}");
        let config = std::fs::read_to_string(dir.join("firecracker.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["machine-config"]["vcpu_count"], 1);
        assert_eq!(config["machine-config"]["mem_size_mib"], 512);
        assert_eq!(config["boot-source"]["boot_args"], "case=pio_out iters=10");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_disk_case_attaches_the_image_as_virtio_blk_pci_and_firecracker_sits_it_out() {
        let dir = std::env::temp_dir();
        let launch = Launch {
            guest: Path::new("/g.elf"),
            cmdline: "case=virtio_blk",
            memory_mib: 256,
            workdir: &dir,
            disk: Some(Path::new("/d.img")),
            tap: Some("exlcmp0"),
            exits: &ExitsSource::Qmp(PathBuf::from("/q.sock")),
        };
        let line = |kind| {
            let vmm = Vmm {
                kind,
                path: PathBuf::from("/bin/true"),
            };
            args(&vmm.command(&launch).unwrap()).join(" ")
        };
        assert!(line(VmmKind::Exitless).contains("--disk path=/d.img"));
        let qemu = line(VmmKind::Qemu);
        assert!(qemu.contains("-M pc ") && qemu.contains("virtio-blk-pci,disable-legacy=on"));
        assert!(qemu.contains("tap,id=n,ifname=exlcmp0,script=no"), "{qemu}");
        assert!(
            qemu.contains("-qmp unix:/q.sock,server=on,wait=off"),
            "{qemu}"
        );
        assert!(
            qemu.contains("virtio-net-pci,disable-legacy=on,netdev=n"),
            "{qemu}"
        );
        assert!(line(VmmKind::Exitless).contains("--net tap=exlcmp0"));
        let ch = line(VmmKind::CloudHypervisor);
        assert!(ch.contains("--disk path=/d.img,image_type=raw"), "{ch}");
        assert!(ch.contains("--net tap=exlcmp0"), "{ch}");
        let fc = Vmm {
            kind: VmmKind::Firecracker,
            path: PathBuf::from("/bin/true"),
        };
        assert!(fc.cannot_run("virtio_blk_qd1").is_some());
        assert!(fc.cannot_run("virtio_net_qd32").is_some());
        assert!(fc.cannot_run("pio_out").is_none());
        let ch = Vmm {
            kind: VmmKind::CloudHypervisor,
            path: PathBuf::from("/bin/true"),
        };
        assert!(ch.cannot_run("virtio_net_qd1").is_some());
        assert!(ch.cannot_run("virtio_blk_qd1").is_none());
    }

    #[test]
    fn a_device_case_names_its_guest_case_queue_depth_and_device() {
        assert_eq!(
            guest_case("virtio_blk_qd32"),
            ("virtio_blk", Some(32), Some(Device::Disk))
        );
        assert_eq!(
            guest_case("virtio_net_qd1"),
            ("virtio_net", Some(1), Some(Device::Net))
        );
        assert_eq!(guest_case("pio_out"), ("pio_out", None, None));
        assert_eq!(guest_case("x_qdz"), ("x_qdz", None, None));
    }

    #[test]
    fn a_named_peer_must_be_an_executable_file() {
        let plain = std::env::temp_dir().join(format!("exitless-plain-{}", std::process::id()));
        std::fs::write(&plain, "x").unwrap();
        let err = Vmm::named(VmmKind::Qemu, &plain).unwrap_err();
        std::fs::remove_file(&plain).ok();
        assert!(err.to_string().contains("not an executable"), "{err}");
        assert!(Vmm::named(VmmKind::Qemu, Path::new("/nonexistent/qemu")).is_err());
        assert!(Vmm::named(VmmKind::Qemu, Path::new("/bin/true")).is_ok());
    }
}
