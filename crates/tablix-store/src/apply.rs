//! Deterministic application of Commands, alone or as a group commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::functions::FunctionFlags;
use rusqlite::{Connection, OpenFlags, params};
use tablix_vfs::ClockVfs;

use crate::command::{Command, Stamp, Stamped};
use crate::config::{Durability, StoreConfig};
use crate::error::StoreError;
use crate::exec;
use crate::outcome::Applied;
use crate::policy::{Policy, error_message};
use crate::schema;

/// WAL pages between automatic checkpoints.
const WAL_AUTOCHECKPOINT_PAGES: i64 = 16384;

/// The writer's page cache, in KiB as `PRAGMA cache_size` takes it (negative).
const WRITER_CACHE_KIB: i64 = -65536;

/// The writer connection and everything needed to apply Commands on it.
///
/// Field order matters: `conn` is declared before `clock`, so it is closed
/// before the VFS it was opened with is unregistered.
pub(crate) struct Applier {
    conn: Connection,
    /// Set when SQLite rolled back a pending transaction (e.g. a COMMIT that
    /// hit a full disk): acknowledged file-system Commands are gone, so the
    /// kernel's view no longer matches and no further one is accepted.
    lost: Option<String>,
    policy: Policy,
    /// State of the generator behind `random()`, reseeded per Command.
    rng: Arc<AtomicU64>,
    clock: ClockVfs,
}

/// How the writer begins a transaction. Deferred, not IMMEDIATE: this
/// connection is the only writer of the persistent database, so its first
/// write can never find another, and IMMEDIATE would also take RESERVED on
/// the attached memory database, whose write-intent gate belongs to the
/// memory database's own writers.
const BEGIN_WRITE: &str = "BEGIN";

/// Attaches the memory database `mem_uri` as `mem`, as every store
/// connection does, so that one query can join it with the main database.
pub(crate) fn attach_memory(conn: &Connection, mem_uri: &str) -> rusqlite::Result<()> {
    conn.execute("ATTACH DATABASE ?1 AS mem", params![mem_uri])?;
    Ok(())
}

impl Applier {
    pub(crate) fn open(config: &StoreConfig, mem_uri: &str) -> Result<Applier, StoreError> {
        let clock = ClockVfs::register_over(config.vfs.as_deref())
            .map_err(|e| StoreError::Open(e.to_string()))?;
        let path = config.database_path();
        let mut conn = Connection::open_with_flags_and_vfs(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            clock.name(),
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Open(format!(
                "{} refused WAL mode (journal_mode is {mode})",
                path.display()
            )));
        }
        let sync = match config.durability {
            Durability::Sync => "FULL",
            Durability::Async => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        // A checkpoint fsyncs the WAL and the database: at SQLite's default
        // (every 1000 pages, 4 MiB) bulk file writes spend most of their time
        // in those syncs. 64 MiB between checkpoints keeps them rare while
        // bounding the WAL.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
        // Async mode's pending transaction holds up to a flush interval of
        // file writes. At SQLite's default 2 MiB cache its dirty pages spill
        // into the WAL mid-transaction (a page dirtied again is written
        // again) and each Command's savepoint journals the pages it touches
        // again: measured on a 1 GiB `dd`, the FUSE threads spent most of
        // their time in those two. 64 MiB holds a flush interval of writes.
        // (Temporary storage stays on disk: in memory, statement journals
        // would cost a few percent less, but a user's CREATE INDEX on a
        // large table would sort in the daemon's memory.)
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)?;
        schema::migrate(&conn, &path)?;
        attach_memory(&conn, mem_uri)?;
        tablix_pcache::register_stats_table(&conn)?;
        let rng = Arc::new(AtomicU64::new(0));
        register_random(&conn, &rng)?;
        let policy = Policy::install(&mut conn, false)?;
        Ok(Applier {
            conn,
            lost: None,
            policy,
            rng,
            clock,
        })
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Whether Commands applied by [`Applier::apply_pending`] await a commit.
    pub(crate) fn has_pending(&self) -> bool {
        !self.conn.is_autocommit()
    }

