//! `exitless run`: boot a Linux guest.
//!
//! Exit codes: 0 when the guest powers off or reboots (a reboot ends the VM with "guest
//! rebooted"), 3 on a triple fault, 4 when KVM fails to run the guest, 5 on an unknown KVM
//! system event, 124 when `--timeout` stopped the VM, 130 when SIGINT or SIGTERM stopped it,
//! 159 when a seccomp filter stopped exitless, and 1 for any error setting the VM up (one line
//! on stderr).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use exitless_control::api::server::ApiServer;
use exitless_control::control::{serve, Vmm};
use vmm::config::{ConfigError, VmConfig, VmConfigOverrides, MAX_VCPUS};
use vmm::launch::{self, LaunchEnd, LaunchOptions, LaunchedVm};
use vmm::profile::ProfileReport;
use vmm::terminal::RawTerminal;
use vmm::vcpu::VmEnd;

use crate::output_file::{ensure_writable, write_json};

/// Exit code when the guest triple-faulted.
pub const EXIT_TRIPLE_FAULT: i32 = 3;
/// Exit code when KVM could not run the guest.
pub const EXIT_KVM_FAILURE: i32 = 4;
/// Exit code for a KVM system event exitless does not know.
pub const EXIT_SYSTEM_EVENT: i32 = 5;
/// Exit code when `--timeout` stopped the VM.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code when SIGINT or SIGTERM stopped the VM.
pub const EXIT_SIGNAL: i32 = 130;

/// Options of `exitless run` (boxed: they are large next to the other subcommands).
#[derive(Args)]
#[command(
    after_help = "The guest's COM1 is this terminal: keys go to the guest, except Ctrl-C, which \
stops the VM (as SIGINT and SIGTERM do). SIGUSR1 prints the exit profile of a running VM.\n\n\
When stdin ends (EOF, e.g. < /dev/null), the guest gets no more input and the VM runs on. \
When stdout stops taking the guest's output (a closed pipe, `| head`, a gone terminal), that \
output is dropped, said once on stderr and counted in the profile (\"console\" in \
--profile-json); the VM runs on to its own end. --serial-log still gets everything.\n\n\
Exit codes: 0 guest powered off or rebooted, 1 setup error, 2 usage error (a bad or \
missing option), 3 triple fault, 4 KVM failure, 5 unknown KVM system event, 124 --timeout reached, \
130 stopped by SIGINT/SIGTERM, 159 a thread made a system call its seccomp filter does not \
allow (see --seccomp)."
)]
pub struct RunArgs {
    #[command(flatten)]
    opts: Box<RunOptions>,
    #[command(flatten)]
    pub server: crate::options::ServerOptions,
    #[command(flatten)]
    pub vm: crate::options::VmOptions,
}

