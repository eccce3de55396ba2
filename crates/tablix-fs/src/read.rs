//! Reads of the file system. Each runs on a reader connection inside one
//! read transaction (the caller's), so what it returns is one snapshot.

use rusqlite::{Connection, OptionalExtension, params};

use crate::errno::Errno;
use crate::error::FsError;
use crate::inode::{
    ATTR_COLUMNS, attr, attr_from_row, check_lookup_name, child, directory, parent_of,
};
use crate::op::{Attr, Ino};
use crate::schema::{BLOCK_SIZE, block_key, split_block_key};

pub fn getattr(conn: &Connection, ino: Ino) -> Result<Attr, FsError> {
    attr(conn, ino)
}

/// The inode `name` names in directory `parent`.
pub fn lookup(conn: &Connection, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
    check_lookup_name(name)?;
    let dir = directory(conn, parent)?;
    match name {
        b"." => return Ok(dir),
        b".." => return attr(conn, parent_of(conn, parent)?),
        _ => {}
    }
    let (_, ino) = child(conn, parent, name)?.ok_or(FsError::Errno(Errno::ENOENT))?;
    attr(conn, ino)
}

/// One directory entry as readdir returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub attr: Attr,
    /// The offset that resumes the listing after this entry.
    pub next: u64,
}

/// Offsets of `.` and `..`; an entry with row id `id` resumes at `id + 2`.
const DOT_OFFSETS: u64 = 2;