    /// Applies one file-system Command inside the open write transaction,
    /// opening one if needed, without committing: async mode's fast path.
    /// A failing Command is rolled back alone (its savepoint); the pending
    /// ones stay. Only file-system Commands come here: they never end the
    /// transaction themselves, unlike SQL with ON CONFLICT ROLLBACK.
    pub(crate) fn apply_pending(&mut self, item: &Stamped) -> Result<Applied, StoreError> {
        debug_assert!(matches!(item.command, Command::Fs(_)));
        if let Some(why) = &self.lost {
            return Err(StoreError::PendingLost(why.clone()));
        }
        let had_pending = !self.conn.is_autocommit();
        if !had_pending {
            self.batch_sql(BEGIN_WRITE)?;
        }
        let r = self.pending_savepoint(item);
        if self.conn.is_autocommit() {
            // SQLite ended the transaction itself (a full disk while
            // spilling pages): whatever was pending is gone.
            let why = match &r {
                Err(e) => e.to_string(),
                Ok(a) => {
                    a.fs.as_ref()
                        .and_then(|f| f.as_ref().err())
                        .map_or_else(|| "the transaction ended".to_string(), |e| e.to_string())
                }
            };
            if had_pending {
                return Err(self.mark_lost(why));
            }
        }
        r
    }

    fn pending_savepoint(&self, item: &Stamped) -> Result<Applied, StoreError> {
        self.pending_sql("SAVEPOINT tablix_command")?;
        let r = self.apply(item);
        if r.as_ref().map_or(true, |a| a.rolled_back) {
            self.pending_sql("ROLLBACK TO tablix_command")?;
        }
        self.pending_sql("RELEASE tablix_command")?;
        r
    }

    fn mark_lost(&mut self, why: String) -> StoreError {
        tracing::error!(
            "file-system changes acknowledged since the last flush were lost: {why}; refusing further changes until restart"
        );
        self.lost = Some(why.clone());
        StoreError::PendingLost(why)
    }

    /// Commits what [`Applier::apply_pending`] left open. On failure the
    /// transaction stays open if SQLite kept it, to be retried; if SQLite
    /// rolled it back, the store refuses further file-system changes.
    pub(crate) fn commit_pending(&mut self) -> Result<(), StoreError> {
        if self.conn.is_autocommit() {
            return Ok(());
        }
        match self.pending_sql("COMMIT") {
            Ok(()) => Ok(()),
            Err(e) if self.conn.is_autocommit() => Err(self.mark_lost(e.to_string())),
            Err(e) => Err(e),
        }
    }

    /// Savepoint control inside the pending transaction: a failure is
    /// reported without rolling back Commands already acknowledged.
    fn pending_sql(&self, sql: &str) -> Result<(), StoreError> {
        self.control(sql)
            .map_err(|e| StoreError::Commit(error_message(&e)))
    }

