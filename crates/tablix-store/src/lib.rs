//! The tablix store: every piece of state tablix keeps lives in SQLite
//! databases owned by this crate, and the only way to change that state is a
//! Command applied by [`Store`]: a [`ReplicatedCommand`] (user SQL, a
//! file-system operation) for the persistent database, or a node-local one
//! (the daemon record, a pipe operation, process events) for the memory
//! database. Each domain is a state machine (`state_machine.rs`).
//!
//! * a persistent database (`DATA/tablix.db`, WAL) for files and user tables,
//!   and a memory database attached as `mem` for volatile state (the daemon
//!   record, pipes, the process table), so one query joins both. The memory
//!   database is on tablix-vfs's blocking memory VFS; its Commands are
//!   applied at once on the caller's thread, each in its own transaction;
//! * a single writer thread that applies Commands with group commit: every
//!   Command queued while the previous commit was in flight goes into the next
//!   SQLite transaction, each in its own SAVEPOINT;
//! * a pool of read-only connections for snapshot reads.
//!
//! Architecture invariant: `apply` is deterministic. It never reads the wall
//! clock or a random source: the time and random seed a Command needs travel
//! inside its [`Stamp`].

mod apply_log;
mod apply_version;
mod audit;
mod budget;
mod changeset;
mod command;
mod command_log;
mod config;
mod dump;
mod error;
mod exec;
mod file_data;
mod fs_writer;
mod group;
mod lock;
mod outcome;
mod policy;
mod principal;
mod proposals;
mod read_conn;
mod readers;
mod sandbox;
mod schema;
mod snapshot;
mod sql_writer;
mod sqltext;
mod stamp;
mod state_machine;
mod stats;
mod store;
mod transactions;
mod tx_view;
mod tx_writer;
mod volatile;
mod wal;
mod write_point;
mod writer;

pub use apply_log::{AppliedState, CommandReply, EntryPayload, EntryReply, FsApplied, LogEntry};
pub use apply_version::APPLY_VERSION;
pub use budget::{Cancel, Limits};
pub use command::{
    DaemonRecord, Params, ReplicatedCommand, SqlCommand, Stamp, Stamped, Statement, TxCommit, Value,
};
pub use command_log::applied as applied_entry;
pub use config::{
    DEFAULT_LOG_SEGMENT_BYTES, DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_TRANSACTIONS,
    DEFAULT_MEMORY_LIMIT, DEFAULT_READ_TIMEOUT, DEFAULT_TX_IDLE_TIMEOUT, DEFAULT_TX_MAX_BYTES,
    DEFAULT_TX_MAX_DURATION, DEFAULT_WAL_LIMIT, DEFAULT_WRITE_TIMEOUT, Durability, LogKeeper,
    StoreConfig,
};
pub use dump::LoadError;
pub use error::{LogFailure, SqliteFailure, StoreError};
pub use exec::{Cell, Collect, Sink, Stop, replay};
pub use outcome::{FsResult, PipeResult, Rows, SqlReply, StatementOutcome, StatementResult};
pub use policy::is_system_table;
pub use principal::{MAY_EXEC, MAY_READ, MAY_WRITE, Principal};
pub use proposals::REMEMBERED as REMEMBERED_PROPOSALS;
pub use read_conn::ReadConn;
pub use sandbox::ProcVisibility;
pub use schema::{LATEST_SCHEMA_VERSION, MEMORY_SCHEMA};
pub use stats::{MemoryLockStats, StoreStats};
pub use store::{Propose, ProposeAnswer, Store, Ticket};
pub use tablix_log::LogId;
pub use transactions::{Transaction, TxControl, TxInfo, TxKind, TxStats};
pub use tx_writer::TxOutcome;
pub use write_point::{WritePoint, WriteProbe};

/// The version of the SQLite tablix runs.
pub fn sqlite_version() -> &'static str {
    rusqlite::version()
}
