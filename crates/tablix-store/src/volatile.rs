//! The memory database: volatile state (the daemon record, pipes, the
//! process table) on the blocking memory VFS.
//!
//! Its Commands are applied on the caller's thread, on a connection of a
//! small pool, each in its own transaction: the write-intent gate first,
//! then `BEGIN IMMEDIATE` (see tablix-vfs's DESIGN.md for why that order
//! can neither deadlock nor return SQLITE_BUSY). Nothing here is synced or
//! replicated; it lives as long as the process.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, params};

use crate::command::{DaemonRecord, Stamp};
use crate::error::StoreError;
use crate::outcome::PipeResult;
use crate::read_conn::ReadConn;
use crate::schema::MEMORY_SCHEMA;
use crate::state_machine::StateMachine;

pub(crate) struct Volatile {
    /// The database's name in the memory VFS.
    name: String,
    uri: String,
    /// The connection Commands are applied on. One is enough (the write
    /// gate admits one write transaction at a time anyway), and keeping
    /// to one keeps its page cache valid from one transaction to the next:
    /// a commit from another connection would make SQLite drop it.
    writer: Mutex<Connection>,
    /// Connections for tablix's own reads.
    idle: Mutex<Vec<Connection>>,
    /// Bumped after every write transaction: which images are stale.
    generation: AtomicU64,
    /// The newest image made, and the scratch database images are made in.
    image: Mutex<(Option<Arc<MemImage>>, Connection)>,
}

/// A copy of the memory database as of one generation: what connections
/// that run user SQL read as `mem`, so that a user query never holds the
/// memory database's locks (pipes and the process table never wait for
/// it), and sees one consistent state of it.
pub(crate) struct MemImage {
    pub(crate) generation: u64,
    pub(crate) bytes: Vec<u8>,
}

impl Volatile {
    /// Creates the memory database `name` with its schema.
    pub(crate) fn open(name: &str) -> Result<Volatile, StoreError> {
        let vfs = tablix_vfs::register_mem_vfs().map_err(|e| StoreError::Open(e.to_string()))?;
        let uri = format!("file:{name}?vfs={vfs}");
        let writer = connect(&uri, Access::Writer)?;
        create_schema(&writer)?;
        // An image is a serialized database; SQLite serializes a memdb
        // database without copying it page by page.
        let scratch = Connection::open_with_flags(
            format!("file:/{name}-image?vfs=memdb"),
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_URI
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        Ok(Volatile {
            name: name.to_string(),
            uri,
            writer: Mutex::new(writer),
            idle: Mutex::new(Vec::new()),
            generation: AtomicU64::new(1),
            image: Mutex::new((None, scratch)),
        })
    }

    /// The current generation of the memory database.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// An image of the memory database no older than the generation at
    /// the time of the call.
    pub(crate) fn image(&self) -> Result<Arc<MemImage>, StoreError> {
        let mut slot = self.image.lock().map_err(|_| StoreError::Closed)?;
        // Read first: a change during the copy leaves the image labelled
        // older than what it holds, so it is made again next time.
        let generation = self.generation();
        if let Some(img) = &slot.0
            && img.generation == generation
        {
            return Ok(Arc::clone(img));
        }
        let source = self.take()?;
        let copied = {
            // All pages in one step: one read transaction on the source,
            // so the copy is one consistent state.
            let backup = rusqlite::backup::Backup::new(&source, &mut slot.1)?;
            backup.step(-1).and_then(|r| match r {
                rusqlite::backup::StepResult::Done => Ok(()),
                _ => Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                    Some("copying the memory database did not finish".into()),
                )),
            })
        };
        self.put(source);
        copied?;
        let bytes = slot.1.serialize(rusqlite::MAIN_DB)?.to_vec();
        let img = Arc::new(MemImage { generation, bytes });
        slot.0 = Some(Arc::clone(&img));
        Ok(img)
    }

    /// Lock waits so far.
    pub(crate) fn lock_stats(&self) -> tablix_vfs::MemLockStats {
        tablix_vfs::mem_lock_stats(&self.name).unwrap_or_default()
    }

    fn take(&self) -> Result<Connection, StoreError> {
        let idle = self.idle.lock().ok().and_then(|mut i| i.pop());
        match idle {
            Some(c) => Ok(c),
            None => connect(&self.uri, Access::Reader),
        }
    }

    fn put(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    /// Runs `f` on the one writer connection (applying node-local
    /// Commands with [`apply_alone`]); every image made before is stale
    /// afterwards.
    pub(crate) fn write<R>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let conn = self.writer.lock().map_err(|_| StoreError::Closed)?;
        let r = f(&conn);
        self.generation.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// Runs tablix's own read-only SQL on the memory database as `main`.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&ReadConn) -> R) -> Result<R, StoreError> {
        let conn = self.take()?;
        let out = f(&ReadConn::reader(&conn));
        self.put(conn);
        Ok(out)
    }
}

