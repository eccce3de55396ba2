//! The error a file-system operation returns: a Linux errno.

use serde::{Deserialize, Serialize};

/// A Linux `errno` value, as the kernel expects from a file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENXIO: Errno = Errno(libc::ENXIO);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EINTR: Errno = Errno(libc::EINTR);
    pub const EPIPE: Errno = Errno(libc::EPIPE);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);

    pub fn code(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

/// What a SQLite failure inside a file-system operation means to the caller:
/// a full disk is ENOSPC, memory exhaustion ENOMEM, a read-only database
/// EROFS; anything else is an I/O error.
impl From<rusqlite::Error> for Errno {
    fn from(e: rusqlite::Error) -> Errno {
        Errno::of_sqlite(&e)
    }
}

impl Errno {
    pub fn of_sqlite(e: &rusqlite::Error) -> Errno {
        use rusqlite::ErrorCode;
        match e.sqlite_error_code() {
            Some(ErrorCode::DiskFull) => Errno::ENOSPC,
            Some(ErrorCode::OutOfMemory) => Errno::ENOMEM,
            Some(ErrorCode::ReadOnly) => Errno::EROFS,
            Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Errno::EAGAIN,
            _ => Errno::EIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_failures_map_to_the_errno_a_file_system_gives() {
        let fail =
            |code: i32| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        let table = [
            (rusqlite::ffi::SQLITE_FULL, Errno::ENOSPC),
            (rusqlite::ffi::SQLITE_NOMEM, Errno::ENOMEM),
            (rusqlite::ffi::SQLITE_READONLY, Errno::EROFS),
            (rusqlite::ffi::SQLITE_BUSY, Errno::EAGAIN),
            (rusqlite::ffi::SQLITE_IOERR, Errno::EIO),
            (rusqlite::ffi::SQLITE_CORRUPT, Errno::EIO),
        ];
        for (code, want) in table {
            assert_eq!(Errno::from(fail(code)), want, "SQLite code {code}");
        }
        assert_eq!(
            Errno::from(rusqlite::Error::QueryReturnedNoRows),
            Errno::EIO
        );
    }
}
