//! `tablix fsck`: check and repair the file system of a stopped daemon's
//! data directory.

use std::process::ExitCode;

use anyhow::{Context, bail};
use tablix_fs::{FsOp, FsReply};
use tablix_store::{Command, Stamp, Store, StoreConfig, StoreError};

use crate::cli::FsckArgs;
use crate::discovery;

/// Exit codes after fsck(8): 0 clean, 1 problems corrected, 4 problems left.
const CORRECTED: u8 = 1;
const UNCORRECTED: u8 = 4;

pub fn run(args: FsckArgs) -> anyhow::Result<ExitCode> {
    let data = discovery::data_dir(args.data.as_deref())?;
    let config = StoreConfig::new(&data);
    if !config.database_path().exists() {
        bail!("{} holds no tablix database", data.display());
    }
    let store = Store::open(config).map_err(|e| match e {
        StoreError::Locked { holder, .. } => anyhow::anyhow!(
            "a tablix daemon{} is using {}; stop it before running fsck",
            holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
            data.display()
        ),
        e => anyhow::Error::from(e).context(format!("opening {}", data.display())),
    })?;
    let repair = !args.no_repair;
    let applied = store
        .apply(Stamp::now(), Command::Fs(FsOp::Check { repair }))
        .context("running the check")?;
    store.close()?;
    let report = match applied.fs {
        Some(Ok(FsReply::Checked(r))) => r,
        Some(Err(e)) => bail!("the check failed: {e}"),
        _ => bail!("the check returned nothing"),
    };
    println!(
        "{}: {} inodes, {} entries, {} blocks",
        data.display(),
        report.inodes,
        report.entries,
        report.blocks
    );
    for p in &report.problems {
        println!("problem: {p}");
    }
    for r in &report.repairs {
        println!("repaired: {r}");
    }
    if report.is_clean() {
        println!("clean");
        Ok(ExitCode::SUCCESS)
    } else if report.unrepaired == 0 {
        println!("{} problems, all repaired", report.problems.len());
        Ok(ExitCode::from(CORRECTED))
    } else {
        println!(
            "{} problems, {} not repaired{}",
            report.problems.len(),
            report.unrepaired,
            if repair {
                ""
            } else {
                " (run without -n to repair)"
            }
        );
        Ok(ExitCode::from(UNCORRECTED))
    }
}