/// What a connection to the memory database may do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Creates the database and applies Commands: the one writer.
    Writer,
    /// tablix's own reads and the images' copies: opened read-only and
    /// `query_only`, so a read can never change what only Commands may.
    Reader,
}

fn connect(uri: &str, access: Access) -> Result<Connection, StoreError> {
    let mut flags = OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    flags |= match access {
        Access::Writer => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        Access::Reader => OpenFlags::SQLITE_OPEN_READ_ONLY,
    };
    let conn = Connection::open_with_flags(uri, flags)?;
    // The rollback journal stays in this connection's memory: the database
    // itself is memory, and only this connection can roll its own
    // transaction back. A cache of 16 MiB holds every page a busy set of
    // pipes touches.
    conn.execute_batch(
        "PRAGMA journal_mode=MEMORY; PRAGMA synchronous=OFF; PRAGMA cache_size=-16384",
    )?;
    // Plans must not depend on bound values: SQLite (built with STAT4)
    // otherwise re-prepares a statement whenever a value bound in a range
    // changes, which is every time here.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    conn.set_prepared_statement_cache_capacity(64);
    if access == Access::Reader {
        conn.pragma_update(None, "query_only", true)?;
    }
    Ok(conn)
}

/// Applies one node-local Command in its own transaction on the memory
/// database: the write gate, then BEGIN IMMEDIATE, then COMMIT, or
/// ROLLBACK when the reply refuses the Command or the node fails under it.
pub(crate) fn apply_alone<M: StateMachine<Bounds = ()>>(
    machine: &M,
    stamp: Stamp,
    op: &M::Op,
) -> Result<M::Reply, StoreError> {
    let conn = machine.connection();
    let _intent = write_intent(conn)?;
    crate::group::control(conn, "BEGIN IMMEDIATE")?;
    let r = machine.apply(stamp, op, &());
    if r.as_ref().map_or(true, M::refused) {
        rollback(conn);
        return r;
    }
    if let Err(e) = crate::group::control(conn, "COMMIT") {
        rollback(conn);
        return Err(e.into());
    }
    r
}

fn write_intent(conn: &Connection) -> rusqlite::Result<tablix_vfs::WriteIntent<'_>> {
    tablix_vfs::write_intent(conn, "main")
        .map_err(|rc| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), None))
}

/// Creates the schema in one write transaction.
fn create_schema(conn: &Connection) -> rusqlite::Result<()> {
    let _intent = write_intent(conn)?;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let r = conn
        .execute_batch(MEMORY_SCHEMA)
        .and_then(|_| conn.execute_batch(tablix_pipe::schema::SCHEMA))
        .and_then(|_| conn.execute_batch(tablix_proc::schema::SCHEMA))
        .and_then(|_| conn.execute_batch("COMMIT"));
    if r.is_err() {
        rollback(conn);
    }
    r
}

fn rollback(conn: &Connection) {
    if !conn.is_autocommit()
        && let Err(e) = conn.execute_batch("ROLLBACK")
    {
        tracing::error!("rolling back a memory-database transaction: {e}");
    }
}

