//! One migration of the `migrate` case (migrate.rs) with each VMM, driven as its users drive
//! it: exitless and Cloud Hypervisor through Cloud Hypervisor's API (`vm.create`,
//! `vm.boot`, `vm.receive-migration` on the destination, `vm.send-migration` on the source),
//! QEMU through QMP (`-incoming unix:PATH` on the destination; `migrate-set-parameters`
//! lifting `max-bandwidth`, `migrate`, `query-migrate` on the source).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use super::api_start::vm_create_body;
use super::migrate::{guest_result, same_tsc, GuestSeen, MigrateRound, Setting, Way, WARM};
use super::peer::Vmm;
use super::snapshot::{connect, one_line};
use super::vmm_kind::VmmKind;
use exitless_control::api::client::ApiClient;

/// The guest's line once its loop runs, and its result line.
const LOOP_LINE: &str = "EXITLESS MIGRATE loop";
const RESULT_LINE: &str = "EXITLESS RESULT case=migrate";
const DONE_LINE: &str = "EXITLESS DONE";
/// QEMU's `max-bandwidth` lifted (bytes/s): no cap in practice.
const NO_CAP: u64 = 1 << 40;

/// One migration of the guest writing `rate` MiB/s with `vmm`, over `way`.
pub fn once(vmm: &Vmm, s: &Setting, way: Way, rate: u64) -> Result<MigrateRound, String> {
    let _ = std::fs::remove_dir_all(&s.dir);
    std::fs::create_dir_all(&s.dir).map_err(|e| format!("cannot make {}: {e}", s.dir.display()))?;
    let measured = match vmm.kind {
        VmmKind::Qemu => qemu(vmm, s, rate),
        _ => api(vmm, s, way, rate),
    };
    let _ = std::fs::remove_dir_all(&s.dir);
    measured
}

