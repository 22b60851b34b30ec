//! Start-up through the API, as Kata Containers starts a VMM: the process with
//! `--api-socket`, `vmm.ping` until it answers, `vm.create` and `vm.boot`, then the guest's
//! first serial line. Run for exitless and for Cloud Hypervisor, which speak the same API,
//! and for the floor VMM, which has no API: spawned with the guest, its first line is the
//! limit every start is a ratio to.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::console_watch;
use super::peer::Vmm;
use super::vmm_kind::VmmKind;
use exitless_control::api::client::ApiClient;

/// One start, in milliseconds from the process's spawn (requests in microseconds; none for
/// the floor VMM).
#[derive(Clone, Debug, Serialize)]
pub struct ApiStart {
    /// Until `vmm.ping` first answered.
    pub ready_ms: Option<f64>,
    /// How long `vm.create` and `vm.boot` took to answer.
    pub create_us: Option<f64>,
    pub boot_us: Option<f64>,
    /// Until the guest's first serial line reached the VMM's stdout.
    pub first_line_ms: f64,
}

/// The guest's command line: one iteration, then it holds.
const CMDLINE: &str = "case=pio_out iters=1 hold";

/// Whether this VMM speaks the API.
pub fn speaks_api(kind: VmmKind) -> bool {
    matches!(kind, VmmKind::Exitless | VmmKind::CloudHypervisor)
}

/// Whether `compare --api` runs this VMM: those that speak the API, and the floor.
pub fn in_api_comparison(kind: VmmKind) -> bool {
    speaks_api(kind) || kind == VmmKind::Floor
}

/// The `vm.create` body: the guest with `cmdline`, 1 vCPU, `memory_mib`, serial on stdout.
pub fn vm_create_body(guest: &Path, memory_mib: u64, cmdline: &str) -> String {
    serde_json::json!({
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": memory_mib << 20},
        "payload": {"kernel": guest, "cmdline": cmdline},
        "serial": {"mode": "Tty"},
        "console": {"mode": "Off"},
    })
    .to_string()
}

/// One start of `vmm` booting `guest` (the floor: spawned with it); the process is killed
/// afterwards.
pub fn measure(
    vmm: &Vmm,
    guest: &Path,
    workdir: &Path,
    memory_mib: u64,
) -> Result<ApiStart, String> {
    let socket = workdir.join(format!("{}-api.sock", vmm.kind.name()));
    let _ = std::fs::remove_file(&socket);
    let floor = vmm.kind == VmmKind::Floor;
    let mut cmd = Command::new(&vmm.path);
    if floor {
        cmd.arg(guest).arg(CMDLINE).arg(memory_mib.to_string());
    } else {
        cmd.arg("--api-socket").arg(&socket);
    }
    let start = Instant::now();
    let (mut child, first) = console_watch::spawn(&mut cmd, &vmm.path, "EXITLESS")?;
    let started = match floor {
        true => Ok(ApiStart {
            ready_ms: None,
            create_us: None,
            boot_us: None,
            first_line_ms: 0.0,
        }),
        false => drive(&socket, start, guest, memory_mib),
    };
    let result = started.and_then(|mut s| {
        let at = first
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "no serial line within 30 s".to_string())?;
        s.first_line_ms = ms(at - start);
        Ok(s)
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&socket);
    result
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Ping until ready, then create and boot; the first line is filled in by the caller.
fn drive(socket: &Path, start: Instant, guest: &Path, memory_mib: u64) -> Result<ApiStart, String> {
    let mut client = loop {
        let ready = ApiClient::connect(socket, Duration::from_secs(10))
            .ok()
            .and_then(|mut c| {
                (c.request("GET", "vmm.ping", None).ok()?.status == 200).then_some(c)
            });
        if let Some(c) = ready {
            break c;
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err("vmm.ping never answered".into());
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let ready_ms = ms(start.elapsed());
    let timed = |c: &mut ApiClient, endpoint: &str, body: Option<&str>| {
        let t = Instant::now();
        let r = c
            .request("PUT", endpoint, body)
            .map_err(|e| format!("{endpoint}: {e}"))?;
        if !(200..300).contains(&r.status) {
            return Err(format!("{endpoint}: {} {}", r.status, r.body.trim()));
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    let body = vm_create_body(guest, memory_mib, CMDLINE);
    let create_us = timed(&mut client, "vm.create", Some(&body))?;
    let boot_us = timed(&mut client, "vm.boot", None)?;
    Ok(ApiStart {
        ready_ms: Some(ready_ms),
        create_us: Some(create_us),
        boot_us: Some(boot_us),
        first_line_ms: 0.0,
    })
}
