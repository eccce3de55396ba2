//! File-system operations as data: the store applies each as a replicated
//! Command (`ReplicatedCommand::Fs`).

use serde::{Deserialize, Serialize};

/// An inode number. 1 is the root directory.
pub type Ino = u64;

pub const ROOT: Ino = 1;

/// A time an operation sets: the Command's own time, or a given one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    Now,
    At(i64),
}

/// Attribute changes of `setattr`; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// Permission bits (07777); the file type never changes.
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<i64>,
}

/// A state change of the file system. Every one is deterministic: times
/// come from the Command's stamp, inode numbers from the database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsOp {
    /// Run at every mount: gives a never-mounted root directory its owner
    /// and times, and reclaims inodes left unlinked-but-open by the last run.
    Mount {
        uid: u32,
        gid: u32,
    },
    /// Creates a regular file, directory, FIFO, socket or device node.
    /// `mode` carries the type bits (`S_IFMT`) and the permission bits,
    /// already masked by the caller's umask.
    MakeNode {
        parent: Ino,
        name: Vec<u8>,
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        parent: Ino,
        name: Vec<u8>,
        target: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    Link {
        ino: Ino,
        parent: Ino,
        name: Vec<u8>,
    },
    Unlink {
        parent: Ino,
        name: Vec<u8>,
    },
    Rmdir {
        parent: Ino,
        name: Vec<u8>,
    },
    /// `flags` are renameat2's: RENAME_NOREPLACE or RENAME_EXCHANGE.
    Rename {
        parent: Ino,
        name: Vec<u8>,
        new_parent: Ino,
        new_name: Vec<u8>,
        flags: u32,
    },
    SetAttr {
        ino: Ino,
        attr: SetAttr,
    },
    /// `kill_suidgid`: the writer lacks CAP_FSETID, so the write drops
    /// the set-user-ID bit, and the set-group-ID bit of a group-executable
    /// file, as on every Linux file system.
    Write {
        ino: Ino,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        kill_suidgid: bool,
    },
    /// fallocate(2); `mode` takes FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE
    /// and FALLOC_FL_ZERO_RANGE. Allocating stores nothing: it grows the
    /// size (without KEEP_SIZE) over a hole.
    Fallocate {
        ino: Ino,
        offset: u64,
        length: u64,
        mode: i32,
    },
    /// `flags` are setxattr's: XATTR_CREATE or XATTR_REPLACE.
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: i32,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// Frees the listed inodes that no directory entry names any more
    /// (nlink 0): the kernel has forgotten them, so nothing can reach them.
    Reclaim {
        inodes: Vec<Ino>,
    },
    /// Checks the file system's invariants and, with `repair`, fixes what
    /// it safely can (`tablix fsck`); with `verify_data`, also reads every
    /// block against its checksum.
    Check {
        repair: bool,
        verify_data: bool,
    },
    /// A cluster node's [`FsOp::Mount`]: besides the root's owner and
    /// times, records `node` as one whose kernel may hold unlinked files
    /// open, and releases every such file for it (its kernel, mounting
    /// afresh, holds none).
    MountNode {
        uid: u32,
        gid: u32,
        node: u64,
    },
    /// A cluster node's [`FsOp::Reclaim`]: `node`'s kernel holds none of
    /// `inodes` (it forgot them, or never had them). An unlinked inode is
    /// freed once every mounted node has released it: a file open on one
    /// node outlives its unlinking on another.
    Release {
        node: u64,
        inodes: Vec<Ino>,
    },
    /// `node` mounts the file system no more (it left the cluster): no
    /// unlinked inode waits for it, and its locks go.
    Unmount {
        node: u64,
    },
    /// A cluster node's advisory lock (a POSIX record lock, or a `flock`
    /// as a lock of the whole file): sets `owner`'s lock on bytes
    /// `start..=end` of `ino` to `kind`, splitting what the owner held
    /// there. Refused with EAGAIN while another owner's lock conflicts.
    /// `owner` is the kernel's lock owner on `node`; `pid` is for
    /// F_GETLK.
    Lock {
        node: u64,
        owner: u64,
        pid: u32,
        ino: Ino,
        start: u64,
        end: u64,
        kind: LockKind,
    },
    /// Every lock `node` holds goes: its lease ran out (the leader heard
    /// nothing from it for that long). It stays a mount, with the
    /// unlinked files it holds open. Each process that held a lock is
    /// recorded as having lost it on that file (`tablix_lost_lock`)
    /// until it closes the file.
    ExpireLocks {
        node: u64,
    },
    /// A write to a file opened with O_APPEND on a cluster node: `data` goes
    /// at the end of the file as this operation finds it, wherever the
    /// writer's kernel (whose idea of the size may be another node's
    /// appends behind) thought the end was. Otherwise as [`FsOp::Write`].
    Append {
        ino: Ino,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        kill_suidgid: bool,
    },
    /// `op`, a change of `ino` sent by process `pid` of cluster node
    /// `node` while it held a lock on `ino`: refused with EIO if, where
    /// it lands in the log, the node's lease has taken that lock
    /// (`tablix_lost_lock`); the writer's node may not have known yet.
    Fenced {
        node: u64,
        pid: u32,
        ino: Ino,
        op: Box<FsOp>,
    },
}

