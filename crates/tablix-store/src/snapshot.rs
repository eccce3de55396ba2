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

/// Copies what `from` sees of its main database to a new file at `to`
/// (replacing any file there) in one step, so one read transaction: the
/// copy is one committed state, and writers are not stopped (WAL). The
/// copy is synced, with its directory, before this returns. Returns the
/// applied state the copy holds.
pub(crate) fn copy(from: &Connection, to: &Path) -> Result<AppliedState, StoreError> {
    match std::fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut dst = Connection::open(to)?;
    one_step(from, &mut dst, "copying the database into a snapshot")?;
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
