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

/// Registers a scalar SQL function whose body may run SQL on the very
/// connection that calls it (reads only: it runs in the middle of the
/// caller's statement). rusqlite hands a function only its arguments.
pub fn create_scalar_function_on_db<F, T>(
    conn: &Connection,
    name: &str,
    n_arg: i32,
    flags: rusqlite::functions::FunctionFlags,
    f: F,
) -> rusqlite::Result<()>
where
    F: Fn(&Connection, &rusqlite::functions::Context<'_>) -> rusqlite::Result<T> + Send + 'static,
    T: rusqlite::types::ToSql,
{
    conn.create_scalar_function(name, n_arg, flags, move |ctx| {
        // SAFETY: the function runs inside a call SQLite makes on the
        // connection that owns `ctx`, on that connection's thread, and the
        // borrowed handle does not outlive this call; it is not closed
        // when dropped.
        let db = unsafe { ctx.get_connection()? };
        f(&db, ctx)
    })
}

/// Sets SQLite's process-wide heap limits: past `soft` bytes it frees
/// caches first; past `hard` an allocation fails with SQLITE_NOMEM. 0
/// means no limit. Returns the previous hard limit.
pub fn set_heap_limits(soft: i64, hard: i64) -> i64 {
    // SAFETY: both calls only set process-wide counters under SQLite's
    // own mutex.
    unsafe {
        libsqlite3_sys::sqlite3_soft_heap_limit64(soft);
        libsqlite3_sys::sqlite3_hard_heap_limit64(hard)
    }
}

/// Bytes SQLite has allocated now, and at most since the process started.
pub fn heap_used() -> (i64, i64) {
    // SAFETY: reads counters under SQLite's own mutex.
    unsafe {
        (
            libsqlite3_sys::sqlite3_memory_used(),
            libsqlite3_sys::sqlite3_memory_highwater(0),
        )
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

/// Whether `sql` ends with a complete statement, by SQLite's own rules
/// (`sqlite3_complete`: a `;` outside strings, comments and trigger
/// bodies). Text with a NUL byte is never complete.
pub fn is_complete(sql: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(sql) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    unsafe { libsqlite3_sys::sqlite3_complete(c.as_ptr()) != 0 }
}

/// Splits text into its statements, each ending at a `;` that ends a
/// complete statement (see [`is_complete`]), trimmed, without empty
/// ones. What follows the last complete statement, if anything but
/// blanks and comments, is the last element.
pub fn split_statements(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices(';') {
        let candidate = &text[start..=i];
        if is_complete(candidate) {
            let s = candidate.trim();
            if s != ";" {
                out.push(s);
            }
            start = i + 1;
        }
    }
    let rest = text[start..].trim();
    if has_words(rest) {
        out.push(rest);
    }
    out
}

/// Whether `s` holds anything but comments.
fn has_words(s: &str) -> bool {
    let mut rest = s.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r
                .split_once('\n')
                .map_or("", |(_, after)| after)
                .trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r
                .split_once("*/")
                .map_or("", |(_, after)| after)
                .trim_start();
        } else {
            return !rest.is_empty();
        }
    }
}

#[cfg(test)]
mod split_tests {
    use super::*;

    #[test]
    fn statements_split_where_sqlite_says_they_end() {
        assert!(is_complete("SELECT 1;"));
        assert!(!is_complete("SELECT ';"));
        let text = "BEGIN TRANSACTION;\nCREATE TABLE t(a);\nINSERT INTO t VALUES('x;y');\n\
                    CREATE TRIGGER g AFTER INSERT ON t BEGIN INSERT INTO t VALUES (1); DELETE FROM t; END;\n\
                    -- a comment; with a semicolon\nCOMMIT;\n;  SELECT 2";
        assert_eq!(
            split_statements(text),
            vec![
                "BEGIN TRANSACTION;",
                "CREATE TABLE t(a);",
                "INSERT INTO t VALUES('x;y');",
                "CREATE TRIGGER g AFTER INSERT ON t BEGIN INSERT INTO t VALUES (1); DELETE FROM t; END;",
                "-- a comment; with a semicolon\nCOMMIT;",
                "SELECT 2",
            ]
        );
        assert!(split_statements("  -- nothing\n").is_empty());
    }
}
