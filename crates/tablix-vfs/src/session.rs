//! Changes as changesets, through SQLite's session extension: recording
//! what a connection changes ([`RecordingConn`]) and applying a changeset
//! as one step that any conflict aborts whole ([`apply_changeset`]).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::NonNull;

use libsqlite3_sys as ffi;
use rusqlite::Connection;

/// A connection whose changes to its main database can be recorded.
///
/// It owns the connection, so a recording (a session object, tied to the
/// connection) always ends before the connection closes. Mutable access
/// to the connection ends the recording first.
pub struct RecordingConn {
    session: Option<NonNull<ffi::sqlite3_session>>,
    conn: Connection,
}

// SAFETY: the session is used only through `&self`/`&mut self` of this
// value, on whichever thread holds it, exactly like the connection it
// belongs to (which is Send).
unsafe impl Send for RecordingConn {}

impl std::ops::Deref for RecordingConn {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl RecordingConn {
    pub fn new(conn: Connection) -> RecordingConn {
        RecordingConn {
            session: None,
            conn,
        }
    }

    /// The connection, for changes that are not to be recorded: ends any
    /// recording first.
    pub fn conn_mut(&mut self) -> &mut Connection {
        self.stop();
        &mut self.conn
    }

    /// Starts recording every change to the main database's tables,
    /// rowid tables without a primary key included (known by their
    /// rowid), dropping any recording under way.
    pub fn record(&mut self) -> Result<(), c_int> {
        self.stop();
        let mut session: *mut ffi::sqlite3_session = std::ptr::null_mut();
        // SAFETY: the handle is live and used on this thread; the session
        // is deleted before the connection closes (`stop`, `Drop`).
        unsafe {
            let rc = ffi::sqlite3session_create(self.conn.handle(), c"main".as_ptr(), &mut session);
            if rc != ffi::SQLITE_OK {
                return Err(rc);
            }
            let Some(s) = NonNull::new(session) else {
                return Err(ffi::SQLITE_NOMEM);
            };
            let mut on: c_int = 1;
            let rc = ffi::sqlite3session_object_config(
                s.as_ptr(),
                ffi::SQLITE_SESSION_OBJCONFIG_ROWID,
                (&mut on as *mut c_int).cast(),
            );
            let rc = if rc == ffi::SQLITE_OK {
                ffi::sqlite3session_attach(s.as_ptr(), std::ptr::null())
            } else {
                rc
            };
            if rc != ffi::SQLITE_OK {
                ffi::sqlite3session_delete(s.as_ptr());
                return Err(rc);
            }
            self.session = Some(s);
        }
        Ok(())
    }

    pub fn is_recording(&self) -> bool {
        self.session.is_some()
    }

    /// Heap bytes the recording holds (the first values of every row it
    /// saw change).
    pub fn recording_bytes(&self) -> u64 {
        match self.session {
            // SAFETY: the session is live while recorded here.
            Some(s) => {
                u64::try_from(unsafe { ffi::sqlite3session_memory_used(s.as_ptr()) }).unwrap_or(0)
            }
            None => 0,
        }
    }

    /// The changes recorded so far, as a changeset: each row changed, as
    /// it was when first changed and as it is now (a row changed and
    /// changed back is no change). Reads the rows through the connection.
    /// Empty when nothing is recorded.
    pub fn changeset(&self) -> Result<Vec<u8>, c_int> {
        let Some(s) = self.session else {
            return Ok(Vec::new());
        };
        let mut n: c_int = 0;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: the session is live; SQLite allocates the output with
        // sqlite3_malloc, freed here after copying.
        unsafe {
            let rc = ffi::sqlite3session_changeset(s.as_ptr(), &mut n, &mut p);
            if rc != ffi::SQLITE_OK {
                ffi::sqlite3_free(p);
                return Err(rc);
            }
            let out = match usize::try_from(n) {
                Ok(len) if !p.is_null() && len > 0 => {
                    std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec()
                }
                _ => Vec::new(),
            };
            ffi::sqlite3_free(p);
            Ok(out)
        }
    }

