//! Options shared by several commands: each command offers those that act there (the API
//! socket, -v, the log file, seccomp), given after its name or before it (`exitless
//! --api-socket S run ...`, as Kata starts the API server: `exitless --api-socket S
//! --seccomp on --log-file F`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Seccomp {
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

/// Where exitless's messages go: every command that runs VMs (`compare` too).
#[derive(Args, Default)]
pub struct LogOptions {
    /// Write exitless's own messages (its stderr) to FILE, appended, instead of stderr
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
}

/// What every command that runs exitless's VMs in its own process takes: `run`, `bench`.
#[derive(Args, Default)]
pub struct VmOptions {
    #[command(flatten)]
    pub log: LogOptions,
    /// Seccomp filters on the threads a guest can reach (vCPUs, devices, disk I/O, API) and
    /// on `run`'s main thread: a system call outside a thread's list stops exitless with code
    /// 159 and a line naming the thread and the call. `off` (or `false`) is for debugging
    /// [default: on]
    #[arg(long, value_enum, value_name = "on|off")]
    pub seccomp: Option<Seccomp>,
    /// How a migration tracks the pages the vCPUs write: `ring` (KVM's dirty ring, 64 KiB
    /// of kernel memory per vCPU, enabled when the VM is made; the VM is refused where KVM
    /// lacks it), `bitmap` (KVM's bitmap, with manual protect where offered) or `auto` (the
    /// ring where KVM offers it). Nothing is logged unless a migration runs
    /// (docs/migration.md) [default: auto]
    #[arg(long, value_name = "auto|ring|bitmap", value_parser = clap::value_parser!(DirtyLog))]
    pub dirty_log: Option<DirtyLog>,
    /// The exit profile times one userspace exit in N (two TSC reads and the host CPU's read
    /// on that exit only); every exit is still counted by reason and device, and the times
    /// are scaled to all of them (the profile says so). 1 times every exit
    /// [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub profile_sample: Option<u32>,
}

/// `--dirty-log`'s value: vmm's mode, parsed with its own error line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyLog(pub vmm::kvm::dirty_tracking::DirtyLogMode);

impl std::str::FromStr for DirtyLog {
    type Err = vmm::kvm::dirty_tracking::ModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(DirtyLog)
    }
}

/// `run`'s and the API server's: the VM's API and what it logs.
#[derive(Args, Default)]
pub struct ServerOptions {
    /// Serve Cloud Hypervisor's REST API (HTTP over this Unix socket). Alone: an empty VMM
    /// that waits for vm.create and vm.boot; with `run`: the API of the VM it starts. A stale
    /// socket file is replaced; one a program listens on is an error. Removed on exit
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// More detail on stderr (repeatable): -v logs each API request and its status
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl VmOptions {
    /// These options with `outer`'s (given before the command) where these say nothing;
    /// seccomp is off if either says so.
    pub fn or(self, outer: &VmOptions) -> VmOptions {
        let off = [self.seccomp, outer.seccomp].contains(&Some(Seccomp::Off));
        let log_file = self.log.log_file.or_else(|| outer.log.log_file.clone());
        VmOptions {
            log: LogOptions { log_file },
            seccomp: Some(if off { Seccomp::Off } else { Seccomp::On }),
            dirty_log: self.dirty_log.or(outer.dirty_log),
            profile_sample: self.profile_sample.or(outer.profile_sample),
        }
    }
}

impl ServerOptions {
    /// These options with `outer`'s where these say nothing; -v counts both.
    pub fn or(self, outer: &ServerOptions) -> ServerOptions {
        ServerOptions {
            api_socket: self.api_socket.or_else(|| outer.api_socket.clone()),
            verbose: self.verbose + outer.verbose,
        }
    }
}
