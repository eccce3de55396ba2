//! Deterministic application of pipe operations.

use rusqlite::{Connection, MAIN_DB, OptionalExtension, params};

use crate::op::{End, PipeError, PipeOp, PipeReply, PipeState};
use crate::read::state;
use crate::schema::valid_name;

/// Applies `op` inside the caller's transaction on the memory database, at
/// `now_ns` (the Command's stamp).
pub fn apply(conn: &Connection, now_ns: i64, op: &PipeOp) -> Result<PipeReply, PipeError> {
    match op {
        PipeOp::Create {
            name,
            uid,
            gid,
            mode,
            capacity,
            exclusive,
        } => create(
            conn,
            name,
            (*uid, *gid, *mode),
            *capacity,
            *exclusive,
            now_ns,
        ),
        PipeOp::Open {
            pipe,
            handle,
            end,
            pid,
        } => open(conn, *pipe, *handle, *end, *pid, now_ns),
        PipeOp::Close { handle } => close(conn, *handle, now_ns),
        PipeOp::Holds { pid, parent, held } => holds(conn, *pid, *parent, held, now_ns),
        PipeOp::Io {
            pipe,
            write: data,
            read: max,
            read_first,
        } => io(conn, *pipe, data, *max, *read_first, now_ns),
        PipeOp::SetCapacity { pipe, capacity } => set_capacity(conn, *pipe, *capacity, now_ns),
        PipeOp::Unlink { name } => unlink(conn, name, now_ns),
    }
}

fn create(
    conn: &Connection,
    name: &str,
    (uid, gid, mode): (u32, u32, u32),
    capacity: u32,
    exclusive: bool,
    now_ns: i64,
) -> Result<PipeReply, PipeError> {
    if !valid_name(name) {
        return Err(PipeError::InvalidName(name.to_string()));
    }
    if !(4096..=1 << 30).contains(&capacity) {
        return Err(PipeError::InvalidCapacity(capacity));
    }
    let found: Option<i64> = conn
        .prepare_cached("SELECT id FROM pipe WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    if let Some(pipe) = found {
        if exclusive {
            return Err(PipeError::Exists(name.to_string()));
        }
        return Ok(PipeReply::Created {
            pipe,
            existed: true,
        });
    }
    conn.prepare_cached(
        "INSERT INTO pipe(name, uid, gid, mode, capacity, created_ns, changed_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
    )?
    .execute(params![name, uid, gid, mode & 0o7777, capacity, now_ns])?;
    Ok(PipeReply::Created {
        pipe: conn.last_insert_rowid(),
        existed: false,
    })
}

fn ends(conn: &Connection, pipe: i64, end: End, delta: i64, now_ns: i64) -> Result<(), PipeError> {
    let (r, w) = (
        i64::from(end.reads()) * delta,
        i64::from(end.writes()) * delta,
    );
    conn.prepare_cached(
        "UPDATE pipe SET readers = readers + ?2, writers = writers + ?3, changed_ns = ?4
         WHERE id = ?1",
    )?
    .execute(params![pipe, r, w, now_ns])?;
    Ok(())
}

