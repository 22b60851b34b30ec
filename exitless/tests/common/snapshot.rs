//! What the snapshot tests share: a scratch directory, the bench guest's rounds read from its
//! console, and the API steps of a snapshot and of a restore (each reply checked).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exitless_control::api::client::ApiClient;
use vmm::snapshot::SnapshotState;

use super::api_vmm::{json, ok, Vmm};
use super::Stream;

/// A directory removed with everything in it when the test ends.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("exitless-snap-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A snapshot test's start: its scratch directory with an empty `snap` directory in it, and
/// the bench guest exported (removed when the test ends).
pub struct SnapTest {
    pub scratch: Scratch,
    /// `snap` in the scratch directory, made empty.
    pub dir: PathBuf,
    pub guest: PathBuf,
}

impl SnapTest {
    /// None (reported skipped as `test`) without /dev/kvm. `tag` names the scratch directory,
    /// and the guest as `snap-{tag}`.
    pub fn start(test: &str, tag: &str) -> Option<SnapTest> {
        if !super::kvm_available(test) {
            return None;
        }
        let scratch = Scratch::new(tag);
        let dir = scratch.join("snap");
        std::fs::create_dir(&dir).unwrap();
        let guest = super::export_guest(&format!("snap-{tag}"));
        Some(SnapTest {
            scratch,
            dir,
            guest,
        })
    }
}

impl Drop for SnapTest {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.guest);
    }
}

/// A child process killed if the test ends early.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The last round a guest printed, from its console text.
pub fn last_tick(text: &str) -> Option<u64> {
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("EXITLESS TICK n="))
        .find_map(|l| l.split(' ').next()?.parse().ok())
}

/// Waits until the file at `path` holds `line`, or the guest's `EXITLESS ERROR` (it has
/// ended: the caller's checks of the text say what went wrong); its text.
pub fn wait_file(path: &Path, line: &str) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(line) || text.contains("EXITLESS ERROR") {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no '{line}' in {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state the snapshot in `dir` saved.
pub fn saved_state(dir: &Path) -> SnapshotState {
    SnapshotState::parse(&std::fs::read(dir.join("state.json")).unwrap()).unwrap()
}

/// Checks that each device (id, kind) was saved running, set up by its driver.
pub fn assert_saved_running(state: &SnapshotState, devices: &[(&str, &str)]) {
    for &(id, kind) in devices {
        let saved = &state.devices[id];
        assert_eq!(saved.kind, kind);
        assert_eq!(
            saved.state["untouched"], false,
            "{id}: set up by its driver"
        );
        assert_eq!(saved.state["transport"]["running"], true, "{id}");
    }
}

/// Starts `command` with its stdout (the console) piped and read as it comes, stdin and
/// stderr null.
pub fn spawn_console(command: &mut Command) -> (Proc, Stream) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Proc(child);
    let out = Stream::spawn(child.0.stdout.take().unwrap());
    (child, out)
}

/// vm.create with `body`, vm.boot, then waits for the guest's second round in `serial`;
/// the console text then.
pub fn boot_to_second_round(c: &mut ApiClient, body: &str, serial: &Path) -> String {
    ok(
        c.request("PUT", "vm.create", Some(body)).unwrap(),
        "vm.create",
    );
    ok(c.request("PUT", "vm.boot", None).unwrap(), "vm.boot");
    wait_file(serial, "TICK n=1 ")
}

/// vm.snapshot into `dir`: its status and body.
pub fn try_snapshot(c: &mut ApiClient, dir: &Path) -> (u16, String) {
    let url = serde_json::json!({ "destination_url": format!("file://{}", dir.display()) });
    let r = c.request("PUT", "vm.snapshot", Some(&url.to_string()));
    let r = r.unwrap();
    (r.status, r.body.trim().to_string())
}

/// vm.pause, then vm.snapshot into `dir`; both must succeed.
pub fn pause_and_snapshot(c: &mut ApiClient, dir: &Path) {
    ok(c.request("PUT", "vm.pause", None).unwrap(), "vm.pause");
    let (status, body) = try_snapshot(c, dir);
    assert!(
        status == 200 || status == 204,
        "vm.snapshot: {status} {body}"
    );
}

/// vm.restore from `dir` (the VM is Paused then), vm.resume; each must succeed.
pub fn restore_and_resume(c: &mut ApiClient, dir: &Path) {
    let body = serde_json::json!({ "source_url": format!("file://{}", dir.display()) });
    ok(
        c.request("PUT", "vm.restore", Some(&body.to_string()))
            .unwrap(),
        "vm.restore",
    );
    let info = json(&ok(c.request("GET", "vm.info", None).unwrap(), "vm.info"));
    assert_eq!(info["state"], "Paused", "{info}");
    ok(c.request("PUT", "vm.resume", None).unwrap(), "vm.resume");
}

/// [`restore_and_resume`] in `vmm` (a fresh `exitless --api-socket`); the VMM.
pub fn restored_in(vmm: Vmm, dir: &Path) -> Vmm {
    restore_and_resume(&mut vmm.client(), dir);
    vmm
}

/// vmm.shutdown, which must succeed.
pub fn shutdown(c: &mut ApiClient) {
    ok(
        c.request("PUT", "vmm.shutdown", None).unwrap(),
        "vmm.shutdown",
    );
}

/// An `exitless run` with its API socket, its console piped and read as it comes.
pub struct ApiRun {
    child: Proc,
    pub out: Stream,
    pub client: ApiClient,
}

impl ApiRun {
    /// Starts `run` (an `exitless run` command) with `--api-socket socket` and waits until
    /// its console shows `until`; then connects to its API.
    pub fn start(mut run: Command, socket: &Path, until: &str) -> ApiRun {
        let (child, mut out) = spawn_console(run.arg("--api-socket").arg(socket));
        assert!(
            out.wait_for(Duration::from_secs(60), |t| t.contains(until)),
            "{}",
            out.text
        );
        let client = ApiClient::connect(socket, Duration::from_secs(30)).unwrap();
        ApiRun { child, out, client }
    }

    /// vmm.shutdown, then the console to its end; the last round the guest printed.
    pub fn shutdown(mut self) -> u64 {
        shutdown(&mut self.client);
        self.out.read_to_end(Duration::from_secs(10));
        let _ = self.child.0.wait();
        last_tick(&self.out.text).expect("a round before the pause")
    }
}
