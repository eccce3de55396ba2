//! The file-system checker: verifies the invariants the operations keep and,
//! when asked, repairs what can be repaired without guessing.
//!
//! Invariants checked (each finding names the one it saw broken):
//! 1. The database passes `PRAGMA integrity_check`.
//! 2. Every directory entry's parent is an existing directory.
//! 3. Every directory entry names an existing inode.
//! 4. A non-directory's nlink is the number of entries naming it; a
//!    directory's is 2 plus its subdirectories (0 once removed).
//! 5. Every inode but the root is named by an entry, or has nlink 0 (open
//!    but unlinked when the daemon stopped, reclaimed at the next mount;
//!    on a cluster, possibly still open on another node).
//! 6. Only regular files have data blocks; no stored byte lies at or past a
//!    file's size, and `allocated` is the bytes its blocks hold.
//! 7. A symlink has its target and nothing else has one.
//! 8. Every block's bytes match the checksum stored with them (only with
//!    [`Options::verify_data`]; a block written before checksums existed
//!    has none and is counted as unverified). Data cannot be repaired.
//! 9. A node's release of an inode (`tablix_release`) names an unlinked
//!    inode.
//! 10. A lock (`tablix_lock`) names an existing inode.
//! 11. A lock a lease took (`tablix_lost_lock`) names an existing inode.

use rusqlite::{Connection, OptionalExtension, params};

use crate::checksum;
use crate::errno::Errno;
use crate::error::FsError;
use crate::op::{Ino, ROOT};
use crate::schema::{BLOCK_SIZE, split_block_key};

/// What a check does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Fix what can be fixed safely (otherwise change nothing).
    pub repair: bool,
    /// Read every data block and compare it with its checksum.
    pub verify_data: bool,
}

/// Where a check is, for a caller that shows progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub phase: &'static str,
    /// Units done and in all (blocks while verifying data; 0 and 0 when a
    /// phase has no count).
    pub done: u64,
    pub total: u64,
}

/// Blocks read per query while verifying data: a progress report each.
const VERIFY_CHUNK: i64 = 256;

/// What a check found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// One line per problem found.
    pub problems: Vec<String>,
    /// One line per repair made.
    pub repairs: Vec<String>,
    /// Problems that were found but not repaired.
    pub unrepaired: usize,
    pub inodes: u64,
    pub entries: u64,
    pub blocks: u64,
    /// Blocks read and found to match their checksums.
    pub verified_blocks: u64,
    /// Blocks without a checksum (written before checksums existed).
    pub unverified_blocks: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

fn all<T: rusqlite::types::FromSql>(conn: &Connection, sql: &str) -> rusqlite::Result<Vec<T>> {
    let mut st = conn.prepare(sql)?;
    let rows = st.query_map([], |r| r.get(0))?;
    rows.collect()
}

