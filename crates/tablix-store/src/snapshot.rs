//! Snapshots of the persistent database: a consistent copy taken from a
//! reader while writes go on, and its installation in place of the whole
//! state. Replication builds them to send to lagging and new nodes.
//!
//! A snapshot is a self-contained SQLite file (rollback-journal mode, no
//! WAL beside it) that names, in its `tablix_meta`, the last log entry it
//! holds and the membership recorded with it.

use std::path::Path;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::{Connection, OpenFlags};

use crate::apply_log::{self, AppliedState};
use crate::error::StoreError;
use crate::schema::{self, APPLICATION_ID, LATEST_SCHEMA_VERSION};

/// Pages one backup step copies into a snapshot.
const STEP_PAGES: i32 = 1024;

/// Bytes of a snapshot written between two syncs of its file while it is
/// copied; after each sync the copy pauses three times as long as the
/// sync took (at most `MOST_IDLE`), for the log syncs of the node's
/// writes. Written whole and synced once at the end, a copy of a database
/// of gigabytes left that much for the disk to write at once, and every
/// log sync waited behind it (the store's DESIGN.md has the figures).
const SYNC_EVERY_BYTES: u64 = 16 << 20;

/// The longest pause after one sync of a snapshot being copied.
const MOST_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Copies what `from` sees of its main database to a new file at `to`
/// (replacing any file there) within one read transaction: the copy is
/// one committed state, and writers are not stopped (WAL). It is copied
/// in steps and synced as it grows, so that the disk is never handed the
/// whole of it at once; the copy is synced, with its directory, before
/// this returns. Returns the applied state the copy holds.
pub(crate) fn copy(from: &Connection, to: &Path) -> Result<AppliedState, StoreError> {
    match std::fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut dst = Connection::open(to)?;
    // A copy cut short is thrown away whole (its name is the builder's),
    // so its own journal and syncs would buy nothing.
    dst.query_row("PRAGMA journal_mode=OFF", [], |_| Ok(()))?;
    dst.pragma_update(None, "synchronous", "OFF")?;
    {
        let _read = ReadTransaction::begin(from)?;
        let page: i64 = from.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let step_bytes = u64::try_from(page).unwrap_or(0) * STEP_PAGES as u64;
        let file = std::fs::File::open(to)?;
        let backup = Backup::new(from, &mut dst)?;
        let mut unsynced = 0u64;
        loop {
            let step = backup.step(STEP_PAGES)?;
            unsynced += step_bytes;
            match step {
                StepResult::Done => break,
                StepResult::More => {}
                other => {
                    return Err(StoreError::Busy(format!(
                        "copying the database into a snapshot: SQLite answered {other:?} within the copy's own read transaction"
                    )));
                }
            }
            if unsynced >= SYNC_EVERY_BYTES {
                // The disk is left to the node's log syncs for three
                // times as long as this sync took.
                let began = std::time::Instant::now();
                file.sync_data()?;
                std::thread::sleep((began.elapsed() * 3).min(MOST_IDLE));
                unsynced = 0;
            }
        }
    }
    let mode: String = dst.query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("delete") {
        return Err(StoreError::Open(format!(
            "the snapshot {} stayed in journal mode {mode}",
            to.display()
        )));
    }
    let state = apply_log::applied_state(&dst)?;
    dst.close().map_err(|(_, e)| e)?;
    std::fs::File::open(to)?.sync_all()?;
    if let Some(dir) = to.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(state)
}

/// A read transaction held open on a connection until dropped, so that
/// every backup step of a copy reads the same committed state.
struct ReadTransaction<'a>(&'a Connection);

impl<'a> ReadTransaction<'a> {
    fn begin(conn: &'a Connection) -> Result<ReadTransaction<'a>, StoreError> {
        conn.execute_batch("BEGIN")?;
        let held = ReadTransaction(conn);
        // A deferred transaction takes its snapshot at its first read.
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?;
        Ok(held)
    }
}

impl Drop for ReadTransaction<'_> {
    fn drop(&mut self) {
        // Nothing was written in it: ending it cannot lose anything.
        let _ = self.0.execute_batch("ROLLBACK");
    }
}

/// Replaces the whole main database of `to` (the file system's writer
/// connection) with the snapshot at `from`, in one transaction: readers
/// see the old state or the new one, never a mix. The snapshot must be a
/// sound tablix database no newer than this build; an older one is
/// migrated after. Returns the applied state it holds.
pub(crate) fn install(from: &Path, to: &mut Connection) -> Result<AppliedState, StoreError> {
    let src = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let app_id: i64 = src.query_row("PRAGMA main.application_id", [], |r| r.get(0))?;
    if app_id != APPLICATION_ID {
        return Err(StoreError::NotTablix {
            path: from.to_path_buf(),
            found: app_id,
        });
    }
    let version: u32 = src.query_row("PRAGMA main.user_version", [], |r| r.get(0))?;
    if version > LATEST_SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: from.to_path_buf(),
            found: version,
            supported: LATEST_SCHEMA_VERSION,
        });
    }
    schema::quick_check(&src, from)?;
    let state = apply_log::applied_state(&src)?;
    one_step(&src, to, "installing a snapshot")?;
    drop(src);
    schema::migrate(to, from)?;
    Ok(state)
}

/// Copies all of `from`'s main database over `to`'s in one backup step.
fn one_step(from: &Connection, to: &mut Connection, what: &str) -> Result<(), StoreError> {
    let backup = Backup::new(from, to)?;
    match backup.step(-1)? {
        StepResult::Done => Ok(()),
        other => Err(StoreError::Busy(format!(
            "{what}: SQLite answered {other:?} where one step copies every page"
        ))),
    }
}
