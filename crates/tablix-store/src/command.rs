//! Commands: the one way tablix state changes. Replicated Commands
//! change the persistent database and are entries of the command log;
//! node-local ones change only this node's memory database.

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

/// User SQL, as sent to rqlite's `/db/execute`. With `transaction`, the
/// first failing statement rolls the whole Command back; without it each
/// statement stands alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SqlCommand {
    pub statements: Vec<Statement>,
    pub transaction: bool,
    /// Whom the statements run as: what the authorizer and the views of
    /// system state apply.
    pub principal: Principal,
}

/// A Command that changes the persistent database: the entries of the
/// command log, which replication copies to every node. Applying the same
/// sequence of stamped replicated Commands to the same starting state
/// gives the same state and the same results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReplicatedCommand {
    Sql(SqlCommand),
    /// A file-system operation (the FUSE mount's writes).
    Fs(tablix_fs::FsOp),
    /// The commit of an interactive transaction: its changes, validated
    /// against the state and applied whole, or refused whole.
    Tx(TxCommit),
}

/// What an interactive transaction changed, as SQLite's session extension
/// encodes it (a changeset), each changed row whole as the transaction's
/// snapshot had it: the writer applies it only if every such row is still
/// so (first committer wins).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TxCommit {
    #[serde(with = "serde_bytes")]
    pub changeset: Vec<u8>,
}

// Node-local Commands (the daemon record, pipes, the process table)
// change only this node's memory database: they are not
// `ReplicatedCommand`s, and reach the store only through its node-local
// entry points (`Store::set_daemon`, `apply_pipe`, `apply_proc`), which
// apply them at once and never log, sync or replicate them.

/// The non-deterministic inputs of a Command, fixed by whoever proposes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// What SQL's `'now'` means while the Command applies.
    pub unix_nanos: i64,
    /// Seed of the generator behind SQL's `random()` and `randomblob()`.
    pub seed: u64,
}

/// A Command with its stamp: the unit the writer applies and, for a
/// [`ReplicatedCommand`], the unit of the command log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stamped<C> {
    pub stamp: Stamp,
    pub command: C,
}

impl<C> Stamped<C> {
    pub fn new(stamp: Stamp, command: C) -> Stamped<C> {
        Stamped { stamp, command }
    }
}