fn open(
    conn: &Connection,
    pipe: i64,
    handle: u64,
    end: End,
    pid: u32,
    now_ns: i64,
) -> Result<PipeReply, PipeError> {
    state(conn, pipe)?;
    let handle = i64::try_from(handle).map_err(|_| PipeError::NoSuchHandle(handle))?;
    conn.prepare_cached(
        "INSERT INTO pipe_end(handle, pipe, end, opened_ns) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![handle, pipe, end.as_str(), now_ns])?;
    conn.prepare_cached("INSERT INTO pid_pipe(pid, handle, since_ns) VALUES (?1, ?2, ?3)")?
        .execute(params![pid, handle, now_ns])?;
    ends(conn, pipe, end, 1, now_ns)?;
    Ok(PipeReply::Ends {
        pipe,
        state: state(conn, pipe)?,
        removed: false,
    })
}

/// Removes `pipe` if it has no name and no open end.
fn collect(conn: &Connection, pipe: i64) -> Result<bool, PipeError> {
    let unused: bool = conn
        .prepare_cached(
            "SELECT name IS NULL AND readers = 0 AND writers = 0 FROM pipe WHERE id = ?1",
        )?
        .query_row([pipe], |r| r.get(0))
        .optional()?
        .unwrap_or(false);
    if unused {
        conn.prepare_cached("DELETE FROM pipe_data WHERE pipe = ?1")?
            .execute([pipe])?;
        conn.prepare_cached("DELETE FROM pipe WHERE id = ?1")?
            .execute([pipe])?;
    }
    Ok(unused)
}

fn close(conn: &Connection, handle: u64, now_ns: i64) -> Result<PipeReply, PipeError> {
    let key = i64::try_from(handle).map_err(|_| PipeError::NoSuchHandle(handle))?;
    let found: Option<(i64, String)> = conn
        .prepare_cached("SELECT pipe, end FROM pipe_end WHERE handle = ?1")?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((pipe, end)) = found else {
        return Err(PipeError::NoSuchHandle(handle));
    };
    let end = End::parse(&end);
    conn.prepare_cached("DELETE FROM pid_pipe WHERE handle = ?1")?
        .execute([key])?;
    conn.prepare_cached("DELETE FROM pipe_end WHERE handle = ?1")?
        .execute([key])?;
    ends(conn, pipe, end, -1, now_ns)?;
    let s = state(conn, pipe)?;
    if s.readers == 0 && s.writers == 0 && s.buffered > 0 {
        // Like a Linux FIFO, a pipe nobody has open keeps no bytes.
        conn.prepare_cached("DELETE FROM pipe_data WHERE pipe = ?1")?
            .execute([pipe])?;
        conn.prepare_cached("UPDATE pipe SET buffered = 0, head = 0 WHERE id = ?1")?
            .execute([pipe])?;
    }
    let removed = collect(conn, pipe)?;
    Ok(PipeReply::Ends {
        pipe,
        state: PipeState {
            buffered: if s.readers == 0 && s.writers == 0 {
                0
            } else {
                s.buffered
            },
            ..s
        },
        removed,
    })
}

/// Makes `pid`'s rows of `pid_pipe` the ends `held`: see `PipeOp::Holds`.
fn holds(
    conn: &Connection,
    pid: u32,
    parent: Option<u32>,
    held: &[(i64, End)],
    now_ns: i64,
) -> Result<PipeReply, PipeError> {
    let had: Vec<(i64, i64, String)> = conn
        .prepare_cached(
            "SELECT h.handle, e.pipe, e.end FROM pid_pipe h JOIN pipe_end e ON e.handle = h.handle
             WHERE h.pid = ?1",
        )?
        .query_map([pid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut removed = 0;
    for (handle, pipe, end) in &had {
        if !held.contains(&(*pipe, End::parse(end))) {
            conn.prepare_cached("DELETE FROM pid_pipe WHERE pid = ?1 AND handle = ?2")?
                .execute(params![pid, handle])?;
            removed += 1;
        }
    }
    let mut added = 0;
    for &(pipe, end) in held {
        let kept = had
            .iter()
            .any(|(_, p, e)| *p == pipe && End::parse(e) == end);
        if kept {
            continue;
        }
        // Which of the pipe's open handles with this end the descriptor is
        // cannot be seen from /proc; the parent's is the likely one (an
        // inherited descriptor), else the newest.
        let handle: Option<i64> = conn
            .prepare_cached(
                "SELECT e.handle FROM pipe_end e
                 WHERE e.pipe = ?1 AND e.end = ?2
                 ORDER BY e.handle IN (SELECT handle FROM pid_pipe WHERE pid = ?3) DESC,
                          e.handle DESC
                 LIMIT 1",
            )?
            .query_row(params![pipe, end.as_str(), parent], |r| r.get(0))
            .optional()?;
        if let Some(handle) = handle {
            added += conn
                .prepare_cached(
                    "INSERT OR IGNORE INTO pid_pipe(pid, handle, since_ns) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![pid, handle, now_ns])? as u32;
        }
    }
    Ok(PipeReply::Held { added, removed })
}

/// Process `child` was forked by `parent`: it holds every end its parent
/// holds. Returns whether it holds any now, when what it really holds is
/// worth reading (`PipeOp::Holds`): it may have closed some before its
/// fork was applied, and rows recorded from its own descriptors before
/// then are kept. Runs in the process table's transaction.
pub fn forked(conn: &Connection, parent: u32, child: u32, at_ns: i64) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO pid_pipe(pid, handle, since_ns)
         SELECT ?2, handle, ?3 FROM pid_pipe WHERE pid = ?1",
    )?
    .execute(params![parent, child, at_ns])?;
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM pid_pipe WHERE pid = ?1)")?
        .query_row([child], |r| r.get(0))
}

/// Process `pid` ended: it holds nothing. (Its ends' handles close when
/// their last descriptor does, which the kernel reports separately.)
pub fn exited(conn: &Connection, pid: u32) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM pid_pipe WHERE pid = ?1")?
        .execute([pid])?;
    Ok(())
}

