//! The file system's tables in the persistent database.
//!
//! Data blocks are keyed by one integer, `ino << BLOCK_INDEX_BITS | index`,
//! so a block is found by a single rowid lookup and a file's blocks are one
//! contiguous rowid range (truncation and reads are range scans, with no
//! secondary index to maintain). The view `tablix_blocks` shows the two
//! parts to SQL; the table itself has no generated columns, because SQLite
//! cannot open incremental blob handles on such a table.

/// Bytes per data block: 64 KiB, chosen by measurement (see DESIGN.md).
pub const BLOCK_SIZE: u64 = 65536;

/// Bits of the block key that hold the block index.
pub const BLOCK_INDEX_BITS: u32 = 24;

/// The largest file size: every block index fits in its bits.
pub const MAX_FILE_SIZE: u64 = BLOCK_SIZE << BLOCK_INDEX_BITS;

/// Longest name of one directory entry, as on every Linux file system.
pub const NAME_MAX: usize = 255;

/// Longest symlink target (PATH_MAX less its terminating NUL).
pub const SYMLINK_MAX: usize = 4095;

/// Most hard links one inode may have.
pub const LINK_MAX: u32 = 65000;

/// Largest extended attribute value (XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;

/// The largest block index.
pub const LAST_BLOCK_INDEX: u64 = (1 << BLOCK_INDEX_BITS) - 1;

/// Inode numbers of the file system stay below this; the mount's virtual
/// inodes (the control directory and pipes) start here.
pub const MAX_INO: u64 = 1 << 48;

/// The key of block `index` of inode `ino`.
pub fn block_key(ino: u64, index: u64) -> i64 {
    ((ino << BLOCK_INDEX_BITS) | index) as i64
}

/// The inode and block index a block key stands for.
pub fn split_block_key(key: i64) -> (u64, u64) {
    let key = key as u64;
    (key >> BLOCK_INDEX_BITS, key & LAST_BLOCK_INDEX)
}

/// The part of one block a byte range `[from, to)` covers.
pub(crate) struct Span {
    pub index: u64,
    /// Offset of the block in the file.
    pub start: u64,
    /// The covered bytes within the block.
    pub lo: usize,
    pub hi: usize,
}

/// The blocks `[from, to)` touches, in order, with the part of each.
pub(crate) fn spans(from: u64, to: u64) -> impl Iterator<Item = Span> {
    let mut pos = from;
    std::iter::from_fn(move || {
        if pos >= to {
            return None;
        }
        let index = pos / BLOCK_SIZE;
        let start = index * BLOCK_SIZE;
        let span = Span {
            index,
            start,
            lo: (pos - start) as usize,
            hi: (to.min(start + BLOCK_SIZE) - start) as usize,
        };
        pos = start + span.hi as u64;
        Some(span)
    })
}

/// The file system's migrations of the persistent database, as
/// (schema version, SQL): the store runs them, in version order among the
/// other domains', on the file system's writer connection. Each is frozen
/// once released (a change is a new migration appended here), which
/// `released_migrations_are_frozen` checks.
pub const MIGRATIONS: &[(u32, &str)] = &[
    (2, MIGRATION_2),
    (3, MIGRATION_3),
    (4, MIGRATION_4),
    (6, MIGRATION_6),
    (7, MIGRATION_7),
    (8, MIGRATION_8),
];

/// The file system's tables that the store checks at every start (SQLite's
/// quick_check), before anything writes: its metadata, small next to the
/// data blocks, which `tablix fsck` checks whole.
pub const QUICK_CHECKED: &[&str] = &[
    "tablix_inode",
    "tablix_dirent",
    "tablix_symlink",
    "tablix_xattr",
    "tablix_block_sum",
    "tablix_mount",
    "tablix_release",
    "tablix_lock",
    "tablix_lost_lock",
];

