//! `exitless --api-socket` started as Kata starts it, for the API tests.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use exitless_control::api::client::{ApiClient, Reply};
use serde_json::Value;

use super::Stream;

/// A running `exitless --api-socket`, killed if the test ends early.
pub struct Vmm {
    pub child: Child,
    pub socket: PathBuf,
    pub stderr: Stream,
}

impl Vmm {
    pub fn start(tag: &str) -> Vmm {
        Self::start_build(&super::exitless_path(), tag)
    }

    /// [`Vmm::start`] with build `bin`.
    pub fn start_build(bin: &std::path::Path, tag: &str) -> Vmm {
        Self::start_with_stdout(bin, tag, Stdio::null())
    }

    /// [`Vmm::start_build`] with the VMM's stdout (where a `Tty` console goes) as given.
    pub fn start_with_stdout(bin: &std::path::Path, tag: &str, stdout: Stdio) -> Vmm {
        Self::start_with_args(bin, tag, stdout, &[])
    }

    /// [`Vmm::start_with_stdout`] with more options on the command line (`--dirty-log ring`).
    pub fn start_with_args(bin: &std::path::Path, tag: &str, stdout: Stdio, args: &[&str]) -> Vmm {
        let socket =
            std::env::temp_dir().join(format!("exitless-api-{tag}-{}.sock", std::process::id()));
        let mut child = std::process::Command::new(bin)
            .args(args)
            .args(["-v", "--api-socket"])
            .arg(&socket)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Stream::spawn(child.stderr.take().unwrap());
        let vmm = Vmm {
            child,
            socket,
            stderr,
        };
        // As Kata does: ping every 10 ms until it answers.
        let start = Instant::now();
        while vmm.try_client().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no answer on the API socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        vmm
    }

    pub fn try_client(&self) -> Option<ApiClient> {
        let mut c = ApiClient::connect(&self.socket, Duration::from_secs(30)).ok()?;
        (c.request("GET", "vmm.ping", None).ok()?.status == 200).then_some(c)
    }

    pub fn client(&self) -> ApiClient {
        self.try_client().expect("the API answers")
    }

    /// `vm.create` with `body`, then `vm.boot`, each answered with success.
    pub fn create_and_boot(&self, body: &Value) {
        let mut c = self.client();
        let created = c.request("PUT", "vm.create", Some(&body.to_string()));
        ok(created.expect("vm.create answered"), "vm.create");
        ok(
            c.request("PUT", "vm.boot", None).expect("vm.boot answered"),
            "vm.boot",
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open file descriptors of the VMM process.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// Thread names of the VMM process.
    pub fn threads(&self) -> Vec<String> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return Vec::new();
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|c| c.trim().to_string())
            .collect()
    }

    /// Waits up to `limit` for the process to end; its exit status then.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn kvm_or_skip(test: &str) -> bool {
    if std::fs::metadata("/dev/kvm").is_err() {
        vmm::test_skip::skip(test, "/dev/kvm is missing on this host");
        return false;
    }
    true
}

pub fn ok(r: Reply, what: &str) -> Reply {
    assert!(
        r.status == 200 || r.status == 204,
        "{what}: {} {}",
        r.status,
        r.body
    );
    r
}

pub fn json(r: &Reply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

/// The `vm.create` body of a bench-guest VM running `cmdline`, its serial console in the
/// file `serial`: one vCPU and 256 MiB unless `extra` says otherwise (its top-level fields
/// replace the defaults': `cpus`, `memory`, `disks`...).
pub fn bench_vm_body(
    kernel: &std::path::Path,
    cmdline: &str,
    serial: &std::path::Path,
    extra: Value,
) -> Value {
    let mut body = serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 256u64 << 20},
        "payload": {"kernel": kernel, "cmdline": cmdline},
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}
