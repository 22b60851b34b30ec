//! The `snapshot` compare case: the bench guest's `case=snapshot` (10 MiB of its memory
//! written, then a console line every few milliseconds) booted through each VMM's API,
//! paused mid-loop, snapshotted, and restored in fresh processes of the same VMM, each driven
//! through its own API as its users drive it: exitless and Cloud Hypervisor with Cloud
//! Hypervisor's (`vm.create`, `vm.boot`, `vm.pause`, `vm.snapshot`, `vm.restore`,
//! `vm.resume`), Firecracker with its own (`/boot-source`, `/machine-config`, `/actions`,
//! `PATCH /vm`, `/snapshot/create` of a `Full` snapshot, `/snapshot/load` from a `File`).
//! A VMM that cannot snapshot the guest here is reported with the error it answered.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::api_start::vm_create_body;
use super::console_watch;
use super::peer::Vmm;
use super::process::memory_of;
use super::vmm_kind::VmmKind;
use super::Spread;
use exitless_control::api::client::ApiClient;

/// The case's name in `--cases` (with the peers, which say which of them sit it out).
pub use super::peer::SNAPSHOT_CASE as CASE;

/// The guest: 10 MiB written, then a tick line every few ms for as long as the VM runs.
const CMDLINE: &str = "case=snapshot ticks=100000000 iters=20 touch_mib=10";
/// Ticks the guest prints before it is paused (mid-loop: it goes on ticking).
const TICKS_BEFORE_PAUSE: usize = 20;
/// Clones of one snapshot running at once whose private dirty memory is sampled.
pub const CLONES: usize = 3;
/// How long the clones run before their memory is sampled.
const CLONES_RUN: Duration = Duration::from_millis(500);
/// Longest a VMM may take to answer one request.
const REQUEST_LIMIT: Duration = Duration::from_secs(60);
/// Longest a VMM may take to make its API socket.
const SOCKET_LIMIT: Duration = Duration::from_secs(10);

/// Whether this VMM takes part (the floor has no snapshot; QEMU's `migrate` to a file is not
/// driven here).
pub fn takes_part(kind: VmmKind) -> bool {
    matches!(
        kind,
        VmmKind::Exitless | VmmKind::Firecracker | VmmKind::CloudHypervisor
    )
}

/// One round of one VMM.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotRound {
    /// The snapshot request of the paused VM, as the client saw its reply.
    pub create_ms: f64,
    /// In a fresh process: the restore request (not resuming) and the resume request.
    pub restore_ms: f64,
    pub resume_ms: f64,
    /// Spawn of a fresh process to the guest's next console line, restoring with one request
    /// that also resumes.
    pub spawn_to_line_ms: f64,
    /// Private dirty memory (smaps) of each of [`CLONES`] clones running at once.
    pub clone_private_dirty_kib: Vec<u64>,
    /// Bytes the snapshot's files allocate on disk.
    pub snapshot_bytes: u64,
}

/// One VMM's row: medians (min-max) over the rounds, or the error that stopped it.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotRow {
    pub vmm: &'static str,
    pub failed: Option<String>,
    pub rounds: Vec<SnapshotRound>,
    pub create_ms: Spread,
    /// Restore request to the guest running again: restore + resume.
    pub restore_resume_ms: Spread,
    pub restore_ms: Spread,
    pub resume_ms: Spread,
    pub spawn_to_line_ms: Spread,
    /// Over every clone of every round.
    pub private_dirty_kib: Spread,
    pub snapshot_bytes: Spread,
}

impl SnapshotRow {
    pub fn of(vmm: &'static str, rounds: Vec<SnapshotRound>, failed: Option<String>) -> Self {
        let over =
            |f: fn(&SnapshotRound) -> f64| Spread::of(&rounds.iter().map(f).collect::<Vec<_>>());
        let dirty: Vec<f64> = rounds
            .iter()
            .flat_map(|r| r.clone_private_dirty_kib.iter().map(|k| *k as f64))
            .collect();
        SnapshotRow {
            vmm,
            failed,
            create_ms: over(|r| r.create_ms),
            restore_resume_ms: over(|r| r.restore_ms + r.resume_ms),
            restore_ms: over(|r| r.restore_ms),
            resume_ms: over(|r| r.resume_ms),
            spawn_to_line_ms: over(|r| r.spawn_to_line_ms),
            private_dirty_kib: Spread::of(&dirty),
            snapshot_bytes: over(|r| r.snapshot_bytes as f64),
            rounds,
        }
    }
}

