//! Applying an [`FsOp`] to the database. Runs on the store's writer inside
//! the Command's savepoint: on `Err` the caller rolls the savepoint back, so
//! an operation either happens whole or not at all.

use rusqlite::{Connection, OptionalExtension, params};

use crate::checksum;
use crate::errno::Errno;
use crate::error::FsError;
use crate::inode::{attr, check_new_name, child, directory, parent_of};
use crate::op::{Attr, FsOp, FsReply, Ino, LockKind, ROOT, SetAttr, SetTime};
use crate::schema::{
    BLOCK_SIZE, LAST_BLOCK_INDEX, LINK_MAX, MAX_FILE_SIZE, MAX_INO, NAME_MAX, SYMLINK_MAX,
    XATTR_VALUE_MAX, block_key, spans,
};

const S_IFMT: u32 = libc::S_IFMT;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFLNK: u32 = libc::S_IFLNK;

/// Applies `op` at time `now` (nanoseconds since the epoch).
pub fn apply(conn: &Connection, now: i64, op: &FsOp) -> Result<FsReply, FsError> {
    match op {
        FsOp::Mount { uid, gid } => mount(conn, now, *uid, *gid),
        FsOp::MountNode { uid, gid, node } => mount_node(conn, now, *uid, *gid, *node),
        FsOp::Release { node, inodes } => {
            for &ino in inodes {
                release(conn, *node, ino)?;
            }
            Ok(FsReply::Done)
        }
        FsOp::Unmount { node } => unmount(conn, *node),
        FsOp::ExpireLocks { node } => {
            conn.prepare_cached(
                "INSERT OR IGNORE INTO tablix_lost_lock(node, ino, pid, owner)
                 SELECT DISTINCT node, ino, pid, owner FROM tablix_lock WHERE node = ?1",
            )?
            .execute(params![*node as i64])?;
            delete_locks(conn, *node)?;
            Ok(FsReply::Done)
        }
        FsOp::Lock {
            node,
            owner,
            pid,
            ino,
            start,
            end,
            kind,
        } => lock(conn, (*node, *owner), *pid, *ino, (*start, *end), *kind),
        FsOp::MakeNode {
            parent,
            name,
            mode,
            rdev,
            uid,
            gid,
        } => make_node(conn, now, *parent, name, *mode, *rdev, *uid, *gid).map(FsReply::Attr),
        FsOp::Symlink {
            parent,
            name,
            target,
            uid,
            gid,
        } => symlink(conn, now, *parent, name, target, *uid, *gid).map(FsReply::Attr),
        FsOp::Link { ino, parent, name } => link(conn, now, *ino, *parent, name).map(FsReply::Attr),
        FsOp::Unlink { parent, name } => unlink(conn, now, *parent, name),
        FsOp::Rmdir { parent, name } => rmdir(conn, now, *parent, name),
        FsOp::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } => rename(conn, now, *parent, name, *new_parent, new_name, *flags),
        FsOp::SetAttr { ino, attr } => set_attr(conn, now, *ino, attr).map(FsReply::Attr),
        FsOp::Write {
            ino,
            offset,
            data,
            kill_suidgid,
        } => write(conn, now, *ino, *offset, data, *kill_suidgid),
        FsOp::Append {
            ino,
            data,
            kill_suidgid,
        } => {
            let end = regular_file(conn, *ino)?.size;
            write(conn, now, *ino, end, data, *kill_suidgid)
        }
        FsOp::Fallocate {
            ino,
            offset,
            length,
            mode,
        } => fallocate(conn, now, *ino, *offset, *length, *mode),
        FsOp::SetXattr {
            ino,
            name,
            value,
            flags,
        } => set_xattr(conn, now, *ino, name, value, *flags),
        FsOp::RemoveXattr { ino, name } => remove_xattr(conn, now, *ino, name),
        FsOp::Reclaim { inodes } => {
            for &ino in inodes {
                reclaim(conn, ino)?;
            }
            Ok(FsReply::Done)
        }
        FsOp::Fenced { node, pid, ino, op } => {
            if crate::read::lost_lock_pids(conn, *ino, *node)?.contains(pid) {
                return Err(Errno::EIO.into());
            }
            apply(conn, now, op)
        }
        FsOp::Check {
            repair,
            verify_data,
        } => crate::check::check(
            conn,
            now,
            crate::check::Options {
                repair: *repair,
                verify_data: *verify_data,
            },
            &mut |_| {},
        )
        .map(FsReply::Checked),
    }
}

/// A single node's mount: its kernel is the only one, and it holds
/// nothing yet, so every unlinked inode goes.
fn mount(conn: &Connection, now: i64, uid: u32, gid: u32) -> Result<FsReply, FsError> {
    own_root(conn, now, uid, gid)?;
    for ino in unlinked(conn)? {
        reclaim(conn, ino)?;
    }
    Ok(FsReply::Done)
}