/// Options of `exitless run`. Command line values override the `--config` file.
#[derive(Args)]
pub struct RunOptions {
    /// Kernel image: ELF vmlinux (PVH boot) or bzImage [default: none, required here or in --config]
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// Initial ramdisk [default: none]
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// Kernel command line [default: "console=ttyS0 reboot=k panic=1"]
    #[arg(long, value_name = "STR")]
    cmdline: Option<String>,
    /// Number of vCPUs: 1 to 254 (fewer if KVM allows fewer) [default: 1]
    #[arg(long, value_name = "N")]
    cpus: Option<u64>,
    /// Guest RAM: a number with a K, M, G or T suffix (256M, 1G); a bare number is MiB; 16M to
    /// 1T. Or size=SIZE with what backs it: shared=on (a memfd a vhost-user back end such as
    /// virtiofsd can map; --fs needs it), hugepages=on (from the host's hugetlb pool, which
    /// must have enough free pages), hugepage_size=2M|1G, hotplug_size=SIZE (how much
    /// vm.resize may add through --api-socket, ACPI memory hotplug) [default: 512M, private,
    /// normal pages, no hotplug]
    #[arg(long, value_name = "SIZE|size=SIZE,...")]
    memory: Option<String>,
    /// A Cloud Hypervisor VmConfig in JSON (what vm.create and `exitless remote create`
    /// take: payload, cpus, memory in bytes, disks, net, fs, vsock, balloon, serial; see
    /// docs/api.md); command line options override it. Without a serial section the console
    /// is this terminal; the entropy device is always there, as in Cloud Hypervisor
    /// [default: none]
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// Also write the serial console to this file [default: none]
    #[arg(long, value_name = "FILE")]
    serial_log: Option<PathBuf>,
    /// Interrupt controller: kernel, split or none [default: kernel]
    #[arg(long, value_name = "MODE")]
    irqchip: Option<String>,
    /// Pin vCPU i to the i-th host CPU of this list: one CPU per vCPU, e.g. 0,1 with --cpus 2
    /// [default: no pinning]
    #[arg(long, value_name = "LIST")]
    cpu_affinity: Option<String>,
    /// Print the exit profile when the VM ends and on SIGUSR1 [default: off]
    #[arg(long)]
    profile: bool,
    /// Write the exit profile as JSON to FILE when the VM ends [default: none]
    #[arg(long, value_name = "FILE")]
    profile_json: Option<PathBuf>,
    /// Break the printed profile down per vCPU [default: off]
    #[arg(long)]
    profile_per_vcpu: bool,
    /// Print a one-line exit summary on stderr every SECS seconds, also for an interval
    /// without userspace exits (not with --api-socket: vm.profile answers there) [default: off]
    #[arg(long, value_name = "SECS")]
    profile_interval: Option<f64>,
    /// A raw disk image as a virtio-blk device (repeatable; readonly=on refuses the guest's
    /// writes, direct=on opens it O_DIRECT). The image is locked while attached (exclusive,
    /// shared when read-only): a second writer is refused; lock=off shares it on purpose.
    /// vhost_user=on,socket=PATH: the disk served by a vhost-user-blk back end (e.g.
    /// qemu-storage-daemon) listening on PATH; needs --memory size=SIZE,shared=on
    /// [default: none]
    #[arg(
        long,
        value_name = "path=FILE[,readonly=on][,direct=on][,lock=off] | vhost_user=on,socket=PATH"
    )]
    disk: Vec<String>,
    /// A virtio-rng device fed from the host's getrandom(2) [default: off]
    #[arg(long)]
    rng: bool,
    /// A virtio-net card on host tap NAME (repeatable). The tap is opened if it exists, else
    /// created (as QEMU does; needs CAP_NET_ADMIN), which stderr says in one line: "created
    /// tap NAME" (it goes when exitless ends). An interface that is not a tap (lo, eth0) is
    /// refused. The host side (address, bridge, up) is yours to set. mac= defaults to
    /// 52:54:00 and three bytes from the tap's name [default: none]
    #[arg(long, value_name = "tap=NAME[,mac=MAC]")]
    net: Vec<String>,
    /// A virtio-vsock device with guest context id N (3 or more), joined to Unix sockets: a
    /// host program connects to PATH and sends "CONNECT <port>\n" to reach guest port
    /// <port> (answered "OK <hostport>\n"); a guest connection to host port P goes to PATH_P
    /// [default: none]
    #[arg(long, value_name = "cid=N,socket=PATH")]
    vsock: Option<String>,
    /// A virtio-fs device the guest mounts as TAG (mount -t virtiofs TAG DIR), served by the
    /// vhost-user back end listening on PATH, e.g. `virtiofsd --socket-path PATH --shared-dir
    /// DIR` (repeatable). Needs --memory size=SIZE,shared=on. num_queues= request queues
    /// [default: 1], queue_size= [default: 1024] [default: none]
    #[arg(long, value_name = "tag=TAG,socket=PATH")]
    fs: Vec<String>,
    /// A virtio device of type N (2 block, 26 fs, ...) whose queues (one per size listed) and
    /// configuration space the vhost-user back end listening on PATH serves, as Cloud
    /// Hypervisor's --generic-vhost-user (repeatable). Needs --memory size=SIZE,shared=on
    /// [default: none]
    #[arg(long, value_name = "socket=PATH,device_type=N,queue_sizes=[Q,...]")]
    generic_vhost_user: Vec<String>,
    /// A virtio-pmem device: FILE mapped into guest physical memory (created with size= if
    /// missing, grown to it if shorter; size a multiple of 2M), made durable by the driver's
    /// flush; discard_writes=on keeps the guest's writes out of the file (repeatable)
    /// [default: none]
    #[arg(long, value_name = "file=FILE[,size=SIZE][,discard_writes=on]")]
    pmem: Vec<String>,
    /// A virtio-balloon device, through which the guest gives memory back to the host:
    /// free_page_reporting=on lets it report its free pages, which exitless discards (the
    /// host's RSS falls); size=SIZE (0, or a size as --memory takes it) is what it is asked to
    /// put in the balloon at boot; deflate_on_oom=on lets it take that back when short of
    /// memory. e.g. --balloon free_page_reporting=on,size=0 [default: none]
    #[arg(long, value_name = "KEY=VALUE,...")]
    balloon: Option<String>,
    /// Stop the VM after SECS seconds and exit with code 124 [default: no timeout]
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Print where start-up time went (from main to the guest's first serial line: KVM, memory,
    /// devices, loading, vCPU threads, seccomp, first KVM_RUN) on stderr when the VM ends
    /// [default: off]
    #[arg(long)]
    timing: bool,
    /// Run the VM saved in DIR (by vm.snapshot: config.json, state.json, guest-ram) from
    /// where it was paused, instead of booting one. The VM is the snapshot's: options that
    /// shape a VM (--kernel, --cpus, --memory, devices...) cannot be given with it; the
    /// console is this terminal (--serial-log adds a file). Guest memory is mapped from the
    /// snapshot copy-on-write: the snapshot is never written [default: none]
    #[arg(long, value_name = "DIR")]
    restore: Option<PathBuf>,
    /// With --restore and --api-socket: leave the restored VM Paused until vm.resume
    /// [default: it runs at once]
    #[arg(long, requires = "restore")]
    paused: bool,
}

