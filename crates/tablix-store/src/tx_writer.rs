//! The writer of interactive transactions' commits: each `TxCommit` is a
//! changeset, checked against the state and applied whole, or refused
//! whole as a conflict, in groups on a connection of its own.
//!
//! No user SQL runs here. Triggers are off and foreign-key actions do not
//! run: the changeset already holds what they did where the transaction
//! ran; constraints and foreign keys are still checked.

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use serde::{Deserialize, Serialize};
use tablix_vfs::{ApplyError, ConflictKind};

use crate::changeset;
use crate::command::{Stamp, Stamped, TxCommit};
use crate::config::StoreConfig;
use crate::error::{SqliteFailure, StoreError};
use crate::group;
use crate::state_machine::{Grouped, StateMachine};
use crate::write_point::{WritePoint, WriteProbe};

/// What committing an interactive transaction answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TxOutcome {
    /// Every change applied; how many rows changed.
    Committed { rows: u64 },
    /// Rows it changed were changed by another since its snapshot (or
    /// its changes now break a constraint): nothing of it was applied,
    /// and running it again may succeed.
    Conflict(String),
    /// It could not be applied for a reason of its own (a malformed
    /// changeset): nothing of it was applied.
    Refused(String),
}

impl TxOutcome {
    pub fn is_committed(&self) -> bool {
        matches!(self, TxOutcome::Committed { .. })
    }
}

/// The transaction writer's page cache, in KiB as `PRAGMA cache_size`
/// takes it (negative): 64 MiB, as the file system's writer.
const TX_WRITER_CACHE_KIB: i64 = -65536;

pub(crate) struct TxWriter {
    conn: Connection,
    /// Whether some table's foreign key has an action, by the schema
    /// version it was found for.
    fk_actions: std::cell::Cell<Option<(i64, bool)>>,
    /// Tables as changesets see them, for the current schema.
    shapes: std::cell::RefCell<changeset::ShapeCache>,
}

/// The message of a conflict with a table's shape.
fn shape_conflict(why: &str) -> String {
    format!(
        "conflict: {why} since this transaction's snapshot; nothing of it was applied, run the transaction again"
    )
}

/// The message of a conflict.
fn conflict(kind: ConflictKind, table: &str) -> String {
    let what = match kind {
        ConflictKind::Data => format!(
            "a row of {table} that this transaction changed was changed by another transaction since its snapshot"
        ),
        ConflictKind::NotFound => format!(
            "a row of {table} that this transaction changed was deleted by another transaction since its snapshot"
        ),
        ConflictKind::Exists => format!(
            "a row this transaction inserted into {table} has a key another transaction took since its snapshot"
        ),
        ConflictKind::Constraint => format!(
            "this transaction's changes to {table} break a constraint together with what was committed since its snapshot"
        ),
        ConflictKind::ForeignKey => "this transaction's changes break a foreign key together with what was committed since its snapshot".to_string(),
    };
    format!("conflict: {what}; nothing of it was applied, run the transaction again")
}

impl TxWriter {
    pub(crate) fn open(config: &StoreConfig) -> Result<TxWriter, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let path = config.database_path();
        let conn = match &config.vfs {
            Some(v) => Connection::open_with_flags_and_vfs(&path, flags, v.as_str())?,
            None => Connection::open_with_flags(&path, flags)?,
        };
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        crate::sandbox::writer_pragmas(&conn, config)?;
        conn.pragma_update(None, "foreign_keys", true)?;
        // A commit's savepoint journals every page it changes: at most
        // --tx-max-bytes, kept in memory rather than spilled to a
        // temporary file on every commit. No user SQL runs here, so
        // nothing else is temporary.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        // Every commit reads the pages its rows are on, and the view that
        // ran it read them moments before: a cache the size of the file
        // system writer's keeps them.
        conn.pragma_update(None, "cache_size", TX_WRITER_CACHE_KIB)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
        Ok(TxWriter {
            conn,
            fk_actions: std::cell::Cell::new(None),
            shapes: std::cell::RefCell::new(changeset::ShapeCache::default()),
        })
    }

    /// Whether a foreign key of some table has an action other than NO
    /// ACTION (which must not run again when a changeset that holds its
    /// effects is applied), as of the current schema.
    fn fk_actions(&self) -> rusqlite::Result<bool> {
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA schema_version")?
            .query_row([], |r| r.get(0))?;
        if let Some((v, any)) = self.fk_actions.get()
            && v == version
        {
            return Ok(any);
        }
        let any: bool = self
            .conn
            .prepare(
                "SELECT EXISTS (SELECT 1 FROM main.sqlite_schema AS s, pragma_foreign_key_list(s.name, 'main') AS f
                  WHERE s.type = 'table'
                    AND (upper(f.on_delete) <> 'NO ACTION' OR upper(f.on_update) <> 'NO ACTION'))",
            )?
            .query_row([], |r| r.get(0))?;
        self.fk_actions.set(Some((version, any)));
        Ok(any)
    }

    /// Applies commits as one group commit (see [`group::commit`]);
    /// `record(conn, n)` records where the log stands once the first `n`
    /// are applied.
    pub(crate) fn apply_group(
        &self,
        items: &[&Stamped<TxCommit>],
        record: impl Fn(&Connection, usize) -> rusqlite::Result<()>,
        probe: &WriteProbe,
    ) -> Result<Vec<Result<TxOutcome, StoreError>>, StoreError> {
        let items: Vec<(&Stamped<TxCommit>, &())> = items.iter().map(|i| (*i, &())).collect();
        group::commit(self, &items, usize::MAX, |conn, n| {
            record(conn, n)?;
            probe.at(WritePoint::Applied);
            Ok(())
        })
    }
}