/// The daemon record's domain: one row, replaced by each `SetDaemon`.
pub(crate) struct DaemonRecords<'c>(pub(crate) &'c Connection);

impl StateMachine for DaemonRecords<'_> {
    type Op = DaemonRecord;
    type Reply = ();
    type Bounds = ();

    fn connection(&self) -> &Connection {
        self.0
    }

    fn apply(&self, stamp: Stamp, d: &DaemonRecord, _: &()) -> Result<(), StoreError> {
        self.0.prepare_cached("DELETE FROM daemon")?.execute([])?;
        self.0
            .prepare_cached(
                "INSERT INTO daemon(pid, http_addr, data_dir, mode, version, started_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                d.pid,
                d.http_addr,
                d.data_dir,
                d.mode,
                d.version,
                stamp.unix_nanos
            ])?;
        Ok(())
    }

    fn refused(_: &()) -> bool {
        false
    }
}

/// The pipes' domain (tablix-pipe): a refused operation's error is its
/// reply, and its changes are rolled back.
pub(crate) struct Pipes<'c>(pub(crate) &'c Connection);

impl StateMachine for Pipes<'_> {
    type Op = tablix_pipe::PipeOp;
    type Reply = PipeResult;
    type Bounds = ();

    fn connection(&self) -> &Connection {
        self.0
    }

    fn apply(
        &self,
        stamp: Stamp,
        op: &tablix_pipe::PipeOp,
        _: &(),
    ) -> Result<PipeResult, StoreError> {
        Ok(tablix_pipe::apply(self.0, stamp.unix_nanos, op))
    }

    fn refused(reply: &PipeResult) -> bool {
        reply.is_err()
    }
}

/// The process table's domain (tablix-proc): batches of process events.
/// A fork or exit also changes who holds pipe ends (`pid_pipe`): a child
/// holds what its parent holds, an exited process nothing. The reply names
/// the children that inherited pipe ends.
pub(crate) struct Processes<'c>(pub(crate) &'c Connection);

impl StateMachine for Processes<'_> {
    type Op = tablix_proc::ProcOp;
    type Reply = Vec<u32>;
    type Bounds = ();

    fn connection(&self) -> &Connection {
        self.0
    }

    fn apply(&self, _: Stamp, op: &tablix_proc::ProcOp, _: &()) -> Result<Vec<u32>, StoreError> {
        tablix_proc::apply(self.0, op)?;
        let mut inherited = Vec::new();
        for event in &op.events {
            match *event {
                // A new thread shares its process's descriptors: only a new
                // process inherits.
                tablix_proc::ProcEvent::Fork {
                    pid,
                    tgid,
                    parent_tgid,
                    at_ns,
                    ..
                } if pid == tgid && tablix_pipe::forked(self.0, parent_tgid, pid, at_ns)? => {
                    inherited.push(pid);
                }
                tablix_proc::ProcEvent::Exit { pid, .. } => {
                    tablix_pipe::exited(self.0, pid)?;
                    inherited.retain(|p| *p != pid);
                }
                _ => {}
            }
        }
        Ok(inherited)
    }

    fn refused(_: &Vec<u32>) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tablix_own_reads_cannot_write_the_memory_database() {
        let v = Volatile::open("volatile-test-readers").expect("opening");
        let count = |v: &Volatile| {
            v.read(|c| c.query_row("SELECT count(*) FROM daemon", [], |r| r.get::<_, i64>(0)))
                .expect("a reader")
                .expect("counting")
        };
        let before = count(&v);
        let attempts = [
            "UPDATE daemon SET pid = pid",
            "DELETE FROM daemon",
            "CREATE TABLE t(x)",
        ];
        for sql in attempts {
            let r = v.read(|c| c.execute(sql, [])).expect("a reader");
            assert!(
                matches!(&r, Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ReadOnly),
                "{sql} on a reader gave {r:?}"
            );
        }
        assert_eq!(count(&v), before);
        // A reader is still a backup's source.
        assert!(!v.image().expect("an image").bytes.is_empty());
    }
}
