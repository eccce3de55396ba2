//! Every errno the mount answers with for a failure below it: the store's,
//! SQLite's, the file system's and the pipes'. Nothing else in tablix maps
//! a failure to an errno.

use rusqlite::ErrorCode;
use tablix_fs::{Errno, FsError};
use tablix_store::StoreError;

/// The errno for a SQLite result code, as a disk file system would fail:
/// a full disk is ENOSPC, no memory ENOMEM, a read-only database EROFS,
/// a busy one EAGAIN; anything else (I/O errors, damage) EIO.
pub fn sqlite_errno(code: Option<ErrorCode>) -> Errno {
    match code {
        Some(ErrorCode::DiskFull) => Errno::ENOSPC,
        Some(ErrorCode::OutOfMemory) => Errno::ENOMEM,
        Some(ErrorCode::ReadOnly) => Errno::EROFS,
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Errno::EAGAIN,
        _ => Errno::EIO,
    }
}

/// The errno for a failure of the store itself (not of the operation).
/// Async mode's lost changes (`PendingLost`) answer as their cause did,
/// as a kernel's writeback error does at `fsync`: ENOSPC when the disk
/// filled, EIO otherwise.
///
/// The command log's failure is ENOSPC when the disk is full (nothing was
/// logged or applied); a stopped state machine answers as its cause. A
/// cluster node that reaches no leader within its bounded wait answers
/// EROFS: its mount serves reads, and no write, until a leader is back.
pub fn store_errno(e: &StoreError) -> Errno {
    match e {
        StoreError::Io(e) if e.raw_os_error() == Some(libc::ENOSPC) => Errno::ENOSPC,
        StoreError::Log(f) if f.disk_full => Errno::ENOSPC,
        // A node that reaches no leader is read-only until one is back.
        StoreError::NoLeader(_) => Errno::EROFS,
        other => sqlite_errno(other.sqlite_code()),
    }
}

/// The errno for a read whose wait for the mount's read level failed (no
/// leader confirmed in time): EIO, never EROFS, since the read itself
/// was not refused for being one, only its freshness could not be had.
pub fn read_gate_errno(_: &StoreError) -> Errno {
    Errno::EIO
}

/// The errno for a file-system read's failure.
pub fn fs_errno(e: &FsError) -> Errno {
    match e {
        FsError::Errno(e) => *e,
        FsError::Sqlite(e) => sqlite_errno(e.sqlite_error_code()),
    }
}

/// The errno for a failure of a read of the memory database: no row is
/// ENOENT.
pub fn memory_read_errno(e: &rusqlite::Error) -> Errno {
    match e {
        rusqlite::Error::QueryReturnedNoRows => Errno::ENOENT,
        e => sqlite_errno(e.sqlite_error_code()),
    }
}

/// The errno for a pipe operation's failure.
pub fn pipe_errno(e: &tablix_pipe::PipeError) -> Errno {
    use tablix_pipe::PipeError as P;
    match e {
        P::Exists(_) => Errno::EEXIST,
        P::NoSuchName(_) | P::NoSuchPipe(_) => Errno::ENOENT,
        P::InvalidName(_) => Errno::EINVAL,
        P::NoSuchHandle(_) => Errno::EBADF,
        P::InvalidCapacity(_) => Errno::EINVAL,
        P::CapacityBelowBuffered { .. } => Errno::EBUSY,
        P::BrokenPipe => Errno::EPIPE,
        P::Sql { .. } => sqlite_errno(e.sqlite_code()),
    }
}

