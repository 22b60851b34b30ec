//! exitless: a KVM VMM that keeps exits few and cheap and shows where exit cycles go.

#[cfg(target_env = "musl")]
mod allocator;
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
mod compare_migrate;
#[cfg(feature = "lab")]
mod compare_snapshot;
mod options;
mod output_file;
mod remote;
mod remote_migration;
mod run;
mod tap_check;

use anyhow::Context;
use clap::{Parser, Subcommand};
use options::{Seccomp, ServerOptions, VmOptions};

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
    #[command(flatten)]
    server: ServerOptions,
    #[command(flatten)]
    vm: VmOptions,
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

/// `run` and the API server's command line alone: clap builds every subcommand's arguments
/// before it parses, and `remote`'s (a subcommand per endpoint) were ~3% of a start's main
/// thread (docs/performance.md).
#[derive(Parser)]
#[command(name = "exitless")]
struct RunCli {
    #[command(subcommand)]
    command: Option<RunCommand>,
    #[command(flatten)]
    server: ServerOptions,
    #[command(flatten)]
    vm: VmOptions,
}

#[derive(Subcommand)]
enum RunCommand {
    Run(run::RunArgs),
}

/// The API server's command line alone (Kata's: `--api-socket S`, `-v`, `--seccomp`,
/// `--log-file`): no subcommand's arguments built at all.
#[derive(Parser)]
#[command(name = "exitless")]
struct ServerCli {
    #[command(flatten)]
    server: ServerOptions,
    #[command(flatten)]
    vm: VmOptions,
}

/// The words that ask for help or the version: the whole parser answers them.
const HELP_WORDS: &[&str] = &["help", "--help", "-h", "--version", "-V"];

/// Whether a word of the command line after the program's name is one of `words`.
#[inline]
fn names_any(args: &[std::ffi::OsString], words: &[&str]) -> bool {
    args.iter().skip(1).any(|a| words.iter().any(|w| a == w))
}

/// The command line parsed as `run`'s or the API server's, when no word of it names another
/// command or asks for help; `None` to parse it with more, also when this parse fails, so
/// that an error is the whole parser's message.
fn parse_run_only(args: &[std::ffi::OsString]) -> Option<Cli> {
    if names_any(args, &["remote", "bench", "compare"]) || names_any(args, HELP_WORDS) {
        return None;
    }
    if !names_any(args, &["run"]) {
        let cli = ServerCli::try_parse_from(args).ok()?;
        return Some(Cli {
            command: None,
            server: cli.server,
            vm: cli.vm,
        });
    }
    let cli = RunCli::try_parse_from(args).ok()?;
    Some(Cli {
        command: cli.command.map(|RunCommand::Run(args)| Command::Run(args)),
        server: cli.server,
        vm: cli.vm,
    })
}

/// `run`, `remote` and the API server's command line without the lab's commands: clap builds
/// every subcommand's arguments before it parses, and `bench`'s and `compare`'s many left the
/// allocator ~28 kB more dirty heap in every VM of the default build (docs/performance.md).
#[cfg(feature = "lab")]
#[derive(Parser)]
#[command(name = "exitless")]
struct VmmCli {
    #[command(subcommand)]
    command: Option<VmmCommand>,
    #[command(flatten)]
    server: ServerOptions,
    #[command(flatten)]
    vm: VmOptions,
}

#[cfg(feature = "lab")]
#[derive(Subcommand)]
enum VmmCommand {
    Run(run::RunArgs),
    Remote(remote::RemoteArgs),
}

/// The command line parsed without the lab's commands, when no word of it asks for them or
/// for help (which lists them all); `None` to parse it whole, also when this parse fails, so
/// that an error is the whole parser's message.
#[cfg(feature = "lab")]
fn parse_without_the_lab(args: Vec<std::ffi::OsString>) -> Option<Cli> {
    if names_any(&args, &["bench", "compare"]) || names_any(&args, HELP_WORDS) {
        return None;
    }
    let cli = VmmCli::try_parse_from(args).ok()?;
    let command = cli.command.map(|c| match c {
        VmmCommand::Run(args) => Command::Run(args),
        VmmCommand::Remote(args) => Command::Remote(args),
    });
    Some(Cli {
        command,
        server: cli.server,
        vm: cli.vm,
    })
}

/// The command line; a usage error is clap's whole message (what is wrong, the argument's
/// name, a similar argument when there is one, the usage line), exit code 2.
fn parse_args() -> Cli {
    use clap::error::ErrorKind;
    let args: Vec<_> = std::env::args_os().collect();
    if let Some(cli) = parse_run_only(&args) {
        return cli;
    }
    #[cfg(feature = "lab")]
    if let Some(cli) = parse_without_the_lab(args) {
        return cli;
    }
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
            let text = e.render().to_string();
            let text = text.trim_end().trim_start_matches("error: ");
            eprintln!("exitless: {text}");
            std::process::exit(2);
        }
    }
}