fn own_root(conn: &Connection, now: i64, uid: u32, gid: u32) -> Result<(), FsError> {
    // A root whose birth time is 0 was never mounted.
    conn.prepare_cached(
        "UPDATE tablix_inode SET uid = ?1, gid = ?2, atime_ns = ?3, mtime_ns = ?3,
             ctime_ns = ?3, btime_ns = ?3
         WHERE ino = 1 AND btime_ns = 0",
    )?
    .execute(params![uid, gid, now])?;
    Ok(())
}

fn unlinked(conn: &Connection) -> Result<Vec<Ino>, FsError> {
    let inodes: Vec<i64> = conn
        .prepare_cached("SELECT ino FROM tablix_inode WHERE nlink = 0")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(inodes.into_iter().map(|i| i as Ino).collect())
}

fn mount_node(
    conn: &Connection,
    now: i64,
    uid: u32,
    gid: u32,
    node: u64,
) -> Result<FsReply, FsError> {
    own_root(conn, now, uid, gid)?;
    conn.prepare_cached("INSERT OR IGNORE INTO tablix_mount(node) VALUES (?1)")?
        .execute(params![node as i64])?;
    // Its kernel restarted: the processes that held its locks hold nothing.
    drop_locks(conn, node)?;
    for ino in unlinked(conn)? {
        release(conn, node, ino)?;
    }
    Ok(FsReply::Done)
}

/// Records that `node`'s kernel holds `ino` no more, and frees it if it
/// is unlinked and no mounted node holds it. A linked inode needs no
/// release: it is released when it is unlinked, by every node.
fn release(conn: &Connection, node: u64, ino: Ino) -> Result<(), FsError> {
    let unlinked = conn
        .prepare_cached("SELECT 1 FROM tablix_inode WHERE ino = ?1 AND nlink = 0")?
        .query_row(params![ino as i64], |_| Ok(()))
        .optional()?
        .is_some();
    if !unlinked {
        return Ok(());
    }
    conn.prepare_cached("INSERT OR IGNORE INTO tablix_release(ino, node) VALUES (?1, ?2)")?
        .execute(params![ino as i64, node as i64])?;
    if released_by_all(conn, ino)? {
        reclaim(conn, ino)?;
    }
    Ok(())
}

/// Whether every mounted node has released `ino`.
fn released_by_all(conn: &Connection, ino: Ino) -> Result<bool, FsError> {
    Ok(conn
        .prepare_cached(
            "SELECT NOT EXISTS (SELECT 1 FROM tablix_mount m WHERE NOT EXISTS
                 (SELECT 1 FROM tablix_release r WHERE r.ino = ?1 AND r.node = m.node))",
        )?
        .query_row(params![ino as i64], |r| r.get(0))?)
}

/// `node`'s locks go (what its lease took, `tablix_lost_lock`, stays).
fn delete_locks(conn: &Connection, node: u64) -> Result<(), FsError> {
    conn.prepare_cached("DELETE FROM tablix_lock WHERE node = ?1")?
        .execute(params![node as i64])?;
    Ok(())
}

/// Every lock `node` holds goes, and what its lease took.
fn drop_locks(conn: &Connection, node: u64) -> Result<(), FsError> {
    delete_locks(conn, node)?;
    conn.prepare_cached("DELETE FROM tablix_lost_lock WHERE node = ?1")?
        .execute(params![node as i64])?;
    Ok(())
}

fn unmount(conn: &Connection, node: u64) -> Result<FsReply, FsError> {
    conn.prepare_cached("DELETE FROM tablix_mount WHERE node = ?1")?
        .execute(params![node as i64])?;
    conn.prepare_cached("DELETE FROM tablix_release WHERE node = ?1")?
        .execute(params![node as i64])?;
    drop_locks(conn, node)?;
    for ino in unlinked(conn)? {
        if released_by_all(conn, ino)? {
            reclaim(conn, ino)?;
        }
    }
    Ok(FsReply::Done)
}