/// Checks the file system; with `repair`, fixes what it safely can. With
/// repairs it runs on the store's writer inside a Command, so they are one
/// transaction; without, on any connection, read-only. `progress` hears of
/// each phase, and of every few blocks while data is verified.
pub fn check(
    conn: &Connection,
    now: i64,
    options: Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<Report, FsError> {
    let repair = options.repair;
    let mut r = Report::default();
    phase(progress, "integrity check of the database");
    let integrity: Vec<String> = all(conn, "PRAGMA integrity_check")?;
    if integrity != ["ok"] {
        for line in integrity {
            r.problems.push(format!("1: integrity_check: {line}"));
            r.unrepaired += 1;
        }
        // Row-level repairs on a damaged b-tree could make things worse.
        return Ok(r);
    }

    phase(progress, "directory entries");
    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT d.id FROM tablix_dirent d LEFT JOIN tablix_inode p ON p.ino = d.parent
         WHERE p.ino IS NULL OR (p.mode & 61440) != 16384",
        &["DELETE FROM tablix_dirent WHERE id = ?1"],
        |id| format!("2: entry {id} is in a missing or non-directory parent"),
        |id| format!("removed entry {id}"),
    )?;
    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT d.id FROM tablix_dirent d LEFT JOIN tablix_inode i ON i.ino = d.ino WHERE i.ino IS NULL",
        &["DELETE FROM tablix_dirent WHERE id = ?1"],
        |id| format!("3: entry {id} names a missing inode"),
        |id| format!("removed dangling entry {id}"),
    )?;

    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT r.ino FROM tablix_release r LEFT JOIN tablix_inode i ON i.ino = r.ino
         WHERE i.ino IS NULL OR i.nlink != 0 GROUP BY r.ino",
        &["DELETE FROM tablix_release WHERE ino = ?1"],
        |ino| format!("9: inode {ino} is released by a node but is missing or linked"),
        |ino| format!("removed the releases of inode {ino}"),
    )?;

    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT l.ino FROM tablix_lock l LEFT JOIN tablix_inode i ON i.ino = l.ino
         WHERE i.ino IS NULL GROUP BY l.ino",
        &["DELETE FROM tablix_lock WHERE ino = ?1"],
        |ino| format!("10: inode {ino} is locked but missing"),
        |ino| format!("removed the locks of missing inode {ino}"),
    )?;

    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT l.ino FROM tablix_lost_lock l LEFT JOIN tablix_inode i ON i.ino = l.ino
         WHERE i.ino IS NULL GROUP BY l.ino",
        &["DELETE FROM tablix_lost_lock WHERE ino = ?1"],
        |ino| format!("11: inode {ino} has a lost lock but is missing"),
        |ino| format!("removed the lost locks of missing inode {ino}"),
    )?;

    // Inodes no entry names: open-but-unlinked ones are expected (nlink 0);
    // others are lost and go to /lost+found.
    let unnamed: Vec<(i64, i64, i64)> = {
        let mut st = conn.prepare(
            "SELECT i.ino, i.nlink, i.mode FROM tablix_inode i
             WHERE i.ino != 1 AND NOT EXISTS (SELECT 1 FROM tablix_dirent d WHERE d.ino = i.ino)",
        )?;
        let rows = st.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    for (ino, nlink, mode) in unnamed {
        if nlink == 0 {
            r.problems.push(format!(
                "5: inode {ino} is unlinked but not yet reclaimed (it was open at shutdown, or on a cluster is open on another node)"
            ));
            if repair {
                crate::apply(
                    conn,
                    now,
                    &crate::FsOp::Reclaim {
                        inodes: vec![ino as u64],
                    },
                )?;
                r.repairs.push(format!("reclaimed inode {ino}"));
            }
        } else {
            r.problems.push(format!(
                "5: inode {ino} has nlink {nlink} but no entry names it"
            ));
            if repair {
                let dir = lost_and_found(conn, now)?;
                let name = format!("#{ino}");
                conn.execute(
                    "INSERT INTO tablix_dirent(parent, name, ino) VALUES (?1, ?2, ?3)",
                    params![dir as i64, name.as_bytes(), ino],
                )?;
                if (mode as u32 & libc::S_IFMT) == libc::S_IFDIR {
                    conn.execute(
                        "UPDATE tablix_inode SET nlink = nlink + 1 WHERE ino = ?1",
                        params![dir as i64],
                    )?;
                }
                r.repairs
                    .push(format!("linked inode {ino} as /lost+found/{name}"));
            }
        }
    }

    // Link counts, after the entries are repaired.
    phase(progress, "link counts");
    let links: Vec<(i64, i64, i64, i64)> = {
        let mut st = conn.prepare(
            "SELECT i.ino, i.nlink,
                    CASE WHEN (i.mode & 61440) = 16384 THEN
                        CASE WHEN i.ino = 1 OR EXISTS (SELECT 1 FROM tablix_dirent d WHERE d.ino = i.ino)
                             THEN 2 + (SELECT count(*) FROM tablix_dirent d JOIN tablix_inode c ON c.ino = d.ino
                                       WHERE d.parent = i.ino AND (c.mode & 61440) = 16384)
                             ELSE 0 END
                    ELSE (SELECT count(*) FROM tablix_dirent d WHERE d.ino = i.ino) END,
                    (SELECT count(*) FROM tablix_dirent d WHERE d.ino = i.ino)
             FROM tablix_inode i",
        )?;
        let rows = st.query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    for (ino, nlink, want, names) in links {
        if nlink != want {
            r.problems
                .push(format!("4: inode {ino} has nlink {nlink}, expected {want}"));
            if repair {
                conn.execute(
                    "UPDATE tablix_inode SET nlink = ?2 WHERE ino = ?1",
                    params![ino, want],
                )?;
                r.repairs
                    .push(format!("set nlink of inode {ino} to {want}"));
            }
        }
        if names > 1 && want > 0 && nlink >= 2 && ino as u64 != ROOT {
            let is_dir: bool = conn.query_row(
                "SELECT (mode & 61440) = 16384 FROM tablix_inode WHERE ino = ?1",
                params![ino],
                |row| row.get(0),
            )?;
            if is_dir {
                r.problems
                    .push(format!("4: directory {ino} has {names} entries"));
                r.unrepaired += 1;
            }
        }
    }

    phase(progress, "block placement and sizes");
    check_blocks(conn, repair, &mut r)?;

    let bad_links: Vec<i64> = all(
        conn,
        "SELECT i.ino FROM tablix_inode i LEFT JOIN tablix_symlink s ON s.ino = i.ino
         WHERE (i.mode & 61440) = 40960 AND s.ino IS NULL",
    )?;
    for ino in bad_links {
        r.problems.push(format!("7: symlink {ino} has no target"));
        r.unrepaired += 1;
    }
    remove_found(
        conn,
        repair,
        &mut r,
        "SELECT s.ino FROM tablix_symlink s LEFT JOIN tablix_inode i ON i.ino = s.ino
         WHERE i.ino IS NULL OR (i.mode & 61440) != 40960",
        &["DELETE FROM tablix_symlink WHERE ino = ?1"],
        |ino| format!("7: inode {ino} has a symlink target but is not a symlink"),
        |ino| format!("removed the stray target of {ino}"),
    )?;
    if options.verify_data {
        verify_data(conn, &mut r, progress)?;
    }
    if !repair {
        r.unrepaired = r.problems.len();
    }
    r.inodes = conn.query_row("SELECT count(*) FROM tablix_inode", [], |row| {
        row.get::<_, i64>(0)
    })? as u64;
    r.entries = conn.query_row("SELECT count(*) FROM tablix_dirent", [], |row| {
        row.get::<_, i64>(0)
    })? as u64;
    r.blocks = conn.query_row("SELECT count(*) FROM tablix_block", [], |row| {
        row.get::<_, i64>(0)
    })? as u64;
    Ok(r)
}

fn check_blocks(conn: &Connection, repair: bool, r: &mut Report) -> Result<(), FsError> {
    // Blocks of missing or non-regular inodes.
    remove_found(
        conn,
        repair,
        r,
        "SELECT b.id FROM tablix_block b LEFT JOIN tablix_inode i ON i.ino = b.id >> 24
         WHERE i.ino IS NULL OR (i.mode & 61440) != 32768",
        &[
            "DELETE FROM tablix_block WHERE id = ?1",
            "DELETE FROM tablix_block_sum WHERE id = ?1",
        ],
        |id| {
            let (ino, index) = split_block_key(id);
            format!("6: block {index} of inode {ino} belongs to no regular file")
        },
        |id| format!("removed block {id}"),
    )?;
    // Checksums of blocks that are gone.
    remove_found(
        conn,
        repair,
        r,
        "SELECT s.id FROM tablix_block_sum s LEFT JOIN tablix_block b ON b.id = s.id
         WHERE b.id IS NULL",
        &["DELETE FROM tablix_block_sum WHERE id = ?1"],
        |id| {
            let (ino, index) = split_block_key(id);
            format!("11: block {index} of inode {ino} has a checksum but no data")
        },
        |id| format!("removed the checksum of missing block {id}"),
    )?;
    // Bytes stored past the size.
    let past: Vec<(i64, i64, i64, i64)> = {
        let mut st = conn.prepare(
            "SELECT b.id, b.id & 16777215, length(b.data), i.size
             FROM tablix_block b JOIN tablix_inode i ON i.ino = b.id >> 24
             WHERE (b.id & 16777215) * ?1 + length(b.data) > i.size",
        )?;
        let rows = st.query_map(params![BLOCK_SIZE as i64], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })?;
        rows.collect::<Result<_, _>>()?
    };
    for (id, idx, len, size) in past {
        let ino = split_block_key(id).0;
        r.problems.push(format!(
            "6: block {idx} of inode {ino} holds {len} bytes, past the size {size}"
        ));
        if repair {
            let start = idx * BLOCK_SIZE as i64;
            if start >= size {
                conn.execute("DELETE FROM tablix_block WHERE id = ?1", params![id])?;
                conn.execute("DELETE FROM tablix_block_sum WHERE id = ?1", params![id])?;
            } else {
                let keep: Vec<u8> = conn.query_row(
                    "SELECT substr(data, 1, ?2) FROM tablix_block WHERE id = ?1",
                    params![id, size - start],
                    |row| row.get(0),
                )?;
                conn.execute(
                    "UPDATE tablix_block SET data = ?2 WHERE id = ?1",
                    params![id, keep],
                )?;
                conn.execute(
                    "INSERT OR REPLACE INTO tablix_block_sum(id, crc) VALUES (?1, ?2)",
                    params![id, &checksum::of(&keep)[..]],
                )?;
            }
            r.repairs
                .push(format!("trimmed block {idx} of inode {ino} to the size"));
        }
    }
    let wrong_alloc: Vec<(i64, i64, i64)> = {
        let mut st = conn.prepare(
            "SELECT i.ino, i.allocated,
                    (SELECT coalesce(sum(length(b.data)), 0) FROM tablix_block b
                     WHERE b.id BETWEEN i.ino << 24 AND (i.ino << 24) | 16777215)
             FROM tablix_inode i WHERE (i.mode & 61440) = 32768",
        )?;
        let rows = st.query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?;
        rows.collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .collect()
    };
    for (ino, recorded, actual) in wrong_alloc {
        r.problems.push(format!(
            "6: inode {ino} records {recorded} bytes allocated, its blocks hold {actual}"
        ));
        if repair {
            conn.execute(
                "UPDATE tablix_inode SET allocated = ?2 WHERE ino = ?1",
                params![ino, actual],
            )?;
            r.repairs
                .push(format!("set the allocation of inode {ino} to {actual}"));
        }
    }
    Ok(())
}