/// Interactive transactions' commits: a changeset, validated by value and
/// applied whole.
impl StateMachine for TxWriter {
    type Op = TxCommit;
    type Reply = TxOutcome;
    type Bounds = ();

    fn connection(&self) -> &Connection {
        &self.conn
    }

    fn apply(&self, _stamp: Stamp, op: &TxCommit, _: &()) -> Result<TxOutcome, StoreError> {
        let tables = match changeset::parse(&op.changeset) {
            Ok(t) => t,
            Err(e) => return Ok(TxOutcome::Refused(e.to_string())),
        };
        let rows = tables.iter().map(|t| t.changes.len() as u64).sum();
        let failed = |e: &rusqlite::Error| -> Result<TxOutcome, StoreError> {
            let failure = SqliteFailure {
                code: e.sqlite_error().map(|f| f.extended_code),
                message: format!(
                    "applying a transaction's changes: {}",
                    crate::policy::error_message(e)
                ),
            };
            if failure.is_node_local() {
                Err(StoreError::Failed(failure))
            } else {
                Ok(TxOutcome::Refused(failure.message))
            }
        };
        let fk_actions = match self.fk_actions() {
            Ok(a) => a,
            Err(e) => return failed(&e),
        };
        if fk_actions {
            // Foreign-key actions must not run again: SQLite's own apply
            // can turn them off (at the price of re-preparing every
            // statement of this connection), after the same whole-row
            // check.
            match changeset::changed_rows(&self.conn, &tables) {
                Ok(None) => {}
                Ok(Some((table, gone))) => {
                    let kind = if gone {
                        ConflictKind::NotFound
                    } else {
                        ConflictKind::Data
                    };
                    return Ok(TxOutcome::Conflict(conflict(kind, &table)));
                }
                Err(changeset::Mismatch::Shape(why)) => {
                    return Ok(TxOutcome::Conflict(shape_conflict(&why)));
                }
                Err(changeset::Mismatch::Failed(e)) => return failed(&e),
            }
            return match tablix_vfs::apply_changeset(&self.conn, &op.changeset, true) {
                Ok(()) => Ok(TxOutcome::Committed { rows }),
                Err(ApplyError::Conflict { kind, table }) => {
                    Ok(TxOutcome::Conflict(conflict(kind, &table)))
                }
                Err(ApplyError::Sqlite { code, message }) => {
                    let failure = SqliteFailure {
                        code: Some(code),
                        message: format!("applying a transaction's changes: {message}"),
                    };
                    if failure.is_node_local() {
                        Err(StoreError::Failed(failure))
                    } else {
                        Ok(TxOutcome::Refused(failure.message))
                    }
                }
            };
        }
        let mut shapes = self.shapes.borrow_mut();
        if let Err(e) = shapes.check_version(&self.conn) {
            return failed(&e);
        }
        match changeset::apply(&self.conn, &tables, &mut shapes) {
            Ok(()) => Ok(TxOutcome::Committed { rows }),
            Err(changeset::Refusal::Conflict(kind, table)) => {
                Ok(TxOutcome::Conflict(conflict(kind, &table)))
            }
            Err(changeset::Refusal::Shape(why)) => Ok(TxOutcome::Conflict(shape_conflict(&why))),
            Err(changeset::Refusal::Failed(e)) => failed(&e),
        }
    }

    fn refused(reply: &TxOutcome) -> bool {
        !reply.is_committed()
    }
}

impl Grouped for TxWriter {
    fn ended(_reply: TxOutcome) -> TxOutcome {
        TxOutcome::Refused("applying the transaction's changes ended the whole write transaction; nothing of it was applied".into())
    }
}