/// Whether these arguments boot a VM in this process from its command line (`run` without
/// `--restore`), judged from the words before clap parses them: such a VM gets a head start
/// (vmm::launch::head_start). Only speculation: a wrong guess costs a thread and an unused
/// empty VM, or the head start. The API server gets none: it waits for `vm.create` and
/// `vm.boot` anyway, and its head start cost ~0.3 ms of CPU per start for no gain in time to
/// the first line (2026-11-29, docs/performance.md).
fn boots_a_vm(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    let args: Vec<_> = args.collect();
    let word = |w: &str| args.iter().any(|a| a == w);
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
    if elsewhere.iter().any(|w| word(w)) {
        return false;
    }
    let restores = args
        .iter()
        .any(|a| a.as_encoded_bytes().starts_with(b"--restore"));
    word("run") && !restores
}

/// The options that act for this command: given after its name, else before it.
fn options_for(cli: &mut Cli) -> (VmOptions, ServerOptions) {
    use std::mem::take;
    let (vm, server) = match &mut cli.command {
        Some(Command::Run(args)) => (take(&mut args.vm), take(&mut args.server)),
        #[cfg(feature = "lab")]
        Some(Command::Bench(args)) => (take(&mut args.vm), ServerOptions::default()),
        #[cfg(feature = "lab")]
        Some(Command::Compare(args)) => {
            let log = take(&mut args.log);
            let vm = VmOptions {
                log,
                ..VmOptions::default()
            };
            (vm, ServerOptions::default())
        }
        Some(Command::Remote(_)) | None => (VmOptions::default(), ServerOptions::default()),
    };
    (vm.or(&cli.vm), server.or(&cli.server))
}

/// The subcommands this build has, for the line that asks for one.
const SUBCOMMANDS: &str = if cfg!(feature = "lab") {
    "bench, run, compare, remote"
} else {
    "run, remote"
};

