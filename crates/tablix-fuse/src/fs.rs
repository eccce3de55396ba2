//! The FUSE handlers. Each is thin: an `*_inner` function computes the
//! result as `Result<_, Errno>` through the store (reads on the reader
//! pool, changes as `FsOp` Commands), and the handler sends exactly one reply.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags,
    KernelConfig, LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use tablix_fs::{Attr, Errno, FsError, FsOp, FsReply, Ino, SetAttr, SetTime, read};
use tablix_store::{Stamp, Store};

use crate::attr::{file_attr, kind_of, nanos_of};
use crate::errno::{fs_errno, read_gate_errno, store_errno, to_fuser};
use crate::kernel_refs::KernelRefs;
use crate::locks::{LockRequest, Locks};
use crate::pipes::{CONTROL_INO, Pipes};
use crate::route::{self, Entry, Node};
use crate::writeback::Writeback;

/// How the mount behaves.
#[derive(Clone, Debug)]
pub struct FsConfig {
    /// Let the kernel cache writes and send them in large batches, and ask
    /// it to write back what it holds every half of this (async mode's
    /// flush interval, see `writeback.rs`). Only for async mode: in sync
    /// mode a write must be durable when it returns.
    pub writeback_cache: Option<Duration>,
    /// With the writeback cache: the program kept running for those
    /// pushes (the tablix binary's `push-writeback`); none: `sync
    /// --file-system` is run for each.
    pub push_helper: Option<crate::writeback::PushHelper>,
    /// How long the kernel may trust attributes and names it was given.
    /// Every change goes through this mount, so the kernel's caches stay
    /// coherent; the bound matters only for changes made elsewhere.
    pub ttl: Duration,
    /// Largest write the kernel sends in one request.
    pub max_write: u32,
    /// The data directory, whose file system statfs reports on.
    pub data_dir: PathBuf,
    /// What every read of stored state through the mount waits for first
    /// (a cluster node's read level); none: the node's own state at once.
    pub read_gate: Option<Arc<dyn ReadGate>>,
    /// A cluster node's id: its mount follows what its kernel holds and
    /// releases unlinked inodes as that node (`kernel_refs`). None: a
    /// single node, whose kernel's forgetting an unlinked inode frees it.
    pub node: Option<u64>,
}

/// A wait before a read through the mount: on a cluster node, until the
/// node's state is fresh enough for the mount's read level. A read whose
/// wait fails is answered EIO (its freshness cannot be promised).
pub trait ReadGate: Send + Sync + std::fmt::Debug {
    fn before_read(&self) -> Result<(), tablix_store::StoreError>;
}

pub struct TablixFs {
    store: Arc<Store>,
    config: FsConfig,
    /// The pipe files under `.tablix/pipes` (virtual inodes).
    pipes: Arc<Pipes>,
    /// Set when the kernel ends the session (the file system was unmounted).
    ended: Arc<AtomicBool>,
    /// The changes this mount has in flight (their caches need no notice).
    in_flight: Arc<crate::invalidate::InFlight>,
    /// On a cluster node, what the kernel holds.
    refs: Option<Arc<KernelRefs>>,
    /// On a cluster node, the locks that hold across nodes.
    locks: Option<Arc<Locks>>,
    /// With the writeback cache: the files open for writing and the writes
    /// received, for the thread that bounds what the kernel holds.
    writeback: Option<Arc<Writeback>>,
    /// Whether a refused SQLite WAL index was logged (once a mount).
    shm_refusal_logged: AtomicBool,
    /// Files opened so far on a cluster node (their handles' numbers).
    opened: AtomicU64,
    /// When a change the store failed was last logged (seconds since the
    /// mount began): at most one line a second.
    failure_logged: AtomicU64,
    began: std::time::Instant,
}

const GENERATION: Generation = Generation(0);

/// How SQLite names a database's WAL index: the database's name and this.
const SHARED_MEMORY_SUFFIX: &[u8] = b"-shm";

/// Whether a file's handle says it was opened with O_APPEND on a cluster
/// node (for direct I/O). There each open gets a handle of its own, a
/// number times two, plus one for O_APPEND, so that locks taken through
/// an open file are known by it; elsewhere every file's handle is 0.
fn opened_appending(fh: FileHandle) -> bool {
    fh.0 & 1 == 1
}

/// The attributes an operation answered with.
fn attr_of(reply: FsReply) -> Result<Attr, Errno> {
    match reply {
        FsReply::Attr(a) => Ok(a),
        _ => Err(Errno::EIO),
    }
}

