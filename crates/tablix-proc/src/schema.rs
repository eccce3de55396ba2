//! The process table, created in the memory database at every start.

/// How many exited processes the table keeps by default.
pub const DEFAULT_HISTORY: u32 = 1000;

/// Created unqualified on a connection that has the memory database as
/// `main`; read as `mem.*` elsewhere.
pub const SCHEMA: &str = "
CREATE TABLE processes(
    id          INTEGER PRIMARY KEY,
    pid         INTEGER NOT NULL,
    tgid        INTEGER NOT NULL,
    ppid        INTEGER,
    uid         INTEGER,
    euid        INTEGER,
    gid         INTEGER,
    egid        INTEGER,
    comm        TEXT,
    exe         TEXT,
    cmdline     TEXT,
    start_ns    INTEGER,
    exit_ns     INTEGER,
    exit_code   INTEGER,
    exit_signal INTEGER
);
CREATE UNIQUE INDEX processes_live ON processes(pid) WHERE exit_ns IS NULL;
CREATE INDEX processes_exited ON processes(exit_ns) WHERE exit_ns IS NOT NULL;
CREATE VIEW pid_store AS
    SELECT pid, tgid AS handler_id FROM processes WHERE exit_ns IS NULL;
";