fn phase(progress: &mut dyn FnMut(Progress), name: &'static str) {
    progress(Progress {
        phase: name,
        done: 0,
        total: 0,
    });
}

/// Reads every block and compares it with its checksum (invariant 8).
fn verify_data(
    conn: &Connection,
    r: &mut Report,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), FsError> {
    let total: i64 = conn.query_row("SELECT count(*) FROM tablix_block", [], |row| row.get(0))?;
    let mut after = i64::MIN;
    let mut done = 0;
    loop {
        progress(Progress {
            phase: "data blocks against their checksums",
            done,
            total: total as u64,
        });
        let (last, seen) = verify_blocks(conn, after, VERIFY_CHUNK, r)?;
        done += seen;
        match last {
            Some(key) if seen == VERIFY_CHUNK as u64 => after = key,
            _ => return Ok(()),
        }
    }
}

/// Verifies up to `limit` blocks with keys above `after` against their
/// checksums (invariant 8), counting them in `r` and adding a problem per
/// damaged one. Returns the last key read and how many were read, so that
/// a caller can go on from there in another transaction (`tablix scrub`).
pub fn verify_blocks(
    conn: &Connection,
    after: i64,
    limit: i64,
    r: &mut Report,
) -> Result<(Option<i64>, u64), FsError> {
    let mut st = conn.prepare_cached(
        "SELECT b.id, b.data, s.crc FROM tablix_block b LEFT JOIN tablix_block_sum s ON s.id = b.id
         WHERE b.id > ?1 ORDER BY b.id LIMIT ?2",
    )?;
    let mut rows = st.query(params![after, limit])?;
    let mut last = None;
    let mut seen = 0;
    while let Some(row) = rows.next()? {
        seen += 1;
        let id: i64 = row.get(0)?;
        last = Some(id);
        let data = row
            .get_ref(1)?
            .as_blob()
            .map_err(|_| FsError::Errno(Errno::EIO))?;
        let Some(stored) = row
            .get_ref(2)?
            .as_blob_or_null()
            .map_err(|_| FsError::Errno(Errno::EIO))?
        else {
            r.unverified_blocks += 1;
            continue;
        };
        let computed = crc32fast::hash(data);
        match checksum::from_stored(stored) {
            Some(want) if want == computed => r.verified_blocks += 1,
            want => {
                let (ino, index) = split_block_key(id);
                r.problems.push(format!(
                    "8: block {index} of inode {ino} ({}) does not match its checksum (stored {}, computed {computed:08x}): its data is damaged",
                    path_of(conn, ino)?,
                    want.map_or_else(|| "malformed".to_string(), |w| format!("{w:08x}")),
                ));
                r.unrepaired += 1;
            }
        }
    }
    Ok((last, seen))
}

