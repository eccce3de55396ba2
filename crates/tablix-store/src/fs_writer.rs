//! The file system's writer connection: file-system Commands, in groups
//! from the writer thread or (async mode) applied at once in a pending
//! transaction; the schema migrations; the WAL's flushes and checkpoints.
//!
//! No user SQL ever runs here: foreign keys, triggers and views are off,
//! so nothing a user defined on the schema can stop or extend a
//! file-system operation.

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use tablix_fs::{Errno, FsError, FsOp};
use tablix_vfs::ClockVfs;

use crate::apply_log::AppliedState;
use crate::command::{Stamp, Stamped};
use crate::command_log::{self, CommandLog};
use crate::config::StoreConfig;
use crate::error::{SqliteFailure, StoreError};
use crate::group::{self, BEGIN_WRITE};
use crate::outcome::FsResult;
use crate::schema;
use crate::state_machine::{Grouped, StateMachine};
use crate::wal::WalFile;
use crate::write_point::{WritePoint, WriteProbe};

/// Most WAL pages between automatic checkpoints (64 MiB).
const WAL_AUTOCHECKPOINT_PAGES: u64 = 16384;

/// Bytes one page takes in the WAL: the page and its frame header.
const WAL_FRAME_BYTES: u64 = 4096 + 24;

/// WAL pages between automatic checkpoints under `wal_limit`: at most
/// half the limit, so that the WAL of ordinary writes, which a completed
/// checkpoint lets the next writer reuse from its start, never reaches
/// the limit. Over the limit the WAL is truncated, and a WAL truncated on
/// every cycle is allocated anew on every cycle (measured: single-row
/// sync inserts about a fifth slower than into a reused WAL).
pub(crate) fn autocheckpoint_pages(wal_limit: u64) -> i64 {
    (wal_limit / 2 / WAL_FRAME_BYTES).clamp(1, WAL_AUTOCHECKPOINT_PAGES) as i64
}

/// SQLite's default distance between automatic checkpoints (4 MiB).
const SQL_AUTOCHECKPOINT_PAGES: i64 = 1000;

/// WAL pages between the SQL writer's automatic checkpoints: SQLite's
/// default, and at most half of `wal_limit` as for file-system writes.
/// Single-row transactions gain nothing from the file system's long
/// interval (measured, `tablix bench insert` against the build before
/// the hardening, two alternating rounds: with 64 MiB 0.81-0.92 at four
/// clients, with 4 MiB 1.03-1.04).
pub(crate) fn sql_autocheckpoint_pages(wal_limit: u64) -> i64 {
    autocheckpoint_pages(wal_limit).min(SQL_AUTOCHECKPOINT_PAGES)
}

/// The writer's page cache, in KiB as `PRAGMA cache_size` takes it (negative).
const WRITER_CACHE_KIB: i64 = -65536;

/// Prepared statements kept per connection of the file system (its writer
/// and readers): tablix-fs runs about a hundred distinct statements, the
/// store a few of its own. At rusqlite's default of 16 a mix of operations
/// (Postmark's creates, writes, reads and deletes) evicted them in turn and
/// a sixth of the daemon's time went to parsing them again.
pub(crate) const FS_STATEMENTS: usize = 256;

/// Field order matters: `conn` closes before its clock VFS is unregistered.
pub(crate) struct FsWriter {
    conn: Connection,
    /// Set when SQLite rolled back a pending transaction (e.g. a COMMIT that
    /// hit a full disk): acknowledged file-system Commands are gone, so the
    /// kernel's view no longer matches and no further one is accepted.
    lost: Option<SqliteFailure>,
    /// The last log entry applied in the pending transaction.
    pending_upto: Option<tablix_log::LogId>,
    clock: ClockVfs,
}

