//! The one mapping from store failures to the errno a FUSE reply carries.

use tablix_fs::Errno;
use tablix_store::StoreError;

/// SQLite's message for SQLITE_FULL, which reaches the store's group-commit
/// errors as text.
const DISK_FULL: &str = "database or disk is full";

/// The errno for a failure of the store itself (not of the operation).
pub fn store_errno(e: &StoreError) -> Errno {
    match e {
        StoreError::Apply(m) | StoreError::Commit(m) | StoreError::Open(m)
            if m.contains(DISK_FULL) =>
        {
            Errno::ENOSPC
        }
        StoreError::Sqlite(e) => Errno::of_sqlite(e),
        StoreError::Io(e) if e.raw_os_error() == Some(libc::ENOSPC) => Errno::ENOSPC,
        _ => Errno::EIO,
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
        P::Sql(m) if m.contains(DISK_FULL) => Errno::ENOSPC,
        P::Sql(_) => Errno::EIO,
    }
}

pub fn to_fuser(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_failures_map_to_one_errno_each() {
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        let table: Vec<(StoreError, Errno)> = vec![
            (
                StoreError::Commit("database or disk is full".into()),
                Errno::ENOSPC,
            ),
            (
                StoreError::Apply("UNIQUE constraint failed".into()),
                Errno::EIO,
            ),
            (StoreError::Closed, Errno::EIO),
            (StoreError::Sqlite(full), Errno::ENOSPC),
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
            assert_eq!(store_errno(&err), want, "{err}");
        }
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
            (P::Sql("database or disk is full".into()), Errno::ENOSPC),
            (P::Sql("no such table: pipe".into()), Errno::EIO),
        ];
        for (err, want) in table {
            assert_eq!(pipe_errno(&err), want, "{err}");
        }
    }
}
