//! KVM's `exits` statistic of a VMM's VM (every exit of every vCPU, in-kernel or not), read
//! from outside where the host lets us: KVM's debugfs folder of the VM. Where the kernel's
//! lockdown refuses debugfs statistics, each VMM's own channel: exitless's exit profile
//! (`--profile-json`, written when SIGTERM stops it) and QEMU's `query-stats` over QMP;
//! Cloud Hypervisor and Firecracker expose none.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::vmm_kind::VmmKind;

const KVM_DEBUGFS: &str = "/sys/kernel/debug/kvm";

/// Where one run's `exits` count comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitsSource {
    /// KVM's debugfs folder of the VM (`PID-FD/exits`).
    Debugfs,
    /// exitless's profile JSON, written at this path when it stops.
    ExitlessProfile(PathBuf),
    /// QEMU's QMP socket at this path.
    Qmp(PathBuf),
    /// None, and why.
    Unavailable(&'static str),
}

impl ExitsSource {
    /// The source for `kind` when debugfs cannot be read; files go into `workdir`.
    pub fn own_channel(kind: VmmKind, workdir: &Path) -> ExitsSource {
        match kind {
            VmmKind::Exitless => ExitsSource::ExitlessProfile(workdir.join("profile.json")),
            VmmKind::Qemu => ExitsSource::Qmp(workdir.join("qmp.sock")),
            VmmKind::Firecracker | VmmKind::CloudHypervisor | VmmKind::Floor => {
                ExitsSource::Unavailable("it exposes no KVM statistics")
            }
        }
    }

    /// The count, once the guest is done and the VMM (process `pid`) still runs; an
    /// exitless run is stopped by SIGTERM here so that it writes its profile.
    pub fn read(&self, pid: u32) -> Result<u64, String> {
        match self {
            ExitsSource::Debugfs => debugfs_exits(pid),
            ExitsSource::ExitlessProfile(path) => profile_exits(pid, path),
            ExitsSource::Qmp(path) => qmp_exits(path),
            ExitsSource::Unavailable(why) => Err(why.to_string()),
        }
    }
}

/// Whether KVM's debugfs statistics can be read here (debugfs mounted if it is not), or why
/// not.
pub fn debugfs_readable() -> Result<(), String> {
    let debugfs = Path::new(KVM_DEBUGFS);
    if !debugfs.exists() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "debugfs", "nodev", "/sys/kernel/debug"])
            .output();
    }
    match std::fs::read_to_string(debugfs.join("exits")) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Err(format!(
            "KVM's debugfs statistics refused: {e} (kernel lockdown)"
        )),
        Err(e) => Err(format!("cannot read {KVM_DEBUGFS}/exits: {e}")),
    }
}

/// KVM's debugfs folder for a VM is `PID-FD`; its `exits` file sums the VM's vCPUs.
fn debugfs_exits(pid: u32) -> Result<u64, String> {
    let prefix = format!("{pid}-");
    std::fs::read_dir(KVM_DEBUGFS)
        .map_err(|e| format!("cannot list {KVM_DEBUGFS}: {e}"))?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("exits")).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .reduce(|a, b| a + b)
        .ok_or_else(|| format!("no KVM debugfs folder for process {pid}"))
}

/// Stops exitless (SIGTERM), waits for its profile, and sums its `exits` statistics.
fn profile_exits(pid: u32, path: &Path) -> Result<u64, String> {
    let _ = std::fs::remove_file(path);
    // SAFETY: kill has no memory effects; pid is our own child, still unreaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let profile = loop {
        // The profile is written once, whole; a partial read fails to parse and is retried.
        let read = std::fs::read_to_string(path).ok();
        if let Some(v) = read.and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()) {
            break v;
        }
        if Instant::now() > deadline {
            return Err("exitless wrote no profile within 10 s of SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(stat_sum(&profile["kvm_stats"], "delta"))
}

/// Sums `key` over the entries of `stats` named `exits`.
fn stat_sum(stats: &serde_json::Value, key: &str) -> u64 {
    stats
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == "exits")
        .filter_map(|s| s[key].as_u64())
        .sum()
}

/// `query-stats` for the vCPUs' `exits` over QEMU's QMP socket.
fn qmp_exits(path: &Path) -> Result<u64, String> {
    let stream = UnixStream::connect(path).map_err(|e| format!("QMP: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| format!("QMP: {e}"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| format!("QMP: {e}"))?);
    let mut writer = stream;
    let mut reply = String::new();
    let mut exchange = |command: &str| -> Result<serde_json::Value, String> {
        if !command.is_empty() {
            writeln!(writer, "{command}").map_err(|e| format!("QMP: {e}"))?;
        }
        reply.clear();
        reader
            .read_line(&mut reply)
            .map_err(|e| format!("QMP: {e}"))?;
        serde_json::from_str(&reply).map_err(|e| format!("QMP reply: {e}"))
    };
    exchange("")?;
    exchange(r#"{"execute": "qmp_capabilities"}"#)?;
    let stats = exchange(
        r#"{"execute": "query-stats", "arguments": {"target": "vcpu", "providers": [{"provider": "kvm", "names": ["exits"]}]}}"#,
    )?;
    let vcpus = stats["return"]
        .as_array()
        .ok_or_else(|| format!("QMP query-stats: {stats}"))?;
    Ok(vcpus.iter().map(|v| stat_sum(&v["stats"], "value")).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_summed_over_vcpus_and_only_exits() {
        let profile = serde_json::json!([
            {"scope": "vcpu0", "name": "exits", "delta": 10},
            {"scope": "vcpu1", "name": "exits", "delta": 5},
            {"scope": "vcpu0", "name": "io_exits", "delta": 7},
        ]);
        assert_eq!(stat_sum(&profile, "delta"), 15);
        let dir = Path::new("/w");
        assert_eq!(
            ExitsSource::own_channel(VmmKind::Qemu, dir),
            ExitsSource::Qmp(dir.join("qmp.sock"))
        );
        let ch = ExitsSource::own_channel(VmmKind::CloudHypervisor, dir);
        assert!(ch.read(1).is_err());
    }
}