/// The store's migration 2: creates the file system, with its root
/// directory. The root gets its owner and times at the first mount
/// (`FsOp::Mount`). Frozen.
pub const MIGRATION_2: &str = "
CREATE TABLE main.tablix_inode(
    ino       INTEGER PRIMARY KEY AUTOINCREMENT,
    mode      INTEGER NOT NULL,
    nlink     INTEGER NOT NULL,
    uid       INTEGER NOT NULL,
    gid       INTEGER NOT NULL,
    rdev      INTEGER NOT NULL DEFAULT 0,
    size      INTEGER NOT NULL DEFAULT 0,
    allocated INTEGER NOT NULL DEFAULT 0,
    atime_ns  INTEGER NOT NULL,
    mtime_ns  INTEGER NOT NULL,
    ctime_ns  INTEGER NOT NULL,
    btime_ns  INTEGER NOT NULL
) STRICT;
CREATE INDEX main.tablix_inode_unlinked ON tablix_inode(ino) WHERE nlink = 0;
CREATE TABLE main.tablix_dirent(
    id     INTEGER PRIMARY KEY,
    parent INTEGER NOT NULL,
    name   BLOB NOT NULL,
    ino    INTEGER NOT NULL,
    UNIQUE(parent, name)
) STRICT;
CREATE INDEX main.tablix_dirent_parent ON tablix_dirent(parent);
CREATE INDEX main.tablix_dirent_ino ON tablix_dirent(ino);
CREATE TABLE main.tablix_block(
    id   INTEGER PRIMARY KEY,
    data BLOB NOT NULL
) STRICT;
CREATE VIEW main.tablix_blocks AS
    SELECT id >> 24 AS ino, id & 16777215 AS idx, length(data) AS bytes, data
    FROM tablix_block;
CREATE TABLE main.tablix_symlink(
    ino    INTEGER PRIMARY KEY,
    target BLOB NOT NULL
) STRICT;
CREATE TABLE main.tablix_xattr(
    ino   INTEGER NOT NULL,
    name  BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY(ino, name)
) STRICT, WITHOUT ROWID;
INSERT INTO main.tablix_inode(ino, mode, nlink, uid, gid, atime_ns, mtime_ns, ctime_ns, btime_ns)
    VALUES (1, 16877, 2, 0, 0, 0, 0, 0, 0);
INSERT INTO main.tablix_meta(key, value) VALUES ('fs_block_size', 65536);
CREATE VIEW main.files AS
WITH RECURSIVE walk(ino, path) AS (
    SELECT 1, '/'
    UNION ALL
    SELECT d.ino, CASE WHEN w.path = '/' THEN '/' ELSE w.path || '/' END || CAST(d.name AS TEXT)
    FROM walk w
    JOIN tablix_inode p ON p.ino = w.ino AND (p.mode & 61440) = 16384
    JOIN tablix_dirent d ON d.parent = w.ino
)
SELECT w.path AS path,
       i.ino AS ino,
       CASE i.mode & 61440
           WHEN 32768 THEN 'file' WHEN 16384 THEN 'dir' WHEN 40960 THEN 'symlink'
           WHEN 4096 THEN 'fifo' WHEN 49152 THEN 'socket' WHEN 8192 THEN 'chardev'
           WHEN 24576 THEN 'blockdev' ELSE 'unknown' END AS type,
       i.size AS size,
       printf('%04o', i.mode & 4095) AS mode,
       i.uid AS uid,
       i.gid AS gid,
       i.nlink AS nlink,
       CAST((SELECT s.target FROM tablix_symlink s WHERE s.ino = i.ino) AS TEXT) AS target,
       strftime('%Y-%m-%d %H:%M:%f', i.atime_ns / 1e9, 'unixepoch') AS atime,
       strftime('%Y-%m-%d %H:%M:%f', i.mtime_ns / 1e9, 'unixepoch') AS mtime,
       strftime('%Y-%m-%d %H:%M:%f', i.ctime_ns / 1e9, 'unixepoch') AS ctime,
       strftime('%Y-%m-%d %H:%M:%f', i.btime_ns / 1e9, 'unixepoch') AS btime
FROM walk w JOIN tablix_inode i ON i.ino = w.ino;
";

