//! Reads of the pipe tables, on any connection to the memory database:
//! what the mount shows of a pipe as a file, and the counts that decide
//! whom to wake.

use rusqlite::{Connection, OptionalExtension, Row};

use crate::op::{PipeError, PipeState};

/// A pipe as the mount shows it: one file per pipe, named or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipeFile {
    pub id: i64,
    /// `None` for an anonymous pipe (and once a named one is removed).
    pub name: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
    /// The most bytes it holds at once.
    pub capacity: u64,
    pub created_ns: i64,
    pub changed_ns: i64,
}

/// The columns `file_of_row` reads, selected from `pipe`.
macro_rules! select_files {
    ($rest:literal) => {
        concat!(
            "SELECT id, name, uid, gid, mode, capacity, created_ns, changed_ns FROM pipe ",
            $rest
        )
    };
}

fn file_of_row(r: &Row<'_>) -> rusqlite::Result<PipeFile> {
    Ok(PipeFile {
        id: r.get(0)?,
        name: r.get(1)?,
        uid: r.get(2)?,
        gid: r.get(3)?,
        mode: r.get::<_, u32>(4)? & 0o7777,
        capacity: r.get::<_, i64>(5)?.max(0) as u64,
        created_ns: r.get(6)?,
        changed_ns: r.get(7)?,
    })
}

/// The pipe with id `pipe`.
pub fn file(conn: &Connection, pipe: i64) -> Result<PipeFile, PipeError> {
    conn.prepare_cached(select_files!("WHERE id = ?1"))?
        .query_row([pipe], file_of_row)
        .optional()?
        .ok_or(PipeError::NoSuchPipe(pipe))
}

/// The pipe named `name`.
pub fn named(conn: &Connection, name: &str) -> Result<PipeFile, PipeError> {
    conn.prepare_cached(select_files!("WHERE name = ?1"))?
        .query_row([name], file_of_row)
        .optional()?
        .ok_or_else(|| PipeError::NoSuchName(name.to_string()))
}

/// Every named pipe, in the order they were made.
pub fn all_named(conn: &Connection) -> Result<Vec<PipeFile>, PipeError> {
    let mut stmt = conn.prepare_cached(select_files!("WHERE name IS NOT NULL ORDER BY id"))?;
    let rows = stmt.query_map([], file_of_row)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The counts of `pipe`.
pub fn state(conn: &Connection, pipe: i64) -> Result<PipeState, PipeError> {
    conn.prepare_cached(
        "SELECT buffered, capacity, readers, writers, name IS NULL FROM pipe WHERE id = ?1",
    )?
    .query_row([pipe], |r| {
        Ok(PipeState {
            buffered: r.get::<_, i64>(0)?.max(0) as u64,
            capacity: r.get::<_, i64>(1)?.max(0) as u64,
            readers: r.get(2)?,
            writers: r.get(3)?,
            anonymous: r.get(4)?,
        })
    })
    .optional()?
    .ok_or(PipeError::NoSuchPipe(pipe))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::PipeOp;

    fn db() -> Connection {
        let c = Connection::open_in_memory().expect("memory db");
        c.execute_batch(crate::schema::SCHEMA).expect("schema");
        c
    }

    fn create(c: &Connection, now: i64, name: &str, uid: u32, capacity: u32) {
        let made = crate::apply(
            c,
            now,
            &PipeOp::Create {
                name: name.into(),
                uid,
                gid: 100,
                mode: 0o100640,
                capacity,
                exclusive: true,
            },
        );
        assert!(made.is_ok(), "{made:?}");
    }

    #[test]
    fn files_are_found_by_id_and_name_and_listed_if_named() {
        let c = db();
        create(&c, 7, "jobs", 1000, 4096);
        create(&c, 8, "logs", 0, 65536);
        let jobs = named(&c, "jobs").expect("by name");
        assert_eq!(
            (
                jobs.uid,
                jobs.gid,
                jobs.mode,
                jobs.capacity,
                jobs.created_ns
            ),
            (1000, 100, 0o640, 4096, 7)
        );
        assert_eq!(file(&c, jobs.id).expect("by id"), jobs);
        let logs = named(&c, "logs").expect("by name");
        crate::apply(
            &c,
            9,
            &PipeOp::Unlink {
                name: "logs".into(),
            },
        )
        .expect("unlink");
        // Removed with no end open, it is gone from the list and by id.
        assert_eq!(all_named(&c).expect("list"), vec![jobs]);
        assert_eq!(file(&c, logs.id), Err(PipeError::NoSuchPipe(logs.id)));
        assert_eq!(named(&c, "nope"), Err(PipeError::NoSuchName("nope".into())));
        assert_eq!(state(&c, 99), Err(PipeError::NoSuchPipe(99)));
    }
}