/// Lists directory `dir` from `offset` (0, or an entry's `next`), calling
/// `emit` until it returns false. Offsets are stable: entries are listed in
/// the order of their never-reused row ids, so an entry that exists for the
/// whole listing is returned exactly once however the directory changes.
pub fn readdir(
    conn: &Connection,
    dir: Ino,
    offset: u64,
    mut emit: impl FnMut(DirEntry) -> bool,
) -> Result<(), FsError> {
    let me = attr(conn, dir)?;
    if !me.is_dir() {
        return Err(Errno::ENOTDIR.into());
    }
    if offset == 0
        && !emit(DirEntry {
            name: b".".to_vec(),
            attr: me,
            next: 1,
        })
    {
        return Ok(());
    }
    if offset <= 1 {
        let up = attr(conn, parent_of(conn, dir)?)?;
        if !emit(DirEntry {
            name: b"..".to_vec(),
            attr: up,
            next: 2,
        }) {
            return Ok(());
        }
    }
    let after = offset.saturating_sub(DOT_OFFSETS) as i64;
    let mut st = conn.prepare_cached(&format!(
        "SELECT d.id, d.name, {} FROM tablix_dirent d JOIN tablix_inode i ON i.ino = d.ino
         WHERE d.parent = ?1 AND d.id > ?2 ORDER BY d.id",
        ATTR_COLUMNS
            .split(", ")
            .map(|c| format!("i.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    let mut rows = st.query(params![dir as i64, after])?;
    while let Some(row) = rows.next()? {
        let id: i64 = row.get(0)?;
        let entry = DirEntry {
            name: row.get(1)?,
            attr: attr_from_row(row, 2)?,
            next: id as u64 + DOT_OFFSETS,
        };
        if !emit(entry) {
            break;
        }
    }
    Ok(())
}

/// Up to `size` bytes of file `ino` from `offset`; holes read as zeros.
pub fn read(conn: &Connection, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
    let a = attr(conn, ino)?;
    if a.is_dir() {
        return Err(Errno::EISDIR.into());
    }
    if offset >= a.size {
        return Ok(Vec::new());
    }
    let end = a.size.min(offset.saturating_add(u64::from(size)));
    let mut out = vec![0u8; (end - offset) as usize];
    let first = offset / BLOCK_SIZE;
    let last = (end - 1) / BLOCK_SIZE;
    let mut st =
        conn.prepare_cached("SELECT id, data FROM tablix_block WHERE id BETWEEN ?1 AND ?2")?;
    let mut rows = st.query(params![block_key(ino, first), block_key(ino, last)])?;
    while let Some(row) = rows.next()? {
        let key: i64 = row.get(0)?;
        let start = split_block_key(key).1 * BLOCK_SIZE;
        let data = row
            .get_ref(1)?
            .as_blob()
            .map_err(|_| FsError::Errno(Errno::EIO))?;
        let from = offset.max(start);
        let to = end.min(start + data.len() as u64);
        if from < to {
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - start) as usize..(to - start) as usize]);
        }
    }
    Ok(out)
}

pub fn readlink(conn: &Connection, ino: Ino) -> Result<Vec<u8>, FsError> {
    let a = attr(conn, ino)?;
    if a.file_type() != libc::S_IFLNK {
        return Err(Errno::EINVAL.into());
    }
    conn.prepare_cached("SELECT target FROM tablix_symlink WHERE ino = ?1")?
        .query_row(params![ino as i64], |r| r.get(0))
        .optional()?
        .ok_or(FsError::Errno(Errno::EIO))
}

pub fn getxattr(conn: &Connection, ino: Ino, name: &[u8]) -> Result<Vec<u8>, FsError> {
    attr(conn, ino)?;
    crate::apply::check_xattr_name(name)?;
    conn.prepare_cached("SELECT value FROM tablix_xattr WHERE ino = ?1 AND name = ?2")?
        .query_row(params![ino as i64, name], |r| r.get(0))
        .optional()?
        .ok_or(FsError::Errno(Errno::ENODATA))
}

/// The names of `ino`'s extended attributes, each followed by a NUL.
pub fn listxattr(conn: &Connection, ino: Ino) -> Result<Vec<u8>, FsError> {
    attr(conn, ino)?;
    let mut out = Vec::new();
    let mut st =
        conn.prepare_cached("SELECT name FROM tablix_xattr WHERE ino = ?1 ORDER BY name")?;
    let mut rows = st.query(params![ino as i64])?;
    while let Some(row) = rows.next()? {
        out.extend_from_slice(
            row.get_ref(0)?
                .as_blob()
                .map_err(|_| FsError::Errno(Errno::EIO))?,
        );
        out.push(0);
    }
    Ok(out)
}

/// lseek's SEEK_DATA and SEEK_HOLE: a stored block is data, a missing one
/// a hole, and there is an implicit hole at the end of the file.
pub fn seek(conn: &Connection, ino: Ino, offset: u64, whence: i32) -> Result<u64, FsError> {
    let a = attr(conn, ino)?;
    if offset >= a.size {
        return Err(Errno::ENXIO.into());
    }
    let first = offset / BLOCK_SIZE;
    let last = (a.size - 1) / BLOCK_SIZE;
    let mut st =
        conn.prepare_cached("SELECT id FROM tablix_block WHERE id BETWEEN ?1 AND ?2 ORDER BY id")?;
    let keys = st.query_map(params![block_key(ino, first), block_key(ino, last)], |r| {
        r.get::<_, i64>(0)
    })?;
    match whence {
        libc::SEEK_DATA => match keys.into_iter().next() {
            Some(key) => Ok((split_block_key(key?).1 * BLOCK_SIZE).max(offset)),
            None => Err(Errno::ENXIO.into()),
        },
        libc::SEEK_HOLE => {
            let mut expect = first;
            for key in keys {
                let index = split_block_key(key?).1;
                if index != expect {
                    break;
                }
                expect += 1;
            }
            Ok((expect * BLOCK_SIZE).max(offset).min(a.size))
        }
        _ => Err(Errno::EINVAL.into()),
    }
}

/// Most symbolic links one path resolution follows (Linux's MAXSYMLINKS).
const MAX_SYMLINKS: u32 = 40;

/// Longest path resolved (PATH_MAX, with its terminating NUL).
const PATH_MAX: usize = 4096;

/// What a permission check asks for, as access(2)'s mask.
pub const MAY_READ: u32 = 4;
pub const MAY_SEARCH: u32 = 1;

/// Resolves the absolute `path` as the kernel would for a caller whose
/// rights `may(attr, mask)` decides: every directory it passes through must
/// be searchable, `.` and `..` work, and symbolic links are followed (at
/// most 40), relative to the directory holding them. Returns the final
/// inode; a trailing `/` requires it to be a directory.
pub fn resolve(
    conn: &Connection,
    path: &[u8],
    may: &dyn Fn(&Attr, u32) -> bool,
) -> Result<Attr, FsError> {
    if path.len() >= PATH_MAX {
        return Err(Errno::ENAMETOOLONG.into());
    }
    if path.first() != Some(&b'/') {
        return Err(Errno::EINVAL.into());
    }
    let mut pending: std::collections::VecDeque<Vec<u8>> = components(path);
    let mut must_be_dir = path.ends_with(b"/");
    let mut cur = attr(conn, crate::op::ROOT)?;
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if !cur.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        if !may(&cur, MAY_SEARCH) {
            return Err(Errno::EACCES.into());
        }
        check_lookup_name(&name)?;
        match name.as_slice() {
            b"." => continue,
            b".." => {
                cur = attr(conn, parent_of(conn, cur.ino)?)?;
                continue;
            }
            _ => {}
        }
        let (_, ino) = child(conn, cur.ino, &name)?.ok_or(FsError::Errno(Errno::ENOENT))?;
        let next = attr(conn, ino)?;
        if next.file_type() == libc::S_IFLNK {
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(Errno::ELOOP.into());
            }
            let target = readlink(conn, ino)?;
            if pending.is_empty() {
                must_be_dir |= target.ends_with(b"/");
            }
            for part in components(&target).into_iter().rev() {
                pending.push_front(part);
            }
            if target.first() == Some(&b'/') {
                cur = attr(conn, crate::op::ROOT)?;
            }
            continue;
        }
        cur = next;
    }
    if must_be_dir && !cur.is_dir() {
        return Err(Errno::ENOTDIR.into());
    }
    Ok(cur)
}