fn seconds(name: &str, value: Option<f64>) -> anyhow::Result<Option<Duration>> {
    value
        .map(|s| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .with_context(|| format!("--{name} must be a positive number of seconds, got {s}"))
        })
        .transpose()
}

/// Parses an option here rather than in clap, so a bad value is one line like other errors.
fn parse<T: FromStr<Err = ConfigError>>(value: Option<&str>) -> anyhow::Result<Option<T>> {
    Ok(value.map(str::parse).transpose()?)
}

/// The VM config stores the vCPU count as u8; larger counts get the same message as any
/// count over the limit.
fn cpu_count(n: u64) -> anyhow::Result<u8> {
    u8::try_from(n).map_err(|_| {
        let kvm = vmm::kvm::open().map_or(MAX_VCPUS, |k| k.get_max_vcpus());
        let max = kvm.min(MAX_VCPUS);
        ConfigError::TooManyCpus { cpus: n, max }.into()
    })
}

/// `--config FILE`: a Cloud Hypervisor VmConfig (the schema vm.create takes), with `kernel`
/// (`--kernel`) where the file has no payload.kernel.
fn config_file(path: &Path, kernel: Option<&Path>) -> anyhow::Result<VmConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("Cannot read config file {}", path.display()))?;
    let fail = |why: &dyn std::fmt::Display| anyhow::anyhow!("--config {}: {why}", path.display());
    let mut api: exitless_control::api::schema::VmConfig = serde_json::from_str(&text)
        .map_err(|e| fail(&format!("not a Cloud Hypervisor VmConfig: {e}")))?;
    if api.payload.kernel.is_none() {
        let Some(kernel) = kernel else {
            return Err(fail(
                &"no kernel: give payload.kernel in the file or --kernel",
            ));
        };
        api.payload.kernel = Some(kernel.display().to_string());
    }
    let console_given = api.serial.is_some();
    let mut config = api.to_vm_config().map_err(|e| fail(&e.message))?;
    if !console_given {
        config.serial_output = vmm::config::SerialOutputMode::Stdout;
    }
    Ok(config)
}