    /// Runs one of the writer's own transaction-control statements, kept
    /// prepared: every Command runs two or three of them. (User SQL is
    /// never prepared through the cache, so it cannot meet these.)
    fn control(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    /// Puts the connection in the state every Command starts from: the
    /// Command's time and seed, and no remembered insert id.
    fn set_stamp(&self, stamp: Stamp) {
        self.clock.set_unix_nanos(stamp.unix_nanos);
        self.rng.store(stamp.seed, Ordering::Relaxed);
        tablix_vfs::set_last_insert_rowid(&self.conn, 0);
    }

    /// Applies one Command's body; the caller owns the surrounding
    /// transaction and savepoint.
    fn apply(&self, item: &Stamped) -> Result<Applied, StoreError> {
        self.set_stamp(item.stamp);
        match &item.command {
            Command::Sql {
                statements,
                transaction,
            } => {
                self.policy.set_enforcing(true);
                let mut out = Applied::default();
                for st in statements {
                    let outcome = exec::run(&self.conn, &self.policy, st);
                    let failed = outcome.result.is_error();
                    out.statements.push(outcome);
                    if failed && *transaction {
                        out.rolled_back = true;
                        break;
                    }
                    if self.conn.is_autocommit() {
                        // The statement ended the enclosing transaction
                        // (ON CONFLICT ROLLBACK); the batch restarts without it.
                        out.rolled_back = true;
                        break;
                    }
                }
                self.policy.set_enforcing(false);
                Ok(out)
            }
            Command::Fs(op) => {
                let result = tablix_fs::apply(&self.conn, item.stamp.unix_nanos, op);
                Ok(Applied {
                    rolled_back: result.is_err(),
                    fs: Some(result),
                    ..Applied::default()
                })
            }
            Command::SetDaemon(_) | Command::Pipe(_) | Command::Proc(_) => Err(StoreError::Apply(
                "a memory-database Command reached the writer".into(),
            )),
        }
    }

    /// Applies `items` in one SQLite transaction, each inside its own
    /// SAVEPOINT, and commits. A Command that fails is rolled back alone and
    /// gets its own error; the others commit. A Command whose statement ends
    /// the whole transaction (ON CONFLICT ROLLBACK, RAISE(ROLLBACK)) is
    /// excluded and the group is applied again without it, which leaves the
    /// same state as applying the Commands one by one.
    ///
    /// Returns `Err` only when the group as a whole failed (BEGIN, SAVEPOINT
    /// or COMMIT): then nothing of it is applied.
    pub(crate) fn apply_batch(
        &self,
        items: &[&Stamped],
    ) -> Result<Vec<Result<Applied, StoreError>>, StoreError> {
        let mut excluded: Vec<Option<Result<Applied, String>>> = vec![None; items.len()];
        'attempt: loop {
            self.batch_sql(BEGIN_WRITE)?;
            let mut results = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                if let Some(r) = &excluded[i] {
                    results.push(r.clone().map_err(StoreError::Apply));
                    continue;
                }
                self.batch_sql("SAVEPOINT tablix_command")?;
                let r = self.apply(item);
                if self.conn.is_autocommit() {
                    excluded[i] = Some(r.map_err(|e| e.to_string()));
                    continue 'attempt;
                }
                let failed = r.as_ref().map_or(true, |a| a.rolled_back);
                if failed {
                    self.batch_sql("ROLLBACK TO tablix_command")?;
                }
                self.batch_sql("RELEASE tablix_command")?;
                results.push(r);
            }
            self.batch_sql("COMMIT")?;
            return Ok(results);
        }
    }

    /// Runs transaction-control SQL; on failure rolls the group back.
    fn batch_sql(&self, sql: &str) -> Result<(), StoreError> {
        self.control(sql).map_err(|e| {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            StoreError::Commit(error_message(&e))
        })
    }

    /// Writes the WAL to stable storage (async mode's bounded flush),
    /// through SQLite's own WAL handle so every VFS layer sees the sync.
    pub(crate) fn sync_wal(&self) -> Result<(), StoreError> {
        tablix_vfs::sync_journal(&self.conn)
            .map_err(|rc| StoreError::Apply(format!("syncing the WAL failed (SQLite error {rc})")))
    }

    /// Folds the WAL back into the database before closing.
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// Replaces SQLite's `random()` and `randomblob()` on the writer with a
/// generator seeded from the Command's stamp, so replay reproduces them.
fn register_random(conn: &Connection, rng: &Arc<AtomicU64>) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8;
    let state = Arc::clone(rng);
    conn.create_scalar_function("random", 0, flags, move |_| Ok(next_random(&state) as i64))?;
    let state = Arc::clone(rng);
    conn.create_scalar_function("randomblob", 1, flags, move |ctx| {
        let n: i64 = ctx.get(0)?;
        let n = n.clamp(1, 1 << 30) as usize;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            out.extend_from_slice(&next_random(&state).to_le_bytes());
        }
        out.truncate(n);
        Ok(out)
    })?;
    Ok(())
}

