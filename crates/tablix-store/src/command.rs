//! Commands: the one way tablix state changes.

use serde::{Deserialize, Serialize};

use crate::principal::Principal;

/// A value bound to or read from SQL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// Parameters of one SQL statement, in rqlite's two forms.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum Params {
    #[default]
    None,
    /// `?` / `?NNN` parameters, in order.
    Positional(Vec<Value>),
    /// `:name`, `@name` or `$name` parameters, keyed without the prefix.
    Named(Vec<(String, Value)>),
}

/// One SQL statement with its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    pub sql: String,
    pub params: Params,
}

impl Statement {
    pub fn new(sql: impl Into<String>) -> Statement {
        Statement {
            sql: sql.into(),
            params: Params::None,
        }
    }

    pub fn with_params(sql: impl Into<String>, params: Params) -> Statement {
        Statement {
            sql: sql.into(),
            params,
        }
    }
}

/// The running daemon, as recorded in the volatile `mem.daemon` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DaemonRecord {
    pub pid: u32,
    pub http_addr: String,
    pub data_dir: String,
    pub mode: String,
    pub version: String,
}

/// A state change. Applying the same sequence of stamped Commands to the same
/// starting state gives the same state and the same results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// User SQL, as sent to rqlite's `/db/execute`. With `transaction`, the
    /// first failing statement rolls the whole Command back; without it each
    /// statement stands alone.
    Sql {
        statements: Vec<Statement>,
        transaction: bool,
        /// Whom the statements run as: what the authorizer and the views
        /// of system state apply.
        principal: Principal,
    },
    /// Records the daemon that owns the data directory.
    SetDaemon(DaemonRecord),
    /// A file-system operation (the FUSE mount's writes).
    Fs(tablix_fs::FsOp),
    /// A pipe operation, on the memory database.
    Pipe(tablix_pipe::PipeOp),
    /// A batch of process events, on the memory database.
    Proc(tablix_proc::ProcOp),
}

impl Command {
    /// Whether the Command changes only the memory database (volatile
    /// state, applied at once on the caller's thread, never synced).
    pub fn is_volatile(&self) -> bool {
        matches!(
            self,
            Command::SetDaemon(_) | Command::Pipe(_) | Command::Proc(_)
        )
    }

    /// What kind of Command this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::Sql { .. } => "a SQL command",
            Command::SetDaemon(_) => "a daemon record",
            Command::Fs(_) => "a file-system command",
            Command::Pipe(_) => "a pipe command",
            Command::Proc(_) => "a process-table command",
        }
    }
}

/// The non-deterministic inputs of a Command, fixed by whoever proposes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// What SQL's `'now'` means while the Command applies.
    pub unix_nanos: i64,
    /// Seed of the generator behind SQL's `random()` and `randomblob()`.
    pub seed: u64,
}

/// A Command with its stamp: the unit the writer applies and, later, the unit
/// of the replicated log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    pub stamp: Stamp,
    pub command: Command,
}

impl Stamped {
    pub fn new(stamp: Stamp, command: Command) -> Stamped {
        Stamped { stamp, command }
    }
}