/// Sets `(node, owner)`'s lock on `range` of `ino` (inclusive; an
/// offset past `i64::MAX`, the kernel's "to the end of the file", is
/// `i64::MAX`).
fn lock(
    conn: &Connection,
    (node, owner): (u64, u64),
    pid: u32,
    ino: Ino,
    range: (u64, u64),
    kind: LockKind,
) -> Result<FsReply, FsError> {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let (start, end) = (clamp(range.0), clamp(range.1));
    if end < start {
        return Err(Errno::EINVAL.into());
    }
    attr(conn, ino)?;
    if kind != LockKind::Unlock
        && crate::read::lock_conflict(conn, ino, (node, owner), range, kind == LockKind::Write)?
            .is_some()
    {
        return Err(Errno::EAGAIN.into());
    }
    // The owner's locks over the range are cut out of it, keeping what
    // lies outside.
    let held: Vec<(i64, i64, i64, i64)> = conn
        .prepare_cached(
            "SELECT start, end, write, pid FROM tablix_lock
             WHERE ino = ?1 AND node = ?2 AND owner = ?3 AND start <= ?5 AND end >= ?4",
        )?
        .query_map(
            params![ino as i64, node as i64, owner as i64, start, end],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )?
        .collect::<Result<_, _>>()?;
    let insert = |s: i64, e: i64, write: i64, pid: i64| -> Result<(), FsError> {
        conn.prepare_cached(
            "INSERT INTO tablix_lock(ino, node, owner, start, end, write, pid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            ino as i64,
            node as i64,
            owner as i64,
            s,
            e,
            write,
            pid
        ])?;
        Ok(())
    };
    for (s, e, write, held_pid) in held {
        conn.prepare_cached(
            "DELETE FROM tablix_lock WHERE ino = ?1 AND node = ?2 AND owner = ?3 AND start = ?4",
        )?
        .execute(params![ino as i64, node as i64, owner as i64, s])?;
        if s < start {
            insert(s, start - 1, write, held_pid)?;
        }
        if e > end {
            insert(end + 1, e, write, held_pid)?;
        }
    }
    if kind != LockKind::Unlock {
        insert(
            start,
            end,
            i64::from(kind == LockKind::Write),
            i64::from(pid),
        )?;
    } else if start == 0 && end == i64::MAX {
        // The owner let go of the whole file (it closed it): what its
        // lease took from it is forgotten with it.
        conn.prepare_cached(
            "DELETE FROM tablix_lost_lock WHERE node = ?1 AND ino = ?2 AND owner = ?3",
        )?
        .execute(params![node as i64, ino as i64, owner as i64])?;
    }
    Ok(FsReply::Done)
}

/// Frees `ino` if no entry names it any more.
fn reclaim(conn: &Connection, ino: Ino) -> Result<(), FsError> {
    let gone = conn
        .prepare_cached("DELETE FROM tablix_inode WHERE ino = ?1 AND nlink = 0")?
        .execute(params![ino as i64])?;
    if gone == 0 {
        return Ok(());
    }
    conn.prepare_cached("DELETE FROM tablix_release WHERE ino = ?1")?
        .execute(params![ino as i64])?;
    conn.prepare_cached("DELETE FROM tablix_lock WHERE ino = ?1")?
        .execute(params![ino as i64])?;
    conn.prepare_cached("DELETE FROM tablix_lost_lock WHERE ino = ?1")?
        .execute(params![ino as i64])?;
    delete_blocks_from(conn, ino, 0)?;
    conn.prepare_cached("DELETE FROM tablix_symlink WHERE ino = ?1")?
        .execute(params![ino as i64])?;
    conn.prepare_cached("DELETE FROM tablix_xattr WHERE ino = ?1")?
        .execute(params![ino as i64])?;
    Ok(())
}

fn touch_dir(conn: &Connection, ino: Ino, now: i64, nlink_delta: i64) -> Result<(), FsError> {
    conn.prepare_cached(
        "UPDATE tablix_inode SET mtime_ns = ?2, ctime_ns = ?2, nlink = nlink + ?3 WHERE ino = ?1",
    )?
    .execute(params![ino as i64, now, nlink_delta])?;
    Ok(())
}

/// Sets an inode's ctime: its metadata changed.
fn touch_inode(conn: &Connection, ino: Ino, now: i64) -> Result<(), FsError> {
    change_links(conn, ino, now, 0)
}

fn change_links(conn: &Connection, ino: Ino, now: i64, delta: i64) -> Result<(), FsError> {
    conn.prepare_cached(
        "UPDATE tablix_inode SET nlink = max(nlink + ?2, 0), ctime_ns = ?3 WHERE ino = ?1",
    )?
    .execute(params![ino as i64, delta, now])?;
    Ok(())
}

fn add_entry(conn: &Connection, parent: Ino, name: &[u8], ino: Ino) -> Result<(), FsError> {
    conn.prepare_cached("INSERT INTO tablix_dirent(parent, name, ino) VALUES (?1, ?2, ?3)")?
        .execute(params![parent as i64, name, ino as i64])?;
    Ok(())
}

/// Checks that `name` may be created in `parent`; returns the directory.
fn creatable(conn: &Connection, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
    let dir = directory(conn, parent)?;
    check_new_name(name)?;
    if child(conn, parent, name)?.is_some() {
        return Err(Errno::EEXIST.into());
    }
    Ok(dir)
}

#[allow(clippy::too_many_arguments)]
fn insert_inode(
    conn: &Connection,
    now: i64,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    size: u64,
) -> Result<Ino, FsError> {
    // Numbers are never reused: the kernel may still cache a freed one.
    let ino: i64 = conn
        .prepare_cached(
            "UPDATE tablix_meta SET value = value + 1 WHERE key = 'next_ino' RETURNING value - 1",
        )?
        .query_row([], |r| r.get(0))
        .optional()?
        .ok_or(FsError::Errno(Errno::EIO))?;
    if ino as u64 >= MAX_INO {
        return Err(Errno::ENOSPC.into());
    }
    conn.prepare_cached(
        "INSERT INTO tablix_inode(ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, ctime_ns, btime_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?8)",
    )?
    .execute(params![ino, mode, nlink, uid, gid, rdev, size as i64, now])?;
    Ok(ino as u64)
}

