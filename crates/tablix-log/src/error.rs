//! What can go wrong with the log, typed.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("command log {path}: {op}: {cause}")]
    Io {
        path: PathBuf,
        op: &'static str,
        cause: std::io::Error,
    },
    /// An entry the log holds failed its checksum when read back.
    #[error("command log {path}: entry {index} at byte {offset} is corrupt: {detail}")]
    Corrupt {
        path: PathBuf,
        index: u64,
        offset: u64,
        detail: String,
    },
    /// Entries are numbered without gaps: an append must take the next
    /// index.
    #[error("command log: appended entry {got}, but the next index is {expected}")]
    NotNext { expected: u64, got: u64 },
    /// A read of an entry the log does not hold (purged, or not written).
    #[error("command log: no entry {index} (the log holds {first}..={last})")]
    Missing { index: u64, first: u64, last: u64 },
    /// Damage in the log's middle (see [`crate::Damage`]): opening was
    /// refused and nothing changed.
    #[error("command log: {0}")]
    Damaged(crate::Damage),
    #[error("command log: an entry of {bytes} bytes is over the limit of {limit}")]
    TooLarge { bytes: usize, limit: usize },
    /// An earlier write or sync failed: what the log holds past its last
    /// sync is unknown until it is opened again.
    #[error("command log: stopped after an earlier failure: {0}")]
    Poisoned(String),
}

impl LogError {
    pub(crate) fn io(path: &std::path::Path, op: &'static str, cause: std::io::Error) -> Self {
        LogError::Io {
            path: path.to_path_buf(),
            op,
            cause,
        }
    }

    /// Whether the failure is the disk being full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, LogError::Io { cause, .. }
            if matches!(cause.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
    }
}
