//! The one form in which the store lends a connection to code outside it:
//! [`ReadConn`], on which a statement that writes fails with
//! SQLITE_READONLY.

use rusqlite::Connection;

use crate::error::StoreError;

/// A connection that can only read, lent for one call of tablix's own
/// read-only SQL ([`crate::Store::read`], [`crate::Store::read_latest`],
/// [`crate::Store::read_volatile`]).
///
/// Invariant: while a `ReadConn` lives, its connection is `query_only`.
/// The readers of both databases are opened so (and read-only); async
/// mode's reads of the file system's pending writes borrow the writer's
/// connection with `query_only` set for exactly that long
/// ([`ReadConn::on_writer`]).
pub struct ReadConn<'a> {
    conn: &'a Connection,
    /// Set when `query_only` was turned on for this loan and must be
    /// turned off when it ends.
    restore: bool,
}

impl<'a> ReadConn<'a> {
    /// A connection opened read-only and `query_only` (checked in debug
    /// builds).
    pub(crate) fn reader(conn: &'a Connection) -> ReadConn<'a> {
        debug_assert!(
            conn.query_row("PRAGMA query_only", [], |r| r.get::<_, bool>(0))
                .unwrap_or(false),
            "a reader connection must be query_only"
        );
        ReadConn {
            conn,
            restore: false,
        }
    }

    /// Lends a writer's connection for reads: `query_only` until dropped.
    pub(crate) fn on_writer(conn: &'a Connection) -> Result<ReadConn<'a>, StoreError> {
        set_query_only(conn, true)?;
        Ok(ReadConn {
            conn,
            restore: true,
        })
    }
}

fn set_query_only(conn: &Connection, on: bool) -> Result<(), StoreError> {
    let sql = if on {
        "PRAGMA query_only = 1"
    } else {
        "PRAGMA query_only = 0"
    };
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

impl std::ops::Deref for ReadConn<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for ReadConn<'_> {
    fn drop(&mut self) {
        if self.restore
            && let Err(e) = set_query_only(self.conn, false)
        {
            // The writer would refuse every write from now on: loud, not
            // silent. Setting a connection flag fails only without memory.
            tracing::error!("ending a read on the writer's connection: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaned_writer_refuses_writes_and_writes_again_afterwards() {
        let c = Connection::open_in_memory().expect("memory db");
        c.execute_batch("CREATE TABLE t(x); BEGIN; INSERT INTO t VALUES (1);")
            .expect("setup");
        {
            let r = ReadConn::on_writer(&c).expect("loan");
            // The loan sees the writer's uncommitted row...
            let n: i64 = r
                .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
                .expect("count");
            assert_eq!(n, 1);
            // ...and cannot change anything.
            let e = r.execute("INSERT INTO t VALUES (2)", []).unwrap_err();
            assert_eq!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ReadOnly),
                "{e}"
            );
            assert!(r.execute_batch("DELETE FROM t").is_err());
        }
        c.execute("INSERT INTO t VALUES (3)", [])
            .expect("the writer writes again once the loan ended");
        c.execute_batch("COMMIT").expect("commit");
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .expect("count");
        assert_eq!(n, 2);
    }
}