fn vm_config(args: &RunOptions) -> anyhow::Result<VmConfig> {
    // The command line's own errors first; the file must then be a valid VmConfig by itself.
    let cli = VmConfigOverrides {
        kernel: args.kernel.clone(),
        initrd: args.initrd.clone(),
        cmdline: args.cmdline.clone(),
        cpus: args.cpus.map(cpu_count).transpose()?,
        memory: parse(args.memory.as_deref())?,
        serial_log: args.serial_log.clone(),
        irqchip: parse(args.irqchip.as_deref())?,
        cpu_affinity: parse(args.cpu_affinity.as_deref())?,
        disks: args
            .disk
            .iter()
            .map(|d| d.parse())
            .collect::<Result<_, ConfigError>>()?,
        rng: args.rng,
        nets: args
            .net
            .iter()
            .map(|n| n.parse())
            .collect::<Result<_, ConfigError>>()?,
        vsock: parse(args.vsock.as_deref())?,
        fs: args
            .fs
            .iter()
            .map(|f| f.parse())
            .collect::<Result<_, ConfigError>>()?,
        balloon: parse(args.balloon.as_deref())?,
        generic_vhost_user: args
            .generic_vhost_user
            .iter()
            .map(|g| g.parse())
            .collect::<Result<_, ConfigError>>()?,
        pmem: args
            .pmem
            .iter()
            .map(|p| p.parse())
            .collect::<Result<_, ConfigError>>()?,
    };
    let file = args
        .config
        .as_deref()
        .map(|path| config_file(path, args.kernel.as_deref()))
        .transpose()?;
    Ok(VmConfig::merge_cli(file, cli)?)
}

pub fn main(args: RunArgs, api_socket: Option<&Path>, verbose: bool) -> anyhow::Result<i32> {
    let args = *args.opts;
    let timeout = seconds("timeout", args.timeout)?;
    let interval = seconds("profile-interval", args.profile_interval)?;
    if interval.is_some() && api_socket.is_some() {
        anyhow::bail!(
            "--profile-interval does not print with --api-socket: ask the API (`exitless remote \
             --api-socket PATH profile`, vm.profile) instead"
        );
    }
    if args.paused && api_socket.is_none() {
        anyhow::bail!("--paused needs --api-socket (vm.resume runs the VM)");
    }
    if args.timing {
        // Before the snapshot is read: a restore's timing starts there.
        vmm::startup::enable();
    }
    let restored = args
        .restore
        .as_deref()
        .map(|dir| restored_config(&args, dir))
        .transpose()?;
    let config = match &restored {
        Some((_, config, _)) => config.clone(),
        None => {
            let mut config = vm_config(&args)?;
            if api_socket.is_some() {
                // Named as vm.info shows them: the API and a snapshot find each by that name.
                exitless_control::api::convert::name_devices_as_the_api_does(&mut config);
            }
            config
        }
    };
    if let Some(path) = &args.profile_json {
        ensure_writable("--profile-json", path)?;
    }
    // Taps given by name (not Kata's fds): refused when not a tap, said when created.
    let named_taps = config.nets.iter().filter(|n| n.tap_fd.is_none());
    let created_taps = crate::tap_check::to_create(named_taps.map(|n| n.tap.as_str()))?;
    launch::install_signal_handlers()?;
    // Launch errors already include their causes in their messages: keep them one line.
    let (mut vm, api, paused) = match restored {
        Some((api, config, state)) => {
            let vm = restore_vm(&args, &config, state)?;
            (vm, Some(api), args.paused)
        }
        None => {
            let vm = launch::launch(&config, LaunchOptions::default())
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            (vm, None, false)
        }
    };
    for tap in &created_taps {
        eprintln!("{}", crate::tap_check::created_line(tap));
    }
    if let Some(socket) = api_socket {
        let api =
            api.unwrap_or_else(|| exitless_control::api::schema::VmConfig::from_vm_config(&config));
        let served = ServedVm {
            api,
            config,
            vm,
            paused,
        };
        return serve_api(&args, served, socket, timeout, verbose);
    }
    let mut terminal = RawTerminal::enter();
    // From here the main thread only waits, reports and stops the VM: under its filter it
    // cannot start the devices thread when a device first needs it.
    vm.start_devices_before_filter()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    vmm::seccomp::apply(vmm::seccomp::ThreadKind::Main)?;
    vmm::startup::mark(vmm::startup::moment::MAIN_SECCOMP);
    // After the filter, whose compilation reaches deep into the stack too.
    launch::release_unused_stack();
    let end = wait(&args, &mut vm, timeout, interval);
    if let Ok(t) = terminal.as_mut() {
        t.restore();
    }
    let end = end?;
    let report = vm.report();
    output_profile(&args, &report)?;
    Ok(exit_code(end))
}

