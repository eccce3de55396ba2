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

/// What fsck finds in the command log, against the state's last applied
/// entry.
struct LogCheck {
    /// Problems the repair cuts away (damage in the log's middle).
    repairable: Vec<String>,
    /// What the repair does about them.
    repairs: Vec<String>,
    /// Problems it cannot repair (entries missing from the log).
    unrepairable: Vec<String>,
}

impl LogCheck {
    fn is_clean(&self) -> bool {
        self.repairable.is_empty() && self.unrepairable.is_empty()
    }
}

fn check_log(data: &Path, conn: &Connection) -> anyhow::Result<LogCheck> {
    let dir = StoreConfig::new(data).log_dir();
    let log = tablix_log::Log::inspect(&dir)
        .map_err(|e| anyhow::anyhow!("reading the command log in {}: {e}", dir.display()))?;
    let a = tablix_store::applied_entry(conn)
        .context("reading the state's last applied entry")?
        .map_or(0, |a| a.index);
    let last = log.last.map_or(0, |l| l.index);
    let held = if last >= log.first_index() {
        format!("entries {}..={last}", log.first_index())
    } else {
        "no entries".to_string()
    };
    // Entries past damage are not counted: they cannot be applied.
    let pending = last.saturating_sub(a);
    println!(
        "command log: {held} in {} segments ({} bytes of records); the state holds entries up to {a}{}",
        log.segments,
        log.bytes,
        if pending > 0 {
            format!("; {pending} to apply at the next start")
        } else {
            String::new()
        }
    );
    if let Some((path, offset)) = &log.torn_tail {
        println!(
            "command log: ends in a torn write at byte {offset} of {} (never synced, so never acknowledged; the next start cuts it)",
            path.display()
        );
    }
    let mut out = LogCheck {
        repairable: Vec::new(),
        repairs: Vec::new(),
        unrepairable: Vec::new(),
    };
    match &log.damage {
        Some(d) if d.through <= a => println!(
            "command log: {d}; the state holds all of those entries, so the next start cuts them and nothing is lost"
        ),
        Some(d) => {
            let lost = format!("entries {}..={}", d.index.max(a + 1), d.through);
            out.repairable.push(format!(
                "command log: {d}; the state holds entries up to {a}, so {lost} are lost if the log is cut there"
            ));
            out.repairs.push(format!(
                "cut the command log before entry {} ({lost} are lost; {} entries before it are applied)",
                d.index,
                pending
            ));
        }
        None => {}
    }
    let missing_to = log.first_index().saturating_sub(1);
    if missing_to > a && log.damage.is_none() {
        out.unrepairable.push(format!(
            "command log: starts at entry {}, but the state holds entries only up to {a}: entries {}..={missing_to} are missing",
            log.first_index(),
            a + 1
        ));
    }
    Ok(out)
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
    let cluster_node = data.join(tablix_raft::LOG_DIR).exists();
    let progress = Progress::new("tablix fsck");
    let (report, log) = {
        let (mut conn, _copy) = open_read_only(&db)?;
        let log = if cluster_node {
            println!(
                "a node of a cluster: its log is replication's ({}), which the cluster checks",
                data.join(tablix_raft::LOG_DIR).display()
            );
            LogCheck {
                repairable: Vec::new(),
                repairs: Vec::new(),
                unrepairable: Vec::new(),
            }
        } else {
            check_log(&data, &conn)?
        };
        progress.watch(&mut conn)?;
        let mut phase = |p: tablix_fs::check::Progress| progress.at(p.phase, p.done, p.total);
        let report = tablix_fs::check::check(
            &conn,
            0,
            Options {
                repair: false,
                verify_data: true,
            },
            &mut phase,
        )
        .map_err(|e| anyhow::anyhow!("checking {}: {e}", db.display()))?;
        (report, log)
    };
    print(&data, &report);
    for p in log.repairable.iter().chain(&log.unrepairable) {
        println!("problem: {p}");
    }
    let problems = report.problems.len() + log.repairable.len() + log.unrepairable.len();
    if report.is_clean() && log.is_clean() {
        println!("clean");
        return Ok(CLEAN);
    }
    if args.no_repair {
        println!("{problems} problems, not repaired (-n; run without it to repair)");
        return Ok(UNCORRECTED);
    }
    if cluster_node {
        println!(
            "{problems} problems, not repaired: a cluster node's state changes only through the cluster's log; remove the node from the cluster, move {} aside, and add the node back (a snapshot brings it up)",
            data.display()
        );
        return Ok(UNCORRECTED);
    }
    let damaged_tree = report.problems.iter().any(|p| p.starts_with("1:"));
    if damaged_tree {
        println!(
            "{problems} problems; the database's own structure is damaged, which fsck does not repair: restore the data directory from a backup"
        );
        return Ok(UNCORRECTED);
    }
    if !log.unrepairable.is_empty() {
        println!(
            "{problems} problems; entries missing from the command log cannot be made up: restore the data directory from a backup, or move {} aside to start from the state as it is",
            StoreConfig::new(&data).log_dir().display()
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
    let mut config = StoreConfig::new(&data);
    // The damaged entries and every one after them are cut: the state
    // cannot take them, and the rest of the log is applied at this open.
    config.discard_damaged_log = !log.repairable.is_empty();
    let store = Store::open(config).map_err(|e| match e {
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
    for r in &log.repairs {
        println!("repaired: {r}");
    }
    for r in &repaired.repairs {
        println!("repaired: {r}");
    }
    let left = repaired.unrepaired + damaged_data;
    if left == 0 {
        println!("{problems} problems, all repaired");
        Ok(CORRECTED)
    } else {
        println!("{problems} problems, {left} not repaired");
        Ok(UNCORRECTED)
    }
}