/// Where a round works and what it boots.
pub struct RoundSetting<'a> {
    pub guest: &'a Path,
    pub memory_mib: u64,
    /// A folder of the round's own, removed afterwards (a `Full` snapshot is all of RAM).
    pub dir: PathBuf,
    /// Longest the guest may take to print its next line.
    pub limit: Duration,
}

/// One round: a VM booted, paused and snapshotted, then restored in fresh processes.
pub fn round(vmm: &Vmm, setting: &RoundSetting) -> Result<SnapshotRound, String> {
    let dir = &setting.dir;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let measured = measure(vmm, setting);
    let _ = std::fs::remove_dir_all(dir);
    measured
}

fn measure(vmm: &Vmm, setting: &RoundSetting) -> Result<SnapshotRound, String> {
    let snap = setting.dir.join("snapshot");
    std::fs::create_dir_all(&snap).map_err(|e| format!("cannot make {}: {e}", snap.display()))?;
    let create_ms = make_snapshot(vmm, setting, &snap)?;
    let snapshot_bytes = allocated_bytes(&snap);
    let (restore_ms, resume_ms) = restore_then_resume(vmm, setting, &snap)?;
    let spawn_to_line_ms = spawn_to_line(vmm, setting, &snap)?;
    let clone_private_dirty_kib = clones(vmm, setting, &snap)?;
    Ok(SnapshotRound {
        create_ms,
        restore_ms,
        resume_ms,
        spawn_to_line_ms,
        clone_private_dirty_kib,
        snapshot_bytes,
    })
}

/// Boots the guest, lets it tick, pauses it and snapshots it into `snap`: the snapshot
/// request's time.
fn make_snapshot(vmm: &Vmm, setting: &RoundSetting, snap: &Path) -> Result<f64, String> {
    let mut vm = RunningVmm::spawn(vmm, &setting.dir.join("template.sock"))?;
    vm.boot(setting)?;
    for _ in 0..TICKS_BEFORE_PAUSE {
        vm.next_tick(setting.limit)?;
    }
    vm.pause()?;
    vm.snapshot(snap)
}

/// A fresh process restores without resuming, then resumes: each request's time, once the
/// guest ticked again.
fn restore_then_resume(
    vmm: &Vmm,
    setting: &RoundSetting,
    snap: &Path,
) -> Result<(f64, f64), String> {
    let mut vm = RunningVmm::spawn(vmm, &setting.dir.join("restore.sock"))?;
    let restore = vm.restore(snap, false)?;
    let resume = vm.resume()?;
    vm.next_tick(setting.limit)?;
    Ok((restore, resume))
}

/// Spawn of a fresh process to the guest's next line, restoring with one request that also
/// resumes.
fn spawn_to_line(vmm: &Vmm, setting: &RoundSetting, snap: &Path) -> Result<f64, String> {
    let start = Instant::now();
    let mut vm = RunningVmm::spawn(vmm, &setting.dir.join("spawn.sock"))?;
    vm.restore(snap, true)?;
    let at = vm.next_tick(setting.limit)?;
    Ok(ms(at.saturating_duration_since(start)))
}

/// [`CLONES`] clones of the snapshot at once, each once it ticked and ran a while: their
/// private dirty memory.
fn clones(vmm: &Vmm, setting: &RoundSetting, snap: &Path) -> Result<Vec<u64>, String> {
    let mut vms = Vec::new();
    for i in 0..CLONES {
        let mut vm = RunningVmm::spawn(vmm, &setting.dir.join(format!("clone{i}.sock")))?;
        vm.restore(snap, true)?;
        vms.push(vm);
    }
    for vm in &mut vms {
        vm.next_tick(setting.limit)?;
    }
    std::thread::sleep(CLONES_RUN);
    Ok(vms
        .iter()
        .map(|vm| memory_of(vm.child.id()).private_dirty_kib)
        .collect())
}

/// Bytes the files in `dir` allocate on disk (a sparse file only what it holds).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How a VMM's API is spoken: Cloud Hypervisor's (exitless speaks it too), or Firecracker's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    CloudHypervisor,
    Firecracker,
}

/// A VMM process started with its API socket, its console read on a thread of its own;
/// killed when dropped.
struct RunningVmm {
    child: Child,
    client: ApiClient,
    dialect: Dialect,
    ticks: Receiver<Instant>,
    socket: PathBuf,
}