/// splitmix64: small, fast and good enough for SQL's random().
fn next_random(state: &AtomicU64) -> u64 {
    let s = state
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Params, Statement, Value};
    use crate::outcome::StatementResult;
    use proptest::prelude::*;
    use std::path::Path;

    fn applier(dir: &Path, tag: &str) -> Applier {
        let config = StoreConfig::new(dir.join(tag));
        std::fs::create_dir_all(&config.data_dir).unwrap();
        let uri = format!(
            "file:/tablix-apply-test-{tag}-{}?vfs=memdb",
            std::process::id()
        );
        let a = Applier::open(&config, &uri).unwrap();
        a.connection()
            .execute_batch("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT UNIQUE, r ANY)")
            .unwrap();
        a
    }

    fn dump(a: &Applier) -> Vec<(i64, Option<String>, Option<String>)> {
        let mut st = a
            .connection()
            .prepare("SELECT k, v, quote(r) FROM t ORDER BY k")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn statement() -> impl Strategy<Value = Statement> {
        let key = 0i64..6;
        let val = prop::sample::select(vec!["a", "b", "c", "d"]);
        prop_oneof![
            (key.clone(), val.clone()).prop_map(|(k, v)| Statement::with_params(
                "INSERT INTO t(k, v) VALUES (?, ?)",
                Params::Positional(vec![Value::Integer(k), Value::Text(v.into())])
            )),
            (key.clone(), val.clone()).prop_map(|(k, v)| Statement::with_params(
                "INSERT OR ROLLBACK INTO t(k, v) VALUES (:k, :v)",
                Params::Named(vec![
                    ("k".into(), Value::Integer(k)),
                    ("v".into(), Value::Text(v.into()))
                ])
            )),
            (key.clone(), val).prop_map(|(k, v)| Statement::new(format!(
                "UPDATE t SET v = '{v}', r = random() WHERE k = {k}"
            ))),
            key.clone().prop_map(|k| Statement::new(format!("DELETE FROM t WHERE k = {k}"))),
            key.prop_map(|k| Statement::new(format!(
                "INSERT OR REPLACE INTO t(k, v, r) VALUES ({k}, NULL, datetime('now') || hex(randomblob(4)))"
            ))),
            Just(Statement::new("INSERT INTO tablix_meta VALUES ('x', 1)")),
            Just(Statement::new("INSERT INTO nowhere VALUES (1)")),
            Just(Statement::new("SELECT count(*) FROM t")),
        ]
    }

    fn command() -> impl Strategy<Value = Stamped> {
        (
            prop::collection::vec(statement(), 1..4),
            any::<bool>(),
            any::<u64>(),
            0i64..4_000_000_000_000_000_000,
        )
            .prop_map(|(statements, transaction, seed, unix_nanos)| Stamped {
                stamp: Stamp { unix_nanos, seed },
                command: Command::Sql {
                    statements,
                    transaction,
                },
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Group commit (any grouping) ends in the same state, with the same
        /// per-Command results, as applying the Commands one by one.
        #[test]
        fn group_commit_matches_one_by_one(
            commands in prop::collection::vec(command(), 1..24),
            cut in prop::collection::vec(1usize..8, 1..8),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let grouped = applier(dir.path(), "grouped");
            let single = applier(dir.path(), "single");
            let mut grouped_results = Vec::new();
            let mut rest: &[Stamped] = &commands;
            let mut sizes = cut.iter().cycle();
            while !rest.is_empty() {
                let n = (*sizes.next().unwrap()).min(rest.len());
                let refs: Vec<&Stamped> = rest[..n].iter().collect();
                grouped_results.extend(grouped.apply_batch(&refs).unwrap());
                rest = &rest[n..];
            }
            let mut single_results = Vec::new();
            for c in &commands {
                single_results.extend(single.apply_batch(&[c]).unwrap());
            }
            let view = |r: &Result<Applied, StoreError>| match r {
                Ok(a) => Ok((a.results(), a.rolled_back)),
                Err(e) => Err(e.to_string()),
            };
            let g: Vec<_> = grouped_results.iter().map(view).collect();
            let s: Vec<_> = single_results.iter().map(view).collect();
            prop_assert_eq!(g, s);
            prop_assert_eq!(dump(&grouped), dump(&single));
        }
    }

    #[test]
    fn or_rollback_fails_alone_inside_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let a = applier(dir.path(), "rb");
        let stamp = Stamp {
            unix_nanos: 0,
            seed: 1,
        };
        let sql = |s: &str| {
            Stamped::new(
                stamp,
                Command::Sql {
                    statements: vec![Statement::new(s)],
                    transaction: false,
                },
            )
        };
        let items = [
            sql("INSERT INTO t(k, v) VALUES (1, 'a')"),
            sql("INSERT OR ROLLBACK INTO t(k, v) VALUES (2, 'a')"),
            sql("INSERT INTO t(k, v) VALUES (3, 'c')"),
        ];
        let refs: Vec<&Stamped> = items.iter().collect();
        let r = a.apply_batch(&refs).unwrap();
        assert!(!r[0].as_ref().unwrap().rolled_back);
        let failed = r[1].as_ref().unwrap();
        assert!(failed.rolled_back);
        assert!(
            matches!(&failed.statements[0].result, StatementResult::Error(m) if m.contains("UNIQUE"))
        );
        assert!(!r[2].as_ref().unwrap().rolled_back);
        assert_eq!(dump(&a).iter().map(|r| r.0).collect::<Vec<_>>(), [1, 3]);
    }
}
