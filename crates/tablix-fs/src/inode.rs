//! Row-level helpers on inodes and directory entries, shared by the
//! operations and the reads.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::errno::Errno;
use crate::error::FsError;
use crate::op::{Attr, Ino};
use crate::schema::NAME_MAX;

pub(crate) const ATTR_COLUMNS: &str =
    "ino, mode, nlink, uid, gid, rdev, size, allocated, atime_ns, mtime_ns, ctime_ns, btime_ns";

/// Reads an [`Attr`] from a row selecting [`ATTR_COLUMNS`] from `first` on.
pub(crate) fn attr_from_row(row: &Row<'_>, first: usize) -> rusqlite::Result<Attr> {
    Ok(Attr {
        ino: row.get::<_, i64>(first)? as u64,
        mode: row.get::<_, i64>(first + 1)? as u32,
        nlink: row.get::<_, i64>(first + 2)? as u32,
        uid: row.get::<_, i64>(first + 3)? as u32,
        gid: row.get::<_, i64>(first + 4)? as u32,
        rdev: row.get::<_, i64>(first + 5)? as u32,
        size: row.get::<_, i64>(first + 6)? as u64,
        allocated: row.get::<_, i64>(first + 7)? as u64,
        atime_ns: row.get(first + 8)?,
        mtime_ns: row.get(first + 9)?,
        ctime_ns: row.get(first + 10)?,
        btime_ns: row.get(first + 11)?,
    })
}

/// The attributes of `ino`, or ENOENT.
pub(crate) fn attr(conn: &Connection, ino: Ino) -> Result<Attr, FsError> {
    conn.prepare_cached(&format!(
        "SELECT {ATTR_COLUMNS} FROM tablix_inode WHERE ino = ?1"
    ))?
    .query_row(params![ino as i64], |r| attr_from_row(r, 0))
    .optional()?
    .ok_or(FsError::Errno(Errno::ENOENT))
}

/// `ino` as a directory entries can be added to or looked up in: it must
/// exist, be a directory and not have been removed.
pub(crate) fn directory(conn: &Connection, ino: Ino) -> Result<Attr, FsError> {
    let a = attr(conn, ino)?;
    if !a.is_dir() {
        return Err(Errno::ENOTDIR.into());
    }
    if a.nlink == 0 {
        return Err(Errno::ENOENT.into());
    }
    Ok(a)
}

/// The entry `name` of directory `parent`: its row id and inode.
pub(crate) fn child(
    conn: &Connection,
    parent: Ino,
    name: &[u8],
) -> Result<Option<(i64, Ino)>, FsError> {
    Ok(conn
        .prepare_cached("SELECT id, ino FROM tablix_dirent WHERE parent = ?1 AND name = ?2")?
        .query_row(params![parent as i64, name], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as u64))
        })
        .optional()?)
}

/// The directory holding directory `ino` (a directory has exactly one
/// entry); the root is its own parent.
pub(crate) fn parent_of(conn: &Connection, ino: Ino) -> Result<Ino, FsError> {
    if ino == crate::op::ROOT {
        return Ok(ino);
    }
    Ok(conn
        .prepare_cached("SELECT parent FROM tablix_dirent WHERE ino = ?1 LIMIT 1")?
        .query_row(params![ino as i64], |r| r.get::<_, i64>(0))
        .optional()?
        .map_or(crate::op::ROOT, |p| p as u64))
}

/// A name that may be looked up: at most NAME_MAX bytes.
pub(crate) fn check_lookup_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(())
}

/// A name a new entry may take: not empty, not `.` or `..`, no `/` or NUL,
/// at most NAME_MAX bytes.
pub(crate) fn check_new_name(name: &[u8]) -> Result<(), Errno> {
    check_lookup_name(name)?;
    if name.is_empty() {
        return Err(Errno::ENOENT);
    }
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}