/// Appends as much of `data` as fits; returns the count and the state.
fn write(
    conn: &Connection,
    s: PipeState,
    pipe: i64,
    data: &[u8],
    now_ns: i64,
) -> Result<(usize, PipeState), PipeError> {
    if data.is_empty() {
        return Ok((0, s));
    }
    if s.readers == 0 {
        return Err(PipeError::BrokenPipe);
    }
    let n = s.writable(data.len());
    if n == 0 {
        return Ok((0, s));
    }
    conn.prepare_cached("INSERT INTO pipe_data(pipe, data) VALUES (?1, ?2)")?
        .execute(params![pipe, &data[..n]])?;
    conn.prepare_cached(
        "UPDATE pipe SET buffered = buffered + ?2, bytes_in = bytes_in + ?2,
                         writes = writes + 1, changed_ns = ?3
         WHERE id = ?1",
    )?
    .execute(params![pipe, n as i64, now_ns])?;
    Ok((
        n,
        PipeState {
            buffered: s.buffered + n as u64,
            ..s
        },
    ))
}

fn io(
    conn: &Connection,
    pipe: i64,
    data: &[u8],
    max: u32,
    read_first: bool,
    now_ns: i64,
) -> Result<PipeReply, PipeError> {
    let s = state(conn, pipe)?;
    let (written, data_out, s) = if read_first {
        let (out, s) = read(conn, s, pipe, max, now_ns)?;
        let (n, s) = write(conn, s, pipe, data, now_ns)?;
        (n, out, s)
    } else {
        let (n, s) = write(conn, s, pipe, data, now_ns)?;
        let (out, s) = read(conn, s, pipe, max, now_ns)?;
        (n, out, s)
    };
    Ok(PipeReply::Io {
        written,
        data: data_out,
        state: s,
    })
}

/// Consumes up to `max` bytes; returns them and the state.
fn read(
    conn: &Connection,
    s: PipeState,
    pipe: i64,
    max: u32,
    now_ns: i64,
) -> Result<(Vec<u8>, PipeState), PipeError> {
    let want = usize::try_from(u64::from(max).min(s.buffered)).unwrap_or(0);
    if want == 0 {
        return Ok((Vec::new(), s));
    }
    let head: i64 = conn
        .prepare_cached("SELECT head FROM pipe WHERE id = ?1")?
        .query_row([pipe], |r| r.get(0))?;
    // The chunks to visit, oldest first, with their lengths; the statement
    // is finished before any blob is opened or row deleted.
    let mut chunks: Vec<(i64, usize)> = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT seq, length(data) FROM pipe_data WHERE pipe = ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([pipe])?;
        let mut covered = 0usize;
        let mut first = true;
        while let Some(row) = rows.next()? {
            let len: i64 = row.get(1)?;
            let skip = if first { head } else { 0 };
            first = false;
            let avail = usize::try_from(len - skip).unwrap_or(0);
            chunks.push((row.get(0)?, usize::try_from(len).unwrap_or(0)));
            covered += avail;
            if covered >= want {
                break;
            }
        }
    }
    let mut data = Vec::with_capacity(want);
    let mut offset = usize::try_from(head).unwrap_or(0);
    let mut last_consumed = None;
    for (seq, len) in chunks {
        let take = (len - offset).min(want - data.len());
        if offset == 0 && take == len {
            // The whole chunk: one cached statement.
            let whole: Vec<u8> = conn
                .prepare_cached("SELECT data FROM pipe_data WHERE seq = ?1")?
                .query_row([seq], |r| r.get(0))?;
            if data.is_empty() {
                data = whole;
            } else {
                data.extend_from_slice(&whole);
            }
        } else {
            // Part of a chunk: read only those bytes, so that consuming a
            // large chunk in small reads stays linear.
            let start = data.len();
            data.resize(start + take, 0);
            let blob = conn.blob_open(MAIN_DB, "pipe_data", "data", seq, true)?;
            blob.read_at_exact(&mut data[start..], offset)?;
        }
        if offset + take == len {
            last_consumed = Some(seq);
            offset = 0;
        } else {
            offset += take;
        }
        if data.len() == want {
            break;
        }
    }
    if let Some(seq) = last_consumed {
        conn.prepare_cached("DELETE FROM pipe_data WHERE pipe = ?1 AND seq <= ?2")?
            .execute([pipe, seq])?;
    }
    conn.prepare_cached(
        "UPDATE pipe SET buffered = buffered - ?2, bytes_out = bytes_out + ?2, head = ?3,
                         reads = reads + 1, changed_ns = ?4
         WHERE id = ?1",
    )?
    .execute(params![pipe, want as i64, offset as i64, now_ns])?;
    Ok((
        data,
        PipeState {
            buffered: s.buffered - want as u64,
            ..s
        },
    ))
}

