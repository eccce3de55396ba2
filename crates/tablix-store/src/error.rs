//! The store's error type.

use std::path::PathBuf;

use rusqlite::ErrorCode;

/// A failure of SQLite itself, typed by its result code: callers decide by
/// the code, never by the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteFailure {
    /// SQLite's extended result code; `None` when rusqlite failed before
    /// SQLite answered.
    pub code: Option<i32>,
    /// What failed, with SQLite's message.
    pub message: String,
}

impl SqliteFailure {
    pub fn of(e: &rusqlite::Error) -> SqliteFailure {
        SqliteFailure {
            code: e.sqlite_error().map(|f| f.extended_code),
            message: crate::policy::error_message(e),
        }
    }

    /// The failure of `what`, with SQLite's `code`.
    pub fn with_code(code: i32, what: &str) -> SqliteFailure {
        let e = rusqlite::ffi::Error::new(code);
        SqliteFailure {
            code: Some(code),
            message: format!("{what}: {e}"),
        }
    }

    /// `what` failed, with no SQLite code behind it.
    pub fn without_code(what: impl Into<String>) -> SqliteFailure {
        SqliteFailure {
            code: None,
            message: what.into(),
        }
    }

    /// SQLite's primary result code.
    pub fn code(&self) -> Option<ErrorCode> {
        self.code.map(|c| rusqlite::ffi::Error::new(c).code)
    }

    /// Whether the failure belongs to this node (its disk, its memory, its
    /// files) rather than to what it was asked to do: applying the same
    /// Commands on another node, or on this one once repaired, may succeed.
    pub fn is_node_local(&self) -> bool {
        self.code().is_some_and(is_node_local)
    }
}

/// Result codes that say the node failed, not the statement: a full disk,
/// an I/O error, no memory, a damaged or unopenable database file.
pub(crate) fn is_node_local(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::OutOfMemory
            | ErrorCode::DatabaseCorrupt
            | ErrorCode::NotADatabase
            | ErrorCode::CannotOpen
    )
}

impl std::fmt::Display for SqliteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A failure of the command log, kept as what callers decide by (a full
/// disk or not) and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFailure {
    pub disk_full: bool,
    pub message: String,
}

impl std::fmt::Display for LogFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if self.disk_full {
            f.write_str(" (the disk is full)")?;
        }
        Ok(())
    }
}