pub fn to_fuser(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;
    use tablix_store::{LogFailure, SqliteFailure};

    fn sqlite(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some("any text".into()))
    }

    fn failure(code: i32) -> SqliteFailure {
        SqliteFailure::of(&sqlite(code))
    }

    #[test]
    fn sqlite_codes_map_as_a_disk_file_system_fails() {
        let table = [
            (ffi::SQLITE_FULL, Errno::ENOSPC),
            (ffi::SQLITE_NOMEM, Errno::ENOMEM),
            (ffi::SQLITE_READONLY, Errno::EROFS),
            (ffi::SQLITE_BUSY, Errno::EAGAIN),
            (ffi::SQLITE_LOCKED, Errno::EAGAIN),
            (ffi::SQLITE_IOERR, Errno::EIO),
            (ffi::SQLITE_IOERR_FSYNC, Errno::EIO),
            (ffi::SQLITE_CORRUPT, Errno::EIO),
            (ffi::SQLITE_CONSTRAINT_UNIQUE, Errno::EIO),
        ];
        for (code, want) in table {
            assert_eq!(
                sqlite_errno(sqlite(code).sqlite_error_code()),
                want,
                "code {code}"
            );
        }
        assert_eq!(sqlite_errno(None), Errno::EIO);
    }

    #[test]
    fn store_failures_map_by_their_code_never_their_text() {
        // A message that reads like a full disk is not one; a full disk
        // with any message is.
        let worded = SqliteFailure::without_code("database or disk is full");
        let full = SqliteFailure {
            code: Some(ffi::SQLITE_FULL),
            message: "anything".into(),
        };
        let table: Vec<(StoreError, Errno)> = vec![
            (StoreError::Commit(full.clone()), Errno::ENOSPC),
            (StoreError::Failed(full.clone()), Errno::ENOSPC),
            (StoreError::Commit(worded.clone()), Errno::EIO),
            (
                StoreError::Failed(failure(ffi::SQLITE_IOERR_WRITE)),
                Errno::EIO,
            ),
            (
                StoreError::Failed(failure(ffi::SQLITE_NOMEM)),
                Errno::ENOMEM,
            ),
            (StoreError::PendingLost(full.clone()), Errno::ENOSPC),
            (
                StoreError::PendingLost(failure(ffi::SQLITE_IOERR_FSYNC)),
                Errno::EIO,
            ),
            (StoreError::PendingLost(worded.clone()), Errno::EIO),
            (
                StoreError::Log(LogFailure {
                    disk_full: true,
                    message: "extending".into(),
                }),
                Errno::ENOSPC,
            ),
            (
                StoreError::Log(LogFailure {
                    disk_full: false,
                    message: "database or disk is full".into(),
                }),
                Errno::EIO,
            ),
            (
                StoreError::Stopped {
                    applied: 3,
                    cause: full.clone(),
                },
                Errno::ENOSPC,
            ),
            (
                StoreError::Stopped {
                    applied: 3,
                    cause: worded,
                },
                Errno::EIO,
            ),
            (
                StoreError::Apply("database or disk is full".into()),
                Errno::EIO,
            ),
            (StoreError::Closed, Errno::EIO),
            (StoreError::NoLeader("partitioned".into()), Errno::EROFS),
            (StoreError::Replication("no answer".into()), Errno::EIO),
            (StoreError::Sqlite(sqlite(ffi::SQLITE_FULL)), Errno::ENOSPC),
            (
                StoreError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Errno::ENOSPC,
            ),
            (
                StoreError::Io(std::io::Error::from_raw_os_error(libc::EBADF)),
                Errno::EIO,
            ),
        ];
        for (err, want) in table {
            assert_eq!(store_errno(&err), want, "{err:?}");
        }
    }

    #[test]
    fn a_read_that_could_not_be_made_fresh_is_eio_not_erofs() {
        for err in [
            StoreError::NoLeader("partitioned".into()),
            StoreError::Replication("no answer".into()),
            StoreError::Closed,
        ] {
            assert_eq!(read_gate_errno(&err), Errno::EIO, "{err:?}");
        }
    }

    #[test]
    fn file_system_and_memory_reads_map_to_one_errno_each() {
        assert_eq!(fs_errno(&FsError::Errno(Errno::ENOENT)), Errno::ENOENT);
        assert_eq!(fs_errno(&FsError::Errno(Errno::ELOOP)), Errno::ELOOP);
        assert_eq!(
            fs_errno(&FsError::Sqlite(sqlite(ffi::SQLITE_FULL))),
            Errno::ENOSPC
        );
        assert_eq!(
            fs_errno(&FsError::Sqlite(rusqlite::Error::QueryReturnedNoRows)),
            Errno::EIO
        );
        assert_eq!(
            memory_read_errno(&rusqlite::Error::QueryReturnedNoRows),
            Errno::ENOENT
        );
        assert_eq!(memory_read_errno(&sqlite(ffi::SQLITE_NOMEM)), Errno::ENOMEM);
    }

    #[test]
    fn pipe_failures_map_to_one_errno_each() {
        use tablix_pipe::PipeError as P;
        let table = [
            (P::Exists("p".into()), Errno::EEXIST),
            (P::NoSuchName("p".into()), Errno::ENOENT),
            (P::NoSuchPipe(3), Errno::ENOENT),
            (P::InvalidName("a/b".into()), Errno::EINVAL),
            (P::InvalidCapacity(1), Errno::EINVAL),
            (P::NoSuchHandle(9), Errno::EBADF),
            (P::BrokenPipe, Errno::EPIPE),
            (
                P::CapacityBelowBuffered {
                    capacity: 4096,
                    buffered: 5000,
                },
                Errno::EBUSY,
            ),
            (P::from(sqlite(ffi::SQLITE_FULL)), Errno::ENOSPC),
            (
                P::Sql {
                    code: None,
                    message: "database or disk is full".into(),
                },
                Errno::EIO,
            ),
            (P::from(sqlite(ffi::SQLITE_ERROR)), Errno::EIO),
        ];
        for (err, want) in table {
            assert_eq!(pipe_errno(&err), want, "{err}");
        }
    }
}
