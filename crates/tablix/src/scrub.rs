//! `tablix scrub`: reads every data block against the checksum written
//! with it, while the daemon serves (or not), in short read transactions
//! so that the daemon's checkpoints go on meanwhile.
//!
//! Exit status: 0 when every block matched, 4 when some did not (their
//! files are named), 8 when the check could not run.

use std::process::ExitCode;

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags};
use tablix_fs::check::Report;

use crate::cli::ScrubArgs;
use crate::discovery;
use crate::progress::Progress;

/// Blocks read per read transaction.
const BATCH: i64 = 256;

pub fn run(args: ScrubArgs) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::from(match scrub(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tablix scrub: error: {e:#}");
            8
        }
    }))
}

fn scrub(args: &ScrubArgs) -> anyhow::Result<u8> {
    let data = discovery::data_dir(args.data.as_deref())?;
    let db = data.join("tablix.db");
    if !db.exists() {
        bail!("{} holds no tablix database", data.display());
    }
    let conn = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|c| {
            c.busy_timeout(std::time::Duration::from_secs(10))?;
            c.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?;
            Ok(c)
        })
        .with_context(|| {
            format!(
                "reading {} (scrub reads the data directory's files: run it as the user the daemon runs as)",
                db.display()
            )
        })?;
    let total: i64 = conn.query_row("SELECT count(*) FROM tablix_block", [], |r| r.get(0))?;
    let progress = Progress::new("tablix scrub");
    let mut report = Report::default();
    let mut after = i64::MIN;
    let mut done = 0u64;
    loop {
        progress.at("data blocks against their checksums", done, total as u64);
        conn.execute_batch("BEGIN")?;
        let r = tablix_fs::check::verify_blocks(&conn, after, BATCH, &mut report);
        conn.execute_batch("COMMIT")?;
        let (last, seen) = r.map_err(|e| anyhow::anyhow!("reading blocks: {e}"))?;
        done += seen;
        match last {
            Some(key) if seen == BATCH as u64 => after = key,
            _ => break,
        }
    }
    for p in &report.problems {
        println!("damaged: {}", p.trim_start_matches("8: "));
    }
    println!(
        "{}: {} blocks read: {} match their checksums, {} written before checksums (not verified), {} damaged",
        data.display(),
        done,
        report.verified_blocks,
        report.unverified_blocks,
        report.problems.len()
    );
    Ok(if report.problems.is_empty() { 0 } else { 4 })
}
