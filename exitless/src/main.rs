//! exitless: a KVM VMM that keeps exits few and cheap and shows where exit cycles go.

mod bench;
mod compare;
mod output_file;
mod run;

use clap::{Parser, Subcommand, ValueEnum};

/// A KVM virtual machine monitor built around the cost of VM exits.
#[derive(Parser)]
#[command(name = "exitless", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Seccomp filters on the threads a guest can reach (vCPUs, devices, disk I/O) and on
    /// `run`'s main thread: a system call outside a thread's list stops exitless with code 159
    /// and a line naming the thread and the call. `off` is for debugging.
    #[arg(long, global = true, value_enum, default_value_t = Seccomp::On)]
    seccomp: Seccomp,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Seccomp {
    On,
    Off,
}

#[derive(Subcommand)]
enum Command {
    /// Measure what each kind of VM exit costs on this host (the exit lab).
    Bench(bench::BenchArgs),
    /// Boot a Linux guest.
    Run(run::RunArgs),
    /// Run the bench guest under exitless and the peer VMMs found here, side by side.
    Compare(compare::CompareArgs),
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

fn main() {
    let cli = parse_args();
    if cli.seccomp == Seccomp::Off {
        vmm::seccomp::disable();
    }
    let result = match cli.command {
        Command::Bench(args) => bench::main(args),
        Command::Run(args) => run::main(args),
        Command::Compare(args) => compare::main(args),
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