/// The store's migration 3, after [`MIGRATION_2`]. Frozen.
///
/// * Inode numbers come from `tablix_meta.next_ino` instead of
///   AUTOINCREMENT, so `sqlite_sequence` holds only rows of user tables and
///   user SQL may change it freely. The table is rebuilt without the
///   keyword, keeping every row.
/// * Data blocks get a checksum column (`crc`: CRC-32 of `data`, 4 bytes
///   big-endian, written with the data; NULL for blocks written before it).
/// * The `files` view leaves the database: it is created per connection in
///   the temp schema ([`USER_VIEWS`]), where it can apply the permissions of
///   whoever queries it.
///
/// Runs with `legacy_alter_table` on and foreign keys off, so that objects
/// of other owners cannot stop it.
pub const MIGRATION_3: &str = "
DROP VIEW IF EXISTS main.files;
CREATE TABLE main.tablix_inode_v3(
    ino       INTEGER PRIMARY KEY,
    mode      INTEGER NOT NULL,
    nlink     INTEGER NOT NULL,
    uid       INTEGER NOT NULL,
    gid       INTEGER NOT NULL,
    rdev      INTEGER NOT NULL DEFAULT 0,
    size      INTEGER NOT NULL DEFAULT 0,
    allocated INTEGER NOT NULL DEFAULT 0,
    atime_ns  INTEGER NOT NULL,
    mtime_ns  INTEGER NOT NULL,
    ctime_ns  INTEGER NOT NULL,
    btime_ns  INTEGER NOT NULL
) STRICT;
INSERT INTO main.tablix_inode_v3
    SELECT ino, mode, nlink, uid, gid, rdev, size, allocated, atime_ns, mtime_ns, ctime_ns, btime_ns
    FROM main.tablix_inode;
INSERT INTO main.tablix_meta(key, value) VALUES ('next_ino', 1 + max(
    coalesce((SELECT seq FROM main.sqlite_sequence WHERE name = 'tablix_inode'), 0),
    coalesce((SELECT max(ino) FROM main.tablix_inode), 0)));
DROP TABLE main.tablix_inode;
ALTER TABLE main.tablix_inode_v3 RENAME TO tablix_inode;
CREATE INDEX main.tablix_inode_unlinked ON tablix_inode(ino) WHERE nlink = 0;
DELETE FROM main.sqlite_sequence WHERE name = 'tablix_inode';
ALTER TABLE main.tablix_block ADD COLUMN crc BLOB;
";

/// The store's migration 4, after [`MIGRATION_3`]. Frozen.
///
/// Checksums move to their own table, `tablix_block_sum` (`crc`: CRC-32 of
/// the block's `data`, 4 bytes big-endian; no row for a block written
/// before checksums). As the last column of a 64 KiB row a checksum lay at
/// the end of the row's overflow chain, so patching a block walked the
/// whole chain and dirtied its last page; as a row of its own it shares a
/// small leaf page with its neighbours' sums.
pub const MIGRATION_4: &str = "
CREATE TABLE main.tablix_block_sum(
    id  INTEGER PRIMARY KEY,
    crc BLOB NOT NULL
) STRICT;
INSERT INTO main.tablix_block_sum(id, crc)
    SELECT id, crc FROM main.tablix_block WHERE crc IS NOT NULL;
ALTER TABLE main.tablix_block DROP COLUMN crc;
";

/// The store's migration 6 (the store's own 5 comes between). Frozen.
///
/// An unlinked inode (nlink 0) stays while a kernel may hold it open. On
/// a cluster every node's kernel may: `tablix_mount` lists the nodes that
/// mount the file system (`FsOp::MountNode`, `FsOp::Unmount`), and
/// `tablix_release` the unlinked inodes each has let go of
/// (`FsOp::Release`); an inode all of them released is freed. A single
/// node's mount records nothing here.
pub const MIGRATION_6: &str = "
CREATE TABLE main.tablix_mount(
    node INTEGER PRIMARY KEY
) STRICT;
CREATE TABLE main.tablix_release(
    ino  INTEGER NOT NULL,
    node INTEGER NOT NULL,
    PRIMARY KEY(ino, node)
) STRICT, WITHOUT ROWID;
";

/// The store's migration 7, after [`MIGRATION_6`]. Frozen.
///
/// A cluster's advisory locks (`FsOp::Lock`): each row is one owner's
/// lock on bytes `start..=end` of an inode, `write` or not, the owner
/// being a kernel's lock owner on `node`. A single node's kernel keeps
/// its locks itself and records none.
pub const MIGRATION_7: &str = "
CREATE TABLE main.tablix_lock(
    ino   INTEGER NOT NULL,
    node  INTEGER NOT NULL,
    owner INTEGER NOT NULL,
    start INTEGER NOT NULL,
    end   INTEGER NOT NULL,
    write INTEGER NOT NULL,
    pid   INTEGER NOT NULL,
    PRIMARY KEY(ino, node, owner, start)
) STRICT, WITHOUT ROWID;
";