/// The options `--restore` leaves to the snapshot: given with it, they are refused by name.
fn shaping_options(args: &RunOptions) -> Vec<&'static str> {
    let given = [
        ("--kernel", args.kernel.is_some()),
        ("--initrd", args.initrd.is_some()),
        ("--cmdline", args.cmdline.is_some()),
        ("--cpus", args.cpus.is_some()),
        ("--memory", args.memory.is_some()),
        ("--config", args.config.is_some()),
        ("--irqchip", args.irqchip.is_some()),
        ("--disk", !args.disk.is_empty()),
        ("--rng", args.rng),
        ("--net", !args.net.is_empty()),
        ("--vsock", args.vsock.is_some()),
        ("--fs", !args.fs.is_empty()),
        ("--generic-vhost-user", !args.generic_vhost_user.is_empty()),
        ("--pmem", !args.pmem.is_empty()),
        ("--balloon", args.balloon.is_some()),
    ];
    given.into_iter().filter(|g| g.1).map(|g| g.0).collect()
}

type Restored = (
    exitless_control::api::schema::VmConfig,
    VmConfig,
    vmm::snapshot::SnapshotState,
);

/// The snapshot in `dir`: its config (console on stdout, `--serial-log` and
/// `--cpu-affinity` as given) and its checked state.
fn restored_config(args: &RunOptions, dir: &Path) -> anyhow::Result<Restored> {
    if let Some(first) = shaping_options(args).first() {
        anyhow::bail!("--restore runs the snapshot's VM: {first} cannot be given with it");
    }
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("--restore {}: {e}", dir.display());
    let (json, state) = vmm::snapshot::read(dir).map_err(|e| fail(&e))?;
    let api: exitless_control::api::schema::VmConfig =
        serde_json::from_value(json).map_err(|e| fail(&format!("config.json: {e}")))?;
    let mut config = api.to_vm_config().map_err(|e| fail(&e.message))?;
    config.serial_output = vmm::config::SerialOutputMode::Stdout;
    config.serial_log = args.serial_log.clone();
    config.cpu_affinity = parse(args.cpu_affinity.as_deref())?;
    Ok((api, config, state))
}

