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