fn set_capacity(
    conn: &Connection,
    pipe: i64,
    capacity: u32,
    now_ns: i64,
) -> Result<PipeReply, PipeError> {
    if !(4096..=1 << 30).contains(&capacity) {
        return Err(PipeError::InvalidCapacity(capacity));
    }
    let s = state(conn, pipe)?;
    if s.buffered > u64::from(capacity) {
        return Err(PipeError::CapacityBelowBuffered {
            capacity,
            buffered: s.buffered,
        });
    }
    conn.prepare_cached("UPDATE pipe SET capacity = ?2, changed_ns = ?3 WHERE id = ?1")?
        .execute(params![pipe, capacity, now_ns])?;
    Ok(PipeReply::Ends {
        pipe,
        state: PipeState {
            capacity: u64::from(capacity),
            ..s
        },
        removed: false,
    })
}

fn unlink(conn: &Connection, name: &str, now_ns: i64) -> Result<PipeReply, PipeError> {
    let found: Option<i64> = conn
        .prepare_cached("SELECT id FROM pipe WHERE name = ?1")?
        .query_row([name], |r| r.get(0))
        .optional()?;
    let Some(pipe) = found else {
        return Err(PipeError::NoSuchName(name.to_string()));
    };
    let s = state(conn, pipe)?;
    conn.prepare_cached("UPDATE pipe SET name = NULL, changed_ns = ?2 WHERE id = ?1")?
        .execute(params![pipe, now_ns])?;
    let removed = collect(conn, pipe)?;
    Ok(PipeReply::Ends {
        pipe,
        state: s,
        removed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::SCHEMA;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        c
    }

    fn create(c: &Connection, name: &str, capacity: u32) -> i64 {
        let op = PipeOp::Create {
            name: name.into(),
            uid: 0,
            gid: 0,
            mode: 0o600,
            capacity,
            exclusive: true,
        };
        match apply(c, 1, &op).unwrap() {
            PipeReply::Created { pipe, .. } => pipe,
            r => panic!("{r:?}"),
        }
    }

    fn open(c: &Connection, pipe: i64, handle: u64, end: End) {
        apply(
            c,
            1,
            &PipeOp::Open {
                pipe,
                handle,
                end,
                pid: 1,
            },
        )
        .unwrap();
    }

    fn io(c: &Connection, pipe: i64, data: &[u8], max: u32, read_first: bool) -> PipeReply {
        let op = PipeOp::Io {
            pipe,
            write: data.to_vec(),
            read: max,
            read_first,
        };
        apply(c, 1, &op).unwrap()
    }

    fn write(c: &Connection, pipe: i64, data: &[u8]) -> Result<usize, PipeError> {
        let op = PipeOp::Io {
            pipe,
            write: data.to_vec(),
            read: 0,
            read_first: false,
        };
        match apply(c, 1, &op)? {
            PipeReply::Io { written, .. } => Ok(written),
            r => panic!("{r:?}"),
        }
    }

    fn read(c: &Connection, pipe: i64, max: u32) -> Vec<u8> {
        match io(c, pipe, &[], max, false) {
            PipeReply::Io { data, .. } => data,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn bytes_come_out_in_order_across_chunks_and_partial_reads() {
        let c = db();
        let p = create(&c, "p", 65536);
        open(&c, p, 1, End::Read);
        open(&c, p, 2, End::Write);
        let input: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        for piece in input.chunks(3000) {
            assert_eq!(write(&c, p, piece).unwrap(), piece.len());
        }
        let mut out = Vec::new();
        for max in [1u32, 7, 2999, 3001, 4096, 65536] {
            out.extend(read(&c, p, max));
        }
        assert_eq!(out, input);
        let (rows, buffered, head): (i64, i64, i64) = c
            .query_row(
                "SELECT (SELECT count(*) FROM pipe_data), buffered, head FROM pipe",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((rows, buffered, head), (0, 0, 0));
    }

    #[test]
    fn capacity_bounds_writes_and_small_writes_are_atomic() {
        let c = db();
        let p = create(&c, "p", 8192);
        open(&c, p, 1, End::Read);
        open(&c, p, 2, End::Write);
        assert_eq!(write(&c, p, &[1; 6000]).unwrap(), 6000);
        // 2192 bytes free: a 4096-byte write is atomic, so nothing goes in.
        assert_eq!(write(&c, p, &[2; 4096]).unwrap(), 0);
        // A larger write goes in partially.
        assert_eq!(write(&c, p, &[3; 5000]).unwrap(), 2192);
        assert_eq!(write(&c, p, &[4; 1]).unwrap(), 0);
        assert_eq!(read(&c, p, 10_000).len(), 8192);
        // The capacity can change, but not below what is buffered.
        write(&c, p, &[1; 6000]).unwrap();
        let resize = |capacity| PipeOp::SetCapacity { pipe: p, capacity };
        assert_eq!(
            apply(&c, 1, &resize(4096)),
            Err(PipeError::CapacityBelowBuffered {
                capacity: 4096,
                buffered: 6000
            })
        );
        assert_eq!(
            apply(&c, 1, &resize(100)),
            Err(PipeError::InvalidCapacity(100))
        );
        apply(&c, 1, &resize(16384)).unwrap();
        assert_eq!(write(&c, p, &[1; 20000]).unwrap(), 16384 - 6000);
        read(&c, p, 16384);
        apply(&c, 1, &resize(8192)).unwrap();
        // One transaction can hand bytes over in either order: reading
        // first makes room for an atomic write that did not fit before.
        assert_eq!(write(&c, p, &[5; 8192]).unwrap(), 8192);
        match io(&c, p, &[6; 4096], 4096, true) {
            PipeReply::Io {
                written,
                data,
                state,
            } => {
                assert_eq!((written, data, state.buffered), (4096, vec![5; 4096], 8192));
            }
            r => panic!("{r:?}"),
        }
        match io(&c, p, &[7; 10], 4096, false) {
            PipeReply::Io { written, data, .. } => assert_eq!((written, data), (0, vec![5; 4096])),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn writing_without_readers_is_a_broken_pipe_and_closed_anonymous_pipes_go() {
        let c = db();
        let p = create(&c, "p", 65536);
        open(&c, p, 1, End::Read);
        open(&c, p, 2, End::Write);
        write(&c, p, b"left over").unwrap();
        apply(&c, 1, &PipeOp::Close { handle: 1 }).unwrap();
        assert_eq!(write(&c, p, b"x"), Err(PipeError::BrokenPipe));
        apply(&c, 1, &PipeOp::Unlink { name: "p".into() }).unwrap();
        match apply(&c, 1, &PipeOp::Close { handle: 2 }).unwrap() {
            PipeReply::Ends { removed, .. } => assert!(removed),
            r => panic!("{r:?}"),
        }
        let left: i64 = c
            .query_row("SELECT (SELECT count(*) FROM pipe) + (SELECT count(*) FROM pipe_data) + (SELECT count(*) FROM pid_pipe) + (SELECT count(*) FROM pipe_end)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0);
    }

    #[test]
    fn names_are_checked() {
        let c = db();
        create(&c, "p", 65536);
        for (name, cap, want) in [
            ("p", 65536, PipeError::Exists("p".into())),
            ("a/b", 65536, PipeError::InvalidName("a/b".into())),
            ("..", 65536, PipeError::InvalidName("..".into())),
            ("q", 10, PipeError::InvalidCapacity(10)),
        ] {
            let op = PipeOp::Create {
                name: name.into(),
                uid: 0,
                gid: 0,
                mode: 0o600,
                capacity: cap,
                exclusive: true,
            };
            assert_eq!(apply(&c, 1, &op), Err(want));
        }
        let long = "x".repeat(256);
        assert!(matches!(
            apply(&c, 1, &PipeOp::Unlink { name: long }),
            Err(PipeError::NoSuchName(_))
        ));
    }

    /// `(pid, pipe, end)` of every holder, ordered.
    fn holders(c: &Connection) -> Vec<(u32, i64, String)> {
        c.prepare(
            "SELECT h.pid, e.pipe, e.end FROM pid_pipe h JOIN pipe_end e USING (handle)
             ORDER BY 1, 2, 3",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    }

    fn holds(c: &Connection, pid: u32, parent: Option<u32>, held: &[(i64, End)]) -> (u32, u32) {
        let op = PipeOp::Holds {
            pid,
            parent,
            held: held.to_vec(),
        };
        match apply(c, 5, &op).unwrap() {
            PipeReply::Held { added, removed } => (added, removed),
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn holders_follow_forks_closes_and_exits() {
        // sh (pid 1) makes a pipe and forks a writer (2) and a reader (3),
        // as `a | b` does; each child keeps one end, sh keeps none.
        let c = db();
        let p = create(&c, "p", 65536);
        open(&c, p, 1, End::Read);
        open(&c, p, 2, End::Write);
        let h = |pid: u32, end: &str| (pid, p, end.to_string());
        assert_eq!(holders(&c), vec![h(1, "read"), h(1, "write")]);
        assert!(forked(&c, 1, 2, 3).unwrap());
        assert!(forked(&c, 1, 3, 3).unwrap());
        assert!(!forked(&c, 9, 4, 3).unwrap(), "a parent without pipes");
        assert_eq!(holders(&c).len(), 6);
        assert_eq!(holds(&c, 2, Some(1), &[(p, End::Write)]), (0, 1));
        assert_eq!(holds(&c, 3, Some(1), &[(p, End::Read)]), (0, 1));
        assert_eq!(holds(&c, 1, None, &[]), (0, 2));
        assert_eq!(holders(&c), vec![h(2, "write"), h(3, "read")]);
        // What a process holds is read again and again: nothing changes.
        assert_eq!(holds(&c, 3, Some(1), &[(p, End::Read)]), (0, 0));
        // Counts of open ends are the kernel's (handles), not holders'.
        let s = state(&c, p).unwrap();
        assert_eq!((s.readers, s.writers), (1, 1));
        // A process seen holding an end it did not inherit (passed over a
        // socket, or read before its fork was applied) takes a handle of
        // that pipe and end.
        assert_eq!(
            holds(&c, 7, None, &[(p, End::Write), (99, End::Read)]),
            (1, 0)
        );
        assert!(holders(&c).contains(&h(7, "write")));
        exited(&c, 2).unwrap();
        exited(&c, 7).unwrap();
        assert_eq!(holders(&c), vec![h(3, "read")]);
        // The last descriptor closes: the handle and its holders go.
        apply(&c, 6, &PipeOp::Close { handle: 1 }).unwrap();
        apply(&c, 6, &PipeOp::Close { handle: 2 }).unwrap();
        assert!(holders(&c).is_empty());
        // A child whose own descriptors were read before its fork was
        // applied keeps what was read; it is read again after.
        open(&c, p, 3, End::Read);
        assert_eq!(holds(&c, 8, Some(4), &[]), (0, 0));
        assert_eq!(holds(&c, 9, Some(1), &[(p, End::Read)]), (1, 0));
        assert!(!forked(&c, 4, 8, 7).unwrap());
        assert!(forked(&c, 4, 9, 7).unwrap(), "read it again");
        assert_eq!(holders(&c), vec![h(1, "read"), h(9, "read")]);
    }

    #[test]
    fn an_end_taken_up_prefers_the_parents_handle() {
        let c = db();
        let p = create(&c, "p", 65536);
        // Two processes opened the read end of one named pipe on their own.
        apply(
            &c,
            1,
            &PipeOp::Open {
                pipe: p,
                handle: 10,
                end: End::Read,
                pid: 100,
            },
        )
        .unwrap();
        apply(
            &c,
            1,
            &PipeOp::Open {
                pipe: p,
                handle: 11,
                end: End::Read,
                pid: 200,
            },
        )
        .unwrap();
        holds(&c, 101, Some(100), &[(p, End::Read)]);
        let handle: i64 = c
            .query_row("SELECT handle FROM pid_pipe WHERE pid = 101", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(handle, 10);
        holds(&c, 300, None, &[(p, End::Read)]);
        let handle: i64 = c
            .query_row("SELECT handle FROM pid_pipe WHERE pid = 300", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(handle, 11, "without a parent holding it: the newest");
    }
}