/// One path naming `ino`, for messages ("?" parts where entries are gone).
pub fn path_of(conn: &Connection, ino: Ino) -> Result<String, FsError> {
    let mut parts = Vec::new();
    let mut at = ino;
    // Bounded: a damaged tree could loop.
    for _ in 0..4096 {
        if at == ROOT {
            break;
        }
        let up: Option<(i64, Vec<u8>)> = conn
            .prepare_cached("SELECT parent, name FROM tablix_dirent WHERE ino = ?1 LIMIT 1")?
            .query_row(params![at as i64], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        match up {
            Some((parent, name)) => {
                parts.push(String::from_utf8_lossy(&name).into_owned());
                at = parent as u64;
            }
            None => {
                parts.push(format!("<inode {at}, no name>"));
                break;
            }
        }
    }
    parts.reverse();
    Ok(format!("/{}", parts.join("/")))
}

/// Reports each row `find` returns as a problem and, with `repair`, removes
/// it with `delete` (which takes the row's key as ?1).
fn remove_found(
    conn: &Connection,
    repair: bool,
    r: &mut Report,
    find: &str,
    delete: &[&str],
    problem: impl Fn(i64) -> String,
    repaired: impl Fn(i64) -> String,
) -> Result<(), FsError> {
    for key in all::<i64>(conn, find)? {
        r.problems.push(problem(key));
        if repair {
            for sql in delete {
                conn.execute(sql, params![key])?;
            }
            r.repairs.push(repaired(key));
        }
    }
    Ok(())
}

/// The `/lost+found` directory, created if missing.
fn lost_and_found(conn: &Connection, now: i64) -> Result<Ino, FsError> {
    if let Some((_, ino)) = crate::inode::child(conn, ROOT, b"lost+found")? {
        return Ok(ino);
    }
    let reply = crate::apply(
        conn,
        now,
        &crate::FsOp::MakeNode {
            parent: ROOT,
            name: b"lost+found".to_vec(),
            mode: libc::S_IFDIR | 0o700,
            rdev: 0,
            uid: 0,
            gid: 0,
        },
    )?;
    match reply {
        crate::FsReply::Attr(a) => Ok(a.ino),
        _ => Err(Errno::EIO.into()),
    }
}
