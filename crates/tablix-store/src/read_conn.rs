//! The one form in which the store lends a connection to code outside it:
//! [`ReadConn`], for reads only.

use rusqlite::Connection;

use crate::error::StoreError;

/// A connection lent for one call of tablix's own read-only SQL
/// ([`crate::Store::read`], [`crate::Store::read_latest`],
/// [`crate::Store::read_volatile`]).
///
/// The readers of both databases are opened read-only and `query_only`:
/// a write on them fails with SQLITE_READONLY. Async mode's reads of the
/// file system's pending writes borrow the writer's connection
/// (`ReadConn::on_writer`), where a write is detected, not prevented:
/// `Store::read_latest` fails if the read changed a row. (Both ways of
/// preventing it cost too much per read, measured with `tablix bench fs
/// --workloads meta --modes async`: `PRAGMA query_only` expires every
/// prepared statement of the connection when set, which took the FUSE
/// round trip from 10 to 23 us; a savepoint rolled back after each read
/// made `rm -rf` 1.55 times slower.)
pub struct ReadConn<'a> {
    conn: &'a Connection,
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
        ReadConn { conn }
    }

    /// Lends a writer's connection for one read: `f` runs on it, and
    /// fails the read if it changed a row.
    pub(crate) fn on_writer<R>(
        conn: &'a Connection,
        f: impl FnOnce(&ReadConn<'a>) -> R,
    ) -> Result<R, StoreError> {
        let before = conn.total_changes();
        let out = f(&ReadConn { conn });
        let changed = conn.total_changes() - before;
        if changed != 0 {
            tracing::error!("a read on the file system's writer changed {changed} rows");
            return Err(StoreError::Apply(format!(
                "a read on the file system's writer changed {changed} rows: a defect in tablix"
            )));
        }
        Ok(out)
    }
}

impl std::ops::Deref for ReadConn<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaned_writer_sees_pending_rows_and_a_write_fails_the_read() {
        let c = Connection::open_in_memory().expect("memory db");
        c.execute_batch("CREATE TABLE t(x); BEGIN; INSERT INTO t VALUES (1);")
            .expect("setup");
        let n = ReadConn::on_writer(&c, |r| {
            r.query_row("SELECT count(*) FROM t", [], |row| row.get::<_, i64>(0))
        })
        .expect("a read")
        .expect("count");
        assert_eq!(n, 1, "the loan sees the writer's uncommitted row");
        let wrote = ReadConn::on_writer(&c, |r| r.execute("DELETE FROM t", []));
        assert!(
            matches!(wrote, Err(StoreError::Apply(_))),
            "a write through a loan went unnoticed: {wrote:?}"
        );
    }
}