/// What a [`FsOp::Lock`] makes of a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// The attributes of one inode, as `stat(2)` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// Bytes held in data blocks (st_blocks is this over 512).
    pub allocated: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
}

impl Attr {
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
}

/// What an applied operation returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsReply {
    /// The operation changed nothing the caller needs to see.
    Done,
    /// The attributes of the inode created, linked or changed.
    Attr(Attr),
    /// Bytes written.
    Written(u32),
    /// What a check found.
    Checked(crate::check::Report),
}

/// What an applied operation may have made stale in a kernel's caches of
/// the file system: what a node whose kernel did not see the operation
/// (it came through another node, or through SQL) must invalidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touched {
    /// The name `name` in directory `parent` (a cached lookup of it, or
    /// of its absence).
    Entry { parent: Ino, name: Vec<u8> },
    /// The inode's attributes.
    Attr(Ino),
    /// The inode's attributes and `len` bytes of its data from `offset`
    /// (`len` 0: to the end).
    Data { ino: Ino, offset: u64, len: u64 },
}

impl FsOp {
    /// What applying this operation may have made stale in caches of it.
    pub fn touched(&self) -> Vec<Touched> {
        let entry = |parent: &Ino, name: &[u8]| Touched::Entry {
            parent: *parent,
            name: name.to_vec(),
        };
        match self {
            // What these free, no kernel holds.
            FsOp::Mount { .. }
            | FsOp::MountNode { .. }
            | FsOp::Unmount { .. }
            | FsOp::Lock { .. }
            | FsOp::ExpireLocks { .. }
            | FsOp::Check { .. } => Vec::new(),
            FsOp::MakeNode { parent, name, .. }
            | FsOp::Symlink { parent, name, .. }
            | FsOp::Unlink { parent, name }
            | FsOp::Rmdir { parent, name } => vec![entry(parent, name), Touched::Attr(*parent)],
            FsOp::Link { ino, parent, name } => vec![
                entry(parent, name),
                Touched::Attr(*parent),
                Touched::Attr(*ino),
            ],
            FsOp::Rename {
                parent,
                name,
                new_parent,
                new_name,
                ..
            } => vec![
                entry(parent, name),
                entry(new_parent, new_name),
                Touched::Attr(*parent),
                Touched::Attr(*new_parent),
            ],
            FsOp::SetAttr { ino, attr } => match attr.size {
                Some(_) => vec![Touched::Data {
                    ino: *ino,
                    offset: 0,
                    len: 0,
                }],
                None => vec![Touched::Attr(*ino)],
            },
            // Where it went is the state's to say: every cached page of
            // the file.
            FsOp::Append { ino, .. } => vec![Touched::Data {
                ino: *ino,
                offset: 0,
                len: 0,
            }],
            FsOp::Write {
                ino, offset, data, ..
            } => vec![Touched::Data {
                ino: *ino,
                offset: *offset,
                len: data.len() as u64,
            }],
            FsOp::Fallocate {
                ino,
                offset,
                length,
                ..
            } => vec![Touched::Data {
                ino: *ino,
                offset: *offset,
                len: *length,
            }],
            FsOp::SetXattr { ino, .. } | FsOp::RemoveXattr { ino, .. } => {
                vec![Touched::Attr(*ino)]
            }
            FsOp::Reclaim { inodes } | FsOp::Release { inodes, .. } => {
                inodes.iter().map(|i| Touched::Attr(*i)).collect()
            }
            FsOp::Fenced { op, .. } => op.touched(),
        }
    }
}
