//! The pipe tables, created in the memory database at every start.

/// Default capacity of a pipe, as Linux's default pipe buffer.
pub const DEFAULT_CAPACITY: u32 = 65_536;

/// Longest pipe name, as a file name.
pub const MAX_NAME: usize = 255;

/// A pipe's id is its file's inode number (offset); AUTOINCREMENT keeps the
/// kernel from meeting a new pipe under an inode number it may still cache.
///
/// `pipe_end` is one open end: an open file description (FUSE's file
/// handle), which every descriptor that `dup` and `fork` make of it shares.
/// `pid_pipe` names each process (thread group) holding one.
///
/// Tables and views, unqualified: they are created on a connection that
/// has the memory database as `main`, and read as `mem.*` elsewhere.
pub const SCHEMA: &str = "
CREATE TABLE pipe(
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT UNIQUE,
    uid        INTEGER NOT NULL,
    gid        INTEGER NOT NULL,
    mode       INTEGER NOT NULL,
    capacity   INTEGER NOT NULL,
    buffered   INTEGER NOT NULL DEFAULT 0,
    head       INTEGER NOT NULL DEFAULT 0,
    bytes_in   INTEGER NOT NULL DEFAULT 0,
    bytes_out  INTEGER NOT NULL DEFAULT 0,
    writes     INTEGER NOT NULL DEFAULT 0,
    reads      INTEGER NOT NULL DEFAULT 0,
    readers    INTEGER NOT NULL DEFAULT 0,
    writers    INTEGER NOT NULL DEFAULT 0,
    created_ns INTEGER NOT NULL,
    changed_ns INTEGER NOT NULL
);
CREATE TABLE pipe_data(
    seq  INTEGER PRIMARY KEY,
    pipe INTEGER NOT NULL REFERENCES pipe(id),
    data BLOB NOT NULL
);
CREATE INDEX pipe_data_by_pipe ON pipe_data(pipe, seq);
CREATE TABLE pipe_end(
    handle    INTEGER PRIMARY KEY,
    pipe      INTEGER NOT NULL REFERENCES pipe(id),
    end       TEXT NOT NULL CHECK (end IN ('read', 'write', 'both')),
    opened_ns INTEGER NOT NULL
);
CREATE INDEX pipe_end_by_pipe ON pipe_end(pipe, end);
CREATE TABLE pid_pipe(
    pid      INTEGER NOT NULL,
    handle   INTEGER NOT NULL REFERENCES pipe_end(handle),
    since_ns INTEGER NOT NULL,
    PRIMARY KEY (pid, handle)
) WITHOUT ROWID;
CREATE INDEX pid_pipe_by_handle ON pid_pipe(handle);
";

/// The pipes as SQL users see them, created in the temp schema of each
/// connection that runs user SQL (the memory database itself is readable
/// only by root). `pipes`: every named pipe (anyone may list the pipes
/// directory), and the anonymous pipes the querying user created (root:
/// all). `pid_pipe`: which process holds which end, for the processes the
/// user may inspect, as /proc/PID/fd shows them (`since_ns`: since when
/// the process holds it; `opened_ns`: when the end was opened). `pipe_data`, the bytes in
/// flight, has no view. The store provides `tablix_caller_uid()` and
/// `tablix_may_inspect(uid, euid, gid, egid)`; inner names start with
/// `tablix_`, which user SQL may not give a CTE.
pub const USER_VIEWS: &str = "
CREATE TEMP VIEW pipes AS
    SELECT id, name, buffered, capacity, bytes_in AS total_in, bytes_out AS total_out,
           writes, reads, readers, writers, uid, gid, mode, created_ns, changed_ns
    FROM mem.pipe
    WHERE name IS NOT NULL OR uid = tablix_caller_uid() OR tablix_caller_uid() = 0;
CREATE TEMP VIEW pid_pipe AS
    WITH tablix_inspectable(pid) AS (
        SELECT pid FROM mem.processes
        WHERE exit_ns IS NULL AND tablix_may_inspect(uid, euid, gid, egid)
    )
    SELECT e.handle, e.pipe, h.pid, e.end, e.opened_ns, h.since_ns
    FROM mem.pid_pipe h JOIN mem.pipe_end e ON e.handle = h.handle
    WHERE tablix_caller_uid() = 0 OR h.pid IN tablix_inspectable;
";

/// Whether `name` may name a pipe: a file name that is not `.` or `..`,
/// has no `/` or NUL, and is at most [`MAX_NAME`] bytes.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == 0)
}