/// The restored VM, running unless `--paused`.
fn restore_vm(
    args: &RunOptions,
    config: &VmConfig,
    state: vmm::snapshot::SnapshotState,
) -> anyhow::Result<LaunchedVm> {
    let dir = args.restore.as_deref().unwrap_or(Path::new("."));
    let opts = launch::RestoreOptions {
        stdin_to_serial: true,
    };
    let vm = launch::restore(config, dir, state, opts)
        .map_err(|e| anyhow::anyhow!("--restore {}: {e}", dir.display()))?;
    if !args.paused {
        vm.resume().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(vm)
}

/// The VM `run` started or restored, to serve through the API.
struct ServedVm {
    api: exitless_control::api::schema::VmConfig,
    config: VmConfig,
    vm: LaunchedVm,
    paused: bool,
}

/// Serves the API of the VM just started until it ends, `vmm.shutdown`, a stop signal or the
/// timeout; then the profile as usual.
fn serve_api(
    args: &RunOptions,
    served: ServedVm,
    socket: &Path,
    timeout: Option<Duration>,
    verbose: bool,
) -> anyhow::Result<i32> {
    let (calls, requests) = std::sync::mpsc::channel();
    let server = ApiServer::start(socket, calls).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ServedVm {
        api,
        config,
        vm,
        paused,
    } = served;
    let mut vmm = Vmm::with_vm(api, config, vm, paused);
    let start = Instant::now();
    let mut timed_out = false;
    let deadline = timeout.map(|t| start + t);
    let exit = serve::serve(&mut vmm, &requests, verbose, deadline, |_| {
        timed_out = timeout.is_some_and(|t| start.elapsed() >= t);
        timed_out || launch::stop_signal().is_some()
    });
    drop(server);
    if let Some(report) = vmm.report() {
        output_profile(args, &report)?;
    }
    Ok(match exit.0 {
        serve::EXIT_SIGNAL if timed_out => {
            eprintln!("exitless: timeout reached, VM stopped");
            EXIT_TIMEOUT
        }
        code => code,
    })
}

/// Waits for the VM, printing live summaries and SIGUSR1 reports, stopping on a signal.
fn wait(
    args: &RunOptions,
    vm: &mut LaunchedVm,
    timeout: Option<Duration>,
    interval: Option<Duration>,
) -> anyhow::Result<LaunchEnd> {
    // Snapshots of every profile table are ~1.5 KiB per exit kind and device: taken only
    // when a live summary needs them, not held for the VM's life.
    let mut last = interval.map(|_| (Instant::now(), vm.snapshots()));
    let end = vm
        .wait(timeout, interval, |vm| {
            if launch::stop_signal().is_some() {
                return true;
            }
            if launch::take_report_request() && args.profile {
                eprint!(
                    "\r\n{}",
                    crlf(&vm.report().render_table(args.profile_per_vcpu))
                );
            }
            if let (Some(every), Some(last)) = (interval, last.as_mut()) {
                if last.0.elapsed() >= every {
                    let window = vm.report_since(&last.1, last.0.elapsed());
                    eprint!("\r{}\r\n", window.render_summary());
                    *last = (Instant::now(), vm.snapshots());
                }
            }
            false
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(end)
}

/// Raw mode does not turn `\n` into `\r\n`; the report is printed while it may be on.
fn crlf(text: &str) -> String {
    text.replace('\n', "\r\n")
}

fn output_profile(args: &RunOptions, report: &ProfileReport) -> anyhow::Result<()> {
    if let Some(timeline) = vmm::startup::timeline() {
        eprint!("{}", timeline.render());
    }
    if let Some(path) = &args.profile_json {
        write_json(path, report)?;
    }
    if args.profile {
        eprint!("{}", report.render_table(args.profile_per_vcpu));
    }
    Ok(())
}

/// Why KVM stopped, in one line; on a PVM host, what that host cannot do.
fn kvm_failure_message(reason: u64, pvm: bool) -> String {
    let base = format!("KVM could not run the guest (hardware reason {reason:#x})");
    if pvm {
        format!(
            "{base}: this host's KVM is PVM, which emulates guest kernel code one instruction \
             at a time and cannot run all of it (a stock Linux stops in early boot here); \
             a real KVM host (VT-x/SVM) runs this guest"
        )
    } else {
        base
    }
}

fn exit_code(end: LaunchEnd) -> i32 {
    match end {
        LaunchEnd::TimedOut => {
            eprintln!("exitless: timeout reached, VM stopped");
            EXIT_TIMEOUT
        }
        LaunchEnd::StopRequested | LaunchEnd::Guest(VmEnd::Stopped) => {
            eprintln!("exitless: stopped by signal");
            EXIT_SIGNAL
        }
        LaunchEnd::Guest(VmEnd::PowerOff(_)) => 0,
        LaunchEnd::Guest(VmEnd::Reset) => {
            eprintln!("exitless: guest rebooted");
            0
        }
        LaunchEnd::Guest(VmEnd::TripleFault) => {
            eprintln!("exitless: guest triple fault (KVM_EXIT_SHUTDOWN)");
            EXIT_TRIPLE_FAULT
        }
        LaunchEnd::Guest(VmEnd::KvmFailure(reason)) => {
            eprintln!(
                "exitless: {}",
                kvm_failure_message(reason, vmm::kvm::is_pvm_host())
            );
            EXIT_KVM_FAILURE
        }
        LaunchEnd::Guest(VmEnd::SystemEvent(kind)) => {
            eprintln!("exitless: unknown KVM system event {kind}");
            EXIT_SYSTEM_EVENT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_failure_explains_pvm_in_one_line() {
        let plain = kvm_failure_message(0x10, false);
        assert_eq!(plain, "KVM could not run the guest (hardware reason 0x10)");
        let pvm = kvm_failure_message(0, true);
        assert!(
            pvm.contains("PVM, which emulates guest kernel code"),
            "{pvm}"
        );
        assert_eq!(pvm.lines().count(), 1);
    }
}
