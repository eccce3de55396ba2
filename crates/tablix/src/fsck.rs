//! `tablix fsck`: check and repair the file system of a stopped daemon's
//! data directory.
//!
//! The check runs first on a read-only view of the data (with `-n` it is
//! all that runs, and no file of the data directory changes: not the
//! database, its WAL, its shared-memory index or the lock file). Only if
//! it finds problems, and repairs are wanted, does fsck open the store and
//! apply them as one Command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags};
use tablix_fs::check::{Options, Report};
use tablix_fs::{FsOp, FsReply};
use tablix_store::{Stamp, Store, StoreConfig, StoreError};

use crate::cli::FsckArgs;
use crate::discovery;
use crate::progress::Progress;

/// Exit codes of fsck(8).
const CLEAN: u8 = 0;
const CORRECTED: u8 = 1;
const UNCORRECTED: u8 = 4;
const OPERATIONAL: u8 = 8;

pub fn run(args: FsckArgs) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::from(match check(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tablix fsck: error: {e:#}");
            OPERATIONAL
        }
    }))
}

/// Holds `DATA/LOCK` (if a daemon ever made it) so that no daemon starts
/// while fsck reads, without creating or writing the file.
struct NoDaemon {
    _file: Option<std::fs::File>,
}

impl NoDaemon {
    fn take(data: &Path) -> anyhow::Result<NoDaemon> {
        let path = data.join("LOCK");
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(NoDaemon { _file: None });
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        match file.try_lock() {
            Ok(()) => Ok(NoDaemon { _file: Some(file) }),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                bail!(
                    "a tablix daemon{} is using {}; stop it before running fsck",
                    if holder.is_empty() {
                        String::new()
                    } else {
                        format!(" (pid {holder})")
                    },
                    data.display()
                )
            }
            Err(std::fs::TryLockError::Error(e)) => Err(e).context("locking the data directory"),
        }
    }
}

/// A file URI for `path`, with the characters URIs reserve escaped.
fn uri(path: &Path, query: &str) -> String {
    let mut out = String::from("file:");
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push('?');
    out.push_str(query);
    out
}

/// A read-only view of the database that changes no file: the database
/// file alone when it has no WAL; with its WAL and index, read without
/// writing the index; a WAL without an index (a damaged directory) from a
/// copy, since reading it would mean building an index. The directory
/// returned, if any, holds that copy.
fn open_read_only(db: &Path) -> anyhow::Result<(Connection, Option<tempfile::TempDir>)> {
    let wal = db.with_extension("db-wal");
    let shm = db.with_extension("db-shm");
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
    let open = |uri: &str| {
        Connection::open_with_flags(uri, flags).with_context(|| format!("opening {}", db.display()))
    };
    if !wal.exists() {
        return Ok((open(&uri(db, "immutable=1"))?, None));
    }
    if shm.exists() {
        return Ok((open(&uri(db, "readonly_shm=1"))?, None));
    }
    let copy = tempfile::tempdir().context("making a scratch directory for a copy")?;
    let to = copy.path().join("tablix.db");
    std::fs::copy(db, &to).context("copying the database")?;
    std::fs::copy(&wal, to.with_extension("db-wal")).context("copying the WAL")?;
    let conn = Connection::open_with_flags(&to, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .context("opening the copy")?;
    Ok((conn, Some(copy)))
}

fn print(data: &Path, r: &Report) {
    println!(
        "{}: {} inodes, {} entries, {} blocks ({} verified against their checksums, {} written before checksums)",
        data.display(),
        r.inodes,
        r.entries,
        r.blocks,
        r.verified_blocks,
        r.unverified_blocks
    );
    for p in &r.problems {
        println!("problem: {p}");
    }
}

fn check(args: &FsckArgs) -> anyhow::Result<u8> {
    let data: PathBuf = discovery::data_dir(args.data.as_deref())?;
    let db = data.join("tablix.db");
    if !db.exists() {
        bail!("{} holds no tablix database", data.display());
    }
    let lock = NoDaemon::take(&data)?;
    let progress = Progress::new("tablix fsck");
    let report = {
        let (mut conn, _copy) = open_read_only(&db)?;
        progress.watch(&mut conn)?;
        let mut phase = |p: tablix_fs::check::Progress| progress.at(p.phase, p.done, p.total);
        tablix_fs::check::check(
            &conn,
            0,
            Options {
                repair: false,
                verify_data: true,
            },
            &mut phase,
        )
        .map_err(|e| anyhow::anyhow!("checking {}: {e}", db.display()))?
    };
    print(&data, &report);
    if report.is_clean() {
        println!("clean");
        return Ok(CLEAN);
    }
    if args.no_repair {
        println!(
            "{} problems, not repaired (-n; run without it to repair)",
            report.problems.len()
        );
        return Ok(UNCORRECTED);
    }
    let damaged_tree = report.problems.iter().any(|p| p.starts_with("1:"));
    if damaged_tree {
        println!(
            "{} problems; the database's own structure is damaged, which fsck does not repair: restore the data directory from a backup",
            report.problems.len()
        );
        return Ok(UNCORRECTED);
    }
    drop(lock);
    // Data that fails its checksum stays as it is: nothing says what the
    // bytes were.
    let damaged_data = report
        .problems
        .iter()
        .filter(|p| p.starts_with("8:"))
        .count();
    eprintln!("tablix fsck: repairing");
    let store = Store::open(StoreConfig::new(&data)).map_err(|e| match e {
        StoreError::Locked { holder, .. } => anyhow::anyhow!(
            "a tablix daemon{} started while fsck ran; stop it and run fsck again",
            holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
        ),
        e => anyhow::Error::from(e).context(format!("opening {}", data.display())),
    })?;
    let applied = store
        .apply_fs(
            Stamp::now(),
            FsOp::Check {
                repair: true,
                verify_data: false,
            },
        )
        .context("repairing")?;
    store.close()?;
    let repaired = match applied {
        Ok(FsReply::Checked(r)) => r,
        Err(e) => bail!("the repair failed: {e}"),
        Ok(other) => bail!("the repair answered {other:?}, not a check's report"),
    };
    for r in &repaired.repairs {
        println!("repaired: {r}");
    }
    let left = repaired.unrepaired + damaged_data;
    if left == 0 {
        println!("{} problems, all repaired", report.problems.len());
        Ok(CORRECTED)
    } else {
        println!("{} problems, {left} not repaired", report.problems.len());
        Ok(UNCORRECTED)
    }
}
