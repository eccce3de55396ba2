//! `file_data(path [, offset, length])`: a file's bytes, for whoever may
//! read the file.
//!
//! The path is resolved as the kernel would resolve it for the request's
//! principal (every directory on the way searchable, symbolic links
//! followed), and the file must be readable by them. It is the only way
//! user SQL reaches file contents: the raw block table is root's.

use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::limits::Limit;
use rusqlite::types::{Value, ValueRef};

use crate::policy::State;
use crate::principal::{MAY_READ, Principal};

fn fail(msg: String) -> rusqlite::Error {
    rusqlite::Error::UserFunctionError(msg.into())
}

/// Registers `file_data` with one and with three arguments. Direct-only:
/// no view or trigger can call it on someone else's behalf.
pub(crate) fn register(conn: &Connection, state: Arc<Mutex<State>>) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DIRECTONLY;
    for n_arg in [1, 3] {
        let state = Arc::clone(&state);
        tablix_vfs::create_scalar_function_on_db(
            conn,
            "file_data",
            n_arg,
            flags,
            move |db, ctx| file_data(db, ctx, &state),
        )?;
    }
    Ok(())
}

fn file_data(db: &Connection, ctx: &Context<'_>, state: &Mutex<State>) -> rusqlite::Result<Value> {
    let path: Vec<u8> = match ctx.get_raw(0) {
        ValueRef::Null => return Ok(Value::Null),
        ValueRef::Text(t) | ValueRef::Blob(t) => t.to_vec(),
        _ => return Err(fail("file_data(path): path must be text".into())),
    };
    let (offset, length) = if ctx.len() == 3 {
        // As substr's: a NULL offset or length gives NULL.
        let (offset, length) = match (ctx.get_raw(1), ctx.get_raw(2)) {
            (ValueRef::Null, _) | (_, ValueRef::Null) => return Ok(Value::Null),
            (ValueRef::Integer(o), ValueRef::Integer(l)) => (o, l),
            _ => {
                return Err(fail(
                    "file_data(path, offset, length): offset and length must be integers".into(),
                ));
            }
        };
        if offset < 0 || length < 0 {
            return Err(fail(
                "file_data(path, offset, length): offset and length must not be negative".into(),
            ));
        }
        (offset as u64, Some(length as u64))
    } else {
        (0, None)
    };
    let shown = String::from_utf8_lossy(&path).into_owned();
    let principal = {
        let mut s = state
            .lock()
            .map_err(|_| fail("file_data: a lock was poisoned".into()))?;
        // tablix's own reads below: the rights checked are the principal's.
        let was = s.enforcing;
        s.enforcing = false;
        (s.principal.clone(), was)
    };
    let result = read(db, &path, offset, length, &principal.0);
    if let Ok(mut s) = state.lock() {
        s.enforcing = principal.1;
    }
    result.map(Value::Blob).map_err(|e| match e {
        // SQLite's own failure keeps its code (a full disk stays one).
        Failure::Fs(tablix_fs::FsError::Sqlite(e)) => e,
        Failure::Fs(tablix_fs::FsError::Errno(errno)) => fail(format!("file_data({shown:?}): {errno}")),
        Failure::TooBig { size, limit } => fail(format!(
            "file_data({shown:?}): {size} bytes is more than the largest value ({limit} bytes); read it in pieces with file_data(path, offset, length)"
        )),
    })
}

enum Failure {
    Fs(tablix_fs::FsError),
    TooBig { size: u64, limit: u64 },
}

impl From<tablix_fs::FsError> for Failure {
    fn from(e: tablix_fs::FsError) -> Failure {
        Failure::Fs(e)
    }
}

impl From<tablix_fs::Errno> for Failure {
    fn from(e: tablix_fs::Errno) -> Failure {
        Failure::Fs(e.into())
    }
}

fn read(
    db: &Connection,
    path: &[u8],
    offset: u64,
    length: Option<u64>,
    who: &Principal,
) -> Result<Vec<u8>, Failure> {
    let may = |a: &tablix_fs::Attr, mask: u32| who.may(a.mode, a.uid, a.gid, mask);
    let attr = tablix_fs::read::resolve(db, path, &may)?;
    if attr.is_dir() {
        return Err(tablix_fs::Errno::EISDIR.into());
    }
    if attr.file_type() != libc::S_IFREG {
        return Err(tablix_fs::Errno::EINVAL.into());
    }
    if !may(&attr, MAY_READ) {
        return Err(tablix_fs::Errno::EACCES.into());
    }
    let available = attr.size.saturating_sub(offset);
    let size = length.map_or(available, |l| l.min(available));
    let limit = db.limit(Limit::SQLITE_LIMIT_LENGTH).unwrap_or(0).max(0) as u64;
    if size > limit {
        return Err(Failure::TooBig { size, limit });
    }
    Ok(tablix_fs::read::read(db, attr.ino, offset, size as u32)?)
}