/// A VMM process with its console's lines read on a thread of its own; killed when dropped.
struct Proc {
    child: Child,
    lines: Receiver<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Starts `cmd`, its stderr to `log`.
    fn spawn(cmd: &mut Command, log: &Path) -> Result<Self, String> {
        let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
        let stdout = child.stdout.take().ok_or("the VMM has no stdout")?;
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Proc { child, lines })
    }

    /// The next console line starting with `prefix` within `limit`.
    fn line(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(l) if l.starts_with("EXITLESS ERROR") || l.starts_with("EXITLESS SKIP") => {
                    return Err(format!("the guest said: {l}"))
                }
                Ok(_) => continue,
                Err(_) => {
                    let status = match self.child.try_wait() {
                        Ok(Some(s)) => format!("the VMM ended ({s})"),
                        _ => format!("not within {limit:?}"),
                    };
                    return Err(format!("no \"{prefix}\" line: {status}"));
                }
            }
        }
    }

    /// Whether the process ends within `limit`.
    fn ends_within(&mut self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

/// The host's TSC around a migration, and whether the guest's TSC is the host's.
struct Window {
    same_tsc: bool,
    from: u64,
    to: u64,
}

impl Window {
    /// Once the guest's loop line came on the source's console.
    fn after_loop_line(src: &mut Proc, s: &Setting) -> Result<Self, String> {
        let line = src.line(LOOP_LINE, s.limit)?;
        let same_tsc = same_tsc(&line, vmm::profile::rdtsc(), s.tsc_khz);
        Ok(Window {
            same_tsc,
            from: 0,
            to: 0,
        })
    }

    fn open(&mut self) {
        self.from = vmm::profile::rdtsc();
    }

    fn close(&mut self) {
        self.to = vmm::profile::rdtsc();
    }
}

/// The guest's result and done lines on the destination.
fn destination_result(dst: &mut Proc, s: &Setting, w: &Window) -> Result<GuestSeen, String> {
    let line = dst.line(RESULT_LINE, s.limit)?;
    let window = w.same_tsc.then_some((w.from, w.to));
    let result = guest_result(&line, s.tsc_khz, window)?;
    dst.line(DONE_LINE, s.limit)?;
    Ok(result)
}

// ---- exitless and Cloud Hypervisor: Cloud Hypervisor's API ----

fn api_process(vmm: &Vmm, s: &Setting, name: &str) -> Result<(Proc, ApiClient), String> {
    let socket = s.dir.join(format!("{name}.sock"));
    let mut cmd = Command::new(&vmm.path);
    match vmm.kind {
        VmmKind::CloudHypervisor => {
            cmd.arg("--api-socket")
                .arg(format!("path={}", socket.display()));
        }
        _ => {
            cmd.arg("-v").arg("--api-socket").arg(&socket);
        }
    }
    let mut p = Proc::spawn(&mut cmd, &s.dir.join(format!("{name}.log")))?;
    let client = connect(&socket, &mut p.child)?;
    Ok((p, client))
}

fn put(c: &mut ApiClient, what: &str, body: Option<String>) -> Result<(), String> {
    let reply = c
        .request_path("PUT", &format!("/api/v1/{what}"), body.as_deref())
        .map_err(|e| format!("{what}: {e}"))?;
    match (200..300).contains(&reply.status) {
        true => Ok(()),
        false => Err(format!(
            "{what}: {} {}",
            reply.status,
            one_line(&reply.body)
        )),
    }
}

fn api(vmm: &Vmm, s: &Setting, way: Way, rate: u64) -> Result<MigrateRound, String> {
    let (mut src, mut client) = api_process(vmm, s, "src")?;
    let (mut dst, dst_client) = api_process(vmm, s, "dst")?;
    let mut body: serde_json::Value =
        serde_json::from_str(&vm_create_body(s.guest, s.memory_mib, &s.cmdline(rate)))
            .map_err(|e| e.to_string())?;
    if way == Way::Local {
        body["memory"]["shared"] = true.into();
    }
    put(&mut client, "vm.create", Some(body.to_string()))?;
    put(&mut client, "vm.boot", None)?;
    let mut window = Window::after_loop_line(&mut src, s)?;
    std::thread::sleep(WARM);
    let url = format!("unix:{}", s.dir.join("m.sock").display());
    let receive = serde_json::json!({ "receiver_url": url }).to_string();
    let receiver = std::thread::spawn(move || {
        let mut c = dst_client;
        put(&mut c, "vm.receive-migration", Some(receive))
    });
    let listening = s.dir.join("m.sock");
    let start = Instant::now();
    while !listening.exists() && start.elapsed() < s.limit {
        std::thread::sleep(Duration::from_millis(1));
    }
    let send = serde_json::json!({ "destination_url": url, "local": way == Way::Local });
    let start = Instant::now();
    window.open();
    let sent = put(&mut client, "vm.send-migration", Some(send.to_string()));
    window.close();
    let client_ms = start.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = sent {
        // The destination may wait for a source that is gone: ending it ends its request.
        drop(dst);
        let _ = receiver.join();
        let status = match src.child.try_wait() {
            Ok(Some(st)) => format!(" (the source ended: {st})"),
            _ => String::new(),
        };
        return Err(format!("{e}{status}"));
    }
    receiver
        .join()
        .map_err(|_| "the receiving request's thread panicked".to_string())??;
    let source_ended = src.ends_within(s.limit);
    let seen = destination_result(&mut dst, s, &window)?;
    let log = std::fs::read_to_string(s.dir.join("src.log")).unwrap_or_default();
    let (total_ms, downtime_ms, sent_mib, passes) = exitless_summary(&log)
        .ok_or_else(|| format!("the source logged no summary: {}", one_line(&log)))?;
    Ok(MigrateRound {
        guest_downtime_ms: seen.downtime_ms,
        in_window: seen.in_window,
        guest_gap_from_start_ms: seen.from_start_ms,
        guest_noise_ms: seen.noise_ms,
        total_ms,
        reported_downtime_ms: Some(downtime_ms),
        client_ms,
        sent_mib,
        passes: Some(passes),
        written_mib: seen.written_mib,
        done_line: true,
        source_ended,
        steps: log
            .lines()
            .find_map(|l| l.split_once("steps: "))
            .map(|(_, steps)| steps.to_string()),
    })
}

/// exitless's `-v` line: "complete in T ms, downtime D ms, M MiB of memory in P passes".
fn exitless_summary(log: &str) -> Option<(f64, f64, f64, u64)> {
    let line = log.lines().find(|l| l.contains("complete in "))?;
    let after = |key: &str| -> Option<&str> { line.split(key).nth(1)?.split_whitespace().next() };
    Some((
        after("complete in ")?.parse().ok()?,
        after("downtime ")?.parse().ok()?,
        line.split(" MiB of memory")
            .next()?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()?,
        after("memory in ")?.parse().ok()?,
    ))
}

// ---- QEMU: QMP ----

/// A QMP connection, capabilities negotiated.
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(path: &Path, limit: Duration) -> Result<Self, String> {
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if start.elapsed() > limit => return Err(format!("QMP: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let qmp = |e: std::io::Error| format!("QMP: {e}");
        stream.set_read_timeout(Some(limit)).map_err(qmp)?;
        let mut q = Qmp {
            reader: BufReader::new(stream.try_clone().map_err(qmp)?),
            writer: stream,
        };
        q.reply()?;
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    /// The next reply that is not an event.
    fn reply(&mut self) -> Result<serde_json::Value, String> {
        loop {
            let mut line = String::new();
            self.reader
                .read_line(&mut line)
                .map_err(|e| format!("QMP: {e}"))?;
            let v: serde_json::Value =
                serde_json::from_str(&line).map_err(|e| format!("QMP reply {line:?}: {e}"))?;
            if v.get("event").is_none() {
                return Ok(v);
            }
        }
    }

    fn execute(
        &mut self,
        command: &str,
        arguments: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, String> {
        let mut msg = serde_json::json!({ "execute": command });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        writeln!(self.writer, "{msg}").map_err(|e| format!("QMP: {e}"))?;
        let r = self.reply()?;
        match r.get("error") {
            Some(e) => Err(format!("QMP {command}: {e}")),
            None => Ok(r["return"].clone()),
        }
    }
}

fn qemu_process(
    vmm: &Vmm,
    s: &Setting,
    name: &str,
    cmdline: &str,
) -> Result<(Proc, PathBuf), String> {
    let qmp = s.dir.join(format!("{name}-qmp.sock"));
    let mem = s.memory_mib.to_string();
    let mut cmd = Command::new(&vmm.path);
    cmd.args(["-accel", "kvm", "-M", "microvm", "-m", &mem, "-smp", "1"])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-kernel"])
        .arg(s.guest)
        .args(["-append", cmdline])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4", "-qmp"])
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    if name == "dst" {
        cmd.arg("-incoming")
            .arg(format!("unix:{}", s.dir.join("m.sock").display()));
    }
    Ok((
        Proc::spawn(&mut cmd, &s.dir.join(format!("{name}.log")))?,
        qmp,
    ))
}

fn qemu(vmm: &Vmm, s: &Setting, rate: u64) -> Result<MigrateRound, String> {
    let cmdline = s.cmdline(rate);
    let (mut src, src_qmp) = qemu_process(vmm, s, "src", &cmdline)?;
    let (mut dst, dst_qmp) = qemu_process(vmm, s, "dst", &cmdline)?;
    let mut q = Qmp::connect(&src_qmp, s.limit)?;
    // The destination listens once its QMP answers.
    drop(Qmp::connect(&dst_qmp, s.limit)?);
    let mut window = Window::after_loop_line(&mut src, s)?;
    q.execute(
        "migrate-set-parameters",
        Some(serde_json::json!({ "max-bandwidth": NO_CAP })),
    )?;
    std::thread::sleep(WARM);
    let uri = format!("unix:{}", s.dir.join("m.sock").display());
    let start = Instant::now();
    window.open();
    q.execute("migrate", Some(serde_json::json!({ "uri": uri })))?;
    let info = loop {
        let info = q.execute("query-migrate", None)?;
        match info["status"].as_str() {
            Some("completed") => break info,
            Some("failed") | Some("cancelled") => {
                return Err(format!("migrate: {}", info["error-desc"]))
            }
            _ if start.elapsed() > s.limit => return Err("migrate: not completed in time".into()),
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    window.close();
    let client_ms = start.elapsed().as_secs_f64() * 1e3;
    let status = q.execute("query-status", None)?;
    let seen = destination_result(&mut dst, s, &window)?;
    let ms = |key: &str| info[key].as_f64();
    Ok(MigrateRound {
        guest_downtime_ms: seen.downtime_ms,
        in_window: seen.in_window,
        guest_gap_from_start_ms: seen.from_start_ms,
        guest_noise_ms: seen.noise_ms,
        total_ms: ms("total-time").ok_or("query-migrate: no total-time")?,
        reported_downtime_ms: ms("downtime"),
        client_ms,
        sent_mib: info["ram"]["transferred"].as_f64().unwrap_or(0.0) / f64::from(1 << 20),
        passes: info["ram"]["dirty-sync-count"].as_u64(),
        written_mib: seen.written_mib,
        done_line: true,
        source_ended: status["status"] == "postmigrate",
        steps: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exitless_s_summary_line_gives_its_figures() {
        let log = "exitless: something\nexitless: vm.send-migration: complete in 206.3 ms, \
                   downtime 19.4 ms, 82 MiB of memory in 2 passes (last 512 kB)\n";
        assert_eq!(exitless_summary(log), Some((206.3, 19.4, 82.0, 2)));
        assert_eq!(exitless_summary("exitless: no"), None);
    }
}