impl Drop for RunningVmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl RunningVmm {
    /// Starts `vmm` with its API on `socket` and connects once the socket answers.
    fn spawn(vmm: &Vmm, socket: &Path) -> Result<Self, String> {
        let _ = std::fs::remove_file(socket);
        let (dialect, args) = match vmm.kind {
            VmmKind::Firecracker => (
                Dialect::Firecracker,
                vec!["--api-sock".into(), socket.display().to_string()],
            ),
            VmmKind::CloudHypervisor => (
                Dialect::CloudHypervisor,
                vec!["--api-socket".into(), format!("path={}", socket.display())],
            ),
            _ => (
                Dialect::CloudHypervisor,
                vec!["--api-socket".into(), socket.display().to_string()],
            ),
        };
        let mut cmd = Command::new(&vmm.path);
        cmd.args(&args);
        if dialect == Dialect::Firecracker {
            cmd.args(["--level", "Error"]);
        }
        let (mut child, ticks) = console_watch::spawn(&mut cmd, &vmm.path, "EXITLESS TICK")?;
        let client = match connect(socket, &mut child) {
            Ok(c) => c,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(RunningVmm {
            child,
            client,
            dialect,
            ticks,
            socket: socket.to_path_buf(),
        })
    }

    /// One request; its time in ms, or `what: STATUS BODY` when it is refused.
    fn timed(&mut self, method: &str, what: &str, body: Option<String>) -> Result<f64, String> {
        let path = match self.dialect {
            Dialect::CloudHypervisor => format!("/api/v1/{what}"),
            Dialect::Firecracker => what.to_string(),
        };
        let start = Instant::now();
        let reply = self
            .client
            .request_path(method, &path, body.as_deref())
            .map_err(|e| format!("{what}: {e}"))?;
        let took = ms(start.elapsed());
        if !(200..300).contains(&reply.status) {
            return Err(format!(
                "{what}: {} {}",
                reply.status,
                one_line(&reply.body)
            ));
        }
        Ok(took)
    }

    /// Creates and boots the guest.
    fn boot(&mut self, setting: &RoundSetting) -> Result<(), String> {
        if self.dialect == Dialect::CloudHypervisor {
            let body = vm_create_body(setting.guest, setting.memory_mib, CMDLINE);
            self.timed("PUT", "vm.create", Some(body))?;
            return self.timed("PUT", "vm.boot", None).map(drop);
        }
        let source = serde_json::json!({
            "kernel_image_path": setting.guest,
            "boot_args": CMDLINE,
        });
        let machine = serde_json::json!({"vcpu_count": 1, "mem_size_mib": setting.memory_mib});
        let start = serde_json::json!({"action_type": "InstanceStart"});
        self.timed("PUT", "/boot-source", Some(source.to_string()))?;
        self.timed("PUT", "/machine-config", Some(machine.to_string()))?;
        self.timed("PUT", "/actions", Some(start.to_string()))
            .map(drop)
    }

    fn pause(&mut self) -> Result<f64, String> {
        match self.dialect {
            Dialect::CloudHypervisor => self.timed("PUT", "vm.pause", None),
            Dialect::Firecracker => {
                self.timed("PATCH", "/vm", Some(r#"{"state":"Paused"}"#.into()))
            }
        }
    }

    fn resume(&mut self) -> Result<f64, String> {
        match self.dialect {
            Dialect::CloudHypervisor => self.timed("PUT", "vm.resume", None),
            Dialect::Firecracker => {
                self.timed("PATCH", "/vm", Some(r#"{"state":"Resumed"}"#.into()))
            }
        }
    }

    /// Snapshots the paused VM into `snap`.
    fn snapshot(&mut self, snap: &Path) -> Result<f64, String> {
        let body = match self.dialect {
            Dialect::CloudHypervisor => {
                serde_json::json!({"destination_url": format!("file://{}", snap.display())})
            }
            Dialect::Firecracker => serde_json::json!({
                "snapshot_type": "Full",
                "snapshot_path": snap.join("vmstate"),
                "mem_file_path": snap.join("mem"),
            }),
        };
        match self.dialect {
            Dialect::CloudHypervisor => self.timed("PUT", "vm.snapshot", Some(body.to_string())),
            Dialect::Firecracker => self.timed("PUT", "/snapshot/create", Some(body.to_string())),
        }
    }

    /// Restores the VM in `snap` into this process, resuming it at once with `resume`.
    fn restore(&mut self, snap: &Path, resume: bool) -> Result<f64, String> {
        match self.dialect {
            Dialect::CloudHypervisor => {
                let url = format!("file://{}", snap.display());
                let body = serde_json::json!({"source_url": url, "resume": resume});
                self.timed("PUT", "vm.restore", Some(body.to_string()))
            }
            Dialect::Firecracker => {
                let body = serde_json::json!({
                    "snapshot_path": snap.join("vmstate"),
                    "mem_backend": {"backend_type": "File", "backend_path": snap.join("mem")},
                    "resume_vm": resume,
                });
                self.timed("PUT", "/snapshot/load", Some(body.to_string()))
            }
        }
    }

    /// When the guest's next tick line reached the VMM's stdout.
    fn next_tick(&mut self, limit: Duration) -> Result<Instant, String> {
        self.ticks.recv_timeout(limit).map_err(|_| {
            let status = match self.child.try_wait() {
                Ok(Some(s)) => format!("the VMM ended ({s})"),
                _ => format!("no console line within {limit:?}"),
            };
            format!("the guest did not tick: {status}")
        })
    }
}

/// An error body on one line: Cloud Hypervisor's list of causes joined with ": ", each
/// without the backtrace it may carry; any other body with its whitespace folded.
pub(super) fn one_line(body: &str) -> String {
    let causes: Option<Vec<String>> = serde_json::from_str(body).ok();
    let text = match causes {
        Some(causes) => causes
            .iter()
            .map(|c| c.split("\n\n").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(": "),
        None => body.to_string(),
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A client of the API on `socket`, once `child` accepts connections there.
pub(super) fn connect(socket: &Path, child: &mut Child) -> Result<ApiClient, String> {
    let start = Instant::now();
    loop {
        let e = match ApiClient::connect(socket, REQUEST_LIMIT) {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the VMM ended ({status}) before its API answered"));
        }
        if start.elapsed() > SOCKET_LIMIT {
            return Err(format!("no API on {}: {e}", socket.display()));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(create: f64, restore: f64, resume: f64, dirty: [u64; CLONES]) -> SnapshotRound {
        SnapshotRound {
            create_ms: create,
            restore_ms: restore,
            resume_ms: resume,
            spawn_to_line_ms: 2.0 * restore,
            clone_private_dirty_kib: dirty.to_vec(),
            snapshot_bytes: 4096,
        }
    }

    #[test]
    fn a_row_takes_medians_over_rounds_and_every_clone() {
        let rounds = vec![
            round(1.0, 2.0, 1.0, [300, 310, 320]),
            round(3.0, 4.0, 0.5, [290, 400, 305]),
            round(2.0, 3.0, 2.0, [301, 302, 303]),
        ];
        let row = SnapshotRow::of("exitless", rounds, None);
        assert_eq!(row.create_ms.median, 2.0);
        assert_eq!(row.restore_resume_ms.median, 4.5);
        assert_eq!(row.restore_resume_ms.min, 3.0);
        assert_eq!(row.spawn_to_line_ms.max, 8.0);
        assert_eq!(row.private_dirty_kib.median, 303.0);
        assert_eq!(row.private_dirty_kib.max, 400.0);
        assert_eq!(row.snapshot_bytes.median, 4096.0);
        let failed = SnapshotRow::of(
            "cloud-hypervisor",
            Vec::new(),
            Some("vm.snapshot: 500".into()),
        );
        assert_eq!(failed.create_ms, Spread::default());
        assert_eq!(failed.failed.as_deref(), Some("vm.snapshot: 500"));
    }

    #[test]
    fn an_error_body_is_one_line_without_backtraces() {
        let ch = r#"["Error from API","Cannot snapshot VM","Could not get vCPU state GetNestedState(Invalid argument (os error 22)\n\nStack backtrace:\n 0: <unknown>\n 1: start_thread)"]"#;
        assert_eq!(
            one_line(ch),
            "Error from API: Cannot snapshot VM: Could not get vCPU state \
             GetNestedState(Invalid argument (os error 22)"
        );
        assert_eq!(
            one_line("{\"fault_message\": \"Bad\n request\"}"),
            "{\"fault_message\": \"Bad request\"}"
        );
    }

    #[test]
    fn the_peers_that_snapshot_take_part_and_the_others_say_why_not() {
        use super::super::peer::snapshot_why_not as why_not;
        for kind in [
            VmmKind::Exitless,
            VmmKind::Firecracker,
            VmmKind::CloudHypervisor,
        ] {
            assert!(takes_part(kind) && why_not(kind).is_none(), "{kind:?}");
        }
        for kind in [VmmKind::Qemu, VmmKind::Floor] {
            assert!(!takes_part(kind) && why_not(kind).is_some(), "{kind:?}");
        }
    }

    #[test]
    fn a_vmm_that_never_makes_its_socket_is_one_clear_error() {
        let dir = std::env::temp_dir().join(format!("exitless-snapcmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let vmm = Vmm {
            kind: VmmKind::CloudHypervisor,
            path: PathBuf::from("/bin/true"),
        };
        let e = RunningVmm::spawn(&vmm, &dir.join("none.sock"))
            .err()
            .expect("no API");
        assert!(
            e.contains("ended") && e.contains("before its API answered"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
