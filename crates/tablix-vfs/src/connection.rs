//! Connection-level C calls rusqlite does not wrap.

use rusqlite::Connection;

/// Sets the value `last_insert_rowid()` reports. The store resets it to 0
/// before each Command so that a Command's reported insert id never depends
/// on what earlier (possibly rolled back) Commands did on the connection.
pub fn set_last_insert_rowid(conn: &Connection, rowid: i64) {
    // SAFETY: `handle()` is the live sqlite3* owned by `conn`, used on the
    // thread that owns `conn`; sqlite3_set_last_insert_rowid has no other
    // preconditions.
    unsafe { libsqlite3_sys::sqlite3_set_last_insert_rowid(conn.handle(), rowid) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_last_insert_rowid() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2);")
            .unwrap();
        assert_eq!(conn.last_insert_rowid(), 2);
        set_last_insert_rowid(&conn, 0);
        assert_eq!(conn.last_insert_rowid(), 0);
    }
}