fn components(path: &[u8]) -> std::collections::VecDeque<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Whether a name of `ino` ends with `suffix`.
pub fn named_with_suffix(conn: &Connection, ino: Ino, suffix: &[u8]) -> Result<bool, FsError> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM tablix_dirent WHERE ino = ?1 AND substr(name, -?3) = ?2 LIMIT 1",
        )?
        .query_row(params![ino as i64, suffix, suffix.len() as i64], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Inodes in use, for statfs.
pub fn inode_count(conn: &Connection) -> Result<u64, FsError> {
    Ok(conn
        .prepare_cached("SELECT count(*) FROM tablix_inode")?
        .query_row([], |r| r.get::<_, i64>(0))? as u64)
}

/// The cluster nodes recorded as mounting the file system
/// (`FsOp::MountNode`, until `FsOp::Unmount`).
pub fn mounted_nodes(conn: &Connection) -> Result<Vec<u64>, FsError> {
    node_ids(conn, "SELECT node FROM tablix_mount ORDER BY node")
}

/// The node ids `sql` selects.
fn node_ids(conn: &Connection, sql: &str) -> Result<Vec<u64>, FsError> {
    let mut st = conn.prepare_cached(sql)?;
    let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
    Ok(rows
        .map(|r| r.map(|n| n as u64))
        .collect::<Result<_, _>>()?)
}

/// The nodes that hold a lock (`FsOp::Lock`), until they unlock, leave
/// (`FsOp::Unmount`), mount again or their lease runs out
/// (`FsOp::ExpireLocks`).
pub fn lock_holders(conn: &Connection) -> Result<Vec<u64>, FsError> {
    node_ids(conn, "SELECT DISTINCT node FROM tablix_lock ORDER BY node")
}

/// A lock one owner holds (`FsOp::Lock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub node: u64,
    pub start: u64,
    pub end: u64,
    pub write: bool,
    pub pid: u32,
}