/// What to do: a subcommand, or with only `--api-socket` the API server.
fn dispatch(command: Option<Command>, server: ServerOptions) -> anyhow::Result<i32> {
    let verbose = server.verbose > 0;
    match (command, server.api_socket) {
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
            eprintln!(
                "exitless: give a command ({SUBCOMMANDS}) or --api-socket PATH for an empty \
                 VMM (--help lists them)"
            );
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

#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

fn main() {
    vmm::startup::main_started();
    // Before any thread: one malloc arena for all (see vmm::seccomp).
    vmm::seccomp::prepare_malloc();
    // The heap start-up frees goes back once the VM runs (only the binary reaches its allocator).
    #[cfg(target_env = "musl")]
    vmm::launch::set_heap_release(allocator::release_freed_heap);
    if boots_a_vm(std::env::args_os().skip(1)) {
        // Failing to start the thread only costs the head start.
        let _ = vmm::launch::head_start::begin();
    }
    let mut cli = parse_args();
    let (vm, server) = options_for(&mut cli);
    if vm.seccomp == Some(Seccomp::Off) {
        vmm::seccomp::disable();
    }
    if let Some(mode) = vm.dirty_log {
        vmm::kvm::dirty_tracking::prefer(mode.0);
    }
    if let Some(every) = vm.profile_sample {
        vmm::profile::set_sample(every);
    }
    let result = match &vm.log.log_file {
        Some(path) => redirect_stderr(path).and_then(|()| dispatch(cli.command, server)),
        None => dispatch(cli.command, server),
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
    use super::{boots_a_vm, options_for, Cli, Seccomp};
    use clap::Parser;

    fn options(line: &str) -> (super::VmOptions, super::ServerOptions) {
        let mut cli = Cli::try_parse_from(line.split_whitespace()).unwrap();
        options_for(&mut cli)
    }

    #[test]
    fn the_profile_sample_is_taken_before_or_after_the_command_and_refused_at_zero() {
        let (vm, _) = options("exitless --profile-sample 4 run --kernel k");
        assert_eq!(vm.profile_sample, Some(4));
        let (vm, _) = options("exitless run --profile-sample 1 --kernel k");
        assert_eq!(vm.profile_sample, Some(1));
        let (vm, _) = options("exitless --api-socket /s --profile-sample 8");
        assert_eq!(vm.profile_sample, Some(8));
        assert_eq!(options("exitless run --kernel k").0.profile_sample, None);
        assert!(Cli::try_parse_from(["exitless", "--profile-sample", "0"]).is_err());
    }

    #[test]
    fn shared_options_act_given_before_or_after_the_command_and_only_where_they_act() {
        let (vm, server) = options("exitless --seccomp off -v --api-socket /s run --kernel k");
        assert_eq!(vm.seccomp, Some(Seccomp::Off));
        assert_eq!(
            server.api_socket.as_deref(),
            Some(std::path::Path::new("/s"))
        );
        let (vm, server) = options("exitless -v run --seccomp off -v --log-file l --kernel k");
        assert_eq!((vm.seccomp, server.verbose), (Some(Seccomp::Off), 2));
        assert_eq!(vm.log.log_file.as_deref(), Some(std::path::Path::new("l")));
        let (vm, _) = options("exitless run --kernel k");
        assert_eq!(vm.seccomp, Some(Seccomp::On), "on unless said");
        let (vm, _) = options("exitless compare --log-file l");
        assert!(vm.log.log_file.is_some());
        for refused in [
            "exitless remote --seccomp off --api-socket s ping",
            "exitless remote -v --api-socket s ping",
            "exitless bench --api-socket s",
            "exitless compare --seccomp off",
        ] {
            assert!(
                Cli::try_parse_from(refused.split_whitespace()).is_err(),
                "{refused}"
            );
        }
    }

    #[cfg(feature = "lab")]
    #[test]
    fn run_and_remote_parse_without_the_lab_and_alike() {
        use super::parse_without_the_lab;
        let words = |line: &str| line.split_whitespace().map(Into::into).collect::<Vec<_>>();
        for line in [
            "exitless run --kernel k --memory 512M --seccomp off",
            "exitless -v --api-socket /s run --kernel k",
            "exitless --api-socket /s",
            "exitless remote --api-socket /s ping",
        ] {
            let mut lean = parse_without_the_lab(words(line)).expect(line);
            let mut whole = Cli::try_parse_from(words(line)).unwrap();
            let (lean_vm, lean_server) = options_for(&mut lean);
            let (vm, server) = options_for(&mut whole);
            assert_eq!(lean_vm.seccomp, vm.seccomp, "{line}");
            assert_eq!(lean_server.api_socket, server.api_socket, "{line}");
            assert_eq!(lean_server.verbose, server.verbose, "{line}");
            assert_eq!(lean.command.is_some(), whole.command.is_some(), "{line}");
        }
        for whole_parser in [
            "exitless bench --cases cpuid",
            "exitless compare --api",
            "exitless run --help",
            "exitless help",
            "exitless --version",
            "exitless run --kernle k",
            "exitless benhc",
        ] {
            assert!(
                parse_without_the_lab(words(whole_parser)).is_none(),
                "{whole_parser}"
            );
        }
    }

    #[test]
    fn run_and_the_api_server_parse_without_remote_and_alike() {
        use super::parse_run_only;
        let words = |line: &str| line.split_whitespace().map(Into::into).collect::<Vec<_>>();
        for line in [
            "exitless run --kernel k --memory 512M --seccomp off",
            "exitless -v --api-socket /s run --kernel k --cmdline c",
            "exitless --api-socket /s -vv --seccomp false",
            "exitless --api-socket /s --log-file l --profile-sample 4",
            "exitless --api-socket /s",
            "exitless run --kernel k --disk path=d --net tap=t --timing",
        ] {
            let mut lean = parse_run_only(&words(line)).expect(line);
            let mut whole = Cli::try_parse_from(words(line)).unwrap();
            let (lean_vm, lean_server) = options_for(&mut lean);
            let (vm, server) = options_for(&mut whole);
            assert_eq!(lean_vm.seccomp, vm.seccomp, "{line}");
            assert_eq!(lean_server.api_socket, server.api_socket, "{line}");
            assert_eq!(lean_server.verbose, server.verbose, "{line}");
            assert_eq!(lean.command.is_some(), whole.command.is_some(), "{line}");
        }
        for whole_parser in [
            "exitless remote --api-socket /s ping",
            "exitless --api-socket /s remote ping",
            "exitless bench --cases cpuid",
            "exitless compare --api",
            "exitless run --help",
            "exitless help",
            "exitless -h",
            "exitless --version",
            "exitless run --kernle k",
            "exitless rnu --kernel k",
            "exitless --api-socket /s extra",
            "exitless --api-socket /s --kernel k",
        ] {
            assert!(
                parse_run_only(&words(whole_parser)).is_none(),
                "{whole_parser}"
            );
        }
    }

    fn boots(line: &str) -> bool {
        boots_a_vm(line.split_whitespace().map(std::ffi::OsString::from))
    }

    #[test]
    fn a_head_start_only_for_a_command_line_that_boots_a_vm() {
        assert!(boots("run --kernel k --memory 512M"));
        assert!(boots("--api-socket /tmp/s run --kernel k"));
        for elsewhere in [
            "--api-socket /tmp/s",
            "-v --api-socket=/tmp/s",
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
            assert!(!boots(elsewhere), "{elsewhere}");
        }
    }
}