#[allow(clippy::too_many_arguments)]
fn make_node(
    conn: &Connection,
    now: i64,
    parent: Ino,
    name: &[u8],
    mode: u32,
    rdev: u32,
    uid: u32,
    gid: u32,
) -> Result<Attr, FsError> {
    let dir = creatable(conn, parent, name)?;
    let kind = match mode & S_IFMT {
        0 => S_IFREG,
        k @ (libc::S_IFREG
        | libc::S_IFDIR
        | libc::S_IFIFO
        | libc::S_IFSOCK
        | libc::S_IFCHR
        | libc::S_IFBLK) => k,
        _ => return Err(Errno::EINVAL.into()),
    };
    let mut mode = kind | (mode & 0o7777);
    let mut gid = gid;
    if dir.mode & libc::S_ISGID != 0 {
        // A set-group-ID directory gives its group to what is created in
        // it, and its set-group-ID bit to subdirectories.
        gid = dir.gid;
        if kind == S_IFDIR {
            mode |= libc::S_ISGID;
        }
    }
    let is_dir = kind == S_IFDIR;
    if is_dir && dir.nlink >= LINK_MAX {
        return Err(Errno::EMLINK.into());
    }
    let rdev = if matches!(kind, libc::S_IFCHR | libc::S_IFBLK) {
        rdev
    } else {
        0
    };
    let ino = insert_inode(
        conn,
        now,
        mode,
        if is_dir { 2 } else { 1 },
        uid,
        gid,
        rdev,
        0,
    )?;
    add_entry(conn, parent, name, ino)?;
    touch_dir(conn, parent, now, i64::from(is_dir))?;
    attr(conn, ino)
}

fn symlink(
    conn: &Connection,
    now: i64,
    parent: Ino,
    name: &[u8],
    target: &[u8],
    uid: u32,
    gid: u32,
) -> Result<Attr, FsError> {
    let dir = creatable(conn, parent, name)?;
    if target.is_empty() {
        return Err(Errno::ENOENT.into());
    }
    if target.len() > SYMLINK_MAX {
        return Err(Errno::ENAMETOOLONG.into());
    }
    let gid = if dir.mode & libc::S_ISGID != 0 {
        dir.gid
    } else {
        gid
    };
    let ino = insert_inode(
        conn,
        now,
        S_IFLNK | 0o777,
        1,
        uid,
        gid,
        0,
        target.len() as u64,
    )?;
    conn.prepare_cached("INSERT INTO tablix_symlink(ino, target) VALUES (?1, ?2)")?
        .execute(params![ino as i64, target])?;
    add_entry(conn, parent, name, ino)?;
    touch_dir(conn, parent, now, 0)?;
    attr(conn, ino)
}

fn link(conn: &Connection, now: i64, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr, FsError> {
    let target = attr(conn, ino)?;
    if target.is_dir() {
        return Err(Errno::EPERM.into());
    }
    if target.nlink == 0 {
        // An unlinked file cannot get a name back (linkat of an O_TMPFILE
        // aside, which this file system does not offer).
        return Err(Errno::ENOENT.into());
    }
    if target.nlink >= LINK_MAX {
        return Err(Errno::EMLINK.into());
    }
    creatable(conn, parent, name)?;
    add_entry(conn, parent, name, ino)?;
    change_links(conn, ino, now, 1)?;
    touch_dir(conn, parent, now, 0)?;
    attr(conn, ino)
}

fn remove_entry(conn: &Connection, id: i64) -> Result<(), FsError> {
    conn.prepare_cached("DELETE FROM tablix_dirent WHERE id = ?1")?
        .execute(params![id])?;
    Ok(())
}

fn unlink(conn: &Connection, now: i64, parent: Ino, name: &[u8]) -> Result<FsReply, FsError> {
    directory(conn, parent)?;
    crate::inode::check_lookup_name(name)?;
    let (id, ino) = child(conn, parent, name)?.ok_or(FsError::Errno(Errno::ENOENT))?;
    if attr(conn, ino)?.is_dir() {
        return Err(Errno::EISDIR.into());
    }
    remove_entry(conn, id)?;
    // At nlink 0 the inode stays until the kernel forgets it (Reclaim), so
    // an open file stays readable until its last close.
    change_links(conn, ino, now, -1)?;
    touch_dir(conn, parent, now, 0)?;
    Ok(FsReply::Done)
}

fn is_empty_dir(conn: &Connection, ino: Ino) -> Result<bool, FsError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM tablix_dirent WHERE parent = ?1 LIMIT 1")?
        .query_row(params![ino as i64], |_| Ok(()))
        .optional()?
        .is_none())
}

fn rmdir(conn: &Connection, now: i64, parent: Ino, name: &[u8]) -> Result<FsReply, FsError> {
    directory(conn, parent)?;
    crate::inode::check_lookup_name(name)?;
    if name == b"." {
        return Err(Errno::EINVAL.into());
    }
    if name == b".." {
        return Err(Errno::ENOTEMPTY.into());
    }
    let (id, ino) = child(conn, parent, name)?.ok_or(FsError::Errno(Errno::ENOENT))?;
    if !attr(conn, ino)?.is_dir() {
        return Err(Errno::ENOTDIR.into());
    }
    if !is_empty_dir(conn, ino)? {
        return Err(Errno::ENOTEMPTY.into());
    }
    remove_entry(conn, id)?;
    change_links(conn, ino, now, -2)?;
    touch_dir(conn, parent, now, -1)?;
    Ok(FsReply::Done)
}