/// A lock of another owner than `(node, owner)` on `ino` over some of
/// `start..=end` that a lock of that range conflicts with: every lock
/// for a write lock, write locks for a read lock.
pub fn lock_conflict(
    conn: &Connection,
    ino: Ino,
    (node, owner): (u64, u64),
    (start, end): (u64, u64),
    write: bool,
) -> Result<Option<HeldLock>, FsError> {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(conn
        .prepare_cached(
            "SELECT node, start, end, write, pid FROM tablix_lock
             WHERE ino = ?1 AND NOT (node = ?2 AND owner = ?3)
               AND start <= ?5 AND end >= ?4 AND (write = 1 OR ?6)
             ORDER BY start LIMIT 1",
        )?
        .query_row(
            params![
                ino as i64,
                node as i64,
                owner as i64,
                clamp(start),
                clamp(end),
                write
            ],
            |r| {
                Ok(HeldLock {
                    node: r.get::<_, i64>(0)? as u64,
                    start: r.get::<_, i64>(1)? as u64,
                    end: r.get::<_, i64>(2)? as u64,
                    write: r.get(3)?,
                    pid: r.get(4)?,
                })
            },
        )
        .optional()?)
}

/// Whether `(node, owner)` holds a lock on `ino`, or held one that its
/// node's lease took (see [`lost_lock_pids`]): either way its close has
/// something to let go of.
pub fn holds_or_lost_lock(
    conn: &Connection,
    ino: Ino,
    (node, owner): (u64, u64),
) -> Result<bool, FsError> {
    if holds_lock(conn, ino, (node, owner))? {
        return Ok(true);
    }
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM tablix_lost_lock WHERE node = ?1 AND ino = ?2 AND owner = ?3 LIMIT 1",
        )?
        .query_row(params![node as i64, ino as i64, owner as i64], |_| Ok(()))
        .optional()?
        .is_some())
}

/// The locks `node` holds on `ino`, as (owner, pid), one per owner and
/// process.
pub fn file_locks(conn: &Connection, ino: Ino, node: u64) -> Result<Vec<(u64, u32)>, FsError> {
    holders(conn, "tablix_lock", ino, node)
}

/// The locks on `ino` that `node`'s lease took (`FsOp::ExpireLocks`)
/// from processes that have not closed the file since, as (owner, pid).
pub fn file_lost_locks(conn: &Connection, ino: Ino, node: u64) -> Result<Vec<(u64, u32)>, FsError> {
    holders(conn, "tablix_lost_lock", ino, node)
}

/// The processes (`pid`s) of `node` whose lock on `ino` its lease took,
/// as [`file_lost_locks`].
pub fn lost_lock_pids(conn: &Connection, ino: Ino, node: u64) -> Result<Vec<u32>, FsError> {
    Ok(file_lost_locks(conn, ino, node)?
        .into_iter()
        .map(|(_, pid)| pid)
        .collect())
}

/// The distinct (owner, pid) of `table`'s rows for `(ino, node)`.
fn holders(
    conn: &Connection,
    table: &str,
    ino: Ino,
    node: u64,
) -> Result<Vec<(u64, u32)>, FsError> {
    let sql = format!("SELECT DISTINCT owner, pid FROM {table} WHERE ino = ?1 AND node = ?2");
    let rows = conn
        .prepare_cached(&sql)?
        .query_map(params![ino as i64, node as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows
        .into_iter()
        .filter_map(|(owner, pid)| Some((owner as u64, u32::try_from(pid).ok()?)))
        .collect())
}

/// Whether `(node, owner)` holds a lock on `ino`.
pub fn holds_lock(conn: &Connection, ino: Ino, (node, owner): (u64, u64)) -> Result<bool, FsError> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM tablix_lock WHERE ino = ?1 AND node = ?2 AND owner = ?3 LIMIT 1",
        )?
        .query_row(params![ino as i64, node as i64, owner as i64], |_| Ok(()))
        .optional()?
        .is_some())
}