    /// Stops recording, dropping what was recorded.
    pub fn stop(&mut self) {
        if let Some(s) = self.session.take() {
            // SAFETY: created by `record` on this connection, deleted once.
            unsafe { ffi::sqlite3session_delete(s.as_ptr()) };
        }
    }
}

impl Drop for RecordingConn {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Why a changeset met the database in a state it did not expect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictKind {
    /// A row to update or delete holds other values than the changeset's
    /// old ones.
    Data,
    /// A row to update or delete is not there.
    NotFound,
    /// A row to insert is there already.
    Exists,
    /// A change would break a constraint (UNIQUE, CHECK, NOT NULL).
    Constraint,
    /// The changes together leave a foreign key without its row.
    ForeignKey,
}

impl ConflictKind {
    fn of(code: c_int) -> ConflictKind {
        match code {
            ffi::SQLITE_CHANGESET_DATA => ConflictKind::Data,
            ffi::SQLITE_CHANGESET_NOTFOUND => ConflictKind::NotFound,
            ffi::SQLITE_CHANGESET_CONFLICT => ConflictKind::Exists,
            ffi::SQLITE_CHANGESET_FOREIGN_KEY => ConflictKind::ForeignKey,
            _ => ConflictKind::Constraint,
        }
    }
}

/// Why a changeset was not applied. Nothing of it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// The first change that met another state than its old values (the
    /// table is empty for a foreign key, which belongs to no one change).
    Conflict { kind: ConflictKind, table: String },
    /// SQLite failed (its extended result code and message).
    Sqlite { code: c_int, message: String },
}

/// What the conflict handler saw first.
struct Seen {
    first: Option<(ConflictKind, String)>,
}

unsafe extern "C" fn on_conflict(
    ctx: *mut c_void,
    kind: c_int,
    it: *mut ffi::sqlite3_changeset_iter,
) -> c_int {
    // SAFETY: `ctx` is the `Seen` passed to apply below, alive for the call.
    let seen = unsafe { &mut *ctx.cast::<Seen>() };
    if seen.first.is_none() {
        let mut table = String::new();
        if kind != ffi::SQLITE_CHANGESET_FOREIGN_KEY {
            let mut name: *const c_char = std::ptr::null();
            let (mut n, mut op, mut indirect) = (0, 0, 0);
            // SAFETY: a live iterator positioned on the conflicting change.
            let rc =
                unsafe { ffi::sqlite3changeset_op(it, &mut name, &mut n, &mut op, &mut indirect) };
            if rc == ffi::SQLITE_OK && !name.is_null() {
                // SAFETY: NUL-terminated, owned by the iterator.
                table = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        seen.first = Some((ConflictKind::of(kind), table));
    }
    ffi::SQLITE_CHANGESET_ABORT
}

/// Applies `changeset` to `conn`'s main database: every change, or (on
/// the first conflict or failure) none, as long as the caller runs it
/// inside a savepoint of its own and rolls that back on `Err` (SQLite's
/// apply opens none here: the store's group commit gives every Command
/// one). Foreign keys are checked once, at the end. With `no_fk_actions`,
/// foreign-key actions (CASCADE, SET NULL, SET DEFAULT, RESTRICT) do not
/// run: the changeset holds what they did where it was recorded. SQLite
/// then expires every prepared statement of the connection, twice, so a
/// caller whose schema has no such action passes false. The caller
/// decides whether triggers run (`SQLITE_DBCONFIG_ENABLE_TRIGGER`).
pub fn apply_changeset(
    conn: &Connection,
    changeset: &[u8],
    no_fk_actions: bool,
) -> Result<(), ApplyError> {
    if changeset.is_empty() {
        return Ok(());
    }
    let n = c_int::try_from(changeset.len()).map_err(|_| ApplyError::Sqlite {
        code: ffi::SQLITE_TOOBIG,
        message: "the changeset is larger than SQLite takes".into(),
    })?;
    let mut seen = Seen { first: None };
    // SAFETY: the handle is live and used on this thread; SQLite reads the
    // changeset without writing it; `seen` outlives the call.
    let rc = unsafe {
        ffi::sqlite3changeset_apply_v2(
            conn.handle(),
            n,
            changeset.as_ptr().cast_mut().cast(),
            None,
            Some(on_conflict),
            (&mut seen as *mut Seen).cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            ffi::SQLITE_CHANGESETAPPLY_NOSAVEPOINT
                | if no_fk_actions {
                    ffi::SQLITE_CHANGESETAPPLY_FKNOACTION
                } else {
                    0
                },
        )
    };
    if let Some((kind, table)) = seen.first {
        return Err(ApplyError::Conflict { kind, table });
    }
    if rc == ffi::SQLITE_OK {
        return Ok(());
    }
    // SAFETY: the handle is live; the message is copied at once.
    let (code, message) = unsafe {
        let m = ffi::sqlite3_errmsg(conn.handle());
        let message = if m.is_null() {
            String::new()
        } else {
            CStr::from_ptr(m).to_string_lossy().into_owned()
        };
        (ffi::sqlite3_extended_errcode(conn.handle()), message)
    };
    Err(ApplyError::Sqlite { code, message })
}

/// Turns a connection's triggers on or off
/// (`SQLITE_DBCONFIG_ENABLE_TRIGGER`); prepared statements are expired
/// when the setting changes.
pub fn set_triggers(conn: &Connection, on: bool) -> Result<(), c_int> {
    let mut now: c_int = 0;
    // SAFETY: the handle is live; the variadic arguments are the int and
    // int* this option takes.
    let rc = unsafe {
        ffi::sqlite3_db_config(
            conn.handle(),
            ffi::SQLITE_DBCONFIG_ENABLE_TRIGGER,
            c_int::from(on),
            &mut now as *mut c_int,
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE kv(k INTEGER PRIMARY KEY, v TEXT, w TEXT);
             CREATE TABLE notes(body TEXT);
             INSERT INTO kv VALUES (1, 'a', 'x'), (2, 'b', 'y'), (3, 'c', 'z');
             INSERT INTO notes VALUES ('one');",
        )
        .unwrap();
        c
    }

    fn dump(c: &Connection) -> Vec<String> {
        let mut st = c
            .prepare(
                "SELECT 'kv', k, v, w FROM kv UNION ALL SELECT 'notes', rowid, body, NULL FROM notes ORDER BY 1, 2",
            )
            .unwrap();
        st.query_map([], |r| {
            Ok(format!(
                "{}:{}:{:?}:{:?}",
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, Option<String>>(3)?
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    #[test]
    fn recorded_changes_apply_elsewhere_and_rolled_back_ones_are_not_recorded() {
        let mut here = RecordingConn::new(db());
        let there = db();
        here.record().unwrap();
        here.execute_batch(
            "INSERT INTO kv VALUES (4, 'd', 'w');
             UPDATE kv SET v = 'B' WHERE k = 2;
             DELETE FROM kv WHERE k = 3;
             INSERT INTO notes VALUES ('two');
             SAVEPOINT s; UPDATE kv SET v = 'gone' WHERE k = 1; ROLLBACK TO s; RELEASE s;",
        )
        .unwrap();
        assert!(here.recording_bytes() > 0);
        let cs = here.changeset().unwrap();
        apply_changeset(&there, &cs, true).unwrap();
        assert_eq!(dump(&here), dump(&there));
        here.stop();
        assert!(here.changeset().unwrap().is_empty());
    }

    #[test]
    fn any_conflict_aborts_the_whole_changeset() {
        let mut here = RecordingConn::new(db());
        here.record().unwrap();
        here.execute_batch(
            "UPDATE kv SET v = 'mine' WHERE k = 1; INSERT INTO kv VALUES (9, 'n', 'n')",
        )
        .unwrap();
        let cs = here.changeset().unwrap();
        let cases = [
            (
                "UPDATE kv SET v = 'theirs' WHERE k = 1",
                ConflictKind::Data,
                "kv",
            ),
            ("DELETE FROM kv WHERE k = 1", ConflictKind::NotFound, "kv"),
            (
                "INSERT INTO kv VALUES (9, 'o', 'o')",
                ConflictKind::Exists,
                "kv",
            ),
        ];
        for (theirs, kind, table) in cases {
            let there = db();
            there.execute_batch(theirs).unwrap();
            let before = dump(&there);
            // Inside a savepoint rolled back on failure, as the store does.
            there.execute_batch("SAVEPOINT apply").unwrap();
            let r = apply_changeset(&there, &cs, false);
            if r.is_err() {
                there.execute_batch("ROLLBACK TO apply").unwrap();
            }
            there.execute_batch("RELEASE apply").unwrap();
            assert_eq!(
                r,
                Err(ApplyError::Conflict {
                    kind,
                    table: table.into()
                }),
                "after {theirs}"
            );
            assert_eq!(dump(&there), before, "a conflicting changeset left changes");
        }
    }

    #[test]
    fn triggers_can_be_turned_off_for_applying() {
        let mut here = RecordingConn::new(db());
        let there = db();
        for c in [&*here, &there] {
            c.execute_batch(
                "CREATE TABLE log(what TEXT);
                 CREATE TRIGGER t AFTER INSERT ON kv BEGIN INSERT INTO log VALUES (new.v); END;",
            )
            .unwrap();
        }
        here.record().unwrap();
        here.execute_batch("INSERT INTO kv VALUES (7, 'g', 'g')")
            .unwrap();
        let cs = here.changeset().unwrap();
        set_triggers(&there, false).unwrap();
        apply_changeset(&there, &cs, true).unwrap();
        set_triggers(&there, true).unwrap();
        let n: i64 = there
            .query_row("SELECT count(*) FROM log", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1, "the trigger's row comes from the changeset, once");
    }
}
