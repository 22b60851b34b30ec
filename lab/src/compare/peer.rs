//! The VMMs `exitless compare` runs, and how each starts the bench guest (a direct-boot PVH
//! ELF, 1 vCPU): as each one's own documentation starts a kernel.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::kvm_stats::ExitsSource;
use super::vmm_kind::VmmKind;
use super::CompareError;

/// The snapshot case's name in `--cases` (its run: snapshot.rs).
pub const SNAPSHOT_CASE: &str = "snapshot";

/// Why a VMM sits the snapshot case out.
pub fn snapshot_why_not(kind: VmmKind) -> Option<&'static str> {
    match kind {
        VmmKind::Qemu => Some("its snapshots (migrate to a file over QMP) are not driven here"),
        VmmKind::Floor => Some("it has no snapshot"),
        _ => None,
    }
}

/// The migrate case's name in `--cases` (its run: migrate.rs).
pub const MIGRATE_CASE: &str = "migrate";

/// Why a VMM sits the migrate case out.
pub fn migrate_why_not(kind: VmmKind) -> Option<&'static str> {
    match kind {
        VmmKind::Firecracker => Some("it cannot migrate a running VM (snapshots only)"),
        VmmKind::Floor => Some("it has no migration"),
        _ => None,
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
    /// A vsock device (guest context id 3) joined to a Unix socket at this path, which must
    /// not exist yet; QEMU leaves it out (see [`Vmm::left_out`]).
    pub vsock: Option<&'a Path>,
    /// A virtiofsd's vhost-user socket, attached as the VMM's virtio-fs device (tag
    /// `kataShared`, one request queue of 1024) on shared guest memory (fs cases).
    pub fs: Option<&'a Path>,
    /// A vhost-user-blk back end's socket (qemu-storage-daemon's export), attached as the
    /// VMM's vhost-user disk (one queue of 128) on shared guest memory (vhost_user_blk cases).
    pub vhost_blk: Option<&'a Path>,
    /// Where KVM's exit count is read (a VMM's own channel is switched on for it).
    pub exits: &'a ExitsSource,
}

impl<'a> Launch<'a> {
    /// `cmdline` on `guest` with no device.
    pub fn bare(
        guest: &'a Path,
        cmdline: &'a str,
        memory_mib: u64,
        workdir: &'a Path,
        exits: &'a ExitsSource,
    ) -> Self {
        Launch {
            guest,
            cmdline,
            memory_mib,
            workdir,
            disk: None,
            tap: None,
            vsock: None,
            fs: None,
            vhost_blk: None,
            exits,
        }
    }
}

/// The devices a compare case attaches to every VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// A disk the guest's virtio-pci driver drives.
    Disk,
    /// A tap the guest's virtio-pci driver drives.
    Net,
    /// A disk, a tap and vsock, attached but not driven (the guest runs a loop case): what
    /// devices cost a VMM in memory and start-up.
    Attached,
    /// A virtiofsd of the VMM's own (vhost-user) the guest's virtio-fs driver reads through.
    Fs,
    /// A qemu-storage-daemon of the VMM's own exporting the image as vhost-user-blk: the
    /// guest's virtio-blk driver drives it as a plain disk.
    VhostBlk,
}

impl Device {
    pub fn has_disk(self) -> bool {
        matches!(self, Device::Disk | Device::Attached)
    }

    /// Whether the case needs the comparison's tap (and so root).
    pub fn has_tap(self) -> bool {
        matches!(self, Device::Net | Device::Attached)
    }

    pub fn has_vsock(self) -> bool {
        self == Device::Attached
    }

    /// Whether the case needs a virtiofsd (and so root) and shared guest memory.
    pub fn has_fs(self) -> bool {
        self == Device::Fs
    }

    /// Whether the case needs qemu-storage-daemon and shared guest memory.
    pub fn has_vhost_blk(self) -> bool {
        self == Device::VhostBlk
    }

    /// Whether the case needs the comparison's raw image (its own disk, or the daemon's).
    pub fn needs_image(self) -> bool {
        self.has_disk() || self.has_vhost_blk()
    }

    /// Whether the guest drives the device (its figures are per request).
    pub fn driven(self) -> bool {
        self != Device::Attached
    }
}