impl TablixFs {
    pub(crate) fn new(
        store: Arc<Store>,
        config: FsConfig,
        ended: Arc<AtomicBool>,
        in_flight: Arc<crate::invalidate::InFlight>,
        holders: Arc<crate::holders::PipeHolders>,
        refs: Option<Arc<KernelRefs>>,
        locks: Option<Arc<Locks>>,
    ) -> TablixFs {
        TablixFs {
            pipes: Pipes::new(Arc::clone(&store), holders, config.ttl),
            store,
            config,
            ended,
            in_flight,
            refs,
            locks,
            writeback: None,
            shm_refusal_logged: AtomicBool::new(false),
            opened: AtomicU64::new(0),
            failure_logged: AtomicU64::new(0),
            began: std::time::Instant::now(),
        }
    }

    /// Counts opens for writing and writes for async mode's writeback
    /// thread (`writeback.rs`).
    pub(crate) fn with_writeback(mut self, writeback: Option<Arc<Writeback>>) -> TablixFs {
        self.writeback = writeback;
        self
    }

    /// How a file (not a pipe) is opened: its cached pages are kept, and
    /// its closes send no FLUSH (nothing is buffered here), but on a
    /// cluster node, where a close gives up the closer's locks. With the
    /// writeback cache (async mode) the kernel sends FLUSH anyway, to
    /// write pages back.
    fn file_open_flags(&self) -> FopenFlags {
        match self.locks {
            Some(_) => FopenFlags::FOPEN_KEEP_CACHE,
            None => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        }
    }

