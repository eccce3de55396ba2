//! Why a file-system operation or read did not complete.

use crate::errno::Errno;

/// The failure of a file-system operation or read: either the operation's
/// own answer or a failure of the node underneath it. Only the first is a
/// result of an operation; the store keeps the two apart, so that
/// applying the same operations to the same state gives the same results
/// on every node.
#[derive(Debug, PartialEq)]
pub enum FsError {
    /// The answer the kernel gets (ENOENT, EEXIST, ENOSPC of a full file
    /// system quota, ...), decided by the operation and the state alone.
    Errno(Errno),
    /// SQLite failed under the operation: a full disk, an I/O error, no
    /// memory, a damaged page. Nothing of the operation happened (its
    /// savepoint is rolled back), and it says nothing about the
    /// operation: another node, or this one later, may apply it.
    Sqlite(rusqlite::Error),
}

impl From<Errno> for FsError {
    fn from(e: Errno) -> FsError {
        FsError::Errno(e)
    }
}

impl From<rusqlite::Error> for FsError {
    fn from(e: rusqlite::Error) -> FsError {
        FsError::Sqlite(e)
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsError::Errno(e) => write!(f, "{e}"),
            FsError::Sqlite(e) => write!(f, "SQLite failed under the file system: {e}"),
        }
    }
}

impl std::error::Error for FsError {}
