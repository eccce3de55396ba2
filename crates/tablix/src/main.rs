//! The `tablix` command.

mod bench;
mod cli;
mod cluster;
mod daemon_log;
mod discovery;
mod fsck;
mod mount_helper;
mod pipe;
mod progress;
mod run;
mod scrub;
mod sql;
mod up;

/// Under glibc's allocator a cluster leader spent a sixth of its CPU in
/// `malloc` and `free`, the largest part under the HTTP path's per-request
/// read buffers (ARCHITECTURE.md, `crates/tablix`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if mount_helper::HELPER_NAMES.contains(&invoked_as) {
        return report(mount_helper::run(&argv[1..]));
    }
    let cli = cli::Cli::parse();
    let result = match cli.command {
        cli::Command::Up(args) => up::run(*args),
        cli::Command::Sql(args) => sql::run(args),
        cli::Command::Cluster(args) => cluster::run(args),
        cli::Command::Bench(args) => bench::run(args),
        cli::Command::Fsck(args) => fsck::run(args),
        cli::Command::Pipe(args) => pipe::run(args),
        cli::Command::Run(args) => run::run(args),
        cli::Command::Scrub(args) => scrub::run(args),
        cli::Command::PushWriteback => {
            tablix_fuse::serve_pushes(std::io::stdin().lock(), std::io::stdout().lock())
                .map(|()| ExitCode::SUCCESS)
                .context("serving writeback pushes")
        }
    };
    report(result)
}

fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tablix: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
