//! exitless: a KVM VMM that keeps exits few and cheap and shows where exit cycles go.

mod api;
#[cfg(feature = "lab")]
mod bench;
#[cfg(feature = "lab")]
mod compare;
#[cfg(feature = "lab")]
mod compare_api;
#[cfg(feature = "lab")]
mod compare_density;
#[cfg(feature = "lab")]
mod compare_snapshot;
mod output_file;
mod remote;
mod run;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use vmm::launch::head_start::Lead;

/// A KVM virtual machine monitor built around the cost of VM exits.
#[derive(Parser)]
#[command(
    name = "exitless",
    version,
    about,
    long_about = None,
    after_help = "With --api-socket and no subcommand, exitless is an empty VMM waiting for \
requests on the socket: Cloud Hypervisor's REST API (vm.create, vm.boot, vm.add-disk, ...), so \
Kata Containers' clh driver can run it unchanged. See docs/api.md; `exitless remote` is a client."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Serve Cloud Hypervisor's REST API (HTTP over this Unix socket). Alone: an empty VMM
    /// that waits for vm.create and vm.boot; with `run`: the API of the VM it starts. A stale
    /// socket file is replaced; one a program listens on is an error. Removed on exit
    #[arg(long, global = true, value_name = "PATH")]
    api_socket: Option<PathBuf>,
    /// More detail on stderr (repeatable): -v logs each API request and its status
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Write exitless's own messages (its stderr) to FILE, appended, instead of stderr
    #[arg(long, global = true, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Seccomp filters on the threads a guest can reach (vCPUs, devices, disk I/O, API) and
    /// on `run`'s main thread: a system call outside a thread's list stops exitless with code
    /// 159 and a line naming the thread and the call. `off` (or `false`) is for debugging.
    #[arg(long, global = true, value_enum, default_value_t = Seccomp::On)]
    seccomp: Seccomp,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Seccomp {
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

#[derive(Subcommand)]
enum Command {
    /// Measure what each kind of VM exit costs on this host (the exit lab).
    #[cfg(feature = "lab")]
    Bench(bench::BenchArgs),
    /// Boot a Linux guest.
    Run(run::RunArgs),
    /// Run the bench guest under exitless and the peer VMMs found here, side by side.
    #[cfg(feature = "lab")]
    Compare(compare::CompareArgs),
    /// Send one request to a VMM started with --api-socket (like ch-remote).
    Remote(remote::RemoteArgs),
}

/// The command line; a usage error is one line (clap's first) with where to look, exit code 2.
fn parse_args() -> Cli {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            e.exit()
        }
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            let first = first.trim_start_matches("error: ");
            eprintln!("exitless: {first} (--help lists the options)");
            std::process::exit(2);
        }
    }
}

/// Whether these arguments boot a VM in this process (`run` without `--restore`, or the API
/// server, which waits for `vm.create`), judged from the words before clap parses them, and
/// how long the VM's head start (vmm::launch::head_start) has then. Only speculation: a wrong
/// guess costs a thread and an unused empty VM, or the head start.
fn boots_a_vm(args: impl Iterator<Item = std::ffi::OsString>) -> Option<Lead> {
    let args: Vec<_> = args.collect();
    let word = |w: &str| args.iter().any(|a| a == w);
    let prefix = |p: &str| {
        let p = p.as_bytes();
        args.iter().any(|a| a.as_encoded_bytes().starts_with(p))
    };
    let elsewhere = [
        "remote",
        "bench",
        "compare",
        "help",
        "--help",
        "-h",
        "--version",
        "-V",
    ];
    if elsewhere.iter().any(|w| word(w)) || prefix("--restore") {
        return None;
    }
    match (word("run"), prefix("--api-socket")) {
        (true, _) => Some(Lead::Short),
        (false, true) => Some(Lead::Long),
        (false, false) => None,
    }
}

/// What to do: a subcommand, or with only `--api-socket` the API server.
fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let verbose = cli.verbose > 0;
    match (cli.command, cli.api_socket) {
        (Some(Command::Run(args)), socket) => run::main(args, socket.as_deref(), verbose),
        (Some(Command::Remote(args)), _) => remote::main(args),
        #[cfg(feature = "lab")]
        (Some(Command::Bench(_) | Command::Compare(_)), Some(_)) => {
            anyhow::bail!("--api-socket goes alone (an empty VMM) or with `run`")
        }
        #[cfg(feature = "lab")]
        (Some(Command::Bench(args)), None) => bench::main(args),
        #[cfg(feature = "lab")]
        (Some(Command::Compare(args)), None) => compare::main(args),
        (None, Some(socket)) => api::main(&socket, verbose),
        (None, None) => {
            eprintln!("exitless: give a subcommand (bench, run, compare) or --api-socket PATH (--help lists them)");
            Ok(2)
        }
    }
}

/// Sends this process's stderr to `path` (appended), as Cloud Hypervisor's --log-file does.
fn redirect_stderr(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("--log-file {}: cannot write there", path.display()))?;
    // SAFETY: dup2 makes fd 2 a copy of an fd this function holds open; no memory involved.
    if unsafe { libc::dup2(file.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
        anyhow::bail!("--log-file: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// musl's own allocator gives freed memory back with munmap at once (22-34 calls between
/// creating the VM and its first run, against 2 with dlmalloc), and in a process that holds a
/// VM each munmap runs KVM's MMU notifier and a TLB shootdown to the other CPUs: it took musl's
/// start-up gain away. dlmalloc keeps freed memory for reuse below its trim threshold. The exit
/// path allocates nothing, so its one lock is never taken there (docs/performance.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

fn main() {
    vmm::startup::main_started();
    // Before any thread: one malloc arena for all (see vmm::seccomp).
    vmm::seccomp::prepare_malloc();
    if let Some(lead) = boots_a_vm(std::env::args_os().skip(1)) {
        // Failing to start the thread only costs the head start.
        let _ = vmm::launch::head_start::begin(lead);
    }
    let cli = parse_args();
    if cli.seccomp == Seccomp::Off {
        vmm::seccomp::disable();
    }
    let result = match &cli.log_file {
        Some(path) => redirect_stderr(path).and_then(|()| dispatch(cli)),
        None => dispatch(cli),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            vmm::terminal::restore_terminal();
            eprintln!("exitless: {e:#}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{boots_a_vm, Lead};

    fn boots(line: &str) -> Option<Lead> {
        boots_a_vm(line.split_whitespace().map(std::ffi::OsString::from))
    }

    #[test]
    fn a_head_start_only_for_a_command_line_that_boots_a_vm() {
        assert_eq!(boots("run --kernel k --memory 512M"), Some(Lead::Short));
        assert_eq!(boots("--api-socket /tmp/s"), Some(Lead::Long));
        assert_eq!(boots("-v --api-socket=/tmp/s"), Some(Lead::Long));
        assert_eq!(
            boots("--api-socket /tmp/s run --kernel k"),
            Some(Lead::Short)
        );
        for elsewhere in [
            "run --restore dir",
            "--api-socket /tmp/s run --restore=dir --paused",
            "run --help",
            "remote --api-socket /tmp/s ping",
            "--api-socket /tmp/s remote ping",
            "bench --cases cpuid",
            "compare --api",
            "--version",
            "",
        ] {
            assert_eq!(boots(elsewhere), None, "{elsewhere}");
        }
    }
}
