//! `ustrace`: the command-line door to ustrace.
//!
//! `demo` and `bench` run in this process on the built-in workload; the other verbs reach a
//! running process's tracefs over its control socket or a FUSE mount.

mod bench;
mod demo;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "ustrace", version, about = "The kernel's event tracing, inside any Linux process")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the built-in key-value store workload with tracing on and print its trace.
    Demo(demo::DemoArgs),
    /// Measure the cost of each hot path on this machine.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ustrace: {e}");
            ExitCode::FAILURE
        }
    }
}