/// Compare cases that drive a device: the guest case at a queue depth.
pub const DEVICE_CASES: &[&str] = &[
    "virtio_blk_qd1",
    "virtio_blk_qd32",
    "virtio_net_qd1",
    "virtio_net_qd32",
    "virtio_fs_qd1",
    "virtio_fs_qd32",
    "vhost_user_blk_qd1",
    "vhost_user_blk_qd32",
];

/// A compare case name ending in this runs its guest case with [`Device::Attached`].
const ATTACHED_SUFFIX: &str = "_devices";

fn peer_device(case: &str) -> Option<Device> {
    guest_case(case).2
}

/// A compare case's guest case, queue depth (device cases) and device:
/// `virtio_blk_qd32` is the guest's `virtio_blk` at `qd=32` on a disk; `vhost_user_blk_qd1`
/// the same loop at `qd=1` on a vhost-user-blk disk; `pio_out_devices` is the guest's
/// `pio_out` with a disk, a tap and vsock attached.
pub fn guest_case(case: &str) -> (&str, Option<u32>, Option<Device>) {
    if let Some(name) = case.strip_suffix(ATTACHED_SUFFIX) {
        return (name, None, Some(Device::Attached));
    }
    let (name, qd) = match case.rsplit_once("_qd") {
        Some((name, qd)) if qd.parse::<u32>().is_ok() => (name, qd.parse().ok()),
        _ => (case, None),
    };
    let (guest, device) = match name {
        "virtio_blk" => (name, Some(Device::Disk)),
        "virtio_net" => (name, Some(Device::Net)),
        "virtio_fs" => (name, Some(Device::Fs)),
        // The guest sees a plain virtio-blk disk: its virtio_blk loop.
        "vhost_user_blk" => ("virtio_blk", Some(Device::VhostBlk)),
        _ => (name, None),
    };
    (guest, qd, device)
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
        if case == SNAPSHOT_CASE {
            return snapshot_why_not(self.kind);
        }
        if case == MIGRATE_CASE {
            return migrate_why_not(self.kind);
        }
        let device = peer_device(case)?;
        match (self.kind, device) {
            // Attached devices are not driven: transport and BARs do not matter.
            (_, Device::Attached) => None,
            (VmmKind::Floor, _) => Some("it has no devices: COM1 and the exit port only"),
            (VmmKind::Firecracker, Device::Fs) => {
                Some("it has no virtio-fs device (no vhost-user front end)")
            }
            (VmmKind::Firecracker, Device::VhostBlk) => Some(
                "its vhost-user-blk is virtio-mmio only (with --enable-pci its BARs cannot be \
                 moved, and the bench guest's driver is virtio-pci)",
            ),
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

    /// What this VMM runs `case` without, and why (the case runs all the same); nothing for
    /// a case it cannot run at all ([`Vmm::cannot_run`] says why).
    pub fn left_out(&self, case: &str) -> Option<&'static str> {
        let device = peer_device(case)?;
        if self.cannot_run(case).is_some() {
            return None;
        }
        match self.kind {
            VmmKind::Floor => Some(
                "a disk, a tap and vsock: the floor has no devices (its row is the limit \
                 without them)",
            ),
            VmmKind::Qemu if device.has_vsock() => Some(
                "vsock: QEMU's is vhost-vsock-pci, which needs the host kernel's vhost_vsock \
                 (/dev/vhost-vsock)",
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
            VmmKind::Floor => {
                cmd.arg(launch.guest)
                    .arg(launch.cmdline)
                    .arg(launch.memory_mib.to_string());
            }
        }
        Ok(cmd)
    }
}

/// The guest context id of every VMM's vsock device.
const VSOCK_CID: u32 = 3;

/// The tag and queues every VMM's virtio-fs device gets (Kata's).
const FS_DEVICE: &str = "tag=kataShared,num_queues=1,queue_size=1024";

/// Whether the launch has a vhost-user device (its guest memory must be shared).
fn vhost_user(launch: &Launch) -> bool {
    launch.fs.is_some() || launch.vhost_blk.is_some()
}

fn exitless_args(cmd: &mut Command, launch: &Launch) {
    let memory = match vhost_user(launch) {
        true => format!("size={}M,shared=on", launch.memory_mib),
        false => format!("{}M", launch.memory_mib),
    };
    cmd.arg("run")
        .arg("--kernel")
        .arg(launch.guest)
        .args(["--memory", &memory, "--cpus", "1"])
        .args(["--cmdline", launch.cmdline]);
    if let Some(socket) = launch.fs {
        cmd.arg("--fs")
            .arg(format!("{FS_DEVICE},socket={}", socket.display()));
    }
    if let Some(disk) = launch.disk {
        cmd.arg("--disk").arg(format!("path={}", disk.display()));
    }
    if let Some(socket) = launch.vhost_blk {
        cmd.arg("--disk")
            .arg(format!("vhost_user=on,socket={}", socket.display()));
    }
    if let Some(tap) = launch.tap {
        cmd.arg("--net").arg(format!("tap={tap}"));
    }
    if let Some(socket) = launch.vsock {
        cmd.arg("--vsock")
            .arg(format!("cid={VSOCK_CID},socket={}", socket.display()));
    }
    if let ExitsSource::ExitlessProfile(path) = launch.exits {
        cmd.arg("--profile-json").arg(path);
    }
}

fn qemu_args(cmd: &mut Command, launch: &Launch) {
    // microvm has PCI only through ECAM; the guest's driver uses 0xCF8: a device case runs
    // on the pc machine.
    let machine = if launch.disk.is_some() || launch.tap.is_some() || vhost_user(launch) {
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
    if vhost_user(launch) {
        // vhost-user needs guest RAM in a shared memfd (QEMU's docs/system/devices/vhost-user).
        cmd.args(["-object"])
            .arg(format!("memory-backend-memfd,id=mem,size={mem}M,share=on"))
            .args(["-numa", "node,memdev=mem"]);
    }
    if let Some(socket) = launch.fs {
        cmd.arg("-chardev")
            .arg(format!("socket,id=vfs,path={}", socket.display()))
            .args([
                "-device",
                "vhost-user-fs-pci,chardev=vfs,tag=kataShared,queue-size=1024",
            ]);
    }
    if let Some(socket) = launch.vhost_blk {
        cmd.arg("-chardev")
            .arg(format!("socket,id=vblk,path={}", socket.display()))
            .args([
                "-device",
                "vhost-user-blk-pci,disable-legacy=on,chardev=vblk,num-queues=1,queue-size=128",
            ]);
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
    let mut json = serde_json::json!({
        "boot-source": {
            "kernel_image_path": launch.guest,
            "boot_args": launch.cmdline,
        },
        "machine-config": {"vcpu_count": 1, "mem_size_mib": launch.memory_mib},
        "drives": [],
    });
    if let Some(disk) = launch.disk {
        json["drives"] = serde_json::json!([{
            "drive_id": "disk",
            "path_on_host": disk,
            "is_root_device": false,
            "is_read_only": false,
        }]);
    }
    if let Some(tap) = launch.tap {
        json["network-interfaces"] = serde_json::json!([{"iface_id": "net", "host_dev_name": tap}]);
    }
    if let Some(socket) = launch.vsock {
        json["vsock"] = serde_json::json!({"guest_cid": VSOCK_CID, "uds_path": socket});
    }
    std::fs::write(&config, json.to_string()).map_err(CompareError::Workdir)?;
    cmd.args(["--no-api", "--level", "Error", "--config-file"])
        .arg(config);
    Ok(())
}

fn cloud_hypervisor_args(cmd: &mut Command, launch: &Launch) {
    let shared = if vhost_user(launch) { ",shared=on" } else { "" };
    cmd.arg("--kernel")
        .arg(launch.guest)
        .args(["--cmdline", launch.cmdline, "--cpus", "boot=1"])
        .args(["--memory", &format!("size={}M{shared}", launch.memory_mib)])
        .args(["--serial", "tty", "--console", "off"]);
    if let Some(socket) = launch.fs {
        cmd.arg("--fs")
            .arg(format!("{FS_DEVICE},socket={}", socket.display()));
    }
    if let Some(disk) = launch.disk {
        cmd.arg("--disk")
            .arg(format!("path={},image_type=raw", disk.display()));
    }
    if let Some(socket) = launch.vhost_blk {
        cmd.arg("--disk").arg(format!(
            "vhost_user=on,socket={},num_queues=1,queue_size=128",
            socket.display()
        ));
    }
    if let Some(tap) = launch.tap {
        cmd.arg("--net").arg(format!("tap={tap}"));
    }
    if let Some(socket) = launch.vsock {
        cmd.arg("--vsock")
            .arg(format!("cid={VSOCK_CID},socket={}", socket.display()));
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer of `kind` (its path does not matter to the command line).
    fn vmm(kind: VmmKind) -> Vmm {
        Vmm {
            kind,
            path: PathBuf::from("/bin/true"),
        }
    }

    /// 512 MiB of `cmdline` with no device, exits from debugfs, in a folder nothing is
    /// written to (no Firecracker command is made of it).
    fn launch_of(cmdline: &str) -> Launch<'_> {
        let workdir = Path::new("/nonexistent/compare");
        Launch::bare(
            Path::new("/g.elf"),
            cmdline,
            512,
            workdir,
            &ExitsSource::Debugfs,
        )
    }

    /// The command line `launch` gives a VMM of `kind`, joined.
    fn line_of(kind: VmmKind, launch: &Launch) -> String {
        args(&vmm(kind).command(launch).unwrap()).join(" ")
    }

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
            vsock: None,
            fs: None,
            vhost_blk: None,
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
            vsock: None,
            fs: None,
            vhost_blk: None,
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
        assert_eq!(
            guest_case("pio_out_devices"),
            ("pio_out", None, Some(Device::Attached))
        );
        assert_eq!(guest_case("x_qdz"), ("x_qdz", None, None));
    }

    #[test]
    fn an_fs_case_gives_every_vmm_shared_memory_and_the_socket_but_firecracker_sits_it_out() {
        let launch = Launch {
            fs: Some(Path::new("/fs.sock")),
            ..launch_of("case=virtio_fs qd=32")
        };
        let line = |kind| line_of(kind, &launch);
        let fs = "--fs tag=kataShared,num_queues=1,queue_size=1024,socket=/fs.sock";
        let exitless = line(VmmKind::Exitless);
        assert!(
            exitless.contains("--memory size=512M,shared=on"),
            "{exitless}"
        );
        assert!(exitless.contains(fs), "{exitless}");
        let ch = line(VmmKind::CloudHypervisor);
        assert!(ch.contains("--memory size=512M,shared=on"), "{ch}");
        assert!(ch.contains(fs), "{ch}");
        let qemu = line(VmmKind::Qemu);
        assert!(qemu.contains("-M pc "), "{qemu}");
        assert!(
            qemu.contains("memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem"),
            "{qemu}"
        );
        assert!(qemu.contains("socket,id=vfs,path=/fs.sock"), "{qemu}");
        assert!(qemu.contains("vhost-user-fs-pci,chardev=vfs,tag=kataShared,queue-size=1024"));
        assert_eq!(
            guest_case("virtio_fs_qd32"),
            ("virtio_fs", Some(32), Some(Device::Fs))
        );
        assert!(vmm(VmmKind::Firecracker)
            .cannot_run("virtio_fs_qd1")
            .is_some());
        // The floor cannot run it: said once, not also as something it runs without.
        let floor = vmm(VmmKind::Floor);
        assert!(floor.cannot_run("virtio_fs_qd32").is_some());
        assert!(floor.left_out("virtio_fs_qd32").is_none());
        assert!(floor.left_out("pio_out_devices").is_some());
        for kind in [VmmKind::Exitless, VmmKind::Qemu, VmmKind::CloudHypervisor] {
            assert!(vmm(kind).cannot_run("virtio_fs_qd32").is_none(), "{kind:?}");
        }
    }

    #[test]
    fn a_vhost_user_blk_case_gives_every_vmm_the_daemon_s_socket_on_shared_memory_only() {
        let launch = Launch {
            vhost_blk: Some(Path::new("/b.sock")),
            ..launch_of("case=virtio_blk qd=32")
        };
        let line = |kind| line_of(kind, &launch);
        // exitless's requests all go to the daemon: no disk of its own, the vhost-user one's
        // kicks and calls KVM's ioeventfd and irqfd (0 userspace exits a request).
        let exitless = line(VmmKind::Exitless);
        assert!(
            exitless.contains("--memory size=512M,shared=on"),
            "{exitless}"
        );
        assert!(
            exitless.ends_with("--disk vhost_user=on,socket=/b.sock"),
            "{exitless}"
        );
        assert_eq!(exitless.matches("--disk").count(), 1, "{exitless}");
        let ch = line(VmmKind::CloudHypervisor);
        assert!(ch.contains("--memory size=512M,shared=on"), "{ch}");
        assert!(
            ch.contains("--disk vhost_user=on,socket=/b.sock,num_queues=1,queue_size=128"),
            "{ch}"
        );
        assert!(!ch.contains("image_type"), "{ch}");
        let qemu = line(VmmKind::Qemu);
        assert!(
            qemu.contains("-M pc ") && qemu.contains("share=on"),
            "{qemu}"
        );
        assert!(qemu.contains("socket,id=vblk,path=/b.sock"), "{qemu}");
        assert!(qemu.contains("vhost-user-blk-pci,disable-legacy=on,chardev=vblk,num-queues=1"));
        assert!(!qemu.contains("-drive"), "{qemu}");
        assert_eq!(
            guest_case("vhost_user_blk_qd32"),
            ("virtio_blk", Some(32), Some(Device::VhostBlk))
        );
        assert!(Device::VhostBlk.needs_image() && !Device::VhostBlk.has_disk());
        assert!(vmm(VmmKind::Firecracker)
            .cannot_run("vhost_user_blk_qd1")
            .is_some());
        for kind in [VmmKind::Exitless, VmmKind::Qemu, VmmKind::CloudHypervisor] {
            assert!(
                vmm(kind).cannot_run("vhost_user_blk_qd1").is_none(),
                "{kind:?}"
            );
        }
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

    #[test]
    fn attached_devices_give_every_vmm_a_disk_a_tap_and_vsock_but_qemu_no_vsock() {
        let dir = std::env::temp_dir().join(format!("exitless-attached-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let launch = Launch {
            guest: Path::new("/g.elf"),
            cmdline: "case=pio_out",
            memory_mib: 512,
            workdir: &dir,
            disk: Some(Path::new("/d.img")),
            tap: Some("exlcmp0"),
            vsock: Some(Path::new("/v.sock")),
            fs: None,
            vhost_blk: None,
            exits: &ExitsSource::Debugfs,
        };
        let vmm = |kind| Vmm {
            kind,
            path: PathBuf::from("/bin/true"),
        };
        let line = |kind| args(&vmm(kind).command(&launch).unwrap()).join(" ");
        for kind in [VmmKind::Exitless, VmmKind::CloudHypervisor] {
            let l = line(kind);
            assert!(l.contains("--vsock cid=3,socket=/v.sock"), "{l}");
            assert!(l.contains("--net tap=exlcmp0") && l.contains("--disk path=/d.img"));
        }
        let qemu = line(VmmKind::Qemu);
        assert!(
            !qemu.contains("vsock") && qemu.contains("ifname=exlcmp0"),
            "{qemu}"
        );
        line(VmmKind::Firecracker);
        let config = std::fs::read_to_string(dir.join("firecracker.json")).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        assert_eq!(config["drives"][0]["path_on_host"], "/d.img", "{config}");
        assert_eq!(config["drives"][0]["is_root_device"], false);
        assert_eq!(config["network-interfaces"][0]["host_dev_name"], "exlcmp0");
        assert_eq!(config["vsock"]["guest_cid"], 3);
        assert_eq!(config["vsock"]["uds_path"], "/v.sock");
        for kind in VmmKind::PEERS {
            assert!(
                vmm(kind).cannot_run("pio_out_devices").is_none(),
                "{kind:?}"
            );
        }
        assert!(vmm(VmmKind::Qemu).left_out("pio_out_devices").is_some());
        assert!(vmm(VmmKind::Firecracker)
            .left_out("pio_out_devices")
            .is_none());
        assert!(vmm(VmmKind::Qemu).left_out("virtio_blk_qd1").is_none());
    }
}
