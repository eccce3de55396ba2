//! The `tablix` command.

mod bench;
mod cli;
mod discovery;
mod sql;
mod up;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Up(args) => up::run(args),
        cli::Command::Sql(args) => sql::run(args),
        cli::Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tablix: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