    /// The handle and open flags of a file (`shm`: named `*-shm`) opened
    /// with `flags`. On a cluster node two kinds are opened for direct
    /// I/O:
    /// - SQLite's WAL index (`*-shm`), which the kernel then refuses to
    ///   map shared (ENODEV): it is shared memory, which each node's
    ///   kernel would keep apart from the others', and SQLite in WAL mode
    ///   on two nodes would lose updates; refused, it reports an I/O
    ///   error instead.
    /// - A file opened with O_APPEND: its writes (`FsOp::Append`) land
    ///   where the state says the file ends, not where this kernel thinks
    ///   it does, and direct I/O leaves no copy of them in the page cache
    ///   at the offset the kernel guessed.
    fn opening(&self, shm: bool, flags: i32) -> (FileHandle, FopenFlags) {
        if let Some(wb) = &self.writeback {
            wb.opened(flags);
        }
        let cached = self.file_open_flags();
        if self.locks.is_none() {
            return (FileHandle(0), cached);
        }
        let number = self.opened.fetch_add(1, Ordering::Relaxed) + 1;
        let handle = |appending: bool| FileHandle((number << 1) | u64::from(appending));
        if shm {
            if !self.shm_refusal_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "a SQLite WAL index (a file named *-shm) was opened on a cluster node's mount: shared memory cannot span nodes, so mapping it is refused and SQLite reports an I/O error; use a rollback journal (PRAGMA journal_mode=DELETE) or PRAGMA locking_mode=EXCLUSIVE before WAL"
                );
            }
            return (handle(false), cached | FopenFlags::FOPEN_DIRECT_IO);
        }
        if flags & libc::O_APPEND != 0 {
            return (handle(true), cached | FopenFlags::FOPEN_DIRECT_IO);
        }
        (handle(false), cached)
    }

    /// Runs `op`, which may hand the kernel one inode (its `Ok`), as an
    /// operation `kernel_refs` counts.
    fn handing(&self, op: impl FnOnce() -> Result<Attr, Errno>) -> Result<Attr, Errno> {
        let Some(refs) = &self.refs else {
            return op();
        };
        let mut handing = refs.begin();
        let r = op();
        if let Ok(a) = &r {
            handing.hand(a.ino);
        }
        r
    }

    /// Applies `op` as a Command: durable on return in sync mode, applied
    /// and flushed within the interval in async mode.
    fn change(&self, op: FsOp) -> Result<FsReply, Errno> {
        let stamp = Stamp::now();
        self.in_flight
            .during(stamp.seed, || self.store.apply_fs_now(stamp, op))
            .map_err(|e| {
                let errno = store_errno(&e);
                self.log_failure(&e, errno);
                errno
            })?
    }

    /// Says why the store failed a change (not the operation's own
    /// result, such as ENOENT), which the caller sees only as an errno;
    /// at most once a second, so that a node without a leader does not
    /// fill its log with every write it refuses.
    fn log_failure(&self, e: &tablix_store::StoreError, errno: Errno) {
        // 1 + seconds, so that the first failure is always logged.
        let now = 1 + self.began.elapsed().as_secs();
        if self.failure_logged.swap(now, Ordering::Relaxed) != now {
            tracing::warn!("a change through the mount failed ({errno:?}): {e}");
        }
    }

    /// On a cluster node: EIO for a process whose lock on `ino` the
    /// node's lease took, until it closes the file (`Locks::not_lost`).
    fn lock_kept(&self, ino: Ino, pid: u32, fh: FileHandle) -> Result<(), Errno> {
        self.locks
            .as_ref()
            .map_or(Ok(()), |l| l.not_lost(ino, pid, fh.0))
    }

    /// Applies `op`, a change of `ino` by process `pid` through open
    /// file `fh` (0: none), fenced as `Locks::fence` has it on a cluster
    /// node.
    fn change_fenced(
        &self,
        (ino, fh): (Ino, FileHandle),
        pid: u32,
        op: FsOp,
    ) -> Result<FsReply, Errno> {
        let Some(locks) = &self.locks else {
            return self.change(op);
        };
        let op = locks.fence(ino, pid, fh.0, op)?;
        let fenced = matches!(op, FsOp::Fenced { .. });
        let r = self.change(op);
        if fenced && r == Err(Errno::EIO) {
            locks.lost(ino, pid);
        }
        r
    }

    fn change_attr(&self, op: FsOp) -> Result<Attr, Errno> {
        attr_of(self.change(op)?)
    }

    fn read<R>(
        &self,
        f: impl FnOnce(&tablix_store::ReadConn) -> Result<R, FsError>,
    ) -> Result<R, Errno> {
        if let Some(gate) = &self.config.read_gate {
            gate.before_read().map_err(|e| {
                tracing::debug!("a read through the mount waited in vain: {e}");
                read_gate_errno(&e)
            })?;
        }
        self.store
            .read_latest(f)
            .map_err(|e| store_errno(&e))?
            .map_err(|e| fs_errno(&e))
    }

    fn reply_entry(&self, reply: ReplyEntry, r: Result<Attr, Errno>) {
        match r {
            Ok(a) => reply.entry(&self.config.ttl, &file_attr(&a), GENERATION),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn getattr_of(&self, ino: Ino) -> Result<Attr, Errno> {
        match route::node(ino) {
            Node::Virtual(ino) => self.pipes.getattr(ino),
            Node::Stored(ino) => self.read(|c| read::getattr(c, ino)),
        }
    }

    fn reply_empty(reply: ReplyEmpty, r: Result<(), Errno>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn setattr_inner(&self, ino: Ino, set: SetAttr) -> Result<Attr, Errno> {
        let ino = match route::node(ino) {
            Node::Virtual(ino) => {
                // A pipe has no length to truncate (O_TRUNC on a FIFO is
                // ignored too); its owner and mode are fixed at creation.
                if set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
                    return Err(Errno::EPERM);
                }
                return self.pipes.getattr(ino);
            }
            Node::Stored(ino) => ino,
        };
        if set == SetAttr::default() {
            return self.read(|c| read::getattr(c, ino));
        }
        self.change_attr(FsOp::SetAttr { ino, attr: set })
    }

    fn make_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        let parent = match route::entry(parent.0, name) {
            Entry::Stored(p) => p,
            Entry::Control => return Err(Errno(libc::EEXIST)),
            Entry::Virtual(_) => return Err(Errno::EPERM),
        };
        self.handing(|| {
            self.change_attr(FsOp::MakeNode {
                parent,
                name: name.as_bytes().to_vec(),
                mode,
                rdev,
                uid: req.uid(),
                gid: req.gid(),
            })
        })
    }

    /// CREATE without O_EXCL of a name that another node created since
    /// this kernel found it absent (a cluster node's): the file there is
    /// opened, as open(2) would have opened it, truncated under O_TRUNC
    /// (the kernel takes it for created, and truncates nothing itself).
    fn open_existing(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        flags: i32,
    ) -> Result<Attr, Errno> {
        let Entry::Stored(parent) = route::entry(parent.0, name) else {
            return Err(Errno(libc::EEXIST));
        };
        // The kernel holds the inode only if the reply says so.
        self.handing(|| {
            let a = self.read(|c| read::lookup(c, parent, name.as_bytes()))?;
            if a.is_dir() {
                return Err(Errno(libc::EISDIR));
            }
            if a.file_type() != libc::S_IFREG {
                return Err(Errno(libc::EEXIST));
            }
            let wanted = match flags & libc::O_ACCMODE {
                libc::O_RDONLY => libc::R_OK,
                libc::O_WRONLY => libc::W_OK,
                _ => libc::R_OK | libc::W_OK,
            };
            self.access_inner(req, a.ino, AccessFlags::from_bits_truncate(wanted))?;
            if flags & libc::O_TRUNC != 0 && a.size > 0 {
                return self.change_attr(FsOp::SetAttr {
                    ino: a.ino,
                    attr: SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    },
                });
            }
            Ok(a)
        })
    }

    fn fsync_inner(&self) -> Result<(), Errno> {
        self.store.flush().wait().map_err(|e| store_errno(&e))
    }

    fn forget_inner(&self, ino: Ino, nlookup: u64) -> Result<(), Errno> {
        if let Some(refs) = &self.refs {
            // A cluster node releases what its kernel let go of, when the
            // releaser decides it safely can. The node's own state is
            // read, past the mount's read level: a forget waits for nothing.
            if refs.forget(ino, nlookup)
                && self
                    .store
                    .read_latest(|c| read::getattr(c, ino))
                    .map_err(|e| store_errno(&e))?
                    .is_ok_and(|a| a.nlink == 0)
            {
                refs.nudge();
            }
            return Ok(());
        }
        let inodes = vec![ino];
        // Only an unlinked inode is freed; checking first keeps the common
        // case (an evicted, still-linked inode) off the write path.
        let unlinked = self.read(|c| {
            let mut out = Vec::new();
            for ino in inodes {
                if read::getattr(c, ino).is_ok_and(|a| a.nlink == 0) {
                    out.push(ino);
                }
            }
            Ok(out)
        })?;
        if unlinked.is_empty() {
            return Ok(());
        }
        let reclaim = FsOp::Reclaim { inodes: unlinked };
        if self.config.writeback_cache.is_some() {
            // Async mode: cheap on this thread.
            self.change(reclaim).map(|_| ())
        } else {
            // Nobody waits on a forget: the writer applies it in a later
            // group instead of this thread waiting for the commit's fsync.
            drop(
                self.store
                    .submit_fs(tablix_store::Stamped::new(Stamp::now(), reclaim)),
            );
            Ok(())
        }
    }

    fn statfs_inner(&self) -> Result<Statfs, Errno> {
        let vfs = nix::sys::statvfs::statvfs(&self.config.data_dir).map_err(|e| Errno(e as i32))?;
        let files = self.read(|c| read::inode_count(c))?;
        let frsize = vfs.fragment_size() as u64;
        let free_files = vfs.blocks_available() as u64 * frsize / 4096;
        Ok(Statfs {
            blocks: vfs.blocks() as u64,
            free: vfs.blocks_free() as u64,
            available: vfs.blocks_available() as u64,
            files: files + free_files,
            free_files,
            block_size: frsize as u32,
        })
    }

    /// fallocate(2). Allocating stores nothing (`tablix_fs` says why), so
    /// the room is checked here, on this node's disk, before the Command:
    /// ENOSPC when the data directory's file system has fewer free bytes
    /// than the range asks for beyond what the file already holds.
    fn fallocate_inner(
        &self,
        req: &Request,
        (ino, fh): (Ino, FileHandle),
        (offset, length): (u64, u64),
        mode: i32,
    ) -> Result<(), Errno> {
        // Only the allocating modes; the store refuses unknown ones.
        if mode & !libc::FALLOC_FL_KEEP_SIZE == 0 {
            let held = self.getattr_of(ino)?.allocated;
            let vfs =
                nix::sys::statvfs::statvfs(&self.config.data_dir).map_err(|e| Errno(e as i32))?;
            let room = (vfs.blocks_available() as u64).saturating_mul(vfs.fragment_size() as u64);
            if length.saturating_sub(held) > room {
                return Err(Errno(libc::ENOSPC));
            }
        }
        self.change_fenced(
            (ino, fh),
            req.pid(),
            FsOp::Fallocate {
                ino,
                offset,
                length,
                mode,
            },
        )
        .map(|_| ())
    }

    fn access_inner(&self, req: &Request, ino: Ino, mask: AccessFlags) -> Result<(), Errno> {
        let a = self.getattr_of(ino)?;
        let mask = mask.bits() as u32 & 0o7;
        if mask == 0 {
            return Ok(());
        }
        if req.uid() == 0 {
            // Root may read and write anything, and execute what has an x bit.
            let needs_x = mask & 0o1 != 0 && !a.is_dir();
            return if needs_x && a.mode & 0o111 == 0 {
                Err(Errno(libc::EACCES))
            } else {
                Ok(())
            };
        }
        let granted = if req.uid() == a.uid {
            (a.mode >> 6) & 0o7
        } else if req.gid() == a.gid {
            (a.mode >> 3) & 0o7
        } else {
            a.mode & 0o7
        };
        if granted & mask == mask {
            Ok(())
        } else {
            Err(Errno(libc::EACCES))
        }
    }
}

