//! exitless: a KVM VMM that keeps exits few and cheap and shows where exit cycles go.

mod bench;
mod output_file;
mod run;

use clap::{Parser, Subcommand};

/// A KVM virtual machine monitor built around the cost of VM exits.
#[derive(Parser)]
#[command(name = "exitless", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure what each kind of VM exit costs on this host (the exit lab).
    Bench(bench::BenchArgs),
    /// Boot a Linux guest.
    Run(run::RunArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(args),
        Command::Run(args) => run::main(args),
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