/// Whether `dir` is `ancestor` or lies below it.
fn is_within(conn: &Connection, mut dir: Ino, ancestor: Ino) -> Result<bool, FsError> {
    loop {
        if dir == ancestor {
            return Ok(true);
        }
        if dir == ROOT {
            return Ok(false);
        }
        dir = parent_of(conn, dir)?;
    }
}

fn rename(
    conn: &Connection,
    now: i64,
    parent: Ino,
    name: &[u8],
    new_parent: Ino,
    new_name: &[u8],
    flags: u32,
) -> Result<FsReply, FsError> {
    let noreplace = flags & libc::RENAME_NOREPLACE != 0;
    let exchange = flags & libc::RENAME_EXCHANGE != 0;
    if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
        return Err(Errno::EINVAL.into());
    }
    if noreplace && exchange {
        return Err(Errno::EINVAL.into());
    }
    directory(conn, parent)?;
    directory(conn, new_parent)?;
    crate::inode::check_lookup_name(name)?;
    check_new_name(new_name).map_err(|e| match e {
        // `.` and `..` as a target name are busy, not existing entries.
        Errno::EEXIST => Errno::EBUSY,
        e => e,
    })?;
    if name == b"." || name == b".." {
        return Err(Errno::EBUSY.into());
    }
    let (src_id, src_ino) = child(conn, parent, name)?.ok_or(FsError::Errno(Errno::ENOENT))?;
    let src = attr(conn, src_ino)?;
    let dst = child(conn, new_parent, new_name)?;
    if exchange {
        let (dst_id, dst_ino) = dst.ok_or(FsError::Errno(Errno::ENOENT))?;
        if dst_ino == src_ino {
            return Ok(FsReply::Done);
        }
        let dst_attr = attr(conn, dst_ino)?;
        if parent != new_parent {
            if src.is_dir() && is_within(conn, new_parent, src_ino)? {
                return Err(Errno::EINVAL.into());
            }
            if dst_attr.is_dir() && is_within(conn, parent, dst_ino)? {
                return Err(Errno::EINVAL.into());
            }
        }
        let set = conn.prepare_cached("UPDATE tablix_dirent SET ino = ?2 WHERE id = ?1");
        set?.execute(params![src_id, dst_ino as i64])?;
        conn.prepare_cached("UPDATE tablix_dirent SET ino = ?2 WHERE id = ?1")?
            .execute(params![dst_id, src_ino as i64])?;
        let moved = i64::from(src.is_dir()) - i64::from(dst_attr.is_dir());
        if parent != new_parent {
            touch_dir(conn, parent, now, -moved)?;
            touch_dir(conn, new_parent, now, moved)?;
        } else {
            touch_dir(conn, parent, now, 0)?;
        }
        touch_inode(conn, src_ino, now)?;
        touch_inode(conn, dst_ino, now)?;
        return Ok(FsReply::Done);
    }
    if let Some((dst_id, dst_ino)) = dst {
        if noreplace {
            return Err(Errno::EEXIST.into());
        }
        if dst_ino == src_ino {
            // Two names of one file: rename does nothing.
            return Ok(FsReply::Done);
        }
        let dst_attr = attr(conn, dst_ino)?;
        match (src.is_dir(), dst_attr.is_dir()) {
            (true, false) => return Err(Errno::ENOTDIR.into()),
            (false, true) => return Err(Errno::EISDIR.into()),
            (true, true) if !is_empty_dir(conn, dst_ino)? => return Err(Errno::ENOTEMPTY.into()),
            _ => {}
        }
        if src.is_dir() && is_within(conn, new_parent, src_ino)? {
            return Err(Errno::EINVAL.into());
        }
        remove_entry(conn, dst_id)?;
        if dst_attr.is_dir() {
            change_links(conn, dst_ino, now, -2)?;
            touch_dir(conn, new_parent, now, -1)?;
        } else {
            change_links(conn, dst_ino, now, -1)?;
        }
    } else if noreplace && new_parent == parent && new_name == name {
        return Err(Errno::EEXIST.into());
    } else if src.is_dir() && is_within(conn, new_parent, src_ino)? {
        return Err(Errno::EINVAL.into());
    }
    conn.prepare_cached("UPDATE tablix_dirent SET parent = ?2, name = ?3 WHERE id = ?1")?
        .execute(params![src_id, new_parent as i64, new_name])?;
    let moved = i64::from(src.is_dir() && parent != new_parent);
    touch_dir(conn, parent, now, -moved)?;
    touch_dir(conn, new_parent, now, moved)?;
    touch_inode(conn, src_ino, now)?;
    Ok(FsReply::Done)
}