/// What statfs reports: the space of the disk under the data directory,
/// and inodes as used plus what that space could hold at 4 KiB each.
struct Statfs {
    blocks: u64,
    free: u64,
    available: u64,
    files: u64,
    free_files: u64,
    block_size: u32,
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(nanos_of(t)),
    }
}

impl Filesystem for TablixFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            // The kernel then trusts this file system to drop set-user-ID
            // bits on writes (FUSE_WRITE_KILL_SUIDGID) and stops asking
            // for security.capability before every write.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.config.writeback_cache.is_some() {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.locks.is_some() {
            // The kernel hands its locks to the cluster (`locks.rs`).
            wanted |= InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        }
        if let Err(missing) = config.add_capabilities(wanted) {
            tracing::warn!(
                "the kernel lacks FUSE capabilities {missing:?}; continuing without them"
            );
            let _ = config.add_capabilities(wanted & !missing);
        }
        if let Err(limit) = config.set_max_write(self.config.max_write) {
            let _ = config.set_max_write(limit);
        }
        if let Err(limit) = config.set_max_readahead(self.config.max_write) {
            let _ = config.set_max_readahead(limit);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        Ok(())
    }

    fn destroy(&mut self) {
        self.pipes.stop();
        self.ended.store(true, Ordering::Release);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = match route::entry(parent.0, name) {
            Entry::Control => self.pipes.getattr(CONTROL_INO),
            Entry::Virtual(p) => self.pipes.lookup(p, name.as_bytes()),
            Entry::Stored(p) => self.handing(|| self.read(|c| read::lookup(c, p, name.as_bytes()))),
        };
        match r {
            // A missing name is cached by the kernel as a negative entry
            // (node 0) for the TTL; creating it goes through the kernel,
            // which replaces that entry.
            Err(Errno::ENOENT) => {
                reply.entry(&self.config.ttl, &crate::attr::negative_entry(), GENERATION)
            }
            r => self.reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Node::Stored(ino) = route::node(ino.0)
            && let Err(e) = self.forget_inner(ino, nlookup)
        {
            tracing::warn!("forget of inode {ino}: {e}");
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_of(ino.0) {
            Ok(a) => reply.attr(&self.config.ttl, &file_attr(&a)),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(nanos_of),
        };
        // A truncation is a change of the file's data, fenced as a write.
        let r = match (set.size, route::node(ino.0)) {
            (Some(_), Node::Stored(stored)) => self
                .change_fenced(
                    (stored, fh.unwrap_or(FileHandle(0))),
                    req.pid(),
                    FsOp::SetAttr {
                        ino: stored,
                        attr: set,
                    },
                )
                .and_then(attr_of),
            _ => self.setattr_inner(ino.0, set),
        };
        match r {
            Ok(a) => reply.attr(&self.config.ttl, &file_attr(&a)),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = match route::node(ino.0) {
            // Nothing under .tablix is a symbolic link.
            Node::Virtual(_) => Err(Errno(libc::EINVAL)),
            Node::Stored(ino) => self.read(|c| read::readlink(c, ino)),
        };
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.make_node(req, parent, name, mode, rdev);
        self.reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.make_node(req, parent, name, libc::S_IFDIR | (mode & 0o7777), 0);
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = match route::entry(parent.0, name) {
            Entry::Virtual(p) => self.pipes.unlink(p, name.as_bytes()),
            Entry::Control => Err(Errno::EPERM),
            Entry::Stored(parent) => self
                .change(FsOp::Unlink {
                    parent,
                    name: name.as_bytes().to_vec(),
                })
                .map(|_| ()),
        };
        Self::reply_empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = match route::entry(parent.0, name) {
            Entry::Virtual(_) | Entry::Control => Err(Errno::EPERM),
            Entry::Stored(parent) => self
                .change(FsOp::Rmdir {
                    parent,
                    name: name.as_bytes().to_vec(),
                })
                .map(|_| ()),
        };
        Self::reply_empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = match route::entry(parent.0, link_name) {
            Entry::Virtual(_) => Err(Errno::EPERM),
            Entry::Control => Err(Errno(libc::EEXIST)),
            Entry::Stored(parent) => self.handing(|| {
                self.change_attr(FsOp::Symlink {
                    parent,
                    name: link_name.as_bytes().to_vec(),
                    target: target.as_os_str().as_bytes().to_vec(),
                    uid: req.uid(),
                    gid: req.gid(),
                })
            }),
        };
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = match (
            route::entry(parent.0, name),
            route::entry(newparent.0, newname),
        ) {
            (Entry::Stored(parent), Entry::Stored(new_parent)) => self
                .change(FsOp::Rename {
                    parent,
                    name: name.as_bytes().to_vec(),
                    new_parent,
                    new_name: newname.as_bytes().to_vec(),
                    flags: flags.bits(),
                })
                .map(|_| ()),
            _ => Err(Errno::EPERM),
        };
        Self::reply_empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = match (route::node(ino.0), route::entry(newparent.0, newname)) {
            (Node::Stored(ino), Entry::Stored(parent)) => self.handing(|| {
                self.change_attr(FsOp::Link {
                    ino,
                    parent,
                    name: newname.as_bytes().to_vec(),
                })
            }),
            _ => Err(Errno::EPERM),
        };
        self.reply_entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if let Node::Virtual(ino) = route::node(ino.0) {
            self.pipes.open(ino, flags.0, req.pid(), reply);
            return;
        }
        // No per-open state is kept for files (a cluster node numbers its
        // opens and remembers only the locks taken through each); the
        // kernel keeps its page cache across opens, which is right
        // because every change to a file comes through this mount. (OPEN cannot be refused with
        // ENOSYS to save the round trip: that would switch it off for the
        // pipe files too.)
        // The name is read from the node's own state, past the mount's
        // read level: an open waits for nothing.
        let shm = match (route::node(ino.0), &self.locks) {
            (Node::Stored(ino), Some(_)) => match self
                .store
                .read_latest(|c| read::named_with_suffix(c, ino, SHARED_MEMORY_SUFFIX))
            {
                Ok(Ok(shm)) => shm,
                Ok(Err(e)) => return reply.error(to_fuser(fs_errno(&e))),
                Err(e) => return reply.error(to_fuser(store_errno(&e))),
            },
            _ => false,
        };
        let (fh, open_flags) = self.opening(shm, flags.0);
        reply.opened(fh, open_flags);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let (Node::Stored(_), Some(wb)) = (route::node(ino.0), &self.writeback) {
            wb.released(flags.0);
        }
        let r = match (route::node(ino.0), &self.locks, lock_owner) {
            (Node::Virtual(_), _, _) => {
                self.pipes.release(fh.0);
                Ok(())
            }
            // The open file description's `flock` goes with it.
            (Node::Stored(ino), Some(locks), owner) => {
                locks.released(fh.0);
                owner.map_or(Ok(()), |owner| locks.closed(ino, owner.0))
            }
            _ => Ok(()),
        };
        Self::reply_empty(reply, r);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let r = match (route::node(ino.0), &self.locks) {
            (Node::Stored(ino), Some(locks)) => {
                LockRequest::of((ino, fh.0), lock_owner.0, pid, (start, end), typ)
                    .and_then(|request| locks.conflicting(request))
            }
            _ => Err(Errno(libc::ENOLCK)),
        };
        match r {
            Ok((start, end, typ, pid)) => reply.locked(start, end, typ, pid),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let (Node::Stored(ino), Some(locks)) = (route::node(ino.0), &self.locks) else {
            return reply.error(to_fuser(Errno(libc::ENOLCK)));
        };
        match LockRequest::of((ino, fh.0), lock_owner.0, pid, (start, end), typ) {
            Ok(request) => locks.set(request, sleep.then_some(req.pid()), reply),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        ph: PollNotifier,
        events: PollEvents,
        flags: PollFlags,
        reply: ReplyPoll,
    ) {
        if let Node::Stored(_) = route::node(ino.0) {
            // Files are always ready. (ENOSYS would make the kernel stop
            // asking for every file of the mount, pipes included.)
            reply.poll(
                events
                    & (PollEvents::POLLIN
                        | PollEvents::POLLOUT
                        | PollEvents::POLLRDNORM
                        | PollEvents::POLLWRNORM),
            );
            return;
        }
        match self.pipes.poll(fh.0, ph, events, flags) {
            Ok(ready) => reply.poll(ready),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let ino = match route::node(ino.0) {
            Node::Virtual(_) => {
                self.pipes.read(fh.0, size, flags.0, req.pid(), reply);
                return;
            }
            Node::Stored(ino) => ino,
        };
        match self.read(|c| read::read(c, ino, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = match route::node(ino.0) {
            Node::Virtual(_) => {
                self.pipes.write(fh.0, data, flags.0, req.pid(), reply);
                return;
            }
            Node::Stored(ino) => ino,
        };
        if let Some(wb) = &self.writeback {
            wb.wrote();
        }
        let kill_suidgid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // On a cluster node another node may have appended since this
        // kernel last learned the file's size: an append goes where the
        // state says the file ends.
        let appending = match (&self.locks, flags.0 & libc::O_APPEND != 0) {
            (Some(locks), true) => Some(locks),
            _ => None,
        };
        let op = match appending {
            Some(_) => FsOp::Append {
                ino,
                data: data.to_vec(),
                kill_suidgid,
            },
            None => FsOp::Write {
                ino,
                offset,
                data: data.to_vec(),
                kill_suidgid,
            },
        };
        match (self.change_fenced((ino, fh), req.pid(), op), appending) {
            // Written through the page cache (O_APPEND set after opening,
            // so not direct I/O): the pages hold the data where the kernel
            // guessed, and this write holds them until answered.
            (Ok(FsReply::Written(n)), Some(locks)) if !opened_appending(fh) => {
                reply.written(n);
                locks.drop_pages_later(ino);
            }
            // Direct I/O copies nothing into the page cache, and the kernel
            // drops the pages over the range it guessed (the only cached
            // page past the size it knew is the one that size ends in).
            (Ok(FsReply::Written(n)), _) => reply.written(n),
            (Ok(_), _) => reply.error(to_fuser(Errno::EIO)),
            (Err(e), _) => reply.error(to_fuser(e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A pipe file's FLUSH says who closed a descriptor of it (see
        // holders.rs). A file has nothing buffered here: every write is
        // applied already, and the kernel wrote its cached pages back before
        // sending this; on a cluster node the closer's POSIX locks on it
        // go. (ENOSYS would stop FLUSH for the pipe files too.)
        let r = match (route::node(ino.0), &self.locks) {
            (Node::Virtual(_), _) => {
                self.pipes.flushed(fh.0, req.pid());
                Ok(())
            }
            (Node::Stored(ino), Some(locks)) => locks.closed(ino, lock_owner.0),
            (Node::Stored(_), None) => Ok(()),
        };
        Self::reply_empty(reply, r);
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let r = match route::node(ino.0) {
            // Every byte of a pipe is in the memory database already.
            Node::Virtual(_) => Ok(()),
            Node::Stored(ino) => self
                .lock_kept(ino, req.pid(), fh)
                .and_then(|()| self.fsync_inner()),
        };
        Self::reply_empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.getattr_of(ino.0) {
            Ok(a) if a.is_dir() => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.error(to_fuser(Errno::ENOTDIR)),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let emit = |e: read::DirEntry| {
            !reply.add(
                INodeNo(e.attr.ino),
                e.next,
                kind_of(e.attr.mode),
                OsStr::from_bytes(&e.name),
            )
        };
        let r = match route::node(ino.0) {
            Node::Virtual(ino) => self.pipes.readdir(ino, offset, emit),
            Node::Stored(ino) => self.read(|c| read::readdir(c, ino, offset, emit)),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.config.ttl;
        // Each entry added but `.` and `..` is a lookup the kernel holds.
        let mut handing = self.refs.as_ref().map(|r| r.begin());
        let emit = |e: read::DirEntry| {
            let full = reply.add(
                INodeNo(e.attr.ino),
                e.next,
                OsStr::from_bytes(&e.name),
                &ttl,
                &file_attr(&e.attr),
                GENERATION,
            );
            if !full
                && e.name != b"."
                && e.name != b".."
                && let Some(h) = handing.as_mut()
            {
                h.hand(e.attr.ino);
            }
            !full
        };
        let r = match route::node(ino.0) {
            Node::Virtual(ino) => self.pipes.readdir(ino, offset, emit),
            Node::Stored(ino) => self.read(|c| read::readdir(c, ino, offset, emit)),
        };
        drop(handing);
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::reply_empty(reply, self.fsync_inner());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.statfs_inner() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.free,
                s.available,
                s.files,
                s.free_files,
                s.block_size,
                tablix_fs::schema::NAME_MAX as u32,
                s.block_size,
            ),
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = match route::node(ino.0) {
            Node::Virtual(ino) => self.pipes.set_xattr(ino, name.as_bytes(), value, req.uid()),
            Node::Stored(ino) => self
                .change(FsOp::SetXattr {
                    ino,
                    name: name.as_bytes().to_vec(),
                    value: value.to_vec(),
                    flags,
                })
                .map(|_| ()),
        };
        Self::reply_empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = match route::node(ino.0) {
            Node::Virtual(ino) => self.pipes.get_xattr(ino, name.as_bytes()),
            Node::Stored(ino) => self.read(|c| read::getxattr(c, ino, name.as_bytes())),
        };
        reply_xattr(reply, r, size);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = match route::node(ino.0) {
            Node::Virtual(ino) => Ok(self.pipes.list_xattr(ino)),
            Node::Stored(ino) => self.read(|c| read::listxattr(c, ino)),
        };
        reply_xattr(reply, r, size);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = match route::node(ino.0) {
            Node::Virtual(_) => Err(Errno::ENODATA),
            Node::Stored(ino) => self
                .change(FsOp::RemoveXattr {
                    ino,
                    name: name.as_bytes().to_vec(),
                })
                .map(|_| ()),
        };
        Self::reply_empty(reply, r);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        Self::reply_empty(reply, self.access_inner(req, ino.0, mask));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if let Entry::Virtual(parent) = route::entry(parent.0, name) {
            let who = (req.uid(), req.gid(), req.pid());
            self.pipes.create(parent, name, mode, flags, who, reply);
            return;
        }
        let mode = libc::S_IFREG | (mode & 0o7777);
        let made = match self.make_node(req, parent, name, mode, 0) {
            Err(Errno(libc::EEXIST)) if self.locks.is_some() && flags & libc::O_EXCL == 0 => {
                self.open_existing(req, parent, name, flags)
            }
            made => made,
        };
        match made {
            Ok(a) => {
                let shm = name.as_bytes().ends_with(SHARED_MEMORY_SUFFIX);
                let (fh, open_flags) = self.opening(shm, flags);
                reply.created(&self.config.ttl, &file_attr(&a), GENERATION, fh, open_flags)
            }
            Err(e) => reply.error(to_fuser(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = match route::node(ino.0) {
            Node::Virtual(_) => Err(Errno(libc::ESPIPE)),
            Node::Stored(ino) => self.fallocate_inner(req, (ino, fh), (offset, length), mode),
        };
        Self::reply_empty(reply, r);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // No file here is a terminal or a device: what a disk file system
        // answers to isatty() (TCGETS) and every other ioctl it does not
        // know, without a word in the log.
        reply.error(to_fuser(Errno::ENOTTY));
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let r = match route::node(ino.0) {
            Node::Virtual(_) => Err(Errno(libc::ESPIPE)),
            // With the writeback cache the kernel holds writes this mount
            // has not seen, and its size is the file's: an answer from the
            // stored blocks would call those bytes a hole, or past the end,
            // and a reader skipping holes would skip them. ENOSYS has the
            // kernel answer from its own size from now on, every byte data.
            Node::Stored(_) if self.config.writeback_cache.is_some() => Err(Errno(libc::ENOSYS)),
            Node::Stored(_) if offset < 0 => Err(Errno::ENXIO),
            Node::Stored(ino) => self.read(|c| read::seek(c, ino, offset as u64, whence)),
        };
        match r {
            Ok(off) => reply.offset(off as i64),
            Err(e) => reply.error(to_fuser(e)),
        }
    }
}

fn reply_xattr(reply: ReplyXattr, r: Result<Vec<u8>, Errno>, size: u32) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(to_fuser(Errno::ERANGE)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(to_fuser(e)),
    }
}
