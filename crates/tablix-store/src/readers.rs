//! Pools of read-only connections: one for user SQL (sandboxed), one for
//! the file system's own reads, so that the mount never queues behind a
//! user's query. In WAL mode a reader works on the snapshot that was
//! current when its transaction began: it never blocks a writer and no
//! writer blocks it.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use crate::config::StoreConfig;
use crate::error::StoreError;
use crate::policy::error_message;

/// A fixed set of connections handed out one at a time.
pub(crate) struct Pool<C> {
    state: Mutex<PoolState<C>>,
    returned: Condvar,
    size: usize,
    what: &'static str,
}

struct PoolState<C> {
    idle: Vec<C>,
    closed: bool,
}

/// A connection taken from a pool; goes back when dropped.
pub(crate) struct Lease<'a, C> {
    pool: &'a Pool<C>,
    item: Option<C>,
}

impl<C> std::ops::Deref for Lease<'_, C> {
    type Target = C;
    fn deref(&self) -> &C {
        self.item
            .as_ref()
            .unwrap_or_else(|| unreachable!("a lease holds its item until dropped"))
    }
}

impl<C> std::ops::DerefMut for Lease<'_, C> {
    fn deref_mut(&mut self) -> &mut C {
        self.item
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lease holds its item until dropped"))
    }
}

impl<C> Drop for Lease<'_, C> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take()
            && let Ok(mut s) = self.pool.state.lock()
            && !s.closed
        {
            s.idle.push(item);
        }
        self.pool.returned.notify_one();
    }
}

impl<C> Pool<C> {
    pub(crate) fn new(items: Vec<C>, what: &'static str) -> Pool<C> {
        Pool {
            size: items.len(),
            state: Mutex::new(PoolState {
                idle: items,
                closed: false,
            }),
            returned: Condvar::new(),
            what,
        }
    }

    /// Takes a connection, waiting at most `wait` for one to come back.
    pub(crate) fn acquire(&self, wait: Duration) -> Result<Lease<'_, C>, StoreError> {
        let until = Instant::now() + wait;
        let mut s = self.state.lock().map_err(|_| StoreError::Closed)?;
        loop {
            if s.closed {
                return Err(StoreError::Closed);
            }
            if let Some(item) = s.idle.pop() {
                return Ok(Lease {
                    pool: self,
                    item: Some(item),
                });
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StoreError::Busy(format!(
                    "all {} {} connections stayed busy for {} ms; retry later, or start tablix with more (--readers)",
                    self.size,
                    self.what,
                    wait.as_millis()
                )));
            }
            s = self
                .returned
                .wait_timeout(s, left)
                .map_err(|_| StoreError::Closed)?
                .0;
        }
    }

    /// Closes the idle connections and refuses new leases; a connection in
    /// use is closed when it comes back.
    pub(crate) fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closed = true;
            s.idle.clear();
        }
        self.returned.notify_all();
    }
}

/// Opens the file system's read-only connections: no user SQL runs on
/// them, so they have no authorizer and no memory database.
pub(crate) fn open_fs_readers(
    config: &StoreConfig,
    n: usize,
) -> Result<Pool<Connection>, StoreError> {
    let mut items = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match &config.vfs {
            Some(vfs) => {
                Connection::open_with_flags_and_vfs(config.database_path(), flags, vfs.as_str())?
            }
            None => Connection::open_with_flags(config.database_path(), flags)?,
        };
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.pragma_update(None, "query_only", true)?;
        conn.set_prepared_statement_cache_capacity(crate::fs_writer::FS_STATEMENTS);
        items.push(conn);
    }
    Ok(Pool::new(items, "file-system reader"))
}

/// Runs tablix's own reads (`f`) in one read transaction on `conn`.
pub(crate) fn in_snapshot<R>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> R,
) -> Result<R, StoreError> {
    crate::group::control(conn, "BEGIN").map_err(|e| StoreError::Apply(error_message(&e)))?;
    let out = f(conn);
    crate::group::control(conn, "COMMIT").map_err(|e| StoreError::Apply(error_message(&e)))?;
    Ok(out)
}