fn resolve(t: SetTime, now: i64) -> i64 {
    match t {
        SetTime::Now => now,
        SetTime::At(ns) => ns,
    }
}

fn set_attr(conn: &Connection, now: i64, ino: Ino, set: &SetAttr) -> Result<Attr, FsError> {
    let old = attr(conn, ino)?;
    let mut new = old;
    if let Some(size) = set.size {
        match old.file_type() {
            S_IFREG => {}
            S_IFDIR => return Err(Errno::EISDIR.into()),
            _ => return Err(Errno::EINVAL.into()),
        }
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG.into());
        }
        new.allocated = truncate(conn, ino, old.size, size, old.allocated)?;
        new.size = size;
        new.mtime_ns = now;
        new.ctime_ns = now;
    }
    if let Some(mode) = set.mode {
        new.mode = (old.mode & S_IFMT) | (mode & 0o7777);
        new.ctime_ns = now;
    }
    if let Some(uid) = set.uid {
        new.uid = uid;
        new.ctime_ns = now;
    }
    if let Some(gid) = set.gid {
        new.gid = gid;
        new.ctime_ns = now;
    }
    if (set.uid.is_some() || set.gid.is_some()) && !old.is_dir() && set.mode.is_none() {
        // Linux drops these on every chown of a non-directory, root's too.
        new.mode = kill_suidgid(new.mode);
    }
    if let Some(t) = set.atime {
        new.atime_ns = resolve(t, now);
        new.ctime_ns = now;
    }
    if let Some(t) = set.mtime {
        new.mtime_ns = resolve(t, now);
        new.ctime_ns = now;
    }
    if let Some(t) = set.ctime {
        new.ctime_ns = t;
    }
    store_attr(conn, &new)?;
    Ok(new)
}

fn store_attr(conn: &Connection, a: &Attr) -> Result<(), FsError> {
    conn.prepare_cached(
        "UPDATE tablix_inode SET mode = ?2, uid = ?3, gid = ?4, size = ?5, allocated = ?6,
             atime_ns = ?7, mtime_ns = ?8, ctime_ns = ?9
         WHERE ino = ?1",
    )?
    .execute(params![
        a.ino as i64,
        a.mode,
        a.uid,
        a.gid,
        a.size as i64,
        a.allocated as i64,
        a.atime_ns,
        a.mtime_ns,
        a.ctime_ns
    ])?;
    Ok(())
}

/// Deletes every block of `ino` from index `first` on; returns the bytes
/// they held.
fn delete_blocks_from(conn: &Connection, ino: Ino, first: u64) -> Result<u64, FsError> {
    if first > LAST_BLOCK_INDEX {
        return Ok(0);
    }
    let (lo, hi) = (block_key(ino, first), block_key(ino, LAST_BLOCK_INDEX));
    let freed: i64 = conn
        .prepare_cached(
            "SELECT coalesce(sum(length(data)), 0) FROM tablix_block WHERE id BETWEEN ?1 AND ?2",
        )?
        .query_row(params![lo, hi], |r| r.get(0))?;
    conn.prepare_cached("DELETE FROM tablix_block WHERE id BETWEEN ?1 AND ?2")?
        .execute(params![lo, hi])?;
    conn.prepare_cached("DELETE FROM tablix_block_sum WHERE id BETWEEN ?1 AND ?2")?
        .execute(params![lo, hi])?;
    Ok(freed as u64)
}

