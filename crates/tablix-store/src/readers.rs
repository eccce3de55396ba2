//! The pool of read-only connections serving snapshot reads.

use std::sync::{Condvar, Mutex};

use rusqlite::{Connection, OpenFlags};

use crate::apply::attach_memory;
use crate::command::Statement;
use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::exec;
use crate::outcome::StatementOutcome;
use crate::policy::{Policy, error_message};

struct Reader {
    conn: Connection,
    policy: Policy,
}

/// Read-only connections. In WAL mode a reader works on the snapshot that was
/// current when its transaction began: it never blocks the writer and the
/// writer never blocks it.
pub(crate) struct Readers {
    idle: Mutex<Pool>,
    returned: Condvar,
}

struct Pool {
    idle: Vec<Reader>,
    closed: bool,
}

impl Readers {
    pub(crate) fn open(config: &StoreConfig, mem_uri: &str) -> Result<Readers, StoreError> {
        let mut idle = Vec::with_capacity(config.readers);
        for _ in 0..config.readers.max(1) {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let mut conn = match &config.vfs {
                Some(vfs) => Connection::open_with_flags_and_vfs(
                    config.database_path(),
                    flags,
                    vfs.as_str(),
                )?,
                None => Connection::open_with_flags(config.database_path(), flags)?,
            };
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            attach_memory(&conn, mem_uri)?;
            tablix_pcache::register_stats_table(&conn)?;
            conn.pragma_update(None, "query_only", true)?;
            let policy = Policy::install(&mut conn, true)?;
            idle.push(Reader { conn, policy });
        }
        Ok(Readers {
            idle: Mutex::new(Pool {
                idle,
                closed: false,
            }),
            returned: Condvar::new(),
        })
    }

    fn with<R>(&self, f: impl FnOnce(&Reader) -> R) -> Result<R, StoreError> {
        let reader = {
            let mut pool = self.idle.lock().map_err(|_| StoreError::Closed)?;
            loop {
                if pool.closed {
                    return Err(StoreError::Closed);
                }
                if let Some(r) = pool.idle.pop() {
                    break r;
                }
                pool = self.returned.wait(pool).map_err(|_| StoreError::Closed)?;
            }
        };
        let out = f(&reader);
        if let Ok(mut pool) = self.idle.lock()
            && !pool.closed
        {
            pool.idle.push(reader);
        }
        self.returned.notify_one();
        Ok(out)
    }

    /// Closes the idle connections and refuses new reads, so that the
    /// writer's connection is the last one and can remove the WAL on close.
    /// A reader in use when this runs is closed when it is returned.
    pub(crate) fn close(&self) {
        if let Ok(mut pool) = self.idle.lock() {
            pool.closed = true;
            pool.idle.clear();
        }
        self.returned.notify_all();
    }

    /// Runs `f` inside one read transaction on a reader: everything it
    /// runs sees one snapshot.
    fn in_snapshot<R>(&self, f: impl FnOnce(&Reader) -> R) -> Result<R, StoreError> {
        self.with(|r| {
            r.policy.set_enforcing(false);
            let begun = r.conn.execute_batch("BEGIN");
            r.policy.set_enforcing(true);
            begun.map_err(|e| StoreError::Apply(error_message(&e)))?;
            let out = f(r);
            r.policy.set_enforcing(false);
            let ended = r.conn.execute_batch("COMMIT");
            r.policy.set_enforcing(true);
            ended.map_err(|e| StoreError::Apply(error_message(&e)))?;
            Ok(out)
        })?
    }

    /// Runs tablix's own reads (`f`, trusted SQL) in one read transaction.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&Connection) -> R) -> Result<R, StoreError> {
        self.with(|r| {
            r.policy.set_enforcing(false);
            let out = r.conn.execute_batch("BEGIN").map(|()| {
                let out = f(&r.conn);
                (out, r.conn.execute_batch("COMMIT"))
            });
            r.policy.set_enforcing(true);
            match out {
                Ok((out, Ok(()))) => Ok(out),
                Ok((_, Err(e))) | Err(e) => Err(StoreError::Apply(error_message(&e))),
            }
        })?
    }

    /// Runs `statements` in one read transaction: all see one snapshot.
    pub(crate) fn query(
        &self,
        statements: &[Statement],
    ) -> Result<Vec<StatementOutcome>, StoreError> {
        self.in_snapshot(|r| {
            statements
                .iter()
                .map(|st| exec::run(&r.conn, &r.policy, st))
                .collect()
        })
    }

    /// Runs `statements` on one snapshot if every one of them compiles here
    /// and only reads; None if any needs the writer (it writes, or refers
    /// to something an earlier statement of the request creates). Each
    /// statement is prepared once.
    pub(crate) fn query_if_read_only(
        &self,
        statements: &[Statement],
    ) -> Result<Option<Vec<StatementOutcome>>, StoreError> {
        self.in_snapshot(|r| {
            let mut prepared = Vec::with_capacity(statements.len());
            for st in statements {
                match r.conn.prepare(&st.sql) {
                    Ok(p) if p.readonly() && p.column_count() > 0 => prepared.push(p),
                    _ => return None,
                }
            }
            Some(
                prepared
                    .iter_mut()
                    .zip(statements)
                    .map(|(p, st)| exec::run_prepared(&r.conn, &r.policy, p, &st.params))
                    .collect(),
            )
        })
    }
}
