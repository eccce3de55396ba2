//! The pager's own cache counters, which count the same way whichever page
//! cache is installed (SQLite's built-in one included).

use std::ffi::c_int;

use rusqlite::{Connection, ffi};

const SQLITE_DBSTATUS_CACHE_HIT: c_int = 7;
const SQLITE_DBSTATUS_CACHE_MISS: c_int = 8;

fn counter(conn: &Connection, op: c_int) -> i64 {
    let (mut cur, mut high) = (0 as c_int, 0 as c_int);
    // SAFETY: the handle is live for the borrow of `conn`; the out pointers
    // are valid; reset = 0 leaves the counter alone.
    let rc = unsafe { ffi::sqlite3_db_status(conn.handle(), op, &mut cur, &mut high, 0) };
    if rc == ffi::SQLITE_OK {
        i64::from(cur)
    } else {
        -1
    }
}

/// Pager cache (hits, misses) summed over every database of `conn`.
pub fn pager_cache_counters(conn: &Connection) -> (i64, i64) {
    (
        counter(conn, SQLITE_DBSTATUS_CACHE_HIT),
        counter(conn, SQLITE_DBSTATUS_CACHE_MISS),
    )
}
