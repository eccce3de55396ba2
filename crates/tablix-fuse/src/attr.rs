//! Converting the store's inode attributes into what FUSE replies carry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use tablix_fs::Attr;
use tablix_fs::schema::BLOCK_SIZE;

pub fn time_of(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub fn nanos_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

pub fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.allocated.div_ceil(512),
        atime: time_of(a.atime_ns),
        mtime: time_of(a.mtime_ns),
        ctime: time_of(a.ctime_ns),
        crtime: time_of(a.btime_ns),
        kind: kind_of(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLOCK_SIZE as u32,
        flags: 0,
    }
}

/// The entry FUSE reads as "no such name": node 0.
pub fn negative_entry() -> FileAttr {
    file_attr(&Attr::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_including_before_the_epoch() {
        for ns in [0, 1, 1_700_000_000_123_456_789, -1_500_000_000] {
            assert_eq!(nanos_of(time_of(ns)), ns);
        }
    }

    #[test]
    fn every_file_type_maps() {
        let table = [
            (libc::S_IFREG, FileType::RegularFile),
            (libc::S_IFDIR, FileType::Directory),
            (libc::S_IFLNK, FileType::Symlink),
            (libc::S_IFIFO, FileType::NamedPipe),
            (libc::S_IFSOCK, FileType::Socket),
            (libc::S_IFCHR, FileType::CharDevice),
            (libc::S_IFBLK, FileType::BlockDevice),
        ];
        for (mode, kind) in table {
            assert_eq!(kind_of(mode | 0o644), kind);
        }
    }
}
