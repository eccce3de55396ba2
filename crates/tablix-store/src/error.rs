//! The store's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
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
    #[error("{0}")]
    Apply(String),
    #[error("commit failed, nothing in this group was applied: {0}")]
    Commit(String),
    #[error("the store is shut down")]
    Closed,
    #[error(
        "file-system changes acknowledged since the last flush were lost when committing them failed ({0}); the mount refuses changes until tablix restarts"
    )]
    PendingLost(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
}
