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

/// Syncs the main database's journal (the WAL, in WAL mode) through
/// SQLite's own file handle, so that every VFS layer sees the sync. Returns
/// SQLite's error code if the sync fails; does nothing when no journal is
/// open.
pub fn sync_journal(conn: &Connection) -> Result<(), std::ffi::c_int> {
    const SQLITE_FCNTL_JOURNAL_POINTER: std::ffi::c_int = 28;
    const SQLITE_SYNC_NORMAL: std::ffi::c_int = 2;
    let mut file: *mut libsqlite3_sys::sqlite3_file = std::ptr::null_mut();
    // SAFETY: the handle is live; JOURNAL_POINTER writes one pointer to the
    // pager's journal (or WAL) file, owned by SQLite, valid while the
    // connection is open and used here on the connection's thread.
    unsafe {
        let rc = libsqlite3_sys::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            SQLITE_FCNTL_JOURNAL_POINTER,
            (&mut file as *mut *mut libsqlite3_sys::sqlite3_file).cast(),
        );
        if rc != libsqlite3_sys::SQLITE_OK {
            return Err(rc);
        }
        if file.is_null() || (*file).pMethods.is_null() {
            return Ok(());
        }
        match (*(*file).pMethods).xSync {
            Some(sync) => match sync(file, SQLITE_SYNC_NORMAL) {
                libsqlite3_sys::SQLITE_OK => Ok(()),
                rc => Err(rc),
            },
            None => Ok(()),
        }
    }
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
        // No journal is open on an in-memory database: nothing to sync.
        assert_eq!(sync_journal(&conn), Ok(()));
    }
}
