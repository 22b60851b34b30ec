//! `exitless remote`: a client for people (like Cloud Hypervisor's `ch-remote`) of a VMM
//! started with `--api-socket`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use exitless_control::api::client::ApiClient;

use crate::remote_migration;
use vmm::config::{BalloonConfig, DiskConfig, MemorySize, NetConfig, VsockConfig};

/// Options of `exitless remote`.
#[derive(Args)]
#[command(after_help = "Examples:\n  \
exitless remote --api-socket /tmp/x.sock create vm.json   # a Cloud Hypervisor VmConfig body\n  \
exitless remote --api-socket /tmp/x.sock boot\n  \
exitless remote --api-socket /tmp/x.sock add-disk path=/tmp/d.img,readonly=on\n  \
exitless remote --api-socket /tmp/x.sock resize --cpus 2\n  \
exitless remote --api-socket /tmp/x.sock resize --balloon 256M   # ask the guest for 256 MiB back\n  \
exitless remote --api-socket /tmp/x.sock resize --memory 1G   # needs memory.hotplug_size\n  \
exitless remote --api-socket /tmp/x.sock profile          # where the VM's exit cycles go\n  \
exitless remote --api-socket /tmp/x.sock pause && exitless remote --api-socket /tmp/x.sock snapshot /tmp/snap\n  \
exitless remote --api-socket /tmp/y.sock restore /tmp/snap   # in a fresh exitless --api-socket\n\n\
Live migration (docs/migration.md), ch-remote's arguments; each waits until the migration ends:\n  \
exitless remote --api-socket /tmp/dst.sock receive-migration receiver_url=unix:/tmp/m.sock &   # a fresh VMM\n  \
exitless remote --api-socket /tmp/src.sock send-migration destination_url=unix:/tmp/m.sock\n  \
exitless remote --api-socket /tmp/src.sock send-migration destination_url=unix:/tmp/m.sock,local=on   # shared memory\n\n\
Each command is one request; a refused one prints its status and why, and exits with 1.")]
pub struct RemoteArgs {
    /// The socket `exitless --api-socket` (or Cloud Hypervisor) serves
    #[arg(long, value_name = "PATH")]
    api_socket: PathBuf,
    /// Longest wait for an answer, in seconds [default: 30; send-migration and
    /// receive-migration: no limit, they are answered when the migration ends]
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    #[command(subcommand)]
    command: RemoteCommand,
}