/// Changes the stored bytes for a size change from `old` to `new`; returns
/// the new allocation. Invariant kept: no stored byte lies at or past the
/// size, so growing a file later reads zeros there.
fn truncate(
    conn: &Connection,
    ino: Ino,
    old: u64,
    new: u64,
    allocated: u64,
) -> Result<u64, FsError> {
    if new >= old {
        return Ok(allocated);
    }
    let first_gone = new.div_ceil(BLOCK_SIZE);
    let mut freed = delete_blocks_from(conn, ino, first_gone)?;
    let keep = new % BLOCK_SIZE;
    if keep != 0 {
        let key = block_key(ino, new / BLOCK_SIZE);
        let len: Option<i64> = conn
            .prepare_cached("SELECT length(data) FROM tablix_block WHERE id = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?;
        if let Some(len) = len
            && len as u64 > keep
            && let Some(mut block) = load_block(conn, key)?
        {
            block.truncate(keep as usize);
            store_block(conn, key, &block)?;
            freed += len as u64 - keep;
        }
    }
    Ok(allocated.saturating_sub(freed))
}

fn regular_file(conn: &Connection, ino: Ino) -> Result<Attr, FsError> {
    let a = attr(conn, ino)?;
    match a.file_type() {
        S_IFREG => Ok(a),
        S_IFDIR => Err(Errno::EISDIR.into()),
        _ => Err(Errno::EINVAL.into()),
    }
}

fn load_block(conn: &Connection, key: i64) -> Result<Option<Vec<u8>>, FsError> {
    Ok(conn
        .prepare_cached("SELECT data FROM tablix_block WHERE id = ?1")?
        .query_row(params![key], |r| r.get::<_, Vec<u8>>(0))
        .optional()?)
}

fn block_len(conn: &Connection, key: i64) -> Result<u64, FsError> {
    Ok(conn
        .prepare_cached("SELECT length(data) FROM tablix_block WHERE id = ?1")?
        .query_row(params![key], |r| r.get::<_, i64>(0))
        .optional()?
        .unwrap_or(0) as u64)
}

/// Stores a whole block with its checksum.
fn store_block(conn: &Connection, key: i64, data: &[u8]) -> Result<(), FsError> {
    conn.prepare_cached("INSERT OR REPLACE INTO tablix_block(id, data) VALUES (?1, ?2)")?
        .execute(params![key, data])?;
    store_sum(conn, key, checksum::of(data))
}

fn delete_block(conn: &Connection, key: i64) -> Result<(), FsError> {
    conn.prepare_cached("DELETE FROM tablix_block WHERE id = ?1")?
        .execute(params![key])?;
    conn.prepare_cached("DELETE FROM tablix_block_sum WHERE id = ?1")?
        .execute(params![key])?;
    Ok(())
}

fn store_sum(conn: &Connection, key: i64, sum: [u8; 4]) -> Result<(), FsError> {
    conn.prepare_cached("INSERT OR REPLACE INTO tablix_block_sum(id, crc) VALUES (?1, ?2)")?
        .execute(params![key, &sum[..]])?;
    Ok(())
}

/// Overwrites bytes `[lo, lo + piece.len())` of a stored block in place,
/// so that only the database pages they lie on change (a 4 KiB database
/// page written into a 64 KiB block dirties one page, not the whole row)
/// and a rewritten file keeps its pages where they were instead of freeing
/// them and allocating others from the freelist, scattered. The checksum
/// follows the patch without reading the rest of the block; a block stored
/// before checksums existed keeps none until it is written whole.
fn patch_block(
    conn: &Connection,
    key: i64,
    lo: usize,
    piece: &[u8],
    stored: u64,
) -> Result<(), FsError> {
    let mut blob = conn.blob_open(rusqlite::MAIN_DB, "tablix_block", "data", key, false)?;
    if lo == 0 && piece.len() as u64 == stored {
        blob.write_all_at(piece, 0)?;
        drop(blob);
        return store_sum(conn, key, checksum::of(piece));
    }
    let mut old = vec![0u8; piece.len()];
    blob.read_at_exact(&mut old, lo)?;
    blob.write_all_at(piece, lo)?;
    drop(blob);
    let sum: Option<Vec<u8>> = conn
        .prepare_cached("SELECT crc FROM tablix_block_sum WHERE id = ?1")?
        .query_row(params![key], |r| r.get(0))
        .optional()?;
    let Some(Ok(sum)) = sum.map(<[u8; 4]>::try_from) else {
        return Ok(());
    };
    let after = stored as usize - lo - piece.len();
    let new = checksum::patched(u32::from_be_bytes(sum), &old, piece, after);
    store_sum(conn, key, new.to_be_bytes())
}

/// Writes `data` at `offset` of block range; returns the change in bytes
/// allocated.
fn write_range(conn: &Connection, ino: Ino, offset: u64, data: &[u8]) -> Result<i64, FsError> {
    let mut delta = 0i64;
    for span in spans(offset, offset + data.len() as u64) {
        let from = (span.start + span.lo as u64 - offset) as usize;
        let piece = &data[from..from + (span.hi - span.lo)];
        let key = block_key(ino, span.index);
        let stored = block_len(conn, key)?;
        if span.hi as u64 <= stored {
            // Inside the stored bytes (a whole block over a whole block too).
            patch_block(conn, key, span.lo, piece, stored)?;
        } else if span.lo == 0 && span.hi as u64 == BLOCK_SIZE {
            delta += BLOCK_SIZE as i64 - stored as i64;
            store_block(conn, key, piece)?;
        } else {
            let mut block = load_block(conn, key)?.unwrap_or_default();
            block.resize(span.hi, 0);
            block[span.lo..span.hi].copy_from_slice(piece);
            delta += block.len() as i64 - stored as i64;
            store_block(conn, key, &block)?;
        }
    }
    Ok(delta)
}

/// Drops set-user-ID, and set-group-ID when group-executable: what a write
/// without CAP_FSETID and any change of owner do to a file.
fn kill_suidgid(mode: u32) -> u32 {
    let mut mode = mode & !libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        mode &= !libc::S_ISGID;
    }
    mode
}

fn write(
    conn: &Connection,
    now: i64,
    ino: Ino,
    offset: u64,
    data: &[u8],
    kill_privs: bool,
) -> Result<FsReply, FsError> {
    let mut a = regular_file(conn, ino)?;
    if kill_privs {
        a.mode = kill_suidgid(a.mode);
    }
    let end = offset
        .checked_add(data.len() as u64)
        .filter(|&e| e <= MAX_FILE_SIZE)
        .ok_or(FsError::Errno(Errno::EFBIG))?;
    if data.is_empty() {
        return Ok(FsReply::Written(0));
    }
    let delta = write_range(conn, ino, offset, data)?;
    a.allocated = (a.allocated as i64 + delta).max(0) as u64;
    a.size = a.size.max(end);
    a.mtime_ns = now;
    a.ctime_ns = now;
    store_attr(conn, &a)?;
    Ok(FsReply::Written(data.len() as u32))
}

