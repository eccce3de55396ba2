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
";

/// The process table as SQL users see it, following /proc's rules (the
/// memory database itself is readable only by root). Created in the temp
/// schema of each connection that runs user SQL; the store provides
/// `tablix_may_inspect(uid, euid, gid, egid)` (root, or a caller whose uid
/// and gid match the task's real and effective ones, as ptrace's access
/// check for reading; root alone for a task whose credentials were never
/// read, which keeps NULLs) and `tablix_hidepid()` (the hidepid /proc is mounted
/// with: 0, 1 or 2; 0 for callers in its exempt group).
///
/// * `exe` only for tasks the caller may inspect (the /proc/PID/exe link
///   needs that access);
/// * with hidepid=1, other users' tasks show only pid, tgid, uid and gid
///   (what listing /proc shows); with hidepid=2 they are absent;
/// * `id` orders a pid's rows (a pid reused after an exit has several);
/// * `pid_store` is SQLiteOS's view of live tasks: pid and handler_id.
pub const USER_VIEWS: &str = "
CREATE TEMP VIEW processes AS
    WITH tablix_task AS (
        SELECT *, tablix_may_inspect(uid, euid, gid, egid) AS tablix_inspect FROM mem.processes
    )
    SELECT id, pid, tgid,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN ppid END AS ppid,
           uid,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN euid END AS euid,
           gid,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN egid END AS egid,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN comm END AS comm,
           CASE WHEN tablix_inspect THEN exe END AS exe,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN cmdline END AS cmdline,
           start_ns, exit_ns,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN exit_code END AS exit_code,
           CASE WHEN tablix_inspect OR tablix_hidepid() = 0 THEN exit_signal END AS exit_signal
    FROM tablix_task
    WHERE tablix_inspect OR tablix_hidepid() < 2;
CREATE TEMP VIEW pid_store AS
    SELECT pid, tgid AS handler_id FROM processes WHERE exit_ns IS NULL;
";