impl From<tablix_log::LogError> for StoreError {
    fn from(e: tablix_log::LogError) -> StoreError {
        StoreError::Log(LogFailure {
            disk_full: e.is_disk_full(),
            message: e.to_string(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {cause}")]
    DataDir {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "data directory {path} is in use by another tablix daemon{}",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked { path: PathBuf, holder: Option<u32> },
    #[error(
        "data directory {path} was written by a newer tablix (schema version {found}; this build knows up to {supported}); upgrade tablix or use another --data"
    )]
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("{path} is not a tablix database (application_id {found:#x})")]
    NotTablix { path: PathBuf, found: i64 },
    #[error("opening the store failed: {0}")]
    Open(String),
    #[error(
        "{path} is damaged: {detail}; the daemon will not serve it. Stop here, keep a copy of the data directory, and run `tablix fsck --data {}` to see what it finds",
        path.parent().map(|p| p.display().to_string()).unwrap_or_default()
    )]
    Malformed { path: PathBuf, detail: String },
    /// Every connection that could serve the request stayed busy.
    #[error("tablix is busy: {0}")]
    Busy(String),
    /// A read lent a connection changed a row, or the writer thread died:
    /// a defect, never bad input.
    #[error("{0}")]
    Apply(String),
    /// BEGIN, a SAVEPOINT or COMMIT of a group failed: nothing in the
    /// group was applied.
    #[error("commit failed, nothing in this group was applied: {0}")]
    Commit(SqliteFailure),
    /// SQLite failed under a Command (a full disk, an I/O error, no
    /// memory, a damaged page): a failure of this node, not a result of
    /// the Command, so it is never answered as one. Nothing of the
    /// Command's group was applied.
    #[error("{0}; nothing of this request was applied")]
    Failed(SqliteFailure),
    #[error("the store is shut down")]
    Closed,
    /// A Command was proposed to a store whose log replication keeps
    /// ([`crate::LogKeeper::Replication`]).
    #[error(
        "this store applies the entries of a replicated log: Commands are proposed through replication, not to the store"
    )]
    NotProposer,
    /// Replication did not answer the Command: replication stopped here,
    /// or the leader could not be asked or answer (the message says
    /// whether the Command may have been applied).
    #[error("replication: {0}")]
    Replication(String),
    /// No leader could be reached within the bounded wait (a partitioned
    /// minority, a cluster electing): nothing of the Command is applied,
    /// and local state keeps serving reads.
    #[error("no leader: {0}")]
    NoLeader(String),
    /// The command log failed (a full disk while extending it, an I/O
    /// error): the Commands of the request were not logged, so not
    /// applied.
    #[error("{0}; nothing of this request was applied")]
    Log(LogFailure),
    /// The state machine stopped applying the log: a failure of this node
    /// after entries were logged. Nothing more is applied until restart,
    /// which applies the logged entries the state lacks.
    #[error(
        "tablix stopped applying changes ({cause}); the state holds entries up to {applied} of the command log, and restarting tablix applies the rest"
    )]
    Stopped { applied: u64, cause: SqliteFailure },
    #[error(
        "file-system changes acknowledged since the last flush were lost when committing them failed ({0}); no file-system change is accepted until the store is reopened"
    )]
    PendingLost(SqliteFailure),
    /// No interactive transaction of that id is open for the caller
    /// (never begun, ended, another user's; the message says why if it
    /// was rolled back without its client's word).
    #[error("{0}")]
    NoTransaction(String),
    /// The transaction is running another request.
    #[error("{0}")]
    TransactionBusy(String),
    /// As many interactive transactions are open as the daemon allows.
    #[error("{0}")]
    TooManyTransactions(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

impl StoreError {
    /// SQLite's result code behind the error, if SQLite failed.
    pub fn sqlite_code(&self) -> Option<ErrorCode> {
        match self {
            StoreError::Commit(f) | StoreError::Failed(f) | StoreError::PendingLost(f) => f.code(),
            StoreError::Stopped { cause, .. } => cause.code(),
            StoreError::Sqlite(e) => e.sqlite_error_code(),
            _ => None,
        }
    }

    /// The same failure, for another caller: every Command of a failed
    /// group gets one. Typed variants keep their type and code.
    pub(crate) fn duplicate(&self) -> StoreError {
        match self {
            StoreError::Commit(f) => StoreError::Commit(f.clone()),
            StoreError::Failed(f) => StoreError::Failed(f.clone()),
            StoreError::PendingLost(f) => StoreError::PendingLost(f.clone()),
            StoreError::Sqlite(e) => StoreError::Failed(SqliteFailure::of(e)),
            StoreError::Closed => StoreError::Closed,
            StoreError::NotProposer => StoreError::NotProposer,
            StoreError::Replication(m) => StoreError::Replication(m.clone()),
            StoreError::NoLeader(m) => StoreError::NoLeader(m.clone()),
            StoreError::Log(f) => StoreError::Log(f.clone()),
            StoreError::Stopped { applied, cause } => StoreError::Stopped {
                applied: *applied,
                cause: cause.clone(),
            },
            StoreError::Busy(m) => StoreError::Busy(m.clone()),
            StoreError::NoTransaction(m) => StoreError::NoTransaction(m.clone()),
            StoreError::TransactionBusy(m) => StoreError::TransactionBusy(m.clone()),
            StoreError::TooManyTransactions(m) => StoreError::TooManyTransactions(m.clone()),
            StoreError::Io(e) => StoreError::Io(match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(e.kind(), e.to_string()),
            }),
            other => StoreError::Apply(other.to_string()),
        }
    }
}