/// Zeroes `[from, to)` of stored data: whole blocks go, partial ones are
/// overwritten with zeros where they hold bytes. Returns the allocation
/// change.
fn zero_range(conn: &Connection, ino: Ino, from: u64, to: u64) -> Result<i64, FsError> {
    let mut delta = 0i64;
    for span in spans(from, to) {
        let key = block_key(ino, span.index);
        let Some(mut block) = load_block(conn, key)? else {
            continue;
        };
        if span.lo == 0 && (span.hi as u64 == BLOCK_SIZE || span.hi >= block.len()) {
            delta -= block.len() as i64;
            delete_block(conn, key)?;
        } else if span.lo < block.len() {
            let top = span.hi.min(block.len());
            block[span.lo..top].fill(0);
            store_block(conn, key, &block)?;
        }
    }
    Ok(delta)
}

fn fallocate(
    conn: &Connection,
    now: i64,
    ino: Ino,
    offset: u64,
    length: u64,
    mode: i32,
) -> Result<FsReply, FsError> {
    const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
    if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 {
        return Err(Errno::EOPNOTSUPP.into());
    }
    if mode & PUNCH_HOLE != 0 && (mode & KEEP_SIZE == 0 || mode & ZERO_RANGE != 0) {
        return Err(Errno::EOPNOTSUPP.into());
    }
    if length == 0 {
        return Err(Errno::EINVAL.into());
    }
    let mut a = regular_file(conn, ino)?;
    let end = offset
        .checked_add(length)
        .filter(|&e| e <= MAX_FILE_SIZE)
        .ok_or(FsError::Errno(Errno::EFBIG))?;
    let keep_size = mode & KEEP_SIZE != 0;
    // Allocating stores nothing: a range the file does not hold reads as
    // zeros already, and zeros stored there would not keep a later write
    // from ENOSPC (its bytes reach the command log and the WAL before the
    // file's pages, and those need room of their own). The mount checks
    // the data directory's room before it asks.
    if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 {
        let delta = zero_range(conn, ino, offset, end.min(a.size))?;
        a.allocated = (a.allocated as i64 + delta).max(0) as u64;
    }
    if !keep_size && end > a.size {
        a.size = end;
        a.mtime_ns = now;
    }
    if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 {
        a.mtime_ns = now;
    }
    a.ctime_ns = now;
    store_attr(conn, &a)?;
    Ok(FsReply::Done)
}

/// Checks an extended attribute name for `a`.
pub(crate) fn check_xattr_name(name: &[u8]) -> Result<(), FsError> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Errno::ERANGE.into());
    }
    let known = [&b"user."[..], b"trusted.", b"security."];
    if !known
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        // system.* (POSIX ACLs) and unknown namespaces are not offered.
        return Err(Errno::EOPNOTSUPP.into());
    }
    Ok(())
}

fn xattr_exists(conn: &Connection, ino: Ino, name: &[u8]) -> Result<bool, FsError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM tablix_xattr WHERE ino = ?1 AND name = ?2")?
        .query_row(params![ino as i64, name], |_| Ok(()))
        .optional()?
        .is_some())
}

fn set_xattr(
    conn: &Connection,
    now: i64,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    flags: i32,
) -> Result<FsReply, FsError> {
    let a = attr(conn, ino)?;
    check_xattr_name(name)?;
    if value.len() > XATTR_VALUE_MAX {
        return Err(Errno::E2BIG.into());
    }
    if name.starts_with(b"user.") && !matches!(a.file_type(), S_IFREG | S_IFDIR) {
        return Err(Errno::EPERM.into());
    }
    if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
        return Err(Errno::EINVAL.into());
    }
    let exists = xattr_exists(conn, ino, name)?;
    if flags & libc::XATTR_CREATE != 0 && exists {
        return Err(Errno::EEXIST.into());
    }
    if flags & libc::XATTR_REPLACE != 0 && !exists {
        return Err(Errno::ENODATA.into());
    }
    conn.prepare_cached(
        "INSERT OR REPLACE INTO tablix_xattr(ino, name, value) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![ino as i64, name, value])?;
    touch_inode(conn, ino, now)?;
    Ok(FsReply::Done)
}

fn remove_xattr(conn: &Connection, now: i64, ino: Ino, name: &[u8]) -> Result<FsReply, FsError> {
    attr(conn, ino)?;
    check_xattr_name(name)?;
    let n = conn
        .prepare_cached("DELETE FROM tablix_xattr WHERE ino = ?1 AND name = ?2")?
        .execute(params![ino as i64, name])?;
    if n == 0 {
        return Err(Errno::ENODATA.into());
    }
    touch_inode(conn, ino, now)?;
    Ok(FsReply::Done)
}