#[derive(Subcommand)]
enum RemoteCommand {
    /// Is the VMM there? (vmm.ping)
    Ping,
    /// The VM's config as applied, its state and memory (vm.info)
    Info,
    /// Create the VM from a JSON file holding a Cloud Hypervisor VmConfig (vm.create)
    Create {
        /// The VmConfig: a JSON file (docs/api.md has one)
        file: PathBuf,
    },
    /// Boot the created VM (vm.boot)
    Boot,
    /// Pause the vCPUs (vm.pause)
    Pause,
    /// Resume paused vCPUs (vm.resume)
    Resume,
    /// Stop the VM; it can be booted again (vm.shutdown)
    Shutdown,
    /// Stop and boot the VM again (vm.reboot)
    Reboot,
    /// Stop the VM and forget it (vm.delete)
    Delete,
    /// End the VMM process (vmm.shutdown)
    ShutdownVmm,
    /// Add a disk: path=FILE[,readonly=on][,direct=on][,lock=off] or vhost_user=on,socket=PATH
    /// (a vhost-user-blk back end), then [,id=ID] (vm.add-disk)
    AddDisk {
        /// path=FILE[,readonly=on][,direct=on][,lock=off][,id=ID], as run --disk takes it
        /// (lock=off: no lock against a second writer)
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Add a network card on a host tap: tap=NAME[,mac=MAC][,id=ID] (vm.add-net)
    AddNet {
        /// tap=NAME[,mac=MAC][,id=ID]: an existing tap device, as run --net takes it
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Add the vsock device: cid=N,socket=PATH[,id=ID] (vm.add-vsock)
    AddVsock {
        /// cid=N,socket=PATH[,id=ID]: the guest's CID and the host's Unix socket
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Add a virtio-fs device on a vhost-user back end: tag=TAG,socket=PATH[,num_queues=N]
    /// [,queue_size=Q][,id=ID] (vm.add-fs; the VM's memory must be shared)
    AddFs {
        /// tag=TAG,socket=PATH[,num_queues=N][,queue_size=Q][,id=ID]: the tag the guest
        /// mounts and the back end's (virtiofsd's) socket
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Remove a device by its id (vm.remove-device)
    RemoveDevice {
        /// The id add-* answered with, or the one vm.info shows (e.g. _disk0)
        id: String,
    },
    /// Change the number of vCPUs, grow the guest's memory, or set the balloon's target
    /// (vm.resize)
    Resize {
        /// vCPUs to have: more are hot-added, extra ones removed (ACPI CPU hotplug, up to
        /// cpus.max_vcpus of the VM's config)
        #[arg(long, value_name = "N")]
        cpus: Option<u8>,
        /// Guest RAM to grow to, e.g. 1G (ACPI memory hotplug, up to memory.size +
        /// memory.hotplug_size)
        #[arg(long, value_name = "SIZE")]
        memory: Option<MemorySize>,
        /// Memory the guest is asked to put in its balloon: 0, or a size as --memory takes it
        #[arg(long, value_name = "SIZE")]
        balloon: Option<String>,
    },
    /// Write the paused VM to directory DIR: config.json, state.json, guest-ram
    /// (vm.snapshot)
    Snapshot {
        /// An existing directory the VMM writes the snapshot into
        dir: PathBuf,
    },
    /// Make the VM saved in DIR, in a VMM that has none; it is Paused afterwards unless
    /// --resume (vm.restore)
    Restore {
        /// A directory `snapshot` wrote
        dir: PathBuf,
        /// Run the restored VM at once (vm.resume after vm.restore)
        #[arg(long)]
        resume: bool,
    },
    /// Press the ACPI power button: the guest powers off (vm.power-button)
    PowerButton,
    /// Send an NMI to every vCPU (vm.nmi)
    Nmi,
    /// Grow a disk's image while the guest runs; the guest is told (vm.resize-disk)
    ResizeDisk {
        /// The disk's id (e.g. _disk0)
        #[arg(long, value_name = "ID")]
        disk: String,
        /// Its new size, e.g. 2G (a multiple of 4K; smaller than now is refused)
        #[arg(long, value_name = "SIZE")]
        size: MemorySize,
    },
    /// Grow a memory zone that has a hotplug_size (vm.resize-zone)
    ResizeZone {
        /// The zone's id
        #[arg(long, value_name = "ID")]
        id: String,
        /// Its new size, e.g. 1G (ACPI memory hotplug, up to its size + hotplug_size)
        #[arg(long, value_name = "SIZE")]
        size: MemorySize,
    },
    /// Write the paused VM as an ELF core to FILE, for gdb (vm.coredump)
    Coredump {
        /// The core file (created or replaced)
        file: PathBuf,
    },
    /// Per-device counters (vm.counters)
    Counters,
    /// The running VM's exit profile (vm.profile, exitless's own)
    Profile,
    /// Wait for a VM sent by live migration, in a VMM with no VM (vm.receive-migration):
    /// receiver_url=unix:PATH or receiver_url=tcp:HOST:PORT (or the URL alone); answered
    /// once the VM runs here
    ReceiveMigration {
        /// receiver_url=unix:PATH | receiver_url=tcp:HOST:PORT: where to listen for the
        /// source (one connection)
        #[arg(value_name = "SPEC")]
        spec: String,
    },
    /// Move the VM to a VMM waiting in receive-migration (vm.send-migration):
    /// destination_url=URL[,local=on][,downtime_ms=N][,timeout_s=N]
    /// [,timeout_strategy=cancel|ignore]; once the destination runs it, this VMM ends
    SendMigration {
        /// destination_url=unix:PATH|tcp:HOST:PORT; local=on hands shared memory over as
        /// fds (unix: only); downtime_ms (default 300) is the pause aimed for; past
        /// timeout_s (default 3600) cancel gives up (the VM goes on here) or ignore pauses
        /// anyway
        #[arg(value_name = "SPEC")]
        spec: String,
    },
}

/// `key=value,...` into pairs, with `id=` taken out.
fn split_id(spec: &str) -> (String, Option<String>) {
    let mut id = None;
    let rest: Vec<&str> = spec
        .split(',')
        .filter(|part| match part.strip_prefix("id=") {
            Some(v) => {
                id = Some(v.to_string());
                false
            }
            None => true,
        })
        .collect();
    (rest.join(","), id)
}

/// The disk body: `direct=on` is the API's, the rest as `--disk` takes it.
fn disk_body(spec: &str) -> anyhow::Result<String> {
    let (spec, id) = split_id(spec);
    let direct = spec
        .split(',')
        .any(|p| p == "direct=on" || p == "direct=true");
    let spec: Vec<&str> = spec
        .split(',')
        .filter(|p| !p.starts_with("direct="))
        .collect();
    let disk: DiskConfig = spec.join(",").parse()?;
    if let (true, Some(socket)) = (disk.vhost_user, &disk.vhost_socket) {
        let body = serde_json::json!({"vhost_user": true, "vhost_socket": socket, "id": id});
        return Ok(body.to_string());
    }
    Ok(serde_json::json!({"path": disk.path, "readonly": disk.readonly, "direct": direct, "id": id}).to_string())
}

fn net_body(spec: &str) -> anyhow::Result<String> {
    let (spec, id) = split_id(spec);
    let net: NetConfig = spec.parse()?;
    let mac = net.mac.map(|m| m.to_string());
    Ok(serde_json::json!({"tap": net.tap, "mac": mac, "id": id}).to_string())
}

fn fs_body(spec: &str) -> anyhow::Result<String> {
    let (spec, id) = split_id(spec);
    let f: vmm::config::FsConfig = spec.parse()?;
    Ok(
        serde_json::json!({"tag": f.tag, "socket": f.socket, "num_queues": f.num_queues,
        "queue_size": f.queue_size, "id": id})
        .to_string(),
    )
}

fn vsock_body(spec: &str) -> anyhow::Result<String> {
    let (spec, id) = split_id(spec);
    let v: VsockConfig = spec.parse()?;
    Ok(serde_json::json!({"cid": v.cid, "socket": v.socket, "id": id}).to_string())
}

/// `file://` and `dir` made absolute (the VMM may run elsewhere).
fn file_url(dir: &std::path::Path) -> anyhow::Result<String> {
    let abs = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
    Ok(format!("file://{}", abs.display()))
}

/// The request for a command: method, endpoint, body.
fn request(
    command: &RemoteCommand,
) -> anyhow::Result<(&'static str, &'static str, Option<String>)> {
    let (method, endpoint) = endpoint(command);
    Ok((method, endpoint, body(command)?))
}

/// The method and endpoint of a command.
fn endpoint(command: &RemoteCommand) -> (&'static str, &'static str) {
    use RemoteCommand as C;
    let put = |endpoint| ("PUT", endpoint);
    match command {
        C::Ping => ("GET", "vmm.ping"),
        C::Info => ("GET", "vm.info"),
        C::Counters => ("GET", "vm.counters"),
        C::Profile => ("GET", "vm.profile"),
        C::Create { .. } => put("vm.create"),
        C::Boot => put("vm.boot"),
        C::Pause => put("vm.pause"),
        C::Resume => put("vm.resume"),
        C::Shutdown => put("vm.shutdown"),
        C::Reboot => put("vm.reboot"),
        C::Delete => put("vm.delete"),
        C::ShutdownVmm => put("vmm.shutdown"),
        C::AddDisk { .. } => put("vm.add-disk"),
        C::AddNet { .. } => put("vm.add-net"),
        C::AddVsock { .. } => put("vm.add-vsock"),
        C::AddFs { .. } => put("vm.add-fs"),
        C::RemoveDevice { .. } => put("vm.remove-device"),
        C::PowerButton => put("vm.power-button"),
        C::Nmi => put("vm.nmi"),
        C::ResizeDisk { .. } => put("vm.resize-disk"),
        C::ResizeZone { .. } => put("vm.resize-zone"),
        C::Coredump { .. } => put("vm.coredump"),
        C::Snapshot { .. } => put("vm.snapshot"),
        C::SendMigration { .. } => put("vm.send-migration"),
        C::ReceiveMigration { .. } => put("vm.receive-migration"),
        C::Restore { .. } => put("vm.restore"),
        C::Resize { .. } => put("vm.resize"),
    }
}

/// The body a command sends, if any.
fn body(command: &RemoteCommand) -> anyhow::Result<Option<String>> {
    use RemoteCommand as C;
    let json = |v: serde_json::Value| v.to_string();
    Ok(Some(match command {
        C::Create { file } => std::fs::read_to_string(file)
            .with_context(|| format!("Cannot read {}", file.display()))?,
        C::AddDisk { spec } => disk_body(spec)?,
        C::AddNet { spec } => net_body(spec)?,
        C::AddVsock { spec } => vsock_body(spec)?,
        C::AddFs { spec } => fs_body(spec)?,
        C::RemoveDevice { id } => json(serde_json::json!({ "id": id })),
        C::ResizeDisk { disk, size } => {
            json(serde_json::json!({ "id": disk, "desired_size": size.bytes() }))
        }
        C::ResizeZone { id, size } => {
            json(serde_json::json!({ "id": id, "desired_ram": size.bytes() }))
        }
        C::Coredump { file: dir } | C::Snapshot { dir } => {
            json(serde_json::json!({ "destination_url": file_url(dir)? }))
        }
        C::SendMigration { spec } => remote_migration::send_body(spec)?,
        C::ReceiveMigration { spec } => remote_migration::receive_body(spec)?,
        C::Restore { dir, resume } => {
            json(serde_json::json!({ "source_url": file_url(dir)?, "resume": resume }))
        }
        C::Resize {
            cpus,
            memory,
            balloon,
        } => resize_body(*cpus, *memory, balloon.as_deref())?,
        _ => return Ok(None),
    }))
}

/// `vm.resize`'s body: what is given of vCPUs, memory and the balloon.
fn resize_body(
    cpus: Option<u8>,
    memory: Option<MemorySize>,
    balloon: Option<&str>,
) -> anyhow::Result<String> {
    if cpus.is_none() && memory.is_none() && balloon.is_none() {
        anyhow::bail!("resize needs --cpus N, --memory SIZE or --balloon SIZE");
    }
    let balloon = balloon.map(BalloonConfig::parse_size).transpose()?;
    let mut body = serde_json::Map::new();
    if let Some(n) = cpus {
        body.insert("desired_vcpus".into(), n.into());
    }
    if let Some(ram) = memory {
        body.insert("desired_ram".into(), ram.bytes().into());
    }
    if let Some(bytes) = balloon {
        body.insert("desired_balloon".into(), bytes.into());
    }
    Ok(serde_json::Value::Object(body).to_string())
}

pub fn main(args: RemoteArgs) -> anyhow::Result<i32> {
    let (method, endpoint, body) = request(&args.command)?;
    let migrating = matches!(
        args.command,
        RemoteCommand::SendMigration { .. } | RemoteCommand::ReceiveMigration { .. }
    );
    let timeout = match args.timeout {
        Some(secs) => Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|t| !t.is_zero())
            .context("--timeout must be a positive number of seconds")?,
        // Answered when the migration ends: a year stands for no limit.
        None if migrating => Duration::from_secs(365 * 24 * 3600),
        None => Duration::from_secs(30),
    };
    let socket = args.api_socket.display();
    let mut client = ApiClient::connect(&args.api_socket, timeout)
        .with_context(|| format!("Cannot connect to {socket}"))?;
    let reply = client
        .request(method, endpoint, body.as_deref())
        .with_context(|| format!("{endpoint}: no answer from {socket}"))?;
    match reply.status {
        200 => {
            let pretty = serde_json::from_str::<serde_json::Value>(&reply.body)
                .and_then(|v| serde_json::to_string_pretty(&v))
                .unwrap_or(reply.body);
            println!("{pretty}");
            Ok(0)
        }
        204 => Ok(0),
        status => {
            eprintln!(
                "exitless remote: {endpoint}: {status}: {}",
                reply.body.trim()
            );
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_become_api_bodies() {
        let d: serde_json::Value =
            serde_json::from_str(&disk_body("path=/d.img,readonly=on,direct=on,id=x").unwrap())
                .unwrap();
        assert_eq!(
            d,
            serde_json::json!({"path": "/d.img", "readonly": true, "direct": true, "id": "x"})
        );
        let n: serde_json::Value =
            serde_json::from_str(&net_body("tap=tap0,mac=52:54:00:00:00:07").unwrap()).unwrap();
        assert_eq!(
            (n["tap"].as_str(), n["mac"].as_str()),
            (Some("tap0"), Some("52:54:00:00:00:07"))
        );
        let v: serde_json::Value =
            serde_json::from_str(&vsock_body("cid=3,socket=/v.sock").unwrap()).unwrap();
        assert_eq!(v["cid"], 3);
        let vu: serde_json::Value =
            serde_json::from_str(&disk_body("vhost_user=on,socket=/b.sock,id=v").unwrap()).unwrap();
        assert_eq!(
            vu,
            serde_json::json!({"vhost_user": true, "vhost_socket": "/b.sock", "id": "v"})
        );
        assert!(disk_body("readonly=on").is_err());
        assert!(vsock_body("cid=1,socket=/v").is_err());
    }

    #[test]
    fn operations_send_cloud_hypervisors_bodies() {
        let disk = RemoteCommand::ResizeDisk {
            disk: "_disk0".into(),
            size: "32M".parse().unwrap(),
        };
        let (_, endpoint, body) = request(&disk).unwrap();
        let body: serde_json::Value = serde_json::from_str(&body.unwrap()).unwrap();
        assert_eq!(endpoint, "vm.resize-disk");
        assert_eq!(
            body,
            serde_json::json!({"id": "_disk0", "desired_size": 32u64 << 20})
        );
        let zone = RemoteCommand::ResizeZone {
            id: "mem0".into(),
            size: "1G".parse().unwrap(),
        };
        let body = request(&zone).unwrap().2.unwrap();
        assert_eq!(body, r#"{"desired_ram":1073741824,"id":"mem0"}"#);
        let core = RemoteCommand::Coredump {
            file: "/tmp/vm.core".into(),
        };
        let (_, endpoint, body) = request(&core).unwrap();
        assert_eq!(endpoint, "vm.coredump");
        assert_eq!(
            body.unwrap(),
            r#"{"destination_url":"file:///tmp/vm.core"}"#
        );
        assert_eq!(request(&RemoteCommand::Nmi).unwrap().1, "vm.nmi");
        assert_eq!(
            request(&RemoteCommand::PowerButton).unwrap().1,
            "vm.power-button"
        );
    }

    #[test]
    fn resize_sends_cpus_memory_or_both() {
        let memory = Some("1G".parse().unwrap());
        let r = request(&RemoteCommand::Resize {
            cpus: None,
            memory,
            balloon: None,
        })
        .unwrap();
        let body: serde_json::Value = serde_json::from_str(&r.2.unwrap()).unwrap();
        assert_eq!(
            (r.1, &body["desired_ram"]),
            ("vm.resize", &(1u64 << 30).into())
        );
        assert!(body["desired_vcpus"].is_null());
        let neither = RemoteCommand::Resize {
            cpus: None,
            memory: None,
            balloon: None,
        };
        assert!(request(&neither).is_err());
    }
}