/// The store's migration 8, after [`MIGRATION_7`]. Frozen.
///
/// The locks a cluster node's lease took from it (`FsOp::ExpireLocks`):
/// one row per process (`pid`, the lock owner `owner`) of `node` that
/// held a lock on `ino` then. That process's writes to the file fail
/// until it closes it (the owner's unlock of the whole file as it
/// closes, FLUSH or for a `flock` RELEASE, takes the row away), as an
/// NFS client's do once its lease is lost.
pub const MIGRATION_8: &str = "
CREATE TABLE main.tablix_lost_lock(
    node  INTEGER NOT NULL,
    ino   INTEGER NOT NULL,
    pid   INTEGER NOT NULL,
    owner INTEGER NOT NULL,
    PRIMARY KEY(node, ino, pid, owner)
) STRICT, WITHOUT ROWID;
";

/// The file system as SQL users see it: `files`, one row per path the
/// querying user could look up (every directory on the way searchable by
/// them, as `tablix_may` decides). Created in the temp schema of each
/// connection that runs user SQL; `tablix_may(mode, uid, gid, mask)` is the
/// store's permission check for the current request's user. Inner names
/// start with `tablix_`, a prefix user SQL may not give a CTE.
pub const USER_VIEWS: &str = "
CREATE TEMP VIEW files AS
WITH RECURSIVE tablix_walk(ino, path) AS (
    SELECT 1, '/'
    UNION ALL
    SELECT d.ino, CASE WHEN w.path = '/' THEN '/' ELSE w.path || '/' END || CAST(d.name AS TEXT)
    FROM tablix_walk w
    JOIN main.tablix_inode p ON p.ino = w.ino AND (p.mode & 61440) = 16384
        AND tablix_may(p.mode, p.uid, p.gid, 1)
    JOIN main.tablix_dirent d ON d.parent = w.ino
)
SELECT w.path AS path,
       i.ino AS ino,
       CASE i.mode & 61440
           WHEN 32768 THEN 'file' WHEN 16384 THEN 'dir' WHEN 40960 THEN 'symlink'
           WHEN 4096 THEN 'fifo' WHEN 49152 THEN 'socket' WHEN 8192 THEN 'chardev'
           WHEN 24576 THEN 'blockdev' ELSE 'unknown' END AS type,
       i.size AS size,
       printf('%04o', i.mode & 4095) AS mode,
       i.uid AS uid,
       i.gid AS gid,
       i.nlink AS nlink,
       CAST((SELECT s.target FROM main.tablix_symlink s WHERE s.ino = i.ino) AS TEXT) AS target,
       strftime('%Y-%m-%d %H:%M:%f', i.atime_ns / 1e9, 'unixepoch') AS atime,
       strftime('%Y-%m-%d %H:%M:%f', i.mtime_ns / 1e9, 'unixepoch') AS mtime,
       strftime('%Y-%m-%d %H:%M:%f', i.ctime_ns / 1e9, 'unixepoch') AS ctime,
       strftime('%Y-%m-%d %H:%M:%f', i.btime_ns / 1e9, 'unixepoch') AS btime
FROM tablix_walk w JOIN main.tablix_inode i ON i.ino = w.ino;
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_literals_agree_with_the_constants() {
        assert!(MIGRATION_2.contains(&format!("('fs_block_size', {BLOCK_SIZE})")));
        assert!(MIGRATION_2.contains(&format!("id >> {BLOCK_INDEX_BITS}")));
        assert!(MIGRATION_2.contains(&format!("id & {}", (1u64 << BLOCK_INDEX_BITS) - 1)));
        assert_eq!(MAX_FILE_SIZE, 1 << 40);
        assert_eq!(block_key(3, 5), (3 << 24) | 5);
        assert_eq!(split_block_key(block_key(3, 5)), (3, 5));
    }

    #[test]
    fn spans_cover_a_range_block_by_block() {
        let got: Vec<_> = spans(BLOCK_SIZE - 2, 2 * BLOCK_SIZE + 3)
            .map(|s| (s.index, s.start, s.lo, s.hi))
            .collect();
        let b = BLOCK_SIZE as usize;
        assert_eq!(
            got,
            [
                (0, 0, b - 2, b),
                (1, BLOCK_SIZE, 0, b),
                (2, 2 * BLOCK_SIZE, 0, 3)
            ]
        );
        assert_eq!(spans(5, 5).count(), 0);
    }
}
