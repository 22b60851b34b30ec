//! Starting one VM of a density run: the process spawned, driven through its API where it
//! has one that orchestrators use (exitless and Cloud Hypervisor: `--api-socket`, `vmm.ping`
//! until it answers, `vm.create`, `vm.boot`, as Kata Containers starts a VMM), else booted
//! from its command line (Firecracker's config file, QEMU, the floor); then its console read
//! until the guest is up and idle.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::super::api_start::{speaks_api, vm_create_body};
use super::super::kvm_stats::ExitsSource;
use super::super::peer::{Launch, Vmm};
use exitless_control::api::client::ApiClient;

/// The guest's command line: up, then idle for good.
pub const IDLE_CMDLINE: &str = "case=idle";
/// How long a VMM may take to answer `vmm.ping`, and each request.
const API_LIMIT: Duration = Duration::from_secs(30);
/// Between `vmm.ping` attempts while the VMM starts.
const PING_EVERY: Duration = Duration::from_millis(1);

/// What one VM's starter tells the run, with the VM's index.
#[derive(Debug)]
pub enum Event {
    /// The process was spawned (asked for then; its `Child` is in the run's table).
    Spawned(Instant),
    /// The guest's first console line came then.
    FirstLine(Instant),
    /// The CPU time the VMM's process had used when its guest's first line came (all its
    /// threads, from spawn).
    StartCpu(Duration),
    /// The guest printed `EXITLESS DONE`: it is idle now.
    Idle,
    /// The VM could not start: why.
    Failed(String),
}

/// How one VM is started.
pub struct Starter {
    pub index: usize,
    pub command: Command,
    /// The API socket to drive, for a VMM that speaks the API.
    pub api: Option<(PathBuf, String)>,
}

/// The way `vmm` starts an idle VM: the API for exitless and Cloud Hypervisor, else its
/// command line (Firecracker's config file is written into `workdir` once, here).
pub fn starter(
    vmm: &Vmm,
    index: usize,
    (guest, memory_mib): (&Path, u64),
    workdir: &Path,
) -> Result<Starter, String> {
    if speaks_api(vmm.kind) {
        let socket = workdir.join(format!("density-{}-{index}.sock", vmm.kind.name()));
        let _ = std::fs::remove_file(&socket);
        let mut command = Command::new(&vmm.path);
        command.arg("--api-socket").arg(&socket);
        let body = vm_create_body(guest, memory_mib, IDLE_CMDLINE);
        return Ok(Starter {
            index,
            command,
            api: Some((socket, body)),
        });
    }
    let exits = ExitsSource::Unavailable("not read");
    let launch = Launch::bare(guest, IDLE_CMDLINE, memory_mib, workdir, &exits);
    let command = vmm.command(&launch).map_err(|e| e.to_string())?;
    Ok(Starter {
        index,
        command,
        api: None,
    })
}

impl Starter {
    /// Spawns the VMM (its `Child` goes to `put`, so that the run can kill it whatever
    /// happens here), boots the VM and reads its console until the guest is idle, telling
    /// `events`; then reads on to the end of the console, so that the VMM never blocks on it.
    pub fn run(
        mut self,
        stderr: std::fs::File,
        put: impl FnOnce(Child),
        events: &Sender<(usize, Event)>,
    ) {
        let tell = |e| {
            let _ = events.send((self.index, e));
        };
        self.command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        // Before the spawn: on a busy host this thread may get its CPU back only once the
        // child has run for a while.
        let at = Instant::now();
        let mut child = match self.command.spawn() {
            Ok(c) => c,
            Err(e) => return tell(Event::Failed(format!("cannot start: {e}"))),
        };
        tell(Event::Spawned(at));
        let pid = child.id();
        let stdout = child.stdout.take();
        put(child);
        let Some(stdout) = stdout else {
            return tell(Event::Failed("no console".into()));
        };
        if let Some((socket, body)) = &self.api {
            if let Err(why) = boot_through_api(socket, body) {
                return tell(Event::Failed(why));
            }
        }
        read_console(stdout, pid, &tell);
    }
}

/// `vmm.ping` until it answers, then `vm.create` and `vm.boot`.
fn boot_through_api(socket: &Path, body: &str) -> Result<(), String> {
    let started = Instant::now();
    let mut client = loop {
        let ready = ApiClient::connect(socket, API_LIMIT)
            .ok()
            .and_then(|mut c| {
                (c.request("GET", "vmm.ping", None).ok()?.status == 200).then_some(c)
            });
        if let Some(c) = ready {
            break c;
        }
        if started.elapsed() > API_LIMIT {
            return Err("vmm.ping never answered".into());
        }
        std::thread::sleep(PING_EVERY);
    };
    for (endpoint, body) in [("vm.create", Some(body)), ("vm.boot", None)] {
        let reply = client
            .request("PUT", endpoint, body)
            .map_err(|e| format!("{endpoint}: {e}"))?;
        if !(200..300).contains(&reply.status) {
            return Err(format!(
                "{endpoint}: {} {}",
                reply.status,
                reply.body.trim()
            ));
        }
    }
    Ok(())
}

fn read_console(stdout: ChildStdout, pid: u32, tell: &dyn Fn(Event)) {
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let (mut first, mut idle) = (true, false);
    for line in lines.by_ref() {
        if first {
            tell(Event::FirstLine(Instant::now()));
            if let Some(cpu) = super::threads::process_cpu(pid) {
                tell(Event::StartCpu(cpu));
            }
            first = false;
        }
        if line.trim_end() == "EXITLESS DONE" {
            tell(Event::Idle);
            idle = true;
            break;
        }
        if line.starts_with("EXITLESS ERROR") {
            return tell(Event::Failed(format!("the guest said: {line}")));
        }
    }
    if !idle {
        return tell(Event::Failed(
            "the VMM ended before its guest was idle".into(),
        ));
    }
    lines.for_each(drop);
}