impl FsWriter {
    pub(crate) fn open(config: &StoreConfig) -> Result<FsWriter, StoreError> {
        let clock = ClockVfs::register_over(config.vfs.as_deref())
            .map_err(|e| StoreError::Open(e.to_string()))?;
        let path = config.database_path();
        let conn = Connection::open_with_flags_and_vfs(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            clock.name(),
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.set_prepared_statement_cache_capacity(FS_STATEMENTS);
        schema::quick_check(&conn, &path)?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open(format!(
                "{} refused WAL mode (journal_mode is {mode})",
                path.display()
            )));
        }
        // The command log, synced before every commit, makes Commands
        // durable; the state's own commits need not be (the last applied
        // entry it records says where replay resumes).
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // A checkpoint fsyncs the WAL and the database: at SQLite's default
        // (every 1000 pages, 4 MiB) bulk file writes spend most of their time
        // in those syncs. 64 MiB between checkpoints keeps them rare while
        // bounding the WAL.
        conn.pragma_update(
            None,
            "wal_autocheckpoint",
            autocheckpoint_pages(config.wal_limit),
        )?;
        // A WAL that a large transaction grew is cut back to this once a
        // checkpoint has copied it.
        conn.pragma_update(None, "journal_size_limit", config.wal_limit as i64)?;
        // Async mode's pending transaction holds up to a flush interval of
        // file writes. At SQLite's default 2 MiB cache its dirty pages spill
        // into the WAL mid-transaction (a page dirtied again is written
        // again) and each Command's savepoint journals the pages it touches
        // again: measured on a 1 GiB `dd`, the FUSE threads spent most of
        // their time in those two. 64 MiB holds a flush interval of writes.
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)?;
        // Nothing a user defined (a foreign key naming a system table, a
        // trigger or a view from an older version) takes part in the file
        // system's own statements.
        conn.pragma_update(None, "foreign_keys", false)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
        schema::migrate(&conn, &path)?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_VIEW, false)?;
        tablix_pcache::register_stats_table(&conn)?;
        Ok(FsWriter {
            conn,
            lost: None,
            pending_upto: None,
            clock,
        })
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Whether Commands applied by [`FsWriter::apply_pending`] await a commit.
    pub(crate) fn has_pending(&self) -> bool {
        !self.conn.is_autocommit()
    }

    /// Logs one file-system Command and applies it inside the open write
    /// transaction, opening one if needed, without committing: async
    /// mode's fast path. Its log entry is synced, and the transaction
    /// committed, by [`FsWriter::commit_pending`]. A Command the node
    /// fails under is taken back from the log and rolled back alone (its
    /// savepoint); the pending ones stay. File-system Commands never end
    /// the transaction themselves.
    pub(crate) fn apply_pending(
        &mut self,
        log: &mut CommandLog,
        item: &Stamped<FsOp>,
    ) -> Result<FsResult, StoreError> {
        if let Some(why) = &self.lost {
            return Err(StoreError::PendingLost(why.clone()));
        }
        log.running()?;
        let id = log.append_fs(item)?;
        let had_pending = !self.conn.is_autocommit();
        if !had_pending && let Err(e) = self.pending_sql(BEGIN_WRITE) {
            log.unlog_or_stop(id.index, &e);
            return Err(e);
        }
        let r = self.pending_savepoint(item);
        if self.conn.is_autocommit() {
            // SQLite ended the transaction itself (a full disk while
            // spilling pages): this Command did not happen, and what was
            // pending is gone from the state, though not from the log.
            let why = match &r {
                Err(StoreError::Failed(f) | StoreError::Commit(f)) => f.clone(),
                Err(e) => SqliteFailure::without_code(e.to_string()),
                Ok(_) => SqliteFailure::without_code("SQLite ended the transaction"),
            };
            let e = StoreError::Failed(why.clone());
            log.unlog_or_stop(id.index, &e);
            if had_pending {
                return Err(self.pending_gone(log, why));
            }
            return Err(e);
        }
        match r {
            Ok(reply) => {
                self.pending_upto = Some(id);
                log.at(WritePoint::PendingApplied);
                Ok(reply)
            }
            Err(e) => {
                log.unlog_or_stop(id.index, &e);
                Err(e)
            }
        }
    }

    fn pending_savepoint(&self, item: &Stamped<FsOp>) -> Result<FsResult, StoreError> {
        self.pending_sql("SAVEPOINT tablix_command")?;
        let r = self.apply(item.stamp, &item.command, &());
        if r.as_ref().map_or(true, Self::refused) {
            self.pending_sql("ROLLBACK TO tablix_command")?;
        }
        self.pending_sql("RELEASE tablix_command")?;
        r
    }

    /// SQLite rolled back acknowledged pending Commands. Their entries are
    /// in the log: once it is synced they are not lost, and the state
    /// machine stops until a restart applies them. If the log cannot be
    /// synced either, they are lost, and every later caller is told.
    fn pending_gone(&mut self, log: &mut CommandLog, why: SqliteFailure) -> StoreError {
        self.pending_upto = None;
        match log.sync() {
            Ok(()) => log.stop(why),
            Err(e) => {
                let why = SqliteFailure {
                    code: why.code,
                    message: format!("{why}; syncing the command log failed too: {e}"),
                };
                self.mark_lost(why)
            }
        }
    }

    fn mark_lost(&mut self, why: SqliteFailure) -> StoreError {
        tracing::error!(
            "file-system changes acknowledged since the last flush were lost: {why}; refusing further changes until restart"
        );
        self.pending_upto = None;
        self.lost = Some(why.clone());
        StoreError::PendingLost(why)
    }

    /// Commits what [`FsWriter::apply_pending`] left open: first its log
    /// entries are synced (the state never holds what its log lacks), then
    /// the transaction records the last of them and commits. If the log
    /// cannot be synced, the pending Commands cannot become durable: they
    /// are rolled back and declared lost. If COMMIT fails the transaction
    /// stays open if SQLite kept it, to be retried; if SQLite rolled it
    /// back, the state machine stops.
    pub(crate) fn commit_pending(&mut self, log: &mut CommandLog) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        if let Err(e) = log.sync() {
            let _ = self.conn.execute_batch("ROLLBACK");
            return Err(self.mark_lost(crate::command_log::failure_of(&e)));
        }
        log.at(WritePoint::FlushSynced);
        if let Some(id) = self.pending_upto
            && let Err(e) = command_log::record_applied(&self.conn, id)
        {
            return Err(StoreError::Commit(SqliteFailure::of(&e)));
        }
        match self.pending_sql("COMMIT") {
            Ok(()) => {
                if let Some(id) = self.pending_upto.take() {
                    log.applied_to(id);
                }
                Ok(())
            }
            Err(StoreError::Commit(f)) if self.conn.is_autocommit() => {
                Err(self.pending_gone(log, f))
            }
            Err(e) => Err(e),
        }
    }

    /// Savepoint control inside the pending transaction: a failure is
    /// reported without rolling back Commands already acknowledged.
    fn pending_sql(&self, sql: &str) -> Result<(), StoreError> {
        group::control(&self.conn, sql).map_err(|e| StoreError::Commit(SqliteFailure::of(&e)))
    }

    /// Applies file-system Commands as one group commit, inside whose
    /// transaction `record(conn, n)` records where the log stands once the
    /// first `n` are applied.
    pub(crate) fn apply_group(
        &self,
        items: &[&Stamped<FsOp>],
        record: impl Fn(&Connection, usize) -> rusqlite::Result<()>,
        probe: &WriteProbe,
    ) -> Result<Vec<Result<FsResult, StoreError>>, StoreError> {
        let items: Vec<(&Stamped<FsOp>, &())> = items.iter().map(|i| (*i, &())).collect();
        group::commit(self, &items, usize::MAX, |conn, n| {
            record(conn, n)?;
            probe.at(WritePoint::Applied);
            Ok(())
        })
    }

    /// Replaces the whole state with the snapshot at `path` (see
    /// `snapshot::install`) and makes it durable before returning: the
    /// log behind the snapshot may be purged next.
    pub(crate) fn install(&mut self, path: &std::path::Path) -> Result<AppliedState, StoreError> {
        let state = crate::snapshot::install(path, &mut self.conn)?;
        self.sync_wal()?;
        Ok(state)
    }

    /// Rewrites the database compactly (VACUUM), outside any transaction;
    /// the write turn is the caller's.
    pub(crate) fn vacuum(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch("VACUUM")
            .map_err(|e| StoreError::Failed(SqliteFailure::of(&e)))
    }

    /// Writes the WAL to stable storage (async mode's bounded flush),
    /// through SQLite's own WAL handle so every VFS layer sees the sync.
    pub(crate) fn sync_wal(&self) -> Result<(), StoreError> {
        tablix_vfs::sync_journal(&self.conn).map_err(|rc| {
            StoreError::Failed(SqliteFailure::with_code(rc, "syncing the WAL failed"))
        })
    }

    /// Folds the WAL back into the database and truncates it.
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// Tries to fold the WAL back and cut it to `limit` bytes without
    /// waiting for readers: returns whether the whole WAL was copied and
    /// cut. The WAL restarts rather than being truncated to nothing, so the
    /// next writes reuse its first `limit` bytes, whose pages the kernel
    /// still holds; a WAL allocated anew on every cycle has every partly
    /// written page zeroed first (measured: 7-10% of the daemon's profile
    /// during Bonnie++'s rewrite). Call with the write turn held: no
    /// writer may append while the file is cut.
    pub(crate) fn try_cut_wal(&self, wal: &WalFile, limit: u64) -> Result<bool, StoreError> {
        self.conn.busy_timeout(std::time::Duration::ZERO)?;
        let r = self
            .conn
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0));
        self.conn.busy_timeout(std::time::Duration::from_secs(10))?;
        match r {
            Ok(0) => {}
            Ok(_) => return Ok(false),
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                return Ok(false);
            }
            Err(e) => return Err(e.into()),
        }
        // Every frame is in the database and no reader uses one: a reader
        // starting now reads the database alone, and the next writer
        // starts the WAL over from its first frame.
        if wal.bytes() > limit {
            std::fs::OpenOptions::new()
                .write(true)
                .open(wal.path())?
                .set_len(limit)?;
        }
        Ok(true)
    }
}

/// The file system's domain: `tablix_fs::apply` on the file system's
/// writer connection, with SQL's clock set to the Command's stamp.
impl StateMachine for FsWriter {
    type Op = FsOp;
    type Reply = FsResult;
    type Bounds = ();

    fn connection(&self) -> &Connection {
        &self.conn
    }

    fn apply(&self, stamp: Stamp, op: &FsOp, _: &()) -> Result<FsResult, StoreError> {
        self.clock.set_unix_nanos(stamp.unix_nanos);
        match tablix_fs::apply(&self.conn, stamp.unix_nanos, op) {
            Ok(reply) => Ok(Ok(reply)),
            Err(FsError::Errno(e)) => Ok(Err(e)),
            Err(FsError::Sqlite(e)) => Err(StoreError::Failed(SqliteFailure::of(&e))),
        }
    }

    fn refused(reply: &FsResult) -> bool {
        reply.is_err()
    }
}

impl Grouped for FsWriter {
    /// A file-system operation never ends its transaction itself (SQLite
    /// failing under it is `StoreError::Failed`); if one did, it did not
    /// happen, which the kernel hears as an I/O error.
    fn ended(_: FsResult) -> FsResult {
        Err(Errno::EIO)
    }
}
